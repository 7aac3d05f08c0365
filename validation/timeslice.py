"""A unit of work's CPU time when processes take turns on one core.

Why: the pipeline model keeps each batch's CPU time from the run it calibrates
on and stretches only its wall time by the contention it solves for. In the
decode regime that is where its worker what-ifs miss: the same batches cost
1-12 % more CPU seconds with more workers (``cpugrowth.py``), while the cpu
regime's hashing does not grow. This measures the mechanism directly, away
from the job: ``k`` processes pinned to one core, each doing the same units of
work (a decode regime sample: JPEG decode, crop, flip; or the cpu regime's
hashing), started together so that the scheduler slices the core between
them. A process's CPU time per unit, against the same work alone, is what
taking turns costs it: each turn starts with caches the others filled.
``--beside-train`` measures every cell again with the decode regime's
training step (``job.conv_net``, forward, backward, SGD on one thread) taking
turns on the first core too: in the job a loader worker shares its core with
a training process, not only with other workers. Repeats are interleaved
(every ``k`` once per round, the order rotated).

    python -m validation.timeslice [--processes 1,2,4,8] [--repeats 5] [--cores 1]
        [--beside-train]
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import queue
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

WORKS = ("decode", "spin")
#: The decode regime's image and crop sides (``regimes.py``'s decode regime).
IMAGE_PX, CROP_PX = 448, 96
#: Hash rounds of one spin unit (about a millisecond of one core).
SPIN_ROUNDS = 1_000
WARMUP = 10
#: Seconds a process waits at the start for the others (one that died never comes).
START_TIMEOUT_S = 120


def unit_of(work: str, seed: int) -> Callable[[int], object]:
    """One unit of ``work`` as a call (index → result); each process its own image."""
    if work == "decode":
        from validation.decode import augment, make_jpeg

        jpeg = make_jpeg((seed, 7), IMAGE_PX, IMAGE_PX)
        return lambda i: augment(jpeg, CROP_PX, i)
    if work == "spin":
        from validation.cpuwork import spin

        return lambda _i: spin(SPIN_ROUNDS)
    raise ValueError(f"work {work!r}: one of {', '.join(WORKS)}")


def _turns(work: str, seed: int, units: int, core: int, start, out) -> None:
    """A child: pinned to ``core``, warm, then wait for the others and time ``units``."""
    os.sched_setaffinity(0, {core})
    unit = unit_of(work, seed)
    for i in range(WARMUP):
        unit(i)
    start.wait(timeout=START_TIMEOUT_S)
    t0 = time.thread_time()
    for i in range(units):
        unit(i)
    out.put((time.thread_time() - t0) * 1e3 / units)


def _trainer(core: int, start, stop) -> None:
    """A child: the decode regime's training step (``job.conv_net`` on a batch of crops,
    forward, backward, SGD, one thread) over and over on ``core`` until ``stop``."""
    os.sched_setaffinity(0, {core})
    import torch
    from torch import nn

    from validation.job import CLASSES, conv_net

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net, loss_fn = conv_net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    x, y = torch.rand(8, 3, CROP_PX, CROP_PX), torch.randint(0, CLASSES, (8,))

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(net(x), y).backward()
        optimizer.step()

    for _ in range(WARMUP):
        step()
    start.wait(timeout=START_TIMEOUT_S)
    while not stop.is_set():
        step()


def measure(
    work: str, processes: int, units: int, cores: Sequence[int], beside: str | None = None
) -> float:
    """Mean CPU ms per unit over ``processes`` processes pinned round-robin to ``cores``
    (one core: they all take turns on it); ``beside="train"``: a training process takes
    turns on the first core with them."""
    ctx = mp.get_context("fork")
    start, out, stop = ctx.Barrier(processes + (beside is not None)), ctx.Queue(), ctx.Event()
    children = [
        ctx.Process(target=_turns, args=(work, seed, units, cores[seed % len(cores)], start, out))
        for seed in range(processes)
    ]
    if beside == "train":
        children.append(ctx.Process(target=_trainer, args=(cores[0], start, stop)))
    elif beside is not None:
        raise ValueError(f"beside {beside!r}: only 'train'")
    for child in children:
        child.start()
    per_unit: list[float] = []
    while len(per_unit) < processes:
        try:
            per_unit.append(out.get(timeout=1.0))
        except queue.Empty:
            dead = [c.exitcode for c in children if c.exitcode not in (None, 0)]
            if dead:  # one failed: the others cannot pass the start, or no result comes
                stop.set()
                for child in children:
                    child.kill()
                    child.join()
                raise RuntimeError(f"a {work} cell's process exited with {dead[0]}") from None
    stop.set()
    for child in children:
        child.join()
        if child.exitcode != 0:
            raise RuntimeError(f"a {work} process exited with {child.exitcode}")
    return float(np.mean(per_unit))


def rounds(counts: Sequence[int], repeats: int) -> list[list[int]]:
    """Each round every count once, the order rotated by one per round (drift cancels)."""
    return [[counts[(r + j) % len(counts)] for j in range(len(counts))] for r in range(repeats)]


@dataclass(frozen=True)
class Row:
    work: str
    processes: int
    ms: list[float]  # one mean CPU ms per unit per repeat


#: How a row's work is named when a training process takes turns with it.
BESIDE_TRAIN = " + train"


def table(rows: Sequence[Row]) -> str:
    """Markdown: per work and process count, CPU ms per unit (mean ± sd) and / alone (the
    same work's one process alone, a training process beside it or not)."""
    alone = {r.work: float(np.mean(r.ms)) for r in rows if r.processes == 1}
    alone |= {f"{w}{BESIDE_TRAIN}": ms for w, ms in list(alone.items())}
    lines = [
        "| work | processes | repeats | CPU ms per unit | / alone |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r.work, r.processes)):
        mean = float(np.mean(r.ms))
        sd = float(np.std(r.ms, ddof=1)) if len(r.ms) > 1 else 0.0
        ratio = f"{mean / alone[r.work]:.3f}" if r.work in alone else "n/a"
        lines.append(
            f"| {r.work} | {r.processes} | {len(r.ms)} | {mean:.3f} ± {sd:.3f} | {ratio} |"
        )
    return "\n".join(lines)


def run(
    works: Sequence[str],
    counts: Sequence[int],
    repeats: int,
    units: int,
    cores: Sequence[int],
    beside_train: bool = False,
) -> list[Row]:
    """Every (work, count) once per round; with ``beside_train`` each also with a training
    process on the first core (the row's work named ``work + train``)."""
    besides: list[str | None] = [None, "train"] if beside_train else [None]
    ms: dict[tuple[str, int], list[float]] = {}
    for order in rounds(list(counts), repeats):
        for work in works:
            for k in order:
                for beside in besides:
                    name = work + (BESIDE_TRAIN if beside else "")
                    ms.setdefault((name, k), []).append(measure(work, k, units, cores, beside))
    return [Row(w, k, v) for (w, k), v in ms.items()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m validation.timeslice", description=__doc__)
    p.add_argument("--work", default=",".join(WORKS), help="comma-separated: decode, spin")
    p.add_argument("--processes", default="1,2,4,8", help="comma-separated process counts")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--units", type=int, default=150, help="timed units per process")
    p.add_argument(
        "--cores",
        type=int,
        default=1,
        help="pin the processes round-robin to this many cores (2 with 2 processes: the "
        "control, no turns)",
    )
    p.add_argument(
        "--beside-train",
        action="store_true",
        help="also measure each cell with the decode regime's training step taking turns on "
        "the first core (needs torch)",
    )
    args = p.parse_args(argv)
    try:
        works = [w for w in args.work.split(",") if w]
        counts = [int(k) for k in args.processes.split(",") if k]
    except ValueError:
        p.error("--processes: comma-separated integers")
    if not works or any(w not in WORKS for w in works):
        p.error(f"--work: comma-separated, each one of {', '.join(WORKS)}")
    if not counts or min(counts, default=0) < 1 or min(args.repeats, args.units, args.cores) < 1:
        p.error("--processes, --repeats, --units and --cores must be >= 1")
    allowed = sorted(os.sched_getaffinity(0))
    if args.cores > len(allowed):
        p.error(f"--cores {args.cores}: this process may use {len(allowed)}")
    load0 = os.getloadavg()[0]
    if args.beside_train and importlib.util.find_spec("torch") is None:
        p.error("--beside-train needs torch (pip install torch)")
    try:
        rows = run(
            works, counts, args.repeats, args.units, allowed[: args.cores], args.beside_train
        )
    except RuntimeError as exc:
        print(f"python -m validation.timeslice: {exc}", file=sys.stderr)
        return 1
    print(f"{len(allowed[: args.cores])} core(s): {allowed[: args.cores]}\n")
    print(table(rows))
    print(f"\nload average (1 min) before {load0:.2f}, after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
