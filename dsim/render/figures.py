"""The figures of the what-if report, as plotly ``graph_objects`` built from DataFrames.

Each builder is a pure function of a summary DataFrame (one row per run x
policy, see ``dsim.summary``) or of per-iteration replay DataFrames: no I/O,
so the page assembly (``dsim.render.html``) and the tests can use them alike.
Long timelines are thinned with a min/max-per-bucket downsampling that keeps
every spike, because a browser stays responsive with a few thousand points
per trace while a stall spike is exactly what a reader is looking for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsim.policies import BASELINE, POLICIES, Policy

MAX_POINTS = 5000
"""Most points drawn per timeline or CDF trace."""

HOVER_AT = "epoch %{customdata[0]}, iteration %{customdata[1]}<br>"
TAIL_QUANTILE = 0.99
"""The CDF's x axis initially ends a little past this quantile of every policy's delay."""

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
GPU_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
POLICY_COLORS = (
    "#4c4c4c",
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
)


def policy_name(policy: Policy) -> str:
    """How a policy reads on the page: ``fetch avg / start min``."""
    return f"fetch {policy[0]} / start {policy[1]}"


def policy_of(row: Mapping[str, object]) -> Policy:
    return (str(row["fetch_align"]), str(row["start_align"]))


def ordered_policies(policies: Sequence[Policy]) -> list[Policy]:
    """Baseline first, then in the canonical order of the policy names."""
    rank = {name: i for i, name in enumerate(POLICIES)}

    def key(p: Policy) -> tuple[int, int, int, str, str]:
        return (p != BASELINE, rank.get(p[0], 99), rank.get(p[1], 99), p[0], p[1])

    return sorted(dict.fromkeys(policies), key=key)


def _style(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(
        title={
            "text": title,
            "x": 0.0,
            "xanchor": "left",
            "yref": "container",
            "y": 1.0,
            "yanchor": "top",
            "pad": {"t": 24, "l": 8},
            "font": {"size": 17},
        },
        height=height,
        template="plotly_white",
        font={"family": FONT, "size": 13},
        margin={"l": 70, "r": 30, "t": 80, "b": 60},
        legend={"orientation": "v", "yanchor": "top", "y": 1.0, "x": 1.02, "xanchor": "left"},
        hoverlabel={"namelength": -1},
    )
    return fig


def wrap_name(name: str, width: int = 34) -> str:
    """Break a long run name at underscores so axis labels stay readable side by side."""
    lines: list[str] = []
    current = ""
    for part in name.split("_"):
        piece = part if not current else "_" + part
        if current and len(current) + len(piece) > width:
            lines.append(current + "_")
            current = part
        else:
            current += piece
    lines.append(current)
    return "<br>".join(lines)


# --------------------------------------------------------------------------- downsampling


def downsample_minmax(y: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices of the points to draw: the minimum and maximum of each bucket, in order.

    At most ``max_points`` indices; the first and last point are always kept so
    the trace spans the same range, and no spike is lost, whatever its width.
    """
    values = np.asarray(y, dtype=np.float64)
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    size = -(-n // max(1, (max_points - 2) // 2))  # bucket length, rounded up
    buckets = -(-n // size)
    padded = np.full(buckets * size, np.nan)
    padded[:n] = values
    grid = padded.reshape(buckets, size)
    lo = np.where(np.isnan(grid), np.inf, grid).argmin(axis=1)
    hi = np.where(np.isnan(grid), -np.inf, grid).argmax(axis=1)
    offsets = np.arange(buckets) * size
    keep = np.concatenate(([0, n - 1], offsets + lo, offsets + hi))
    return np.unique(keep[keep < n])


def ecdf_points(values: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their cumulative fractions, thinned to evenly spaced ranks."""
    v = np.sort(np.asarray(values, dtype=np.float64)[~np.isnan(values)])
    n = len(v)
    if n == 0:
        return v, v
    frac = np.arange(1, n + 1) / n
    if n > max_points:
        pick = np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
        v, frac = v[pick], frac[pick]
    return v, frac


# --------------------------------------------------------------------------- what-if grids


def heatmap_figure(summary: pd.DataFrame, run: str) -> go.Figure:
    """Fetch-align x start-align grids of effective delay % and speedup for one run.

    The baseline cell (actual/actual) is the measured run, so every other
    cell reads directly as "what if the loaders were aligned this way".
    """
    rows = summary[summary["run"] == run]
    fetch_names = [n for n in POLICIES if n in set(rows["fetch_align"])]
    fetch_names += sorted(set(rows["fetch_align"]) - set(fetch_names))
    start_names = [n for n in POLICIES if n in set(rows["start_align"])]
    start_names += sorted(set(rows["start_align"]) - set(start_names))
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.16,
        subplot_titles=(
            "effective delay (% of iterations, lower is better)",
            "predicted speedup of mean iteration time (×, higher is better)",
        ),
    )
    specs = (
        ("effective_delay_pct", "Reds", "%{z:.1f}%", 1, 0.42),
        ("speedup", "Greens", "%{z:.3f}×", 2, 1.0),
    )
    for column, scale, text, col, bar_x in specs:
        grid = np.full((len(fetch_names), len(start_names)), np.nan)
        for _, row in rows.iterrows():
            grid[fetch_names.index(row["fetch_align"]), start_names.index(row["start_align"])] = (
                row[column]
            )
        fig.add_trace(
            go.Heatmap(
                z=grid,
                x=start_names,
                y=fetch_names,
                colorscale=scale,
                texttemplate=text,
                textfont={"size": 14},
                hovertemplate=(
                    "fetch %{y} / start %{x}<br>" + column + " = " + text + "<extra></extra>"
                ),
                colorbar={"x": bar_x, "len": 0.9, "thickness": 14},
                name=column,
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="start align", type="category", row=1, col=col)
        fig.update_yaxes(
            title_text="fetch align", type="category", autorange="reversed", row=1, col=col
        )
    return _style(fig, f"What-if grid — {run}", 380)


# --------------------------------------------------------------------------- bars


def bars_figure(summary: pd.DataFrame) -> go.Figure:
    """Mean iteration time and stall per policy, grouped by run, ± one standard deviation."""
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.1,
        subplot_titles=("mean iteration time per policy", "mean training stall per policy"),
    )
    runs = list(dict.fromkeys(summary["run"]))
    policies = ordered_policies([policy_of(r) for _, r in summary.iterrows()])
    for i, policy in enumerate(policies):
        sel = summary[
            (summary["fetch_align"] == policy[0]) & (summary["start_align"] == policy[1])
        ].set_index("run")
        sel = sel.reindex([r for r in runs if r in sel.index])
        color = POLICY_COLORS[i % len(POLICY_COLORS)]
        for row, metric in ((1, "iteration_s"), (2, "stall_s")):
            fig.add_trace(
                go.Bar(
                    x=list(sel.index),
                    y=sel[f"{metric}_mean"],
                    error_y={"type": "data", "array": sel[f"{metric}_std"].fillna(0.0)},
                    name=policy_name(policy),
                    legendgroup=policy_name(policy),
                    showlegend=row == 1,
                    marker_color=color,
                    hovertemplate=(
                        "%{x}<br>"
                        + policy_name(policy)
                        + "<br>%{y:.4f} s ± %{error_y.array:.4f} s<extra></extra>"
                    ),
                ),
                row=row,
                col=1,
            )
    fig.update_layout(barmode="group", bargap=0.2)
    fig.update_yaxes(title_text="iteration time (s)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="training stall (s)", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(
        title_text="run",
        type="category",
        tickvals=runs,
        ticktext=[wrap_name(r) for r in runs],
        tickangle=0,
        row=2,
        col=1,
    )
    lines = max((wrap_name(r).count("<br>") + 1 for r in runs), default=1)
    height = 520 + 16 * lines
    return _style(fig, "Iteration time and training stall by policy (mean ± std)", height)


# --------------------------------------------------------------------------- timeline


def _gpu_columns(table: pd.DataFrame) -> list[str]:
    cols = [c for c in table.columns if c.startswith("stall_s_gpu")]
    return sorted(cols, key=lambda c: int(c.removeprefix("stall_s_gpu") or 0))


def _line(
    x: np.ndarray, y: np.ndarray, hover: np.ndarray, max_points: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The drawn points of one trace; float32 halves the page size and is exact enough to draw."""
    keep = downsample_minmax(y, max_points)
    return x[keep], y[keep].astype(np.float32), hover[keep]


def timeline_figure(
    run: str,
    replays: Mapping[Policy, pd.DataFrame],
    *,
    threshold_s: float,
    selection: str = "",
    selected: Policy | None = None,
    max_points: int = MAX_POINTS,
) -> go.Figure:
    """Per-iteration GPU stalls and delay: measured (actual/actual) against one policy.

    Three stacked panels sharing the iteration axis: measured stall of every
    GPU, the replayed stall of every GPU under the policy picked in the
    dropdown, and the delay of both with the effective-delay threshold. The
    dropdown only flips trace visibility, so the page needs no custom script.
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
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        row_heights=(0.33, 0.33, 0.34),
        subplot_titles=(
            "measured stall per GPU (actual / actual)",
            "replayed stall per GPU under the selected policy",
            "delay between GPUs (max − min stall)",
        ),
    )
    gpu_cols = _gpu_columns(first)
    always: list[bool] = []
    per_policy: list[Policy | None] = []
    if base is not None:
        for j, col in enumerate(gpu_cols):
            xs, ys, hs = _line(x, base[col].to_numpy(float), hover, max_points)
            fig.add_trace(
                go.Scattergl(
                    x=xs,
                    y=ys,
                    customdata=hs,
                    mode="lines",
                    name=f"GPU {col.removeprefix('stall_s_gpu')}",
                    legendgroup=col,
                    line={"color": GPU_COLORS[j % len(GPU_COLORS)], "width": 1},
                    hovertemplate=HOVER_AT + "stall %{y:.4f} s<extra>%{fullData.name}</extra>",
                ),
                row=1,
                col=1,
            )
            always.append(True)
            per_policy.append(None)
    for k, policy in enumerate(others):
        table = replays[policy]
        for j, col in enumerate(gpu_cols):
            xs, ys, hs = _line(x, table[col].to_numpy(float), hover, max_points)
            fig.add_trace(
                go.Scattergl(
                    x=xs,
                    y=ys,
                    customdata=hs,
                    mode="lines",
                    name=f"GPU {col.removeprefix('stall_s_gpu')}",
                    legendgroup=col,
                    showlegend=base is None and k == 0,
                    line={"color": GPU_COLORS[j % len(GPU_COLORS)], "width": 1},
                    hovertemplate=HOVER_AT + "stall %{y:.4f} s<extra>%{fullData.name}</extra>",
                    visible=k == active,
                ),
                row=2,
                col=1,
            )
            always.append(False)
            per_policy.append(policy)
    if base is not None:
        xs, ys, hs = _line(x, base["delay_s"].to_numpy(float), hover, max_points)
        fig.add_trace(
            go.Scattergl(
                x=xs,
                y=ys,
                customdata=hs,
                mode="lines",
                name="delay, measured",
                line={"color": "#4c4c4c", "width": 1},
                hovertemplate=HOVER_AT + "delay %{y:.4f} s<extra>measured</extra>",
            ),
            row=3,
            col=1,
        )
        always.append(True)
        per_policy.append(None)
    for k, policy in enumerate(others):
        xs, ys, hs = _line(x, replays[policy]["delay_s"].to_numpy(float), hover, max_points)
        fig.add_trace(
            go.Scattergl(
                x=xs,
                y=ys,
                customdata=hs,
                mode="lines",
                name=f"delay, {policy_name(policy)}",
                line={"color": "#d62728", "width": 1},
                hovertemplate=HOVER_AT
                + "delay %{y:.4f} s<extra>"
                + policy_name(policy)
                + "</extra>",
                visible=k == active,
            ),
            row=3,
            col=1,
        )
        always.append(False)
        per_policy.append(policy)
    fig.add_hline(
        y=threshold_s,
        line={"color": "#111111", "dash": "dash", "width": 1.5},
        annotation_text=f"effective-delay threshold {threshold_s:g} s",
        annotation_position="top right",
        annotation_bgcolor="rgba(255,255,255,0.8)",
        row=3,
        col=1,
    )
    buttons = [
        {
            "label": policy_name(policy),
            "method": "restyle",
            "args": [
                {"visible": [a or p == policy for a, p in zip(always, per_policy, strict=True)]}
            ],
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
                "x": 0.17,
                "xanchor": "left",
                "y": 1.045,
                "yanchor": "bottom",
                "bgcolor": "#f0f2f6",
            }
        ],
        annotations=[
            *fig.layout.annotations,
            {
                "text": "<b>replayed policy:</b>",
                "xref": "paper",
                "yref": "paper",
                "x": 0.0,
                "y": 1.052,
                "xanchor": "left",
                "yanchor": "bottom",
                "showarrow": False,
            },
        ],
    )
    for row in (1, 2):
        fig.update_yaxes(title_text="stall (s)", rangemode="tozero", row=row, col=1)
    fig.update_yaxes(matches="y", row=2, col=1)  # same scale: the panels compare at a glance
    fig.update_yaxes(title_text="delay (s)", rangemode="tozero", row=3, col=1)
    fig.update_xaxes(title_text="iteration (in order, selected epochs)", row=3, col=1)
    note = f"; downsampled to ≤ {max_points:,} points per trace (min/max per bucket)"
    title = (
        f"Per-iteration timeline — {run}<br><sup>{n:,} iterations{selection}"
        f"{note if thinned else ''}</sup>"
    )
    fig = _style(fig, title, 880)
    fig.update_layout(margin={"t": 140})
    return fig


# --------------------------------------------------------------------------- CDF


def cdf_figure(
    run: str,
    replays: Mapping[Policy, pd.DataFrame],
    *,
    threshold_s: float,
    selection: str = "",
    max_points: int = MAX_POINTS,
) -> go.Figure:
    """Cumulative distribution of per-iteration delay, one curve per policy.

    The share of iterations right of the threshold line is the effective
    delay %; a curve that rises earlier means delay removed.
    """
    fig = go.Figure()
    policies = ordered_policies(list(replays))
    thinned = False
    tails: list[float] = []
    peak = 0.0
    for i, policy in enumerate(policies):
        values = replays[policy]["delay_s"].to_numpy(float)
        thinned |= len(values) > max_points
        finite = values[np.isfinite(values)]
        if len(finite):
            tails.append(float(np.quantile(finite, TAIL_QUANTILE)))
            peak = max(peak, float(finite.max()))
        xs, fr = ecdf_points(values, max_points)
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=fr,
                mode="lines",
                line={
                    "color": POLICY_COLORS[i % len(POLICY_COLORS)],
                    "width": 2.5 if policy == BASELINE else 1.6,
                    "shape": "hv",
                },
                name=policy_name(policy) + (" (measured)" if policy == BASELINE else ""),
                hovertemplate="delay ≤ %{x:.4f} s for %{y:.1%} of iterations<extra>"
                + policy_name(policy)
                + "</extra>",
            )
        )
    fig.add_vline(
        x=threshold_s,
        line={"color": "#111111", "dash": "dash", "width": 1.5},
        annotation_text=f"threshold {threshold_s:g} s",
        annotation_position="bottom right",
    )
    fig.update_xaxes(title_text="delay between GPUs per iteration (s)", rangemode="tozero")
    cut = max([*tails, threshold_s]) * 1.15
    if tails and cut < peak:
        # a few multi-second first batches would squeeze every curve against the axis
        fig.update_xaxes(range=[0, cut])
        thinned_note = (
            f"; x axis cut at the {TAIL_QUANTILE:.1%} quantile (autoscale shows the tail)"
        )
    else:
        thinned_note = ""
    fig.update_yaxes(title_text="fraction of iterations", range=[0, 1.02], tickformat=".0%")
    fig.update_layout(
        updatemenus=[
            {
                "type": "buttons",
                "direction": "right",
                "x": 1.0,
                "xanchor": "right",
                "y": -0.22,
                "yanchor": "top",
                "buttons": [
                    {"label": "linear x", "method": "relayout", "args": [{"xaxis.type": "linear"}]},
                    {"label": "log x", "method": "relayout", "args": [{"xaxis.type": "log"}]},
                ],
            }
        ]
    )
    note = (f"; curves thinned to ≤ {max_points:,} points" if thinned else "") + thinned_note
    title = (
        f"Distribution of per-iteration delay — {run}<br><sup>{selection.lstrip(', ')}{note}</sup>"
    )
    fig = _style(fig, title, 500)
    fig.update_layout(legend={"orientation": "v", "x": 1.0, "y": 0.05, "yanchor": "bottom"})
    fig.update_layout(margin={"t": 90, "b": 110})
    return fig
