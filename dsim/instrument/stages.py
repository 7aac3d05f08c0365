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

The stages share the fetch's own clock readings at its start and end, so
they add up to the fetch exactly (wall: ``read + collate = at_time``; CPU:
``read_cpu + collate_cpu = cpu``), and cost one more reading of each clock
per batch, between the two calls (``bench/bench_instrument.py --stages``).
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

    @classmethod
    def between(
        cls, start: float, cpu_start: float, mid: tuple[float, float], end: float, cpu_end: float
    ) -> Stages:
        """The stages of a fetch timed from (``start``, ``cpu_start``) to (``end``,
        ``cpu_end``) whose reads ended at ``mid`` (wall, CPU; ``read_then_collate``)."""
        return cls(mid[0] - start, mid[1] - cpu_start, end - mid[0], cpu_end - mid[1])


def read_then_collate(
    read: Callable[[], Any], collate: Callable[[Any], Any]
) -> tuple[Any, tuple[float, float]]:
    """``collate(read())``, and when the reads ended on the wall and this thread's CPU clock."""
    samples = read()
    mid = (time.perf_counter(), time.thread_time())
    return collate(samples), mid
