"""The queueing model of DDP data loading: pure NumPy, no I/O.

Per epoch (one fresh DataLoader iterator per epoch, as in PyTorch without
persistent workers), for every rank r and batch i:

- batch i goes to worker ``i mod W``; the loader hands a worker index i only
  once batch ``i - W·P`` has been consumed by training (the prefetch window of
  P batches per worker); a worker builds its batches one after the other:
  ``fetch_start[i] = max(fetch_end[i - W], train_start[i - W·P])``;
- fetch durations are lognormal (mean, coefficient of variation), slower on
  higher ranks by ``1 + skew · r / (G - 1)``, and with probability
  ``straggler_prob`` multiplied by ``straggler_factor``;
- training of iteration i starts when its batch is ready and iteration i-1
  has finished: ``train_start[i] = max(fetch_end[i], end[i - 1])``; the wait
  is the stall (``Data``);
- compute takes ``compute`` seconds, then a synchronising all-reduce makes
  every rank finish at ``end[i] = max_r train_start[i] + compute + allreduce``;
  ``Time`` is ``end[i] - end[i - 1]``, the same on every rank.

Both recurrences are max-plus linear, which lets a whole prefetch window of
W·P iterations be solved at once with cumulative sums and maxima; only the
windows are a Python loop. The timeline is yielded in chunks so that memory
stays bounded whatever the run's length; the chunking never changes a value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from dsim.synth.params import US_PER_S, SynthParams, to_us

# Lines per chunk: large enough that NumPy's per-call overhead vanishes, small
# enough that a chunk's byte matrices stay a few tens of MB.
CHUNK_LINES = 65_536


@dataclass(frozen=True)
class Chunk:
    """Consecutive iterations of one epoch as the model computed them (times in µs since 1970).

    Arrays are [L] per iteration or [L, G] per iteration and rank.
    """

    epoch: int
    iteration: np.ndarray  # [L] batch index within the epoch
    fetch_us: np.ndarray  # [L, G] fetch duration (END FETCH at_time)
    fetch_end_us: np.ndarray  # [L, G] fetch end (fetch line timestamp)
    train_start_us: np.ndarray  # [L, G] batch arrival (training line timestamp)
    stall_us: np.ndarray  # [L, G] Data
    time_us: np.ndarray  # [L] Time (equal on every rank)


def _fetch_scale(params: SynthParams) -> np.ndarray:
    """Mean fetch time per rank in µs: rank skew grows linearly from rank 0 to the last rank."""
    ranks = np.arange(params.gpus, dtype=np.float64)
    slope = params.skew / (params.gpus - 1) if params.gpus > 1 else 0.0
    return params.fetch_mean_s * US_PER_S * (1.0 + slope * ranks)


def _draw_fetch(
    params: SynthParams,
    scale: np.ndarray,
    normal: np.random.Generator,
    uniform: np.random.Generator,
) -> Callable[[int], np.ndarray]:
    """Return ``draw(L) -> [L, G] µs``; each stream is consumed row by row, so chunking is moot."""
    sigma = math.sqrt(math.log1p(params.fetch_cv**2))
    mu = -0.5 * sigma * sigma  # keeps the mean at ``scale``
    gpus = params.gpus

    def draw(rows: int) -> np.ndarray:
        if sigma == 0.0:
            factor = np.ones((rows, gpus))
        else:
            factor = np.exp(mu + sigma * normal.standard_normal((rows, gpus)))
        if params.straggler_prob > 0.0:
            slow = uniform.random((rows, gpus)) < params.straggler_prob
            factor = np.where(slow, factor * params.straggler_factor, factor)
        return np.rint(factor * scale).astype(np.int64)

    return draw


def simulate(params: SynthParams, chunk_iterations: int | None = None) -> Iterator[Chunk]:
    """Yield the model's timeline chunk by chunk, epoch after epoch (pure; no I/O).

    ``chunk_iterations`` only changes how the work is cut, never the values.
    """
    params.validate()
    g, n, w, p = params.gpus, params.iterations, params.workers, params.prefetch
    window = w * p
    if chunk_iterations is None:
        chunk_iterations = max(1, CHUNK_LINES // (2 * g))
    # A chunk is a whole number of prefetch windows, so a window never straddles two chunks.
    chunk = window * max(1, -(-chunk_iterations // window))
    step_us = round(params.compute_s * US_PER_S) + round(params.allreduce_s * US_PER_S)
    normal_seed, uniform_seed = np.random.SeedSequence(params.seed).spawn(2)
    draw = _draw_fetch(
        params,
        _fetch_scale(params),
        np.random.Generator(np.random.PCG64(normal_seed)),
        np.random.Generator(np.random.PCG64(uniform_seed)),
    )
    t0 = to_us(params.start)
    k = np.arange(window, dtype=np.int64)
    k_step, k1_step = k * step_us, (k + 1) * step_us
    for epoch in range(params.epochs):
        # State carried between windows: each worker's last fetch end, the previous
        # window's training starts (they release the next window's indices), last end.
        worker_free = np.full((w, g), t0, dtype=np.int64)
        released = np.full((p, w, g), t0, dtype=np.int64)
        end_prev = t0
        for c0 in range(0, n, chunk):
            rows = min(n, c0 + chunk) - c0
            windows = -(-rows // window)
            # Padded to whole windows; the padding (zero fetches) is computed and cut off.
            fetch = np.zeros((windows * window, g), dtype=np.int64)
            fetch[:rows] = draw(rows)
            f4 = fetch.reshape(windows, p, w, g)
            cum = np.add.accumulate(f4, axis=1)  # per worker, within each window
            cum_before = cum - f4
            fetch_end = np.empty((windows, p, w, g), dtype=np.int64)
            train_start = np.empty((windows, window, g), dtype=np.int64)
            ends = np.empty(windows * window + 1, dtype=np.int64)  # ends[j] = end of row j - 1
            ends[0] = end_prev
            for b in range(windows):
                # Per worker: fe_j = max(fe_{j-1}, released_j) + F_j, solved by cumulative ops.
                lead = np.maximum.accumulate(released - cum_before[b], axis=0)
                fe = fetch_end[b]
                np.add(cum[b], np.maximum(lead, worker_free, out=lead), out=fe)
                # end_i = max(max_r fe_i, end_{i-1}) + step, solved the same way.
                e = ends[b * window + 1 : (b + 1) * window + 1]
                np.maximum.accumulate(fe.reshape(window, g).max(axis=1) - k_step, out=e)
                np.maximum(e, ends[b * window], out=e)
                e += k1_step
                ts = train_start[b]
                np.maximum(fe.reshape(window, g), ends[b * window : (b + 1) * window, None], out=ts)
                worker_free = fe[-1]
                released = ts.reshape(p, w, g)
            end_before = ends[:rows]
            train = train_start.reshape(-1, g)[:rows]
            end_prev = int(ends[rows])
            yield Chunk(
                epoch=epoch,
                iteration=np.arange(c0, c0 + rows, dtype=np.int64),
                fetch_us=fetch[:rows],
                fetch_end_us=fetch_end.reshape(-1, g)[:rows],
                train_start_us=train,
                stall_us=train - end_before[:, None],
                time_us=ends[1 : rows + 1] - end_before,
            )
        t0 = end_prev  # the next epoch's loader starts when this epoch's last step ends
