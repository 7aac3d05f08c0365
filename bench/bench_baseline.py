"""Today's dsim beside a baseline commit, in one run (issue #21 item 1).

Why: a speed claim needs its baseline measured on the same machine, in the
same minutes, with the same logs; numbers copied from an older table carry
that day's load and that day's code of everything around dsim. This runs the
baseline's code (``git archive`` of ``--baseline``, default ``f93d030``, the
commit issue #21 measures against) and this tree's code from the same
interpreter and dependencies, alternating them repeat by repeat (baseline,
current, baseline, current...) so that drift in the machine's speed falls on
both alike. Three measurements:

- **end to end**: ``dsim parse`` -> ``dsim run`` (9 policies, ``--executor
  local`` and ``ray``) -> ``dsim summarize`` of ``--runs`` runs of
  ``--iterations`` x ``--gpus`` (``bench_e2e.py``'s cached ``dsim.synth`` pool
  and stages), fresh traces and results each repeat; target: today's total no
  slower than the baseline's (ratio <= 1.0) for each executor;
- **a cached run**: ``dsim run`` again on finished results (every replay
  reused) against ``dsim summarize`` of the same results; target <= 1.5x;
- **the kernel's share** of one fresh in-process ``dsim run`` of ``--big``
  GPU-iterations (``--gpus`` GPUs, one epoch): wall time inside the replay
  kernels (``cProfile`` cumulative time of the per-iteration model's
  ``prepare``/``replay_prepared`` and the pipeline model's
  ``calibrate``/``replay_pipeline``, each counted once where nested), over the
  command's wall time; target >= 30 %. cProfile's per-call cost inflates the
  Python around the kernels more than the vectorised kernels, so the share is
  if anything understated.

Every command is a fresh interpreter (``python -m dsim`` with the tree first
on ``PYTHONPATH``), as a user runs it. Only wall clock is timed; the load
average before and after each case is recorded (timings are meaningless
beside other work: run it alone).

Usage (repository root)::

    python bench/bench_baseline.py --out bench/out/baseline.json   # 100 runs, 2 repeats
    python bench/bench_baseline.py --quick                         # 4 runs of 200 x 2: works?
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import cached_pool, child_env, run_name, tree_of
from machine_facts import machine

REPO = Path(__file__).resolve().parents[1]
BASELINE = "f93d030"
KERNELS = (  # (file name, function name): the replay kernels, counted once where nested
    ("per_iteration.py", "prepare"),
    ("per_iteration.py", "prepare_columns"),
    ("per_iteration.py", "replay_prepared"),
    ("per_iteration.py", "replay"),
    ("replay.py", "prepare"),  # the baseline's one module (f93d030: dsim/replay.py)
    ("replay.py", "prepare_columns"),
    ("replay.py", "replay_prepared"),
    ("replay.py", "replay"),
    ("pipeline_kernel.py", "calibrate"),
    ("pipeline_kernel.py", "replay_pipeline"),
)
TARGETS = {"e2e_ratio": 1.0, "cached_over_summarize": 1.5, "kernel_share": 0.30}


def baseline_tree(work: Path, ref: str) -> tuple[Path, str]:
    """The baseline commit's files (``git archive``), unpacked once under ``work``."""
    sha = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dest = work / f"code-{sha[:12]}"
    if not (dest / "dsim" / "__init__.py").exists():
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        archive = subprocess.Popen(["git", "-C", str(REPO), "archive", sha], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"git archive {sha} failed")
    return dest, sha


def current_code() -> str:
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return head + ("-dirty" if dirty else "")


def tree_env(tree: Path) -> dict[str, str]:
    """Embedded loopback Ray, and ``tree``'s dsim first on the path."""
    env = child_env(None)
    env["PYTHONPATH"] = str(tree)
    return env


def dsim(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "dsim", *map(str, args)]


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    """Wall seconds of one command; a failure stops the benchmark with its output."""
    began = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )
    return wall


def load() -> float:
    return os.getloadavg()[0]


def end_to_end(
    tree: Path, pool_tree: Path, scratch: Path, runs: int, executors: list[str]
) -> dict[str, Any]:
    """One repeat of parse -> run (each executor) -> summarize, in fresh directories."""
    env = tree_env(tree)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    traces = scratch / "traces"
    row: dict[str, Any] = {"load_before": load()}
    row["parse"] = timed(dsim("parse", pool_tree, "--out", traces, "--quiet"), env, scratch)
    names = [run_name(i) for i in range(runs)]
    for executor in executors:
        results = scratch / f"results-{executor}"
        run = dsim("run", *names, "--traces", traces, "--out", results)
        row[f"run_{executor}"] = timed([*run, "--executor", executor, "--quiet"], env, scratch)
        row[f"summarize_{executor}"] = timed(dsim("summarize", results, "--quiet"), env, scratch)
        row[f"total_{executor}"] = (
            row["parse"] + row[f"run_{executor}"] + row[f"summarize_{executor}"]
        )
    # every replay is now on disk: the same run again reuses all of them
    results = scratch / f"results-{executors[0]}"
    again = dsim("run", *names, "--traces", traces, "--out", results, "--executor", "local")
    row["cached_run"] = timed([*again, "--quiet"], env, scratch)
    row["cached_summarize"] = timed(dsim("summarize", results, "--quiet"), env, scratch)
    row["load_after"] = load()
    return row


_PROFILE = r"""
import cProfile, json, pstats, sys, time
from dsim.cli import main
kernels = {tuple(k) for k in json.loads(sys.argv[1])}
argv = sys.argv[3:]
profile = cProfile.Profile()
began = time.perf_counter()
profile.enable()
try:
    main(argv)
except SystemExit as exc:
    if exc.code not in (0, None):
        raise
profile.disable()
wall = time.perf_counter() - began
stats = pstats.Stats(profile).stats
def is_kernel(key):
    return (key[0].rsplit("/", 1)[-1], key[2]) in kernels
seconds = 0.0
found = []
for key, (_cc, _nc, _tt, cumulative, callers) in stats.items():
    if is_kernel(key) and not any(is_kernel(caller) for caller in callers):
        seconds += cumulative
        found.append(f"{key[0].rsplit('/', 1)[-1]}:{key[2]}")
json.dump({"wall": wall, "kernel": seconds, "functions": sorted(found)}, open(sys.argv[2], "w"))
"""


def kernel_share(tree: Path, big_traces: Path, name: str, scratch: Path) -> dict[str, Any]:
    """A fresh in-process ``dsim run`` of the big run under cProfile: kernel time / wall."""
    results = scratch / "results-big"
    shutil.rmtree(results, ignore_errors=True)
    out = scratch / "profile.json"
    argv = ["run", name, "--traces", str(big_traces), "--out", str(results)]
    argv += ["--executor", "local", "--quiet"]
    before = load()
    wall = timed(
        [sys.executable, "-c", _PROFILE, json.dumps(KERNELS), str(out), *argv],
        tree_env(tree),
        scratch,
    )
    found = json.loads(out.read_text())
    return {
        "load_before": before,
        "load_after": load(),
        "command_s": wall,
        "profiled_s": found["wall"],
        "kernel_s": found["kernel"],
        "share": found["kernel"] / found["wall"],
        "functions": found["functions"],
    }


def summary(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [row[key] for row in rows]
    return {"best": min(values), "median": statistics.median(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help=f"git ref (default {BASELINE})")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--big", type=int, default=8_000_000, help="GPU-iterations of the kernel case"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--executors", default="local,ray")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dsim-bench")
    parser.add_argument("--out", type=Path, help="also write the measurements as JSON here")
    parser.add_argument("--quick", action="store_true", help="4 runs of 200 x 2, 1 repeat, local")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.iterations, args.gpus, args.big, args.repeats = 4, 200, 2, 20_000, 1
        args.executors = "local"
    executors = [e for e in args.executors.split(",") if e]
    if not executors or set(executors) - {"local", "ray"}:
        parser.error("--executors takes local and/or ray")

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    base_tree, base_sha = baseline_tree(work, args.baseline)
    trees = {"baseline": base_tree, "current": REPO}
    codes = {"baseline": base_sha, "current": current_code()}
    pool = cached_pool(work, args.gpus, args.iterations, 1, args.runs)
    pool_tree = tree_of(pool, args.runs)
    big_iterations = max(1, args.big // args.gpus)
    big_pool = cached_pool(work, args.gpus, big_iterations, 1, 1)

    scratch = Path(tempfile.mkdtemp(prefix="dsim-baseline-", dir=work))
    try:
        rows: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
        kernel: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
        big_traces: dict[str, Path] = {}
        for label, tree in trees.items():  # each tree parses the big run with its own parser
            big_traces[label] = scratch / f"big-traces-{label}"
            timed(
                dsim("parse", big_pool, "--out", big_traces[label], "--quiet"),
                tree_env(tree),
                scratch,
            )
        for repeat in range(args.repeats):
            for label, tree in trees.items():
                print(f"repeat {repeat + 1}/{args.repeats}: {label} ...", file=sys.stderr)
                row = end_to_end(tree, pool_tree, scratch / label, args.runs, executors)
                rows[label].append(row)
                kernel[label].append(kernel_share(tree, big_traces[label], run_name(0), scratch))
        result = {
            "machine": machine(),
            "codes": codes,
            "shape": {
                "runs": args.runs,
                "iterations": args.iterations,
                "gpus": args.gpus,
                "big_gpu_iterations": big_iterations * args.gpus,
                "repeats": args.repeats,
                "executors": executors,
            },
            "rows": rows,
            "kernel": kernel,
        }
        report(result)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def report(result: dict[str, Any]) -> None:
    rows, kernel, shape = result["rows"], result["kernel"], result["shape"]
    print(
        f"codes: baseline {result['codes']['baseline'][:12]}, current {result['codes']['current']}"
    )
    print(
        f"{shape['runs']} runs of {shape['iterations']} x {shape['gpus']}, best (median) of "
        f"{shape['repeats']}, seconds"
    )
    stages = ["parse"] + [f"{s}_{e}" for e in shape["executors"] for s in ("run", "summarize")]
    stages += [f"total_{e}" for e in shape["executors"]] + ["cached_run", "cached_summarize"]
    print(f"{'stage':<22} {'baseline':>16} {'current':>16} {'current/baseline':>17}")
    for stage in stages:
        b, c = summary(rows["baseline"], stage), summary(rows["current"], stage)
        print(
            f"{stage:<22} {b['best']:>7.2f} ({b['median']:6.2f}) {c['best']:>7.2f} "
            f"({c['median']:6.2f}) {c['best'] / b['best']:>17.2f}"
        )
    for executor in shape["executors"]:
        b = summary(rows["baseline"], f"total_{executor}")["best"]
        c = summary(rows["current"], f"total_{executor}")["best"]
        verdict = "met" if c / b <= TARGETS["e2e_ratio"] else "NOT met"
        print(f"target: {executor} total current/baseline {c / b:.2f} <= 1.0: {verdict}")
    for label in ("baseline", "current"):
        ratio = (
            summary(rows[label], "cached_run")["best"]
            / summary(rows[label], "cached_summarize")["best"]
        )
        verdict = "met" if ratio <= TARGETS["cached_over_summarize"] else "NOT met"
        print(f"{label}: cached dsim run / dsim summarize {ratio:.2f} (target <= 1.5: {verdict})")
        shares = [k["share"] for k in kernel[label]]
        verdict = "met" if max(shares) >= TARGETS["kernel_share"] else "NOT met"
        functions = ", ".join(kernel[label][0]["functions"])
        print(
            f"{label}: kernel share of a fresh run of {shape['big_gpu_iterations']:,} "
            "GPU-iterations "
            f"{', '.join(f'{s:.1%}' for s in shares)} ({functions}; target >= 30 %: {verdict})"
        )
    loads = [r[k] for label in rows for r in rows[label] for k in ("load_before", "load_after")]
    print(f"1-min load around the cases: {min(loads):.2f} to {max(loads):.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
