"""Whose loader is late: the attribution figures of one run (docs/SPEC.md §5.2, §9.2).

* ``workers_figure``: rank × worker heatmap of each (GPU, worker)'s share of all
  fetch time above its iteration's median fetch (``excess_share_pct``): which
  workers produce the slowest fetches. The GPU labels carry each rank's share of
  iterations in which it alone finished its fetch last.
* ``last_figure``: per window of consecutive selected iterations, the share in
  which each rank alone finished its fetch last, stacked with the share of ties:
  a straggler that stays one colour is fixed, one that changes colour wanders.

Both are pure functions of ``dsim.attribution`` outputs (the table rows of one
run and a ``LastOverTime``); numbers are drawn as given, never recomputed.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dsim.attribution import FIXED, FIXED_STRAGGLER_SHARE, WANDERING, LastOverTime
from dsim.render.figures.style import gpu_color, style

TIE_COLOR = "#c7c7c7"
"""Iterations with no single last rank: grey, never a GPU's colour."""


def _rank_shares(table: pd.DataFrame) -> dict[int, float]:
    ranks = table.drop_duplicates("gpu")
    return {int(g): float(p) for g, p in zip(ranks["gpu"], ranks["gpu_last_pct"], strict=True)}


def straggler_text(table: pd.DataFrame) -> str:
    """``fixed straggler: GPU 2 (last in 70 % ≥ 60 %)`` and the like: short, for a subtitle
    that must fit an 800 px page."""
    first = table.iloc[0]
    if first["straggler"] in (FIXED, WANDERING):
        gpu = int(first["straggler_gpu"])
        share, bar = _rank_shares(table)[gpu], f"{FIXED_STRAGGLER_SHARE:.0f} %"
        if first["straggler"] == FIXED:
            return f"fixed straggler: GPU {gpu} (last in {share:.0f} % ≥ {bar})"
        return f"the straggler wanders: GPU {gpu} last most often ({share:.0f} % < {bar})"
    return "no rank alone finished its fetch last"


def _worker_name(worker: int) -> str:
    return f"worker {worker}" if worker >= 0 else "worker ?"


def workers_figure(table: pd.DataFrame, label: str) -> go.Figure:
    """Rank × worker heatmap of ``excess_share_pct`` (one run's ``attribution_table`` rows)."""
    gpus = sorted(int(g) for g in table["gpu"].unique())
    workers = sorted(int(w) for w in table["worker"].unique())
    shape = (len(gpus), len(workers))
    share, fetches = np.full(shape, np.nan), np.zeros(shape)
    mean_s, excess_s = np.full(shape, np.nan), np.zeros(shape)
    for row in table.itertuples():
        at = (gpus.index(int(row.gpu)), workers.index(int(row.worker)))
        share[at], fetches[at] = row.excess_share_pct, row.fetches
        mean_s[at], excess_s[at] = row.fetch_s_mean, row.excess_s
    last = _rank_shares(table)
    ticks = [f"GPU {g} · last {last.get(g, float('nan')):.0f} %" for g in gpus]
    finite = share[np.isfinite(share)]
    top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    fig = go.Figure(
        go.Heatmap(
            z=share,
            x=[_worker_name(w) for w in workers],
            y=ticks,
            zmin=0.0,
            zmax=top,
            colorscale="Purples",
            texttemplate="%{z:.0f} %",
            textfont={"size": 13},
            customdata=np.dstack([fetches, mean_s, excess_s]),
            hovertemplate=(
                "%{y}, %{x}<br>%{z:.1f} % of the fetch time above iteration medians"
                "<br>%{customdata[2]:.3f} s above the median over %{customdata[0]:.0f} fetches"
                "<br>mean fetch %{customdata[1]:.4f} s<extra></extra>"
            ),
            colorbar={"title": {"text": "%"}, "thickness": 14, "len": 0.9},
            xgap=2,
            ygap=2,
        )
    )
    fig.update_xaxes(type="category", title_text="DataLoader worker")
    fig.update_yaxes(type="category", autorange="reversed")
    note = (
        "share of all fetch time above each iteration's median fetch"
        if finite.size
        else "no fetch took longer than its iteration's median"
    )
    title = f"Slowest workers — {html.escape(label)}<br><sup>{note}</sup>"
    height = int(min(900, max(330, 190 + 46 * len(gpus))))
    return style(fig, title, height, margin={"l": 150})


def last_figure(over: LastOverTime, table: pd.DataFrame, label: str) -> go.Figure:
    """Stacked bars: per window of iterations, each rank's share of being last alone, and
    the ties; legend entries carry each rank's share over all selected iterations."""
    last = _rank_shares(table)
    centre = over.first + (over.size - 1) / 2.0
    span = [
        f"epoch {e0}, iteration {i0}" + (f" – epoch {e1}, iteration {i1}" if e1 != e0 else f"–{i1}")
        for (e0, e1), (i0, i1) in zip(over.epoch.tolist(), over.iteration.tolist(), strict=True)
    ]
    fig = go.Figure()
    for j, gpu in enumerate(over.gpus.tolist()):
        fig.add_trace(
            go.Bar(
                x=centre,
                y=over.last_pct[:, j],
                width=over.size,
                name=f"GPU {gpu} ({last.get(gpu, float('nan')):.0f} % overall)",
                marker={"color": gpu_color(j), "line": {"width": 0}},
                customdata=span,
                hovertemplate="%{customdata}<br>last in %{y:.0f} %<extra>GPU " + f"{gpu}</extra>",
            )
        )
    fig.add_trace(
        go.Bar(
            x=centre,
            y=over.tie_pct,
            width=over.size,
            name="no single last (tie)",
            marker={"color": TIE_COLOR, "line": {"width": 0}},
            customdata=span,
            hovertemplate="%{customdata}<br>tie in %{y:.0f} %<extra></extra>",
        )
    )
    fig.update_layout(barmode="stack", bargap=0)
    fig.update_yaxes(title_text="% of the window's iterations", range=[0, 100])
    fig.update_xaxes(title_text="iteration (in order, selected epochs)", rangemode="tozero")
    n = int(over.size.sum())
    title = (
        f"Who finished its fetch last — {html.escape(label)}<br><sup>{n:,} iterations in "
        f"windows of {over.window:,}; {straggler_text(table)}</sup>"
    )
    return style(fig, title, 420)
