"""The spread the bar chart draws: per-iteration quantiles, never a mean ± std.

A standard deviation drawn around a mean of non-negative, skewed values
(stalls) reaches below zero, which no iteration ever did; quantiles of the
iterations themselves cannot.
"""

from __future__ import annotations

import math

import numpy as np

SPREAD_QUANTILES = (0.10, 0.90)
"""The whiskers span the 10th to the 90th percentile of the selected iterations."""


def quantile_spread(
    values: np.ndarray, quantiles: tuple[float, float] = SPREAD_QUANTILES
) -> tuple[float, float]:
    """Low and high quantile of the finite values (linear interpolation); NaN when none."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return math.nan, math.nan
    lo, hi = np.quantile(v, quantiles)
    return float(lo), float(hi)


def whiskers(mean: float, low: float, high: float) -> tuple[float, float]:
    """Error-bar lengths (below, above) from ``mean`` to the quantiles.

    A skewed distribution can put its mean outside [low, high]; the whisker
    on that side is then empty (0), never negative, so the bar still ends at
    the mean and the whisker spans exactly the quantile range beyond it.
    NaN quantiles give no whisker.
    """
    if any(math.isnan(x) for x in (mean, low, high)):
        return 0.0, 0.0
    return max(mean - low, 0.0), max(high - mean, 0.0)
