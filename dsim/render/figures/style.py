"""The look every report figure shares: fonts, colours, title, margins, legend.

Kept in one place so the figures read as one report, and a figure that needs
more room changes only what differs (``margin``, ``legend``) rather than
restating the layout.
"""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
GPU_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
)
"""Category10 without its red and grey: those two are kept for the derived lines
(delay), so a GPU's stall is never mistaken for a delay curve."""
MEASURED_DELAY_COLOR = "#4c4c4c"
REPLAYED_DELAY_COLOR = "#d62728"
POLICY_COLORS = (
    "#000000",
    "#E69F00",
    "#56B4E9",
    "#009E73",
    "#0072B2",
    "#D55E00",
    "#CC79A7",
    "#F0E442",
    "#999999",
)
"""Okabe-Ito (colour-blind safe): black for the measured run, then the seven
hues, and grey for a ninth policy; ``POLICY_DASHES`` tells a tenth and later
apart where lines (not bars) are drawn."""
POLICY_DASHES = ("solid", "dash", "dot", "dashdot")


def policy_color(index: int) -> str:
    """Colour of the ``index``-th policy in canonical order (0: the measured run)."""
    return POLICY_COLORS[index % len(POLICY_COLORS)]


def policy_dash(index: int) -> str:
    """Line dash of the ``index``-th policy: solid for the first nine, then patterns."""
    return POLICY_DASHES[(index // len(POLICY_COLORS)) % len(POLICY_DASHES)]


def gpu_color(index: int) -> str:
    """Colour of GPU ``index``; cycles through ``GPU_COLORS`` and never gives a delay colour."""
    return GPU_COLORS[index % len(GPU_COLORS)]


OTHER_GPU_COLOR = "#969696"
"""Ranks not named when there are more ranks than ``GPU_COLORS``: one mid grey, darker than
the ties of "who was last" and lighter than the measured delay, so named ranks stand out."""
BAND_FILL = "rgba(110, 120, 135, 0.28)"
"""The 10th–90th percentile band across GPUs (many ranks)."""
BAND_LINE = "#3d4452"
"""The median and the maximum across GPUs (many ranks): dark, not a GPU colour."""


def rank_colors(n_gpus: int, top: list[int] | tuple[int, ...]) -> list[str]:
    """Colour of each of ``n_gpus`` GPUs (by position). Up to ``len(GPU_COLORS)`` ranks each
    has its own (``gpu_color``); beyond, a repeating cycle would give two ranks one colour,
    so the positions ``top`` (the named stragglers, worst first) get the distinct colours
    and every other rank ``OTHER_GPU_COLOR``."""
    if n_gpus <= len(GPU_COLORS):
        return [gpu_color(j) for j in range(n_gpus)]
    colors = [OTHER_GPU_COLOR] * n_gpus
    for i, j in enumerate(list(top)[: len(GPU_COLORS)]):
        colors[int(j)] = GPU_COLORS[i]
    return colors


THRESHOLD_LINE = {"color": "#111111", "dash": "dash", "width": 2}
"""The effective-delay threshold, drawn the same way in every figure that shows it."""

LOG_AXIS_RATIO = 20.0
"""A delay axis opens logarithmic when its 99th percentile exceeds the threshold this
many times: on a linear axis the threshold line would sit flat on the axis."""


def threshold_trace(x: list[float], y: list[float], threshold_s: float) -> go.Scatter:
    """The effective-delay threshold as a line with its own legend entry: the label is in
    the legend, so it never covers data, and the line is drawn over the data."""
    return go.Scatter(
        x=x,
        y=y,
        mode="lines",
        line=THRESHOLD_LINE,
        name=f"threshold {threshold_s:g} s",
        hovertemplate=f"effective-delay threshold {threshold_s:g} s<extra></extra>",
    )


_MARGIN = {"l": 70, "r": 30, "t": 102, "b": 60}
_LEGEND = {"orientation": "v", "yanchor": "top", "y": 1.0, "x": 1.02, "xanchor": "left"}


def style(
    fig: go.Figure,
    title: str,
    height: int,
    *,
    margin: Mapping[str, int] | None = None,
    legend: Mapping[str, object] | None = None,
) -> go.Figure:
    """Apply the report's layout; ``margin`` and ``legend`` override single keys."""
    fig.update_layout(
        title={
            "text": title,
            "x": 0.0,
            "xanchor": "left",
            "yref": "container",
            "y": 1.0,
            "yanchor": "top",
            # below the toolbar (about 30 px at the top right), so no title runs under it
            "pad": {"t": 46, "l": 8},
            "font": {"size": 17},
        },
        height=height,
        template="plotly_white",
        font={"family": FONT, "size": 13},
        margin={**_MARGIN, **(margin or {})},
        legend={**_LEGEND, **(legend or {})},
        hoverlabel={"namelength": -1},
    )
    # invisible 4 px ticks hold the y labels off the axis: the x axis's "0" under the
    # corner no longer touches the y axis's "0 %"
    fig.update_yaxes(ticks="outside", ticklen=4, tickcolor="rgba(0,0,0,0)")
    return fig
