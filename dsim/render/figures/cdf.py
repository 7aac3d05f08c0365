"""Distribution of per-iteration delay of one run, one curve per policy.

The share of iterations right of the threshold line is the effective delay,
so the figure shows at once what the summary's percentage summarises.
"""

from __future__ import annotations

import html
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dsim.render.figures.downsample import MAX_POINTS, ecdf_points
from dsim.render.figures.labels import ordered_policies, policy_name
from dsim.render.figures.style import (
    LOG_AXIS_RATIO,
    policy_color,
    policy_dash,
    style,
    threshold_trace,
)
from dsim.replay.policies import BASELINE, Policy

TAIL_QUANTILE = 0.99
"""The CDF's x axis initially ends a little past this quantile of every policy's delay."""


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
                    "color": policy_color(i),
                    "dash": policy_dash(i),
                    "width": 2.5 if policy == BASELINE else 1.6,
                    "shape": "hv",
                },
                name=policy_name(policy) + (" (measured)" if policy == BASELINE else ""),
                hovertemplate="delay ≤ %{x:.4f} s for %{y:.1%} of iterations<extra>"
                + policy_name(policy)
                + "</extra>",
            )
        )
    fig.add_trace(threshold_trace([threshold_s] * 2, [0.0, 1.0], threshold_s))
    cut = max([*tails, threshold_s]) * 1.15
    log_x = bool(tails and threshold_s > 0 and max(tails) > LOG_AXIS_RATIO * threshold_s)
    if log_x:
        low = threshold_s / 10
        fig.update_xaxes(type="log", range=[np.log10(low), np.log10(max(peak, cut))])
        thinned_note = "; x axis logarithmic so that the threshold shows (zero delays not drawn)"
    elif tails and cut < peak:
        # a few multi-second first batches would squeeze every curve against the axis
        fig.update_xaxes(range=[0, cut])
        thinned_note = (
            f"; x axis cut at the {TAIL_QUANTILE:.1%} quantile (autoscale shows the tail)"
        )
    else:
        thinned_note = ""
    fig.update_xaxes(
        title_text="delay between GPUs per iteration (s)", rangemode="normal" if log_x else "tozero"
    )
    fig.update_yaxes(title_text="fraction of iterations", range=[0, 1.02], tickformat=".0%")
    fig.update_layout(
        updatemenus=[
            {
                "type": "buttons",
                "direction": "right",
                "active": 1 if log_x else 0,
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
        f"Distribution of per-iteration delay — {html.escape(run)}"
        f"<br><sup>{selection.lstrip(', ')}{note}</sup>"
    )
    return style(
        fig,
        title,
        500,
        margin={"t": 112, "b": 110},
        legend={"orientation": "v", "x": 1.0, "y": 0.05, "yanchor": "bottom"},
    )
