"""The replay kernel: docs/SPEC.md §4.1 as pure NumPy functions over [iterations × GPUs] arrays.

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

Blocking. A column loop makes G passes over per-iteration accumulators (row
max/min, temporaries) of length N. Once those no longer fit in the L2 cache
(N of a few 10^5) every pass streams them from memory and the cost per
GPU-iteration jumps. So both ``prepare_columns`` and ``replay_prepared`` walk
the iterations in blocks of ``BLOCK_ROWS`` (``_row_blocks``): the
accumulators of one block stay in cache while the G columns of that block go
by, and the inputs are read once. Iterations are independent and every
operation is the same one, per element, in the same order, so results do not
depend on the block size (bitwise).

Exactness. Floating-point operations are chosen so that the kernel is bitwise
equal to the row-by-row reference in ``tests/reference_replay.py`` for every
quantity that drives a decision:

* the ``avg`` fetch duration sums the GPU columns *sequentially*
  (``acc = F[:,0]; acc = acc + F[:,1]; ...; acc / G``), exactly as
  ``sum(row) / G`` does in Python, so gap signs always agree;
* the ``avg`` start is ``smax - (smax - smin) / 2``, the original formula;
* ``ST + |gap|`` equals ``ST - gap`` in IEEE arithmetic when ``gap < 0``, so one
  subtraction serves both branches.

Iteration time. docs/SPEC.md §4.1 defines it as ``max ST' + max_g (T[g] - max ST)``.
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
(``gpu_stall_s``) and 5 values per iteration, with temporaries of one block.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dsim.replay.models.base import Replay, ReplayModel
from dsim.replay.params import DEFAULT_PARAMS, ReplayParams
from dsim.replay.policies import REGISTRY, Policy

if TYPE_CHECKING:
    from dsim.replay.arrays import IterationArrays

__all__ = [
    "BLOCK_ROWS",
    "PerIterationModel",
    "Prepared",
    "Replay",
    "ReplayParams",
    "prepare",
    "prepare_columns",
    "replay",
    "replay_prepared",
]


@dataclass(frozen=True)
class Prepared:
    """Policy-independent quantities of one run, computed once by ``prepare``.

    [N, G] arrays are Fortran-ordered (contiguous per GPU); the rest are [N].
    ``fetch_aligned``/``start_aligned`` hold, per registered alignment that
    is not the identity, the value every GPU takes on (``dsim.replay.policies``).
    """

    start: np.ndarray
    fetch: np.ndarray
    done: np.ndarray
    stall: np.ndarray
    max_iteration: np.ndarray
    max_stall: np.ndarray
    min_start: np.ndarray
    max_start: np.ndarray
    min_fetch: np.ndarray
    max_fetch: np.ndarray
    fetch_aligned: dict[str, np.ndarray] = field(default_factory=dict)
    start_aligned: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return self.start.shape  # type: ignore[return-value]

    def take(self, lo: int, hi: int) -> Prepared:
        """The rows ``[lo, hi)`` (every array is indexed by iteration first)."""
        return Prepared(
            **{name: getattr(self, name)[lo:hi] for name in _ARRAY_FIELDS},
            fetch_aligned={k: v[lo:hi] for k, v in self.fetch_aligned.items()},
            start_aligned={k: v[lo:hi] for k, v in self.start_aligned.items()},
        )


#: Iterations per block (see "Blocking" above). A replay keeps about 5 [block]
#: float64 accumulators and temporaries hot while the G columns go by: 16,384
#: rows are 128 KiB each, ~0.7 MiB in all, well inside a 2 MiB L2, and large
#: enough that NumPy's fixed cost per call (~1 µs) stays small. Chosen by
#: measurement (bench/bench_replay.py); any value gives identical results.
BLOCK_ROWS = 16_384


def _row_blocks(n: int) -> Iterator[slice]:
    """Row ranges of at most ``BLOCK_ROWS`` iterations covering ``0..n``; none if ``n == 0``."""
    for lo in range(0, n, BLOCK_ROWS):
        yield slice(lo, min(lo + BLOCK_ROWS, n))


def _columns_reduce(a: np.ndarray, ufunc: np.ufunc, out: np.ndarray) -> np.ndarray:
    """Reduce an [n, G] block over GPUs one column at a time, left to right, into ``out``."""
    np.copyto(out, a[:, 0])
    for g in range(1, a.shape[1]):
        ufunc(out, a[:, g], out=out)
    return out


def _as_matrix(name: str, a: np.ndarray, shape: tuple[int, int] | None) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [iterations, GPUs] array, got shape {a.shape}")
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    return np.asfortranarray(a)


#: The [N] fields of ``Prepared`` that every policy needs, one value per iteration.
_ROW_FIELDS = (
    "max_iteration",
    "max_stall",
    "min_start",
    "max_start",
    "min_fetch",
    "max_fetch",
)
_ARRAY_FIELDS = ("start", "fetch", "done", "stall", *_ROW_FIELDS)


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
    fetch_names = [a.name for a in REGISTRY.values() if a.fetch is not None]
    start_names = [a.name for a in REGISTRY.values() if a.start is not None]
    if g == 0:
        empty = np.zeros(n, dtype=np.float64)
        return Prepared(
            s,
            f,
            s + f,
            st,
            *([empty] * len(_ROW_FIELDS)),
            fetch_aligned={name: empty for name in fetch_names},
            start_aligned={name: empty for name in start_names},
        )
    rows = {name: np.empty(n, dtype=np.float64) for name in _ROW_FIELDS}
    fetch_aligned = {name: np.empty(n, dtype=np.float64) for name in fetch_names}
    start_aligned = {name: np.empty(n, dtype=np.float64) for name in start_names}
    for b in _row_blocks(n):
        r = {name: column[b] for name, column in rows.items()}
        _columns_reduce(t[b], np.maximum, r["max_iteration"])
        _columns_reduce(st[b], np.maximum, r["max_stall"])
        _columns_reduce(s[b], np.minimum, r["min_start"])
        _columns_reduce(s[b], np.maximum, r["max_start"])
        _columns_reduce(f[b], np.minimum, r["min_fetch"])
        _columns_reduce(f[b], np.maximum, r["max_fetch"])
        for name, out in fetch_aligned.items():
            out[b] = REGISTRY[name].fetch(f[b])  # type: ignore[misc]
        for name, out in start_aligned.items():
            out[b] = REGISTRY[name].start(s[b])  # type: ignore[misc]
    return Prepared(
        start=s,
        fetch=f,
        done=np.asfortranarray(s + f),
        stall=st,
        **rows,
        fetch_aligned=fetch_aligned,
        start_aligned=start_aligned,
    )


def prepare(arrays: IterationArrays) -> Prepared:
    """Precompute what all policies of one run share (do it once per run)."""
    return prepare_columns(arrays.start, arrays.fetch, arrays.iteration_time, arrays.stall)


def _check_policy(policy: Policy) -> None:
    for side in policy:
        if side not in REGISTRY:
            raise ValueError(f"unknown policy {side!r}; expected one of {', '.join(REGISTRY)}")
        if REGISTRY[side].stall is not None:  # it would otherwise replay as ``actual``
            raise ValueError(f"{side} is a stall alignment: the stall-only model replays it")
    if REGISTRY[policy[0]].fetch is None and REGISTRY[policy[0]].start is not None:
        raise ValueError(f"{policy[0]} aligns starts only: it cannot stand on the fetch side")


def replay_prepared(
    prep: Prepared, policy: Policy, params: ReplayParams = DEFAULT_PARAMS
) -> Replay:
    """Replay every iteration of a prepared run under ``policy`` (docs/SPEC.md §4.1)."""
    _check_policy(policy)
    fetch_align, start_align = policy
    n, g_count = prep.shape
    gpu_stall = np.empty((n, g_count), dtype=np.float64, order="F")
    if g_count == 0:
        empty = np.zeros(n, dtype=np.float64)
        return Replay(empty, empty.copy(), empty.copy(), empty.copy(), empty.copy(), gpu_stall)

    aligned_fetch = prep.fetch_aligned.get(fetch_align)
    aligned_start = prep.start_aligned.get(start_align)
    floor = params.stall_floor_s
    grow_min = params.stall_grow_min_s
    unchanged = aligned_fetch is None and aligned_start is None

    max_new = np.empty(n, dtype=np.float64)  # = stall_s
    delay = np.empty(n, dtype=np.float64)  # min ST' until the end of each block
    iteration = np.empty(n, dtype=np.float64)
    fetch_diff = np.zeros(n, dtype=np.float64)  # aligned fetches all end up equal: 0
    start_diff = np.zeros(n, dtype=np.float64)
    block = min(n, BLOCK_ROWS)
    new_done = np.empty(block, dtype=np.float64)
    gap = np.empty(block, dtype=np.float64)
    cut = np.empty(block, dtype=bool)  # gap > 0 and ST' < 0: floor it
    keep = np.empty(block, dtype=bool)  # gap < 0 and not ST > grow_min: keep ST
    for b in _row_blocks(n):
        m = b.stop - b.start
        nd, gp, ct, kp = new_done[:m], gap[:m], cut[:m], keep[:m]
        mx, mn = max_new[b], delay[b]
        if aligned_fetch is not None and aligned_start is not None:
            np.add(aligned_start[b], aligned_fetch[b], out=nd)  # the same for every GPU
        for g in range(g_count):
            st = prep.stall[b, g]
            new = gpu_stall[b, g]
            if unchanged:
                # D' == D, so every gap is exactly 0 and ST' == ST: skip the arithmetic.
                np.copyto(new, st)
            else:
                if aligned_fetch is None or aligned_start is None:
                    s_new = prep.start[b, g] if aligned_start is None else aligned_start[b]
                    f_new = prep.fetch[b, g] if aligned_fetch is None else aligned_fetch[b]
                    np.add(s_new, f_new, out=nd)
                np.subtract(prep.done[b, g], nd, out=gp)
                # ST - gap when gap > 0; ST + |gap| when gap < 0 (IEEE-identical).
                np.subtract(st, gp, out=new)
                np.less(new, 0, out=ct)
                np.logical_and(ct, np.greater(gp, 0, out=kp), out=ct)
                np.copyto(new, floor, where=ct)
                np.logical_not(np.greater(st, grow_min, out=kp), out=kp)
                np.logical_and(kp, np.less(gp, 0, out=ct), out=kp)
                np.copyto(new, st, where=kp)
            if g == 0:
                np.copyto(mx, new)
                np.copyto(mn, new)
            else:
                np.maximum(mx, new, out=mx)
                np.minimum(mn, new, out=mn)
        np.subtract(mx, mn, out=mn)
        np.subtract(mx, prep.max_stall[b], out=iteration[b])
        np.add(prep.max_iteration[b], iteration[b], out=iteration[b])
        if aligned_fetch is None:
            np.subtract(prep.max_fetch[b], prep.min_fetch[b], out=fetch_diff[b])
        if aligned_start is None:
            np.subtract(prep.max_start[b], prep.min_start[b], out=start_diff[b])
    return Replay(
        iteration_s=iteration,
        stall_s=max_new,
        delay_s=delay,
        fetch_diff_s=fetch_diff,
        start_diff_s=start_diff,
        gpu_stall_s=gpu_stall,
    )


def replay(
    arrays: IterationArrays | Prepared, policy: Policy, params: ReplayParams = DEFAULT_PARAMS
) -> Replay:
    """Replay one run under one policy; pass ``prepare(arrays)`` to share work across policies."""
    prep = arrays if isinstance(arrays, Prepared) else prepare(arrays)
    return replay_prepared(prep, policy, params)


class PerIterationModel(ReplayModel):
    """Every iteration replayed on its own: today's kernel (docs/SPEC.md §3)."""

    name = "per-iteration"
    params = ("stall_floor_s", "stall_grow_min_s")

    def prepare(self, arrays: IterationArrays, params: ReplayParams) -> Prepared:
        return prepare(arrays)

    def replay(self, prepared: Prepared, policy: Policy, params: ReplayParams) -> Replay:
        return replay_prepared(prepared, policy, params)
