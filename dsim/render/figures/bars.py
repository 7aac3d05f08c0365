"""Mean iteration time and training stall per policy, runs side by side."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsim.render.figures.labels import ordered_policies, policy_name, policy_of, wrap_name
from dsim.render.figures.style import POLICY_COLORS, style


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
    return style(fig, "Iteration time and training stall by policy (mean ± std)", height)
