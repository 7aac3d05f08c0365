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
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsim.errors import UsageError
from dsim.instrument.lines import resolve_rank
from dsim.instrument.loader import TimedDataset, instrument_loader
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
    if isinstance(inner.dataset, TimedDataset):
        return loader
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


def _batch_size(inner: Any) -> int | None:
    """A process's batch size: accelerate's sharding batch sampler hides it from the loader.

    ``BatchSamplerShard.batch_size`` is the wrapped sampler's; with
    ``split_batches`` each process gets its share of it.
    """
    if inner.batch_size is not None:
        return int(inner.batch_size)
    sampler = inner.batch_sampler
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

        def on_step_end(self, args, state, control, **kwargs):
            # max_steps reached (or a callback's stop): the Trainer leaves its loop after
            # this step, with the next batch already asked for. That iteration (its wait,
            # then this step) ends here, where the next request would have come.
            if control.should_training_stop:
                inner = getattr(self.loader, "base_dataloader", None)
                finish = getattr(inner, "_dsim_finish", None)
                if finish is not None:
                    finish()

    _callback = DsimTrainerCallback
    return _callback


def __getattr__(name: str) -> Any:
    """``DsimTrainerCallback`` is built on first use: importing this module needs no
    transformers."""
    if name == "DsimTrainerCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
