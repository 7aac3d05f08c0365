"""dsim's raw logs from a Hugging Face ``Trainer`` or an ``accelerate`` training loop.

    from dsim.instrument.huggingface import DsimTrainerCallback

    callback = DsimTrainerCallback(log_dir="logs/myrun")
    trainer = Trainer(model, args, train_dataset=data, callbacks=[callback])

    from dsim.instrument.huggingface import instrument_accelerate

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loader = instrument_accelerate(loader, log_dir="logs/myrun")

Why in place, after ``prepare``: accelerate rebuilds a loader to shard it
(``DataLoaderShard`` around a new torch DataLoader with a sharding batch
sampler), so a loader instrumented before ``prepare`` loses its batch tags.
``instrument_accelerate`` swaps the shard's inner DataLoader for
``instrument_loader``'s loader with a ``TrainingTimer``; the shard object,
its epoch counter, device placement and end-of-data signal for gradient
accumulation stay accelerate's. The Trainer needs no subclass and no
``get_train_dataloader`` override: it hands the prepared loader it is about
to iterate to ``on_train_begin``, where the callback instruments that object.

accelerate reads one batch ahead (to know the last one), so iteration i is
the wait for batch i and then the step on batch i−1, which that wait gates
(docs/SPEC.md §1.10). transformers and accelerate are
imported only when this module is, never by ``import dsim``.

Resuming mid-epoch: accelerate's ``skip_first_batches`` builds a new shard
from the instrumented one's attributes, with its ``TimedDataset`` and a
``SkipBatchSampler``; that loader would build untagged batches and log
nothing. ``instrument_accelerate`` given such a loader instruments it too,
numbering its batches from the count skipped (positions in the epoch, as the
first job numbered them), into the lines of the loader it was rebuilt from.
The Trainer calls ``skip_first_batches`` inside its epoch loop, where no
callback runs between the rebuild and the first batch, so the callback wraps
the name the Trainer calls (``transformers.trainer.skip_first_batches``)
once per process; the wrapper instruments only loaders dsim instrumented and
hands every other loader back as accelerate built it.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsim.errors import UsageError
from dsim.instrument.lines import resolve_rank
from dsim.instrument.loader import (
    TimedDataset,
    instrument_loader,
    instrument_rebuilt,
    is_instrumented,
)
from dsim.instrument.sinks import FileSink, LoggerSink
from dsim.instrument.timer import TrainingTimer


def instrument_accelerate(
    loader: Any,
    log_dir: str | Path | None = None,
    rank: int | None = None,
    *,
    logger: logging.Logger | str | None = None,
    sync: Callable[[], Any] | None = None,
) -> Any:
    """Instrument an ``Accelerator.prepare``d DataLoader in place; returns it.

    Writes fetch, training and loader lines like ``instrument_loader`` plus
    ``TrainingTimer`` (``log_dir``/``logger``, ``rank`` and ``sync`` as
    there). Epochs are the loader's own (``set_epoch``, as the Trainer and
    accelerate's loops set them). Refused: a loader that ``prepare`` did not
    shard per process (``dispatch_batches``, iterable datasets) and a
    stateful (torchdata) inner loader, whose state dict would be lost.

    A loader ``skip_first_batches`` rebuilt from an instrumented one (a job
    resumed mid-epoch) is instrumented as well: its batches keep their
    positions in the epoch (the first is the count skipped), and its lines go
    where the instrumented one's go (its rank; ``log_dir``/``logger`` may be
    left out, and must name that place when given).
    """
    inner = vars(loader).get("base_dataloader")
    if inner is None:
        raise UsageError(
            "instrument_accelerate needs a DataLoader returned by Accelerator.prepare "
            "(wrap a plain loop's DataLoader with instrument_loader instead)"
        )
    if type(loader).__name__ != "DataLoaderShard":
        raise UsageError(
            f"instrument_accelerate cannot time a {type(loader).__name__}: only loaders "
            "sharded per process (DataLoaderShard; not dispatch_batches) build their own batches"
        )
    if is_instrumented(inner):
        return loader
    if isinstance(inner.dataset, TimedDataset):  # rebuilt by skip_first_batches
        _check_place(inner.dataset, log_dir, logger)
        dataset = inner.dataset
        rank, sink = dataset._dsim_rank, dataset._dsim_sink
        timer = TrainingTimer(rank=rank, batch_size=_batch_size(inner), sync=sync, sink=sink)
        return _instrument_skipped(loader, timer, {"batch_size": timer.batch_size})
    if hasattr(inner, "state_dict"):
        raise UsageError("instrument_accelerate cannot keep a stateful (torchdata) loader's state")
    rank = resolve_rank(rank)
    batch_size = _batch_size(inner)
    timer = TrainingTimer(log_dir, rank, batch_size=batch_size, logger=logger, sync=sync)
    loader.base_dataloader = instrument_loader(
        inner,
        log_dir,
        rank,
        logger=logger,
        timer=timer,
        epoch=lambda: int(loader.iteration),
        settings={"batch_size": batch_size},
    )
    return loader


def _instrument_skipped(skipped: Any, timer: TrainingTimer, settings: dict[str, int | None]) -> Any:
    """``skip_first_batches``' shard with its inner DataLoader instrumented in place.

    The first batch's position is the ``SkipBatchSampler``'s count skipped;
    epochs are the new shard's (the Trainer's ``set_epoch`` on it).
    """
    inner = skipped.base_dataloader
    if hasattr(inner, "state_dict"):
        raise UsageError("instrument_accelerate cannot keep a stateful (torchdata) loader's state")
    skipper = inner.batch_sampler if inner.batch_sampler is not None else inner.sampler
    start = getattr(skipper, "skip_batches", None)
    if start is None:
        raise UsageError(
            "instrument_accelerate: this loader holds an instrumented dataset but skips no "
            "batches through a SkipBatchSampler; instrument the loader prepare returned instead"
        )
    skipped.base_dataloader = instrument_rebuilt(
        inner, int(start), timer=timer, epoch=lambda: int(skipped.iteration), settings=settings
    )
    return skipped


def _wrap_trainer_skip() -> None:
    """Make the Trainer's ``skip_first_batches`` instrument what it rebuilds from a dsim loader.

    Why a wrapper: the Trainer rebuilds the loader of the epoch it resumes in
    inside its epoch loop and iterates it at once; no callback runs in
    between. Installed once per process; any other loader passes unchanged.
    """
    module = sys.modules.get("transformers.trainer")
    original = getattr(module, "skip_first_batches", None)
    if original is None or hasattr(original, "_dsim_wraps"):
        return

    @functools.wraps(original)
    def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
        skipped = original(dataloader, num_batches)
        inner = vars(dataloader).get("base_dataloader")
        if not is_instrumented(inner) or type(skipped).__name__ != "DataLoaderShard":
            return skipped
        if inner._dsim_timer is None:
            return skipped
        skipped = _instrument_skipped(skipped, inner._dsim_timer, dict(inner._dsim_settings))
        dataloader._dsim_skipped = skipped  # the callback ends its iteration at a stop
        return skipped

    skip_first_batches._dsim_wraps = original  # type: ignore[attr-defined]
    module.skip_first_batches = skip_first_batches  # type: ignore[union-attr]


def _finish(shard: Any) -> None:
    """End the running iteration of ``shard``'s instrumented loader, and of the loader
    ``skip_first_batches`` rebuilt from it, now (``_dsim_finish``; a no-op where none runs)."""
    for loader in (shard, vars(shard).get("_dsim_skipped")):
        inner = None if loader is None else vars(loader).get("base_dataloader")
        finish = getattr(inner, "_dsim_finish", None)
        if finish is not None:
            finish()


def _check_place(dataset: TimedDataset, log_dir: str | Path | None, logger: Any) -> None:
    """A rebuilt loader logs where its dataset logs: refuse a ``log_dir``/``logger`` elsewhere."""
    sink = dataset._dsim_sink
    if log_dir is not None:
        same = isinstance(sink, FileSink) and sink.path.parent.resolve() == Path(log_dir).resolve()
    elif logger is not None:
        name = logger if isinstance(logger, str) else logger.name
        same = isinstance(sink, LoggerSink) and sink.name == name
    else:
        return
    if not same:
        where = sink.path.parent if isinstance(sink, FileSink) else "its logger"
        raise UsageError(
            "instrument_accelerate: a loader skip_first_batches rebuilt logs where the one "
            f"it was rebuilt from logs ({where}); leave log_dir/logger out or name that place"
        )


def _batch_size(inner: Any) -> int | None:
    """A process's batch size: accelerate's sharding batch sampler hides it from the loader.

    ``BatchSamplerShard.batch_size`` is the wrapped sampler's; with
    ``split_batches`` each process gets its share of it. A ``SkipBatchSampler``
    (``skip_first_batches``) wraps the sharding one and has no batch size.
    """
    if inner.batch_size is not None:
        return int(inner.batch_size)
    sampler = inner.batch_sampler
    if sampler is not None and hasattr(sampler, "skip_batches"):
        sampler = getattr(sampler, "batch_sampler", sampler)
    size = getattr(sampler, "batch_size", None)
    if size is None:
        return None
    if getattr(sampler, "split_batches", False):
        return int(size) // int(getattr(sampler, "num_processes", 1))
    return int(size)


_callback: type | None = None


def callback_class() -> type:
    """``DsimTrainerCallback``, a ``transformers.TrainerCallback`` (built on first use)."""
    global _callback
    if _callback is not None:
        return _callback
    try:
        from transformers import TrainerCallback
    except ImportError as exc:
        raise UsageError(
            "DsimTrainerCallback needs transformers (pip install transformers)"
        ) from exc

    class DsimTrainerCallback(TrainerCallback):
        """Writes dsim's raw logs (``<log_dir>/rank<N>.log``) for the Trainer's train loader.

        ``log_dir`` or ``logger`` and ``sync`` as for ``instrument_accelerate``;
        ranks are torch.distributed's.
        """

        def __init__(
            self,
            log_dir: str | Path | None = None,
            *,
            logger: logging.Logger | str | None = None,
            sync: Callable[[], Any] | None = None,
        ):
            if (log_dir is None) == (logger is None):
                raise UsageError("give exactly one of log_dir= and logger=")
            self.log_dir, self.logger, self.sync = log_dir, logger, sync
            self.loader: Any = None

        def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
            if train_dataloader is None:
                raise UsageError("DsimTrainerCallback: the Trainer passed no train_dataloader")
            self.loader = instrument_accelerate(
                train_dataloader, self.log_dir, logger=self.logger, sync=self.sync
            )
            _wrap_trainer_skip()  # resume_from_checkpoint mid-epoch: log that epoch's rest

        def on_step_end(self, args, state, control, **kwargs):
            # max_steps reached (or a callback's stop): the Trainer leaves its loop after
            # this step, with the next batch already asked for. That iteration (its wait,
            # then this step) ends here, where the next request would have come.
            if control.should_training_stop and self.loader is not None:
                _finish(self.loader)

    _callback = DsimTrainerCallback
    return _callback


def __getattr__(name: str) -> Any:
    """``DsimTrainerCallback`` is built on first use: importing this module needs no
    transformers."""
    if name == "DsimTrainerCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
