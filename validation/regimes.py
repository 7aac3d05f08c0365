"""Seeded per-batch loading costs: the regimes of the fidelity sweep.

A regime fixes how expensive loading is against compute. Its cost table gives
the loading cost of every batch (epoch, batch index, rank) of a run; every run
of a regime — at any worker count, prefetch factor or alignment — draws the
*same* table from the same seed, so that a run with 4 workers is the physical
answer to "what if run A had had 4 workers", and a run with the table aligned
over ranks is the physical answer to "what if the loaders were aligned".

Costs: rank r of G is ``1 + skew * r / (G - 1)`` times slower than rank 0 (so
alignment matters), each batch has lognormal noise of mean 1 and coefficient
of variation ``cv``, and with probability ``straggler_prob`` a batch is a
straggler, ``straggler_factor`` times slower (a large image, a slow read).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

ALIGNS = ("none", "min", "mean")


@dataclass(frozen=True)
class Regime:
    """Loading against compute; times in milliseconds."""

    name: str
    batch_ms: float  # mean loading cost of one batch on rank 0 (before stragglers)
    skew: float  # the last rank is (1 + skew) times slower than rank 0
    cv: float  # per-batch lognormal noise, coefficient of variation
    straggler_prob: float  # share of batches that are stragglers
    straggler_factor: float  # a straggler costs this many times more
    compute_ms: float  # simulated compute per training step
    about: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


# Chosen with pilot runs on the 2-core development VM (validation/README.md):
# 400 iterations x 2 epochs stay within ~60 s at 1 worker, and the workers
# column of each regime crosses (or does not cross) the compute time as named.
REGIMES: dict[str, Regime] = {
    r.name: r
    for r in (
        Regime(
            "heavy",
            batch_ms=40.0,
            skew=0.5,
            cv=0.25,
            straggler_prob=0.02,
            straggler_factor=3.0,
            compute_ms=4.0,
            about="loading dominates at 1, 2 and 4 workers",
        ),
        Regime(
            "data-bound",
            batch_ms=34.0,
            skew=0.4,
            cv=0.25,
            straggler_prob=0.02,
            straggler_factor=3.0,
            compute_ms=8.0,
            about="loading dominates at 1 and 2 workers, compute at 4",
        ),
        Regime(
            "balanced",
            batch_ms=28.0,
            skew=0.4,
            cv=0.25,
            straggler_prob=0.02,
            straggler_factor=3.0,
            compute_ms=10.0,
            about="loading about equals compute at 2 workers",
        ),
        Regime(
            "compute-bound",
            batch_ms=16.0,
            skew=0.4,
            cv=0.25,
            straggler_prob=0.02,
            straggler_factor=3.0,
            compute_ms=20.0,
            about="compute dominates at every worker count; stragglers still stall",
        ),
    )
}


def cost_table(regime: Regime, epochs: int, iterations: int, ranks: int, seed: int) -> np.ndarray:
    """Loading cost in seconds of every batch: float64 ``[epochs, iterations, ranks]``.

    Deterministic in (regime numbers, shape, seed); independent of workers,
    prefetch and alignment, which is what makes runs comparable.
    """
    if epochs < 1 or iterations < 1 or ranks < 1:
        raise ValueError("epochs, iterations and ranks must be >= 1")
    rng = np.random.default_rng(seed)
    shape = (epochs, iterations, ranks)
    sigma2 = math.log1p(regime.cv**2)
    noise = rng.lognormal(mean=-sigma2 / 2, sigma=math.sqrt(sigma2), size=shape)
    straggler = rng.random(shape) < regime.straggler_prob
    rank_factor = 1 + regime.skew * np.arange(ranks) / max(ranks - 1, 1)
    costs = regime.batch_ms / 1000 * rank_factor[None, None, :] * noise
    return np.where(straggler, costs * regime.straggler_factor, costs)


def align_table(table: np.ndarray, align: str) -> np.ndarray:
    """Physically applied alignment: every rank's batch (e, i) costs the min / mean over ranks."""
    if align == "none":
        return table
    if align == "min":
        agg = table.min(axis=2, keepdims=True)
    elif align == "mean":
        agg = table.mean(axis=2, keepdims=True)
    else:
        raise ValueError(f"unknown alignment {align!r} (choose from {', '.join(ALIGNS)})")
    return np.broadcast_to(agg, table.shape).copy()
