"""The physical DDP job of the fidelity harness: loading costs from a seeded cost table.

A sibling of ``examples/ddp_cpu.py``: 2-4 ranks train a tiny MLP with
DistributedDataParallel over gloo on 127.0.0.1 only, instrumented with
``dsim.instrument``. What differs is where loading time comes from: batch i
of epoch e on rank r costs exactly ``table[e, i, r]`` seconds
(``validation/regimes.py``), spread over the batch's samples with sleeps, and
each step adds ``compute_ms`` of simulated compute (a sleep after the step,
whose backward pass all-reduces the gradients, so the ranks stay in step).
Everything that should take time is a sleep, so 4 ranks with 4 workers each
run faithfully on 2 cores.

``--align min|mean`` applies an alignment *physically*: every rank's batch
(e, i) costs the min / the mean over ranks of the table's costs for (e, i).

    python -m validation.job --regime balanced --workers 2 --out /tmp/v --name A
    dsim parse /tmp/v/A
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dsim.instrument import TrainingTimer, instrument_loader
from validation.indexing import Layout, TableSampler
from validation.regimes import ALIGNS, REGIMES, Regime, align_table, cost_table

FEATURES = 16
CLASSES = 4


class TableDataset(Dataset):
    """Synthetic samples; reading batch (e, i) on rank r takes ``costs[e, i]`` seconds.

    ``__getitems__`` (which torch's fetcher, and dsim's wrapper, call with a
    whole batch) sleeps sample by sample towards deadlines measured from the
    batch's first read, so the batch costs its table entry plus one wake-up,
    not plus one wake-up per sample.
    """

    def __init__(self, layout: Layout, rank: int, costs: np.ndarray, seed: int):
        self.layout = layout
        self.rank = rank
        self.costs = costs  # [epochs, iterations] seconds, this rank's column
        self.seed = seed

    def __len__(self) -> int:
        return len(self.layout)

    def _sample(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return torch.randn(FEATURES, generator=g), int(index % CLASSES)

    def _cost(self, index: int) -> float:
        epoch, batch, rank, _ = self.layout.decode(index)
        if rank != self.rank:
            raise RuntimeError(f"rank {self.rank} was handed sample {index} of rank {rank}")
        return float(self.costs[epoch, batch])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self._cost(index) / self.layout.batch_size)
        return self._sample(index)

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        cells = {self.layout.decode(i)[:3] for i in indices}
        if len(cells) != 1:
            raise RuntimeError(f"one batch holds samples of several batches: {sorted(cells)}")
        cost = self._cost(indices[0])
        began = time.perf_counter()
        out = []
        for k, index in enumerate(indices, start=1):
            out.append(self._sample(index))
            left = began + cost * k / len(indices) - time.perf_counter()
            if left > 0:
                time.sleep(left)
        return out


def regime_of(args: argparse.Namespace) -> Regime:
    """The named regime with any numbers given on the command line instead."""
    base = REGIMES[args.regime]
    fields = ("batch_ms", "skew", "cv", "straggler_prob", "straggler_factor", "compute_ms")
    changes = {f: getattr(args, f) for f in fields if getattr(args, f) is not None}
    return Regime(**{**base.as_dict(), **changes})


def run_table(args: argparse.Namespace) -> np.ndarray:
    table = cost_table(regime_of(args), args.epochs, args.iterations, args.ranks, args.seed)
    return align_table(table, args.align)


def train(rank: int, world: int, args: argparse.Namespace, log_dir: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo on loopback only
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        layout = Layout(args.epochs, args.iterations, world, args.batch_size)
        table = run_table(args)
        dataset = TableDataset(layout, rank, table[:, :, rank], args.seed)
        sampler = TableSampler(layout, rank)
        extra = {"prefetch_factor": args.prefetch_factor} if args.workers > 0 else {}
        loader = DataLoader(
            dataset,
            batch_size=args.batch_size,
            sampler=sampler,
            num_workers=args.workers,
            persistent_workers=args.persistent_workers and args.workers > 0,
            **extra,
        )
        loader = instrument_loader(loader, log_dir=log_dir, rank=rank)
        timer = TrainingTimer(log_dir=log_dir, rank=rank, batch_size=args.batch_size)

        torch.manual_seed(args.seed)
        model = nn.parallel.DistributedDataParallel(
            nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        loss_fn = nn.CrossEntropyLoss()
        compute_s = regime_of(args).compute_ms / 1000
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for x, y in timer.iterate(loader, epoch=epoch):
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()  # all-reduce: the ranks wait for each other here
                optimizer.step()
                if compute_s:
                    time.sleep(compute_s)  # stands in for a bigger model's compute
        del loader  # stop the persistent workers now, not at interpreter exit
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, args: argparse.Namespace, log_dir: Path) -> None:
    train(rank, world, args, log_dir)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings(args: argparse.Namespace) -> dict[str, object]:
    """What the run did, written beside its logs as job.json (the loader settings included)."""
    return {
        "regime": regime_of(args).as_dict(),
        "ranks": args.ranks,
        "workers": args.workers,
        "prefetch_factor": args.prefetch_factor if args.workers > 0 else None,
        "persistent_workers": bool(args.persistent_workers and args.workers > 0),
        "align": args.align,
        "iterations": args.iterations,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "seed": args.seed,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--regime", choices=sorted(REGIMES), default="balanced")
    p.add_argument("--ranks", type=int, default=4, help="processes (2 in the smoke test)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--prefetch-factor", type=int, default=2)
    p.add_argument("--persistent-workers", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--align", choices=ALIGNS, default="none", help="physically applied")
    p.add_argument("--iterations", type=int, default=400, help="iterations per epoch")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8, help="per-rank batch size")
    p.add_argument("--seed", type=int, default=0, help="seeds the cost table and the data")
    group = p.add_argument_group("regime numbers (override the regime's)")
    group.add_argument("--batch-ms", type=float, help="mean loading cost of a batch on rank 0")
    group.add_argument("--skew", type=float, help="last rank is (1 + skew) times slower")
    group.add_argument("--cv", type=float, help="per-batch lognormal noise (coeff. of var.)")
    group.add_argument("--straggler-prob", type=float)
    group.add_argument("--straggler-factor", type=float)
    group.add_argument("--compute-ms", type=float, help="simulated compute per step")
    p.add_argument("--out", default="validation/runs", help="parent of the run directory")
    p.add_argument("--name", required=True, help="run directory name")
    args = p.parse_args(argv)
    if min(args.ranks, args.epochs, args.iterations, args.batch_size, args.prefetch_factor) < 1:
        p.error("--ranks, --epochs, --iterations, --batch-size, --prefetch-factor must be >= 1")
    if args.workers < 0:
        p.error("--workers must be >= 0")
    numbers = (args.batch_ms, args.skew, args.cv, args.straggler_prob, args.compute_ms)
    if any(v is not None and v < 0 for v in numbers) or (args.straggler_factor or 1) < 1:
        p.error("regime numbers must be >= 0 (--straggler-factor >= 1)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    log_dir = Path(args.out) / args.name
    log_dir.mkdir(parents=True, exist_ok=True)
    for stale in log_dir.glob("rank*.log*"):  # loggers append: a new run starts empty
        stale.unlink()
    (log_dir / "job.json").write_text(json.dumps(settings(args), indent=2) + "\n")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    # fork: the ranks (and their DataLoader workers) need not import torch again, which takes
    # seconds per process; the parent has started no threads or process group to inherit.
    method = "fork" if sys.platform == "linux" else "spawn"
    if method == "fork":
        import torch._dynamo  # noqa: F401  (DDP imports it lazily: seconds, once per rank)
    mp.start_processes(
        _spawned, args=(args.ranks, args, log_dir), nprocs=args.ranks, start_method=method
    )


if __name__ == "__main__":
    sys.exit(main())
