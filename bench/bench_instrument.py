"""What dsim.instrument costs a training loop, measured plain vs instrumented in one run.

Two numbers:
- per-batch cost (µs): a loader of trivially cheap samples iterated with no
  training step, so nearly all the difference is dsim's fetch and training
  lines (num_workers=0: the fetch line is written in the loop's own process,
  the worst case);
- slowdown of a training step of --step-ms (busy-waiting, so the step itself
  has no timer jitter), in percent of the plain loop's wall time. Target < 1 %.
  ``--cuda-step`` makes the step real GPU work instead (bf16 matrix products
  calibrated to --step-ms, then a sync), as a GPU training loop waits for its
  step; run it on a GPU machine.

Plain and instrumented runs alternate and the best of --repeats is kept for
each: a noisy neighbour only ever adds time, so the fastest run is the
closest to the true cost, and alternating exposes both sides to it alike.
The step rows' verdict does not rest on one best-of pair, which moved by
±1.5 % between identical runs (BENCHMARKS.md): each repeat's instrumented
loop is paired with the plain loop run just before it, and the mean of the
paired slowdowns gets a 95 % bootstrap interval. The target counts as met only
when the whole interval is below 1 %, as missed when it is all above, and as
undecided otherwise (then: more --repeats, on a quieter machine).
``--stages`` adds a third loop in the same alternation, instrumented with
``instrument_loader(..., stages=True)`` (a fetch's reads and collation timed
apart, SPEC §1.2), and prints its cost beside the plain instrumentation's.
``--iterable`` adds the IterableDataset path beside the map-style one: the same
cheap samples streamed by an ``IterableDataset`` (each worker its shard), plain
and instrumented (``dsim.instrument.iterable``: a clock per sample asked for, the
fetch line written in the loop's process when the batch arrives), in the same
alternation, its cost against its own plain loop. ``--quick`` is a smoke run
(a few hundred batches, one repeat): it checks that the script works, its
numbers mean nothing. Publish only numbers measured on a machine left alone.

``--compare REF`` measures only the cost per batch (no training step), of
this tree's dsim and of the commit REF's side by side: REF's ``dsim/`` is
exported (``git archive``, no worktree is created) and each side runs in its
own interpreter (``--per-batch-json``, with that side's dsim first on
``PYTHONPATH``), the two alternating for ``--rounds`` rounds, best of all
kept. Four loops: map-style with 0 and 2 workers, IterableDataset with 0 and
2 workers; per loop the added wall time and the added CPU time of the loop's
own process (the training process: its critical path), in µs per batch, and
the added time *between steps*: the median time the loop spends in
``next()`` (where all of dsim's per-batch work in the loop's process runs)
when each batch is followed by a step of ``--gap-step-ms`` that first sweeps
``--sweep-mb`` of memory, as a real step does, so that the next batch starts
with cold caches. Back to back (no step) the instrumentation's code stays
in the caches; between real steps it does not, and there it costs several
times more (the excess of the 10 ms-step slowdown over the no-step cost).

    python bench/bench_instrument.py [--batches 2000] [--step-ms 10] [--repeats 5] [--stages]
                                     [--iterable] [--quick] [--cuda-step]
    python bench/bench_instrument.py --compare main [--rounds 3] [--batches 2000] [--repeats 5]
                                     [--gap-batches 100] [--gap-step-ms 10] [--sweep-mb 32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The loops whose cost per batch ``--compare`` reports: (name, IterableDataset?, workers).
COST_LOOPS = (
    ("map-style, 0 workers", False, 0),
    ("map-style, 2 workers", False, 2),
    ("iterable, 0 workers", True, 0),
    ("iterable, 2 workers", True, 2),
)


class Cheap:
    """Samples that cost almost nothing to read, so the loop measures overhead only."""

    def __init__(self, n: int):
        import torch

        self.n = n
        self.row = torch.zeros(8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.row, i


def stream_class() -> type:
    """``CheapStream``: the same cheap samples as ``Cheap``, from an ``IterableDataset``
    (built on first use: torch is imported by ``main``)."""
    from torch.utils.data import IterableDataset, get_worker_info

    class CheapStream(IterableDataset):
        """``Cheap``'s samples streamed; each DataLoader worker yields its own shard."""

        def __init__(self, n: int):
            self.cheap = Cheap(n)

        def __iter__(self):
            info = get_worker_info()
            start, step = (0, 1) if info is None else (info.id, info.num_workers)
            for i in range(start, len(self.cheap), step):
                yield self.cheap[i]

    return CheapStream


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def paired_slowdown(
    plain: list[float], timed: list[float], seed: int = 0, resamples: int = 10_000
) -> tuple[float, float, float]:
    """Mean paired slowdown (%) of ``timed`` against ``plain`` and its 95 % interval.

    Pairs are the repeats, in order (each alternation's two loops ran back to back,
    so they shared the machine's state). The interval is the percentile bootstrap of
    the mean, so no distribution is assumed for the OS's jitter.
    """
    import numpy as np

    p, t = np.asarray(plain, dtype=float), np.asarray(timed, dtype=float)
    if p.shape != t.shape or p.size == 0:
        raise ValueError("paired_slowdown needs as many timed loops as plain ones, at least 1")
    pct = 100 * (t - p) / p
    if pct.size == 1:
        return float(pct[0]), float("-inf"), float("inf")
    draws = np.random.default_rng(seed).integers(0, pct.size, (resamples, pct.size))
    means = pct[draws].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(pct.mean()), float(low), float(high)


def target_verdict(low: float, high: float, target: float = 1.0) -> str:
    """Met, missed or undecided: a verdict the interval supports, never more."""
    if high < target:
        return f"< {target:g} % shown"
    if low >= target:
        return "ABOVE TARGET"
    return "undecided: the interval spans the target; more --repeats on a quiet machine"


def cuda_step(step_s: float) -> Callable[[float], None]:
    """A training step of about ``step_s`` on the GPU: bf16 matrix products, then a sync.

    Why: a busy-wait is a step with no GPU and hot caches; a real loop launches
    kernels and waits for them (``loss.item()``, the optimizer's sync) while its
    process's caches cool, which is where the instrumentation's per-batch work
    runs. The number of products is calibrated once, so that one step takes
    ``step_s`` on this GPU; the argument each call gets is ignored.
    """
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--cuda-step: CUDA is not available here")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def products(n: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            a @ a
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    products(20)  # warm up the kernels and the clocks
    per = min(products(50) for _ in range(3)) / 50
    n = max(1, round(step_s / per))

    def step(_seconds: float) -> None:
        for _ in range(n):
            a @ a
        torch.cuda.synchronize()

    step.products = n  # type: ignore[attr-defined]
    step.seconds = n * per  # type: ignore[attr-defined]
    return step


def loop_seconds(
    make: Callable[[], tuple], step_s: float, step: Callable[[float], None] = busy
) -> float:
    """Wall time of one epoch over the loader ``make`` builds, with a step of ``step_s``.

    The clock starts when the first batch arrives: starting worker processes
    takes a few hundred ms whose jitter would drown what is measured here.
    """
    loader, iterate = make()
    start = None
    for _batch in iterate(loader):
        if start is None:
            start = time.perf_counter()
        if step_s:
            step(step_s)
    return time.perf_counter() - start


def measure(
    batches: int,
    batch_size: int,
    workers: int,
    step_s: float,
    repeats: int,
    stages: bool = False,
    iterable: bool = False,
    step: Callable[[float], None] = busy,
) -> dict:
    """Best-of-``repeats`` wall times of the plain loop, the instrumented one and, with
    ``stages``, the one instrumented with stage timing; costs against the plain loop.
    With ``iterable``, also an IterableDataset's plain and instrumented loops, its cost
    (``stream_``) against its own plain loop."""
    from torch.utils.data import DataLoader

    from dsim.instrument import TrainingTimer, instrument_loader

    dataset = Cheap(batches * batch_size)
    tmp = Path(tempfile.mkdtemp(prefix="dsim-bench-"))

    def plain():
        return DataLoader(dataset, batch_size=batch_size, num_workers=workers), iter

    def instrumented(with_stages: bool = False):
        loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers)
        loader = instrument_loader(loader, log_dir=tmp, rank=0, stages=with_stages)
        timer = TrainingTimer(log_dir=tmp, rank=0)
        return loader, lambda lo: timer.iterate(lo, epoch=0)

    def stream(timed: bool):
        loader = DataLoader(stream_class()(batches * batch_size), batch_size=batch_size,
                            num_workers=workers)  # fmt: skip
        if not timed:
            return loader, iter
        loader = instrument_loader(loader, log_dir=tmp, rank=1)
        timer = TrainingTimer(log_dir=tmp, rank=1)
        return loader, lambda lo: timer.iterate(lo, epoch=0, total=batches)

    variants = {"plain": plain, "instrumented": instrumented}
    if stages:
        variants["staged"] = lambda: instrumented(True)
    if iterable:
        variants["stream_plain"] = lambda: stream(False)
        variants["stream_instrumented"] = lambda: stream(True)
    for make in variants.values():
        loop_seconds(make, 0)  # warm up imports and caches
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, make in variants.items():
            times[name].append(loop_seconds(make, step_s, step))
    p = min(times["plain"])
    out = {"plain_s": p, "times": times}
    for name, key in (("instrumented", ""), ("staged", "staged_")):
        if name in times:
            i = min(times[name])
            out[f"{name}_s"] = i
            out[f"{key}per_batch_us"] = (i - p) / (batches - 1) * 1e6
            out[f"{key}slowdown_pct"] = 100 * (i - p) / p
    if iterable:
        sp, si = min(times["stream_plain"]), min(times["stream_instrumented"])
        out.update(stream_plain_s=sp, stream_instrumented_s=si)
        out["stream_per_batch_us"] = (si - sp) / (batches - 1) * 1e6
        out["stream_slowdown_pct"] = 100 * (si - sp) / sp
    return out


def _loop_clocks(make: Callable[[], tuple]) -> tuple[float, float]:
    """(wall, CPU time of this process) of one epoch over the loader ``make`` builds,
    from the first batch's arrival (as ``loop_seconds``) to the end."""
    loader, iterate = make()
    start = cpu = None
    for _batch in iterate(loader):
        if start is None:
            start, cpu = time.perf_counter(), time.process_time()
    return time.perf_counter() - start, time.process_time() - cpu


def _median_gap(make: Callable[[], tuple], step_s: float, sweep: object) -> float:
    """Median seconds the loop spends in ``next()`` when a step follows each batch.

    The step sweeps ``sweep`` (a NumPy array; evicting what the caches held, as a
    real step's work does), then busy-waits the rest of ``step_s``.
    """
    import statistics

    loader, iterate = make()
    gaps, left = [], None
    for _batch in iterate(loader):
        arrived = time.perf_counter()
        if left is not None:
            gaps.append(arrived - left)
        sweep.sum()  # type: ignore[attr-defined]
        busy(step_s - (time.perf_counter() - arrived))
        left = time.perf_counter()
    return statistics.median(gaps)


def per_batch_costs(
    batches: int,
    batch_size: int,
    repeats: int,
    gap_batches: int = 100,
    gap_step_s: float = 0.01,
    sweep_mb: float = 32.0,
) -> dict[str, dict[str, float]]:
    """µs per batch that dsim adds to each of ``COST_LOOPS`` without a training step.

    Plain and instrumented loops alternate, ``repeats`` times; the best of each is
    kept (noise only adds time). ``wall_us``: the loop's added wall time;
    ``cpu_us``: the added CPU time of the loop's process (all its threads, not
    the workers'), which a busy neighbour inflates less than the wall time;
    ``between_steps_us``: the added median time in ``next()`` over ``gap_batches``
    batches, each followed by a cache-sweeping step (``_median_gap``), best of
    ``repeats``.
    """
    import numpy as np
    from torch.utils.data import DataLoader

    from dsim.instrument import TrainingTimer, instrument_loader

    tmp = Path(tempfile.mkdtemp(prefix="dsim-bench-"))
    sweep = np.ones(int(sweep_mb * 2**20) // 8)
    out: dict[str, dict[str, float]] = {}
    for rank, (name, streamed, workers) in enumerate(COST_LOOPS):

        def build(batches=batches, streamed=streamed, workers=workers):
            n = batches * batch_size
            dataset = stream_class()(n) if streamed else Cheap(n)
            return DataLoader(dataset, batch_size=batch_size, num_workers=workers)

        def instrumented(batches=batches, build=build, rank=rank):
            loader = instrument_loader(build(batches), log_dir=tmp, rank=rank)
            timer = TrainingTimer(log_dir=tmp, rank=rank)
            return loader, lambda lo: timer.iterate(lo, epoch=0, total=batches)

        variants = {"plain": lambda build=build: (build(), iter), "timed": instrumented}
        stepped = {
            "plain": lambda build=build: (build(gap_batches), iter),
            "timed": lambda instrumented=instrumented: instrumented(gap_batches),
        }
        gaps = {key: min(_median_gap(make, gap_step_s, sweep) for _ in range(repeats))
                for key, make in stepped.items()}  # fmt: skip
        for make in variants.values():
            _loop_clocks(make)  # warm up imports and caches
        best = {key: [float("inf"), float("inf")] for key in variants}
        for _ in range(repeats):
            for key, make in variants.items():
                wall, cpu = _loop_clocks(make)
                best[key] = [min(best[key][0], wall), min(best[key][1], cpu)]
        per = 1e6 / (batches - 1)
        out[name] = {
            "wall_us": (best["timed"][0] - best["plain"][0]) * per,
            "cpu_us": (best["timed"][1] - best["plain"][1]) * per,
            "between_steps_us": (gaps["timed"] - gaps["plain"]) * 1e6,
        }
    return out


def export_dsim(ref: str, into: Path) -> Path:
    """``ref``'s ``dsim/`` package written under ``into`` (``git archive``: no worktree,
    nothing in the repository changes); returns the directory to put on ``PYTHONPATH``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref, "dsim"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise SystemExit(f"--compare {ref}: git archive failed: {archive.stderr.decode().strip()}")
    tar_path = into / "dsim.tar"
    tar_path.write_bytes(archive.stdout)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return into


def _side(root: Path, args: argparse.Namespace) -> dict:
    """One ``--per-batch-json`` run in a fresh interpreter with ``root``'s dsim first."""
    command = [sys.executable, str(Path(__file__).resolve()), "--per-batch-json"]
    command += ["--batches", str(args.batches), "--repeats", str(args.repeats)]
    command += ["--batch-size", str(args.batch_size), "--gap-batches", str(args.gap_batches)]
    command += ["--gap-step-ms", str(args.gap_step_ms), "--sweep-mb", str(args.sweep_mb)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"--compare: the run with {root}'s dsim failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(result["dsim"]).resolve().parents[1] != root.resolve():
        raise SystemExit(f"--compare: expected {root}'s dsim, imported {result['dsim']}")
    return result


def compare(args: argparse.Namespace) -> None:
    """Old (``args.compare``) and new (this tree) cost per batch, alternating rounds."""
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dsim-bench-ref-") as tmp:
        sides = {args.compare: export_dsim(args.compare, Path(tmp)), "this tree": REPO}
        best: dict[str, dict[str, dict[str, float]]] = {label: {} for label in sides}
        for _ in range(args.rounds):
            for label, root in sides.items():
                for loop, cost in _side(root, args)["costs"].items():
                    kept = best[label].setdefault(loop, dict(cost))
                    for key, value in cost.items():
                        kept[key] = min(kept[key], value)
    old, new = best[args.compare], best["this tree"]
    print(
        f"dsim.instrument cost per batch: {args.compare} vs this tree "
        f"(best of {args.rounds} rounds x {args.repeats} repeats, {args.batches} batches; "
        f"1-min load {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end)"
    )
    print(
        f"  {'loop':22} {'wall µs: old':>13} {'new':>7} {'CPU µs: old':>12} {'new':>7} "
        f"{'between steps µs: old':>22} {'new':>7}"
    )
    for loop, *_ in COST_LOOPS:
        o, n = old[loop], new[loop]
        print(
            f"  {loop:22} {o['wall_us']:13.1f} {n['wall_us']:7.1f} {o['cpu_us']:12.1f} "
            f"{n['cpu_us']:7.1f} {o['between_steps_us']:22.1f} {n['between_steps_us']:7.1f}"
        )
    print(
        f"  (between steps: median time in next() with a {args.gap_step_ms:g} ms step that "
        f"sweeps {args.sweep_mb:g} MB after each batch, {args.gap_batches} batches)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=2000, help="batches in the no-step loop")
    ap.add_argument("--step-batches", type=int, default=300, help="batches in the step loop")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--stages", action="store_true", help="also measure instrument_loader(stages=True)"
    )
    ap.add_argument(
        "--iterable", action="store_true", help="also measure an IterableDataset's loader"
    )
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: 200/30 batches, 1 ms step, 1 repeat"
    )
    ap.add_argument(
        "--cuda-step",
        action="store_true",
        help="the step is --step-ms of bf16 matrix products on the GPU and a sync, not a busy-wait",
    )
    ap.add_argument(
        "--compare", metavar="REF", help="cost per batch only: REF's dsim beside this tree's"
    )
    ap.add_argument("--rounds", type=int, default=3, help="--compare: alternations of the two")
    ap.add_argument("--gap-batches", type=int, default=100, help="--compare: stepped batches")
    ap.add_argument("--gap-step-ms", type=float, default=10.0, help="--compare: the step")
    ap.add_argument("--sweep-mb", type=float, default=32.0, help="--compare: memory swept")
    ap.add_argument("--per-batch-json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compare:
        if args.quick:
            args.batches, args.repeats, args.rounds, args.gap_batches = 200, 1, 1, 20
        compare(args)
        return
    if args.per_batch_json:
        import torch

        import dsim

        torch.set_num_threads(1)
        costs = per_batch_costs(
            args.batches, args.batch_size, args.repeats,
            args.gap_batches, args.gap_step_ms / 1e3, args.sweep_mb,
        )  # fmt: skip
        print(json.dumps({"dsim": dsim.__file__, "costs": costs}))
        return
    if args.quick:
        args.batches, args.step_batches, args.step_ms, args.repeats = 200, 30, 1.0, 1

    import torch

    torch.set_num_threads(1)
    step: Callable[[float], None] = busy
    kind = "busy-wait"
    if args.cuda_step:
        step = cuda_step(args.step_ms / 1e3)
        kind = (
            f"{torch.cuda.get_device_name()}: {step.products} bf16 4096^3 products + sync, "  # type: ignore[attr-defined]
            f"{step.seconds * 1e3:.2f} ms"  # type: ignore[attr-defined]
        )
    print(
        f"dsim.instrument overhead (torch {torch.__version__}, best of {args.repeats}; "
        f"step: {kind})"
    )
    for workers in (0, 2):
        r = measure(
            args.batches, args.batch_size, workers, 0.0, args.repeats, args.stages, args.iterable
        )
        print(
            f"  no step,  workers={workers}: plain {r['plain_s'] * 1e3:8.1f} ms, "
            f"instrumented {r['instrumented_s'] * 1e3:8.1f} ms "
            f"-> {r['per_batch_us']:6.1f} µs per batch"
        )
        if args.stages:
            print(
                f"  {'':22}with stages {r['staged_s'] * 1e3:8.1f} ms "
                f"-> {r['staged_per_batch_us']:6.1f} µs per batch"
            )
        if args.iterable:
            print(
                f"  {'':12}iterable: plain {r['stream_plain_s'] * 1e3:8.1f} ms, "
                f"instrumented {r['stream_instrumented_s'] * 1e3:8.1f} ms "
                f"-> {r['stream_per_batch_us']:6.1f} µs per batch"
            )
    for workers in (0, 2):
        r = measure(
            args.step_batches,
            args.batch_size,
            workers,
            args.step_ms / 1e3,
            args.repeats,
            args.stages,
            args.iterable,
            step,
        )
        rows = [("instrumented", "", "plain_s", "instrumented_s")]
        if args.stages:
            rows.append(("with stages", "staged_", "plain_s", "staged_s"))
        if args.iterable:
            rows.append(("iterable", "stream_", "stream_plain_s", "stream_instrumented_s"))
        for label, key, base, timed in rows:
            slowdown = r[f"{key}slowdown_pct"]
            mean, low, high = paired_slowdown(
                r["times"][base.removesuffix("_s")], r["times"][timed.removesuffix("_s")]
            )
            verdict = target_verdict(low, high)
            if args.quick:
                verdict = "not judged: --quick is a smoke run, not a measurement"
            print(
                f"  {args.step_ms:g} ms step, workers={workers}: plain {r[base]:7.3f} s, "
                f"{label} {r[timed]:7.3f} s -> slowdown {slowdown:+.2f} % (best of "
                f"{args.repeats}); paired mean {mean:+.2f} %, 95 % interval "
                f"[{low:+.2f}, {high:+.2f}] % (target < 1 %: {verdict})"
            )


if __name__ == "__main__":
    main()
