"""Job throughput per policy, and weak-scaling efficiency across GPU counts (docs/SPEC.md §5.5).

Top: samples/s of the whole job per run and policy (measured and replayed),
so a policy's speed-up reads as samples gained. Bottom: for jobs run at
several GPU counts, efficiency against the job's smallest run per policy
(1 = perfect weak scaling). Where the summary cannot give either, the panel
says why in words (the rows' ``throughput_note``) instead of staying blank.
"""

from __future__ import annotations

import html

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
from dsim.render.figures.style import policy_color, style


def _reasons(summary: pd.DataFrame, prefix: str) -> str:
    column = summary.get("throughput_note", pd.Series(dtype="object"))
    notes = [str(n) for n in dict.fromkeys(column) if isinstance(n, str)]
    chosen = [n for n in notes if n.startswith(prefix)] or notes
    return "; ".join(chosen) if chosen else "no data"


def scaling_figure(summary: pd.DataFrame) -> go.Figure:
    """Job throughput (bars per run × policy) and, where runs of one job at several GPU
    counts allow it, scaling efficiency vs GPUs in a second panel.

    Without any scaling the second panel is left out and the reason is a line of the
    subtitle: an empty panel's centred note sat on the run labels of the panel above.
    """
    scaled = summary[summary.get("scaling_efficiency", pd.Series(dtype="float64")).notna()]
    two = not scaled.empty
    runs = list(dict.fromkeys(summary.loc[_known(summary), "run"]))
    ticks, lines = tick_labels(list(short_labels(runs).values()))
    fig = make_subplots(
        rows=2 if two else 1,
        cols=1,
        # room under the top panel for its rows of run labels, above the second's title
        vertical_spacing=0.16 + 0.025 * lines,
        subplot_titles=("job throughput (samples/s)", "weak-scaling efficiency")[: 2 if two else 1],
    )
    known = summary[_known(summary)]
    short = short_labels(runs)
    policies = ordered_policies([policy_of(r) for _, r in summary.iterrows()])
    for i, policy in enumerate(policies):
        sel = known[(known["fetch_align"] == policy[0]) & (known["start_align"] == policy[1])]
        if sel.empty:
            continue
        fig.add_trace(
            go.Bar(
                x=[short[str(r)] for r in sel["run"]],
                y=list(sel["throughput_job_samples_s"]),
                name=policy_name(policy),
                legendgroup=policy_name(policy),
                marker_color=policy_color(i),
                customdata=[
                    f"{html.escape(str(r))}<br>{job:,.1f} samples/s "
                    f"({rank:,.1f} per rank × {g:g} GPUs)"
                    for r, job, rank, g in zip(
                        sel["run"],
                        sel["throughput_job_samples_s"],
                        sel["throughput_rank_samples_s"],
                        sel["gpus"],
                        strict=True,
                    )
                ],
                hovertemplate="%{customdata}<extra>" + policy_name(policy) + "</extra>",
            ),
            row=1,
            col=1,
        )
    for i, policy in enumerate(policies):
        sel = scaled[(scaled["fetch_align"] == policy[0]) & (scaled["start_align"] == policy[1])]
        for base, rows in sel.groupby("scaling_base_gpus", sort=True):
            rows = rows.sort_values("gpus")
            fig.add_trace(
                go.Scatter(
                    x=list(rows["gpus"]),
                    y=list(rows["scaling_efficiency"]),
                    mode="lines+markers",
                    name=policy_name(policy),
                    legendgroup=policy_name(policy),
                    showlegend=not known[
                        (known["fetch_align"] == policy[0]) & (known["start_align"] == policy[1])
                    ].size,
                    line={"color": policy_color(i)},
                    customdata=[
                        f"{html.escape(str(r))}<br>{e:.3f} × ideal against {base:g} GPU(s)"
                        for r, e in zip(rows["run"], rows["scaling_efficiency"], strict=True)
                    ],
                    hovertemplate="%{customdata}<extra>" + policy_name(policy) + "</extra>",
                ),
                row=2,
                col=1,
            )
    if known.empty:
        _say(fig, _reasons(summary, "throughput unknown"), "x domain", "y domain")
    if two:
        fig.add_hline(y=1.0, line={"dash": "dot", "color": "#4c4c4c"}, row=2, col=1)
        fig.update_yaxes(title_text="× ideal", rangemode="tozero", row=2, col=1)
        counts = sorted({float(g) for g in scaled["gpus"]})
        fig.update_xaxes(title_text="GPUs", tickvals=counts, row=2, col=1)
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", row=1, col=1)
    labels = [short[str(r)] for r in runs]
    # never rotated: a 45° label ran into the legend and the panel below
    fig.update_xaxes(type="category", tickvals=labels, ticktext=ticks, tickangle=0, row=1, col=1)
    subtitle = [
        "samples/s from the per-rank batch size and the mean iteration time; efficiency =",
        "job throughput ÷ (GPUs × per-rank throughput of the job's smallest run)",
    ]
    if not two:
        subtitle += _wrap(_reasons(summary, "no scaling"), 90).split("<br>")
    title = "Throughput and weak scaling" + "".join(
        f"<br><sup>{html.escape(line, quote=False)}</sup>" for line in subtitle
    )
    top = 90 + 18 * len(subtitle)
    # rows of run labels under the bars: the second panel (its title) moves down with them
    label_room = 16 * lines
    height = 640 + 2 * label_room if two else 380 + label_room
    return style(fig, title, height + top - 122, margin={"t": top, "b": 50 + label_room})


def _known(summary: pd.DataFrame) -> pd.Series:
    """Rows whose job throughput is known (a batch size was found)."""
    column = summary.get("throughput_job_samples_s", pd.Series(dtype="float64"))
    return column.notna().reindex(summary.index, fill_value=False)


def _wrap(text: str, width: int) -> str:
    """Words wrapped to ``width`` characters with ``<br>`` (a plotly annotation does not wrap)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)


def _say(fig: go.Figure, text: str, xref: str, yref: str) -> None:
    fig.add_annotation(
        text=_wrap(html.escape(text), 90),
        xref=xref,
        yref=yref,
        x=0.5,
        y=0.5,
        showarrow=False,
        font={"size": 13, "color": "#4c4c4c"},
    )
