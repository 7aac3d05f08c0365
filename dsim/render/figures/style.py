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
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
POLICY_COLORS = ("#4c4c4c", *GPU_COLORS[:7], "#17becf", "#bcbd22")
"""Dark grey for the measured run, then the GPU palette without its grey."""
THRESHOLD_LINE = {"color": "#111111", "dash": "dash", "width": 1.5}
"""The effective-delay threshold, drawn the same way in every figure that shows it."""

_MARGIN = {"l": 70, "r": 30, "t": 80, "b": 60}
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
            "pad": {"t": 24, "l": 8},
            "font": {"size": 17},
        },
        height=height,
        template="plotly_white",
        font={"family": FONT, "size": 13},
        margin={**_MARGIN, **(margin or {})},
        legend={**_LEGEND, **(legend or {})},
        hoverlabel={"namelength": -1},
    )
    return fig
