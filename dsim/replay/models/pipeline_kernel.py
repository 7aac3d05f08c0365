"""The ``pipeline`` replay model: DataLoader pipelines and the all-reduce, across iterations.

The per-iteration model replays every iteration on its own. Real loaders are
pipelines, so a batch that is ready earlier or later moves every later one:
this model re-simulates the mechanics of stock PyTorch per rank
(``torch/utils/data/dataloader.py``) and couples the ranks by the all-reduce:

* batch ``i`` of an epoch goes to worker ``i mod W`` (the worker cycle
  restarts at 0 every epoch; the measured run's own worker ids are kept
  when the loader settings are unchanged); the first ``P*W`` indices are sent when the
  epoch's iterator is created, every later one when batch ``k - P*W`` is
  handed to the training loop; a worker builds its batches in order, one at
  a time, so batch ``k`` starts when its index was sent *and* the worker
  finished batch ``k - W``;
* the loop asks for batch ``k`` when iteration ``k - 1`` ended and gets it
  ``d`` seconds after the fetch ended (if it had to wait) or ``h`` seconds
  after asking (if the batch was already there: the hand-over cost);
* an iteration ends on every rank a rank-specific time after the *last*
  rank's batch arrived (the gradients' all-reduce waits for the slowest);
* a start alignment only ever delays a fetch (SPEC §4.2): rank r starts batch
  k at ``max(s_r, aggregate of the ranks' s_q)``, ``s_r`` its causal start
  (index sent, worker free). So start-min is start actual here, and no start
  alignment lets a worker build two batches at once -- which is what let the
  earlier non-causal rule predict more than the loader could deliver.

Every term the logs do not show is calibrated per batch and rank from the
measured run: the latency from an index being sent, or from the worker's
previous batch, to the fetch's start; the delivery and hand-over latencies;
each rank's time from the last arrival to the end of its iteration; the
loop's own gap between iterations. Where two constraints meet in a ``max``
(index sent vs worker free; fetch done vs loop asking), the measured
latency belongs to the constraint that held the batch back, and the other
side gets the typical latency of that constraint (the mean over all ranks,
start-up batches left out), capped so that it
never binds in the measured run. So ``actual/actual`` with the measured
loader settings gives back the measured run to float precision (identity),
and a what-if in which the other constraint binds pays that constraint's
own typical latency instead of the first one's (a worker that goes from
waiting for indices to being busy starts its fetches ~0.2 ms after the
previous batch, not the ~0.7 ms an index takes to arrive). A what-if keeps
these terms and changes only what it names: fetch durations and starts
(the alignment policies) or the loader's ``W`` and ``P``.

The recurrences are sequential in batches, so the kernels are compiled with
numba (a plain NumPy loop over batches is ~100x slower, see bench/); they
loop over batches and ranks of one policy. Segments -- runs of consecutive
iterations of one epoch -- are replayed independently, each from its own
measured start: the metrics are durations, so a segment's shift in absolute
time does not matter, and an iteration missing for some rank only splits a
segment instead of derailing the rest of the run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from dsim.replay.models.jitcache import can_cache

#: Compiled kernels kept on disk where numba can write (``jitcache``), else compiled anew.
_CACHE = can_cache(__file__)
ACTUAL, MIN, AVG, MAX = 0, 1, 2, 3
_CODES = {"actual": ACTUAL, "min": MIN, "avg": AVG, "max": MAX}


@dataclass(frozen=True)
class PipelineInputs:
    """One run as row-major [N, G] arrays (iterations x GPUs), rows sorted by (epoch, iteration).

    ``start`` and ``arrival`` are seconds since a common origin; ``worker``
    holds dense worker numbers per rank (0..W-1).
    """

    segments: np.ndarray  # int64 [S, 2]: row ranges [lo, hi) of consecutive iterations
    iteration: np.ndarray  # int64 [N]: the batch index within its epoch
    start: np.ndarray  # FS: fetch start
    fetch: np.ndarray  # F: fetch duration
    arrival: np.ndarray  # A: batch arrival in the loop (training line timestamp)
    stall: np.ndarray  # ST
    iteration_time: np.ndarray  # T
    worker: np.ndarray  # int32 (the run's arrays, shared: no copy) or int64
    # Per batch and rank, the CPU work a what-if gives the batch over its measured CPU work
    # (a fetch alignment moves it: ``pipeline.aligned_cpu``); ``None``: unchanged (1). A busy
    # worker's hand-over waits on the batch that worker is building, in proportion to its
    # work (SPEC §4.2, "The busy worker's hand-over").
    work_ratio: np.ndarray | None = None


@dataclass(frozen=True)
class Calibration:
    """Per batch and rank residuals of the measured run under its loader settings (W, P)."""

    workers: int
    prefetch: int
    lat_sent: np.ndarray  # index sent -> fetch start, when the worker waited for the index
    lat_free: np.ndarray  # worker's previous batch done -> fetch start, when it was busy
    hand: np.ndarray  # hand-over latency when the batch was already there
    deliver: np.ndarray  # delivery latency from fetch end to arrival when the loop waited
    after: np.ndarray  # time from the last rank's arrival to this rank's iteration end
    loop: np.ndarray  # the loop's gap between the end of iteration k-1 and asking for batch k
    # An IterableDataset's run (SPEC §4.2): each worker reads its own shard of the stream,
    # so a batch keeps its measured worker under every prefetch factor (the worker count
    # cannot change; ``PipelineModel`` refuses that).
    keep_worker_ids: bool = False
    # The busy worker's hand-over (SPEC §4.2): 1.0 where the batch's worker was building a
    # later batch when the loop asked for it, else 0.0 ([N, G]); and per row ([N]) how much
    # longer its segment's ready batches took to hand over when their worker was busy.
    # ``None``: no such term (a calibration built by hand), the hand-over as carried.
    busy: np.ndarray | None = None
    busy_excess: np.ndarray | None = None
    idle_hand: np.ndarray | None = None  # per row ([N]): its segment's idle worker's hand-over
    # Per batch and rank ([N, G]): what a busy worker would add to its hand-over. For a ready
    # batch whose worker was idle, the segment's busy hand-over at the same quantile as its own
    # among the idle ones, less its own; for any other, the busy extra ([0, G] where no segment
    # has an extra: then nothing reads it). And per row ([N]) the idle hand-over as measured
    # (``idle_hand`` is the what-if's: contention stretches it).
    busy_wait: np.ndarray | None = None
    idle_measured: np.ndarray | None = None
    # The busy hand-over's wait for the batch being built (SPEC §4.2): per segment ([S]) the
    # slope and intercept of a busy ready batch's stall on the time its worker still needed
    # for that batch when the loop asked (0, 0 where the stall does not follow it); and per
    # batch and rank ([N, G]) that time as measured (0 where the worker was idle), only where
    # some segment has a slope ([0, G] else: kept always, it made ``dsim run`` peak 10 bytes
    # per GPU-iteration higher on runs without the effect).
    busy_slope: np.ndarray | None = None
    busy_icept: np.ndarray | None = None
    busy_rem: np.ndarray | None = None


def segments_of(epoch: np.ndarray, iteration: np.ndarray) -> np.ndarray:
    """Row ranges of consecutive iterations within one epoch (a gap or a new epoch cuts)."""
    n = len(epoch)
    if n == 0:
        return np.zeros((0, 2), dtype=np.int64)
    cut = np.flatnonzero((np.diff(epoch) != 0) | (np.diff(iteration) != 1)) + 1
    bounds = np.concatenate(([0], cut, [n])).astype(np.int64)
    return np.stack([bounds[:-1], bounds[1:]], axis=1)


@njit(cache=_CACHE)
def _typical(samples, counts):  # pragma: no cover - compiled
    """The typical latency: the mean over every rank's samples, the same for all ranks.

    A mean, not a median, and pooled, not per rank: a rank that switches to a
    constraint it rarely met in the measured run must drift at the same
    average rate, hiccups included, as the ranks that met it all along. Its
    own few samples of that constraint are a biased sample (they come from
    unusual moments), and a bias of 0.05 ms a batch is enough to let it run
    ahead of the others in every what-if.
    """
    g = samples.shape[0]
    total = 0.0
    n = 0
    for r in range(g):
        for j in range(counts[r]):
            total += samples[r, j]
        n += counts[r]
    return np.full(g, total / n if n else 0.0)


#: Ready batches of each kind (worker busy, worker idle) a segment needs before the busy
#: worker's extra hand-over is measured there; with fewer, it is taken as 0 (none).
BUSY_MIN_SAMPLES = 10
#: Standard errors by which the busy ready batches' mean hand-over must exceed the idle ones'.
BUSY_MIN_SE = 2.0
#: Share of the busy ready batches' stall variance the time left on the batch being built
#: must explain (r²) for the hand-over to be replayed as waiting for that batch.
BUSY_MIN_R2 = 0.8
#: Busy ready batches enough for the extra where the time left explains it (r² ≥
#: ``BUSY_MIN_R2``): a line that holds is a mechanism, not a mean, and in a run whose
#: workers are seldom busy when the loop asks (4 workers per rank on 16 cores: 7 of 368
#: ready batches) those few hand-overs are the run's longest stalls.
BUSY_MIN_LINE_SAMPLES = 5


@njit(cache=_CACHE)
def _next_of_worker(worker, lo, hi, nxt, seen):  # pragma: no cover - compiled
    """Fill ``nxt[k, r]`` with the row of the same worker's next batch after row lo + k of
    the segment [lo, hi) (-1: none); ``seen`` is a scratch buffer of the worker slots."""
    for r in range(worker.shape[1]):
        seen[:] = -1
        for i in range(hi - 1, lo - 1, -1):
            nxt[i - lo, r] = seen[worker[i, r]]
            seen[worker[i, r]] = i


@njit(cache=_CACHE)
def _calibrate(
    segments,
    start,
    fetch,
    arrival,
    stall,
    itime,
    worker,
    workers,
    prefetch,
    min_samples,
    min_se,
    min_r2,
    min_line_samples,
):  # pragma: no cover - compiled
    # Memory: besides the 6 [N, G] results, only buffers of the longest segment. The
    # loop's request (arrival - stall), iteration end (request + T) and fetch end
    # (start + F) are computed where they are read, never held as [N, G] matrices
    # (the same IEEE sums: no product, so nothing for a fused multiply-add to change).
    n, g = start.shape
    lat_sent = np.empty((n, g))
    lat_free = np.empty((n, g))
    hand = np.empty((n, g))
    deliver = np.empty((n, g))
    after = np.empty((n, g))
    loop = np.zeros((n, g))
    longest = 0
    for s in range(segments.shape[0]):
        longest = max(longest, segments[s, 1] - segments[s, 0])
    sent = np.empty((longest, g))  # by position in the segment
    free = np.empty((longest, g))
    nworkers = max(int(worker.max()) + 1, 1) if n else 1
    last_end = np.empty((g, nworkers))
    # Per rank, the samples of one segment the typical latencies are the means of.
    index_bound = np.empty((g, longest))  # fetch start - index sent, the worker waited for it
    busy_bound = np.empty((g, longest))  # fetch start - previous batch done, it was busy
    ready = np.empty((g, longest))  # stalls of batches that were there before the loop asked
    waited = np.empty((g, longest))  # arrival - fetch end of batches the loop waited for
    counts = np.zeros((4, g), dtype=np.int64)
    busy = np.zeros((n, g), dtype=np.float32)
    busy_excess = np.zeros(n)
    idle_hand = np.zeros(n)
    busy_wait = np.zeros((0, g))  # allocated at the first segment with a busy extra
    busy_slope = np.zeros(segments.shape[0])
    busy_icept = np.zeros(segments.shape[0])
    busy_values = np.empty(longest * g)  # the segment's ready batches' stalls, by kind
    idle_values = np.empty(longest * g)
    after_same = np.empty((longest, g), dtype=np.int64)  # by position in the segment
    seen = np.empty(nworkers, dtype=np.int64)
    for s in range(segments.shape[0]):
        lo, hi = segments[s, 0], segments[s, 1]
        last_end[:, :] = -np.inf
        counts[:, :] = 0
        for i in range(lo, hi):
            k = i - lo
            last = arrival[i, 0]
            for r in range(1, g):
                last = max(last, arrival[i, r])
            for r in range(g):
                req = arrival[i, r] - stall[i, r]
                fe = start[i, r] + fetch[i, r]
                if workers == 0:  # loading in the main process, on request
                    sent[k, r] = req
                elif k < prefetch * workers:  # the first indices go out with the iterator
                    sent[k, r] = arrival[lo, r] - stall[lo, r]
                else:  # one more index each time a batch is handed to the loop
                    sent[k, r] = arrival[i - prefetch * workers, r]
                free[k, r] = -np.inf
                if workers > 0:
                    free[k, r] = last_end[r, worker[i, r]]
                    last_end[r, worker[i, r]] = fe
                if k > 0:
                    loop[i, r] = req - ((arrival[i - 1, r] - stall[i - 1, r]) + itime[i - 1, r])
                after[i, r] = (req + itime[i, r]) - last
                if k < max(prefetch * workers, 1):
                    continue  # start-up batches (sent with the iterator) are not typical
                if sent[k, r] > free[k, r]:
                    index_bound[r, counts[0, r]] = start[i, r] - sent[k, r]
                    counts[0, r] += 1
                else:
                    busy_bound[r, counts[1, r]] = start[i, r] - free[k, r]
                    counts[1, r] += 1
                if fe < req:
                    ready[r, counts[2, r]] = stall[i, r]
                    counts[2, r] += 1
                else:
                    waited[r, counts[3, r]] = arrival[i, r] - fe
                    counts[3, r] += 1
        s_hat = _typical(index_bound, counts[0])
        f_hat = _typical(busy_bound, counts[1])
        h_hat = _typical(ready, counts[2])
        d_hat = _typical(waited, counts[3])
        for i in range(lo, hi):
            k = i - lo
            for r in range(g):
                req = arrival[i, r] - stall[i, r]
                fe = start[i, r] + fetch[i, r]
                # Each measured latency goes to the constraint that held the fetch back; the
                # other side gets its typical value (never more than the measurement allows).
                if sent[k, r] + s_hat[r] >= free[k, r] + f_hat[r]:  # waited for the index
                    lat_sent[i, r] = start[i, r] - sent[k, r]
                    lat_free[i, r] = min(f_hat[r], start[i, r] - free[k, r])
                else:  # busy with the previous batch
                    lat_free[i, r] = start[i, r] - free[k, r]
                    lat_sent[i, r] = min(s_hat[r], start[i, r] - sent[k, r])
                if fe + d_hat[r] <= req + h_hat[r]:  # the batch was there
                    hand[i, r] = stall[i, r]
                    deliver[i, r] = min(d_hat[r], arrival[i, r] - fe)
                else:  # the loop waited for the fetch: delivery binds
                    deliver[i, r] = arrival[i, r] - fe
                    hand[i, r] = min(h_hat[r], stall[i, r])
        # The busy worker's hand-over: was the batch's worker building its next batch when
        # the loop asked? Ready batches' stalls, pooled over ranks, split by that.
        _next_of_worker(worker, lo, hi, after_same, seen)
        total_busy = 0.0
        total_idle = 0.0
        square_busy = 0.0
        square_idle = 0.0
        n_busy = 0
        n_idle = 0
        sum_rem = 0.0
        sum_rem2 = 0.0
        sum_rem_st = 0.0
        for r in range(g):
            for i in range(hi - 1, lo - 1, -1):  # (the order the committed FIDELITY sums in)
                if workers == 0:
                    continue
                j = after_same[i - lo, r]
                req = arrival[i, r] - stall[i, r]
                left = 0.0  # the time the worker still needed for batch j, when busy
                # Only a batch whose index went out before this hand-over counts (as in the
                # replay: one sent with it cannot have started, whatever a log says).
                sent_before = j - lo < prefetch * workers or j - prefetch * workers < i
                if j >= 0 and sent_before and start[j, r] <= req < start[j, r] + fetch[j, r]:
                    busy[i, r] = 1.0
                    left = start[j, r] + fetch[j, r] - req
                if i - lo < max(prefetch * workers, 1) or not start[i, r] + fetch[i, r] < req:
                    continue  # start-up batches, and batches the loop waited for
                if busy[i, r] > 0.0:
                    busy_values[n_busy] = stall[i, r]
                    total_busy += stall[i, r]
                    square_busy += stall[i, r] * stall[i, r]
                    sum_rem += left
                    sum_rem2 += left * left
                    sum_rem_st += left * stall[i, r]
                    n_busy += 1
                else:
                    idle_values[n_idle] = stall[i, r]
                    total_idle += stall[i, r]
                    square_idle += stall[i, r] * stall[i, r]
                    n_idle += 1
        gap = 0.0
        idle = 0.0
        as_mean = n_busy >= min_samples  # else only where the time left explains it
        if n_busy >= min(min_samples, min_line_samples) and n_idle >= min_samples:
            idle = total_idle / n_idle
            gap = total_busy / n_busy - idle
            # Only an extra that stands out of the two means' noise (2 standard errors).
            var_busy = max(square_busy / n_busy - (total_busy / n_busy) ** 2, 0.0)
            var_idle = max(square_idle / n_idle - idle**2, 0.0)
            if gap <= min_se * np.sqrt(var_busy / n_busy + var_idle / n_idle) or gap <= 0.0:
                gap = 0.0
        slope = 0.0
        icept = 0.0
        if gap > 0.0:
            mean_st = total_busy / n_busy
            mean_rem = sum_rem / n_busy
            var_rem = sum_rem2 / n_busy - mean_rem * mean_rem
            var_st = max(square_busy / n_busy - mean_st * mean_st, 0.0)
            cov = sum_rem_st / n_busy - mean_rem * mean_st
            if var_rem > 0.0 and var_st > 0.0 and cov * cov >= min_r2 * var_rem * var_st:
                slope = min(max(cov / var_rem, 0.0), 1.0)
                icept = mean_st - slope * mean_rem
        if gap > 0.0 and not as_mean and slope == 0.0:
            gap = 0.0  # too few busy hand-overs for a mean, and no line that holds
            idle = 0.0
        busy_slope[s] = slope
        busy_icept[s] = icept
        for i in range(lo, hi):
            busy_excess[i] = gap
            idle_hand[i] = idle
        if gap > 0.0:
            # Kept from the first segment with an extra on ([0, G] in a run without one: the
            # replay reads it only there; kept for every run it is 8 bytes per GPU-iteration
            # of `dsim run`'s peak). The segments before have none: zeros.
            if busy_wait.shape[0] == 0:
                busy_wait = np.zeros((n, g))
            for i in range(lo, hi):
                for r in range(g):
                    busy_wait[i, r] = gap
            _quantile_waits(
                busy_wait, stall, start, fetch, arrival, busy, lo, hi, prefetch * workers,
                np.sort(busy_values[:n_busy]), np.sort(idle_values[:n_idle]),
            )  # fmt: skip
    busy_rem = np.zeros((0, g))
    if workers > 0 and np.any(busy_slope > 0.0):  # the measured time left, where it is read
        busy_rem = np.zeros((n, g))
        busy_time_left(segments, start, fetch, arrival, stall, worker, busy, busy_rem)
    return (
        lat_sent, lat_free, hand, deliver, after, loop, busy, busy_excess, idle_hand, busy_wait,
        busy_slope, busy_icept, busy_rem,
    )  # fmt: skip


@njit(cache=_CACHE)
def busy_time_left(
    segments, start, fetch, arrival, stall, worker, busy, out
):  # pragma: no cover - compiled
    """Into ``out`` [N, G], where the batch's worker was busy when the loop asked for it
    (``busy`` > 0), the time that worker still needed for the batch it was building: its
    next batch's fetch end less the request. Other cells are left as they are."""
    longest = 0
    for s in range(segments.shape[0]):
        longest = max(longest, segments[s, 1] - segments[s, 0])
    nxt = np.empty((longest, start.shape[1]), dtype=np.int64)
    seen = np.empty(max(int(worker.max()) + 1, 1) if worker.size else 1, dtype=np.int64)
    for s in range(segments.shape[0]):
        lo, hi = segments[s, 0], segments[s, 1]
        _next_of_worker(worker, lo, hi, nxt, seen)
        for r in range(start.shape[1]):
            for i in range(lo, hi):
                if busy[i, r] > 0.0:
                    j = nxt[i - lo, r]
                    out[i, r] = start[j, r] + fetch[j, r] - (arrival[i, r] - stall[i, r])


@njit(cache=_CACHE)
def _quantile_waits(
    wait, stall, start, fetch, arrival, busy, lo, hi, window, busy_sorted, idle_sorted
):  # pragma: no cover - compiled
    """Each idle ready batch's busy counterpart: the busy hand-over at its own quantile.

    The quantile of a stall among the idle ones is its mid-rank ((less + equal / 2) / n);
    the busy hand-over at quantile p interpolates the sorted busy ones linearly at position
    p·m − 0.5 (clamped to the first and last). Bounded by the busy ones measured, unlike a
    deviation widened by the two spreads' ratio (validation/README.md, "The busy worker's
    spread": 38-42 on 16 cores).
    """
    n_idle = idle_sorted.shape[0]
    m = busy_sorted.shape[0]
    for r in range(stall.shape[1]):
        for i in range(lo, hi):
            req = arrival[i, r] - stall[i, r]
            if i - lo < max(window, 1) or not start[i, r] + fetch[i, r] < req or busy[i, r] > 0:
                continue
            less = np.searchsorted(idle_sorted, stall[i, r], side="left")
            upto = np.searchsorted(idle_sorted, stall[i, r], side="right")
            p = (less + (upto - less) / 2.0) / n_idle
            t = min(max(p * m - 0.5, 0.0), m - 1.0)
            k = int(np.floor(t))
            q = busy_sorted[k]
            if k + 1 < m:
                q += (t - k) * (busy_sorted[k + 1] - busy_sorted[k])
            wait[i, r] = q - stall[i, r]


def calibrate(
    inputs: PipelineInputs,
    workers: int,
    prefetch: int,
    keep_worker_ids: bool = False,
    busy_min_samples: int = BUSY_MIN_SAMPLES,
    busy_min_se: float = BUSY_MIN_SE,
    busy_min_r2: float = BUSY_MIN_R2,
    busy_min_line_samples: int = BUSY_MIN_LINE_SAMPLES,
) -> Calibration:
    """Residuals of the measured run under loader settings (``workers``, ``prefetch``).

    ``busy_min_samples``: ready batches of each kind (worker busy, idle) a segment needs
    for its busy worker's extra hand-over to be measured; ``busy_min_se``: the standard
    errors it must stand out by (the tests lower both, so that random traces carry it);
    ``busy_min_r2``: the share of the busy ones' stall variance the time left on the batch
    being built must explain for the hand-over to be replayed as waiting for it;
    ``busy_min_line_samples``: the busy ready batches that suffice where it does.
    """
    parts = _calibrate(
        inputs.segments,
        inputs.start,
        inputs.fetch,
        inputs.arrival,
        inputs.stall,
        inputs.iteration_time,
        inputs.worker,
        workers,
        prefetch,
        busy_min_samples,
        busy_min_se,
        busy_min_r2,
        busy_min_line_samples,
    )
    *terms, busy, busy_excess, idle_hand, busy_wait, slope, icept, rem = parts
    return Calibration(
        workers, prefetch, *terms, keep_worker_ids=keep_worker_ids, busy=busy,
        busy_excess=busy_excess, idle_hand=idle_hand, busy_wait=busy_wait,
        idle_measured=idle_hand.copy(), busy_slope=slope, busy_icept=icept, busy_rem=rem,
    )  # fmt: skip


@njit(cache=_CACHE)
def _replay(  # pragma: no cover - compiled
    segments, iteration, start, fetch, arrival, stall, worker,
    lat_sent, lat_free, hand, deliver, after, loop, busy, busy_excess, idle_hand, use_busy,
    busy_wait, idle_measured, work_ratio, busy_slope, busy_icept, busy_rem,
    fetch_mode, start_mode, same_loader, new_w, new_p, want_starts, want_gpus, want_stalls,
):  # fmt: skip
    n, g = start.shape
    iteration_s = np.empty(n)
    stall_s = np.empty(n)
    delay_s = np.empty(n)
    fetch_diff = np.empty(n)
    start_diff = np.empty(n)
    gpu_stall = np.empty((n if want_gpus and want_stalls else 0, g))  # per-GPU: only when read
    end2 = np.empty((n if want_gpus else 0, g))
    # Only this row's requests and the segment's first row's are read, and the arrivals of
    # the last P·W rows (a batch's index goes out with the arrival P·W batches before it):
    # [G] vectors and a ring of P·W + 1 rows, not [N, G] matrices (16 bytes per
    # GPU-iteration less on every replay).
    req = np.empty(g)
    req_first = np.empty(g)
    arr = np.empty(g)
    ring = max(new_p * new_w, 0) + 1
    arr_ring = np.empty((ring, g))  # the arrival of row lo + x at x % ring
    start2 = np.empty((n if want_starts else 0, g))  # only the causality tests read them
    end_prev = np.empty(g)
    natural = np.empty(g)
    f_new = np.empty(g)
    nslots = new_w
    if same_loader:
        nslots = max(int(worker.max()) + 1, 1) if n else 1
    nslots = max(nslots, 1)
    last_end = np.empty((g, nslots))
    aligned = np.empty(n if fetch_mode != ACTUAL else 0)  # each batch's aggregate over ranks
    for i in range(aligned.shape[0]):
        agg = fetch[i, 0]
        if fetch_mode == MIN:
            for r in range(1, g):
                agg = min(agg, fetch[i, r])
        else:
            for r in range(1, g):
                agg = agg + fetch[i, r]
            agg = agg / g
        aligned[i] = agg
    longest = 0
    for s in range(segments.shape[0]):
        longest = max(longest, segments[s, 1] - segments[s, 0])
    after_same = np.empty((longest if use_busy and same_loader else 0, g), dtype=np.int64)
    seen = np.empty(nslots, dtype=np.int64)
    for s in range(segments.shape[0]):
        lo, hi = segments[s, 0], segments[s, 1]
        last_end[:, :] = -np.inf
        if use_busy and same_loader:
            _next_of_worker(worker, lo, hi, after_same, seen)
        for k in range(hi - lo):
            i = lo + k
            # Fetch durations of this batch under the fetch-align policy.
            for r in range(g):
                f_new[r] = fetch[i, r] if fetch_mode == ACTUAL else aligned[i]
            # When each rank could start it: its index sent and its worker free, plus latencies.
            for r in range(g):
                if k == 0:
                    req[r] = arrival[lo, r] - stall[lo, r]
                    req_first[r] = req[r]
                else:
                    req[r] = end_prev[r] + loop[i, r]
                if new_w == 0:
                    sent = req[r]
                elif k < new_p * new_w:
                    sent = req_first[r]
                else:
                    sent = arr_ring[(k - new_p * new_w) % ring, r]
                free = -np.inf
                if new_w > 0:
                    slot = worker[i, r] if same_loader else iteration[i] % new_w
                    free = last_end[r, slot]
                natural[r] = max(sent + lat_sent[i, r], free + lat_free[i, r])
            # Start-align only ever delays a fetch: never before its rank's causal start (its
            # index sent, its worker free), so min gives the causal start back (SPEC §4.2).
            lo_s = natural[0]
            hi_s = natural[0]
            for r in range(1, g):
                lo_s = min(lo_s, natural[r])
                hi_s = max(hi_s, natural[r])
            if start_mode == AVG:
                mid = hi_s - (hi_s - lo_s) / 2
                for r in range(g):
                    natural[r] = max(natural[r], mid)
            elif start_mode == MAX:
                for r in range(g):
                    natural[r] = hi_s
            if want_starts:
                for r in range(g):
                    start2[i, r] = natural[r]
            last = -np.inf
            for r in range(g):
                done = natural[r] + f_new[r]
                if new_w > 0:
                    slot = worker[i, r] if same_loader else iteration[i] % new_w
                    last_end[r, slot] = done
                h = hand[i, r]
                if use_busy and new_w > 0 and busy_excess[i] != 0.0:
                    # Is the worker building its next batch when the loop asks (SPEC §4.2)?
                    j = after_same[k, r] if same_loader else i + new_w
                    now = 0.0
                    left = 0.0  # the time the worker still needs for batch j
                    if 0 <= j < hi:
                        if j - lo < new_p * new_w:
                            sent_j = req_first[r]
                        elif j - new_p * new_w < i:
                            sent_j = arr_ring[(j - lo - new_p * new_w) % ring, r]
                        else:  # its index goes out with this very hand-over: idle until then
                            sent_j = np.inf
                        s_j = max(sent_j + lat_sent[j, r], done + lat_free[j, r])
                        f_j = fetch[j, r] if fetch_mode == ACTUAL else aligned[j]
                        if s_j <= req[r] < s_j + f_j:
                            now = 1.0
                            left = s_j + f_j - req[r]
                    x = work_ratio[j, r] if work_ratio.shape[0] > 0 and now > 0.0 else 1.0
                    beta = busy_slope[s] if busy_slope.shape[0] > 0 else 0.0
                    if beta > 0.0 and now > 0.0 and busy[i, r] > 0.0:
                        # Busy in both: the wait follows the time left on the batch being built.
                        h = max(h + beta * (left - busy_rem[i, r]), 0.0)
                    elif beta > 0.0 and now > busy[i, r]:
                        # Busy where it was idle: the segment's line of stall on time left.
                        h = max(h, busy_icept[s] + beta * left)
                    elif now > busy[i, r]:
                        # Busy where it was idle: a busy worker's hand-over (its counterpart
                        # at the same quantile), its wait in proportion to the work of the
                        # batch the worker is building.
                        h = max(h + busy_wait[i, r] * x * (now - busy[i, r]), 0.0)
                    elif now < busy[i, r]:  # idle where it was busy: an idle worker's hand-over
                        h = h + (idle_hand[i] - h) * (busy[i, r] - now)
                    elif now > 0.0:  # busy in both: its wait moves with the next batch's work
                        h = max(h + (h - idle_measured[i]) * (x - 1.0), 0.0)
                a = max(req[r] + h, done + deliver[i, r])
                arr[r] = a
                arr_ring[k % ring, r] = a
                last = max(last, a)
            t_max = -np.inf
            st_max = -np.inf
            st_min = np.inf
            for r in range(g):
                e = last + after[i, r]
                end_prev[r] = e
                st = arr[r] - req[r]
                if want_gpus:
                    end2[i, r] = e
                    if want_stalls:
                        gpu_stall[i, r] = st
                t_max = max(t_max, e - req[r])
                st_max = max(st_max, st)
                st_min = min(st_min, st)
            iteration_s[i] = t_max
            stall_s[i] = st_max
            delay_s[i] = st_max - st_min
            f_lo = f_new[0]
            f_hi = f_new[0]
            for r in range(1, g):
                f_lo = min(f_lo, f_new[r])
                f_hi = max(f_hi, f_new[r])
            fetch_diff[i] = f_hi - f_lo
            lo_s = natural[0]
            hi_s = natural[0]
            for r in range(1, g):
                lo_s = min(lo_s, natural[r])
                hi_s = max(hi_s, natural[r])
            start_diff[i] = hi_s - lo_s
    return iteration_s, stall_s, delay_s, fetch_diff, start_diff, gpu_stall, end2, start2


def replay_pipeline(
    inputs: PipelineInputs,
    calibration: Calibration,
    policy: tuple[str, str],
    workers: int | None = None,
    prefetch: int | None = None,
    starts: bool = True,
    per_gpu: bool = True,
    stalls: bool = True,
) -> dict[str, np.ndarray]:
    """Replay a calibrated run under ``policy`` and loader settings (default: as measured).

    Besides the metrics, ``gpu_start_s`` holds every replayed fetch start [N, G]: the
    causality tests check them against the worker's previous batch. ``starts=False``
    (the model's own replays) leaves it out: writing it costs the hot loop ~15 %.
    ``per_gpu=False`` leaves out ``gpu_stall_s`` and ``gpu_end_s`` too (empty [0, G]), for
    callers that read the per-iteration metrics only (``dsim run``'s headline): 16 bytes per
    GPU-iteration less at its peak. ``stalls=False`` leaves out ``gpu_stall_s`` alone
    (``pipeline.trainer_stretches`` reads the ends and starts).
    """
    if policy[0] == "max":  # the kernel would take it for another fetch aggregate
        raise ValueError("max aligns starts only: it cannot stand on the fetch side")
    new_w = calibration.workers if workers is None else int(workers)
    new_p = calibration.prefetch if prefetch is None else int(prefetch)
    same = new_w == calibration.workers and (
        new_p == calibration.prefetch or calibration.keep_worker_ids
    )  # ``same``: the measured worker ids are kept (and only they decide it in ``_replay``)
    g = inputs.fetch.shape[1]
    busy, excess, idle = calibration.busy, calibration.busy_excess, calibration.idle_hand
    wait, measured = calibration.busy_wait, calibration.idle_measured
    use_busy = busy is not None and excess is not None and idle is not None
    use_busy = use_busy and bool(np.any(excess != 0.0))
    if not use_busy:
        busy, excess, idle = np.zeros((0, g)), np.zeros(0), np.zeros(0)
    if not use_busy or wait is None or measured is None or len(wait) != len(excess):
        # a calibration built by hand, or given an extra its calibration did not find
        wait = np.repeat(excess[:, None], g, axis=1) if use_busy else np.zeros((0, g))
        measured = idle
    ratio = inputs.work_ratio  # [0, G]: every ratio 1 (no [N, G] array of ones allocated)
    if not use_busy or ratio is None:
        ratio = np.zeros((0, g))
    slope, icept, rem = calibration.busy_slope, calibration.busy_icept, calibration.busy_rem
    if not use_busy or slope is None or icept is None or rem is None or not len(rem):
        slope, icept, rem = np.zeros(0), np.zeros(0), np.zeros((0, g))
    out = _replay(
        inputs.segments, inputs.iteration, inputs.start, inputs.fetch, inputs.arrival,
        inputs.stall, inputs.worker,
        calibration.lat_sent, calibration.lat_free, calibration.hand, calibration.deliver,
        calibration.after, calibration.loop, busy, excess, idle, use_busy, wait, measured, ratio,
        slope, icept, rem,
        _CODES[policy[0]], _CODES[policy[1]], same, new_w, new_p, starts, per_gpu, stalls,
    )  # fmt: skip
    names = (
        *("iteration_s", "stall_s", "delay_s", "fetch_diff_s", "start_diff_s"),
        *("gpu_stall_s", "gpu_end_s", "gpu_start_s"),
    )
    result = dict(zip(names, out, strict=True))
    if not starts:
        del result["gpu_start_s"]
    return result
