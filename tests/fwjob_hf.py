"""A tiny Hugging Face DDP job (2 CPU ranks under torchrun, gloo on loopback) logged by dsim.

Run by tests/test_instrument_hf.py as ``torchrun --nproc_per_node 2 fwjob_hf.py
MODE LOG_ROOT ITERATIONS`` with MODE ``trainer`` (transformers.Trainer with
DsimTrainerCallback, logs in LOG_ROOT/trainer), ``accelerate`` (a plain
accelerate loop with instrument_accelerate, LOG_ROOT/accelerate) or ``both``.
The model and data are plain PyTorch. Every loop accumulates gradients over 2
batches (``gradient_accumulation_steps``; accelerate's ``accumulate``).

Resuming mid-epoch, into the first job's log directory (LOG_ROOT/trainer-cut): a
Trainer stops (``max_steps``) at the checkpoint it saves mid-epoch 1; a second
Trainer resumes from it (``resume_from_checkpoint``, which skips the epoch's
first SKIP batches through accelerate's ``skip_first_batches``) and stops 3
optimizer steps into epoch 2. The accelerate mode also runs a resumed loop in
LOG_ROOT/accelerate-resumed: epoch 1 from batch SKIP (``skip_first_batches``,
instrumented too), then epoch 2.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

BATCH, EPOCHS, RANKS, WORKERS = 8, 2, 2, 2
ACCUMULATE, SAVE_STEP, CUT_STEPS = 2, 9, 3  # batches per step; checkpoint; epoch 2's steps
SKIP = 6  # batches of epoch 1 done at the checkpoint: (SAVE_STEP - 6 steps of epoch 0) * 2


class Samples(Dataset):
    """Random features; rank 1's samples take longer to read (a slow loader to find)."""

    def __init__(self, size: int, rank: int):
        self.rank = rank
        self.x = torch.randn(size, 16, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        time.sleep(0.001 * (1 + 2 * self.rank))
        return {"x": self.x[index], "labels": self.x[index].sum(0, keepdim=True)}


class Model(torch.nn.Module):
    """Returns its loss, as the Trainer expects of a model given labels."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 1)

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}


def trainer(log_dir: str, data: Dataset, iterations: int) -> None:
    """Two epochs; then, logging into one other directory, a Trainer that stops at its
    checkpoint at step SAVE_STEP (mid-epoch 1) and one that resumes from it and stops
    CUT_STEPS steps into epoch 2 (``max_steps``)."""
    from transformers import Trainer

    from dsim.instrument.huggingface import DsimTrainerCallback

    args = _arguments(os.path.join(log_dir, "..", "..", "hf-output"), save_strategy="no")
    callback = DsimTrainerCallback(log_dir=log_dir)
    Trainer(Model(), args, train_dataset=data, callbacks=[callback]).train()

    output = os.path.join(log_dir, "..", "..", "hf-output-cut")
    args = _arguments(output, save_strategy="steps", save_steps=SAVE_STEP, max_steps=SAVE_STEP)
    callback = DsimTrainerCallback(log_dir=log_dir + "-cut")
    Trainer(Model(), args, train_dataset=data, callbacks=[callback]).train()

    steps = EPOCHS * iterations // ACCUMULATE + CUT_STEPS
    args = _arguments(output, save_strategy="no", max_steps=steps)
    callback = DsimTrainerCallback(log_dir=log_dir + "-cut")
    resumed = Trainer(Model(), args, train_dataset=data, callbacks=[callback])
    resumed.train(resume_from_checkpoint=os.path.join(output, f"checkpoint-{SAVE_STEP}"))


def _arguments(output: str, **more):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=output,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATE,
        num_train_epochs=EPOCHS,
        dataloader_num_workers=WORKERS,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
        **more,
    )


def accelerate(log_dir: str, data: Dataset) -> None:
    from accelerate import Accelerator

    from dsim.instrument.huggingface import instrument_accelerate

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=WORKERS)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loader = instrument_accelerate(loader, log_dir=log_dir)
    for _ in range(EPOCHS):
        _train(accelerator, model, optimizer, loader)

    # Resumed at batch SKIP of epoch 1 (the checkpoint's state loading left out), as
    # accelerate's examples resume: the rebuilt loader for that epoch, the prepared one after.
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=WORKERS)
    loader = instrument_accelerate(accelerator.prepare(loader), log_dir=log_dir + "-resumed")
    for epoch in (1, EPOCHS):
        loader.set_epoch(epoch)
        active = loader
        if epoch == 1:
            active = instrument_accelerate(accelerator.skip_first_batches(loader, SKIP))
        _train(accelerator, model, optimizer, active)


def _train(accelerator, model, optimizer, loader) -> None:
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch)["loss"]
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()


def main(mode: str, log_dir: str, iterations: int) -> None:
    torch.set_num_threads(1)
    data = Samples(iterations * BATCH * RANKS, int(os.environ["RANK"]))
    if mode in ("trainer", "both"):
        trainer(os.path.join(log_dir, "trainer"), data, iterations)
    if mode in ("accelerate", "both"):
        accelerate(os.path.join(log_dir, "accelerate"), data)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
