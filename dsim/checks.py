"""Rules that need many records at once: repeats, conflicts, clocks, stray ranks.

Each rule is a pure function from record columns (dicts of equal-length
NumPy arrays, rows in file order) to a mask of the rows it rejects, so that
``dsim.parse`` can apply them in its order and count every reject by reason.
The common case -- a good log -- costs a hash, a sort or a comparison per
rule, vectorised; only the rows or groups that break a rule are looked at
more closely.
"""

from __future__ import annotations

import numpy as np

from dsim import clock
from dsim.epochs import lexsort_order

_MIX = np.uint64(0x9E3779B97F4A7C15)


def group_starts(sort: np.ndarray, keys: list[np.ndarray]) -> np.ndarray:
    """In ``sort`` order: True where a row's ``keys`` differ from the row before (a new group)."""
    new = np.zeros(len(sort), dtype=bool)
    if len(sort):
        new[0] = True
        for key in keys:
            k = key[sort]
            new[1:] |= k[1:] != k[:-1]
    return new


def _comparable(values: np.ndarray) -> np.ndarray:
    """Floats as their bits (``-0.0`` made ``0.0``): equal values, NaN included, compare equal."""
    return (values + 0.0).view(np.int64) if values.dtype.kind == "f" else values


def _hash(values: list[np.ndarray]) -> np.ndarray:
    """A 64-bit hash per row; equal rows hash alike."""
    h = np.zeros(len(values[0]), dtype=np.uint64)
    for v in values:
        h ^= _comparable(v).astype(np.uint64)
        h *= _MIX
        h ^= h >> np.uint64(29)
    return h


def _repeated_rows(values: list[np.ndarray]) -> np.ndarray:
    """Rows whose hash repeats (ascending): the only candidates for an exact repeat.

    Repeats are rare, so a hash of the keys and one sort of those plain
    integers rule almost every row out.
    """
    hashed = _hash(values)
    ordered = np.sort(hashed)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if len(repeated) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.isin(hashed, repeated))


def duplicates(columns: dict[str, np.ndarray], keys: list[str]) -> np.ndarray:
    """Rows repeating an earlier row's ``keys`` exactly (earlier in file order): later copies."""
    dup = np.zeros(len(columns["line"]), dtype=bool)
    rows = _repeated_rows([columns[k] for k in keys])
    if len(rows):
        values = [_comparable(columns[k][rows]) for k in keys]
        sort = np.lexsort((rows, *reversed(values)))
        dup[rows[sort]] = ~group_starts(sort, values)
    return dup


def conflicts(columns: dict[str, np.ndarray], keys: list[str]) -> np.ndarray:
    """Every row whose ``keys`` another row shares: all copies, since none can be trusted."""
    bad = np.zeros(len(columns["line"]), dtype=bool)
    rows = _repeated_rows([columns[k] for k in keys])
    if len(rows):
        values = [_comparable(columns[k][rows]) for k in keys]
        sort = np.lexsort(values[::-1])
        new = group_starts(sort, values)
        group = np.cumsum(new) - 1
        size = np.bincount(group)
        bad[rows[sort]] = size[group] > 1
    return bad


def fetch_clock(fetch: dict[str, np.ndarray]) -> tuple[np.ndarray, list]:
    """Outliers and steps of the fetch lines: each worker writes its lines in time order.

    Groups are (file, rank, worker), in file order.
    """
    keys = [fetch["file"], fetch["gpu"], fetch["worker"]]
    if len(fetch["line"]) == 0:
        return np.zeros(0, dtype=bool), []
    sort = lexsort_order(keys)  # ties by row: file order
    return clock.outliers(fetch["end"], sort, group_starts(sort, keys))


def train_clock(train: dict[str, np.ndarray]) -> tuple[np.ndarray, list]:
    """Outliers and steps of the training lines: a rank's iterations start one after the other.

    Groups are ranks, ordered by (epoch, iteration), ties (conflicting
    records, judged after this) by start time.
    """
    if len(train["line"]) == 0:
        return np.zeros(0, dtype=bool), []
    keys = [train["gpu"], train["epoch"], train["iteration"]]
    sort = lexsort_order(keys)
    if not group_starts(sort, keys)[1:].all():
        sort = np.lexsort((train["start"], *reversed(keys)))  # rare: repeated iterations
    return clock.outliers(train["start"], sort, group_starts(sort, keys[:1]))


def stray_ranks(fetch_gpu: np.ndarray, train_gpu: np.ndarray, share: float) -> dict[int, int]:
    """Ranks with at most ``share`` times the median rank's records (fetch and training).

    Returns {rank: its record count}.

    A flipped digit (``GPU: 1`` -> ``GPU: 7``) makes a rank of one record;
    kept, it would make every iteration incomplete. ``share`` 0 disables.
    """
    both = np.concatenate([fetch_gpu, train_gpu])
    if share <= 0 or len(both) == 0:
        return {}
    if both.min() >= 0 and both.max() < 1 << 20:
        counts = np.bincount(both)
        ranks = np.flatnonzero(counts)
        counts = counts[ranks]
    else:
        ranks, counts = np.unique(both, return_counts=True)
    limit = share * float(np.median(counts))
    return {int(r): int(c) for r, c in zip(ranks, counts, strict=True) if c <= limit}
