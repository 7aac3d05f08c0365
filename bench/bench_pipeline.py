"""The pipeline replay model beside the per-iteration one, measured side by side in one run.

On one core (the process is pinned), for 10^4..10^6 iterations x 8 GPUs:
calibration (``prepare``), one replay, and "per policy" = (prepare + 9
replays) / 9 for both models, in GPU-iterations per second. Also the
pipeline kernel against the plain-Python row-by-row reference
(``tests/reference_pipeline.py``) on the same small run: the reason the
kernel is compiled (numba). And a loader what-if through the CPU-aware path
(logs with CPU times), with the drain's damped passes beside the 2 undamped
passes of earlier versions: what the damping costs.

Run from the repository root: ``python bench/bench_pipeline.py [--quick] [--out FILE.json]``.
The first call of each compiled kernel pays numba's compilation (or loads its
on-disk cache); every timing here is the best of several repeats after a
warm-up call, so it measures the steady state.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dsim.replay.arrays import IterationArrays, LoaderSettings
from dsim.replay.models import get_model
from dsim.replay.params import ReplayParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_facts import machine

PAIRS = list(itertools.product(("actual", "min", "avg"), repeat=2))
REPO = Path(__file__).resolve().parents[1]


def synthetic_arrays(n: int, g: int, workers: int = 4, seed: int = 0) -> IterationArrays:
    """A physically plausible run: W workers per rank, fetches ending before their arrival."""
    rng = np.random.default_rng(seed)
    epoch = (np.arange(n) >= n // 2).astype(np.int32)
    iteration = (np.arange(n) - np.where(epoch == 1, n // 2, 0)).astype(np.int32)
    fetch = rng.lognormal(np.log(0.04), 0.5, (n, g))
    compute = rng.uniform(0.008, 0.012, (n, 1)) + rng.uniform(0, 0.001, (n, g))
    stall = rng.uniform(0, 0.01, (n, g)) * (rng.random((n, g)) < 0.5)
    iteration_time = stall + compute
    arrival = np.cumsum(iteration_time.max(axis=1))[:, None] + stall
    start = arrival - stall - fetch - rng.uniform(0, 0.02, (n, g))
    worker = np.repeat((iteration % workers)[:, None], g, axis=1).astype(np.int32)
    return IterationArrays(
        epoch=epoch,
        iteration=iteration,
        gpus=np.arange(g, dtype=np.int32),
        start=np.asfortranarray(start),
        fetch=np.asfortranarray(fetch),
        iteration_time=np.asfortranarray(iteration_time),
        stall=np.asfortranarray(stall),
        arrival=np.asfortranarray(arrival),
        worker=np.asfortranarray(worker),
        origin_ns=0,
        loader=LoaderSettings(workers, 2, "log"),
    )


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: compilation or cache load, first touch of memory
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def pin_one_core() -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def _all_policies(model: Any, arrays: IterationArrays, params: ReplayParams) -> None:
    """What ``dsim run`` does for one run: prepare once, then every policy."""
    prepared = model.prepare(arrays, params)
    for pair in PAIRS:
        model.replay(prepared, pair, params)


def bench_models(sizes: list[int], gpus: int, repeats: int) -> list[dict[str, Any]]:
    rows = []
    params = ReplayParams()
    for n in sizes:
        arrays = synthetic_arrays(n, gpus)
        work = n * gpus
        for name in ("per-iteration", "pipeline"):
            model = get_model(name)
            prepared = model.prepare(arrays, params)
            t_prepare = best_of(lambda m=model, a=arrays: m.prepare(a, params), repeats)
            t_replay = best_of(
                lambda m=model, p=prepared: m.replay(p, ("min", "min"), params), repeats
            )
            t_all = best_of(
                lambda m=model, a=arrays: _all_policies(m, a, params),
                max(1, repeats // 2),
            )
            rows.append(
                {
                    "model": name,
                    "iterations": n,
                    "gpus": gpus,
                    "prepare_s": t_prepare,
                    "replay_s": t_replay,
                    "per_policy_rate": work / (t_all / len(PAIRS)),
                    "replay_rate": work / t_replay,
                }
            )
    return rows


def bench_reference(n: int, gpus: int) -> dict[str, Any]:
    """The compiled kernel against the plain-Python reference, one policy, same inputs."""
    spec = importlib.util.spec_from_file_location(
        "reference_pipeline", REPO / "tests" / "reference_pipeline.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    arrays = synthetic_arrays(n, gpus)
    model, params = get_model("pipeline"), ReplayParams()
    lists = {
        "epoch": arrays.epoch.tolist(),
        "iteration": arrays.iteration.tolist(),
        "start": arrays.start.tolist(),
        "fetch": arrays.fetch.tolist(),
        "arrival": arrays.arrival.tolist(),
        "stall": arrays.stall.tolist(),
        "iteration_time": arrays.iteration_time.tolist(),
        "worker": arrays.worker.tolist(),
    }

    def reference() -> Any:
        return module.reference_pipeline(
            **lists, policy=("min", "min"), workers=4, prefetch=2, new_workers=None,
            new_prefetch=None,
        )  # fmt: skip

    t_ref = best_of(reference, 1)
    t_kernel = best_of(
        lambda: model.replay(model.prepare(arrays, params), ("min", "min"), params), 5
    )
    return {"iterations": n, "gpus": gpus, "reference_s": t_ref, "kernel_s": t_kernel,
            "ratio": t_ref / t_kernel}  # fmt: skip


def cpu_arrays(n: int, g: int, workers: int = 2) -> IterationArrays:
    """``synthetic_arrays`` with CPU times and one node, so that the CPU-aware path runs:
    each fetch half CPU work, half waiting, a quarter of it a run-queue wait; 2 ms of
    training CPU per iteration; 2 ms per batch of worker CPU outside the building thread.
    The node gets the cores that its logged CPU keeps 80 % busy (at least 2): fewer, and
    the logs would be more than the cores can run, which the model replays independent
    of load (SPEC §4.2; until 7 Dec 2026 this case logged 2 cores, ~4x over)."""
    from dataclasses import replace

    from dsim.replay.models.pipeline import logged_busy, logged_cpu_load

    arrays = synthetic_arrays(n, g, workers)
    cpu = np.asfortranarray(0.5 * arrays.fetch)
    arrays = replace(
        arrays,
        loader=LoaderSettings(workers, 2, "log", cores=1, local_world_size=g),
        fetch_cpu=cpu,
        fetch_runq=np.asfortranarray(0.25 * cpu),
        train_cpu=np.full((n, g), 0.002, order="F"),
        train_runq=np.full((n, g), 0.0002, order="F"),
        fetch_proc=np.asfortranarray(cpu + 0.002),
    )
    per_core = logged_busy(arrays, logged_cpu_load(arrays))  # the node's CPU over 1 core
    cores = max(2, math.ceil(per_core / 0.8))
    return replace(arrays, loader=replace(arrays.loader, cores=cores))


def bench_cpu_aware(sizes: list[int], gpus: int, repeats: int) -> list[dict[str, Any]]:
    """A loader what-if (2 -> 4 workers) through the CPU-aware path: the drain's damped 8
    passes (``TRAINER_PASSES``) beside the 2 undamped passes of earlier versions (each pass
    replays the run once more), side by side on the same arrays."""
    from dsim.replay.models import pipeline as pipeline_module

    rows = []
    shipped = pipeline_module.TRAINER_PASSES
    model, params = get_model("pipeline"), ReplayParams(workers=4, prefetch_factor=2)
    try:
        for n in sizes:
            arrays = cpu_arrays(n, gpus)
            prepared = model.prepare(arrays, ReplayParams())
            assert prepared.cpu is not None  # the CPU-aware path, or this measures nothing
            times = {}
            for passes in (2, shipped):
                pipeline_module.TRAINER_PASSES = passes
                times[passes] = best_of(
                    lambda p=prepared: model.replay(p, ("actual", "actual"), params), repeats
                )
            rows.append(
                {
                    "iterations": n,
                    "gpus": gpus,
                    "passes": shipped,
                    "replay_s": times[shipped],
                    "replay_s_2_passes": times[2],
                    "ratio": times[shipped] / times[2],
                }
            )
    finally:
        pipeline_module.TRAINER_PASSES = shipped
    return rows


def bench_busy_hand_over(sizes: list[int], gpus: int, repeats: int) -> list[dict[str, Any]]:
    """A loader what-if (4 -> 8 workers) with the busy worker's hand-over on and off (SPEC
    §4.2), side by side on the same calibrated run: on, every batch's hand-over asks whether
    its worker is busy (a busy extra of 5 ms put in every row); off, as a run without the
    effect replays (extra 0: the kernel skips the test)."""
    from dataclasses import replace

    rows = []
    model, params = get_model("pipeline"), ReplayParams(workers=8, prefetch_factor=2)
    for n in sizes:
        prepared = model.prepare(synthetic_arrays(n, gpus), ReplayParams())
        c = prepared.calibration
        on = replace(prepared, calibration=replace(c, busy_excess=np.full(n, 0.005)))
        off = replace(prepared, calibration=replace(c, busy_excess=np.zeros(n)))
        times = {
            name: best_of(lambda p=p: model.replay(p, ("actual", "actual"), params), repeats)
            for name, p in (("off", off), ("on", on), ("off_again", off))
        }
        rows.append({"iterations": n, "gpus": gpus, **{f"{k}_s": v for k, v in times.items()}})
    return rows


def _numba_version() -> str:
    import numba

    return numba.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run (< 30 s)")
    parser.add_argument("--out", type=Path, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    core = pin_one_core()
    sizes = [1_000, 10_000] if args.quick else [10_000, 100_000, 1_000_000]
    repeats = 2 if args.quick else 3
    res = {
        "machine": machine(numpy=np.__version__, numba=_numba_version()),
        "pinned_core": core,
        "models": bench_models(sizes, 8, repeats),
        "reference": bench_reference(200 if args.quick else 2_000, 8),
        "cpu_aware": bench_cpu_aware([1_000] if args.quick else [1_000, 10_000], 8, repeats),
        "busy_hand_over": bench_busy_hand_over(sizes, 8, repeats),
    }
    load = res["machine"]["load_average_at_start"]
    print(f"one core ({res['machine']['cpu']}), load {load[0] if load else float('nan'):.2f}")
    print(f"{'model':<14}{'iterations':>11}{'prepare':>10}{'1 replay':>10}"
          f"{'GPU-it/s per policy':>21}{'GPU-it/s replay':>17}")  # fmt: skip
    for r in res["models"]:
        print(
            f"{r['model']:<14}{r['iterations']:>11,}{r['prepare_s']:>9.3f}s{r['replay_s']:>9.3f}s"
            f"{r['per_policy_rate'] / 1e6:>19.1f} M{r['replay_rate'] / 1e6:>15.1f} M"
        )
    ref = res["reference"]
    print(
        f"pipeline kernel vs plain-Python reference ({ref['iterations']:,} x {ref['gpus']}, "
        f"min/min): {ref['reference_s']:.2f} s vs {ref['kernel_s'] * 1e3:.2f} ms "
        f"= {ref['ratio']:,.0f}x"
    )
    for r in res["cpu_aware"]:
        print(
            f"CPU-aware loader what-if ({r['iterations']:,} x {r['gpus']}, 2 -> 4 workers): "
            f"{r['passes']} damped drain passes {r['replay_s'] * 1e3:.1f} ms vs 2 passes "
            f"{r['replay_s_2_passes'] * 1e3:.1f} ms = {r['ratio']:.2f}x"
        )
    for r in res["busy_hand_over"]:
        print(
            f"busy hand-over ({r['iterations']:,} x {r['gpus']}, 4 -> 8 workers): on "
            f"{r['on_s'] * 1e3:.1f} ms vs off {r['off_s'] * 1e3:.1f} / "
            f"{r['off_again_s'] * 1e3:.1f} ms = {r['on_s'] / r['off_s']:.2f}x"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
