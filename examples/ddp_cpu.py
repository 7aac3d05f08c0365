"""A real PyTorch DDP training job on CPU, instrumented for dsim.

Each rank trains a tiny MLP with DistributedDataParallel (gloo backend, on
127.0.0.1 only) on a synthetic dataset whose per-sample loading cost grows
with the rank (``--skew``) and where a few samples are much slower than the
rest (``--straggler-prob``): the uneven data loading dsim is about. Every rank
logs its fetches and iterations with ``dsim.instrument`` into one run
directory, ready for ``dsim parse``:

    python examples/ddp_cpu.py --ranks 2 --epochs 2 --iterations 50 --out logs
    dsim parse logs/cpuDDP_synthetic_none_mlp_epoch2_b64_worker2_thread0

With ``--profile DIR`` each rank also records ``torch.profiler`` traces (CPU
activities, Chrome-trace JSON, gzip'd) of a window of steps into DIR, one
file per rank, as ``tensorboard_trace_handler`` writes them.

Starts its ranks with ``torch.multiprocessing`` (default) or under ``torchrun``
(which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from dsim.instrument import TrainingTimer, instrument_loader

FEATURES = 16
CLASSES = 4


class SlowSynthetic(Dataset):
    """Random features whose loading cost depends on the reading rank and on the sample.

    A sample costs ``base_ms * (1 + skew * rank)``; with probability
    ``straggler_prob`` (decided by a hash of seed and index, so it is the same
    sample on every run) it costs ``straggler_ms`` more, like a large image.
    """

    def __init__(self, size: int, rank: int, args: argparse.Namespace):
        self.size = size
        self.seed = args.seed
        self.cost_s = args.sample_ms * (1 + args.skew * rank) / 1000
        self.straggler_s = args.straggler_ms / 1000
        self.straggler_prob = args.straggler_prob

    def __len__(self) -> int:
        return self.size

    def _uniform(self, index: int) -> float:
        digest = hashlib.blake2b(f"{self.seed}:{index}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") / 2**64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        cost = self.cost_s
        if self._uniform(index) < self.straggler_prob:
            cost += self.straggler_s
        time.sleep(cost)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(FEATURES, generator=g)
        return x, int(index % CLASSES)


#: The dataset field of this example's run names. Not the shipped sample's
#: ``synthetic``: `dsim parse logs --out traces` of a run of this script must not
#: replace the sample's trace of the same settings (traces/README.md says how the
#: samples were made, with --name).
DATASET = "example"


def run_name(args: argparse.Namespace) -> str:
    """The original analysis's naming scheme, so dsim fills in the run's metadata."""
    return (
        f"cpuDDP_{DATASET}_none_mlp_epoch{args.epochs}_b{args.batch_size * args.ranks}"
        f"_worker{args.workers}_thread0"
    )


def train(rank: int, world: int, args: argparse.Namespace) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo on loopback only
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        log_dir = Path(args.out) / (args.name or run_name(args))
        dataset = SlowSynthetic(args.iterations * args.batch_size * world, rank, args)
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=args.seed)
        loader = DataLoader(
            dataset,
            batch_size=args.batch_size,
            sampler=sampler,
            num_workers=args.workers,
            persistent_workers=args.workers > 0,
            drop_last=True,
        )
        loader = instrument_loader(loader, log_dir=log_dir, rank=rank)
        timer = TrainingTimer(log_dir=log_dir, rank=rank, batch_size=args.batch_size)

        torch.manual_seed(args.seed)
        model = nn.parallel.DistributedDataParallel(
            nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        loss_fn = nn.CrossEntropyLoss()
        with _profiler(args, rank) as prof:
            for epoch in range(args.epochs):
                sampler.set_epoch(epoch)
                for x, y in timer.iterate(loader, epoch=epoch):
                    optimizer.zero_grad()
                    loss = loss_fn(model(x), y)
                    loss.backward()  # all-reduce: the ranks wait for each other here
                    optimizer.step()
                    if args.step_ms:
                        time.sleep(args.step_ms / 1000)  # stands in for a bigger model's compute
                    if prof is not None:
                        prof.step()
        del loader  # stop the persistent workers now, not at interpreter exit
        if rank == 0:
            print(f"logs written to {log_dir}", flush=True)
    finally:
        dist.destroy_process_group()


def _profiler(args: argparse.Namespace, rank: int):
    """``torch.profiler`` on CPU writing ``rank<N>.<time>.pt.trace.json.gz`` under ``--profile``.

    Steps ``--profile-skip`` + 1 onwards are recorded (one warm-up step before
    them), ``--profile-steps`` of them. The file name carries the rank, and the
    trace its ``distributedInfo``: either one tells dsim the rank.
    """
    if not args.profile:
        return contextlib.nullcontext(None)
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    return profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=args.profile_skip, warmup=1, active=args.profile_steps, repeat=1),
        on_trace_ready=tensorboard_trace_handler(
            args.profile, worker_name=f"rank{rank}", use_gzip=True
        ),
    )


def _spawned(rank: int, world: int, args: argparse.Namespace) -> None:
    train(rank, world, args)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="processes (2-4 is typical)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--iterations", type=int, default=50, help="iterations per epoch")
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--sample-ms", type=float, default=0.3, help="loading cost of one sample")
    p.add_argument("--skew", type=float, default=0.5, help="extra cost per rank, as a fraction")
    p.add_argument("--straggler-prob", type=float, default=0.01, help="share of slow samples")
    p.add_argument("--straggler-ms", type=float, default=40.0, help="extra cost of a slow one")
    p.add_argument("--step-ms", type=float, default=5.0, help="simulated compute per step")
    p.add_argument("--out", default="logs", help="parent of the run directory")
    p.add_argument(
        "--name",
        default=None,
        help="run directory name (default: cpuDDP_example_..., from settings)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default=None, metavar="DIR", help="also write profiler traces")
    p.add_argument("--profile-skip", type=int, default=5, help="steps before the profiled ones")
    p.add_argument("--profile-steps", type=int, default=30, help="steps profiled")
    args = p.parse_args(argv)
    if args.ranks < 1 or args.epochs < 1 or args.iterations < 1 or args.batch_size < 1:
        p.error("--ranks, --epochs, --iterations and --batch-size must be >= 1")
    if args.workers < 0 or args.skew < 0 or not 0 <= args.straggler_prob <= 1:
        p.error("--workers and --skew must be >= 0, --straggler-prob within [0, 1]")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        args.ranks = int(os.environ["WORLD_SIZE"])
        train(int(os.environ["RANK"]), args.ranks, args)
        return
    log_dir = Path(args.out) / (args.name or run_name(args))
    for stale in log_dir.glob("rank*.log"):  # loggers append: a new run starts empty
        stale.unlink()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    # fork: the ranks (and their DataLoader workers) need not import torch again, which takes
    # seconds per process; the parent has started no threads or process group to inherit.
    method = "fork" if sys.platform == "linux" else "spawn"
    if method == "fork":
        import torch._dynamo  # noqa: F401  (DDP imports it lazily: seconds, once per rank)
    mp.start_processes(_spawned, args=(args.ranks, args), nprocs=args.ranks, start_method=method)


if __name__ == "__main__":
    sys.exit(main())
