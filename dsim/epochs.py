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


def occurrence(keys: list[np.ndarray], time: np.ndarray, order: np.ndarray) -> np.ndarray:
    """0-based ordinal of each row among rows with equal ``keys``, by ``time`` then ``order``."""
    n = len(time)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    sort = np.lexsort((order, time, *reversed(keys)))
    same = np.ones(n, dtype=bool)
    same[0] = False
    for key in keys:
        k = key[sort]
        same[1:] &= k[1:] == k[:-1]
    starts = np.flatnonzero(~same)
    group_start = np.repeat(starts, np.diff(np.append(starts, n)))
    ordinal = np.empty(n, dtype=np.int64)
    ordinal[sort] = np.arange(n) - group_start
    return ordinal


def assign_fetch_epochs(
    fetch_gpu: np.ndarray,
    fetch_idx: np.ndarray,
    fetch_end: np.ndarray,
    fetch_order: np.ndarray,
    train_gpu: np.ndarray,
    train_iteration: np.ndarray,
    train_start: np.ndarray,
    train_order: np.ndarray,
    train_epoch: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Epoch of every fetch, and a mask of the fetches that had a matching training line."""
    k_fetch = occurrence([fetch_gpu, fetch_idx], fetch_end, fetch_order)
    if len(train_gpu) == 0:
        return k_fetch, np.zeros(len(fetch_gpu), dtype=bool)
    k_train = occurrence([train_gpu, train_iteration], train_start, train_order)

    span_k = int(max(k_fetch.max(initial=0), k_train.max(initial=0))) + 1
    span_i = int(max(fetch_idx.max(initial=0), train_iteration.max(initial=0))) + 1

    def key(gpu: np.ndarray, idx: np.ndarray, k: np.ndarray) -> np.ndarray:
        return (gpu.astype(np.int64) * span_i + idx) * span_k + k

    train_keys = key(train_gpu, train_iteration, k_train)
    sort = np.argsort(train_keys, kind="stable")
    sorted_keys = train_keys[sort]
    wanted = key(fetch_gpu, fetch_idx, k_fetch)
    pos = np.clip(np.searchsorted(sorted_keys, wanted), 0, len(sorted_keys) - 1)
    matched = sorted_keys[pos] == wanted
    epoch = np.where(matched, train_epoch[sort][pos], -1).astype(np.int64)

    if not matched.all():
        # Continue after the last training line of the same (rank, index), if any.
        group = train_keys // span_k  # (gpu, idx)
        g_sort = np.lexsort((k_train, group))
        groups, last_pos = np.unique(group[g_sort][::-1], return_index=True)
        last_row = g_sort[::-1][last_pos]
        last_epoch = train_epoch[last_row]
        count = k_train[last_row] + 1
        fetch_group = wanted // span_k
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
