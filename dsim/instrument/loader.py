"""Time every batch a DataLoader builds, in the worker that builds it.

How: the loader's index sampler is wrapped so that each batch of indices is
tagged with its position in the epoch; the tag travels with the indices to
the worker, where a dataset wrapper reads the samples, runs the user's
``collate_fn`` and writes one fetch line (from the first sample read to the
end of collation). The loader's own ``collate_fn`` only unwraps the result.
Samplers, ``collate_fn``, workers, pinning and prefetching stay the user's,
so the loader yields exactly the batches it would yield without dsim, and no
random number is drawn that would not be drawn anyway.

An ``IterableDataset`` has no sampler to carry batch indices: such a loader
is instrumented by ``dsim.instrument.iterable`` instead. The batch index is
the position in the (batch) sampler's epoch, which is the iteration that
consumes the batch, except with ``in_order=False``, where batches may reach
the loop out of sampler order.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from dsim.errors import UsageError
from dsim.instrument.batchsize import on_first_batch
from dsim.instrument.cpu import (
    local_world_size,
    process_cpu_since_last_batch,
    thread_times,
    usable_cores,
    usable_cpus,
)
from dsim.instrument.lines import LineSink, fetch_line, loader_line, make_sink, resolve_rank
from dsim.instrument.proxy import DatasetProxy
from dsim.instrument.sinks import flush_held
from dsim.instrument.stages import Stages, read_then_collate
from dsim.instrument.timer import LAST, TrainingTimer


class _Tagged(NamedTuple):
    """Sampler output with the batch's position in the epoch (pickled to workers)."""

    batch: int
    index: Any


class _Collated(NamedTuple):
    """A batch already collated in the worker; ``_Unwrap`` hands it on unchanged."""

    value: Any


class _Unwrap:
    """The instrumented loader's ``collate_fn``: a worker's ``_Collated`` batch passes unchanged.

    Anything else is collated with the user's ``collate_fn``: frameworks that
    rebuild a loader from its attributes (accelerate's ``skip_first_batches``
    on resume, until ``instrument_rebuilt`` tags it; Lightning re-instantiating
    a loader) build one with a plain sampler, whose untagged samples must
    still become the user's batches (then without fetch lines) rather than a
    list of samples.
    """

    def __init__(self, collate_fn: Any):
        self.collate_fn = collate_fn

    def __call__(self, data: Any) -> Any:
        return data.value if isinstance(data, _Collated) else self.collate_fn(data)


class _TaggingSampler:
    """Yields ``_Tagged(position, indices)``; positions restart at ``start`` with every
    epoch's iterator (0, or the batches a resumed epoch skips: ``instrument_rebuilt``).

    It runs in the loop's process, and its end is the epoch's end there (without
    workers, the last batch is built right after): the fetch lines this process
    holds are written then, also when no ``TrainingTimer`` runs the loop.
    """

    def __init__(self, inner: Any, start: int = 0):
        self.inner = inner
        self.start = start

    def __iter__(self):
        for position, index in enumerate(self.inner, self.start):
            yield _Tagged(position, index)
        flush_held()

    def __len__(self) -> int:
        return len(self.inner)


_worker_info = None


def _worker() -> int | None:
    """The DataLoader worker id; ``None`` in the main process (``num_workers=0``)."""
    global _worker_info
    if _worker_info is None:
        from torch.utils.data import get_worker_info

        _worker_info = get_worker_info
    info = _worker_info()
    return None if info is None else int(info.id)


def _worker_id() -> int:
    """The DataLoader worker id; 0 in the main process (the grammar has no -1)."""
    worker = _worker()
    return 0 if worker is None else worker


class TimedDataset(DatasetProxy):
    """Wraps a map-style dataset: builds tagged batches and logs how long each took.

    Attribute access falls through to the wrapped dataset, so code reading
    ``loader.dataset.classes`` or a ``worker_init_fn`` that shards through
    ``get_worker_info().dataset`` keeps working; the original is ``.wrapped``.
    """

    def __init__(
        self,
        dataset: Any,
        collate_fn: Any,
        sink: LineSink,
        rank: int,
        auto_collation: bool,
        stages: bool = False,
    ):
        self._dsim_dataset = dataset
        self._dsim_collate = collate_fn
        self._dsim_sink = sink
        self._dsim_rank = rank
        self._dsim_auto = auto_collation
        self._dsim_stages = stages  # time reads and collation apart (dsim.instrument.stages)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, _Tagged):
            return self._build(index)
        return self._dsim_dataset[index]

    def __getitems__(self, indices: Any) -> Any:
        if isinstance(indices, _Tagged):
            return self._build(indices)
        return self._read(indices)

    def _read(self, indices: Any) -> list[Any]:
        """Read samples exactly as torch's map-style fetcher would."""
        getitems = getattr(self._dsim_dataset, "__getitems__", None)
        if getitems:
            return getitems(indices)
        return [self._dsim_dataset[i] for i in indices]

    def _build(self, tagged: _Tagged) -> _Collated:
        cpu0, runq0 = thread_times()  # this thread builds the whole batch
        start = time.perf_counter()
        index = tagged.index
        if self._dsim_stages:
            batch, mid = read_then_collate(lambda: self._samples(index), self._dsim_collate)
        else:
            batch, mid = self._dsim_collate(self._samples(index)), None
        end = time.perf_counter()
        seconds = end - start
        cpu1, runq1 = thread_times()
        stages = None if mid is None else Stages.between(start, cpu0, mid, end, cpu1)
        wall_end = time.time()
        runq = None if runq0 is None or runq1 is None else runq1 - runq0
        worker = _worker()
        # In the main process (num_workers=0) the process's CPU is the training
        # process's, which its iteration lines already count.
        proc = None if worker is None else process_cpu_since_last_batch()
        self._dsim_sink.put(  # formatted later, in a block (dsim.instrument.sinks)
            fetch_line,
            wall_end,
            self._dsim_rank,
            0 if worker is None else worker,
            seconds,
            tagged.batch,
            cpu1 - cpu0,
            runq,
            stages,
            None,
            proc,
        )
        return _Collated(batch)

    def _samples(self, index: Any) -> Any:
        """The batch's samples: read as torch would, or the whole batch without auto-collation."""
        return self._read(index) if self._dsim_auto else self._dsim_dataset[index]


_loader_class: type | None = None


def _instrumented_loader_class() -> type:
    """Built on first use so that importing dsim never imports torch."""
    global _loader_class
    if _loader_class is None:
        from torch.utils.data import DataLoader

        class InstrumentedDataLoader(DataLoader):
            """A DataLoader whose index sampler tags each batch with its position in the epoch.

            Every new iterator (one per epoch) logs the loader's settings, which
            the pipeline replay model needs and the fetch lines cannot show, when
            its first batch reaches the loop: with that batch's size in bytes.
            """

            _dsim_sink: LineSink | None = None
            _dsim_rank = 0
            _dsim_timer: TrainingTimer | None = None
            _dsim_epoch: Callable[[], int] | None = None
            _dsim_settings: dict[str, int | None] = {}  # noqa: RUF012 (replaced, never mutated)
            _dsim_running: Iterator[Any] | None = None
            _dsim_start = 0  # position of the first batch in the epoch (a resumed epoch's skip)

            @property
            def _index_sampler(self):
                return _TaggingSampler(super()._index_sampler, self._dsim_start)

            def __iter__(self):
                if self._dsim_timer is None or self._dsim_epoch is None:
                    return self._dsim_iter()
                # Iterated lazily by the timer, so that starting the workers counts as
                # waiting for the first batch, as with ``timer.iterate(loader)``.
                start = self._dsim_start
                epoch, total = self._dsim_epoch(), start + len(self)
                running = self._dsim_timer.iterate(
                    _Iterates(self._dsim_iter), epoch, total, start=start
                )
                self._dsim_running = running
                return running

            def _dsim_finish(self) -> None:
                """Log the iteration running now as ending now, asking for no other batch:
                for framework loops that stop without asking past their last batch
                (Lightning knows an epoch's length; ``max_steps``, a resumed epoch's
                remainder), called where the loop would have asked. A no-op when no
                iteration is running.
                """
                running, self._dsim_running = self._dsim_running, None
                if running is not None:
                    # StopIteration: it had ended; TypeError: never started (nothing runs).
                    with contextlib.suppress(StopIteration, TypeError):
                        running.send(LAST)

            def _dsim_iter(self):
                iterator = super().__iter__()
                if self._dsim_sink is not None:
                    sink, rank = self._dsim_sink, self._dsim_rank
                    settings = {**_settings(self), **self._dsim_settings}

                    def log(nbytes: int | None) -> None:
                        line = loader_line(time.time(), rank, {**settings, "batch_bytes": nbytes})
                        sink.write(line)

                    on_first_batch(iterator, log)
                return iterator

        _loader_class = InstrumentedDataLoader
    return _loader_class


class _Iterates:
    """An iterable whose iterator is ``make()``: lets ``TrainingTimer.iterate`` create it."""

    def __init__(self, make: Callable[[], Iterator[Any]]):
        self.make = make

    def __iter__(self) -> Iterator[Any]:
        return self.make()


def _settings(loader: Any) -> dict[str, object]:
    workers = int(loader.num_workers)
    return {
        "num_workers": workers,
        "prefetch_factor": loader.prefetch_factor if workers > 0 else None,
        "batch_size": loader.batch_size,
        "persistent_workers": bool(loader.persistent_workers),
        "pin_memory": bool(loader.pin_memory),
        "cores": usable_cores(),
        "local_world_size": local_world_size(),
        "cpus": usable_cpus(),
    }


def is_instrumented(loader: Any) -> bool:
    """Whether ``loader`` is a DataLoader ``instrument_loader`` (or ``instrument_rebuilt``) made."""
    return _loader_class is not None and isinstance(loader, _loader_class)


def loader_kwargs(loader: Any, collate_fn: Any) -> dict[str, Any]:
    """The user's DataLoader settings an instrumented copy keeps (``collate_fn`` replaced):
    workers, pinning, timeouts, seeds, prefetch and the options newer torch versions add."""
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
    if getattr(loader, "pin_memory_device", ""):
        kwargs["pin_memory_device"] = loader.pin_memory_device
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return kwargs


def instrument_loader(
    loader: Any,
    log_dir: str | Path | None = None,
    rank: int | None = None,
    *,
    logger: logging.Logger | str | None = None,
    timer: TrainingTimer | None = None,
    epoch: Callable[[], int] | None = None,
    settings: Mapping[str, int | None] | None = None,
    stages: bool = False,
) -> Any:
    """Return a DataLoader that yields what ``loader`` yields and logs one fetch line per batch.

    Lines go to ``<log_dir>/rank<rank>.log`` (or to ``logger``). ``rank``
    defaults to torch.distributed's rank, then ``$RANK``, then 0. The new
    loader shares ``loader``'s sampler object, so ``sampler.set_epoch`` and
    ``loader.sampler.set_epoch`` keep working. Build it before iterating: with
    ``persistent_workers`` the workers are started by the first epoch.

    For training loops that are not the caller's own (Lightning, the Hugging
    Face Trainer, accelerate: ``dsim.instrument.lightning``,
    ``dsim.instrument.huggingface``), ``timer`` and ``epoch`` make the loader
    write the training lines as well: each iterator it hands out is
    ``timer.iterate(…, epoch=epoch())``, so an iteration ends when the loop
    asks for the next batch, whoever the loop is. ``settings`` gives the
    loader line what the loader cannot tell: ``local_world_size`` (ranks on
    the node) for launchers that do not set ``$LOCAL_WORLD_SIZE``,
    ``batch_size`` behind a framework's sharding batch sampler.

    ``stages=True`` also times the sample reads and the collation of each
    batch apart (wall and CPU seconds, SPEC §1.2; ``dsim.instrument.stages``).
    """
    if (timer is None) != (epoch is None):
        raise UsageError("give both timer= and epoch=, or neither")
    from torch.utils.data import IterableDataset

    from dsim.instrument import iterable

    if isinstance(loader.dataset, TimedDataset | iterable.timed_iterable_class()):
        raise UsageError("this DataLoader is already instrumented")
    rank = resolve_rank(rank)
    sink = make_sink(log_dir, rank, logger)
    if isinstance(loader.dataset, IterableDataset):  # no sampler: dsim.instrument.iterable
        return iterable.instrument_iterable(loader, sink, rank)
    auto = loader.batch_sampler is not None
    dataset = TimedDataset(loader.dataset, loader.collate_fn, sink, rank, auto, stages)
    kwargs = loader_kwargs(loader, _Unwrap(loader.collate_fn))
    return _build(loader, dataset, kwargs, timer, epoch, settings, 0)


def instrument_rebuilt(
    loader: Any,
    start: int,
    *,
    timer: TrainingTimer | None = None,
    epoch: Callable[[], int] | None = None,
    settings: Mapping[str, int | None] | None = None,
) -> Any:
    """Instrument a DataLoader a framework rebuilt from an instrumented one's attributes.

    Such a loader (accelerate's ``skip_first_batches``, which resumes an epoch
    past the batches a checkpoint had trained) holds the instrumented loader's
    ``TimedDataset`` and ``collate_fn`` but a plain sampler, so its batches
    carry no position and write no line. The loader returned builds the same
    batches in the same order and logs them as ``instrument_loader``'s does,
    into the same sink and rank, its first batch at position ``start`` of the
    epoch (the batches skipped), so that fetch and training lines keep the
    positions the first job gave them. ``timer``, ``epoch`` and ``settings``
    as for ``instrument_loader``.
    """
    if (timer is None) != (epoch is None):
        raise UsageError("give both timer= and epoch=, or neither")
    dataset = loader.dataset
    if not isinstance(dataset, TimedDataset):
        raise UsageError("instrument_rebuilt needs a loader rebuilt from an instrumented one")
    if is_instrumented(loader):
        raise UsageError("this DataLoader is already instrumented")
    if start < 0:
        raise UsageError(f"start must be a batch position (>= 0), not {start}")
    kwargs = loader_kwargs(loader, loader.collate_fn)  # already the instrumented one's _Unwrap
    return _build(loader, dataset, kwargs, timer, epoch, settings, start)


def _build(
    loader: Any,
    dataset: TimedDataset,
    kwargs: dict[str, Any],
    timer: TrainingTimer | None,
    epoch: Callable[[], int] | None,
    settings: Mapping[str, int | None] | None,
    start: int,
) -> Any:
    """The instrumented DataLoader over ``dataset`` with ``loader``'s samplers and ``kwargs``."""
    from torch.utils.data import BatchSampler

    batch_sampler = loader.batch_sampler
    if batch_sampler is None:
        kwargs.update(batch_size=None, sampler=loader.sampler)
    elif type(batch_sampler) is BatchSampler and batch_sampler.sampler is loader.sampler:
        # Rebuild the default batch sampler so .sampler/.batch_size/.drop_last stay the user's.
        kwargs.update(
            batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last
        )
    else:
        kwargs["batch_sampler"] = batch_sampler
    instrumented = _instrumented_loader_class()(dataset, **kwargs)
    instrumented._dsim_sink, instrumented._dsim_rank = dataset._dsim_sink, dataset._dsim_rank
    instrumented._dsim_timer, instrumented._dsim_epoch = timer, epoch
    instrumented._dsim_settings = dict(settings or {})
    instrumented._dsim_start = start
    return instrumented
