"""Per-iteration timeline of one run: GPU stalls and delay, measured against a policy.

The policy shown is picked in a drop-down that only flips trace visibility,
so the page needs no custom script; long runs are thinned per trace with
``downsample_minmax`` so spikes survive. Above ``MANY_RANKS`` GPUs a panel
draws the spread across GPUs per iteration (median, 10th–90th percentile band,
max) and the ``TOP_RANKS`` GPUs most often waited for by name, not one line
per GPU (``dsim.render.figures.ranks``): the page stays a few MB at any rank
count, and every drawn rank keeps a colour of its own.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsim.render.figures.downsample import MAX_POINTS, downsample_minmax
from dsim.render.figures.labels import ordered_policies, policy_name
from dsim.render.figures.ranks import (
    MANY_RANKS,
    TOP_RANKS,
    RankBands,
    ReducedRanks,
    largest_share,
    percent_text,
    rank_bands,
    stall_stragglers,
)
from dsim.render.figures.style import (
    BAND_FILL,
    BAND_LINE,
    GPU_COLORS,
    LOG_AXIS_RATIO,
    MEASURED_DELAY_COLOR,
    REPLAYED_DELAY_COLOR,
    rank_colors,
    style,
    threshold_trace,
)
from dsim.replay.policies import BASELINE, Policy

HOVER_AT = "epoch %{customdata[0]}, iteration %{customdata[1]}<br>"


def _gpu_columns(table: pd.DataFrame) -> list[str]:
    cols = [c for c in table.columns if c.startswith("stall_s_gpu")]
    return sorted(cols, key=lambda c: int(c.removeprefix("stall_s_gpu") or 0))


def _gpu_line(col: str, color: str, note: str = "") -> dict[str, object]:
    """Name, colour and hover of GPU ``col``'s stall trace, the same in both panels."""
    return {
        "name": f"GPU {col.removeprefix('stall_s_gpu')}{note}",
        "legendgroup": col,
        "line": {"color": color, "width": 1},
        "hovertemplate": HOVER_AT + "stall %{y:.4f} s<extra>%{fullData.name}</extra>",
    }


def _shared_keep(lines: list[np.ndarray], max_points: int) -> np.ndarray | None:
    """Indices drawn for a band's lines, the same for all (a filled band needs one x):
    each line's own min/max buckets at a share of ``max_points``; None: keep every point."""
    n = len(lines[0]) if lines else 0
    if n <= max_points:
        return None
    share = max(4, max_points // len(lines))
    return np.unique(np.concatenate([downsample_minmax(v, share) for v in lines]))


@dataclass
class _Traces:
    """Adds thinned line traces and remembers which policy each belongs to (None: always shown)."""

    fig: go.Figure
    x: np.ndarray
    hover: np.ndarray  # [n, 2] epoch and iteration, as a compact integer array
    max_points: int
    owners: list[Policy | None] = field(default_factory=list)

    def add(
        self,
        values: pd.Series | np.ndarray,
        row: int,
        owner: Policy | None,
        *,
        keep: np.ndarray | None = None,
        hover: bool = True,
        floor: float | None = None,
        **trace: object,
    ) -> None:
        """A line of ``values``, thinned (``keep``: these indices; else its own min/max
        buckets), with the epoch and iteration for the hover unless ``hover`` is False.

        ``floor``: values below it are drawn at it (a log axis has no zero) and the true
        value goes to the hover as ``customdata[2]``."""
        # float32 halves the page size and is exact enough to draw
        y = np.asarray(values, dtype=float)
        if keep is None:
            keep = downsample_minmax(y, self.max_points)
        extra: dict[str, object] = {"customdata": self.hover[keep]}
        if floor is not None:
            extra = {"customdata": np.column_stack([self.hover[keep], y[keep]])}
            y = np.maximum(y, floor)
        if not hover:
            extra = {"hoverinfo": "skip"}
        self.fig.add_trace(
            go.Scattergl(
                x=self.x[keep],
                y=y[keep].astype(np.float32),
                mode="lines",
                **extra,
                **trace,
            ),
            row=row,
            col=1,
        )
        self.owners.append(owner)

    def add_spread(
        self,
        values: np.ndarray | RankBands,
        row: int,
        owner: Policy | None,
        *,
        what: str,
        fmt: str,
        visible: bool = True,
        showlegend: bool = True,
    ) -> None:
        """The spread of ``values`` ([iterations, GPUs]) across GPUs per iteration: a
        10th–90th percentile band, the median and the maximum (``rank_bands``; given
        directly where the report reduced the stalls while reading)."""
        bands = values if isinstance(values, RankBands) else rank_bands(values)
        keep = _shared_keep([bands.p10, bands.median, bands.p90, bands.max], self.max_points)
        common = {"visible": visible}
        self.add(
            bands.p10,
            row,
            owner,
            keep=keep,
            hover=False,
            name="p10 over GPUs",
            legendgroup="band",
            showlegend=False,
            line={"color": BAND_FILL, "width": 0},
            **common,
        )
        self.add(
            bands.p90,
            row,
            owner,
            keep=keep,
            name="p10–p90 over GPUs",
            legendgroup="band",
            showlegend=showlegend,
            fill="tonexty",
            fillcolor=BAND_FILL,
            line={"color": BAND_FILL, "width": 0},
            hovertemplate=HOVER_AT + f"90th percentile {what} %{{y:{fmt}}}<extra></extra>",
            **common,
        )
        for line, name, dash in ((bands.median, "median", "solid"), (bands.max, "max", "dot")):
            self.add(
                line,
                row,
                owner,
                keep=keep,
                name=f"{name} over GPUs",
                legendgroup=name,
                showlegend=showlegend,
                line={"color": BAND_LINE, "width": 1.4 if name == "median" else 1, "dash": dash},
                hovertemplate=HOVER_AT + f"{name} {what} %{{y:{fmt}}}<extra></extra>",
                **common,
            )

    def add_fixed(self, trace: go.Scatter, row: int) -> None:
        """A trace shown whatever the policy (the threshold)."""
        self.fig.add_trace(trace, row=row, col=1)
        self.owners.append(None)

    def visible_with(self, policy: Policy) -> list[bool]:
        return [owner is None or owner == policy for owner in self.owners]


def log_floor(threshold_s: float) -> float:
    """The smallest delay a logarithmic delay axis draws: a tenth of the threshold (so the
    threshold line stays a decade above the bottom). A replay without delay sits on it."""
    return threshold_s / 10


def _log_note(floor: float | None) -> str:
    if floor is None:
        return ""
    # a line of its own: at 800 px the first subtitle line has no room left
    return (
        f"<br><sup>delay axis logarithmic so that the threshold shows; delays below "
        f"{floor:.2g} s drawn at {floor:.2g} s</sup>"
    )


def timeline_figure(
    run: str,
    replays: Mapping[Policy, pd.DataFrame],
    *,
    threshold_s: float,
    selection: str = "",
    selected: Policy | None = None,
    max_points: int = MAX_POINTS,
    utilisation: pd.DataFrame | None = None,
    reduced: ReducedRanks | None = None,
) -> go.Figure:
    """Per-iteration GPU stalls and delay: measured (actual/actual) against one policy.

    Three stacked panels sharing the iteration axis: measured stall of every
    GPU, the replayed stall of every GPU under the policy picked in the
    dropdown, and the delay of both with the effective-delay threshold. The
    dropdown only flips trace visibility, so the page needs no custom script.
    ``utilisation`` (columns ``util_pct_gpu<N>``, one row per iteration in the
    replays' order) adds a panel under the measured stalls, in the GPUs'
    colours: an idle GPU during a stall is a stall that cost compute.
    ``reduced``: a many-rank run's stalls already reduced (``ReducedRanks``); the
    replays then hold the named ranks' stall columns only. The figure is the same.
    """
    policies = ordered_policies(list(replays))
    base = replays.get(BASELINE)
    others = [p for p in policies if p != BASELINE] or policies
    # the drop-down keeps the canonical order and opens on ``selected``
    active = others.index(selected) if selected in others else 0
    first = replays[policies[0]]
    n = len(first)
    x = np.arange(n, dtype=np.int32)
    # epoch and iteration for the hover, as a compact integer array rather than strings
    hover = np.column_stack([first["epoch"].to_numpy(), first["iteration"].to_numpy()]).astype(
        np.int32
    )
    thinned = n > max_points
    util = utilisation is not None and len(utilisation) == n
    # rows: measured stall, [utilisation], replayed stall, delay
    replayed_row, delay_row = (3, 4) if util else (2, 3)
    titles = [
        "measured stall per GPU (actual / actual)",
        "replayed stall per GPU (selected policy)",  # short: the legend is beside it
        "delay between GPUs (max − min stall)",
    ]
    if util:
        titles.insert(1, "GPU utilisation per iteration (nvidia-smi, %)")
    fig = make_subplots(
        rows=len(titles),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07 if not util else 0.055,
        row_heights=(0.33, 0.33, 0.34) if not util else (0.26, 0.18, 0.26, 0.30),
        subplot_titles=titles,
    )
    gpu_cols = _gpu_columns(first) if reduced is None else reduced.columns
    many = len(gpu_cols) > MANY_RANKS
    # the ranks named: those the others wait for most often in the measured run (else the
    # first replay), the same in every panel; with few ranks every rank has its colour
    if reduced is not None:
        named, share = reduced.named, reduced.share
    else:
        reference = (base if base is not None else first)[gpu_cols].to_numpy(float)
        named = (
            stall_stragglers(reference, TOP_RANKS)
            if len(gpu_cols) > len(GPU_COLORS)
            else np.arange(len(gpu_cols))
        )
        share = largest_share(reference) if many else None
    colors = rank_colors(len(gpu_cols), named.tolist())

    def stalls(policy: Policy) -> np.ndarray | RankBands:
        if reduced is not None:
            return reduced.bands[policy]
        return replays[policy][gpu_cols].to_numpy(float)

    drawn = [int(j) for j in named] if many else list(range(len(gpu_cols)))

    def line(j: int) -> dict[str, object]:
        # short: at 800 px a long legend entry runs into the subplot titles
        note = f" ({percent_text(100 * share[j])})" if share is not None else ""
        return _gpu_line(gpu_cols[j], colors[j], note)

    traces = _Traces(fig, x, hover, max_points)
    if base is not None:
        if many:
            traces.add_spread(stalls(BASELINE), 1, None, what="stall", fmt=".4f")
        for j in drawn:
            traces.add(base[gpu_cols[j]], 1, None, **line(j))
    if util:
        util_cols = [f"util_pct_gpu{c.removeprefix('stall_s_gpu')}" for c in gpu_cols]
        if many:
            present = [c for c in util_cols if c in utilisation.columns]
            values = utilisation.reindex(columns=present).to_numpy(float)
            traces.add_spread(
                values, 2, None, what="utilisation", fmt=".0f", showlegend=base is None
            )
        for j in drawn:
            gpu = gpu_cols[j].removeprefix("stall_s_gpu")
            values = utilisation.get(util_cols[j])
            if values is None:
                continue
            traces.add(
                values.reset_index(drop=True),
                2,
                None,
                name=f"GPU {gpu} utilisation",
                legendgroup=gpu_cols[j],
                showlegend=False,
                line={"color": colors[j], "width": 1, "dash": "dot"},
                hovertemplate=HOVER_AT + "utilisation %{y:.0f} %<extra>GPU " + gpu + "</extra>",
            )
    for k, policy in enumerate(others):
        legend = base is None and k == 0
        if many:
            traces.add_spread(
                stalls(policy),
                replayed_row,
                policy,
                what="stall",
                fmt=".4f",
                visible=k == active,
                showlegend=legend,
            )
        for j in drawn:
            traces.add(
                replays[policy][gpu_cols[j]],
                replayed_row,
                policy,
                **line(j),
                showlegend=legend,
                visible=k == active,
            )
    delays = np.concatenate([r["delay_s"].to_numpy(float) for r in replays.values()])
    delays = delays[np.isfinite(delays) & (delays > 0)]
    log_delay = bool(
        len(delays) and threshold_s > 0 and np.quantile(delays, 0.99) > LOG_AXIS_RATIO * threshold_s
    )
    # On a log axis a zero delay has no place: plotly broke the measured line at every
    # zero and drew a replay with no delay nowhere. Below the floor, delays are drawn at it.
    floor = log_floor(threshold_s) if log_delay else None
    delay_hover = "delay %{customdata[2]:.4f} s" if log_delay else "delay %{y:.4f} s"
    if base is not None:
        traces.add(
            base["delay_s"],
            delay_row,
            None,
            floor=floor,
            name="delay, measured",
            line={"color": MEASURED_DELAY_COLOR, "width": 1},
            hovertemplate=HOVER_AT + delay_hover + "<extra>measured</extra>",
        )
    for k, policy in enumerate(others):
        traces.add(
            replays[policy]["delay_s"],
            delay_row,
            policy,
            floor=floor,
            name=f"delay, {policy_name(policy)}",
            line={"color": REPLAYED_DELAY_COLOR, "width": 1.5},
            hovertemplate=HOVER_AT + delay_hover + "<extra>" + policy_name(policy) + "</extra>",
            visible=k == active,
        )
    traces.add_fixed(threshold_trace([0, max(n - 1, 1)], [threshold_s] * 2, threshold_s), delay_row)
    log_range = None
    if floor is not None:
        # a little below the floor, so a line drawn at it is not hidden by the axis line
        log_range = [np.log10(floor) - 0.25, np.log10(max(float(delays.max()), floor)) + 0.15]
    buttons = [
        {
            "label": "replayed: " + policy_name(policy),
            "method": "restyle",
            "args": [{"visible": traces.visible_with(policy)}],
        }
        for policy in others
    ]
    axis = f"yaxis{delay_row}"
    fig.update_layout(
        updatemenus=[
            {
                "buttons": buttons,
                "direction": "down",
                "showactive": True,
                "active": active,
                "x": 0.0,
                "xanchor": "left",
                "y": 1.045,
                "yanchor": "bottom",
                "bgcolor": "#f0f2f6",
            },
            {
                "type": "buttons",
                "direction": "right",
                "active": 1 if log_delay else 0,
                "x": 1.0,
                "xanchor": "right",
                "y": -0.09,
                "yanchor": "top",
                "buttons": [
                    {
                        "label": "linear delay",
                        "method": "relayout",
                        "args": [{axis + ".type": "linear", axis + ".autorange": True}],
                    },
                    {
                        "label": "log delay",
                        "method": "relayout",
                        "args": [
                            {axis + ".type": "log", axis + ".range": log_range}
                            if log_range is not None
                            else {axis + ".type": "log"}
                        ],
                    },
                ],
            },
        ],
    )
    for row in (1, replayed_row):
        fig.update_yaxes(title_text="stall (s)", rangemode="tozero", row=row, col=1)
    # same scale: the panels compare at a glance
    fig.update_yaxes(matches="y", row=replayed_row, col=1)
    if util:
        fig.update_yaxes(title_text="util. (%)", range=[0, 105], row=2, col=1)
    fig.update_yaxes(
        title_text="delay (s)" + (", log" if log_delay else ""),
        type="log" if log_delay else "linear",
        **({"range": log_range} if log_range is not None else {}),
        row=delay_row,
        col=1,
    )
    fig.update_xaxes(title_text="iteration (in order, selected epochs)", row=delay_row, col=1)
    note = f"; downsampled to ≤ {max_points:,} points per trace (min/max per bucket)"
    # many ranks: a line of its own, so that an 800 px page does not cut it off
    named_note = (
        f"by name the {len(drawn)} most often with the largest stall (% of iterations)"
        if drawn
        else "no GPU ever stalled, none named"
    )
    spread = (
        f"<br><sup>{len(gpu_cols):,} GPUs drawn as their spread; {named_note}</sup>" if many else ""
    )
    title = (
        f"Per-iteration timeline — {html.escape(run)}<br><sup>{n:,} iterations{selection}"
        f"{note if thinned else ''}</sup>"
        f"{_log_note(floor)}"
        f"{spread}"
    )
    lines = int(many) + int(floor is not None)  # subtitle lines beyond the first
    height = (1040 if util else 880) + 20 * lines
    return style(fig, title, height, margin={"t": 162 + 20 * lines})
