"""The replay kernel: DESIGN.md §3 as pure NumPy functions over [iterations × GPUs] arrays.

Contract: ``replay(arrays, policy, params) -> Replay``. No I/O, no pandas, no
Python loop over iterations. Every iteration is replayed on its own, so the
kernel can be fed any slice of iterations (execution chunks them freely) and
the result of a slice equals the same slice of the whole.

Layout. Reductions run over the GPUs of one iteration. Python loops over the
G GPU *columns* (G is small) with NumPy doing each column at once; arrays are
kept column-major (Fortran order) by ``prepare`` so that each column is
contiguous. Quantities every policy needs (fetch done ``D``, row min/max of
``S``, ``F``, ``ST`` and ``T``, the mean fetch time) are computed once per run
by ``prepare`` and shared by all nine policies.

Exactness. Floating-point operations are chosen so that the kernel is bitwise
equal to the row-by-row reference in ``tests/reference_replay.py`` for every
quantity that drives a decision:

* the ``avg`` fetch duration sums the GPU columns *sequentially*
  (``acc = F[:,0]; acc = acc + F[:,1]; ...; acc / G``), exactly as
  ``sum(row) / G`` does in Python, so gap signs always agree;
* the ``avg`` start is ``smax - (smax - smin) / 2``, the original formula;
* ``ST + |gap|`` equals ``ST - gap`` in IEEE arithmetic when ``gap < 0``, so one
  subtraction serves both branches.

Iteration time. DESIGN.md defines it as ``max ST' + max_g (T[g] - max ST)``.
Literally evaluated, ``actual/actual`` gives ``max ST + (max T - max ST)``,
which can differ from the measured ``max T`` in the last bit. The kernel
evaluates the algebraically equal ``max T + (max ST' - max ST)`` instead:
``max_g (T[g] - c) == max_g T[g] - c`` holds exactly in floating point
(rounding is monotonic), so the two forms differ only in the rounding of one
addition (a few ulp, tested against the reference to 1e-12), and whenever no
stall changes (``actual/actual`` in particular) ``max ST' - max ST`` is exactly
0 and the measured ``max T`` comes back bit for bit.

Memory: ``prepare`` keeps 5 float64 values per GPU-iteration (S, F, D, ST, T:
40 bytes) plus 10 per iteration; one replay adds 8 bytes per GPU-iteration
(``gpu_stall_s``) and 5 values per iteration, with O(iterations) temporaries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsim.iterations import IterationArrays
from dsim.policies import ACTUAL, AVG, MIN, POLICIES, Policy
from dsim.results import METRIC_COLUMNS


@dataclass(frozen=True)
class ReplayParams:
    """Thresholds of DESIGN.md §3, defaults as in the original analysis."""

    stall_floor_s: float = 0.000002
    stall_grow_min_s: float = 0.01


@dataclass(frozen=True)
class Replay:
    """Per-iteration results of one policy; arrays of length N (iterations)."""

    iteration_s: np.ndarray
    stall_s: np.ndarray
    delay_s: np.ndarray
    fetch_diff_s: np.ndarray
    start_diff_s: np.ndarray
    gpu_stall_s: np.ndarray  # [N, G] replayed stall ST' per GPU

    def metrics(self) -> dict[str, np.ndarray]:
        """The per-iteration metric columns of a replay table (``dsim.results``)."""
        return {name: getattr(self, name) for name in METRIC_COLUMNS}


@dataclass(frozen=True)
class Prepared:
    """Policy-independent quantities of one run, computed once by ``prepare``.

    [N, G] arrays are Fortran-ordered (contiguous per GPU); the rest are [N].
    """

    start: np.ndarray
    fetch: np.ndarray
    done: np.ndarray
    stall: np.ndarray
    max_iteration: np.ndarray
    max_stall: np.ndarray
    min_start: np.ndarray
    max_start: np.ndarray
    mid_start: np.ndarray
    min_fetch: np.ndarray
    max_fetch: np.ndarray
    avg_fetch: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.start.shape  # type: ignore[return-value]


def _columns_reduce(a: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """Reduce an [N, G] array over GPUs one column at a time (fast on Fortran order)."""
    acc = np.array(a[:, 0], dtype=np.float64, copy=True)
    for g in range(1, a.shape[1]):
        ufunc(acc, a[:, g], out=acc)
    return acc


def _sequential_mean(a: np.ndarray) -> np.ndarray:
    """Row mean by left-to-right summation, bitwise equal to Python's ``sum(row) / G``."""
    acc = np.array(a[:, 0], dtype=np.float64, copy=True)
    for g in range(1, a.shape[1]):
        np.add(acc, a[:, g], out=acc)
    return acc / a.shape[1]


def _as_matrix(name: str, a: np.ndarray, shape: tuple[int, int] | None) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [iterations, GPUs] array, got shape {a.shape}")
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    return np.asfortranarray(a)


def prepare_columns(
    start: np.ndarray, fetch: np.ndarray, iteration_time: np.ndarray, stall: np.ndarray
) -> Prepared:
    """Precompute what all policies share from plain [N, G] arrays (seconds)."""
    s = _as_matrix("start", start, None)
    shape = s.shape
    f = _as_matrix("fetch", fetch, shape)
    t = _as_matrix("iteration_time", iteration_time, shape)
    st = _as_matrix("stall", stall, shape)
    n, g = shape
    if g == 0:
        empty = np.zeros(n, dtype=np.float64)
        return Prepared(s, f, s + f, st, *([empty] * 8))
    min_start = _columns_reduce(s, np.minimum)
    max_start = _columns_reduce(s, np.maximum)
    return Prepared(
        start=s,
        fetch=f,
        done=np.asfortranarray(s + f),
        stall=st,
        max_iteration=_columns_reduce(t, np.maximum),
        max_stall=_columns_reduce(st, np.maximum),
        min_start=min_start,
        max_start=max_start,
        mid_start=max_start - (max_start - min_start) / 2,
        min_fetch=_columns_reduce(f, np.minimum),
        max_fetch=_columns_reduce(f, np.maximum),
        avg_fetch=_sequential_mean(f),
    )


def prepare(arrays: IterationArrays) -> Prepared:
    """Precompute what all policies of one run share (do it once per run)."""
    return prepare_columns(arrays.start, arrays.fetch, arrays.iteration_time, arrays.stall)


def _check_policy(policy: Policy) -> None:
    for side in policy:
        if side not in POLICIES:
            raise ValueError(f"unknown policy {side!r}; expected one of {', '.join(POLICIES)}")


def replay_prepared(
    prep: Prepared, policy: Policy, params: ReplayParams = ReplayParams()
) -> Replay:
    """Replay every iteration of a prepared run under ``policy`` (DESIGN.md §3)."""
    _check_policy(policy)
    fetch_align, start_align = policy
    n, g_count = prep.shape
    gpu_stall = np.empty((n, g_count), dtype=np.float64, order="F")
    if g_count == 0:
        empty = np.zeros(n, dtype=np.float64)
        return Replay(empty, empty.copy(), empty.copy(), empty.copy(), empty.copy(), gpu_stall)

    aligned_fetch = {MIN: prep.min_fetch, AVG: prep.avg_fetch}.get(fetch_align)
    aligned_start = {MIN: prep.min_start, AVG: prep.mid_start}.get(start_align)
    floor = params.stall_floor_s
    grow_min = params.stall_grow_min_s

    for g in range(g_count):
        st = prep.stall[:, g]
        if fetch_align == ACTUAL and start_align == ACTUAL:
            # D' == D, so every gap is exactly 0 and ST' == ST: skip the arithmetic.
            gpu_stall[:, g] = st
            continue
        s_new = prep.start[:, g] if aligned_start is None else aligned_start
        f_new = prep.fetch[:, g] if aligned_fetch is None else aligned_fetch
        gap = prep.done[:, g] - (s_new + f_new)
        new = st - gap  # ST - gap when gap > 0; ST + |gap| when gap < 0 (IEEE-identical)
        np.copyto(new, floor, where=(gap > 0) & (new < 0))
        np.copyto(new, st, where=(gap < 0) & ~(st > grow_min))
        gpu_stall[:, g] = new

    max_new = _columns_reduce(gpu_stall, np.maximum)
    min_new = _columns_reduce(gpu_stall, np.minimum)
    zeros = np.zeros(n, dtype=np.float64)
    fetch_diff = prep.max_fetch - prep.min_fetch if fetch_align == ACTUAL else zeros
    start_diff = prep.max_start - prep.min_start if start_align == ACTUAL else zeros.copy()
    return Replay(
        iteration_s=prep.max_iteration + (max_new - prep.max_stall),
        stall_s=max_new,
        delay_s=max_new - min_new,
        fetch_diff_s=fetch_diff,
        start_diff_s=start_diff,
        gpu_stall_s=gpu_stall,
    )


def replay(
    arrays: IterationArrays | Prepared, policy: Policy, params: ReplayParams = ReplayParams()
) -> Replay:
    """Replay one run under one policy; pass ``prepare(arrays)`` to share work across policies."""
    prep = arrays if isinstance(arrays, Prepared) else prepare(arrays)
    return replay_prepared(prep, policy, params)
