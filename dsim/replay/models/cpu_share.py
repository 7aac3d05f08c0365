"""CPU contention on a node: how much a what-if stretches CPU work (docs/SPEC.md §4.2).

Why: a fetch that decodes on the CPU takes longer when more processes want
the node's cores at once. Adding workers, prefetching more or aligning
fetches changes the iteration time T, hence the node's CPU demand
u = C / (K T) (C: CPU seconds per iteration of every process on the node, K:
its cores), hence how long each CPU second takes in wall time, the stretch
ρ. The logs give one point of the curve ρ(u): the measured run's
ρ_m = 1 + Σ run-queue wait / Σ CPU time at u_m. This module holds the curve,
its calibration and the fixed-point solver; the pipeline model replays the
run for a given ρ (``T_of``) and this module finds the ρ that is consistent
with the T it produces. Everything here is NumPy and Python, but for the
demand's banded sum (``overlap_kernel``, compiled).

The curve is processor sharing's: ρ(u) = 1 + a u / (1 − u) for u < 1 and
∞ at u ≥ 1. With one core and Poisson arrivals (M/M/1-PS) a = 1 exactly;
K cores queue less at the same u, which a < 1 absorbs, and the one measured
point fixes a. Whatever a, ρ → ∞ as u → 1, so T never falls below C / K
(the cores cannot do more than K CPU seconds a second): the saturation
bound holds by construction.

u divides by T, the replay's iteration time (the max over ranks), which is
longer than the wall period at which iterations follow each other. So the
solver takes a lower pole, ``u_cap`` (``wall_cap``): the demand at which the
measured run's own ratio of wall period to T says the cores are busy on the
wall clock. Without it a what-if that added workers to a run whose cores were
already 98 % busy replayed up to 1/u_m faster than they allow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

U_MAX_MEASURED = 0.99  # a measured demand at or above 1 (clock noise) is read as this
PS_COEFFICIENT = 1.0  # a of M/M/1 processor sharing: used when run-queue waits are unknown
MAX_STEPS = 60  # steps of the root search at most (bisection alone: a bracket of 2^-60)
#: ``wall_cap`` never puts the pole closer than this above the measured demand u_m.
CAP_MARGIN = 0.01


@dataclass(frozen=True)
class CpuLoad:
    """The CPU side of a run as [N, G] arrays, and the node it ran on.

    ``fetch_cpu``/``fetch_runq``: each batch's CPU seconds and run-queue wait;
    ``train_cpu``/``train_runq``: each rank's training process, per iteration
    (zeros where the logs have no value). ``runq_known`` is False where no
    run-queue wait was logged (not Linux). ``fetch_extra``: each batch's CPU
    seconds its worker spent outside the building thread (``proc − cpu``,
    SPEC §1.2), ``None`` where ``proc`` was not logged; it adds to the
    node's demand but not to the fetch's own CPU work (it runs beside it).
    Ranks ``r`` and ``r'`` share a node when ``r // ranks_per_node ==
    r' // ranks_per_node`` (torchrun's numbering).
    """

    fetch_cpu: np.ndarray
    fetch_runq: np.ndarray
    train_cpu: np.ndarray
    train_runq: np.ndarray
    cores: int
    ranks_per_node: int
    ranks_per_node_assumed: bool  # LOCAL_WORLD_SIZE was not logged: all ranks on one node
    runq_known: bool
    fetch_extra: np.ndarray | None = None

    def take(self, lo: int, hi: int) -> CpuLoad:
        from dataclasses import replace

        return replace(
            self,
            fetch_cpu=self.fetch_cpu[lo:hi],
            fetch_runq=self.fetch_runq[lo:hi],
            train_cpu=self.train_cpu[lo:hi],
            train_runq=self.train_runq[lo:hi],
            fetch_extra=None if self.fetch_extra is None else self.fetch_extra[lo:hi],
        )


def node_demand(load: CpuLoad) -> float:
    """C: CPU seconds per iteration of the busiest node (its workers, every thread where
    ``proc`` was logged, and its training processes)."""
    n, g = load.fetch_cpu.shape
    if n == 0:
        return 0.0
    per_rank = (load.fetch_cpu + load.train_cpu).sum(axis=0) / n
    if load.fetch_extra is not None:
        per_rank = per_rank + load.fetch_extra.sum(axis=0) / n
    nodes = np.arange(g) // max(load.ranks_per_node, 1)
    return float(np.bincount(nodes, weights=per_rank).max())


def measured_stretch(load: CpuLoad) -> float | None:
    """ρ_m = 1 + Σ q / Σ c over every batch and training process; ``None`` if q is unknown."""
    if not load.runq_known:
        return None
    cpu = float(load.fetch_cpu.sum() + load.train_cpu.sum())
    wait = float(load.fetch_runq.sum() + load.train_runq.sum())
    return 1.0 + wait / cpu if cpu > 0 else 1.0


def class_stretches(load: CpuLoad) -> tuple[float, float] | None:
    """(ρ_w,m, ρ_t,m): the measured stretch of the workers' fetches and of the training
    processes, each 1 + its run-queue wait / its CPU time; ``None`` where either class
    logged no CPU time or the waits are unknown (the pooled ρ_m then serves both)."""
    if not load.runq_known:
        return None
    fetch_cpu, train_cpu = float(load.fetch_cpu.sum()), float(load.train_cpu.sum())
    if fetch_cpu <= 0 or train_cpu <= 0:
        return None
    return (
        1.0 + float(load.fetch_runq.sum()) / fetch_cpu,
        1.0 + float(load.train_runq.sum()) / train_cpu,
    )


def population_factor(workers: int, measured_workers: int) -> float:
    """(W + 1) / (W_m + 1): how a what-if of W workers per rank, from a run of W_m, scales
    the workers' own excess stretch (``class_delta``); the pipeline model applies it to
    fewer workers only (``pipeline.populated``).

    Why: at one node demand the workers' stretch grows with the workers (4 ranks on 2
    cores, loading as CPU work: 2.4-2.6 at 1 worker, 4.8-6.5 at 8, at a demand of
    0.79-0.91 for both), which the contention curve, a function of the demand alone,
    cannot give: from 8 workers to 1 it kept ~4.0 where the re-runs measured ~2.5, and
    predicted fewer workers 9 % too slow on average. A rank's workers and its training
    process are the processes that can want a core at once, and under processor sharing
    the wait per CPU second grows with their number. The square root of the ratio was
    shipped first; the ratio whole fits the fewer-worker re-runs better with the same
    tune picks (validation/README.md, "The twentieth held-out sweep"). The training
    processes' stretch flattens with the workers, so the pooled curve is not scaled
    (tried: tune's picks got worse).
    """
    return (max(int(workers), 0) + 1) / (max(int(measured_workers), 0) + 1)


def class_delta(
    rho: np.ndarray | float, rho_m: float, class_m: float | None, population: float = 1.0
) -> np.ndarray | float:
    """The change of one class's stretch when the pooled one goes ρ_m → ``rho``.

    Why per class: the logs give the workers' fetches and the training processes
    each their own stretch, and at many workers they differ (a 4-rank, 8-worker
    mixed run: workers 8.80, training processes 6.17, pooled 8.39). A fetch's
    wall time holds its own class's waiting, so taking it back to fewer
    workers with the pooled ρ_m left a fetch 86 ms long where the re-runs took
    63 (validation/README.md, "The sixteenth held-out sweep"). The class's
    excess scales with the pooled excess the fixed point solves, ρ_c − 1 =
    (ρ_c,m − 1)(ρ − 1)/(ρ_m − 1), so at ρ = ρ_m the class keeps its measured
    stretch and the measured run replays as itself. A what-if with other
    workers scales that excess by ``population`` (``population_factor``; 1 at
    the measured workers). Without a class stretch (``class_m`` None) or
    without contention (ρ_m ≤ 1) it is ρ − ρ_m. The pipeline model applies it
    to the workers' fetches only.
    """
    if class_m is None or not rho_m > 1.0:
        return rho - rho_m
    return (class_m - 1.0) * ((rho - 1.0) / (rho_m - 1.0) * population - 1.0)


def stretch(u: float, a: float) -> float:
    """ρ(u) = 1 + a u / (1 − u): wall seconds per CPU second at demand ``u``; ∞ at u ≥ 1."""
    if u >= 1.0:
        return math.inf
    return 1.0 + a * max(u, 0.0) / (1.0 - u)


def coefficient(u_measured: float, rho_measured: float | None) -> float:
    """The curve's ``a`` through the measured point (processor sharing's 1 without one)."""
    if rho_measured is None:
        return PS_COEFFICIENT
    u = min(u_measured, U_MAX_MEASURED)
    if u <= 0.0:
        return 0.0
    return max(rho_measured - 1.0, 0.0) * (1.0 - u) / u


def wall_cap(period_s: float, iteration_s: float, u_measured: float) -> float:
    """The demand u = C / (K T) at which the cores are busy on the wall clock: P_m / T_m.

    Why: T (SPEC §3: each iteration's max over ranks of end − request) runs
    16–22 % above the wall period P at which a CPU-bound run's iterations
    follow each other, so its u_m read 0.82–0.86 where the node's counters
    had the cores 98 % busy (validation/README.md, "The node's CPU and the
    demand's period"). A pole at u = 1 let more-worker what-ifs of such runs
    replay 7–10 % faster than the cores allow. The measured run's ratio maps
    T to the wall clock; it is never read as putting the pole below the
    measured point (``CAP_MARGIN`` above u_m: the measured run did run there)
    nor above 1 (no wall period, or one longer than T, keeps the pole at 1).
    """
    if not (period_s > 0.0 and iteration_s > 0.0):
        return 1.0
    return min(1.0, max(period_s / iteration_s, u_measured + CAP_MARGIN))


@dataclass(frozen=True)
class Solution:
    """The fixed point: stretch ρ, the mean iteration time T it gives, the demand u, steps.

    ``busy``: u over the solver's pole ``u_cap``, the cores' busy share on the wall
    clock as the measured run maps T to it (1: saturated).
    """

    rho: float
    iteration_s: float
    demand: float
    steps: int
    busy: float = 0.0


def solve(
    t_of: Callable[[float], float],
    demand_s: float,
    cores: int,
    a: float,
    rho_low: float = 1.0,
    max_steps: int = MAX_STEPS,
    rel_tol: float = 1e-6,
    u_cap: float = 1.0,
) -> Solution:
    """The ρ with ρ = ρ(C / (K T(ρ))) within ``rel_tol``; the curve is ∞ from u ≥ ``u_cap``.

    ``t_of(ρ)`` is the replay's mean iteration time when every CPU second
    takes ρ wall seconds; it grows with ρ, and ρ(C / (K T)) falls as T grows,
    so h(ρ) = ρ − ρ(C / (K T(ρ))) is increasing and has one root. The bracket
    starts at ``rho_low`` (no contention) and doubles its upper end until h
    changes sign; then it shrinks to ``rel_tol`` of its upper end, which is
    returned (h ≥ 0 there: the same contract as bisection's). With ``u_cap`` <
    1, h jumps from −∞ to finite where T reaches C / (K u_cap) and stays
    increasing, so the search stops there when the curve alone would have gone
    past it.

    Why not bisection alone: each step is a replay of the whole run, and
    bisection took 21 of them per what-if (half of `dsim run`'s CPU-aware
    headline). h is smooth between the replay's kinks, so each step
    interpolates between the bracket's ends (regula falsi, with the Illinois
    rule halving an end's value kept twice in a row, which keeps both ends
    moving), and bisects where an end's value is infinite or the
    interpolation falls outside the bracket: 4–12 replays to the same tolerance.
    """
    cap = min(max(u_cap, 0.0), 1.0)

    def h(rho: float) -> tuple[float, float]:
        t = t_of(rho)
        u = demand_s / (cores * t) if t > 0 else math.inf
        return rho - (math.inf if u >= cap else stretch(u, a)), t

    def solution(rho: float, t: float, steps: int) -> Solution:
        u = demand_s / (cores * t) if t > 0 else 0.0
        return Solution(rho, t, u, steps, u / cap if cap > 0 else math.inf)

    lo = rho_low
    f_lo, t_lo = h(lo)
    if f_lo >= 0.0:  # no contention at all even at ρ = ρ_low
        return solution(lo, t_lo, 0)
    hi = max(2.0 * lo, lo + 1.0)
    steps = 0
    while True:
        f_hi, t_hi = h(hi)
        steps += 1
        if f_hi >= 0.0 or steps >= max_steps:
            break
        lo, f_lo, hi = hi, f_hi, 2.0 * hi
    kept = 0  # +1: the upper end moved last time, -1: the lower one
    for _ in range(max_steps):
        if hi - lo <= rel_tol * hi or f_hi == 0.0:
            break
        mid = 0.5 * (lo + hi)
        if math.isfinite(f_lo) and math.isfinite(f_hi):
            guess = hi - f_hi * (hi - lo) / (f_hi - f_lo)
            if lo < guess < hi:
                mid = guess
        value, t_mid = h(mid)
        steps += 1
        if value >= 0.0:
            hi, f_hi, t_hi = mid, value, t_mid
            if kept == 1:  # the lower end kept twice: its weight halved (Illinois)
                f_lo *= 0.5
            kept = 1
        else:
            lo, f_lo = mid, value
            if kept == -1:
                f_hi *= 0.5
            kept = -1
    return solution(hi, t_hi, steps)


def overlap_rate(
    starts: np.ndarray,
    ends: np.ndarray,
    rates: np.ndarray,
    span_lo: np.ndarray,
    span_hi: np.ndarray,
) -> np.ndarray:
    """Per span, the mean over it of Σ_j rate_j over the intervals [s_j, e_j) covering t.

    Why: a fetch spends its CPU seconds over its whole wall interval, so the
    CPU a node's fetches want during an iteration is each fetch's rate (CPU
    seconds per wall second) times the part of the iteration it covers. Spans
    of zero or negative length give NaN. Given as [N, G] rows (a node's
    fetches, row k the batches of iteration k), each span is summed over the
    band of rows that can reach it (``overlap_kernel``: a replayed fetch lives
    within a prefetch window of its row), which costs O(band × G) per span;
    where the bands are wide (``BANDED_MAX_WORK``) or the input is flat, the
    step function is integrated once by a sweep over the sorted ends,
    O((n + m) log n). Both are the definition's sum, to float rounding.
    """
    from dsim.replay.models import overlap_kernel

    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    rates = np.asarray(rates, dtype=np.float64)
    span_lo = np.asarray(span_lo, dtype=np.float64)
    span_hi = np.asarray(span_hi, dtype=np.float64)
    if starts.ndim == 2 and span_lo.ndim == 1 and starts.shape == ends.shape == rates.shape:
        first, stop = overlap_kernel.row_bands(starts, ends, rates, span_lo, span_hi)
        work = int((stop - first).sum()) * starts.shape[1]
        if work <= BANDED_MAX_WORK * (starts.size + span_lo.size):
            return overlap_kernel.banded_overlap_rate(
                starts, ends, rates, span_lo, span_hi, first, stop
            )
    return _swept_overlap_rate(starts, ends, rates, span_lo, span_hi)


#: The most (row, column) pairs per interval and span for which ``overlap_rate`` sums bands
#: of rows instead of sorting every end: a pair costs a few ns, an interval of the sort
#: ~60 ns (the sort, gathers and sums; measured on the 2-core Intel VM, BENCHMARKS.md).
BANDED_MAX_WORK = 16


def _swept_overlap_rate(
    starts: np.ndarray,
    ends: np.ndarray,
    rates: np.ndarray,
    span_lo: np.ndarray,
    span_hi: np.ndarray,
) -> np.ndarray:
    """``overlap_rate`` by one sweep over the sorted ends, for input of any shape."""
    starts = np.asarray(starts, dtype=np.float64).ravel()
    ends = np.asarray(ends, dtype=np.float64).ravel()
    rates = np.asarray(rates, dtype=np.float64).ravel()
    span_lo = np.asarray(span_lo, dtype=np.float64)
    span_hi = np.asarray(span_hi, dtype=np.float64)
    length = span_hi - span_lo
    out = np.full(span_lo.shape, np.nan)
    positive = length > 0
    ok = np.isfinite(starts) & np.isfinite(ends) & (ends > starts) & np.isfinite(rates)
    if not ok.any():
        out[positive] = 0.0
        return out
    # The same sums as concatenating, sorting and integrating whole arrays, with each
    # temporary freed as soon as it is used: this runs on every fetch of a node at once,
    # and its temporaries were the largest part of a CPU-aware replay's peak (~15
    # arrays of the node's fetches; BENCHMARKS.md, "The CPU-aware headline's memory").
    every = bool(ok.all())
    times = np.concatenate([starts, ends] if every else [starts[ok], ends[ok]])
    steps = np.concatenate([rates, rates] if every else [rates[ok], rates[ok]])
    del ok
    steps[steps.size // 2 :] *= -1.0
    order = np.argsort(times, kind="stable")
    level = steps[order]
    del steps
    times = times[order]  # a gather, not a second sort (which cost a quarter of the sweep)
    del order
    np.cumsum(level, out=level)
    width = np.diff(times)
    width *= level[:-1]
    del level
    area = np.empty(times.size)
    area[0] = 0.0
    np.cumsum(width, out=area[1:])
    del width
    covered = np.interp(span_hi, times, area) - np.interp(span_lo, times, area)
    out[positive] = covered[positive] / length[positive]
    return out


def trainer_stretch(
    rho: float,
    demand: np.ndarray,
    body: np.ndarray,
    curve: tuple[int, float] | None = None,
) -> np.ndarray:
    """ρ_k: the stretch of iteration k's training CPU on one node, from its demand d_k.

    Why: the fixed point gives one stretch ρ for the body of a segment, where
    every worker has indices to build. When the sampler runs out, the last
    P·W batches finish and the workers go idle: the node's CPU demand falls
    and the training processes get the cores (the 8-worker re-runs' last 16
    iterations ran 2-3x faster than their body though their fetches took as
    long). In the body the excess stretch ρ − 1 is taken proportional to the
    demand (d_k, CPU seconds per second), scaled so that it is ρ − 1 at the
    body's mean demand d̄ (rows ``body``; every row if none is marked).

    Outside the body (a segment's start-up and drain rows), with ``curve`` =
    (K cores, a), ρ_k is the calibrated processor-sharing curve at the
    iteration's own demand, ``stretch(d_k / K, a)``, never above ρ: the drain
    runs at the low demand of the trainers alone, where the curve is flat
    (an 8-worker re-run's drain measured 1.87, the curve 1.54 at its demand;
    a share proportional to the demand stayed near ρ). The body keeps the
    proportional share: its per-iteration demand is noisy, and near the
    curve's pole at u = 1 one busy iteration would get an unbounded stretch
    (tried: worker what-ifs off by up to 10x). No constant is fitted: where
    d̄ is not positive or d_k is unknown the stretch stays ρ.
    """
    demand = np.asarray(demand, dtype=np.float64)
    body = np.asarray(body, dtype=bool)
    known = np.isfinite(demand)
    mask = body & known
    if not mask.any():
        mask = known
    ref = float(demand[mask].mean()) if mask.any() else 0.0
    if not ref > 0.0:
        return np.full(demand.shape, float(rho))
    out = 1.0 + (float(rho) - 1.0) * np.where(known, demand / ref, 1.0)
    if curve is not None and curve[0] > 0:
        cores, a = curve
        edge = ~body & known
        u = np.clip(demand[edge] / cores, 0.0, U_MAX_MEASURED)
        out[edge] = np.minimum(1.0 + a * u / (1.0 - u), float(rho))
    return out
