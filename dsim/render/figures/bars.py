"""Mean iteration time and training stall per policy, each run on its own scale.

Runs differ in scale by orders of magnitude (a 0.03 s and a 3 s iteration),
so one shared axis in seconds flattens the small ones. Every value is divided
by its run's measured mean iteration time (actual / actual = 1): bars of any
run compare on one axis, and the seconds are in the hover.
"""

from __future__ import annotations

import html
import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsim.render.figures.labels import (
    ordered_policies,
    policy_name,
    policy_of,
    short_labels,
    tick_labels,
)
from dsim.render.figures.spread import SPREAD_QUANTILES, whiskers
from dsim.render.figures.style import policy_color, style


def measured_iteration_s(summary: pd.DataFrame) -> dict[str, float]:
    """Each run's measured mean iteration time: ``speedup × iteration_s_mean`` of any row
    (``speedup`` is measured ÷ replayed); NaN when the run has no measured replay."""
    out: dict[str, float] = {}
    for run, rows in summary.groupby("run", sort=False):
        values = (rows["speedup"] * rows["iteration_s_mean"]).dropna()
        out[str(run)] = float(values.iloc[0]) if len(values) else math.nan
    return out


def bars_figure(summary: pd.DataFrame) -> go.Figure:
    """Mean iteration time and stall per policy, grouped by run, relative to the measured
    iteration time, with p10–p90 whiskers of the iterations (columns ``<metric>_p10`` and
    ``<metric>_p90`` when present)."""
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.1,
        subplot_titles=("iteration time", "training stall"),
    )
    scale = measured_iteration_s(summary)
    runs = [r for r in dict.fromkeys(summary["run"]) if not math.isnan(scale[str(r)])]
    left_out = [r for r in dict.fromkeys(summary["run"]) if r not in runs]
    short = short_labels(runs)
    lo_q, hi_q = (round(q * 100) for q in SPREAD_QUANTILES)
    policies = ordered_policies([policy_of(r) for _, r in summary.iterrows()])
    for i, policy in enumerate(policies):
        sel = summary[
            (summary["fetch_align"] == policy[0]) & (summary["start_align"] == policy[1])
        ].set_index("run")
        sel = sel.reindex([r for r in runs if r in sel.index])
        for row, metric in ((1, "iteration_s"), (2, "stall_s")):
            means, minus, plus, hover = [], [], [], []
            for run, rec in sel.iterrows():
                s = scale[str(run)]
                mean = float(rec[f"{metric}_mean"])
                lo = float(rec.get(f"{metric}_p10", math.nan))
                hi = float(rec.get(f"{metric}_p90", math.nan))
                below, above = whiskers(mean, lo, hi)
                means.append(mean / s)
                minus.append(below / s)
                plus.append(above / s)
                spread = "" if math.isnan(lo) else f"<br>p{lo_q}–p{hi_q}: {lo:.4f}–{hi:.4f} s"
                name = html.escape(str(run))
                hover.append(f"{name}<br>mean {mean:.4f} s = {mean / s:.3f} × measured{spread}")
            fig.add_trace(
                go.Bar(
                    x=[short[str(r)] for r in sel.index],
                    y=means,
                    error_y={"type": "data", "array": plus, "arrayminus": minus},
                    name=policy_name(policy),
                    legendgroup=policy_name(policy),
                    showlegend=row == 1,
                    marker_color=policy_color(i),
                    customdata=hover,
                    hovertemplate="%{customdata}<extra>" + policy_name(policy) + "</extra>",
                ),
                row=row,
                col=1,
            )
    fig.update_layout(barmode="group", bargap=0.2)
    unit = "× measured"
    fig.update_yaxes(title_text=unit, rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=unit, rangemode="tozero", row=2, col=1)
    labels = [short[str(r)] for r in runs]
    ticks, lines = tick_labels(labels)
    # never rotated: a 45° label ran into the legend below
    fig.update_xaxes(type="category", tickvals=labels, ticktext=ticks, tickangle=0, row=2, col=1)
    note = f"÷ the run's measured mean iteration time; whiskers p{lo_q}–p{hi_q} of iterations"
    if left_out:
        note += f"; not shown (no measured replay): {', '.join(map(str, left_out))}"
    return style(
        fig,
        f"Time per iteration, relative to each run<br><sup>{html.escape(note, quote=False)}</sup>",
        560 + 16 * lines,
        margin={"t": 122, "b": 40 + 16 * lines},
        legend={"orientation": "h", "x": 0.0, "y": -0.12 - 0.03 * lines, "yanchor": "top"},
    )
