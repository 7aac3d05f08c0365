"""The node's CPU demand per iteration span, summed over the few rows that can reach it.

Why: the CPU-aware replay asks, eight times per policy (``pipeline.TRAINER_PASSES``),
how much CPU every fetch of a node wants during each iteration's span
(``cpu_share.overlap_rate``). Its sweep sorts every fetch's start and end, half of the
CPU-aware headline's time (BENCHMARKS.md, "The CPU-aware headline's time"). But a
replayed fetch lives near its own row: it starts once its batch is requested, at most a
prefetch window of rows earlier, and ends before its row's iteration does. So each
span is reached by a short band of rows, which two running bounds find: rows whose
fetches all ended before the span (a prefix maximum of the rows' last end) and rows
whose fetches all start after it (a suffix minimum of their first start). Summing the
band's overlaps directly costs O(band × ranks) per span and allocates nothing beyond
the bounds; where the bands are wide (inputs without that structure) the caller sorts.
The sum is the definition's, Σ rate × |[s, e) ∩ [lo, hi)|, so it agrees with the sweep
to float rounding (closer than the sweep to the exact value: the sweep subtracts two
integrals over the whole run).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dsim.replay.models.jitcache import can_cache

_CACHE = can_cache(__file__)


@njit(cache=_CACHE)
def _valid(s, e, r):  # pragma: no cover - compiled
    """Whether an interval counts: finite, not empty, of a finite rate."""
    return np.isfinite(s) and np.isfinite(e) and e > s and np.isfinite(r)


@njit(cache=_CACHE)
def _reach(starts, ends, rates):  # pragma: no cover - compiled
    """Per row, the latest end of its and every earlier row's intervals, and the
    earliest start of its and every later row's (both never decrease)."""
    n, c = starts.shape
    last_end = np.empty(n)
    first_start = np.empty(n)
    running = -np.inf
    for j in range(n):
        for k in range(c):
            if _valid(starts[j, k], ends[j, k], rates[j, k]):
                running = max(running, ends[j, k])
        last_end[j] = running
    running = np.inf
    for j in range(n - 1, -1, -1):
        for k in range(c):
            if _valid(starts[j, k], ends[j, k], rates[j, k]):
                running = min(running, starts[j, k])
        first_start[j] = running
    return last_end, first_start


def row_bands(
    starts: np.ndarray,
    ends: np.ndarray,
    rates: np.ndarray,
    span_lo: np.ndarray,
    span_hi: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per span, the rows [first, stop) whose intervals may overlap it ([M] each).

    ``first``: the first row whose running latest end passes the span's start
    (every earlier row ended by then); ``stop``: the first row from which every
    interval starts at or after the span's end. A span of no length (or NaN) gets
    an empty band."""
    last_end, first_start = _reach(starts, ends, rates)
    first = np.searchsorted(last_end, span_lo, side="right")
    stop = np.searchsorted(first_start, span_hi, side="left")
    np.maximum(stop, first, out=stop)
    empty = ~(span_hi - span_lo > 0.0)
    stop[empty] = first[empty]
    return first, stop


@njit(cache=_CACHE)
def banded_overlap_rate(starts, ends, rates, span_lo, span_hi, first, stop):  # pragma: no cover
    """Per span, Σ rate × |[s, e) ∩ [lo, hi)| / (hi − lo) over the rows of its band;
    NaN for a span of no length (or NaN ends), as ``cpu_share.overlap_rate``."""
    c = starts.shape[1]
    m = span_lo.shape[0]
    out = np.empty(m)
    for i in range(m):
        lo, hi = span_lo[i], span_hi[i]
        length = hi - lo
        if not length > 0.0:
            out[i] = np.nan
            continue
        total = 0.0
        for j in range(first[i], stop[i]):
            for k in range(c):
                s, e, r = starts[j, k], ends[j, k], rates[j, k]
                if _valid(s, e, r):
                    covered = min(e, hi) - max(s, lo)
                    if covered > 0.0:
                        total += r * covered
        out[i] = total / length
    return out


@njit(cache=_CACHE)
def node_spans(end, first, iteration_s):  # pragma: no cover - compiled
    """Each iteration's span on a node ([N] lo, hi): from the node's earliest end of
    iteration k − 1 to its latest end of k; in a segment's ``first`` row, its replayed
    iteration time before that end. ``end``: [N, G] of the node's ranks; a NaN end makes
    its spans NaN, as NumPy's ``min``/``max`` over the row would."""
    n, c = end.shape
    lo = np.empty(n)
    hi = np.empty(n)
    for j in range(n):
        latest, earliest = -np.inf, np.inf
        for k in range(c):
            v = end[j, k]
            if np.isnan(v):
                latest, earliest = np.nan, np.nan
                break
            latest = max(latest, v)
            earliest = min(earliest, v)
        hi[j] = latest
        if j + 1 < n:
            lo[j + 1] = earliest
    for j in range(n):
        if first[j] or j == 0:
            lo[j] = hi[j] - iteration_s[j]
    return lo, hi
