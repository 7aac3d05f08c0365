"""The ``pipeline`` replay model behind the common interface (docs/SPEC.md §3.5).

The mechanics and the calibration are in ``pipeline_kernel``; this module
only connects them to execution: ``prepare`` calibrates a run once under its
measured loader settings, ``replay`` replays rows under a policy and the
loader settings ``ReplayParams`` asks for (``workers``/``prefetch_factor``;
``None`` keeps the measured value), and ``cut_points`` allows execution to
split a run only where the model restarts anyway: at the first row of every
segment (a run of consecutive iterations of one epoch).

When the logs carry CPU times and the node's cores (SPEC §1.2), a what-if
also shares the node's cores (``cpu_share``, SPEC §4.2 "CPU contention"):
the replay is repeated with every CPU second stretched by ρ until ρ agrees
with the CPU demand the replayed iteration time implies. The stretch is
applied to the arrays the kernel receives (fetch durations and the
calibrated ``after`` term), never inside the kernel. Such a run is not cut
into chunks: ρ belongs to the whole run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from dsim.errors import UsageError
from dsim.replay.models import cpu_share
from dsim.replay.models.base import Replay, ReplayModel
from dsim.replay.params import LoaderSettings, ReplayParams
from dsim.replay.policies import Policy

if TYPE_CHECKING:  # the kernel imports numba (~0.3 s): only runs of this model load it
    from dsim.replay.arrays import IterationArrays
    from dsim.replay.models.pipeline_kernel import Calibration, PipelineInputs

#: Alignments the pipeline kernel knows (it aggregates start times inside the recurrence).
SUPPORTED = ("actual", "min", "avg", "max")


@dataclass(frozen=True)
class PreparedPipeline:
    """A calibrated run (or a slice of whole segments of one): inputs, calibration, settings."""

    inputs: PipelineInputs
    calibration: Calibration
    cpu: CpuState | None = None  # None: fetch durations independent of load (no CPU times)

    @property
    def shape(self) -> tuple[int, int]:
        return self.inputs.fetch.shape  # type: ignore[return-value]

    def take(self, lo: int, hi: int) -> PreparedPipeline:
        """Rows ``[lo, hi)``, which must start and end at segment bounds (``cut_points``)."""
        seg = self.inputs.segments
        inside = (seg[:, 0] >= lo) & (seg[:, 1] <= hi)
        segments = seg[inside] - lo
        covered = int((segments[:, 1] - segments[:, 0]).sum()) if len(segments) else 0
        if covered != hi - lo:
            raise ValueError(f"rows [{lo}, {hi}) do not fall on segment bounds")
        from dsim.replay.models.pipeline_kernel import Calibration, PipelineInputs

        i, c = self.inputs, self.calibration

        def rows(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a[lo:hi])

        inputs = PipelineInputs(
            segments, rows(i.iteration), rows(i.start), rows(i.fetch), rows(i.arrival),
            rows(i.stall), rows(i.iteration_time), rows(i.worker),
            None if i.work_ratio is None else rows(i.work_ratio),
        )  # fmt: skip
        calibration = Calibration(
            c.workers, c.prefetch, rows(c.lat_sent), rows(c.lat_free), rows(c.hand),
            rows(c.deliver), rows(c.after), rows(c.loop), c.keep_worker_ids,
            None if c.busy is None else rows(c.busy),
            None if c.busy_excess is None else rows(c.busy_excess),
            None if c.idle_hand is None else rows(c.idle_hand),
            None if c.busy_wait is None else rows(c.busy_wait),
            None if c.idle_measured is None else rows(c.idle_measured),
            None if c.busy_slope is None else np.ascontiguousarray(c.busy_slope[inside]),
            None if c.busy_icept is None else np.ascontiguousarray(c.busy_icept[inside]),
            None if c.busy_rem is None or not len(c.busy_rem) else rows(c.busy_rem),
        )  # fmt: skip
        cpu = None
        if self.cpu is not None:  # never cut in practice (cut_points); kept whole-run values
            cpu = replace(self.cpu, load=self.cpu.load.take(lo, hi))
        return PreparedPipeline(inputs, calibration, cpu)


@dataclass(frozen=True)
class CpuState:
    """The CPU side of a calibrated run: per-cell CPU times and the measured curve point.

    ``rho_measured``: ρ_m (wall seconds per CPU second in the measured run);
    ``demand_s``: C, the busiest node's CPU seconds per iteration; ``a`` the
    processor-sharing curve's coefficient through (u_m, ρ_m); ``u_cap`` the
    demand at which the cores are busy on the wall clock (``cpu_share.wall_cap``).
    """

    load: cpu_share.CpuLoad
    rho_measured: float
    demand_s: float
    a: float
    measured_iteration_s: float
    rho_given: float | None = None  # replay at this stretch instead of solving (term swaps)
    #: ρ_w,m: the workers' fetches' own measured stretch (``cpu_share.class_stretches``),
    #: which a fetch takes back (``_stretched``); None: the pooled ρ_m serves.
    fetch_rho: float | None = None
    fetch_aligned: bool = False  # ``aligned_cpu`` has set the fetches: the kernel keeps them
    #: the what-if's ``cpu_share.population_factor`` on the workers' excess (``populated``)
    fetch_population: float = 1.0
    u_cap: float = 1.0


#: The logged CPU seconds per wall second of a node, over its recorded cores
#: (``logged_busy``), above which the logs cannot be what those cores ran: on the committed
#: validation runs it reached 0.91 with the cores saturated (316 runs of 2 and 16 cores);
#: the margin over 1 is for clocks and the mean's rows.
CPU_OVERCOMMITTED = 1.1


#: The resolution of a logged time (``dsim.instrument`` prints 9 decimals): a smaller
#: positive CPU time is taken as 0, and a shorter fetch spends its CPU at no rate.
CPU_RESOLUTION_S = 1e-9


def cpu_load(arrays: IterationArrays) -> cpu_share.CpuLoad | None:
    """The run's ``CpuLoad``, or ``None`` when the logs lack CPU times or the core count,
    or log more CPU time than the recorded cores can run (``logged_busy``): the CPU-aware
    replay then has no contention it can calibrate, and replays as without CPU times
    (``cpu_assumption`` says why)."""
    load = logged_cpu_load(arrays)
    if load is None or logged_busy(arrays, load) > CPU_OVERCOMMITTED:
        return None
    return load


def logged_busy(arrays: IterationArrays, load: cpu_share.CpuLoad) -> float:
    """The busiest node's logged CPU seconds per wall second over its recorded cores.

    Why: a node cannot run more CPU seconds than its cores times the wall clock, so a
    value well above 1 says the cores or the ranks per node recorded are not what the
    job ran on (each rank bound to cores of its own, ``sched_getaffinity`` read inside
    one rank's binding, or several nodes' ranks taken as one node for want of
    ``LOCAL_WORLD_SIZE``). The curve cannot be calibrated there: clamped to the pole,
    every what-if replayed as slow as those cores would allow (2.2x on a synthetic
    trace whose logs gave 8 ranks 2.2x their 8 cores). The wall clock per iteration
    is the slowest rank's iteration time, on average (at least the period at which
    iterations follow each other): NaN where no iteration time was logged."""
    times = arrays.iteration_time
    if times.size == 0 or load.cores <= 0:
        return math.nan
    slowest = np.where(np.isfinite(times), times, -np.inf).max(axis=1)
    slowest = slowest[slowest > 0]  # a row with no finite time is -inf
    if slowest.size == 0:
        return math.nan
    return cpu_share.node_demand(load) / (load.cores * float(slowest.mean()))


def logged_cpu_load(arrays: IterationArrays) -> cpu_share.CpuLoad | None:
    """The run's CPU times and node as logged, or ``None`` when the logs lack CPU times or
    the core count (``cpu_load`` also checks they can be what the cores ran)."""
    loader = arrays.loader
    if arrays.fetch_cpu is None or loader is None or not loader.cores:
        return None
    g = arrays.n_gpus
    ranks = loader.local_world_size

    def cells(values: np.ndarray | None) -> np.ndarray:
        if values is None:
            return np.zeros(arrays.fetch.shape)
        # a time below the logs' resolution is 0: over one of 1e-320 (a corrupt line) a
        # ratio overflowed to inf
        tiny = values < CPU_RESOLUTION_S  # in place: one mask beside the column at a time
        tiny &= values > 0
        if np.isfinite(values).all() and not tiny.any():  # the arrays' own, not a copy
            return np.ascontiguousarray(values)
        return np.ascontiguousarray(np.where(tiny, 0.0, np.nan_to_num(values, nan=0.0)))

    cores = int(loader.cores)
    if loader.cpu_domain_ranks and loader.process_cores:
        # ranks bound in groups to CPUs of their own: each group is a node of its own
        # (validation/README.md, "The twenty-seventh held-out sweep")
        cores, ranks = int(loader.process_cores), int(loader.cpu_domain_ranks)
    return cpu_share.CpuLoad(
        fetch_cpu=cells(arrays.fetch_cpu),
        fetch_runq=cells(arrays.fetch_runq),
        train_cpu=cells(arrays.train_cpu),
        train_runq=cells(arrays.train_runq),
        cores=cores,
        ranks_per_node=int(ranks) if ranks else g,
        ranks_per_node_assumed=not ranks,
        runq_known=arrays.fetch_runq is not None,
        fetch_extra=worker_outside_cpu(arrays.fetch_proc, arrays.fetch_cpu),
    )


def worker_outside_cpu(proc: np.ndarray | None, cpu: np.ndarray | None) -> np.ndarray | None:
    """Each batch's CPU seconds that its worker spent outside the thread that built it ([N, G]).

    Why: the worker process's feeder thread pickles each batch into the pipe
    while the next is built, CPU the node's cores serve but ``cpu`` (the
    building thread's) does not hold; on a saturated 2-core node it put the
    cores' limit 7-14 ms per iteration before the contention curve's pole
    (validation/README.md, "The node's idle time, measured"). ``proc − cpu``
    per batch, never negative; a batch without ``proc`` (each worker's first,
    SPEC §1.2) takes its rank's mean, a rank without any the run's mean.
    ``None`` when no fetch line carries ``proc``: the demand is then the
    threads' alone, as before ``proc`` was logged.
    """
    if proc is None or cpu is None:
        return None
    outside = np.maximum(proc - cpu, 0.0)
    known = np.isfinite(outside)
    if not known.any():
        return None
    overall = float(outside[known].mean())
    count = known.sum(axis=0)
    ranks = np.where(
        count > 0, np.where(known, outside, 0.0).sum(axis=0) / np.maximum(count, 1), overall
    )
    return np.ascontiguousarray(np.where(known, outside, ranks[None, :]))


def cpu_assumption(arrays: IterationArrays) -> dict[str, Any] | None:
    """What the replay assumes about CPU contention (``result.json`` ``loader.cpu``).

    ``None`` when the logs carry no CPU times: fetch durations are then taken
    as independent of load, as before CPU times existed (the verdict says so).
    Where they log more CPU time than the recorded cores can run (``cpu_load``),
    ``model`` is ``load-independent`` and ``cpu_over_cores`` says by how much.
    """
    load = logged_cpu_load(arrays)
    if load is None:
        return None
    g = arrays.n_gpus
    node = {
        "cores": load.cores,
        "ranks_per_node": load.ranks_per_node,
        "ranks_per_node_assumed": load.ranks_per_node_assumed,
        "nodes": -(-g // load.ranks_per_node),
    }
    if arrays.loader is not None and arrays.loader.cpu_domain_ranks:
        node["cpu_domains"] = True  # a "node" is a group of ranks bound to one CPU set
    busy = logged_busy(arrays, load)
    if busy > CPU_OVERCOMMITTED:
        return {"model": LOAD_INDEPENDENT, **node, "cpu_over_cores": round(busy, 3)}
    return {
        "model": "cpu-aware",
        **node,
        "runq_logged": load.runq_known,
        "training_cpu_logged": arrays.train_cpu is not None,
        "worker_process_cpu_logged": load.fetch_extra is not None,
    }


#: ``cpu_assumption``'s model where the logged CPU times exceed the recorded cores.
LOAD_INDEPENDENT = "load-independent"


def _stretched(
    prepared: PreparedPipeline,
    rho: float,
    trainer_rho: np.ndarray | None = None,
    drain: np.ndarray | None = None,
) -> PreparedPipeline:
    """The run with every CPU second taking ``rho`` wall seconds instead of ρ_m.

    A fetch of wall time f and CPU time c becomes f + c Δ_w (never negative),
    Δ_w the workers' change of stretch (``cpu_share.class_delta``: their own
    measured stretch, its excess scaled with the pooled one and, for fewer
    workers, by their population, ``populated``; ρ − ρ_m where the logs give
    no class stretch). Where the workers' own stretch ρ_w,m and run-queue
    waits q are known it becomes f + (c + q) Δ_w / ρ_w,m: the same time over
    the run, but a batch that waited less for a core than the run's average
    gets less of the change (SPEC §4.2, "Each batch's own wait": a straggler
    built in a quiet drain was stretched to 698 ms where the re-runs took
    449). Each rank's time after the last arrival grows
    by its training process's CPU time c_t (ρ_t − ρ_m): it competes for the
    same cores.
    ``trainer_rho`` ([N, G]) gives each iteration's ρ_t where the node's
    demand varies along the run (``trainer_stretches``); without it ρ_t = ρ.
    In the ``drain`` rows ([N] bool: each segment's last P·W) the hand-over
    of a ready batch shrinks by min(1, ρ_t / ρ): there the loop only takes
    built batches off the queue, work of the training process that speeds
    up with it (SPEC §4.2, "The drain"). Below ρ_m every row's rank-to-rank
    spread of the hand-over narrows (``hand_spread``). An idle worker's hand-over
    (``idle_hand``: SPEC §4.2, "The busy worker's hand-over") scales by ρ / ρ_m.
    """
    cpu = prepared.cpu
    assert cpu is not None
    fetch_delta = cpu_share.class_delta(rho, cpu.rho_measured, cpu.fetch_rho, cpu.fetch_population)
    # Each [N, G] term is built in one array, in place: this runs on every step of the
    # contention solver and every trainer pass (BENCHMARKS.md, "The CPU-aware headline's
    # memory"); the sums are the same, term for term.
    if cpu.fetch_rho is not None and cpu.fetch_rho > 0.0 and cpu.load.runq_known:
        # each batch's CPU and its wait for a core scale together
        fetch = np.add(cpu.load.fetch_cpu, cpu.load.fetch_runq)
        fetch *= fetch_delta / cpu.fetch_rho
    else:
        fetch = cpu.load.fetch_cpu * fetch_delta
    fetch += prepared.inputs.fetch
    np.maximum(fetch, 0.0, out=fetch)
    inputs = replace(prepared.inputs, fetch=fetch)
    # The training processes keep the pooled stretch: their own class's (tried with the
    # fetches') moved the mixed regime's aligned shares at 1 worker by 3-12 points.
    delta = rho - cpu.rho_measured
    if trainer_rho is None:
        after = cpu.load.train_cpu * delta
    else:
        after = np.subtract(trainer_rho, cpu.rho_measured)
        after *= cpu.load.train_cpu
    after += prepared.calibration.after
    calibration = replace(prepared.calibration, after=after)
    calibration = replace(calibration, hand=hand_spread(calibration.hand, rho, cpu.rho_measured))
    if calibration.idle_hand is not None and cpu.rho_measured > 0:
        # An idle worker's hand-over, put in where the measured one was a busy worker's, is
        # the training process's and the worker's work: it stretches like CPU work.
        ratio = rho / cpu.rho_measured
        calibration = replace(calibration, idle_hand=calibration.idle_hand * ratio)
    if trainer_rho is not None and drain is not None and drain.any() and rho > 0:
        # only the drain rows change (elsewhere the ratio is 1): no [N, G] ratio is made
        rows = np.flatnonzero(drain)
        hand = calibration.hand
        if hand is prepared.calibration.hand:  # the calibration's own: never written
            hand = hand.copy()
        hand[rows] *= np.minimum(trainer_rho[rows] / rho, 1.0)
        calibration = replace(calibration, hand=hand)
    return PreparedPipeline(inputs, calibration, None)


def hand_spread(hand: np.ndarray, rho: float, rho_measured: float) -> np.ndarray:
    """The hand-overs ([N, G]) with each row's rank-to-rank spread shrunk to a what-if's
    lower contention: around the row's mean, by (ρ − 1) / (ρ_m − 1) when ρ < ρ_m.

    Why: the hand-over of a built batch is the training process taking it off
    the queue, and on a busy node part of it is that process waiting for a
    core; the ranks wait unequally, and the spread is carried per row and rank
    from the measured run. A what-if that leaves less CPU work (fetches
    aligned to the fastest rank) waits less: in the cpu regime's align-min
    re-runs the spread was 12–14 ms against 15–19 ms in the base runs, and
    carried whole it predicted 8–23 points too much effective delay
    (validation/README.md, "Aligned fetches"). The waiting part of the
    stretch, ρ − 1, scales it. It is never widened: scaling the hand-over
    itself up with ρ made the sleep regime's worker what-ifs miss by up to
    9.5 % (SPEC §4.2, "The drain"), and the re-runs of align mean, where ρ
    stays near ρ_m, kept their spread.
    """
    excess = rho_measured - 1.0
    if not excess > 0.0 or not rho < rho_measured or hand.size == 0:
        return hand
    shrink = max(rho - 1.0, 0.0) / excess
    finite = np.isfinite(hand)  # a rank without a value leaves the row's mean alone
    counts = finite.sum(axis=1, keepdims=True)
    sums = np.where(finite, hand, 0.0).sum(axis=1, keepdims=True)
    mean = np.divide(sums, counts, out=np.full_like(sums, np.nan), where=counts > 0)
    spread = np.subtract(hand, mean)
    spread *= shrink
    spread += mean
    return spread


def ready_batches(prepared: PreparedPipeline) -> np.ndarray:
    """[N, G] bool: batches built before the loop asked for them, each segment's first P·W
    (start-up, built at once) left out: the batches the busy worker's hand-over is measured
    on (SPEC §4.2), as the calibration selects them."""
    i, c = prepared.inputs, prepared.calibration
    ready = i.start + i.fetch < i.arrival - i.stall
    window = max(c.workers * c.prefetch, 1)
    for lo, _ in i.segments:
        ready[lo : lo + window] = False
    return ready


def busy_time_left(prepared: PreparedPipeline) -> np.ndarray:
    """[N, G]: for each batch whose worker was busy when the loop asked for it (the
    calibration's ``busy``), the time that worker still needed for the batch it was building
    (its next one); NaN elsewhere. What a busy hand-over's wait follows where the worker holds
    the GIL for its whole batch (SPEC §4.2); the diagnostics read it (validation.handover),
    the calibration keeps it only where it is fitted (``busy_rem``)."""
    from dsim.replay.models import pipeline_kernel

    i, c = prepared.inputs, prepared.calibration
    left = np.full(i.fetch.shape, np.nan)
    if c.busy is not None and i.fetch.size:
        pipeline_kernel.busy_time_left(
            i.segments, i.start, i.fetch, i.arrival, i.stall, i.worker, c.busy, left
        )
    return left


def drain_rows(segments: np.ndarray, n: int, startup: int) -> np.ndarray:
    """[N] bool: each segment's last ``startup`` (= P·W) rows, where no fetch starts any more."""
    drain = np.zeros(n, dtype=bool)
    for lo, hi in segments:
        drain[max(hi - startup, lo) : hi] = True
    return drain


def body_rows(segments: np.ndarray, n: int, window: int) -> np.ndarray:
    """[N] bool: each segment's rows from ``window`` (= P·W) to ``window`` before its end.

    None in a segment of at most 2·``window`` rows (the stop is clipped at the
    segment's start: a negative one would count from the run's end).
    """
    body = np.zeros(n, dtype=bool)
    for lo, hi in segments:
        body[lo + window : max(hi - window, lo)] = True
    return body


#: The calibrated terms a base run's drain makes fast: the trainer's step after the last
#: arrival and its hand-over of a built batch (the loop's other terms keep their values).
DRAIN_TERMS = ("after", "hand")


def rebodied(
    prepared: PreparedPipeline, workers: int | None, prefetch: int | None
) -> PreparedPipeline:
    """The run with the start-up and drain rows that the what-if keeps busy calibrated as
    body rows (the start-up's: ``startup_as_body``).

    Why: the calibrated ``after`` and ``hand`` of the measured run's last
    m = P_m·W_m rows (its drain) were measured with idle workers and a fast
    trainer (an 8-worker cpu run: 11 ms after the last arrival there against
    19 ms in its body). A what-if with a shorter window P·W drains only in
    its last P·W rows, so the rows between are body rows of the what-if,
    where every worker still builds batches; carried over as measured, they
    made 4 workers look as fast as 8 (issue #19; SPEC §4.2, "The drain").
    Row k of those takes the ``DRAIN_TERMS`` of row k − m, a body row of the
    measured run, every rank's from the same row: an iteration ends when the
    slowest rank's step does, so the ranks' spread within a row matters
    (each rank's body mean instead gave those rows 37-43 ms against 52-57 ms
    measured). Where row k − m is not a body row (a segment shorter than
    3 m), each rank's mean over the body rows; with no body row, unchanged.
    A longer window needs nothing here: its extra drain rows get the drain's
    stretch (``trainer_stretches``), and its extra start-up rows were body rows
    measured. The measured window (the identity) is left as it is.
    """
    measured = max(prepared.calibration.workers * prepared.calibration.prefetch, 1)
    window = _loader_window(prepared, workers, prefetch)
    if window >= measured:
        return prepared
    prepared = startup_as_body(prepared, window, measured)
    c = prepared.calibration
    n = prepared.inputs.fetch.shape[0]
    segments = prepared.inputs.segments
    moved = np.flatnonzero(drain_rows(segments, n, measured) & ~drain_rows(segments, n, window))
    body = body_rows(segments, n, measured)
    if not len(moved) or not body.any():
        return prepared
    source = moved - measured
    copied = (source >= 0) & body[np.maximum(source, 0)]
    terms = {}
    carried = (*DRAIN_TERMS, "busy") if c.busy is not None else DRAIN_TERMS
    if c.busy_rem is not None and len(c.busy_rem):
        carried = (*carried, "busy_rem")  # the time left goes with its busy flag
    for term in carried:  # a copied hand-over keeps the busy flag it was measured with
        values = np.array(getattr(c, term), dtype=np.float64)
        means = values[body].mean(axis=0)
        values[moved[copied]] = values[source[copied]]
        values[moved[~copied]] = means
        terms[term] = values
    return replace(prepared, calibration=replace(c, **terms))


#: The calibrated terms a base run's start-up makes slow: the latencies before a fetch
#: starts (the worker processes' own start, then the burst of P_m·W_m batches built at once).
STARTUP_TERMS = ("lat_sent", "lat_free")


def startup_as_body(prepared: PreparedPipeline, window: int, measured: int) -> PreparedPipeline:
    """The run with the start-up rows that a shorter loader window keeps busy as body rows.

    Why: the measured run's first m = P_m·W_m rows of a segment are built at
    once when the epoch's iterator is created. Their calibrated latencies hold
    the worker processes' start (an 8-worker cpu run: 220-290 ms from index
    sent to fetch start in its first 8 rows, 6 ms in its body) and their
    fetches the run-queue wait of 4 ranks x 8 workers starting together (125-320
    ms of a 140-340 ms fetch, against 37 of 51 ms in the body). A what-if with a
    shorter window P·W builds rows P·W..m-1 one after another in its body, where
    those batches wait for neither: carried over as measured, each index sent
    in the body waited a start-up latency and each fetch its burst's queue, so
    the 8 -> 1 worker what-ifs of the contention sweep predicted rows 11-15 at
    63-168 ms where the 1-worker re-runs measured ~50, and the mean 12-16 % too
    slow (validation/README.md, "The measured start-up in a what-if's body"; adopted on the
    thirty-fourth and thirty-fifth held-out sweeps).
    The mirror of the drain's rule (``rebodied``): row k of those takes the
    ``STARTUP_TERMS`` of row k + m, a body row of the measured run, every
    rank's from that one row (where it is not a body row, each rank's body
    mean); and where the logs give run-queue waits (CPU-aware), its fetch
    keeps its own CPU time c and other waiting but waits for a core as its
    rank's body fetches did: q = c Σq / Σc over the rank's body rows, the
    fetch f - q_measured + q. The what-if's own start-up rows (< P·W) keep
    what was measured.
    """
    inputs, c = prepared.inputs, prepared.calibration
    n = inputs.fetch.shape[0]
    body = body_rows(inputs.segments, n, measured)
    if not body.any():
        return prepared
    moved = np.concatenate(
        [np.arange(lo + window, min(lo + measured, hi)) for lo, hi in inputs.segments]
        + [np.zeros(0, dtype=np.int64)]
    ).astype(np.int64)
    if not len(moved):
        return prepared
    source = moved + measured
    copied = (source < n) & body[np.minimum(source, n - 1)]
    terms = {}
    for term in STARTUP_TERMS:
        values = np.array(getattr(c, term), dtype=np.float64)
        means = values[body].mean(axis=0)
        values[moved[copied]] = values[source[copied]]
        values[moved[~copied]] = means
        terms[term] = values
    prepared = replace(prepared, calibration=replace(c, **terms))
    cpu = prepared.cpu
    if cpu is None or not cpu.load.runq_known:
        return prepared
    load = cpu.load
    body_cpu = load.fetch_cpu[body].sum(axis=0)
    waits = np.divide(
        load.fetch_runq[body].sum(axis=0),
        body_cpu,
        out=np.zeros_like(body_cpu),
        where=body_cpu > 0,
    )  # each rank's body run-queue wait per CPU second
    runq = np.array(load.fetch_runq, dtype=np.float64)
    fetch = np.array(inputs.fetch, dtype=np.float64)
    wait = load.fetch_cpu[moved] * waits
    fetch[moved] = np.maximum(fetch[moved] - runq[moved] + wait, 0.0)
    runq[moved] = wait
    return replace(
        prepared,
        inputs=replace(inputs, fetch=fetch),
        cpu=replace(cpu, load=replace(load, fetch_runq=runq)),
    )


def _loader_window(prepared: PreparedPipeline, workers: int | None, prefetch: int | None) -> int:
    """P·W of the replay (at least 1): the batches in flight, its start-up and drain length."""
    c = prepared.calibration
    w = c.workers if workers is None else int(workers)
    p = c.prefetch if prefetch is None else int(prefetch)
    return max(w * p, 1)


#: Passes of the trainers' per-iteration stretch (each replays once more), each taking the
#: mean of the previous stretches and the new. Undamped, the passes alternate: a fast drain
#: pulls its iterations onto the fetches still in flight, whose demand then slows it, and
#: two passes (until this version) stopped on the slow side (the drain of every CPU-loaded
#: regime's loader what-ifs predicted 33-67 % too slow on average; damped, 3-25 %).
#: After eight damped passes the predicted means move < 0.1 ms with 24 more (held-out 6's
#: cpu and mixed 2-worker runs replayed with 4 and 8 workers; SPEC §4.2).
TRAINER_PASSES = 8


def trainer_stretches(
    prepared: PreparedPipeline,
    policy: Policy,
    workers: int | None,
    prefetch: int | None,
    rho: float,
) -> np.ndarray:
    """Each iteration's stretch of the training CPU, from the node's demand in it ([N, G]).

    Why: ρ* is the body's stretch; at a segment's end the workers finish their
    last batches and go idle, the node's demand falls and the loop runs
    faster (SPEC §4.2, CPU contention, "The drain"). The replay at ρ* gives
    every fetch's wall interval; a fetch spends its CPU time c (and x, the
    worker's CPU outside the building thread, ``CpuLoad.fetch_extra``) evenly over it,
    a training process its c_t over its iteration; their sum over the node
    during iteration k's span (from the node's earliest end of iteration
    k − 1 to its latest end of k) is the demand d_k, and
    ``cpu_share.trainer_stretch`` turns it into ρ_k (the body's share of ρ*,
    the calibrated curve at the start-up and drain rows). Fetches keep ρ*: a
    fetch lives across many iterations, and the last ones measured as long as
    the body's. Repeated ``TRAINER_PASSES`` times with the new iteration ends,
    each pass's stretches averaged with the previous pass's (damped: the
    undamped passes alternate between a fast and a slow drain).
    """
    from dsim.replay.models import overlap_kernel
    from dsim.replay.models.pipeline_kernel import replay_pipeline

    cpu = prepared.cpu
    assert cpu is not None
    load = cpu.load
    n, g = prepared.inputs.fetch.shape
    startup = _loader_window(prepared, workers, prefetch)
    drain = drain_rows(prepared.inputs.segments, n, startup)
    body = body_rows(prepared.inputs.segments, n, startup)
    first = np.zeros(n, dtype=bool)
    first[prepared.inputs.segments[:, 0]] = True
    per_node = max(load.ranks_per_node, 1)
    # a node's ranks are consecutive (torchrun's numbering): its columns are a slice, so
    # that no pass copies them out (a CPU-aware replay's peak, BENCHMARKS.md)
    nodes = [slice(lo, min(lo + per_node, g)) for lo in range(0, g, per_node)]
    trainer_cpu = [load.train_cpu[:, cols].sum(axis=1) for cols in nodes]
    rho_t = np.full((n, len(nodes)), float(rho))  # one value per node and row
    widths = [cols.stop - cols.start for cols in nodes]

    def per_gpu() -> np.ndarray:  # [N, G]: one node's column seen by all its ranks (a view)
        if len(nodes) == 1:
            return np.broadcast_to(rho_t, (n, g))
        return np.repeat(rho_t, widths, axis=1)

    rate = None  # each fetch's CPU rate: its stretched fetch is ρ*'s, the same every pass
    for _ in range(TRAINER_PASSES):
        stretched = _stretched(prepared, rho, per_gpu(), drain)
        out = replay_pipeline(
            stretched.inputs,
            stretched.calibration,
            kernel_policy(prepared, policy),
            workers,
            prefetch,
            starts=True,
            stalls=False,
        )
        fetch = stretched.inputs.fetch
        del stretched  # its other terms are not read below (16 bytes per GPU-iteration)
        start, end = out["gpu_start_s"], out["gpu_end_s"]
        if rate is None:  # in one array, made in place: it lives through every pass
            extra = load.fetch_extra
            rate = np.array(load.fetch_cpu) if extra is None else load.fetch_cpu + extra
            # a fetch under the logs' resolution spends no CPU at a rate (a corrupt 1e-320
            # made the rate overflow to inf)
            running = fetch >= CPU_RESOLUTION_S
            np.divide(rate, fetch, out=rate, where=running)
            rate[~running] = 0.0
            del running
        ends = np.add(start, fetch, out=fetch)  # each fetch's end, in its duration's place
        for k, (cols, train_cpu) in enumerate(zip(nodes, trainer_cpu, strict=True)):
            span_lo, span_hi = overlap_kernel.node_spans(end[:, cols], first, out["iteration_s"])
            demand = np.empty(n)
            for lo, hi in prepared.inputs.segments:  # each from its own start: none overlaps
                demand[lo:hi] = cpu_share.overlap_rate(
                    start[lo:hi, cols], ends[lo:hi, cols], rate[lo:hi, cols], span_lo[lo:hi],
                    span_hi[lo:hi],
                )  # fmt: skip
            length = span_hi - span_lo
            trainers = np.divide(train_cpu, length, out=np.zeros(n), where=length > 0)
            damped = cpu_share.trainer_stretch(rho, demand + trainers, body, (load.cores, cpu.a))
            damped += rho_t[:, k]  # damped: undamped passes alternate (TRAINER_PASSES)
            damped *= 0.5
            rho_t[:, k] = damped
        del out, start, fetch, ends, end
    return per_gpu()


def aligned_cpu(prepared: PreparedPipeline, fetch_align: str) -> PreparedPipeline:
    """The fetches and CPU times as a fetch alignment changes them, and the demand with them.

    Aligning a batch's fetches to the fastest rank's (``min``) gives every rank
    that rank's work for the batch: its CPU time c and the part of its fetch
    that was neither CPU nor run-queue wait w (I/O, sleeps); to the mean
    (``avg``), the means over ranks. Each rank keeps its own contention for
    that batch: its measured run-queue wait per CPU second q/c, so the
    aligned fetch lasts w + c (1 + q_r / c_r) on rank r. Copying the fastest
    rank's wall time to every rank instead made the ranks finish together
    and predicted no effective delay where the re-runs measured 26-89 %
    (FIDELITY.md, mixed regime). The node's CPU demand C follows, so that
    aligned loaders that do less work also contend less (SPEC §4.2, CPU
    contention). The kernel then replays these fetches as they are
    (``kernel_policy``).
    """
    cpu = prepared.cpu
    if cpu is None or fetch_align == "actual":
        return prepared
    load = cpu.load
    n, g = load.fetch_cpu.shape
    if n == 0:
        return prepared
    fetch = prepared.inputs.fetch
    c, q = load.fetch_cpu, load.fetch_runq
    other = np.maximum(fetch - c - q, 0.0)
    if fetch_align == "min":
        rank = np.argmin(fetch, axis=1)
        rows = np.arange(n)
        work, rest = c[rows, rank], other[rows, rank]
    else:
        work, rest = c.mean(axis=1), other.mean(axis=1)
    # (``cpu_load`` took CPU times below the logs' resolution as 0: no ratio overflows)
    share = np.divide(q, c, out=np.zeros_like(q), where=c > 0)
    cpu_work = np.broadcast_to(work[:, None], (n, g))  # every rank's the same: a view
    load = replace(load, fetch_cpu=cpu_work, fetch_runq=cpu_work * share)
    inputs = replace(
        prepared.inputs,
        fetch=np.ascontiguousarray(rest[:, None] + cpu_work * (1.0 + share)),
        work_ratio=np.divide(cpu_work, c, out=np.ones_like(c), where=c > 0),
    )
    state = replace(cpu, load=load, demand_s=cpu_share.node_demand(load), fetch_aligned=True)
    return PreparedPipeline(inputs, prepared.calibration, state)


def kernel_policy(prepared: PreparedPipeline, policy: Policy) -> Policy:
    """The policy the kernel replays: fetches ``aligned_cpu`` already set are kept as they are."""
    if prepared.cpu is not None and prepared.cpu.fetch_aligned:
        return ("actual", policy[1])
    return tuple(policy)  # type: ignore[return-value]


def pipeline_inputs(arrays: IterationArrays) -> PipelineInputs:
    """The kernel's row-major inputs from a run's [N, G] arrays."""
    from dsim.replay.models.pipeline_kernel import PipelineInputs, segments_of

    def c(a: np.ndarray, dtype: Any = np.float64) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=dtype)

    # the worker ids as the arrays hold them (int32): a view, not an int64 copy of
    # 8 bytes per GPU-iteration beside them
    return PipelineInputs(
        segments_of(arrays.epoch, arrays.iteration),
        c(arrays.iteration, np.int64), c(arrays.start), c(arrays.fetch), c(arrays.arrival),
        c(arrays.stall), c(arrays.iteration_time), c(arrays.worker, arrays.worker.dtype),
    )  # fmt: skip


def measured_loader(arrays: IterationArrays) -> LoaderSettings:
    """The run's loader settings: as its trace logged them, else as its worker ids imply."""
    if arrays.loader is not None:
        return arrays.loader
    return LoaderSettings.implied(arrays.worker)


def stream_workers_refusal(measured: int, asked: int, run: str | None = None) -> str:
    """Why a run of an IterableDataset cannot be replayed with another worker count."""
    where = "this run" if run is None else f"run {run}"
    return (
        f"--workers {asked}: {where} read an IterableDataset with {measured} workers "
        f"(its fetch lines carry stream positions); each worker read its own shard of the "
        f"stream and no sampler maps batches to workers, so dsim cannot tell which batches, "
        f"of what duration, {asked} workers would build; alignments and --prefetch-factor "
        f"are replayed (see --workers in `dsim run --help`)"
    )


def check_stream_workers(
    arrays: IterationArrays, workers: int | None, run: str | None = None
) -> None:
    """Refuse a worker what-if on a run whose fetches came from an IterableDataset (SPEC §4.2)."""
    if not arrays.stream or workers is None:
        return
    measured = measured_loader(arrays).workers
    if int(workers) != measured:
        raise UsageError(stream_workers_refusal(measured, int(workers), run))


def assumed_loader(measured: LoaderSettings, params: ReplayParams) -> tuple[int, int]:
    """The (workers, prefetch factor) a replay assumes: the what-if where given, else measured."""
    workers = measured.workers if params.workers is None else params.workers
    prefetch = (
        measured.prefetch_factor if params.prefetch_factor is None else params.prefetch_factor
    )
    return int(workers), int(prefetch)


class PipelineModel(ReplayModel):
    """DataLoader pipelines per rank, coupled by the all-reduce, across iterations."""

    name = "pipeline"
    params = ("workers", "prefetch_factor")
    uses_loader = True
    reads_cpu = True  # the CPU-aware path (SPEC §4.2)
    #: Bump on every change of this model's predictions (its cache keys, SPEC §7.2); a
    #: serial after the date where they changed more than once in a day: the contention's
    #: root found by interpolation (within the same tolerance, not the same digits), then
    #: a few busy hand-overs kept where the time left explains them; 2026-12-08: the
    #: measured start-up's rows that a shorter loader window builds in its body
    #: (``startup_as_body``).
    revision = "2026-12-08"

    def prepare(self, arrays: IterationArrays, params: ReplayParams) -> PreparedPipeline:
        from dsim.replay.models.pipeline_kernel import calibrate

        measured = measured_loader(arrays)
        inputs = pipeline_inputs(arrays)
        check_stream_workers(arrays, params.workers)
        prepared = PreparedPipeline(
            inputs,
            calibrate(inputs, measured.workers, measured.prefetch_factor, arrays.stream),
        )
        load = cpu_load(arrays)
        if load is None or arrays.n_iterations == 0:
            return prepared
        measured_t = _mean_iteration(prepared, ("actual", "actual"), None, None)
        demand = cpu_share.node_demand(load)
        u_m = demand / (load.cores * measured_t) if measured_t > 0 else 0.0
        rho_m = cpu_share.measured_stretch(load)
        a = cpu_share.coefficient(u_m, rho_m)
        if rho_m is None:  # no run-queue waits logged: the curve's own value at u_m
            rho_m = cpu_share.stretch(min(u_m, cpu_share.U_MAX_MEASURED), a)
        classes = cpu_share.class_stretches(load)
        state = CpuState(
            load, rho_m, demand, a, measured_t,
            fetch_rho=None if classes is None else classes[0],
            u_cap=cpu_share.wall_cap(measured_period(prepared), measured_t, u_m),
        )  # fmt: skip
        return PreparedPipeline(prepared.inputs, prepared.calibration, state)

    def supports(self, policy: Policy) -> bool:
        return all(name in SUPPORTED for name in policy)

    def replay(
        self,
        prepared: PreparedPipeline,
        policy: Policy,
        params: ReplayParams,
        per_gpu: bool = True,
    ) -> Replay:
        """``per_gpu=False``: ``gpu_stall_s`` left empty ([0, G]), for callers that read the
        metrics only (``dsim.analysis.headline``): the kernel then holds two [N, G]
        matrices fewer."""
        unsupported = [name for name in policy if name not in SUPPORTED]
        if unsupported:
            raise UsageError(
                f"the pipeline model cannot replay alignment {unsupported[0]!r} "
                f"(it supports {', '.join(SUPPORTED)})"
            )
        from dsim.replay.models.pipeline_kernel import replay_pipeline

        workers, prefetch = params.workers, params.prefetch_factor
        calibration = prepared.calibration
        if calibration.keep_worker_ids and workers not in (None, calibration.workers):
            raise UsageError(stream_workers_refusal(calibration.workers, workers))
        same = (workers in (None, calibration.workers)) and (
            prefetch in (None, calibration.prefetch)
        )
        replayed = tuple(policy)
        if prepared.cpu is not None and not (same and replayed == ("actual", "actual")):
            prepared, replayed = contended(prepared, policy, workers, prefetch)
        out = replay_pipeline(
            prepared.inputs,
            prepared.calibration,
            replayed,
            workers,
            prefetch,
            starts=False,
            per_gpu=per_gpu,
        )
        return Replay(
            iteration_s=out["iteration_s"],
            stall_s=out["stall_s"],
            delay_s=out["delay_s"],
            fetch_diff_s=out["fetch_diff_s"],
            start_diff_s=out["start_diff_s"],
            gpu_stall_s=out["gpu_stall_s"],
        )

    def cut_points(self, arrays: IterationArrays) -> np.ndarray | None:
        from dsim.replay.models.pipeline_kernel import segments_of

        if cpu_load(arrays) is not None:  # one stretch for the whole run: never cut it
            return np.zeros(1, dtype=np.int64)
        return segments_of(arrays.epoch, arrays.iteration)[:, 0]


def measured_period(prepared: PreparedPipeline) -> float:
    """The measured run's wall period: the mean interval between consecutive iteration ends.

    An iteration ends on the node when its latest rank's step does: the last
    arrival plus the largest calibrated ``after``. Over the steady rows, as
    ``_mean_iteration`` takes T_m (each segment's first and last P_m*W_m left
    out), and per segment, so that the gap between epochs is not an interval;
    segments weigh by their steady rows. 0.0 where no segment has two.
    Why: ``cpu_share.wall_cap`` maps T to the wall clock with it.
    """
    inputs, c = prepared.inputs, prepared.calibration
    if inputs.arrival.size == 0:
        return 0.0

    def end(row: int) -> float:  # only each segment's two end rows are read
        return float(np.max(inputs.arrival[row]) + np.max(c.after[row]))

    edge = max(c.workers * c.prefetch, 1)
    span, steps = 0.0, 0
    for lo, hi in inputs.segments:
        first, last = int(lo) + edge, int(hi) - edge - 1
        if last <= first:
            continue
        start, stop = end(first), end(last)
        if np.isfinite(start) and np.isfinite(stop):
            span += stop - start
            steps += last - first
    return span / steps if steps else 0.0


def _mean_iteration(
    prepared: PreparedPipeline, policy: Policy, workers: int | None, prefetch: int | None
) -> float:
    """The replay's steady mean iteration time: each segment's start-up and measured drain left out.

    The first P*W batches of a segment are sent with the epoch's iterator and
    built while the loop waits for the first one; their iterations say
    nothing about the rate at which the cores keep up (T in u = C / (K T)).
    So are the measured run's own first P_m*W_m: their calibrated latencies
    carry the measured start-up, where P_m*W_m batches were built at once.
    Leaving only the what-if's P*W out let an 8-worker run's 16-batch
    start-up inflate T of a 2-worker what-if, lower u and ρ*, and predict
    its body below the cores' bound C / K (FIDELITY.md: -18 % to -32 %).

    The measured run's last P_m*W_m rows (its drain) are left out too, of T
    and of T_m alike: they ran with idle workers and a fast trainer, so an
    8-worker run's 16 fast rows lowered T_m and raised u_m, and a 4-worker
    what-if, which drains in 8 rows, got a T that mixed body rows in where
    T_m had drain rows, a lower u and a lower ρ*: its body predicted faster
    than the 8-worker run's (issue #19; validation/README.md, "The two open
    misses").
    """
    from dsim.replay.models.pipeline_kernel import replay_pipeline

    out = replay_pipeline(
        prepared.inputs, prepared.calibration, policy, workers, prefetch, starts=False
    )
    times = out["iteration_s"]
    if len(times) == 0:
        return 0.0
    c = prepared.calibration
    w = c.workers if workers is None else int(workers)
    p = c.prefetch if prefetch is None else int(prefetch)
    startup = max(w * p, c.workers * c.prefetch, 1)
    drain = max(c.workers * c.prefetch, 1)
    steady = np.ones(len(times), dtype=bool)
    for lo, hi in prepared.inputs.segments:
        steady[lo : min(lo + startup, hi)] = False
        steady[max(hi - drain, lo) : hi] = False
    return float(np.mean(times[steady] if steady.any() else times))


def populated(prepared: PreparedPipeline, workers: int | None) -> PreparedPipeline:
    """The run with its workers' excess stretch scaled for a what-if of fewer ``workers`` per
    rank than measured (``cpu_share.population_factor``; None, the measured count or more:
    as measured).

    Why fewer only: scaled up for more workers, the workers' stretch rose while the pooled
    one the fixed point solves fell, and the training processes with it: a CPU-bound
    loader's 4-worker what-if came out 7 % faster than its 1-worker run and below the
    cores' bound C / K (tests/test_cpu_share.py). Scaled down, both fall together, as
    the 1-worker re-runs measure (validation/README.md, "The eighteenth held-out sweep").
    """
    cpu = prepared.cpu
    measured = prepared.calibration.workers
    if cpu is None or workers is None or int(workers) >= measured:
        return prepared
    factor = cpu_share.population_factor(int(workers), measured)
    return replace(prepared, cpu=replace(cpu, fetch_population=factor))


def solve_contention(
    prepared: PreparedPipeline, policy: Policy, workers: int | None, prefetch: int | None
) -> cpu_share.Solution:
    """The stretch ρ at which the replay's iteration time and the node's CPU demand agree."""
    prepared = populated(prepared, workers)
    cpu = prepared.cpu
    assert cpu is not None
    replayed = kernel_policy(prepared, policy)

    def t_of(rho: float) -> float:
        return _mean_iteration(_stretched(prepared, rho), replayed, workers, prefetch)

    return cpu_share.solve(t_of, cpu.demand_s, cpu.load.cores, cpu.a, u_cap=cpu.u_cap)


def contended(
    prepared: PreparedPipeline, policy: Policy, workers: int | None, prefetch: int | None
) -> tuple[PreparedPipeline, Policy]:
    """The run as the what-if's CPU contention stretches it, and the policy the kernel replays.

    The fetch alignment moves the CPU work (``aligned_cpu``); the stretch ρ*
    is solved (``solve_contention``) unless the run carries one to use
    (``CpuState.rho_given``: the validation's swap of the re-run's measured
    stretch); the trainers' stretch follows the node's demand per iteration
    (``trainer_stretches``).
    """
    prepared = populated(aligned_cpu(rebodied(prepared, workers, prefetch), policy[0]), workers)
    cpu = prepared.cpu
    assert cpu is not None
    if cpu.rho_given is not None:
        rho = float(cpu.rho_given)
    else:
        rho = solve_contention(prepared, policy, workers, prefetch).rho
    rho_t = trainer_stretches(prepared, policy, workers, prefetch, rho)
    n = prepared.inputs.fetch.shape[0]
    drain = drain_rows(prepared.inputs.segments, n, _loader_window(prepared, workers, prefetch))
    return _stretched(prepared, rho, rho_t, drain), kernel_policy(prepared, policy)
