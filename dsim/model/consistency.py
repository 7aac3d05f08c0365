"""How consistent a run's per-rank timelines are with one synchronous DDP job (docs/SPEC.md §2.3).

In synchronous DDP the gradient all-reduce ends every rank's iteration at
(nearly) the same time, each rank asks for its next batch only after its
iteration ended, and no rank finishes an iteration before the last rank's
batch arrived. A trace that breaks these rules cannot come from such a job
(ranks of different jobs, shifted clocks, tables rebuilt by hand), and a
model calibrated on it absorbs impossible terms. The figures are computed
from the train table alone (§1.2: an iteration was requested at arrival −
``Data`` and ended at arrival − ``Data`` + ``Time``):

* ``end_spread_s``: per iteration, latest − earliest end over ranks (median, p95);
* ``loop_gap_s``: per rank, the next request − this iteration's end, within an
  epoch (min, max, share below −``TOLERANCE_S``);
* ``compute_after_arrival``: per rank and iteration, the rank's end − the latest
  arrival over ranks (share below −``TOLERANCE_S``).

Pure functions of NumPy arrays; only iterations every rank has a training
record for count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from dsim.io.arrowtables import numpy_of

#: Slack for rounding of logged timestamps and durations (printed to 1 µs–1 ms) and for the
#: time between the all-reduce and the training line's print on each rank.
TOLERANCE_S = 0.005
#: Iteration ends further apart than this across ranks cannot be one all-reduce ending every rank.
END_SPREAD_MAX_S = 0.050
#: Share of iterations (or rank-iterations) allowed to break a rule before the trace is called
#: inconsistent: single late prints and clock hiccups happen in real logs (the shipped profiler
#: sample has one iteration of 40 whose ends differ by 0.19 s).
SHARE_MAX = 0.05
#: A rank whose iteration ends lie further than this from the other ranks' (median over
#: iterations) runs on a clock that is off; within it, and with a deviation within it too,
#: the offset is constant and is corrected (docs/SPEC.md §1.7.1).
CLOCK_OFFSET_MAX_S = END_SPREAD_MAX_S
#: Fewer complete iterations than this say nothing either way.
MIN_ITERATIONS = 3


def _s(value: float) -> float:
    """Seconds to the microsecond: the logs' precision at best."""
    return round(float(value), 6)


def _share(mask: np.ndarray) -> float:
    return round(float(mask.mean()), 4) if mask.size else 0.0


def _stats(values: np.ndarray) -> dict[str, float]:
    return {"median": _s(np.median(values)), "p95": _s(np.percentile(values, 95))}


def train_arrays(train: pa.Table):
    """(ranks, epoch, iteration, rank index, arrival s, stall s, time s) of a non-empty train
    table: what ``clock_offsets`` and ``consistency`` read, made once for both by a parse.

    Views of the table's columns where it can (epoch, iteration, stall, time); one
    array each for the rank index and the arrival: a parse's peak memory is here.
    """
    gpu = numpy_of(train.column("gpu"))
    ranks, index = _ranks_index(gpu)
    del gpu
    start_ns = numpy_of(train.column("start").cast(pa.int64()))
    first, arrival = start_ns.min(), np.empty(len(start_ns))
    for lo in range(0, len(start_ns), 1 << 20):  # exact in int64, then seconds; no full temp
        arrival[lo : lo + (1 << 20)] = start_ns[lo : lo + (1 << 20)] - first
    arrival /= 1e9
    epoch = numpy_of(train.column("epoch"))
    iteration = numpy_of(train.column("iteration"))
    stall = numpy_of(train.column("stall_s"))
    time_s = numpy_of(train.column("iteration_s"))
    return ranks, epoch, iteration, index, arrival, stall, time_s


def _ranks_index(gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ranks, ascending, and each record's index into them (int32).

    Ranks are small non-negative integers (below ``bounds.RANK_LIMIT`` in every
    parsed table), so they are found by counting: ``np.unique`` (a hash) and a
    binary search per record took ~2.5 ms per 80,000 records, twice per parse.
    Anything else takes that general way; both give the same arrays.
    """
    if len(gpu) and int(gpu.min()) >= 0 and int(gpu.max()) < _COUNTED_RANKS:
        present = np.bincount(gpu) > 0
        ranks = np.flatnonzero(present).astype(gpu.dtype, copy=False)
        position = np.cumsum(present, dtype=np.int32)
        position -= 1
        return ranks, position[gpu]
    ranks = np.unique(gpu)
    return ranks, np.searchsorted(ranks, gpu).astype(np.int32)


#: Ranks below this are found by counting (``_ranks_index``): ``bounds.RANK_LIMIT``.
_COUNTED_RANKS = 1 << 20


def _row_max(grid: np.ndarray) -> np.ndarray:
    """``grid.max(axis=1)`` of a [iterations, ranks] grid, a rank (a column) at a time.

    NumPy reduces a row of a few ranks at a time ~10x slower than it combines
    whole columns; ``np.maximum`` propagates NaN as ``max`` does, so the values
    are the same.
    """
    out = grid[:, 0].copy()
    for r in range(1, grid.shape[1]):
        np.maximum(out, grid[:, r], out=out)
    return out


def _row_min(grid: np.ndarray) -> np.ndarray:
    """``grid.min(axis=1)``, as ``_row_max``."""
    out = grid[:, 0].copy()
    for r in range(1, grid.shape[1]):
        np.minimum(out, grid[:, r], out=out)
    return out


def _row_has_nan(grid: np.ndarray) -> np.ndarray:
    """``np.isnan(grid).any(axis=1)``, as ``_row_max``."""
    out = np.isnan(grid[:, 0])
    for r in range(1, grid.shape[1]):
        out |= np.isnan(grid[:, r])
    return out


def _row_median(block: np.ndarray) -> np.ndarray:
    """``np.median(block, axis=1)``: the middle of each sorted row (NaN rows: ``np.median``).

    ``np.median`` along rows of a few ranks took ~5 ms per 10,000 rows, a sort
    of the rows ~0.5 ms. Its value is the middle element, or the mean of the two
    middle ones, ``(0.0 + a + b) / 2``, exactly as ``np.median`` computes it (checked
    against it bit for bit in tests/test_consistency_fastpath.py).
    """
    ordered = np.sort(block, axis=1)
    k = block.shape[1]
    if k == 0 or np.isnan(ordered[:, -1]).any():  # NaN sorts last; np.median says NaN
        return np.median(block, axis=1)
    # np.median's mean sums from 0.0 (so a -0.0 comes out as 0.0), then divides
    middle = ordered[:, (k - 1) // 2] + 0.0
    if k % 2 == 0:
        middle += ordered[:, k // 2]
        middle /= 2
    return middle


def consistency(train: pa.Table, arrays: tuple | None = None) -> dict[str, Any] | None:
    """The figures above for one run's train table; ``None`` with fewer than 2 ranks or
    fewer than ``MIN_ITERATIONS`` iterations every rank trained. ``arrays``: the table's
    ``train_arrays`` when the caller has them (a parse makes them once for both checks)."""
    if train.num_rows == 0:
        return None
    ranks, *columns = arrays if arrays is not None else train_arrays(train)
    if ranks.size < 2:
        return None
    return timeline_consistency(*columns)


def _cells(epoch, iteration, rank) -> tuple[np.ndarray, np.ndarray, int]:
    """(the distinct (epoch, iteration) keys in order, each record's cell in the
    [keys, ranks] grid, ranks): one int64 key per record, not a stacked pair, whose
    ``np.unique(axis=1)`` took ~50 bytes a record. A table sorted by epoch and
    iteration (every table ``dsim parse`` writes from raw logs) needs no sort at all."""
    n_ranks = int(rank.max()) + 1
    key = np.array(epoch, dtype=np.int64)  # a copy: shifted and added to in place
    key <<= 32
    key += iteration
    key += 2**31
    if key.size < 2 or not (key[1:] < key[:-1]).any():
        first = np.empty(key.size, dtype=bool)
        first[:1] = True
        np.not_equal(key[1:], key[:-1], out=first[1:])
        keys = key[first]
        del key
        cell = np.cumsum(first, dtype=_cell_type(len(keys), n_ranks))
        cell -= 1
    else:
        keys, cell = np.unique(key, return_inverse=True)
        del key
        cell = cell.ravel().astype(_cell_type(len(keys), n_ranks), copy=False)
    cell *= n_ranks
    cell += rank
    return keys, cell, n_ranks


def _cell_type(keys: int, ranks: int) -> type:
    """int32 cells where the grid has fewer than 2^31 of them: 4 bytes a record less at a
    parse's peak."""
    return np.int32 if keys * ranks < 2**31 else np.int64


def _grid(cell: np.ndarray, shape: tuple[int, int], values: np.ndarray) -> np.ndarray:
    """``values`` placed at their ``cell``s of a [keys, ranks] grid, NaN where none is.

    A table sorted by (epoch, iteration, rank) with every rank in every iteration
    (what ``dsim parse`` writes of a complete run) has each record in the cell of
    its own row number: the grid is then a copy of the values, without the
    scatter's index checks and casts (~45 instructions a record, three grids a parse).
    """
    size = shape[0] * shape[1]
    if _in_row_order(cell, size):
        return np.array(values, dtype=np.float64).reshape(shape)
    grid = np.full(size, np.nan)
    grid[cell] = values
    return grid.reshape(shape)


def _in_row_order(cell: np.ndarray, size: int) -> bool:
    """Whether ``cell[i] == i`` for every record and the records fill all ``size`` cells;
    checked a block at a time (no array of the row numbers at a parse's peak)."""
    if len(cell) != size:
        return False
    for lo in range(0, size, _GAP_ROWS):
        block = cell[lo : lo + _GAP_ROWS]
        if not np.array_equal(block, np.arange(lo, lo + len(block), dtype=block.dtype)):
            return False
    return True


def end_grid(epoch, iteration, rank, arrival, stall, time_s) -> np.ndarray:
    """Iteration ends as [iterations every rank trained, ranks] (seconds on one axis)."""
    keys, cell, n_ranks = _cells(epoch, iteration, rank)
    end = np.subtract(arrival, stall)
    end += time_s
    grid = _grid(cell, (len(keys), n_ranks), end)
    del end, cell
    return grid[~_row_has_nan(grid)]


def rank_offsets(end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's clock offset and how constant it is, from iteration ends [iterations, ranks].

    The all-reduce ends one iteration on every rank together, so a rank's end
    minus the others' is its clock's offset plus a few ms. Offsets are taken
    against the largest group of ranks whose clocks agree within
    ``CLOCK_OFFSET_MAX_S`` (the first such group in rank order on a tie: with two
    ranks, rank 0 is the reference): one rank an hour behind moves itself, not the
    rest. Returns (offset s, spread s) per rank: the median over iterations of its
    end − the reference ends, and the p95 of the deviation around that median.
    Computed a rank (a column) at a time: a parse's peak memory is here, and a
    temporary as large as ``end`` costs 8 bytes per GPU-iteration.
    """
    ranks = end.shape[1]
    against_first = np.array([np.median(end[:, r] - end[:, 0]) for r in range(ranks)])
    agree = np.abs(against_first[:, None] - against_first[None, :]) <= CLOCK_OFFSET_MAX_S
    members = np.flatnonzero(agree[int(np.argmax(agree.sum(axis=1)))])
    offsets = against_first - np.median(against_first[members])
    reference = np.empty(len(end))
    rows = max(1, (1 << 20) // max(len(members), 1))
    for lo in range(0, len(end), rows):
        block = end[lo : lo + rows, members] - offsets[members]
        reference[lo : lo + rows] = _row_median(block)
    spread = np.array(
        [np.percentile(np.abs(end[:, r] - offsets[r] - reference), 95) for r in range(ranks)]
    )
    return offsets, spread


def clock_offsets(train: pa.Table, arrays: tuple | None = None) -> dict[str, Any] | None:
    """Ranks whose clocks are off the others' by more than ``CLOCK_OFFSET_MAX_S``.

    ``None`` when there is nothing to say (one rank, fewer than ``MIN_ITERATIONS``
    iterations every rank trained, or every clock within the tolerance); else
    ``{"tolerance_s", "iterations", "ranks": [{"gpu", "offset_s", "spread_s",
    "corrected"}]}``: a rank's offset is *constant* (and may be corrected by
    shifting its times by −offset) when its spread is within the tolerance too.
    ``arrays``: the table's ``train_arrays``, as for ``consistency``.
    """
    if train.num_rows == 0:
        return None
    ranks, *columns = arrays if arrays is not None else train_arrays(train)
    if ranks.size < 2:
        return None
    end = end_grid(*columns)
    if len(end) < MIN_ITERATIONS:
        return None
    offsets, spread = rank_offsets(end)
    off = np.flatnonzero(np.abs(offsets) > CLOCK_OFFSET_MAX_S)
    if not off.size:
        return None
    return {
        "tolerance_s": CLOCK_OFFSET_MAX_S,
        "iterations": len(end),
        "ranks": [
            {
                "gpu": int(ranks[r]),
                "offset_s": _s(offsets[r]),
                "spread_s": _s(spread[r]),
                "corrected": bool(spread[r] <= CLOCK_OFFSET_MAX_S),
            }
            for r in off
        ],
    }


def timeline_consistency(
    epoch: np.ndarray,
    iteration: np.ndarray,
    rank: np.ndarray,
    arrival: np.ndarray,
    stall: np.ndarray,
    time_s: np.ndarray,
) -> dict[str, Any] | None:
    """The figures from per-record arrays (``rank`` 0..n−1; ``arrival`` seconds on one axis)."""
    # Grids are built and let go of one at a time: a parse's peak memory is here.
    keys, cell, n_ranks = _cells(epoch, iteration, rank)
    shape = (len(keys), n_ranks)
    values = np.subtract(arrival, stall)  # requests
    grid_request = _grid(cell, shape, values)
    values += time_s  # ends
    grid_end = _grid(cell, shape, values)
    del values  # the arrivals' grid is made from ``arrival`` itself
    complete = ~_row_has_nan(grid_end)
    if int(complete.sum()) < MIN_ITERATIONS:
        return None
    # the next iteration of the same epoch on the same rank: consecutive keys, one epoch
    follows = (keys[1:] >> 32 == keys[:-1] >> 32) & (keys[1:] == keys[:-1] + 1)
    grid_request[1:] -= grid_end[:-1]  # every row's gap, in place: no selected copy of ends
    gaps = _gap_figures(grid_request[1:], follows)
    del grid_request
    everyone = bool(complete.all())  # then no copy of the complete rows is needed
    end = grid_end if everyone else grid_end[complete]
    del grid_end
    spread = _row_max(end) - _row_min(end)
    arrivals = _grid(cell, shape, arrival)
    del cell
    end -= _row_max(arrivals if everyone else arrivals[complete])[:, None]
    del arrivals
    late_share = _share(end.ravel() < -TOLERANCE_S)  # a rank's end before the last arrival
    del end
    spread_stats = {**_stats(spread), "over_share": _share(spread > END_SPREAD_MAX_S)}
    figures: dict[str, Any] = {
        "iterations": int(complete.sum()),
        "end_spread_s": spread_stats,
        "loop_gap_s": gaps,
        "compute_after_arrival": {
            "negative_share": late_share,
        },
        "tolerance_s": TOLERANCE_S,
    }
    figures["problems"] = problems(figures)
    return figures


#: Rows of the gap grid read at a time (``_gap_figures``).
_GAP_ROWS = 1 << 16


def _gap_figures(gap_rows: np.ndarray, follows: np.ndarray) -> dict[str, Any]:
    """``loop_gap_s`` of the gaps in the rows ``follows`` selects (NaN: a rank without one),
    a block of rows at a time: the min, max and share of all of them, with no copy of them
    (8 bytes a record at a parse's peak). Counts are exact, so the share is the mean's."""
    low, high, negative, count = np.inf, -np.inf, 0, 0
    for lo in range(0, len(follows), _GAP_ROWS):
        block = gap_rows[lo : lo + _GAP_ROWS][follows[lo : lo + _GAP_ROWS]]
        block = block[~np.isnan(block)]
        if block.size:
            low, high = min(low, float(block.min())), max(high, float(block.max()))
            negative += int(np.count_nonzero(block < -TOLERANCE_S))
            count += block.size
    return {
        "min": _s(low) if count else None,
        "max": _s(high) if count else None,
        "negative_share": round(negative / count, 4) if count else 0.0,
    }


def problems(figures: dict[str, Any]) -> list[str]:
    """What makes a run's figures impossible for synchronous DDP, in words ([] when none)."""
    out = []
    spread = figures["end_spread_s"]
    if spread["over_share"] > SHARE_MAX:
        out.append(
            f"iteration ends differ across ranks by more than {END_SPREAD_MAX_S * 1000:.0f} ms "
            f"in {100 * spread['over_share']:.1f} % of iterations (median {spread['median']:.3g} "
            f"s, p95 {spread['p95']:.3g} s)"
        )
    gap = figures["loop_gap_s"]
    if gap["negative_share"] > SHARE_MAX:
        out.append(
            f"a rank requests its next batch before its iteration ended in "
            f"{100 * gap['negative_share']:.1f} % of ranks' iterations (loop gaps "
            f"{gap['min']:.3g} to {gap['max']:.3g} s)"
        )
    after = figures["compute_after_arrival"]["negative_share"]
    if after > SHARE_MAX:
        out.append(
            f"a rank's iteration ends before the last rank's batch arrived in {100 * after:.1f} % "
            "of ranks' iterations"
        )
    return out
