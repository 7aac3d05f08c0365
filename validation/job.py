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

How a cost is spent depends on the regime's ``kind`` (``validation/regimes.py``):
a sleep (``sleep``), CPU work calibrated in units per millisecond of one
uncontended core (``cpu``; ``--cpu-units-per-ms``, measured once by the sweep),
half of each (``mixed``), or real JPEG decoding with a small conv net as
compute (``decode``). In cpu and mixed regimes ``compute_ms`` is CPU work too.

``--align min|mean`` applies an alignment *physically*: every rank's batch
(e, i) costs the min / the mean over ranks of the table's costs for (e, i)
(not in the decode regime). ``--start-align min|max|control`` aligns fetch
*starts* through a shared-memory board (``validation/startalign.py``) and
writes ``start_align.json``. ``--device cuda`` is the GPU variant: NCCL, the
conv net on the GPU, real decoding, ``pin_memory=True`` (decode regime only).

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
from validation import startalign
from validation.cpuwork import calibrate, work_ms
from validation.indexing import Layout, TableSampler
from validation.machine import NODE_CPU_FILE, NodeSamples
from validation.regimes import ALIGNS, REGIMES, Regime, align_table, cost_table, size_factors
from validation.startalign import StartGate

FEATURES = 16
CLASSES = 4


class TableDataset(Dataset):
    """Synthetic samples; reading batch (e, i) on rank r takes ``costs[e, i]`` seconds.

    ``__getitems__`` (which torch's fetcher, and dsim's wrapper, call with a
    whole batch) sleeps sample by sample towards deadlines measured from the
    batch's first read, so the batch costs its table entry plus one wake-up,
    not plus one wake-up per sample.
    """

    def __init__(
        self,
        layout: Layout,
        rank: int,
        costs: np.ndarray,
        seed: int,
        kind: str = "sleep",
        units_per_ms: float | None = None,
        gate: StartGate | None = None,
    ):
        self.layout = layout
        self.rank = rank
        self.costs = costs  # [epochs, iterations] seconds, this rank's column
        self.seed = seed
        self.kind = kind
        self.units_per_ms = units_per_ms
        self.gate = gate
        if kind in ("cpu", "mixed") and not units_per_ms:
            raise ValueError(f"a {kind} regime needs the CPU calibration (units per ms)")

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

    def _spend(self, seconds: float) -> None:
        """One sample's share of a batch's cost, spent as the regime's kind says."""
        if self.kind == "cpu":
            work_ms(seconds * 1e3, self.units_per_ms)
        elif self.kind == "mixed":  # CPU work, then the waiting half (a plain sleep)
            work_ms(seconds * 500, self.units_per_ms)
            time.sleep(seconds / 2)
        else:
            time.sleep(seconds)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        self._spend(self._cost(index) / self.layout.batch_size)
        return self._sample(index)

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        cell = batch_cell(self.layout, indices)
        if self.gate is not None:
            self.gate.enter(*cell)
        cost = self._cost(indices[0])
        began = time.perf_counter()
        out = []
        for k, index in enumerate(indices, start=1):
            out.append(self._sample(index))
            if self.kind != "sleep":  # work is not a deadline: it stretches under contention
                self._spend(cost / len(indices))
                continue
            left = began + cost * k / len(indices) - time.perf_counter()
            if left > 0:
                time.sleep(left)
        return out


def batch_cell(layout: Layout, indices: list[int]) -> tuple[int, int, int]:
    """(epoch, batch, rank) of a whole batch; RuntimeError when it mixes cells."""
    cells = {layout.decode(i)[:3] for i in indices}
    if len(cells) != 1:
        raise RuntimeError(f"one batch holds samples of several batches: {sorted(cells)}")
    return next(iter(cells))


class DecodeDataset(Dataset):
    """The decode regime: every sample decodes its batch's JPEG, crops, flips (Pillow).

    The JPEGs are generated here, before the loader starts (not timed): one per
    batch of this rank, sized by ``size_factors`` (``validation/decode.py``).
    """

    def __init__(
        self,
        layout: Layout,
        rank: int,
        regime: Regime,
        factors: np.ndarray,
        seed: int,
        gate: StartGate | None = None,
    ):
        from validation.decode import image_side, make_jpeg

        self.layout, self.rank, self.seed, self.gate = layout, rank, seed, gate
        self.crop_px = regime.crop_px
        # one JPEG per batch; batches of equal (rounded) size share it: the decode is
        # real work each time, and building the dataset stays short
        made: dict[int, bytes] = {}
        self.jpegs = []
        for row in factors:  # factors: [epochs, iterations], this rank's column
            sides = [image_side(regime.image_px, regime.crop_px, f) for f in row]
            for side in sides:
                if side not in made:
                    made[side] = make_jpeg((seed, rank, side), side, side)
            self.jpegs.append([made[side] for side in sides])

    def __len__(self) -> int:
        return len(self.layout)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from validation.decode import augment

        epoch, batch, rank, _ = self.layout.decode(index)
        if rank != self.rank:
            raise RuntimeError(f"rank {self.rank} was handed sample {index} of rank {rank}")
        pixels = augment(self.jpegs[epoch][batch], self.crop_px, self.seed * 1_000_003 + index)
        return torch.from_numpy(pixels), int(index % CLASSES)

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        cell = batch_cell(self.layout, indices)
        if self.gate is not None:
            self.gate.enter(*cell)
        return [self.__getitem__(i) for i in indices]


def conv_net() -> nn.Module:
    """The decode regime's model: small enough for one CPU thread, real convolutions."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, CLASSES),
    )


def regime_of(args: argparse.Namespace) -> Regime:
    """The named regime with any numbers given on the command line instead."""
    base = REGIMES[args.regime]
    fields = ("batch_ms", "skew", "cv", "straggler_prob", "straggler_factor", "compute_ms")
    changes = {f: getattr(args, f) for f in fields if getattr(args, f) is not None}
    return Regime(**{**base.as_dict(), **changes})


def run_table(args: argparse.Namespace) -> np.ndarray:
    table = cost_table(regime_of(args), args.epochs, args.iterations, args.ranks, args.seed)
    return align_table(table, args.align)


def make_dataset(rank: int, world: int, args: argparse.Namespace) -> Dataset:
    layout = Layout(args.epochs, args.iterations, world, args.batch_size)
    regime = regime_of(args)
    gate = None
    if args.start_align != "none":
        gate = StartGate(args.board, args.start_align, (args.epochs, args.iterations, world))
    if regime.kind == "decode":
        factors = size_factors(regime, args.epochs, args.iterations, world, args.seed)
        return DecodeDataset(layout, rank, regime, factors[:, :, rank], args.seed, gate)
    table = run_table(args)
    return TableDataset(
        layout, rank, table[:, :, rank], args.seed, regime.kind, args.cpu_units_per_ms, gate
    )


def train(rank: int, world: int, args: argparse.Namespace, log_dir: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo on loopback only
    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    device = torch.device("cuda", gpu_of(rank, args)) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend_of(args), rank=rank, world_size=world)
    try:
        regime = regime_of(args)
        layout = Layout(args.epochs, args.iterations, world, args.batch_size)
        dataset = make_dataset(rank, world, args)
        sampler = TableSampler(layout, rank)
        extra = {"prefetch_factor": args.prefetch_factor} if args.workers > 0 else {}
        loader = DataLoader(
            dataset,
            batch_size=args.batch_size,
            sampler=sampler,
            num_workers=args.workers,
            persistent_workers=args.persistent_workers and args.workers > 0,
            pin_memory=cuda,
            **extra,
        )
        loader = instrument_loader(loader, log_dir=log_dir, rank=rank)
        timer = TrainingTimer(log_dir=log_dir, rank=rank, batch_size=args.batch_size)

        torch.manual_seed(args.seed)
        if regime.kind == "decode":
            net = conv_net()
        else:
            net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
        net = net.to(device)
        ids = [device.index] if cuda else None
        model = nn.parallel.DistributedDataParallel(net, device_ids=ids)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        loss_fn = nn.CrossEntropyLoss()
        compute_ms = regime.compute_ms
        node = NodeSamples(log_dir) if rank == 0 else None  # one node: one rank samples it
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for x, y in timer.iterate(loader, epoch=epoch):
                if node is not None:
                    node.sample(epoch)
                x, y = x.to(device, non_blocking=cuda), y.to(device, non_blocking=cuda)
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()  # all-reduce: the ranks wait for each other here
                optimizer.step()
                if cuda:
                    torch.cuda.synchronize(device)  # the step's GPU work is part of the step
                if not compute_ms:
                    continue
                if regime.kind in ("cpu", "mixed"):  # the trainer competes for the cores
                    work_ms(compute_ms, args.cpu_units_per_ms)
                else:
                    time.sleep(compute_ms / 1000)  # stands in for a bigger model's compute
        if node is not None:
            node.sample(args.epochs)  # the end of the last iteration
            node.write()
        del loader  # stop the persistent workers now, not at interpreter exit
    finally:
        dist.destroy_process_group()


def gpu_of(rank: int, args: argparse.Namespace) -> int:
    """Rank r's GPU: its own, or with ``--share-gpus`` r mod the GPUs there are."""
    return rank % args.gpus if args.share_gpus else rank


def backend_of(args: argparse.Namespace) -> str:
    """NCCL where every rank has a GPU of its own; gloo on the CPU and for shared GPUs.

    NCCL refuses two ranks on one device, and gloo all-reduces CUDA tensors (through
    host memory), so ranks that share a GPU still run DDP with CUDA compute.
    """
    if args.device != "cuda" or (args.share_gpus and args.ranks > args.gpus):
        return "gloo"
    return "nccl"


def rank_cpus(rank: int, world: int, cpus: list[int]) -> list[int]:
    """Rank ``rank``'s own share of ``cpus`` under ``--bind``: consecutive slices, or, with
    more ranks than CPUs, CPU ⌊r k / R⌋ (ranks 0, 1 on the first of 2, ranks 2, 3 on the
    second)."""
    k = len(cpus)
    if world <= k:
        return cpus[rank * k // world : (rank + 1) * k // world]
    return [cpus[rank * k // world]]


def _spawned(rank: int, world: int, args: argparse.Namespace, log_dir: Path) -> None:
    if args.bind:  # before any worker forks: they inherit the mask
        os.sched_setaffinity(0, rank_cpus(rank, world, sorted(os.sched_getaffinity(0))))
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
        "start_align": args.start_align,
        "device": args.device,
        "backend": backend_of(args),
        "gpus": args.gpus if args.device == "cuda" else None,
        "share_gpus": bool(args.share_gpus),
        "pin_memory": args.device == "cuda",
        "cpu_units_per_ms": args.cpu_units_per_ms,
        "cpu_calibrated_by": args.calibrated_by,
        "cores_available": cores_available(),
        "bind": bool(args.bind),
        "local_world_size": args.ranks,
        "iterations": args.iterations,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "seed": args.seed,
    }


def cores_available() -> int:
    """Cores this process may run on (its affinity mask), as the ranks and workers inherit it."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--regime", choices=sorted(REGIMES), default="balanced")
    p.add_argument("--ranks", type=int, default=4, help="processes (2 in the smoke test)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--prefetch-factor", type=int, default=2)
    p.add_argument("--persistent-workers", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--align", choices=ALIGNS, default="none", help="physically applied")
    p.add_argument(
        "--start-align",
        choices=startalign.MODES,
        default="none",
        help="align fetch starts over ranks through shared memory (validation/startalign.py)",
    )
    p.add_argument(
        "--cpu-units-per-ms",
        type=float,
        help="CPU work units per ms of one uncontended core (cpu/mixed; default: measure now)",
    )
    p.add_argument(
        "--bind",
        action="store_true",
        help="bind each rank and its workers to its own share of the CPUs (as srun "
        "--cpu-bind does): with 4 ranks on 2, ranks 0-1 on the first, 2-3 on the second",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--share-gpus",
        action="store_true",
        help="--device cuda with more ranks than GPUs: rank r on GPU r mod G, gloo for the "
        "all-reduce (NCCL refuses two ranks on one GPU)",
    )
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
    if args.cpu_units_per_ms is not None and args.cpu_units_per_ms <= 0:
        p.error("--cpu-units-per-ms must be > 0")
    kind = REGIMES[args.regime].kind
    if kind == "decode" and args.align != "none":
        p.error("--align: the decode regime has no cost table to align (start alignment works)")
    if args.device == "cuda" and kind != "decode":
        p.error("--device cuda runs the decode regime only (--regime decode)")
    if args.share_gpus and args.device != "cuda":
        p.error("--share-gpus needs --device cuda")
    args.calibrated_by = "argument" if args.cpu_units_per_ms else None
    args.board = None
    args.gpus = None
    return args


def check_cuda(ranks: int, share: bool = False) -> str | None:
    """Why ``--device cuda`` cannot run here (None when it can).

    One GPU per rank and NCCL, or with ``share`` (``--share-gpus``) at least one GPU.
    """
    if not torch.cuda.is_available():
        return "--device cuda: CUDA is not available here (use --device cpu, or a GPU machine)"
    found = torch.cuda.device_count()
    if found < ranks and not share:
        return (
            f"--device cuda: {ranks} ranks need {ranks} GPUs, {found} found "
            "(--share-gpus puts several ranks on one GPU)"
        )
    if found >= ranks and not dist.is_nccl_available():
        return "--device cuda: this PyTorch build has no NCCL"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        if why := check_cuda(args.ranks, args.share_gpus):
            print(f"validation.job: error: {why}", file=sys.stderr)
            return 2
        args.gpus = torch.cuda.device_count()
    spends_cpu = REGIMES[args.regime].kind in ("cpu", "mixed")
    if spends_cpu and args.cpu_units_per_ms is None:
        args.cpu_units_per_ms, args.calibrated_by = calibrate(), "job"
    log_dir = Path(args.out) / args.name
    log_dir.mkdir(parents=True, exist_ok=True)
    for stale in [
        *log_dir.glob("rank*.log*"),
        log_dir / "start_align.json",
        log_dir / NODE_CPU_FILE,
    ]:
        stale.unlink(missing_ok=True)  # loggers append: a new run starts empty
    record = settings(args)
    (log_dir / "job.json").write_text(json.dumps(record, indent=2) + "\n")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ["LOCAL_WORLD_SIZE"] = str(args.ranks)  # all ranks run on this node
    shape = (args.epochs, args.iterations, args.ranks)
    speed = [calibrate()] if spends_cpu else []  # before the board: nothing to clean up yet
    if args.start_align != "none":  # before the ranks fork: they and their workers share it
        args.board = startalign.create_board(*shape, tag=str(os.getpid()))
    try:
        _start(args, log_dir)
        if spends_cpu:  # the machine's speed just before and after, alone (no rank runs)
            speed.append(calibrate())
            record["cpu_speed_units_per_ms"] = speed
            (log_dir / "job.json").write_text(json.dumps(record, indent=2) + "\n")
        if args.board is not None:
            startalign.write_summary(
                args.board, args.start_align, shape, log_dir / "start_align.json"
            )
    finally:
        if args.board is not None:
            startalign.remove_board(args.board)
    return 0


def _start(args: argparse.Namespace, log_dir: Path) -> None:
    # fork: the ranks (and their DataLoader workers) need not import torch again, which takes
    # seconds per process; the parent has started no threads or process group to inherit.
    # The GPU variant spawns: the parent asked the driver for devices (check_cuda), and a
    # forked child must not inherit CUDA state.
    method = "fork" if sys.platform == "linux" and args.device == "cpu" else "spawn"
    if method == "fork":
        import torch._dynamo  # noqa: F401  (DDP imports it lazily: seconds, once per rank)
    mp.start_processes(
        _spawned, args=(args.ranks, args, log_dir), nprocs=args.ranks, start_method=method
    )


if __name__ == "__main__":
    sys.exit(main())
