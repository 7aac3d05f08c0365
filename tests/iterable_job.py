"""A real 2-rank DDP job (gloo, loopback) reading an IterableDataset, for tests/test_iterable.py.

``python tests/iterable_job.py OUT W [W ...]`` trains a tiny model for two
epochs once per worker count W, logging to ``OUT/w<W>/rank<r>.log`` through
``dsim.instrument``. Each rank streams its own samples; inside a rank the
workers shard the stream with ``get_worker_info``. With two workers the
shards are uneven (worker 0 gets two thirds of the batches), so worker 1
runs dry mid-epoch and the DataLoader's round-robin skips it from then on.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dsim.instrument import TrainingTimer, instrument_loader

BATCH = 4
BATCHES = 6  # per rank and epoch; with 2 workers: 4 from worker 0, 2 from worker 1
EPOCHS = 2
FEATURES = 8


class ShardedStream(IterableDataset):
    """``BATCHES * BATCH`` samples per rank, split between the DataLoader's workers."""

    def __init__(self, rank: int):
        self.rank = rank

    def __len__(self) -> int:
        return BATCHES * BATCH

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        samples = range(BATCHES * BATCH)
        if workers == 2:  # uneven on purpose: worker 0 streams the first 2/3
            cut = (2 * BATCHES // 3) * BATCH
            samples = samples[:cut] if worker == 0 else samples[cut:]
        else:
            samples = samples[worker::workers]
        generator = torch.Generator().manual_seed(1000 * self.rank)
        for i in samples:
            time.sleep(0.001 * (1 + self.rank))  # rank 1 reads twice as slowly
            yield torch.randn(FEATURES, generator=generator), i % 2


def train(rank: int, world: int, port: int, out: str, worker_counts: list[int]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = nn.parallel.DistributedDataParallel(nn.Linear(FEATURES, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for workers in worker_counts:
            log_dir = Path(out) / f"w{workers}"
            context = "fork" if workers else None  # fast here; spawn is tested by pickling
            plain = DataLoader(
                ShardedStream(rank),
                batch_size=BATCH,
                num_workers=workers,
                multiprocessing_context=context,
            )
            loader = instrument_loader(plain, log_dir=log_dir, rank=rank)
            timer = TrainingTimer(log_dir=log_dir, rank=rank)
            for epoch in range(EPOCHS):
                for x, y in timer.iterate(loader, epoch=epoch):
                    optimizer.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()  # the all-reduce
                    optimizer.step()
    finally:
        dist.destroy_process_group()


def main() -> None:
    out, worker_counts = sys.argv[1], [int(w) for w in sys.argv[2:]]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # fork: torch is imported once, not once per rank (the process group starts after it)
    mp.start_processes(train, args=(2, port, out, worker_counts), nprocs=2, start_method="fork")


if __name__ == "__main__":
    main()
