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

import logging
import time
from pathlib import Path
from typing import Any, NamedTuple

from dsim.errors import UsageError
from dsim.instrument.batchsize import on_first_batch
from dsim.instrument.cpu import local_world_size, thread_times, usable_cores
from dsim.instrument.lines import LineSink, fetch_line, loader_line, make_sink, resolve_rank


class _Tagged(NamedTuple):
    """Sampler output with the batch's position in the epoch (pickled to workers)."""

    batch: int
    index: Any


class _Collated(NamedTuple):
    """A batch already collated in the worker; ``_unwrap`` hands it on unchanged."""

    value: Any


def _unwrap(data: Any) -> Any:
    return data.value if isinstance(data, _Collated) else data


class _TaggingSampler:
    """Yields ``_Tagged(position, indices)``; positions restart with every epoch's iterator."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __iter__(self):
        for position, index in enumerate(self.inner):
            yield _Tagged(position, index)

    def __len__(self) -> int:
        return len(self.inner)


_worker_info = None


def _worker_id() -> int:
    """The DataLoader worker id; 0 in the main process (the grammar has no -1)."""
    global _worker_info
    if _worker_info is None:
        from torch.utils.data import get_worker_info

        _worker_info = get_worker_info
    info = _worker_info()
    return 0 if info is None else int(info.id)


class TimedDataset:
    """Wraps a map-style dataset: builds tagged batches and logs how long each took.

    Attribute access falls through to the wrapped dataset, so code reading
    ``loader.dataset.classes`` or a ``worker_init_fn`` that shards through
    ``get_worker_info().dataset`` keeps working; the original is ``.wrapped``.
    """

    def __init__(
        self, dataset: Any, collate_fn: Any, sink: LineSink, rank: int, auto_collation: bool
    ):
        self._dsim_dataset = dataset
        self._dsim_collate = collate_fn
        self._dsim_sink = sink
        self._dsim_rank = rank
        self._dsim_auto = auto_collation

    @property
    def wrapped(self) -> Any:
        return self._dsim_dataset

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("__", "_dsim_")):
            raise AttributeError(name)
        return getattr(self._dsim_dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_dsim_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._dsim_dataset, name, value)

    def __len__(self) -> int:
        return len(self._dsim_dataset)

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
        samples = self._read(index) if self._dsim_auto else self._dsim_dataset[index]
        batch = self._dsim_collate(samples)
        seconds = time.perf_counter() - start
        cpu1, runq1 = thread_times()
        wall_end = time.time()
        runq = None if runq0 is None or runq1 is None else runq1 - runq0
        self._dsim_sink.write(
            fetch_line(
                wall_end, self._dsim_rank, _worker_id(), seconds, tagged.batch, cpu1 - cpu0, runq
            )
        )
        return _Collated(batch)


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

            @property
            def _index_sampler(self):
                return _TaggingSampler(super()._index_sampler)

            def __iter__(self):
                iterator = super().__iter__()
                if self._dsim_sink is not None:
                    sink, rank, settings = self._dsim_sink, self._dsim_rank, _settings(self)

                    def log(nbytes: int | None) -> None:
                        line = loader_line(time.time(), rank, {**settings, "batch_bytes": nbytes})
                        sink.write(line)

                    on_first_batch(iterator, log)
                return iterator

        _loader_class = InstrumentedDataLoader
    return _loader_class


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
    }


def instrument_loader(
    loader: Any,
    log_dir: str | Path | None = None,
    rank: int | None = None,
    *,
    logger: logging.Logger | str | None = None,
) -> Any:
    """Return a DataLoader that yields what ``loader`` yields and logs one fetch line per batch.

    Lines go to ``<log_dir>/rank<rank>.log`` (or to ``logger``). ``rank``
    defaults to torch.distributed's rank, then ``$RANK``, then 0. The new
    loader shares ``loader``'s sampler object, so ``sampler.set_epoch`` and
    ``loader.sampler.set_epoch`` keep working. Build it before iterating: with
    ``persistent_workers`` the workers are started by the first epoch.
    """
    from torch.utils.data import BatchSampler, IterableDataset

    from dsim.instrument import iterable

    if isinstance(loader.dataset, TimedDataset | iterable.timed_iterable_class()):
        raise UsageError("this DataLoader is already instrumented")
    rank = resolve_rank(rank)
    sink = make_sink(log_dir, rank, logger)
    if isinstance(loader.dataset, IterableDataset):  # no sampler: dsim.instrument.iterable
        return iterable.instrument_iterable(loader, sink, rank)
    auto = loader.batch_sampler is not None
    dataset = TimedDataset(loader.dataset, loader.collate_fn, sink, rank, auto)

    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": _unwrap,
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

    batch_sampler = loader.batch_sampler
    if not auto:
        kwargs.update(batch_size=None, sampler=loader.sampler)
    elif type(batch_sampler) is BatchSampler and batch_sampler.sampler is loader.sampler:
        # Rebuild the default batch sampler so .sampler/.batch_size/.drop_last stay the user's.
        kwargs.update(
            batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last
        )
    else:
        kwargs["batch_sampler"] = batch_sampler
    instrumented = _instrumented_loader_class()(dataset, **kwargs)
    instrumented._dsim_sink, instrumented._dsim_rank = sink, rank
    return instrumented
