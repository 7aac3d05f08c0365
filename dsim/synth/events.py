"""The model's chunks as line columns, released in exact time order.

A line's fields come from several places (the chunk, the parameters, the
running means the training loop prints), and the two kinds of lines
interleave in time across chunk borders. This module turns each chunk into
flat columns, one per printed field, and holds back only the events that a
later chunk could still precede, so that the writer can stream.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from dsim.synth.model import Chunk, simulate
from dsim.synth.params import US_PER_S, SynthParams

Events = dict[str, np.ndarray]
"""Equal-length columns, one per printed field (``time``, ``rank``, ...), one row per line."""


def take(ev: Events, rows: np.ndarray) -> Events:
    return {key: value[rows] for key, value in ev.items()}


def _concat(a: Events | None, b: Events) -> Events:
    if a is None:
        return b
    return {key: np.concatenate([a[key], b[key]]) for key in b}


class _Averages:
    """Running means per epoch, as the training loop's AverageMeter prints them in parentheses."""

    def __init__(self, gpus: int):
        self.gpus = gpus
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.step = 0
        self.throughput = 0
        self.stall = np.zeros(self.gpus, dtype=np.int64)

    def update(self, chunk: Chunk, throughput: np.ndarray) -> tuple[np.ndarray, ...]:
        count = self.count + np.arange(1, chunk.time_us.shape[0] + 1, dtype=np.int64)
        step = self.step + np.cumsum(chunk.time_us)
        thr = self.throughput + np.cumsum(throughput)
        stall = self.stall + np.cumsum(chunk.stall_us, axis=0)
        self.count, self.step, self.throughput = int(count[-1]), int(step[-1]), int(thr[-1])
        self.stall = stall[-1].copy()

        def mean(total: np.ndarray, n: np.ndarray) -> np.ndarray:
            return (2 * total + n) // (2 * n)  # round half up, in integers

        return mean(step, count), mean(thr, count), mean(stall, count[:, None])


def _chunk_events(chunk: Chunk, params: SynthParams, averages: _Averages) -> tuple[Events, Events]:
    """A chunk's fetch and training lines as flat columns (row-major over [iteration, rank])."""
    length, g = chunk.fetch_us.shape
    iteration = np.repeat(chunk.iteration, g)
    rank = np.tile(np.arange(g, dtype=np.int64), length)
    # Throughput in thousandths of samples/s, rounded half up.
    throughput = (2_000 * params.batch_size * US_PER_S // chunk.time_us + 1) // 2
    step_avg, thr_avg, stall_avg = averages.update(chunk, throughput)
    fetch = {
        "time": chunk.fetch_end_us.ravel(),
        "rank": rank,
        "iteration": iteration,
        "worker": iteration % params.workers,
        "fetch": chunk.fetch_us.ravel(),
    }
    train = {
        "time": chunk.train_start_us.ravel(),
        "rank": rank,
        "iteration": iteration,
        "epoch": np.full(length * g, chunk.epoch, dtype=np.int64),
        "step": np.repeat(chunk.time_us, g),
        "step_avg": np.repeat(step_avg, g),
        "stall": chunk.stall_us.ravel(),
        "stall_avg": stall_avg.ravel(),
        "throughput": np.repeat(throughput, g),
        "throughput_avg": np.repeat(thr_avg, g),
    }
    return fetch, train


def released_iterations(train: Events, params: SynthParams) -> int:
    """Iterations whose training lines a batch of events completes (for progress)."""
    return int(train["time"].shape[0] // params.gpus)


def ordered_events(
    params: SynthParams, chunk_iterations: int | None = None
) -> Iterator[tuple[Events, Events]]:
    """Yield batches of events such that concatenating them gives exact time order.

    After a chunk ending at iteration b, no later event can be earlier than the
    training start of iteration b - W·P on any rank: every later fetch starts
    only after that batch was consumed, and training is monotone. Events before
    that watermark are final; the rest wait for the next chunk. An epoch's
    last event precedes the next epoch's first, so epochs flush completely.
    """
    window = params.workers * params.prefetch
    averages = _Averages(params.gpus)
    pending_fetch: Events | None = None
    pending_train: Events | None = None
    last_epoch = 0
    for chunk in simulate(params, chunk_iterations):
        if chunk.epoch != last_epoch:
            averages.reset()
            last_epoch = chunk.epoch
        fetch, train = _chunk_events(chunk, params, averages)
        fetch = _concat(pending_fetch, fetch)
        train = _concat(pending_train, train)
        end = int(chunk.iteration[-1]) + 1
        if end == params.iterations:
            pending_fetch = pending_train = None
            yield fetch, train
            continue
        mark_row = end - window - int(chunk.iteration[0])
        watermark = int(chunk.train_start_us[mark_row].min()) if mark_row >= 0 else -1
        f_now = fetch["time"] < watermark
        t_now = train["time"] < watermark
        pending_fetch, pending_train = take(fetch, ~f_now), take(train, ~t_now)
        if f_now.any() or t_now.any():
            yield take(fetch, f_now), take(train, t_now)
