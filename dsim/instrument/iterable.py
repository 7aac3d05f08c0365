"""Time every batch a DataLoader builds from an IterableDataset (docs/SPEC.md §1.2).

Why a path of its own: a map-style loader's sampler hands each batch's
indices to a worker, and ``dsim.instrument.loader`` tags them with the
batch's position in the epoch. An ``IterableDataset`` has no sampler: every
worker runs its own iterator over its shard of the stream (WebDataset,
Hugging Face streaming datasets, torchdata) and the DataLoader takes the
workers' batches in turn. What stands in for the sampler index here:

* in the worker, the dataset wrapper notes when the batch's first sample is
  asked for (the first batch of an epoch includes opening the stream), and the
  wrapped ``collate_fn`` when collation ended, with the thread's CPU time and
  run-queue wait over the same span, and the batch's position in that
  worker's stream (``stream K``, 0-based per epoch);
* in the main process, when the batch reaches the loop, its position among
  the batches the loop received this epoch becomes ``data idx``. Only there
  is it known: the DataLoader hands batches out round-robin across workers
  (worker ``k mod W`` builds the k-th), but a worker whose shard ends drops
  out of the cycle, after which the round-robin arithmetic no longer holds.
  The fetch line is written then, with the worker's end time as its
  timestamp (a line's place in the file does not matter, SPEC §1.2).

So ``data idx i`` is the batch iteration i consumes, as for map-style
loaders (also with ``in_order=False``). Batches built but never handed to
the loop (a ``break``, the end of a job) are not logged. The user's
dataset, ``collate_fn``, workers, pinning and prefetching are kept; the
batches are the ones the loader would yield without dsim.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from dsim.instrument.batchsize import on_first_batch
from dsim.instrument.cpu import process_cpu_since_last_batch, thread_times
from dsim.instrument.lines import LineSink, fetch_line, loader_line
from dsim.instrument.loader import _settings, _worker, loader_kwargs
from dsim.instrument.proxy import DatasetProxy
from dsim.instrument.sinks import flush_held


class _Built(NamedTuple):
    """A batch collated in a worker, with how it was built; unwrapped in the main process.

    A named tuple so that the pin-memory thread pins ``value`` and passes the rest.
    """

    value: Any
    wall_end: float
    seconds: float
    worker: int
    stream: int
    cpu: float
    runq: float | None
    proc: float | None  # the worker process's CPU since its previous batch (SPEC §1.2)


class _Clock:
    """One worker's pending batch: when its first sample was asked for, and the count so far."""

    __slots__ = ("count", "cpu", "runq", "start")

    def __init__(self) -> None:
        self.start: float | None = None
        self.cpu = 0.0
        self.runq: float | None = None
        self.count = 0

    def begin(self) -> None:
        if self.start is None:
            self.cpu, self.runq = thread_times()
            self.start = time.perf_counter()

    def finish(self, batch: Any) -> _Built:
        """The batch built since ``begin``; the next sample asked for starts the next batch."""
        start = self.start if self.start is not None else time.perf_counter()
        seconds = time.perf_counter() - start
        cpu, runq = thread_times()
        wall_end = time.time()
        waited = None if runq is None or self.runq is None else runq - self.runq
        worker = _worker()
        proc = None if worker is None else process_cpu_since_last_batch()
        built = _Built(
            batch, wall_end, seconds, 0 if worker is None else worker, self.count,
            cpu - self.cpu, waited, proc,
        )  # fmt: skip
        self.count += 1
        self.start = None
        return built


class TimedCollate:
    """The user's ``collate_fn``, ending the batch's clock (in the worker that built it)."""

    def __init__(self, collate_fn: Any, dataset: Any):
        self.collate_fn = collate_fn
        self.dataset = dataset  # pickled with the dataset to spawned workers: the same object

    def __call__(self, samples: Any) -> _Built:
        batch = self.collate_fn(samples)
        return self.dataset._dsim_clock.finish(batch)


_dataset_class: type | None = None


def timed_iterable_class() -> type:
    """Built on first use so that importing dsim never imports torch."""
    global _dataset_class
    if _dataset_class is None:
        from torch.utils.data import IterableDataset

        class TimedIterable(DatasetProxy, IterableDataset):
            """Wraps an IterableDataset: starts each batch's clock at its first sample.

            Attribute access falls through to the wrapped dataset (``.wrapped``),
            so that ``get_worker_info().dataset`` sharding code keeps working.
            """

            def __init__(self, dataset: Any):
                self._dsim_dataset = dataset
                self._dsim_clock = _Clock()

            def __reduce__(self):  # the class is built at run time: pickle through a function
                return _rebuild, (self._dsim_dataset, self._dsim_clock)

            def __iter__(self):
                clock = self._dsim_clock = _Clock()  # a new epoch in this worker
                clock.begin()  # opening the stream is part of the first batch
                samples = iter(self._dsim_dataset)
                while True:
                    clock.begin()
                    try:
                        sample = next(samples)
                    except StopIteration:
                        return
                    yield sample

        _dataset_class = TimedIterable
    return _dataset_class


def _rebuild(dataset: Any, clock: _Clock) -> Any:
    """A ``TimedIterable`` again, in a worker started with ``spawn`` (or ``forkserver``)."""
    timed = timed_iterable_class()(dataset)
    timed._dsim_clock = clock
    return timed


class _HandOut:
    """The loader's iterator, writing each batch's fetch line as the batch reaches the loop."""

    def __init__(self, inner: Any, sink: LineSink, rank: int):
        self._dsim_inner = inner
        self._dsim_sink = sink
        self._dsim_rank = rank
        self._dsim_position = 0

    def __iter__(self) -> _HandOut:
        return self

    def __next__(self) -> Any:
        try:
            data = next(self._dsim_inner)
        except StopIteration:  # the epoch's end: write the lines this process holds
            flush_held()
            raise
        if not isinstance(data, _Built):
            return data
        self._dsim_sink.put(
            fetch_line, data.wall_end, self._dsim_rank, data.worker, data.seconds,
            self._dsim_position, data.cpu, data.runq, None, data.stream, data.proc,
        )  # fmt: skip
        self._dsim_position += 1
        return data.value

    def __len__(self) -> int:
        return len(self._dsim_inner)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_dsim_"):
            raise AttributeError(name)
        return getattr(self._dsim_inner, name)


_loader_class: type | None = None


def _stream_loader_class() -> type:
    global _loader_class
    if _loader_class is None:
        from torch.utils.data import DataLoader

        class InstrumentedStreamLoader(DataLoader):
            """A DataLoader over a ``TimedIterable``: logs each batch as the loop receives it,
            and the loader's settings with every epoch's first batch (as map-style loaders)."""

            _dsim_sink: LineSink | None = None
            _dsim_rank = 0

            def __iter__(self):
                iterator = super().__iter__()
                sink, rank = self._dsim_sink, self._dsim_rank
                if sink is None:
                    return iterator
                settings = _settings(self)

                def log(nbytes: int | None) -> None:
                    sink.write(loader_line(time.time(), rank, {**settings, "batch_bytes": nbytes}))

                on_first_batch(iterator, log)
                return _HandOut(iterator, sink, rank)

        _loader_class = InstrumentedStreamLoader
    return _loader_class


def instrument_iterable(loader: Any, sink: LineSink, rank: int) -> Any:
    """A DataLoader that yields what ``loader`` (over an IterableDataset) yields, and logs it.

    Called by ``instrument_loader``, which checked the arguments. The loader's
    settings are copied (as ``instrument_loader`` copies a map-style loader's);
    the dataset and ``collate_fn`` are wrapped.
    """
    dataset = timed_iterable_class()(loader.dataset)
    kwargs = loader_kwargs(loader, TimedCollate(loader.collate_fn, dataset))
    kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    instrumented = _stream_loader_class()(dataset, **kwargs)
    instrumented._dsim_sink, instrumented._dsim_rank = sink, rank
    return instrumented
