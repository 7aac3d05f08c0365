"""Instrument a real PyTorch DDP job so that ``dsim parse`` can read its logs.

    from dsim.instrument import instrument_loader, TrainingTimer

    loader = instrument_loader(loader, log_dir="logs/myrun", rank=rank)
    timer = TrainingTimer(log_dir="logs/myrun", rank=rank)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in timer.iterate(loader, epoch=epoch):
            train_step(batch)

Each rank appends to ``logs/myrun/rank<N>.log``: one fetch line per batch from
the DataLoader worker that built it, one training line per iteration.
PyTorch is imported only when a loader is instrumented; dsim never needs it.
Loops a framework runs: ``dsim.instrument.lightning.DsimCallback`` (Lightning),
``dsim.instrument.huggingface.DsimTrainerCallback`` and ``instrument_accelerate``
(transformers, accelerate); not imported here, so ``import dsim.instrument``
imports no framework.
"""

from __future__ import annotations

from dsim.instrument.gpu import GpuUtilRecorder
from dsim.instrument.lines import FileSink, LoggerSink, fetch_line, training_line
from dsim.instrument.loader import TimedDataset, instrument_loader
from dsim.instrument.timer import TrainingTimer

__all__ = [
    "FileSink",
    "GpuUtilRecorder",
    "LoggerSink",
    "TimedDataset",
    "TrainingTimer",
    "fetch_line",
    "instrument_loader",
    "training_line",
]
