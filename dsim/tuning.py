"""`dsim tune`'s logic: the loader grid, the sweep, the recommendation (docs/SPEC.md §5.7).

Pure functions over one run's prepared pipeline replay: no files, no
printing. The sweep calls only the replay model's public entry points
(``prepare`` once, ``replay`` per setting), so whatever the pipeline model
learns (causality, CPU awareness) reaches ``dsim tune`` without a change here.

Why the recommendation is the *cheapest* setting near the best and not the
best: past the knee of the curve, more workers buy fractions of a percent
that are well inside the model's error, and cost processes and memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsim.replay.params import MAX_LOADER_SETTING
from dsim.words import counted

#: A setting within this fraction of the best predicted iteration time counts as "as good".
NEAR_BEST = 0.02
#: More workers "stop helping" when the next step of the grid gains less than this.
FLAT_GAIN = 0.02
#: The best setting is compute-bound when its iteration time is within this of the compute floor.
COMPUTE_BOUND_WITHIN = 0.05
#: One rank "binds" when its remaining stall is at least this many times the next rank's.
SLOW_RANK_RATIO = 2.0
#: Bootstrap resamples of the per-iteration times (vectorised: a few hundred are fast).
BOOTSTRAP_RESAMPLES = 300
#: Iterations are resampled in at most this many contiguous blocks (bounded memory; blocks
#: keep the autocorrelation of neighbouring iterations inside a resample).
BOOTSTRAP_BLOCKS = 2000
#: Largest worker count or prefetch factor a grid may ask for (``dsim run``'s bound too).
MAX_SETTING = MAX_LOADER_SETTING
#: The grid when the run did not record its cores.
DEFAULT_WORKERS = (0, 1, 2, 4, 8, 16)
DEFAULT_PREFETCH = (1, 2, 4)


def default_workers(per_rank: float | None) -> tuple[int, ...]:
    """0, 1, 2, 4, … up to two powers of two past the recorded cores per rank (else 16)."""
    if per_rank is None:
        return DEFAULT_WORKERS
    top = 1
    while top < 4 * per_rank:
        top *= 2
    top = min(max(top, 4), MAX_SETTING)
    values = [0, 1]
    while values[-1] < top:
        values.append(values[-1] * 2)
    return tuple(values)


@dataclass(frozen=True)
class Point:
    """One replayed setting: per selected iteration, the job's iteration time and stall."""

    workers: int
    prefetch: int
    policy: tuple[str, str]
    iteration_s: np.ndarray  # [n] selected iterations
    stall_s: np.ndarray  # [n]
    rank_stall_s: np.ndarray  # [G] mean replayed stall per rank

    @property
    def mean_iteration_s(self) -> float:
        return float(self.iteration_s.mean())

    @property
    def mean_stall_s(self) -> float:
        return float(self.stall_s.mean())


def sweep(
    model: Any,
    prepared: Any,
    mask: np.ndarray,
    workers: Sequence[int],
    prefetch: Sequence[int],
    policy: tuple[str, str],
    base_params: Any,
) -> list[Point]:
    """Replay every (workers, prefetch) of the grid under ``policy``; rows kept by ``mask``."""
    from dataclasses import replace

    points = []
    for w in workers:
        for p in prefetch:
            out = model.replay(
                prepared, policy, replace(base_params, workers=int(w), prefetch_factor=int(p))
            )
            points.append(
                Point(
                    int(w), int(p), policy,
                    np.asarray(out.iteration_s)[mask], np.asarray(out.stall_s)[mask],
                    np.asarray(out.gpu_stall_s)[mask].mean(axis=0),
                )
            )  # fmt: skip
    return points


def _blocks(values: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Sums and counts of ``values`` (rows: series) over contiguous blocks of iterations."""
    n = values.shape[-1]
    edges = np.linspace(0, n, min(n, blocks) + 1).astype(np.int64)
    sums = np.add.reduceat(values, edges[:-1], axis=-1)
    return sums, np.diff(edges)


def bootstrap_means(
    series: np.ndarray,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    blocks: int = BOOTSTRAP_BLOCKS,
) -> np.ndarray:
    """Resampled means of each row of ``series`` [k, n], the same resamples for every row.

    Paired: a ratio of two rows' resampled means keeps their shared
    iteration-to-iteration variation out of the interval. Returns [resamples, k].
    """
    series = np.atleast_2d(np.asarray(series, dtype=np.float64))
    sums, counts = _blocks(series, blocks)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, counts.size, size=(resamples, counts.size))
    total = counts[pick].sum(axis=1)
    return sums[:, pick].sum(axis=2).T / total[:, None]


@dataclass(frozen=True)
class Band:
    """A value with its interval: bootstrap percentiles, widened by the model's error."""

    value: float
    low: float
    high: float


def _band(value: float, samples: np.ndarray, widen: float, *, inverse: bool = False) -> Band:
    lo, hi = np.percentile(samples, [2.5, 97.5])
    if inverse:  # a speed-up: the model's error on the time divides it
        return Band(value, float(lo / (1 + widen)), float(hi / max(1 - widen, 1e-9)))
    return Band(value, float(lo * (1 - widen)), float(hi * (1 + widen)))


def bands(baseline: Point, chosen: Point, widen: float, seed: int = 0) -> dict[str, Band]:
    """Predicted iteration time, stall and speed-up of ``chosen`` over ``baseline``, with bands."""
    means = bootstrap_means(
        np.vstack([baseline.iteration_s, chosen.iteration_s, chosen.stall_s]), seed=seed
    )
    speedup = baseline.mean_iteration_s / chosen.mean_iteration_s
    return {
        "iteration_s": _band(chosen.mean_iteration_s, means[:, 1], widen),
        "stall_s": _band(chosen.mean_stall_s, means[:, 2], widen),
        "speedup": _band(speedup, means[:, 0] / means[:, 1], widen, inverse=True),
    }


def cheapest_near_best(points: Sequence[Point], near: float = NEAR_BEST) -> Point:
    """The fewest workers, then the smallest prefetch, within ``near`` of the best time.

    ``near`` is taken of the best time's size, so that a best of 0 or below (a replay of
    corrupt CPU times once predicted -24 ms) still leaves the best itself to choose
    instead of nothing.
    """
    best = min(p.mean_iteration_s for p in points)
    good = [p for p in points if p.mean_iteration_s <= best + abs(best) * near]
    return min(good, key=lambda p: (p.workers, p.prefetch))


def best_prefetch_curve(points: Sequence[Point]) -> list[Point]:
    """Per worker count, the setting with the best prefetch: the curve over workers."""
    by_workers: dict[int, Point] = {}
    for p in points:
        held = by_workers.get(p.workers)
        if held is None or p.mean_iteration_s < held.mean_iteration_s:
            by_workers[p.workers] = p
    return [by_workers[w] for w in sorted(by_workers)]


@dataclass(frozen=True)
class Flattening:
    """Where more workers stop helping, and why (``reason`` is a key, ``text`` the words)."""

    workers: int | None  # None: still helping at the largest setting tried
    # compute-bound | slow-rank | cpu-saturated | loading-bound | stall-left | hand-over-unknown
    reason: str
    text: str


def flattening(
    points: Sequence[Point],
    *,
    cpu_saturated_at: int | None = None,
    ranks: Sequence[int] | None = None,
    gain: float = FLAT_GAIN,
    hand_over_unknown: bool = False,
) -> Flattening:
    """The knee of the curve over workers and what binds there.

    The compute floor is the knee's mean iteration time less its stall (the
    loop's compute and all-reduce), which no loader setting can beat.
    ``ranks``: the rank ids of the stall columns (default 0, 1, …).
    ``cpu_saturated_at``: the worker count from which the model reports the
    node's cores saturated, only when the model is CPU-aware (else ``None``).
    ``hand_over_unknown``: nearly every built batch waited for a busy worker to
    hand it over, so the calibration had no idle hand-over to compare with
    (``dsim.app.tune.unknown_hand_over``). A stall that does not shrink is then
    what the model cannot see, not what more workers would leave: the knee is
    not claimed, and the words say which setting to re-run with to find out
    (a 1-rank cpu run, 99 % busy, "stopped helping" at 1 worker where 8
    measured 35 % faster: validation/data-r1).
    """
    curve = best_prefetch_curve(points)
    knee = None
    beyond = None
    for here, there in itertools.pairwise(curve):
        if here.mean_iteration_s <= there.mean_iteration_s * (1 + gain):
            knee, beyond = here, there
            break
    if knee is None:
        top = curve[-1]
        tried = f"loading-bound up to the largest setting tried ({counted(top.workers, 'worker')})"
        if cpu_saturated_at is not None and cpu_saturated_at <= top.workers:
            # Why: "may still help" alone overstated a CPU-bound run on 2 cores (saturated at
            # 1 worker, 4 predicted 1.13x, re-runs 1.03x: validation/data-holdout21).
            return Flattening(
                None,
                "loading-bound",
                f"{tried}, but the node's CPU cores are saturated from "
                f"{counted(cpu_saturated_at, 'worker')}: each worker more competes for them, so "
                "more workers may help less than predicted",
            )
        return Flattening(None, "loading-bound", f"{tried}: more workers may still help")
    t = knee.mean_iteration_s
    compute_floor_s = t - knee.mean_stall_s
    if t <= compute_floor_s * (1 + COMPUTE_BOUND_WITHIN):
        return Flattening(
            knee.workers,
            "compute-bound",
            f"more than {counted(knee.workers, 'worker')} stop helping: compute-bound, the loop's "
            "compute "
            f"floor ({compute_floor_s * 1e3:.1f} ms per iteration) binds",
        )
    stalls = knee.rank_stall_s
    ordered = np.sort(stalls)[::-1]
    if stalls.size > 1 and ordered[0] > 0 and ordered[0] >= SLOW_RANK_RATIO * ordered[1]:
        column = int(np.argmax(stalls))
        rank = column if ranks is None else int(ranks[column])
        return Flattening(
            knee.workers,
            "slow-rank",
            f"more than {counted(knee.workers, 'worker')} stop helping: one slow rank, rank "
            f"{rank}'s loader binds ({stalls.max() / stalls.sum():.0%} of the stall left)",
        )
    if cpu_saturated_at is not None and knee.workers >= cpu_saturated_at:
        return Flattening(
            knee.workers,
            "cpu-saturated",
            f"more than {counted(knee.workers, 'worker')} stop helping: the node's CPU cores are "
            "saturated",
        )
    if hand_over_unknown and beyond is not None:
        return Flattening(
            None,
            "hand-over-unknown",
            f"whether more than {counted(knee.workers, 'worker')} would help is not known: the "
            f"stall left ({knee.mean_stall_s * 1e3:.1f} ms per iteration) is batches waiting for "
            "a busy worker to hand them over, which the replay cannot shorten (caveat below); "
            f"re-run with num_workers={beyond.workers} to find out",
        )
    return Flattening(
        knee.workers,
        "stall-left",
        f"more than {counted(knee.workers, 'worker')} stop helping: the stall left "
        f"({knee.mean_stall_s * 1e3:.1f} ms per iteration) does not shrink with more workers "
        "or a larger prefetch",
    )
