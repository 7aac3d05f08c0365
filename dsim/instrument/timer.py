"""Time a training loop: one training line per iteration and rank.

Conventions of the PyTorch ImageNet example, which the original logs used:
an iteration starts when the previous one ended (the first one when the
epoch's iterator is requested, so worker start-up counts as waiting), Data is
the time until the batch arrived, Time runs until the step ended, including
the wait, and the line's timestamp is the batch's arrival. Consecutive Times
therefore add up to the epoch's wall time. Means in parentheses are per epoch.
CPU is the training process's CPU time over the iteration (all its threads;
with ``num_workers=0`` that includes building the batch), Runq its main
thread's wait for a core (Linux only).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from dsim.errors import UsageError
from dsim.instrument.cpu import process_cpu, thread_wait
from dsim.instrument.lines import LineSink, make_sink, resolve_rank, training_line
from dsim.instrument.sinks import flush_held

T = TypeVar("T")

#: Sent into ``TrainingTimer.iterate``'s generator (``gen.send(LAST)``): log the iteration
#: running now, ending now, and ask the loader for nothing more. For framework loops that
#: stop without asking for another batch (an epoch's known last batch, ``max_steps``).
LAST = object()


class _Mean:
    __slots__ = ("count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0

    def add(self, value: float) -> tuple[float, float]:
        self.count += 1
        self.total += value
        return value, self.total / self.count


class TrainingTimer:
    """Wraps the iteration over a loader; see ``iterate``.

    ``sync`` (e.g. ``torch.cuda.synchronize``) is called before the end of
    each iteration is taken, so that asynchronous GPU work is counted in the
    iteration that launched it. ``batch_size`` defaults to the loader's; the
    Throughput column is left out when it is unknown. ``sink`` (instead of
    ``log_dir``/``logger``) is a sink already made: an instrumented loader's,
    so that training lines go where its fetch lines go.
    """

    def __init__(
        self,
        log_dir: str | Path | None = None,
        rank: int | None = None,
        batch_size: int | None = None,
        *,
        logger: logging.Logger | str | None = None,
        sync: Callable[[], Any] | None = None,
        sink: LineSink | None = None,
    ):
        self.rank = resolve_rank(rank)
        self.batch_size = batch_size
        self.sync = sync
        if sink is not None and (log_dir is not None or logger is not None):
            raise UsageError("give sink= or log_dir=/logger=, not both")
        self.sink = sink if sink is not None else make_sink(log_dir, self.rank, logger)

    def iterate(
        self, loader: Iterable[T], epoch: int, total: int | None = None, *, start: int = 0
    ) -> Iterator[T]:
        """Yield ``loader``'s batches; log each iteration when the loop asks for the next batch.

        ``total`` (iterations in the epoch) defaults to ``len(loader)``.
        ``start`` numbers the first iteration: for a loader that resumes an
        epoch past the batches a checkpoint had trained (accelerate's
        ``skip_first_batches``), whose iterations keep their positions in the
        epoch; ``total`` stays the whole epoch's count. An
        iteration the loop leaves with ``break`` or an exception is not
        logged: its end is unknown, and a wrong record is worse than none.
        Sending ``LAST`` (``gen.send(LAST)``) logs the running iteration as
        ending then and stops the generator without asking ``loader`` for
        another batch: for a framework that knows where its loop stops.
        """
        if total is None:
            try:
                total = len(loader)  # type: ignore[arg-type]
            except TypeError:
                raise UsageError("the loader has no len(); pass total= to iterate()") from None
        batch_size = self.batch_size or getattr(loader, "batch_size", None)
        times, waits, rates = _Mean(), _Mean(), _Mean()
        cpus, runqs = _Mean(), _Mean()
        clock, sync, put, rank = time.perf_counter, self.sync, self.sink.put, self.rank
        # Per iteration: one read of the process's CPU clock and one of the main thread's
        # run-queue wait (its CPU clock is not needed here: a system call saved per batch).
        process_clock, wait = process_cpu, thread_wait

        try:
            begin = clock()
            cpu_begin = process_clock()
            runq_begin = wait()
            batches = iter(loader)
            for iteration in itertools.count(start):
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                arrived = clock()
                arrived_wall = time.time()
                signal = yield batch
                if sync is not None:
                    sync()
                end = clock()
                cpu_end = process_clock()
                runq_end = wait()
                runq = None if runq_end is None or runq_begin is None else runq_end - runq_begin
                elapsed = end - begin
                rate = rates.add(batch_size / elapsed) if batch_size and elapsed > 0 else None
                put(  # formatted later, in a block (dsim.instrument.sinks)
                    training_line,
                    arrived_wall,
                    rank,
                    epoch,
                    iteration,
                    total,
                    times.add(elapsed),
                    waits.add(arrived - begin),
                    rate,
                    cpus.add(cpu_end - cpu_begin),
                    None if runq is None else runqs.add(runq),
                )
                if signal is LAST:
                    return
                begin, cpu_begin, runq_begin = end, cpu_end, runq_end
        finally:  # the loop ended, broke or raised: write what the process's sinks hold
            flush_held()
