"""The distinct values of integer arrays: ``np.unique``'s answers, without its cost.

Why: NumPy 2's ``np.unique`` hashes, then sorts what it found; on the key, rank
and worker columns of a run (80,000 values, already in runs of sorted keys) it
took ~3 ms a call, where a sort and a neighbour comparison take 0.2-0.9 ms and
counting (the values span little) ~0.15 ms. It was called ~18 times a run by
``dsim run`` (arrays, summary rows, attribution): ~10 % of a 20-run sweep's
CPU beside the replay's 5 %. The parser's counts of ranks, epochs and
iterations use the same rule (``countable``). Pure functions; the results
equal ``np.unique``'s (the same values, ascending, of the input's dtype).
"""

from __future__ import annotations

import numpy as np

__all__ = ["countable", "distinct", "distinct_inverse"]


def countable(values: np.ndarray) -> bool:
    """Whether integer ``values`` are some and span little enough to be counted
    (``np.bincount`` over max - min + 1 bins) instead of hashed or sorted: ranks, epochs,
    iterations and workers do."""
    if len(values) == 0:
        return False
    span = int(values.max()) - int(values.min())
    return span < max(4 * len(values), 1 << 16)


def _offsets(values: np.ndarray) -> tuple[np.ndarray, int]:
    """``values`` less their minimum, as indices (computed in 64 bits: in a narrow signed
    dtype the difference can overflow), and that minimum."""
    low = values.min()
    if values.dtype.kind == "u":
        return (values - low).astype(np.intp), int(low)
    return (values.astype(np.int64) - np.int64(low)).astype(np.intp), int(low)


def _shifted(offsets: np.ndarray, low: int, dtype: np.dtype) -> np.ndarray:
    """``offsets + low`` in ``dtype``: computed there, with its wrap-around, which gives the
    exact values since they fit it (``low`` may not fit an ``int64``: a ``uint64``'s)."""
    return offsets.astype(dtype) + dtype.type(low)


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-D integer array."""
    values = np.asarray(values)
    if len(values) == 0 or values.dtype.kind not in "iu":
        return np.unique(values)
    if countable(values):
        offset, low = _offsets(values)
        return _shifted(np.flatnonzero(np.bincount(offset)), low, values.dtype)
    ordered = np.sort(values)
    keep = np.empty(len(ordered), bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def distinct_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of a 1-D integer array: the distinct
    values and, for each value, its index among them."""
    values = np.asarray(values)
    if values.dtype.kind not in "iu" or not countable(values):
        ids, inverse = np.unique(values, return_inverse=True)
        return ids, inverse.reshape(-1)
    offset, low = _offsets(values)
    present = np.bincount(offset) > 0
    index = np.cumsum(present) - 1
    ids = _shifted(np.flatnonzero(present), low, values.dtype)
    return ids, index[offset]
