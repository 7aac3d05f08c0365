"""Which epoch each fetch belongs to (docs/SPEC.md §1).

Fetch lines carry no epoch. A fetch of rank g, batch index i, that ended at
E takes its epoch from the *last training line of rank g (any iteration)
that started before E - TOL*: if that line is (epoch e, iteration j of N),
the fetch is in epoch e when j < i (and i < N), and in epoch e + 1 when
j >= i (the rank had already passed iteration i in epoch e, so this batch is
for the next epoch: loaders that prefetch across an epoch boundary) or when
i >= N (epoch e has no batch i; N is the size most training lines of epoch e
declare, so that one corrupt ``[j/N]`` changes nothing). "Epoch e + 1" is the next
epoch the run trained (a resumed job skips epochs). A fetch that ended before the
rank's first training line takes that line's epoch.

Why by time: a training line of iteration i starts after its batch's fetch
ended, so the line before E is an earlier iteration of the same epoch or a
later one of the previous epoch. The answer depends only on the rank's
training timeline near E, so a lost, duplicated or rejected record moves at
most the fetches of its own neighbourhood (ordinal matching -- the k-th fetch
of (rank, i) to the k-th training line of (rank, i) -- let one lost record
shift every later epoch). ``TOL`` absorbs loggers that round fetch-end
timestamps up: it is the resolution of the printed time (1 ms for
``...:54.841``, 1 µs for ``...:54.841234``), at most 1 ms, so that a loop
whose iterations take less than a millisecond keeps its order.

A rank with no training line at all falls back on ordinals: its k-th fetch
of batch index i in time order is in the run's first epoch plus k (a rank's
batch indices start over each epoch).
"""

from __future__ import annotations

import numpy as np

_FITS = 1 << 62  # packed sort keys stay below this
_RADIX_SPAN = 1 << 16  # packed keys that fit 16 bits sort by radix (``lexsort_order``)
TOL_NS = 1_000_000  # 1 ms: fetch-end timestamps may be rounded up to the millisecond
# The tolerance of a fetch end printed with d fraction digits: its resolution, at most TOL_NS.
_TOL_BY_DIGITS = np.array([min(10 ** (9 - d), TOL_NS) for d in range(10)], dtype=np.int32)


def lexsort_order(keys: list[np.ndarray]) -> np.ndarray:
    """The permutation ``np.lexsort(keys[::-1])`` gives: first key most significant, ties by row.

    ``np.lexsort`` sorts once per key, indirectly. When the keys' ranges
    multiply to less than 2^62 they pack into one int64, and with the row
    number as the last digit every packed value is distinct, so one plain
    (vectorised, unstable) argsort gives the same order several times faster;
    when they fit 16 bits, a stable radix sort of the packed keys alone, faster
    again. Integer keys only.
    """
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    spans = []
    total = 1
    for key in keys:
        lo, hi = int(key.min()), int(key.max())
        spans.append((lo, hi - lo + 1))
        total *= hi - lo + 1
    if total >= _FITS:
        return np.lexsort(keys[::-1])
    packed = np.zeros(n, dtype=np.int64)
    for key, (lo, span) in zip(keys, spans, strict=True):
        packed *= span
        packed += key - lo if lo else key
    if total <= _RADIX_SPAN:
        # NumPy's stable sort of 16-bit keys is a radix sort: O(n), ~5x faster here than the
        # argsort below (a run's (file, rank, worker) groups: 80,000 rows in 0.7 ms, not 3.9)
        return np.argsort(packed.astype(np.uint16), kind="stable")
    if total * n < _FITS:
        packed *= n
        packed += np.arange(n)
        return np.argsort(packed)
    return np.argsort(packed, kind="stable")


def _index_dtype(n: int) -> type:
    """Ranks and ordinals below 2^31 (every real log) take half the memory of int64."""
    return np.int32 if n < 1 << 31 else np.int64


def _time_rank(time: np.ndarray) -> np.ndarray:
    """Rank of each row by ``time``, ties by row (a stable sort: logs are nearly in time order)."""
    sort = np.argsort(time, kind="stable")
    dtype = _index_dtype(len(time))
    rank = np.empty(len(time), dtype=dtype)
    rank[sort] = np.arange(len(time), dtype=dtype)
    return rank


def _occurrence_sort(
    keys: list[np.ndarray], time: np.ndarray, order: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Ordinals (see ``occurrence``) and the sort by ``keys``, ``time``, ``order`` behind them.

    ``order=None`` says the rows are in file order already (what ``dsim.sources.rawlog.parse``
    passes: it keeps no per-row order key). Ordinals are int32 below 2^31 rows.
    """
    n = len(time)
    dtype = _index_dtype(n)
    if n == 0:
        return np.zeros(0, dtype=dtype), np.zeros(0, dtype=np.int64)
    if order is None or n == 1 or bool((order[1:] > order[:-1]).all()):  # ties by row
        rank = _time_rank(time)
        sort = lexsort_order([*keys, rank])
        del rank
    else:
        sort = np.lexsort((order, time, *reversed(keys)))
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for key in keys:
        k = key[sort]
        new[1:] |= k[1:] != k[:-1]
        del k
    # Position in sort order minus the position where the row's group starts.
    position = np.arange(n, dtype=dtype)
    group_start = np.where(new, position, 0).astype(dtype, copy=False)
    del new
    np.maximum.accumulate(group_start, out=group_start)
    position -= group_start
    del group_start
    ordinal = np.empty(n, dtype=dtype)
    ordinal[sort] = position
    return ordinal, sort


def occurrence(keys: list[np.ndarray], time: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    """0-based ordinal of each row among rows with equal ``keys``, by ``time`` then ``order``."""
    return _occurrence_sort(keys, time, order)[0]


def assign_fetch_epochs(
    fetch_gpu: np.ndarray,
    fetch_idx: np.ndarray,
    fetch_end: np.ndarray,
    train_gpu: np.ndarray,
    train_epoch: np.ndarray,
    train_iteration: np.ndarray,
    train_total: np.ndarray,
    train_start: np.ndarray,
    *,
    fetch_tol: np.ndarray | int = TOL_NS,
) -> np.ndarray:
    """Epoch of every fetch (see the module docstring); times in nanoseconds.

    ``fetch_tol``: TOL per fetch (``tolerance`` of its printed digits) or for all.

    Vectorised: one sort of the training lines by (rank, start) and one
    binary search per fetch for (rank, E - TOL), both on one packed int64 key
    when rank and time fit in it (a rank at a time otherwise). This runs while
    all records of a run are in memory, so its temporaries set the peak memory
    of ``dsim parse``: arrays are made in the order they are needed and
    dropped as soon as they are not.
    """
    dtype = np.result_type(train_epoch.dtype, np.int32)
    epoch = np.zeros(len(fetch_gpu), dtype=dtype)
    if len(fetch_gpu) == 0:
        return epoch
    if len(train_gpu):
        found = _by_time(
            fetch_gpu, fetch_idx, fetch_end, fetch_tol, train_gpu, train_epoch, train_iteration,
            train_total, train_start, epoch,
        )  # fmt: skip
    else:
        found = np.zeros(len(fetch_gpu), dtype=bool)
    if not found.all():
        rows = np.flatnonzero(~found)  # ranks without training lines
        first_epoch = int(train_epoch.min()) if len(train_epoch) else 0
        k = occurrence([fetch_gpu[rows], fetch_idx[rows]], fetch_end[rows], rows)
        epoch[rows] = first_epoch + k
    return epoch


def tolerance(digits: np.ndarray) -> np.ndarray:
    """TOL of fetch ends printed with ``digits`` fraction digits (int32 nanoseconds)."""
    return _TOL_BY_DIGITS[digits]


def _by_time(
    fetch_gpu, fetch_idx, fetch_end, fetch_tol, train_gpu, train_epoch, train_iteration,
    train_total, train_start, out: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """Fill ``out`` for fetches of ranks that have training lines; returns which ones those are."""
    lo = min(int(train_start.min()), int(fetch_end.min()) - TOL_NS)
    hi = max(int(train_start.max()), int(fetch_end.max()))
    span = hi - lo + 1
    g_lo = min(int(train_gpu.min()), int(fetch_gpu.min()))
    g_span = max(int(train_gpu.max()), int(fetch_gpu.max())) - g_lo + 1
    train = (train_gpu, train_epoch, train_iteration, train_total)
    present = np.unique(train_epoch)  # the epochs the run trained, ascending
    if g_span * span < _FITS:
        sort, sorted_key = _sorted_lines(_packed(train_gpu, train_start, g_lo, lo, span), train)
        want = _packed(fetch_gpu, fetch_end, g_lo, lo, span)
        want -= fetch_tol
        return _match(sorted_key, sort, want, train, fetch_gpu, fetch_idx, out, present)
    found = np.zeros(len(fetch_gpu), dtype=bool)
    for gpu in np.unique(train_gpu):  # a rank at a time: its times alone fit int64
        t = np.flatnonzero(train_gpu == gpu)
        f = np.flatnonzero(fetch_gpu == gpu)
        if len(f) == 0:
            continue
        mine = tuple(column[t] for column in train)
        sort, sorted_key = _sorted_lines(train_start[t], mine)
        sub = np.zeros(len(f), dtype=out.dtype)
        want = fetch_end[f] - (fetch_tol[f] if np.ndim(fetch_tol) else fetch_tol)
        found[f] = _match(sorted_key, sort, want, mine, fetch_gpu[f], fetch_idx[f], sub, present)
        out[f] = sub
    return found


def _packed(gpu: np.ndarray, time: np.ndarray, g_lo: int, lo: int, span: int) -> np.ndarray:
    """(rank, time) as one int64 that sorts like the pair: (gpu - g_lo) * span + time - lo."""
    key = gpu.astype(np.int64)
    if g_lo:
        key -= g_lo
    key *= span
    key += time
    key -= lo
    return key


def _sorted_lines(key: np.ndarray, train) -> tuple[np.ndarray, np.ndarray]:
    """The training lines sorted by ``key`` (rank and start), and the sorted keys.

    Lines of one rank with the same start (rare) are ordered by (epoch,
    iteration), so that the later one counts as the last before a fetch.
    """
    sort = np.argsort(key, kind="stable")
    # ``key`` (a fresh array of the caller's) sorted in place: the values of ``key[sort]``
    # without a third array of the lines beside it and its order (a parse's peak is here)
    key.sort(kind="stable")
    sorted_key = key
    if len(sort) > 1 and bool((sorted_key[1:] == sorted_key[:-1]).any()):
        _, epoch, iteration, _ = train
        original = np.empty_like(sorted_key)
        original[sort] = sorted_key
        sort = np.lexsort((iteration, epoch, original))
        sorted_key = original[sort]
    return sort, sorted_key


def _skip_absent_epochs(out: np.ndarray, later: np.ndarray, present: np.ndarray) -> None:
    """Fetches of "the next epoch" go to the next epoch the run trained, not e + 1 blindly.

    A job resumed from a checkpoint logs epochs 0-1, then 3-4: the batches its
    loader prefetched before epoch 3's first training line follow epoch 1's last
    line, and belong to epoch 3; epoch 2 does not exist in this run. After the
    run's last trained epoch, e + 1 stays (batches of an epoch the log ends before).
    """
    rows = np.flatnonzero(later)
    if len(rows) == 0 or len(present) == 0:
        return
    nxt = np.searchsorted(present, out[rows] - 1, side="right")  # first epoch above e
    inside = nxt < len(present)
    out[rows[inside]] = present[nxt[inside]]


#: Fetches per block of ``_match``'s binary search.
_BLOCK = 1 << 20


def _match(
    sorted_key, sort, want, train, fetch_gpu, fetch_idx, out: np.ndarray, present: np.ndarray
) -> np.ndarray:
    """The rule for fetches at ``want`` against the sorted training lines (rank and time)."""
    train_gpu, train_epoch, train_iteration, train_total = train
    # lines strictly before E - TOL, written over ``want`` (a fresh int64 array of the
    # caller's) a block at a time: no second array of every fetch beside it
    for lo in range(0, len(want), _BLOCK):
        want[lo : lo + _BLOCK] = np.searchsorted(sorted_key, want[lo : lo + _BLOCK], side="left")
    last = want
    del want, sorted_key
    last -= 1
    has_last = last >= 0
    np.maximum(last, 0, out=last)
    np.take(sort, last, out=last)  # the line's row
    has_last &= train_gpu[last] == fetch_gpu
    later = train_iteration[last] >= fetch_idx  # the rank already passed batch i in epoch e
    beyond = np.flatnonzero(~later & (fetch_idx >= train_total[last]))
    if len(beyond):  # epoch e may have no batch i: trust the epoch's N, not one line's
        size = _epoch_sizes(train_epoch, train_total)
        later[beyond] = fetch_idx[beyond] >= [size[e] for e in train_epoch[last[beyond]].tolist()]
    np.add(train_epoch[last], later, out=out, casting="unsafe")
    _skip_absent_epochs(out, later, present)
    del later
    rest = np.flatnonzero(~has_last)
    if len(rest):
        # No line of the rank before E - TOL: the rank's first line gives the epoch, if it has one.
        sorted_gpu = train_gpu[sort]  # ascending: the rank is the key's leading part
        pos = np.minimum(np.searchsorted(sorted_gpu, fetch_gpu[rest]), len(sort) - 1)
        has = sorted_gpu[pos] == fetch_gpu[rest]
        out[rest[has]] = train_epoch[sort[pos[has]]]
        has_last[rest[has]] = True
    return has_last


def _epoch_sizes(train_epoch: np.ndarray, train_total: np.ndarray) -> dict[int, int]:
    """Each epoch's N: the ``[i/N]`` that most of its training lines declare.

    One line with a corrupt N does not change it.
    """
    pairs, counts = np.unique(
        np.stack([train_epoch, train_total], axis=1), axis=0, return_counts=True
    )
    sizes: dict[int, tuple[int, int]] = {}
    for (epoch, total), count in zip(pairs.tolist(), counts.tolist(), strict=True):
        if count > sizes.get(epoch, (0, 0))[0]:
            sizes[epoch] = (count, total)
    return {epoch: total for epoch, (_, total) in sizes.items()}
