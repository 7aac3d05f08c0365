"""A fetch split into its stages: the dataset's sample reads and the collation (SPEC §1.2).

Why: one fetch duration says *that* a loader is slow, not *what* in it to
fix. A worker's fetch is two calls of user code one after the other: the
dataset's ``__getitems__`` (or one ``__getitem__`` per index), where reading,
decoding and augmenting happen, then the ``collate_fn``. Timing each with the
wall clock and the thread's CPU clock (``time.thread_time``, as for the whole
fetch, ``dsim.instrument.cpu``) says which stage takes the time and whether
it computes (CPU ≈ wall) or waits (for I/O, a lock, a core).

The pinned-memory copy is not a stage here: torch makes it in the main
process's pin thread, after the worker wrote the batch's fetch line, and
only where its accelerator check (made in the main process when the
iterator is built) passes; the worker cannot know the copy's time, nor
whether there is one.

Costs four clock reads per batch beside the four the fetch already takes,
and a longer line (``bench/bench_instrument.py --stages``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple


class Stages(NamedTuple):
    """Seconds of one batch's stages: wall and thread CPU time of the reads and the collation."""

    read: float
    read_cpu: float
    collate: float
    collate_cpu: float


def timed_build(read: Callable[[], Any], collate: Callable[[Any], Any]) -> tuple[Any, Stages]:
    """``collate(read())`` and how long each call took (wall, and this thread's CPU).

    The clocks are read between the two calls only once each, so the stages
    add up to the span they cover without a gap between them.
    """
    clock, cpu = time.perf_counter, time.thread_time
    t0, c0 = clock(), cpu()
    samples = read()
    t1, c1 = clock(), cpu()
    batch = collate(samples)
    t2, c2 = clock(), cpu()
    return batch, Stages(t1 - t0, c1 - c0, t2 - t1, c2 - c1)
