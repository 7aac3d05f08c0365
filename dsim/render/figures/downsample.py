"""Thinning long traces to what a browser draws smoothly, without hiding spikes.

A browser stays responsive with a few thousand points per trace, while a
stall spike is exactly what a reader is looking for: timelines keep the
minimum and maximum of every bucket, CDFs keep evenly spaced ranks.
"""

from __future__ import annotations

import numpy as np

MAX_POINTS = 5000
"""Most points drawn per timeline or CDF trace."""


def downsample_minmax(y: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices of the points to draw: the minimum and maximum of each bucket, in order.

    At most ``max_points`` indices; the first and last point are always kept so
    the trace spans the same range, and no spike is lost, whatever its width.
    """
    values = np.asarray(y, dtype=np.float64)
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    size = -(-n // max(1, (max_points - 2) // 2))  # bucket length, rounded up
    buckets = -(-n // size)
    padded = np.full(buckets * size, np.nan)
    padded[:n] = values
    grid = padded.reshape(buckets, size)
    lo = np.where(np.isnan(grid), np.inf, grid).argmin(axis=1)
    hi = np.where(np.isnan(grid), -np.inf, grid).argmax(axis=1)
    offsets = np.arange(buckets) * size
    keep = np.concatenate(([0, n - 1], offsets + lo, offsets + hi))
    return np.unique(keep[keep < n])


def ecdf_points(values: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their cumulative fractions, thinned to evenly spaced ranks."""
    v = np.sort(np.asarray(values, dtype=np.float64)[~np.isnan(values)])
    n = len(v)
    if n == 0:
        return v, v
    frac = np.arange(1, n + 1) / n
    if n > max_points:
        pick = np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
        v, frac = v[pick], frac[pick]
    return v, frac
