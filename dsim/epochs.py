"""Which epoch each fetch belongs to (DESIGN.md §1).

Fetch lines carry no epoch. The k-th fetch of (rank, batch index) in time
order belongs to the epoch of the k-th training line of (rank, iteration =
that index) in time order. Matching by ordinal rather than by time window
stays right when workers of the next epoch start before the last batches of
the previous one arrive, and when training lines are printed late.

Without training lines the ordinal itself is the epoch (the rank's batch
indices start over each epoch). Fetches beyond the last training line of
their (rank, index) -- a run that stopped mid-epoch -- continue the count
after that line's epoch.
"""

from __future__ import annotations

import numpy as np

_FITS = 1 << 62  # packed sort keys stay below this


def lexsort_order(keys: list[np.ndarray]) -> np.ndarray:
    """The permutation ``np.lexsort(keys[::-1])`` gives: first key most significant, ties by row.

    ``np.lexsort`` sorts once per key, indirectly. When the keys' ranges
    multiply to less than 2^62 they pack into one int64, and with the row
    number as the last digit every packed value is distinct, so one plain
    (vectorised, unstable) argsort gives the same order several times faster.
    Integer keys only.
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

    ``order=None`` says the rows are in file order already (what ``dsim.parse``
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
    fetch_order: np.ndarray | None,
    train_gpu: np.ndarray,
    train_iteration: np.ndarray,
    train_start: np.ndarray,
    train_order: np.ndarray | None,
    train_epoch: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Epoch of every fetch, and a mask of the fetches that had a matching training line.

    An ``*_order`` of ``None`` means those rows are in file order. Arrays are
    made in the order they are needed and dropped as soon as they are not:
    this runs while all records of a run are in memory, so its temporaries
    set the peak memory of ``dsim parse``.
    """
    k_fetch, f_sort = _occurrence_sort([fetch_gpu, fetch_idx], fetch_end, fetch_order)
    if len(train_gpu) == 0:
        return k_fetch, np.zeros(len(fetch_gpu), dtype=bool)
    k_train, t_sort = _occurrence_sort([train_gpu, train_iteration], train_start, train_order)

    span_k = int(max(k_fetch.max(initial=0), k_train.max(initial=0))) + 1
    span_i = int(max(fetch_idx.max(initial=0), train_iteration.max(initial=0))) + 1

    def key(gpu: np.ndarray, idx: np.ndarray, k: np.ndarray) -> np.ndarray:
        out = gpu.astype(np.int64)
        out *= span_i
        out += idx
        out *= span_k
        out += k
        return out

    # Both occurrence sorts order rows by (rank, index, ordinal): the keys come out
    # ascending, so matching is a merge of two sorted lists (or, usually, equality).
    sort = t_sort
    sorted_keys = key(train_gpu[sort], train_iteration[sort], k_train[sort])
    if len(sorted_keys) > 1 and not bool((sorted_keys[1:] > sorted_keys[:-1]).all()):
        train_keys = np.empty_like(sorted_keys)
        train_keys[sort] = sorted_keys
        sort = np.argsort(train_keys, kind="stable")
        sorted_keys = train_keys[sort]
        del train_keys
    wanted_sorted = key(fetch_gpu[f_sort], fetch_idx[f_sort], k_fetch[f_sort])
    epoch = np.empty(len(wanted_sorted), dtype=np.result_type(train_epoch, k_fetch))
    if np.array_equal(wanted_sorted, sorted_keys):
        del wanted_sorted, sorted_keys, k_fetch, k_train
        epoch[f_sort] = train_epoch[sort]
        matched = np.ones(len(epoch), dtype=bool)
        return epoch, matched
    pos = np.clip(np.searchsorted(sorted_keys, wanted_sorted), 0, len(sorted_keys) - 1)
    hit = sorted_keys[pos] == wanted_sorted
    matched = np.empty(len(epoch), dtype=bool)
    matched[f_sort] = hit
    epoch[f_sort] = np.where(hit, train_epoch[sort][pos], -1)

    if not matched.all():
        # Continue after the last training line of the same (rank, index), if any.
        train_keys = key(train_gpu, train_iteration, k_train)
        group = train_keys // span_k  # (gpu, idx)
        g_sort = np.lexsort((k_train, group))
        groups, last_pos = np.unique(group[g_sort][::-1], return_index=True)
        last_row = g_sort[::-1][last_pos]
        last_epoch = train_epoch[last_row]
        count = k_train[last_row].astype(np.int64) + 1
        fetch_group = key(fetch_gpu, fetch_idx, k_fetch) // span_k
        p = np.clip(np.searchsorted(groups, fetch_group), 0, max(len(groups) - 1, 0))
        has_group = groups[p] == fetch_group
        # A (rank, index) with no training line at all: the ordinal counts
        # from the rank's first epoch.
        first_epoch = _first_epoch_per_gpu(train_gpu, train_epoch, fetch_gpu)
        fallback = np.where(
            has_group, last_epoch[p] + (k_fetch - count[p] + 1), first_epoch + k_fetch
        )
        epoch = np.where(matched, epoch, fallback)
    return epoch, matched


def _first_epoch_per_gpu(train_gpu, train_epoch, fetch_gpu) -> np.ndarray:
    gpus, inverse = np.unique(train_gpu, return_inverse=True)
    first = np.full(len(gpus), np.iinfo(np.int64).max)
    np.minimum.at(first, inverse, train_epoch)
    p = np.clip(np.searchsorted(gpus, fetch_gpu), 0, len(gpus) - 1)
    return np.where(gpus[p] == fetch_gpu, first[p], 0)
