"""Per-iteration timeline of one run: GPU stalls and delay, measured against a policy.

The policy shown is picked in a drop-down that only flips trace visibility,
so the page needs no custom script; long runs are thinned per trace with
``downsample_minmax`` so spikes survive.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsim.render.figures.downsample import MAX_POINTS, downsample_minmax
from dsim.render.figures.labels import ordered_policies, policy_name
from dsim.render.figures.style import (
    LOG_AXIS_RATIO,
    MEASURED_DELAY_COLOR,
    REPLAYED_DELAY_COLOR,
    gpu_color,
    style,
    threshold_trace,
)
from dsim.replay.policies import BASELINE, Policy

HOVER_AT = "epoch %{customdata[0]}, iteration %{customdata[1]}<br>"


def _gpu_columns(table: pd.DataFrame) -> list[str]:
    cols = [c for c in table.columns if c.startswith("stall_s_gpu")]
    return sorted(cols, key=lambda c: int(c.removeprefix("stall_s_gpu") or 0))


def _gpu_line(j: int, col: str) -> dict[str, object]:
    """Name, colour and hover of GPU ``col``'s stall trace, the same in both panels."""
    return {
        "name": f"GPU {col.removeprefix('stall_s_gpu')}",
        "legendgroup": col,
        "line": {"color": gpu_color(j), "width": 1},
        "hovertemplate": HOVER_AT + "stall %{y:.4f} s<extra>%{fullData.name}</extra>",
    }


@dataclass
class _Traces:
    """Adds thinned line traces and remembers which policy each belongs to (None: always shown)."""

    fig: go.Figure
    x: np.ndarray
    hover: np.ndarray  # [n, 2] epoch and iteration, as a compact integer array
    max_points: int
    owners: list[Policy | None] = field(default_factory=list)

    def add(self, values: pd.Series, row: int, owner: Policy | None, **trace: object) -> None:
        # float32 halves the page size and is exact enough to draw
        y = values.to_numpy(float)
        keep = downsample_minmax(y, self.max_points)
        self.fig.add_trace(
            go.Scattergl(
                x=self.x[keep],
                y=y[keep].astype(np.float32),
                customdata=self.hover[keep],
                mode="lines",
                **trace,
            ),
            row=row,
            col=1,
        )
        self.owners.append(owner)

    def add_fixed(self, trace: go.Scatter, row: int) -> None:
        """A trace shown whatever the policy (the threshold)."""
        self.fig.add_trace(trace, row=row, col=1)
        self.owners.append(None)

    def visible_with(self, policy: Policy) -> list[bool]:
        return [owner is None or owner == policy for owner in self.owners]


def timeline_figure(
    run: str,
    replays: Mapping[Policy, pd.DataFrame],
    *,
    threshold_s: float,
    selection: str = "",
    selected: Policy | None = None,
    max_points: int = MAX_POINTS,
    utilisation: pd.DataFrame | None = None,
) -> go.Figure:
    """Per-iteration GPU stalls and delay: measured (actual/actual) against one policy.

    Three stacked panels sharing the iteration axis: measured stall of every
    GPU, the replayed stall of every GPU under the policy picked in the
    dropdown, and the delay of both with the effective-delay threshold. The
    dropdown only flips trace visibility, so the page needs no custom script.
    ``utilisation`` (columns ``util_pct_gpu<N>``, one row per iteration in the
    replays' order) adds a panel under the measured stalls, in the GPUs'
    colours: an idle GPU during a stall is a stall that cost compute.
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
        "replayed stall per GPU under the selected policy",
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
    gpu_cols = _gpu_columns(first)
    traces = _Traces(fig, x, hover, max_points)
    if base is not None:
        for j, col in enumerate(gpu_cols):
            traces.add(base[col], 1, None, **_gpu_line(j, col))
    if util:
        for j, col in enumerate(gpu_cols):
            gpu = col.removeprefix("stall_s_gpu")
            values = utilisation.get(f"util_pct_gpu{gpu}")
            if values is None:
                continue
            traces.add(
                values.reset_index(drop=True),
                2,
                None,
                name=f"GPU {gpu} utilisation",
                legendgroup=col,
                showlegend=False,
                line={"color": gpu_color(j), "width": 1, "dash": "dot"},
                hovertemplate=HOVER_AT + "utilisation %{y:.0f} %<extra>GPU " + gpu + "</extra>",
            )
    for k, policy in enumerate(others):
        for j, col in enumerate(gpu_cols):
            traces.add(
                replays[policy][col],
                replayed_row,
                policy,
                **_gpu_line(j, col),
                showlegend=base is None and k == 0,
                visible=k == active,
            )
    if base is not None:
        traces.add(
            base["delay_s"],
            delay_row,
            None,
            name="delay, measured",
            line={"color": MEASURED_DELAY_COLOR, "width": 1},
            hovertemplate=HOVER_AT + "delay %{y:.4f} s<extra>measured</extra>",
        )
    for k, policy in enumerate(others):
        traces.add(
            replays[policy]["delay_s"],
            delay_row,
            policy,
            name=f"delay, {policy_name(policy)}",
            line={"color": REPLAYED_DELAY_COLOR, "width": 1},
            hovertemplate=HOVER_AT + "delay %{y:.4f} s<extra>" + policy_name(policy) + "</extra>",
            visible=k == active,
        )
    traces.add_fixed(threshold_trace([0, max(n - 1, 1)], [threshold_s] * 2, threshold_s), delay_row)
    delays = np.concatenate([r["delay_s"].to_numpy(float) for r in replays.values()])
    delays = delays[np.isfinite(delays) & (delays > 0)]
    log_delay = bool(
        len(delays) and threshold_s > 0 and np.quantile(delays, 0.99) > LOG_AXIS_RATIO * threshold_s
    )
    buttons = [
        {
            "label": "replayed: " + policy_name(policy),
            "method": "restyle",
            "args": [{"visible": traces.visible_with(policy)}],
        }
        for policy in others
    ]
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
                        "args": [{f"yaxis{delay_row}.type": "linear"}],
                    },
                    {
                        "label": "log delay",
                        "method": "relayout",
                        "args": [{f"yaxis{delay_row}.type": "log"}],
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
        row=delay_row,
        col=1,
    )
    fig.update_xaxes(title_text="iteration (in order, selected epochs)", row=delay_row, col=1)
    note = f"; downsampled to ≤ {max_points:,} points per trace (min/max per bucket)"
    title = (
        f"Per-iteration timeline — {run}<br><sup>{n:,} iterations{selection}"
        f"{note if thinned else ''}"
        f"{'; delay axis logarithmic so that the threshold shows' if log_delay else ''}</sup>"
    )
    return style(fig, title, 1040 if util else 880, margin={"t": 162})
