"""Replay benchmarks: dsim's kernel vs the original pandas analysis, scaling, memory, Ray.

Everything is measured in one process, side by side, so the numbers of one
run are comparable with each other. Sections:

1. real-sized case: one 851-iteration x 4-GPU epoch (synthetic, or ``--trace``),
   all 9 policy pairs with dsim (best of N) vs the original method;
2. throughput on one core (the process is pinned to a single CPU) for
   10^3..10^6 iterations x 1, 8, 64 GPUs, with fitted growth exponents;
3. memory of the kernel per GPU-iteration (tracemalloc peak);
4. Ray: embedded start-up and speedup over in-process execution as runs grow,
   through dsim's own executors (``dsim.execute``);
5. optionally (``--compare``, needs ``--trace``): the original's and dsim's
   summary statistics for all 9 policies, flagging differences at 4 decimals.

Run from the repository root: ``python bench/bench_replay.py [--quick] [--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import os
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

import original_method
from machine_facts import machine

from dsim.analysis.summary import DEFAULT_THRESHOLD_S, DEFAULT_WARMUP, summarize_metrics
from dsim.io.atomic import write_json
from dsim.model.tables import FETCH_SCHEMA, TRAIN_SCHEMA, read_run
from dsim.replay.arrays import IterationArrays, build_iteration_arrays
from dsim.replay.models.per_iteration import Prepared, ReplayParams, prepare, replay_prepared
from dsim.replay.policies import KNOWN

ALL_PAIRS = list(itertools.product(KNOWN, KNOWN))
PARAMS = ReplayParams()
ORIGIN_NS = 1_630_525_726_000_000_000  # 2021-09-01 19:48:46
METRICS = ["iteration_s", "stall_s", "delay_s", "fetch_diff_s", "start_diff_s"]


# --------------------------------------------------------------------------- synthetic data


def synthetic_matrices(n: int, g: int, seed: int = 0) -> dict[str, np.ndarray]:
    """[n, g] matrices shaped like the real trace: ~8 s fetches, stalls often ~0 or seconds."""
    rng = np.random.default_rng(seed)
    base = np.cumsum(rng.uniform(0.5, 1.5, size=n))[:, None]
    start = base + rng.uniform(0.0, 3.0, size=(n, g))
    fetch = rng.uniform(7.0, 9.5, size=(n, g))
    stall = rng.choice([0.000002, 0.000006, 0.009, 0.011, 0.5, 3.0], size=(n, g))
    stall = stall * rng.uniform(0.5, 1.5, size=(n, g))
    pure = rng.uniform(0.85, 0.95, size=(n, 1))
    iteration_time = stall.max(axis=1, keepdims=True) + pure + 1e-4 * np.arange(g)[None, :]
    return {"start": start, "fetch": fetch, "iteration_time": iteration_time, "stall": stall}


def synthetic_arrays(n: int, g: int, seed: int = 0) -> IterationArrays:
    m = synthetic_matrices(n, g, seed)
    return IterationArrays(
        epoch=np.ones(n, dtype=np.int32),
        iteration=np.arange(n, dtype=np.int32),
        gpus=np.arange(g, dtype=np.int32),
        start=np.asfortranarray(m["start"]),
        fetch=np.asfortranarray(m["fetch"]),
        iteration_time=np.asfortranarray(m["iteration_time"]),
        stall=np.asfortranarray(m["stall"]),
        arrival=np.zeros((n, g), order="F"),
        worker=np.zeros((n, g), dtype=np.int32, order="F"),
        origin_ns=ORIGIN_NS,
    )


def synthetic_tables(n: int, g: int, epoch: int = 1, seed: int = 0) -> tuple[pa.Table, pa.Table]:
    """The same kind of trace as dsim's Arrow tables (what ``dsim parse`` would write)."""
    m = synthetic_matrices(n, g, seed)
    it = np.repeat(np.arange(n, dtype=np.int32), g)
    gpu = np.tile(np.arange(g, dtype=np.int32), n)
    ep = np.full(n * g, epoch, dtype=np.int32)
    start_ns = ORIGIN_NS + np.round(m["start"].ravel() * 1e9).astype(np.int64)
    fetch_s = m["fetch"].ravel()
    end_ns = start_ns + np.round(fetch_s * 1e9).astype(np.int64)
    train_ns = start_ns.reshape(n, g).max(axis=1).repeat(g) + 10_000_000_000
    ts = pa.timestamp("ns")
    fetch = pa.table(
        {
            "epoch": ep,
            "iteration": it,
            "gpu": gpu,
            "worker": it % 12,
            "start": pa.array(start_ns, ts),
            "end": pa.array(end_ns, ts),
            "fetch_s": fetch_s,
        },
        schema=FETCH_SCHEMA,
    )
    train = pa.table(
        {
            "epoch": ep,
            "iteration": it,
            "gpu": gpu,
            "start": pa.array(train_ns, ts),
            "iteration_s": m["iteration_time"].ravel(),
            "stall_s": m["stall"].ravel(),
            "throughput": pa.nulls(n * g, pa.float64()),
        },
        schema=TRAIN_SCHEMA,
    )
    return fetch, train


# --------------------------------------------------------------------------- timing helpers


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of ``repeats`` calls: the least disturbed measurement of a pure function."""
    best = math.inf
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def all_policies(prep: Prepared) -> None:
    for policy in ALL_PAIRS:
        replay_prepared(prep, policy, PARAMS)


def prepare_and_all_policies(arrays: IterationArrays) -> None:
    all_policies(prepare(arrays))


def repeats_for(work: int, quick: bool) -> int:
    """More repeats for small cases (noisy), few for big ones (slow and stable)."""
    if work <= 10_000:
        return 5 if quick else 30
    if work <= 1_000_000:
        return 3 if quick else 10
    return 2 if quick else 3


# --------------------------------------------------------------------------- sections


def epoch_case(args: argparse.Namespace) -> tuple[pa.Table, pa.Table, int, str]:
    if args.trace is None:
        fetch, train = synthetic_tables(851, 4, epoch=1)
        return fetch, train, 1, "synthetic 851 x 4"
    run = read_run(args.trace)
    epochs = sorted(set(run.train.column("epoch").to_pylist()))
    epoch = args.epoch if args.epoch is not None else (1 if 1 in epochs else epochs[0])
    return run.fetch, run.train, epoch, f"{run.name} epoch {epoch}"


def bench_real_sized(args: argparse.Namespace) -> dict[str, Any]:
    fetch, train, epoch, label = epoch_case(args)
    all_arrays = build_iteration_arrays(fetch, train)
    arrays = all_arrays.take(np.flatnonzero(all_arrays.epoch == epoch))
    n, g = arrays.n_iterations, arrays.n_gpus
    build_s = best_of(lambda: build_iteration_arrays(fetch, train), 5 if args.quick else 20)
    dsim_s = best_of(lambda: prepare_and_all_policies(arrays), 10 if args.quick else 100)

    frame, cols = original_method.simulation_frame(fetch, train, epoch)
    n_orig = 1 if args.quick else args.original_policies
    if args.quick:
        frame = frame.iloc[:20]
    orig_policies = ALL_PAIRS[:: max(1, 9 // n_orig)][:n_orig]
    per_policy = []
    for policy in orig_policies:
        t0 = time.perf_counter()
        original_method.simulate(frame, cols, policy)
        per_policy.append(time.perf_counter() - t0)
    orig_s = float(np.mean(per_policy)) * n / len(frame)  # scaled up in --quick
    return {
        "case": label,
        "iterations": n,
        "gpus": g,
        "dsim_build_arrays_ms": build_s * 1e3,
        "dsim_9_policies_ms": dsim_s * 1e3,
        "original_rows_timed": len(frame),
        "original_policies_timed": [f"{p[0]}__{p[1]}" for p in orig_policies],
        "original_s_per_policy": orig_s,
        "original_9_policies_s": orig_s * 9,
        "speedup": orig_s * 9 / dsim_s,
    }


def pin_one_core() -> set[int] | None:
    """Pin this process to one CPU so that 'per core' means what it says; returns the old set."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(old)})
    return old


def bench_throughput(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        sizes = [(n, g) for n in (1_000, 10_000) for g in (1, 8)]
    else:
        sizes = [
            (n, g)
            for n in (1_000, 10_000, 100_000, 1_000_000)
            for g in (1, 8, 64)
            if not (g == 64 and n > 100_000)
        ]
    old = pin_one_core()
    rows = []
    try:
        for n, g in sizes:
            arrays = synthetic_arrays(n, g, seed=n + g)
            reps = repeats_for(n * g, args.quick)
            prep_s = best_of(lambda a=arrays: prepare(a), reps)
            prep = prepare(arrays)
            replay_s = best_of(lambda p=prep: all_policies(p), reps)
            per_policy = (prep_s + replay_s) / 9
            rows.append(
                {
                    "iterations": n,
                    "gpus": g,
                    "prepare_ms": prep_s * 1e3,
                    "replay_9_ms": replay_s * 1e3,
                    "per_policy_ms": per_policy * 1e3,
                    "gpu_iterations_per_s_per_policy": n * g / per_policy,
                }
            )
            del arrays, prep
    finally:
        if old is not None:
            os.sched_setaffinity(0, old)
    return {"cpus": 1 if old is not None else None, "rows": rows, "fit": fit_growth(rows)}


def fit_growth(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Least squares of log time = a + b log N + c log G: b, c are the growth exponents.

    Fitted on all points and on the large ones (N*G >= 10^5), where fixed
    per-call costs (Python, NumPy dispatch) no longer hide the slope.
    """

    def fit(selected: list[dict[str, Any]]) -> dict[str, float] | None:
        if len(selected) < 3:
            return None
        x = np.array([[1.0, math.log(r["iterations"]), math.log(r["gpus"])] for r in selected])
        y = np.array([math.log(r["per_policy_ms"]) for r in selected])
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        return {"iterations_exponent": float(coef[1]), "gpus_exponent": float(coef[2])}

    return {
        "all": fit(rows),
        "large": fit([r for r in rows if r["iterations"] * r["gpus"] >= 100_000]),
    }


def bench_memory(args: argparse.Namespace) -> dict[str, Any]:
    n, g = (10_000, 8) if args.quick else (1_000_000, 8)
    arrays = synthetic_arrays(n, g)
    gc.collect()
    tracemalloc.start()
    prep = prepare(arrays)
    _, prep_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    peaks = {}
    for policy in (("actual", "actual"), ("avg", "avg"), ("min", "actual")):
        tracemalloc.reset_peak()
        result = replay_prepared(prep, policy, PARAMS)
        _, peak = tracemalloc.get_traced_memory()
        peaks[f"{policy[0]}__{policy[1]}"] = (peak - base) / (n * g)
        del result
    tracemalloc.stop()
    return {
        "iterations": n,
        "gpus": g,
        "prepare_peak_bytes_per_gpu_iteration": prep_peak / (n * g),
        "replay_peak_bytes_per_gpu_iteration": peaks,
    }


def bench_ray(args: argparse.Namespace) -> dict[str, Any]:
    """Embedded Ray start-up, then in-process vs Ray on the same jobs, through dsim's executors."""
    from dsim.execute import Job, execute
    from dsim.execute.ray_backend import connect

    num_cpus = args.ray_cpus
    n, g = (1_000, 8) if args.quick else (100_000, 8)
    run_counts = (1, 2) if args.quick else (1, 4, 16)
    prep = prepare(synthetic_arrays(n, g))

    t0 = time.perf_counter()
    ray, started = connect(None, num_cpus)
    startup_s = time.perf_counter() - t0
    rows = []
    try:

        def timed(executor: str, jobs: list[Job]) -> float:
            done = []
            t = time.perf_counter()
            execute(jobs, PARAMS, executor=executor, num_cpus=num_cpus, on_result=done.append)
            elapsed = time.perf_counter() - t
            assert len(done) == sum(len(j.policies) for j in jobs)
            return elapsed

        warm_jobs = [Job("warm", prep, tuple(ALL_PAIRS))]
        first_call_s = timed("ray", warm_jobs)  # includes starting the worker processes
        for runs in run_counts:
            jobs = [Job(f"run{i}", prep, tuple(ALL_PAIRS)) for i in range(runs)]
            local_s = timed("local", jobs)
            ray_s = timed("ray", jobs)
            rows.append(
                {
                    "runs": runs,
                    "policies": runs * 9,
                    "local_s": local_s,
                    "ray_s": ray_s,
                    "speedup": local_s / ray_s,
                }
            )
    finally:
        if started:
            ray.shutdown()
    return {
        "executors": "dsim.execute (local, ray)",
        "num_cpus": num_cpus,
        "iterations": n,
        "gpus": g,
        "startup_s": startup_s,
        "first_call_s": first_call_s,
        "rows": rows,
    }


def original_summary(df: Any, warmup: int, threshold: float) -> dict[str, float]:
    """The notebook's summary cell: rows past warm-up, pandas mean/std, share of delay > 0.030."""
    df = df[df["iteration"] > warmup]
    out = {"iterations": len(df)}
    for metric in METRICS:
        out[f"{metric}_mean"] = df[metric].mean()
        out[f"{metric}_std"] = df[metric].std()
    out["effective_delay_pct"] = float(len(df[df["delay_s"] > threshold])) / float(len(df)) * 100.0
    return out


def bench_compare(args: argparse.Namespace) -> dict[str, Any]:
    """Summary statistics of all 9 policies, original vs dsim, on one epoch of ``--trace``."""
    fetch, train, epoch, label = epoch_case(args)
    all_arrays = build_iteration_arrays(fetch, train)
    rows = np.flatnonzero(all_arrays.epoch == epoch)
    arrays = all_arrays.take(rows)
    prep = prepare(arrays)
    mask = arrays.iteration > DEFAULT_WARMUP
    out = []
    for policy in ALL_PAIRS:
        d = summarize_metrics(
            replay_prepared(prep, policy, PARAMS).metrics(), mask, DEFAULT_THRESHOLD_S
        )
        o = original_summary(
            original_method.original_replay(fetch, train, epoch, policy),
            DEFAULT_WARMUP,
            DEFAULT_THRESHOLD_S,
        )
        keys = [k for k in d if k != "iterations"]
        diffs = {k: abs(float(d[k]) - float(o[k])) for k in keys}
        beyond = [k for k in keys if round(float(d[k]), 4) != round(float(o[k]), 4)]
        out.append(
            {
                "policy": f"{policy[0]}__{policy[1]}",
                "iterations": [d["iterations"], o["iterations"]],
                "dsim": {k: float(d[k]) for k in keys},
                "original": {k: float(o[k]) for k in keys},
                "max_abs_diff": max(diffs.values()),
                "differ_at_4_decimals": beyond,
            }
        )
    return {"case": label, "policies": out}


# --------------------------------------------------------------------------- report


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:,.1f} M"


def print_report(res: dict[str, Any]) -> None:
    m = res["machine"]
    print(
        f"machine: {m['nproc']} CPUs, {m['cpu']}, {m['memory_gib']} GiB; numpy {m['numpy']}; "
        f"load average at start {m['load_average_at_start']}"
    )
    r = res.get("real_sized")
    if r:
        print(f"\n[1] real-sized epoch ({r['case']}: {r['iterations']} it x {r['gpus']} GPUs)")
        print(f"  dsim  build arrays        {r['dsim_build_arrays_ms']:10.2f} ms")
        print(f"  dsim  9 policies (best)   {r['dsim_9_policies_ms']:10.2f} ms   (target <= 10 ms)")
        print(
            f"  original, s per policy    {r['original_s_per_policy']:10.2f} s    "
            f"(timed {len(r['original_policies_timed'])} policies on "
            f"{r['original_rows_timed']} rows)"
        )
        print(f"  speedup (9 policies)      {r['speedup']:10,.0f} x  (target >= 1,000x)")
    t = res.get("throughput")
    if t:
        print("\n[2] throughput, one core (per policy = (prepare + 9 replays) / 9)")
        print(
            f"  {'iterations':>10} {'GPUs':>5} {'prepare ms':>11} {'9 replays ms':>13} "
            f"{'GPU-it/s/policy':>16}"
        )
        for row in t["rows"]:
            print(
                f"  {row['iterations']:>10,} {row['gpus']:>5} {row['prepare_ms']:>11.2f} "
                f"{row['replay_9_ms']:>13.2f} "
                f"{fmt_rate(row['gpu_iterations_per_s_per_policy']):>16}"
            )
        for name, fit in t["fit"].items():
            if fit:
                print(
                    f"  growth exponents ({name} points): time ~ N^"
                    f"{fit['iterations_exponent']:.2f} x G^{fit['gpus_exponent']:.2f}"
                )
    mem = res.get("memory")
    if mem:
        per = ", ".join(
            f"{k} {v:.1f}" for k, v in mem["replay_peak_bytes_per_gpu_iteration"].items()
        )
        print(f"\n[3] memory ({mem['iterations']:,} it x {mem['gpus']} GPUs, tracemalloc peak)")
        print(f"  prepare: {mem['prepare_peak_bytes_per_gpu_iteration']:.1f} B per GPU-iteration")
        print(f"  one replay: {per} B per GPU-iteration")
    ray = res.get("ray")
    if ray:
        print(
            f"\n[4] Ray via {ray['executors']}, num_cpus={ray['num_cpus']}, "
            f"runs of {ray['iterations']:,} it x {ray['gpus']} GPUs"
        )
        print(
            f"  embedded start-up {ray['startup_s']:.2f} s; first call (worker start) "
            f"{ray['first_call_s']:.2f} s"
        )
        print(f"  {'runs':>5} {'policies':>9} {'local s':>9} {'ray s':>9} {'speedup':>8}")
        for row in ray["rows"]:
            print(
                f"  {row['runs']:>5} {row['policies']:>9} {row['local_s']:>9.3f} "
                f"{row['ray_s']:>9.3f} {row['speedup']:>8.2f}"
            )
    cmp_ = res.get("compare")
    if cmp_:
        print(f"\n[5] original vs dsim summary ({cmp_['case']}, warm-up {DEFAULT_WARMUP})")
        for p in cmp_["policies"]:
            flag = ", ".join(p["differ_at_4_decimals"]) or "none"
            print(
                f"  {p['policy']:<16} max |diff| {p['max_abs_diff']:.2e}  "
                f"differ at 4 decimals: {flag}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run (< 30 s)")
    parser.add_argument("--out", type=Path, help="also write the numbers to this JSON file")
    parser.add_argument("--trace", type=Path, help="a parsed run directory (dsim parse output)")
    parser.add_argument("--epoch", type=int, help="epoch of --trace to use (default 1)")
    parser.add_argument(
        "--original-policies", type=int, default=3, help="policies to time with the original"
    )
    parser.add_argument("--ray-cpus", type=int, default=2, help="num_cpus of embedded Ray")
    parser.add_argument(
        "--ray",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the Ray section (default: yes, but no with --quick: Ray's start-up alone "
        "takes 5-15 s on a small machine)",
    )
    parser.add_argument(
        "--compare", action="store_true", help="with --trace: compare summaries of all 9 policies"
    )
    args = parser.parse_args(argv)
    if args.compare and args.trace is None:
        parser.error("--compare needs --trace")
    args.original_policies = max(1, min(9, args.original_policies))

    res: dict[str, Any] = {"machine": machine(numpy=np.__version__), "quick": args.quick}
    res["real_sized"] = bench_real_sized(args)
    res["throughput"] = bench_throughput(args)
    res["memory"] = bench_memory(args)
    if args.ray if args.ray is not None else not args.quick:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        res["ray"] = bench_ray(args)
    if args.compare:
        res["compare"] = bench_compare(args)
    print_report(res)
    if args.out is not None:
        write_json(res, args.out)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
