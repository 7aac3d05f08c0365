"""The what-if grid of one run: fetch align x start align, effective delay and speedup."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsim.render.figures.labels import ordered_names
from dsim.render.figures.style import style


def color_range(summary: pd.DataFrame, column: str) -> tuple[float, float]:
    """One colour scale per metric across every run of the page, so that the same
    colour means the same value in every run's grid. Speed-up always includes 1
    (no change); effective delay spans 0 to the largest value."""
    values = pd.to_numeric(summary[column], errors="coerce").dropna()
    if column == "speedup":
        lo = min(1.0, float(values.min())) if len(values) else 1.0
        hi = max(1.0, float(values.max())) if len(values) else 1.0
    else:
        lo, hi = 0.0, float(values.max()) if len(values) else 0.0
    return (lo, hi) if hi > lo else (lo, lo + 1.0)


def heatmap_figure(summary: pd.DataFrame, run: str, label: str | None = None) -> go.Figure:
    """Fetch-align x start-align grids of effective delay % and speedup for one run.

    The baseline cell (actual/actual) is the measured run, so every other
    cell reads directly as "what if the loaders were aligned this way". The
    colour scales are those of the whole ``summary`` (``color_range``); the
    title names the run by ``label`` (short), the hover by its full name.
    """
    rows = summary[summary["run"] == run]
    fetch_names = ordered_names(rows["fetch_align"])
    start_names = ordered_names(rows["start_align"])
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.2,
        subplot_titles=("effective delay % (lower is better)", "speed-up × (higher is better)"),
    )
    specs = (
        ("effective_delay_pct", "Reds", "%{z:.1f}%", 1, 0.4),
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
                zmin=color_range(summary, column)[0],
                zmax=color_range(summary, column)[1],
                texttemplate=text,
                textfont={"size": 14},
                hovertemplate=(
                    f"{html.escape(run)}<br>fetch %{{y}} / start %{{x}}<br>"
                    f"{column} = {text}<extra></extra>"
                ),
                colorbar={"x": bar_x, "len": 0.9, "thickness": 14},
                name=column,
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="start align", type="category", row=1, col=col)
        # the right grid shares the rows: its axis title and labels (`stall-min` is long) would
        # run into the left colour bar
        fig.update_yaxes(
            title_text="fetch align" if col == 1 else None,
            showticklabels=col == 1,
            type="category",
            autorange="reversed",
            row=1,
            col=col,
        )
    return style(fig, f"What-if grid — {html.escape(label or run)}", 380)
