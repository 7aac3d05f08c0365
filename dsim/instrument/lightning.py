"""dsim's raw logs from a PyTorch Lightning job, with no change to its LightningModule.

    from dsim.instrument.lightning import DsimCallback

    trainer = Trainer(strategy="ddp", callbacks=[DsimCallback(log_dir="logs/myrun")])

Why a callback that wraps the train data source: Lightning builds the train
DataLoader itself (from ``train_dataloader()``, a datamodule or ``fit``'s
argument) and then rebuilds it with a ``DistributedSampler``; only the loader
it finally iterates carries the rank's batches. The callback's ``setup``
wraps the fit loop's data source so that the loaders come back inside a
``CombinedLoader`` that instruments each of its DataLoaders the first time it
is iterated, after all of Lightning's processing, and again whenever
Lightning reloads them (``reload_dataloaders_every_n_epochs``). Each is
replaced by ``instrument_loader``'s loader with a ``TrainingTimer``: the
same fetch, training and loader lines as a hand-written loop, and an
iteration ends when Lightning asks for the next batch. Lightning 2.x does not
read ahead of a loader with a length (its fetcher knows the last batch from
the count), so iteration i is the wait for batch i and the step on it, as in a
hand-written loop; after the batch its epoch loop ends with (the last one,
``max_steps``, a stop request) it asks for nothing, so ``on_train_batch_end``
ends the running iteration there when the loop is done. A fetcher that does
read one ahead (a loader without a length) leaves iteration i+1 running at a
``max_steps`` stop, which that hook ends the same way (docs/SPEC.md §1.10).

Lightning is imported when the callback class is first used, never by
``import dsim``; ``lightning`` is preferred, ``pytorch_lightning`` used when
only it is installed (``callback_class("pytorch_lightning")`` picks it).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsim.errors import UsageError
from dsim.instrument.loader import TimedDataset, instrument_loader
from dsim.instrument.timer import TrainingTimer

PACKAGES = ("lightning.pytorch", "pytorch_lightning")
_classes: dict[object, type] = {}  # callback per package name, instrumenting class per base


def _package(name: str | None) -> Any:
    """The Lightning package ``name``, else the first of ``PACKAGES`` that imports."""
    names = (name,) if name else PACKAGES
    for candidate in names:
        try:
            return importlib.import_module(candidate)
        except ImportError:
            continue
    wanted = " or ".join(names)
    raise UsageError(f"dsim.instrument.lightning needs {wanted} (pip install lightning)")


class _Instrumenter:
    """Replaces a rank's train DataLoaders by instrumented ones; one per Lightning callback."""

    def __init__(
        self,
        log_dir: str | Path | None,
        logger: logging.Logger | str | None,
        sync: Callable[[], Any] | None,
    ):
        if (log_dir is None) == (logger is None):
            raise UsageError("give exactly one of log_dir= and logger=")
        self.log_dir, self.logger, self.sync = log_dir, logger, sync

    def loader(self, loader: Any, trainer: Any) -> Any:
        """``loader`` instrumented for ``trainer``'s rank; unchanged unless a DataLoader."""
        from torch.utils.data import DataLoader

        if not isinstance(loader, DataLoader) or isinstance(loader.dataset, TimedDataset):
            return loader
        rank = int(trainer.global_rank)
        timer = TrainingTimer(
            self.log_dir, rank, batch_size=loader.batch_size, logger=self.logger, sync=self.sync
        )
        return instrument_loader(
            loader,
            self.log_dir,
            rank,
            logger=self.logger,
            timer=timer,
            epoch=lambda: int(trainer.current_epoch),
            settings={"local_world_size": int(trainer.num_devices)},
        )


def _instrumenting_class(base: type) -> type:
    """``base`` (a ``CombinedLoader`` class) whose ``__iter__`` first instruments its loaders."""
    if getattr(base, "_dsim_instrumenting", False):
        return base
    if base in _classes:
        return _classes[base]

    class InstrumentingCombinedLoader(base):  # type: ignore[misc, valid-type]
        _dsim_instrumenting = True
        _dsim: tuple[_Instrumenter, Any] | None = None

        def __iter__(self):
            if self._dsim is not None:
                instrumenter, trainer = self._dsim
                self.flattened = [instrumenter.loader(dl, trainer) for dl in self.flattened]
            return super().__iter__()

    _classes[base] = InstrumentingCombinedLoader
    return InstrumentingCombinedLoader


def callback_class(package: str | None = None) -> type:
    """The callback class for ``package`` (``lightning.pytorch`` or ``pytorch_lightning``)."""
    pl = _package(package)
    key = pl.__name__
    if key in _classes:
        return _classes[key]
    combined = importlib.import_module(f"{key}.utilities.combined_loader").CombinedLoader

    class DsimCallback(pl.Callback):
        """Writes dsim's raw logs (``<log_dir>/rank<N>.log``) for the train DataLoaders.

        ``log_dir`` or ``logger`` as for ``instrument_loader``; ``sync`` (e.g.
        ``torch.cuda.synchronize``) is called before an iteration's end is
        taken. Ranks are Lightning's global ranks; the loader line's
        ``local_world_size`` is the trainer's devices per node.
        """

        def __init__(
            self,
            log_dir: str | Path | None = None,
            *,
            logger: logging.Logger | str | None = None,
            sync: Callable[[], Any] | None = None,
        ):
            super().__init__()
            self._dsim = _Instrumenter(log_dir, logger, sync)

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if stage != "fit":
                return
            source = trainer.fit_loop._data_source
            if getattr(source, "_dsim_wrapped", False):
                return
            original = source.dataloader
            instrumenter = self._dsim

            def dataloader() -> Any:
                loaders = original()
                if not isinstance(loaders, combined):
                    loaders = combined(loaders, "max_size_cycle")
                loaders.__class__ = _instrumenting_class(type(loaders))
                loaders._dsim = (instrumenter, trainer)
                return loaders

            source.dataloader = dataloader
            source._dsim_wrapped = True

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            # Lightning never asks past the batch its epoch loop ends with (it knows the
            # length; limit_train_batches, max_steps, a stop request, a resumed epoch's
            # remainder): the iteration running ends here, where it would have asked.
            if _loop_done(trainer):
                _finish(trainer)

    _classes[key] = DsimCallback
    return DsimCallback


def _loaders(trainer: Any) -> Any:
    return getattr(trainer.fit_loop._combined_loader, "flattened", ())


def _finish(trainer: Any) -> None:
    """End the running iteration of each instrumented train loader now (``_dsim_finish``)."""
    for loader in _loaders(trainer):
        finish = getattr(loader, "_dsim_finish", None)
        if finish is not None:
            finish()


def _loop_done(trainer: Any) -> bool:
    """Whether the epoch loop stops after the batch just trained: its last batch (the
    loader's length, ``limit_train_batches``, a resumed epoch's offset), ``max_steps``
    reached, ``trainer.should_stop``; ``False`` where this Lightning version cannot tell."""
    try:
        return bool(trainer.fit_loop.epoch_loop.done)
    except AttributeError:
        return False


def __getattr__(name: str) -> Any:
    """``DsimCallback`` is built on first use, so that importing this module needs no Lightning."""
    if name == "DsimCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
