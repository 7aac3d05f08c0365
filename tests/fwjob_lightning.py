"""A tiny Lightning DDP job (2 CPU ranks, gloo on loopback) instrumented by dsim's callback.

Run by tests/test_instrument_lightning.py as ``python fwjob_lightning.py LOG_DIR
ITERATIONS``; Lightning's ``ddp`` strategy starts rank 1 by running this file again.
The LightningModule is plain Lightning: the callback is the only dsim line.
"""

from __future__ import annotations

import sys
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from dsim.instrument.lightning import DsimCallback

BATCH, EPOCHS, RANKS, WORKERS = 8, 2, 2, 2


class Samples(Dataset):
    """Random features; rank 1's samples take longer to read (a slow loader to find)."""

    def __init__(self, size: int, rank: int):
        self.rank = rank
        self.x = torch.randn(size, 16, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.001 * (1 + 2 * self.rank))
        return self.x[index], self.x[index].sum(0, keepdim=True)


class Model(pl.LightningModule):
    def __init__(self, iterations: int):
        super().__init__()
        self.net = torch.nn.Linear(16, 1)
        self.iterations = iterations

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        data = Samples(self.iterations * BATCH * RANKS, self.global_rank)
        return DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=WORKERS)


def main(log_dir: str, iterations: int) -> None:
    torch.set_num_threads(1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=RANKS,
        strategy="ddp",
        max_epochs=EPOCHS,
        callbacks=[DsimCallback(log_dir=log_dir)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Model(iterations))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
