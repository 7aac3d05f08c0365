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

A regime's ``kind`` says how a cost is spent (validation/job.py):

* ``sleep`` — a sleep, and the step's compute a sleep too (unaffected by
  contention: the committed sleep sweep);
* ``cpu`` — CPU work (``validation/cpuwork.py``) calibrated so that a cost of
  x ms takes x ms on one uncontended core and longer when the cores are busy;
  the step's ``compute_ms`` is CPU work as well (the trainer competes for the
  same cores);
* ``mixed`` — half of each batch's cost CPU work, half a sleep (I/O waiting);
  compute is CPU work;
* ``decode`` — real loading: Pillow decodes JPEGs the job generates, random
  crop and flip, a float tensor; compute is a small conv net's forward and
  backward. The table gives each batch's image *area* relative to
  ``image_px``² (``size_factors``): rank skew, per-batch noise and stragglers
  through image sizes. No table alignment in this regime.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

ALIGNS = ("none", "min", "mean")
KINDS = ("sleep", "cpu", "mixed", "decode")
# Fields added after the sleep sweep was committed: left out of as_dict() at their
# defaults, so a sleep regime's job.json and manifest entries are what they were.
_LATER_DEFAULTS = {"kind": "sleep", "image_px": 0, "crop_px": 0}


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
    kind: str = "sleep"  # how a cost is spent: one of KINDS
    image_px: int = 0  # decode: side of rank 0's mean image (px)
    crop_px: int = 0  # decode: side of the random crop fed to the net (px)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"regime {self.name}: unknown kind {self.kind!r} ({', '.join(KINDS)})")
        if self.kind == "decode" and not 0 < self.crop_px <= self.image_px:
            raise ValueError(f"regime {self.name}: decode needs 0 < crop_px <= image_px")

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        for key, default in _LATER_DEFAULTS.items():
            if d[key] == default:
                del d[key]
        return d


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
        # The contention regimes (4 ranks, 2 cores; validation/README.md has the arithmetic).
        Regime(
            "cpu",
            batch_ms=12.0,
            skew=0.4,
            cv=0.25,
            straggler_prob=0.02,
            straggler_factor=3.0,
            compute_ms=3.0,
            about="loading is CPU work: 4 ranks' loaders and trainers fill 2 cores at 1 worker",
            kind="cpu",
        ),
        Regime(
            "mixed",
            batch_ms=30.0,
            skew=1.0,
            cv=0.25,
            straggler_prob=0.02,
            straggler_factor=3.0,
            compute_ms=1.0,
            about="half CPU, half waiting: cores not saturated at 1 worker, saturated at 2+",
            kind="mixed",
        ),
        Regime(
            "decode",
            batch_ms=12.0,  # nominal: rank 0's decode of a batch of 8 at image_px (pilot)
            skew=0.4,
            cv=0.25,
            straggler_prob=0.02,
            straggler_factor=2.0,
            compute_ms=0.0,
            about="JPEG decode + crop + flip with Pillow; a small conv net as compute",
            kind="decode",
            image_px=448,
            crop_px=96,
        ),
    )
}
SLEEP_REGIMES = tuple(name for name, r in REGIMES.items() if r.kind == "sleep")


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


def size_factors(regime: Regime, epochs: int, iterations: int, ranks: int, seed: int) -> np.ndarray:
    """Decode: each batch's image area relative to ``image_px``², the cost table's shape.

    The cost table divided by ``batch_ms``: rank skew, per-batch noise and
    stragglers carry over as image sizes (a decode's cost grows with its area).
    """
    return cost_table(regime, epochs, iterations, ranks, seed) / (regime.batch_ms / 1000)


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
