"""Whose loader is late: the attribution figures of one run (docs/SPEC.md §5.2, §9.2).

* ``workers_figure``: rank × worker heatmap of each (GPU, worker)'s share of all
  fetch time above its iteration's median fetch (``excess_share_pct``): which
  workers produce the slowest fetches. The GPU labels carry each rank's share of
  iterations in which it alone finished its fetch last.
* ``last_figure``: per window of consecutive selected iterations, the share in
  which each rank alone finished its fetch last, stacked with the share of ties:
  a straggler that stays one colour is fixed, one that changes colour wanders.

Both are pure functions of ``dsim.analysis.attribution`` outputs (the table rows of one
run and a ``LastOverTime``); numbers are drawn as given, never recomputed, except
that above ``MANY_RANKS`` ranks the ranks not named (``TOP_RANKS`` most often last
are) are grouped: into rows of contiguous ranks in the heatmap (each cell the mean
rank of its range, its label the range's summed "last" share), into one grey
"other GPUs" bar, their shares summed, in the figure of who was last.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dsim.analysis.attribution import FIXED, FIXED_STRAGGLER_SHARE, WANDERING, LastOverTime
from dsim.render.figures.ranks import (
    MANY_RANKS,
    TOP_RANKS,
    bucket_label,
    percent_text,
    rank_buckets,
    top_ranks,
)
from dsim.render.figures.style import GPU_COLORS, OTHER_GPU_COLOR, rank_colors, style

TIE_COLOR = "#c7c7c7"
"""Iterations with no single last rank: grey, never a GPU's colour."""


MAX_CELL_TEXT_ROWS = 40
"""Above this many heatmap rows (or columns) cells are too small to hold a number: the
hover still gives it."""


def _rank_shares(table: pd.DataFrame) -> dict[int, float]:
    ranks = table.drop_duplicates("gpu")
    return {int(g): float(p) for g, p in zip(ranks["gpu"], ranks["gpu_last_pct"], strict=True)}


def named_ranks(table: pd.DataFrame, k: int = TOP_RANKS) -> list[int]:
    """The ``k`` GPUs most often alone last to finish their fetch, ties broken by the
    larger share of the fetch time above iteration medians (``top_ranks``), worst first."""
    ranks = sorted(int(g) for g in table["gpu"].unique())
    last = _rank_shares(table)
    excess = table.groupby("gpu")["excess_share_pct"].sum()
    primary = np.array([last.get(g, 0.0) for g in ranks])
    secondary = np.array([float(excess.get(g, 0.0)) for g in ranks])
    return [ranks[j] for j in top_ranks(primary, secondary, k)]


def _heatmap_rows(table: pd.DataFrame) -> tuple[list[str], list[list[int]]]:
    """The heatmap's rows: one per GPU up to ``MANY_RANKS``; beyond, one per named rank and
    ``RANK_BUCKETS`` rows summing the others in order. Labels carry each rank's share of
    iterations in which it alone was last."""
    gpus = sorted(int(g) for g in table["gpu"].unique())
    last = _rank_shares(table)
    if len(gpus) <= MANY_RANKS:
        groups = [[g] for g in gpus]
    else:
        named = named_ranks(table)
        rest = [g for g in gpus if g not in set(named)]
        groups = [[g] for g in named] + rank_buckets(rest)
    labels = []
    for group in groups:
        if len(group) == 1:
            g = group[0]
            labels.append(f"GPU {g} · last {percent_text(last.get(g, float('nan')))}")
        else:
            share = sum(last.get(g, 0.0) for g in group)
            labels.append(f"{bucket_label(group)} · last {percent_text(share)}")
    return labels, groups


def straggler_text(table: pd.DataFrame) -> str:
    """The straggler in the words of the terminal's straggler line (``describe``), cut
    before the other ranks' shares: ``Straggler: mostly GPU 3's loader — it finished its
    fetch last in 54 % of iterations (below the 60 % of a fixed one)``. A tie at the top
    names no rank, as the terminal does. Percentages as the figures' labels
    (``percent_text``: no "0 %" for a rank of a large run)."""
    first = table.iloc[0]
    bar = f"{FIXED_STRAGGLER_SHARE:.0f} %"
    shares = sorted(_rank_shares(table).items(), key=lambda gs: (-gs[1], gs[0]))
    shares = [(g, s) for g, s in shares if s > 0]
    if first["straggler"] == FIXED:
        gpu = int(first["straggler_gpu"])
        share = percent_text(_rank_shares(table)[gpu])
        return (
            f"Straggler: GPU {gpu}'s loader, fixed — it finished its fetch last in {share} "
            "of iterations"
        )
    if first["straggler"] == WANDERING:
        if not shares or (len(shares) > 1 and shares[1][1] == shares[0][1]):
            return f"Straggler wanders between ranks (none is last in ≥ {bar} of iterations)"
        gpu, share = shares[0]
        return (
            f"Straggler: mostly GPU {gpu}'s loader — it finished its fetch last in "
            f"{percent_text(share)} of iterations (below the {bar} of a fixed one)"
        )
    return "Straggler: none (no rank alone finished its fetch last)"


def _worker_name(worker: int) -> str:
    return f"worker {worker}" if worker >= 0 else "worker ?"


def workers_figure(table: pd.DataFrame, label: str) -> go.Figure:
    """Rank × worker heatmap of ``excess_share_pct`` (one run's ``attribution_table`` rows);
    above ``MANY_RANKS`` ranks, the named ranks and rows of the others summed."""
    labels, groups = _heatmap_rows(table)
    row_of = {g: i for i, group in enumerate(groups) for g in group}
    workers = sorted(int(w) for w in table["worker"].unique())
    column_of = {w: i for i, w in enumerate(workers)}
    shape = (len(groups), len(workers))
    share, fetches = np.zeros(shape), np.zeros(shape)
    seen = np.zeros(shape, bool)
    fetch_time, excess_s = np.zeros(shape), np.zeros(shape)
    for row in table.itertuples():
        at = (row_of[int(row.gpu)], column_of[int(row.worker)])
        seen[at] = True
        share[at] += row.excess_share_pct
        fetches[at] += row.fetches
        fetch_time[at] += row.fetch_s_mean * row.fetches
        excess_s[at] += row.excess_s
    # a row of several ranks shows its mean rank, so that its colour compares with a named
    # rank's (a sum of 64 small shares would outshine the one straggler)
    size = np.array([len(g) for g in groups], dtype=float)[:, None]
    share, excess_s = share / size, excess_s / size
    share[~seen] = np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_s = np.where(fetches > 0, fetch_time / fetches, np.nan)
    finite = share[np.isfinite(share)]
    top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    small = max(shape) > MAX_CELL_TEXT_ROWS
    text = [["" if small else percent_text(v) for v in line] for line in share]
    fig = go.Figure(
        go.Heatmap(
            z=share,
            x=[_worker_name(w) for w in workers],
            y=labels,
            zmin=0.0,
            zmax=top,
            colorscale="Purples",
            text=text,
            texttemplate="%{text}",
            textfont={"size": 13},
            customdata=np.dstack([fetches, mean_s, excess_s]),
            hovertemplate=(
                "%{y}, %{x}<br>%{z:.2f} % of the fetch time above iteration medians"
                "<br>%{customdata[2]:.3f} s above the median; %{customdata[0]:.0f} fetches"
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
    gpus = len(row_of)
    if gpus > MANY_RANKS:
        note += (
            f"; {gpus:,} GPUs: the {len(groups) - sum(len(g) > 1 for g in groups)} most often "
            "last, then the others by rank range (the range's mean rank)"
        )
    title = f"Slowest workers — {html.escape(label)}<br><sup>{note}</sup>"
    height = int(min(900, max(330, 190 + 46 * len(groups))))
    return style(fig, title, height, margin={"l": 240 if gpus > MANY_RANKS else 150})


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
    gpus = [int(g) for g in over.gpus.tolist()]
    position = {g: j for j, g in enumerate(gpus)}
    named = named_ranks(table) if len(gpus) > len(GPU_COLORS) else gpus
    named = [g for g in named if g in position]
    colors = rank_colors(len(gpus), [position[g] for g in named])
    many = len(gpus) > MANY_RANKS
    for gpu in named if many else gpus:
        j = position[gpu]
        fig.add_trace(
            go.Bar(
                x=centre,
                y=over.last_pct[:, j],
                width=over.size,
                name=f"GPU {gpu} ({percent_text(last.get(gpu, float('nan')))} overall)",
                marker={"color": colors[j], "line": {"width": 0}},
                customdata=span,
                hovertemplate="%{customdata}<br>last in %{y:.1f} %<extra>GPU " + f"{gpu}</extra>",
            )
        )
    if many:
        rest = [position[g] for g in gpus if g not in set(named)]
        overall = sum(last.get(gpus[j], 0.0) for j in rest)
        fig.add_trace(
            go.Bar(
                x=centre,
                y=over.last_pct[:, rest].sum(axis=1),
                width=over.size,
                name=f"{len(rest):,} other GPUs ({percent_text(overall)} overall)",
                marker={"color": OTHER_GPU_COLOR, "line": {"width": 0}},
                customdata=span,
                hovertemplate="%{customdata}<br>one of them last in %{y:.1f} %"
                f"<extra>{len(rest):,} other GPUs</extra>",
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
            hovertemplate="%{customdata}<br>tie in %{y:.1f} %<extra></extra>",
        )
    )
    fig.update_layout(barmode="stack", bargap=0)
    fig.update_yaxes(title_text="% of the window's iterations", range=[0, 100])
    fig.update_xaxes(title_text="iteration (in order, selected epochs)", rangemode="tozero")
    n = int(over.size.sum())
    straggler = html.escape(straggler_text(table), quote=False)
    title = (
        f"Who finished its fetch last — {html.escape(label)}<br><sup>{n:,} iterations in "
        f"windows of {over.window:,}</sup><br><sup>{straggler}</sup>"
    )
    # the straggler on a line of its own: the terminal's words do not fit beside the rest
    return style(fig, title, 440, margin={"t": 122})
