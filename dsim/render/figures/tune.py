"""`dsim tune`'s curve in the report: workers × prefetch heatmaps of the predicted speed-up.

One panel per sweep (the loader alone, with the best alignment), the
recommended setting starred, so that where more workers stop helping reads
off the colour at a glance; the hover has the iteration time and stall.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsim.render.figures.style import style


def tune_figure(table: pd.DataFrame, label: str) -> go.Figure:
    """Speed-up over the recorded run per (workers, prefetch), one panel per policy."""
    policies = list(dict.fromkeys(table["policy"]))
    titles = [
        "loader alone" if p == "actual/actual" else f"with aligned loaders ({p})" for p in policies
    ]
    fig = make_subplots(rows=1, cols=len(policies), subplot_titles=titles, horizontal_spacing=0.12)
    lo = min(1.0, float(table["speedup"].min()))
    hi = max(1.0, float(table["speedup"].max()))
    for col, policy in enumerate(policies, start=1):
        rows = table[table["policy"] == policy]
        workers = sorted(rows["workers"].unique())
        prefetch = sorted(rows["prefetch_factor"].unique())
        z = np.full((len(workers), len(prefetch)), np.nan)
        text = np.full(z.shape, "", dtype=object)
        hover = np.full(z.shape, "", dtype=object)
        for _, r in rows.iterrows():
            i, j = workers.index(r["workers"]), prefetch.index(r["prefetch_factor"])
            z[i, j] = r["speedup"]
            text[i, j] = f"{r['speedup']:.2f}×" + (" ★" if r["recommended"] else "")
            hover[i, j] = (
                f"{r['workers']} workers, prefetch {r['prefetch_factor']}: "
                f"{r['iteration_ms']:.1f} ms per iteration, stall {r['stall_ms']:.1f} ms"
            )
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[str(p) for p in prefetch],
                y=[str(w) for w in workers],
                text=text,
                texttemplate="%{text}",
                customdata=hover,
                hovertemplate="%{customdata}<extra></extra>",
                colorscale="Greens",
                zmin=lo,
                zmax=hi,
                showscale=col == len(policies),
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="prefetch_factor", type="category", row=1, col=col)
        fig.update_yaxes(title_text="num_workers", type="category", row=1, col=col)
    title = f"{html.escape(label)}: predicted speed-up of dsim tune's settings (★ recommended)"
    return style(fig, title, 380)
