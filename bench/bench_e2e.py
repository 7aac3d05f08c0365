"""End to end: `dsim parse` -> `dsim run` (9 policies) -> `dsim summarize`, as a user runs them.

Why a separate benchmark: the kernel and the parser are fast on their own, but
what a user waits for is three commands, each a fresh interpreter, with the
Parquet written and read back between them, and (with ``--executor ray``) an
embedded Ray instance started and stopped. This measures exactly that, for 1,
10 and 100 runs of 10,000 iterations x 8 GPUs (one epoch, so the default epoch
selection keeps it), with the in-process and the Ray executor.

Logs come from ``dsim.synth`` (one interleaved ``output.log`` per run, seed =
run index) and are cached under ``--work``; generating them is not timed. The
tree for k runs holds hard links to the first k cached runs. Every repeat
parses into a fresh ``traces`` directory and replays into a fresh results
directory, so nothing is reused from a previous repeat (``dsim run`` would
otherwise reuse finished replays). Log files are read from the page cache
after the first repeat (they were just written, so usually also in the first).

Stages, each a subprocess timed by wall clock:

- ``dsim parse TREE --out TRACES --quiet`` (runs parsed in parallel processes);
- ``dsim run RUN... --traces TRACES --out RESULTS --executor X --quiet``;
- ``dsim summarize RESULTS --quiet``.

Parse does not depend on the executor, so it is timed once per repeat and
counted in both totals. Ray's start-up (import + ``ray.init`` of the embedded
instance, and its shutdown) is timed on its own in a fresh interpreter.
Growth exponents are least-squares slopes of log time against log runs.

Usage (repository root)::

    python bench/bench_e2e.py                          # 1, 10, 100 runs; local and ray
    python bench/bench_e2e.py --repeats 2 --out bench/out/e2e.json
    python bench/bench_e2e.py --quick                  # tiny smoke run (< 30 s, local only)
    python bench/bench_e2e.py --ray-address HOST:PORT  # the Ray runs join a cluster
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_facts import machine

STAGES = ("parse", "run", "summarize")
TARGET_S = 60.0  # issue 6: 100 runs x 9 policies of 10,000 x 8, parse to summary, 2 cores


def dsim_command() -> list[str]:
    """The `dsim` entry point of this interpreter's environment (as a user types it)."""
    script = Path(sys.executable).with_name("dsim")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dsim"]


def child_env(ray_address: str | None) -> dict[str, str]:
    """Loopback-only embedded Ray unless a cluster is named; never an inherited RAY_ADDRESS."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    env.pop("DSIM_DEBUG", None)
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    return env


# --------------------------------------------------------------------------- logs


def run_name(index: int) -> str:
    return f"e2e_run{index:03d}"


def cached_pool(work: Path, gpus: int, iterations: int, epochs: int, count: int) -> Path:
    """Generate (once) ``count`` runs of the given shape; returns the pool directory."""
    from dsim.synth import SynthParams, synthesize

    pool = work / f"pool_g{gpus}_i{iterations}_e{epochs}"
    pool.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        if (pool / run_name(index) / "output.log").exists():
            continue
        params = SynthParams(
            gpus=gpus,
            iterations=iterations,
            epochs=epochs,
            workers=8,
            seed=index,
            name=run_name(index),
        )
        synthesize(params, pool)
    return pool


def tree_of(pool: Path, runs: int) -> Path:
    """A directory with exactly ``runs`` run directories: hard links into the pool."""
    tree = pool.parent / f"{pool.name}_tree{runs}"
    if tree.exists() and len(list(tree.iterdir())) == runs:
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    for index in range(runs):
        target = tree / run_name(index)
        target.mkdir(parents=True)
        for source in (pool / run_name(index)).iterdir():
            try:
                os.link(source, target / source.name)
            except OSError:
                shutil.copy2(source, target / source.name)
    return tree


# --------------------------------------------------------------------------- timing


def timed(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """Wall and CPU seconds of one command; CPU counts the children it waited for.

    Ray's raylet and workers are not waited-for children, so their CPU is not
    in ``cpu_s`` for the Ray executor.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(
            f"failed (exit {done.returncode}): {' '.join(cmd)}\n{done.stdout}{done.stderr}"
        )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


RAY_STARTUP_CHILD = """
import json, os, sys, time
t0 = time.perf_counter()
from dsim.execute.ray_backend import connect
import ray
t1 = time.perf_counter()
num_cpus = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else None
ray_mod, started = connect(None, num_cpus)
t2 = time.perf_counter()
ray_mod.get(ray_mod.remote(lambda: 1).remote())
t3 = time.perf_counter()
if started:
    ray_mod.shutdown()
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "init_s": t2 - t1, "first_task_s": t3 - t2,
                  "shutdown_s": t4 - t3, "total_s": t4 - t0}))
"""


def ray_startup(num_cpus: int | None) -> dict[str, float]:
    """Embedded Ray's fixed cost in a fresh interpreter: import, init, first task, shutdown."""
    env = child_env(None)
    done = subprocess.run(
        [sys.executable, "-c", RAY_STARTUP_CHILD, str(num_cpus or "")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"Ray start-up measurement failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary_rows(results: Path) -> Any:
    """The summary `dsim run` wrote, sorted, for the local-vs-Ray identity check."""
    import pyarrow.parquet as pq

    frame = pq.read_table(results / "summary.parquet").to_pandas()
    keys = ["run", "fetch_align", "start_align"]
    numbers = [c for c in frame.columns if c not in keys and frame[c].dtype.kind in "biuf"]
    return frame[keys + numbers].sort_values(keys).reset_index(drop=True)


def one_repeat(
    tree: Path, runs: int, executors: list[str], args: argparse.Namespace, scratch: Path
) -> dict[str, Any]:
    """Parse once, then run + summarize with each executor; all into fresh directories."""
    dsim = dsim_command()
    env = child_env(args.ray_address)
    traces, out = scratch / "traces", {}
    parse = timed([*dsim, "parse", str(tree), "--out", str(traces), "--quiet"], env)
    names = [run_name(i) for i in range(runs)]
    summaries = {}
    for executor in executors:
        results = scratch / f"results_{executor}"
        run_cmd = [*dsim, "run", *names, "--traces", str(traces), "--out", str(results)]
        run_cmd += ["--executor", executor, "--quiet"]
        if executor == "ray" and args.num_cpus:
            run_cmd += ["--num-cpus", str(args.num_cpus)]
        run = timed(run_cmd, env)
        summarize = timed([*dsim, "summarize", str(results), "--quiet"], env)
        summaries[executor] = summary_rows(results)
        if len(summaries[executor]) != runs * 9:
            raise SystemExit(f"{results}: {len(summaries[executor])} summary rows, not {runs * 9}")
        out[executor] = {
            "parse": parse,
            "run": run,
            "summarize": summarize,
            "total_s": parse["wall_s"] + run["wall_s"] + summarize["wall_s"],
        }
        shutil.rmtree(results, ignore_errors=True)
    if len(summaries) == 2:
        import pandas as pd

        a, b = summaries.values()
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-12, atol=1e-12)
        out["executors_agree"] = True
    shutil.rmtree(traces, ignore_errors=True)
    return out


def aggregate(repeats: list[dict[str, Any]], executor: str) -> dict[str, Any]:
    """Best and median over repeats of each stage's wall time (and of the total)."""
    res: dict[str, Any] = {}
    for stage in STAGES:
        walls = [r[executor][stage]["wall_s"] for r in repeats]
        cpus = [r[executor][stage]["cpu_s"] for r in repeats]
        res[stage] = {
            "best_s": min(walls),
            "median_s": statistics.median(walls),
            "all_s": walls,
            "cpu_median_s": statistics.median(cpus),
        }
    totals = [r[executor]["total_s"] for r in repeats]
    res["total"] = {"best_s": min(totals), "median_s": statistics.median(totals), "all_s": totals}
    return res


def growth(points: list[tuple[int, float]]) -> dict[str, float | None]:
    """Slope of log time vs log runs: over all points, and between the two largest.

    Fixed costs (interpreter start, imports, Ray start-up) flatten the slope
    at small run counts; the last segment shows the growth once they are paid.
    """
    points = sorted(p for p in points if p[0] > 0 and p[1] > 0)
    if len(points) < 2:
        return {"all": None, "last_segment": None}
    xs = [math.log(r) for r, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    (r1, t1), (r2, t2) = points[-2], points[-1]
    return {"all": slope, "last_segment": math.log(t2 / t1) / math.log(r2 / r1)}


# --------------------------------------------------------------------------- report


def print_report(res: dict[str, Any]) -> None:
    shape = res["shape"]
    print(
        f"end to end, runs of {shape['iterations']:,} iterations x {shape['gpus']} GPUs x "
        f"{shape['epochs']} epoch(s), 9 policies; {res['repeats']} repeat(s); "
        f"load average {res['load_before']} -> {res['load_after']}"
    )
    print(
        f"{'executor':>8} {'runs':>5} {'parse s':>9} {'run s':>9} {'summ. s':>9}"
        f" {'total s':>9} {'median':>9} {'s/run':>7}"
    )
    for executor, by_runs in res["results"].items():
        for runs, agg in by_runs.items():
            print(
                f"{executor:>8} {runs:>5} {agg['parse']['best_s']:>9.2f} "
                f"{agg['run']['best_s']:>9.2f} {agg['summarize']['best_s']:>9.2f} "
                f"{agg['total']['best_s']:>9.2f} {agg['total']['median_s']:>9.2f} "
                f"{agg['total']['best_s'] / int(runs):>7.3f}"
            )
    print("growth exponents of time in runs (log-log slope; all points / last segment)")
    for executor, stages in res["growth"].items():
        text = ", ".join(
            f"{stage} {fmt_exp(g['all'])}/{fmt_exp(g['last_segment'])}"
            for stage, g in stages.items()
        )
        print(f"  {executor}: {text}")
    ray = res.get("ray_startup")
    if ray:
        print(
            f"Ray start-up (fresh interpreter): import {ray['import_s']:.2f} s, init "
            f"{ray['init_s']:.2f} s, first task {ray['first_task_s']:.2f} s, shutdown "
            f"{ray['shutdown_s']:.2f} s, total {ray['total_s']:.2f} s"
        )
    target = res.get("target")
    if target:
        print(
            f"target: {target['runs']} runs parse->summary <= {TARGET_S:.0f} s: "
            + ", ".join(f"{ex} {s:.1f} s" for ex, s in target["best_total_s"].items())
        )


def fmt_exp(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def parse_runs(text: str) -> list[int]:
    try:
        runs = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--runs wants numbers like 1,10,100: {text!r}") from exc
    if not runs or runs[0] < 1:
        raise argparse.ArgumentTypeError("--runs wants positive numbers")
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (< 30 s, no Ray)")
    parser.add_argument("--runs", type=parse_runs, help="run counts (default 1,10,100)")
    parser.add_argument("--iterations", type=int, help="iterations per epoch (default 10000)")
    parser.add_argument("--gpus", type=int, help="GPUs per run (default 8)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per run (default 1)")
    parser.add_argument(
        "--executors", default=None, help="comma list of local,ray (default both; --quick: local)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="repeats per size (best, median)")
    parser.add_argument("--num-cpus", type=int, help="--num-cpus of embedded Ray (default all)")
    parser.add_argument("--ray-address", help="run the Ray executor on this cluster (HOST:PORT)")
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "dsim-bench-e2e",
        help="cache of generated logs and scratch space",
    )
    parser.add_argument("--out", type=Path, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    runs = args.runs or ([1, 2, 4] if args.quick else [1, 10, 100])
    iterations = args.iterations or (300 if args.quick else 10_000)
    gpus = args.gpus or (4 if args.quick else 8)
    default_executors = "local" if args.quick else "local,ray"
    executors = [e.strip() for e in (args.executors or default_executors).split(",") if e.strip()]
    if not executors or set(executors) - {"local", "ray"}:
        parser.error("--executors takes local and/or ray")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pool = cached_pool(args.work, gpus, iterations, args.epochs, max(runs))
    generate_s = time.perf_counter() - t0
    load_before = [round(x, 2) for x in os.getloadavg()]
    res: dict[str, Any] = {
        "machine": machine(),
        "quick": args.quick,
        "shape": {"iterations": iterations, "gpus": gpus, "epochs": args.epochs, "workers": 8},
        "lines_per_run": 2 * gpus * iterations * args.epochs,
        "repeats": args.repeats,
        "ray_address": args.ray_address,
        "generate_s_untimed": generate_s,
        "load_before": load_before,
        "commands": [
            "dsim parse TREE --out TRACES --quiet",
            "dsim run RUN... --traces TRACES --out RESULTS --executor X --quiet",
            "dsim summarize RESULTS --quiet",
        ],
    }
    if "ray" in executors and not args.ray_address:
        res["ray_startup"] = ray_startup(args.num_cpus)
    per_size: dict[int, list[dict[str, Any]]] = {}
    for count in runs:
        tree = tree_of(pool, count)
        per_size[count] = []
        for _ in range(args.repeats):
            scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=args.work))
            try:
                per_size[count].append(one_repeat(tree, count, executors, args, scratch))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            print(f"  done: {count} run(s), repeat {len(per_size[count])}", flush=True)
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    res["results"] = {
        ex: {str(count): aggregate(reps, ex) for count, reps in per_size.items()}
        for ex in executors
    }
    res["executors_agree"] = all(
        rep.get("executors_agree", True) for reps in per_size.values() for rep in reps
    )
    res["growth"] = {
        ex: {
            stage: growth([(int(c), agg[stage]["best_s"]) for c, agg in res["results"][ex].items()])
            for stage in (*STAGES, "total")
        }
        for ex in executors
    }
    biggest = str(max(runs))
    res["target"] = {
        "runs": max(runs),
        "limit_s": TARGET_S,
        "best_total_s": {ex: res["results"][ex][biggest]["total"]["best_s"] for ex in executors},
    }
    print_report(res)
    if args.out is not None:
        from dsim.io.atomic import write_json

        write_json(res, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
