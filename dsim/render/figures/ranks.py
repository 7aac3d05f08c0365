"""Per-GPU figures at any rank count: spread across GPUs, the named stragglers, cell labels.

One line per GPU reads well for a handful of ranks and not at all for hundreds:
at 1024 ranks a timeline of one line per GPU and policy is 9,000+ traces and
hundreds of MB that no browser draws in reasonable time, and a colour cycle
repeats long before. Above ``MANY_RANKS`` ranks the figures draw instead, per
iteration, the spread across GPUs (``rank_bands``: median, 10th–90th
percentile, max) and by name the ``TOP_RANKS`` ranks that straggle most
(``top_ranks``); the other ranks are in the bands only. Pure functions of
arrays, so the tests can check a quantile or a ranking against a hand count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MANY_RANKS = 16
"""Above this many ranks, per-GPU figures show quantile bands and the top ranks by name
instead of one line (bar, heatmap row) per GPU (docs/SPEC.md §9.2)."""
TOP_RANKS = 5
"""Ranks named and drawn in their own colour when there are more ranks than colours."""
BAND_QUANTILES = (0.1, 0.5, 0.9)
"""The band's low edge, its middle line and its high edge; the maximum is drawn too."""
RANK_BUCKETS = 16
"""Rows of contiguous ranks a many-rank heatmap sums the ranks not named into."""


@dataclass(frozen=True)
class RankBands:
    """Per iteration, the spread of one metric across GPUs (NaN where no GPU has a value)."""

    p10: np.ndarray
    median: np.ndarray
    p90: np.ndarray
    max: np.ndarray


@dataclass(frozen=True)
class ReducedRanks:
    """A many-rank run's per-GPU stalls reduced to what its timeline draws.

    ``dsim report`` computes it policy by policy while reading, so that no policy's
    [iterations, GPUs] stall table outlives its own reduction (at 1024 ranks × 10,000
    iterations the full tables of nine policies took 4.7 GB): the frames handed to the
    timeline then hold the per-iteration columns and the named ranks' stalls only.
    """

    columns: list[str]
    """Every GPU's stall column (``stall_s_gpu<N>``), in rank order."""
    named: np.ndarray
    """Positions in ``columns`` of the ranks drawn by name (``stall_stragglers``)."""
    share: np.ndarray
    """Per GPU, the share of iterations it alone stalled longest (``largest_share``) in the
    reference replay (the measured one where there is one)."""
    bands: dict[tuple[str, str], RankBands]
    """Per policy, ``rank_bands`` of its stalls over every GPU."""


def rank_bands(values: np.ndarray) -> RankBands:
    """Per row of ``values`` ([iterations, GPUs]) its 10th percentile, median, 90th
    percentile (linear interpolation, NumPy's default) and maximum over the GPUs; NaN
    values (a GPU without a sample) are ignored."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"rank_bands needs [iterations, GPUs], got shape {v.shape}")
    n = v.shape[0]
    if n == 0 or v.shape[1] == 0:
        empty = np.full(n, np.nan)
        return RankBands(empty, empty.copy(), empty.copy(), empty.copy())
    rows = np.isfinite(v).any(axis=1)
    out = np.full((len(BAND_QUANTILES), n), np.nan)
    peak = np.full(n, np.nan)
    if rows.all() and np.isfinite(v).all():
        out[:] = np.quantile(v, BAND_QUANTILES, axis=1)
        peak[:] = v.max(axis=1)
    elif rows.any():
        out[:, rows] = np.nanquantile(v[rows], BAND_QUANTILES, axis=1)
        peak[rows] = np.nanmax(v[rows], axis=1)
    return RankBands(p10=out[0], median=out[1], p90=out[2], max=peak)


def largest_share(values: np.ndarray) -> np.ndarray:
    """Per GPU (column of ``values``), the share of iterations (rows) in which it alone has
    the largest value: for stalls, the rank the others waited for. Ties count for no one."""
    v = np.asarray(values, dtype=np.float64)
    n, g = v.shape
    if n == 0 or g == 0:
        return np.zeros(g)
    filled = np.where(np.isnan(v), -np.inf, v)
    top = filled.max(axis=1, keepdims=True)
    alone = (filled == top).sum(axis=1) == 1
    counts = np.bincount(filled[alone].argmax(axis=1), minlength=g)
    return counts / n


def top_ranks(primary: np.ndarray, secondary: np.ndarray, k: int = TOP_RANKS) -> np.ndarray:
    """Positions of the ``k`` ranks with the largest ``primary`` score, ties broken by the
    larger ``secondary`` and then the lower position; ranks scoring zero (or NaN) on both
    are never named, so fewer than ``k`` may come back. Order: the worst first."""
    p = np.nan_to_num(np.asarray(primary, dtype=np.float64), nan=0.0)
    s = np.nan_to_num(np.asarray(secondary, dtype=np.float64), nan=0.0)
    if p.shape != s.shape:
        raise ValueError(f"scores of different lengths: {p.shape} and {s.shape}")
    order = np.lexsort((np.arange(len(p)), -s, -p))
    order = order[(p[order] > 0) | (s[order] > 0)]
    return order[: max(k, 0)]


def stall_stragglers(values: np.ndarray, k: int = TOP_RANKS) -> np.ndarray:
    """Positions of the ``k`` GPUs (columns) that most often alone have the largest stall,
    ties broken by the larger mean stall: the ranks the others wait for."""
    v = np.asarray(values, dtype=np.float64)
    if v.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(v)
        mean = np.where(finite, v, 0.0).sum(axis=0) / np.maximum(finite.sum(axis=0), 1)
    return top_ranks(largest_share(v), mean, k)


def rank_buckets(gpus: list[int], n_buckets: int = RANK_BUCKETS) -> list[list[int]]:
    """``gpus`` (in order) cut into at most ``n_buckets`` runs of consecutive entries of
    near-equal length: the rows a many-rank heatmap sums the unnamed ranks into."""
    if not gpus:
        return []
    parts = np.array_split(np.asarray(gpus), min(n_buckets, len(gpus)))
    return [[int(g) for g in p] for p in parts if len(p)]


def bucket_label(gpus: list[int]) -> str:
    """``GPUs 0–63 (62 ranks)``: the range a bucket spans and how many ranks it sums."""
    if len(gpus) == 1:
        return f"GPU {gpus[0]}"
    return f"GPUs {gpus[0]}–{gpus[-1]} ({len(gpus)} ranks)"


def percent_text(value: float) -> str:
    """A percentage as a label: two significant digits below 1 %, one decimal below 10 %,
    whole numbers above; where whole numbers would read "0 %" or "1 %" for every rank of
    a large run (1024 ranks share 100 % at about 0.1 % each). Exactly nothing is "0 %",
    NaN a dash."""
    if not np.isfinite(value):
        return "–"
    if value == 0:
        return "0 %"
    if abs(value) < 0.995:
        return f"{value:.2g} %"
    return f"{value:.1f} %" if abs(value) < 9.95 else f"{value:.0f} %"
