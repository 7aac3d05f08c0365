"""A tiny Lightning DDP job (2 CPU ranks, gloo on loopback) instrumented by dsim's callback.

Run by tests/test_instrument_lightning.py as ``python fwjob_lightning.py LOG_ROOT
ITERATIONS``; Lightning's ``ddp`` strategy starts rank 1 by running this file again.
The LightningModule is plain Lightning: the callback is the only dsim line. Four fits,
each accumulating gradients over 2 batches (``accumulate_grad_batches``):

1. epoch 0, saving a checkpoint every 2 optimizer steps and one at its end;
2. epoch 1, resumed from the end-of-epoch checkpoint (``ckpt_path``), logging in the
   same LOG_ROOT/lightning: one run of 2 epochs;
3. resumed from the mid-epoch checkpoint (step 2: 4 batches in) and stopped by
   ``max_steps`` 2 steps later (LOG_ROOT/lightning-cut);
4. resumed from it again, to the end of epoch 0 (LOG_ROOT/lightning-resumed).
"""

from __future__ import annotations

import sys
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

from dsim.instrument.lightning import DsimCallback

BATCH, EPOCHS, RANKS, WORKERS = 8, 2, 2, 2
ACCUMULATE, SAVE_EVERY = 2, 2  # batches per optimizer step; steps between checkpoints
STEP_S = 0.02  # each training step sleeps: an iteration without its step shows


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
        time.sleep(STEP_S)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        data = Samples(self.iterations * BATCH * RANKS, self.global_rank)
        return DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=WORKERS)


def fit(log_dir: str, iterations: int, epochs: int, ckpt: str | None, **more) -> str:
    """One fit of ``epochs`` epochs in all, resumed from ``ckpt``; its checkpoint's path."""
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=RANKS,
        strategy="ddp",
        max_epochs=epochs,
        accumulate_grad_batches=ACCUMULATE,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[DsimCallback(log_dir=log_dir), *more.pop("callbacks", [])],
        **more,
    )
    trainer.fit(Model(iterations), ckpt_path=ckpt)
    path = f"epoch{epochs - 1}.ckpt"
    trainer.save_checkpoint(path)
    return path


def main(log_root: str, iterations: int) -> None:
    torch.set_num_threads(1)
    logs = f"{log_root}/lightning"
    every = ModelCheckpoint(dirpath="steps", every_n_train_steps=SAVE_EVERY, save_top_k=-1)
    end = fit(logs, iterations, 1, None, callbacks=[every])
    fit(logs, iterations, 2, end, enable_checkpointing=False)
    middle = f"steps/epoch=0-step={SAVE_EVERY}.ckpt"
    steps = 2 * SAVE_EVERY
    fit(
        f"{log_root}/lightning-cut",
        iterations,
        1,
        middle,
        max_steps=steps,
        enable_checkpointing=False,
    )
    fit(f"{log_root}/lightning-resumed", iterations, 1, middle, enable_checkpointing=False)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
