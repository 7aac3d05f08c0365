"""Whole runs finished side by side on a few threads, with the serial loop's outcome.

Why threads pay: most of a run's ``finish_run`` is pyarrow's Parquet writer,
NumPy and pandas, which release the GIL, so two runs finished at once use
both cores of a small machine (issue #21 item 1). Why few: each thread holds
one run's replay tables (and its dataset rows) while it works, so the memory
of a sweep grows with the thread count (``thread_count`` caps it at
``MAX_THREADS``).

``map_in_order`` keeps what the serial loop promised:

* results in the items' order, whatever order the threads finish in;
* the error the serial loop would have raised: the first failing item's in
  that order (an earlier item still running is waited for, since it might
  fail first); items after a failed one are not started, and those already
  running are cancelled;
* an interrupt (Ctrl-C, SIGTERM: a ``KeyboardInterrupt`` in the main thread,
  which is the thread waiting here) stops every worker at its next
  checkpoint, where ``Cancelled`` unwinds it through its own ``finally``
  blocks (temporary files removed), and returns only once they all have.

Signals reach only the main thread, so a worker learns of a cancel through
the checkpoint its function calls at safe, frequent points (after each
replay chunk, between policies); the caller decides where those are.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from dsim import processes

T = TypeVar("T")

#: The most runs finished at once in-process: each holds one run's replays in memory.
MAX_THREADS = 4

#: Called by a worker at safe points; raises ``Cancelled`` once its item is cancelled.
Checkpoint = Callable[[], None]


class Cancelled(BaseException):
    """Raised at a worker's checkpoint once its item is cancelled. Not an ``Exception``,
    so that no ``except Exception`` on the way up swallows it (as ``KeyboardInterrupt``)."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def thread_count(items: int, num_cpus: int | None = None) -> int:
    """Threads for ``items`` runs: one per run, at most ``num_cpus`` (the configured CPUs,
    else the usable cores) and ``MAX_THREADS``; 1 means no pool at all."""
    cpus = num_cpus if num_cpus is not None else usable_cores()
    return max(1, min(items, cpus, MAX_THREADS))


def never_cancelled() -> None:
    """The checkpoint of work done in the calling thread: a signal interrupts it there."""


def map_in_order(function: Callable[[int, Checkpoint], T], count: int, threads: int) -> list[T]:
    """``[function(k, checkpoint) for k in range(count)]``, on ``threads`` threads.

    With one thread (or one item) it is that loop, in the calling thread, with no pool;
    otherwise see the module docstring for the order, errors and interrupts."""
    if threads <= 1 or count <= 1:
        return [function(k, never_cancelled) for k in range(count)]
    stops = [threading.Event() for _ in range(count)]

    def checkpoint_of(k: int) -> Checkpoint:
        def checkpoint() -> None:
            if stops[k].is_set():
                raise Cancelled

        return checkpoint

    # the items being worked on, counted here rather than by joining the pool's threads:
    # a signal that lands while ``submit`` starts a thread leaves that thread unknown to
    # the pool (``ThreadPoolExecutor`` registers it after ``Thread.start`` returns)
    running = [0]
    idle = threading.Condition()

    def work(k: int) -> T:
        with idle:
            running[0] += 1
        try:
            checkpoint = checkpoint_of(k)
            checkpoint()  # an item after a failed one is not started
            return function(k, checkpoint)
        finally:
            with idle:
                running[0] -= 1
                idle.notify_all()

    def on_done(k: int, future: Future[T]) -> None:
        if future.cancelled():  # never started (shut down with cancel_futures)
            return
        failure = future.exception()
        if failure is not None and not isinstance(failure, Cancelled):
            for stop in stops[k + 1 :]:  # the serial loop would not have reached them
                stop.set()

    pool = ThreadPoolExecutor(threads, thread_name_prefix="dsim-run")
    try:
        futures = []
        for k in range(count):
            future = pool.submit(work, k)
            future.add_done_callback(lambda done, k=k: on_done(k, done))
            futures.append(future)
        results = [future.result() for future in futures]
    except BaseException:
        for stop in stops:
            stop.set()
        # the workers unwind at their next checkpoint; a second signal meanwhile is noted,
        # not raised, so that this thread waits for their finally blocks to finish
        with processes.deferred_signals():
            pool.shutdown(wait=False, cancel_futures=True)
            with idle:
                idle.wait_for(lambda: running[0] == 0)
        raise
    pool.shutdown(wait=True)
    return results
