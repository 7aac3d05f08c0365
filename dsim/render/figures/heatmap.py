"""The what-if grid of one run: fetch align x start align, effective delay and speedup."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsim.render.figures.labels import ordered_names
from dsim.render.figures.style import style


def heatmap_figure(summary: pd.DataFrame, run: str) -> go.Figure:
    """Fetch-align x start-align grids of effective delay % and speedup for one run.

    The baseline cell (actual/actual) is the measured run, so every other
    cell reads directly as "what if the loaders were aligned this way".
    """
    rows = summary[summary["run"] == run]
    fetch_names = ordered_names(rows["fetch_align"])
    start_names = ordered_names(rows["start_align"])
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
    return style(fig, f"What-if grid — {run}", 380)
