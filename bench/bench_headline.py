"""The time of `dsim run`'s headline (the pipeline model's verdict), with and without CPU times.

Why: on a trace with CPU times (what ``dsim.instrument`` writes) the headline takes the
pipeline model's CPU-aware path (docs/SPEC.md §4.2): for each of the nine policies a
fixed point over the contention (a bisection of whole replays) and eight trainer passes
(a replay and a sweep of every fetch's interval each). Synthetic logs carry no CPU
times, so no other benchmark reaches that path. This one times
``dsim.analysis.headline.pipeline_verdict_on`` (the nine policies, the selection of
``dsim run``'s defaults) on one synthetic run parsed twice, with and without the CPU
fields ``bench_memory.py --cpu`` adds, in a fresh interpreter per measurement, after an
untimed headline of a tiny run (imports, numba's cached kernels). Timed once per
interpreter: ``dsim run`` hands freed memory back before its headline, so the headline
starts on a small heap, and a second call in the same process (its pages already
mapped) measured every tree alike where the first differed by up to 18 %. Today's tree and
``--baseline`` commits (``git archive``d, as ``bench_baseline.py`` does) alternating
repeat by repeat. CPU seconds of the process are reported beside wall seconds: run it
alone.

Usage (repository root)::

    python bench/bench_headline.py --baseline eff9282 --repeats 3
    python bench/bench_headline.py --quick          # 8 x 2 x 2,000: works?
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_baseline import baseline_tree, current_code
from bench_memory import WARM, _logs
from machine_facts import machine

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, time
from pathlib import Path
from dsim.analysis.headline import pipeline_verdict_on
try:
    from dsim.analysis.headline import calibrate_pipeline
except ImportError:  # trees before 7 Dec 2026, afternoon: the verdict took the arrays
    calibrate_pipeline = None
from dsim.app.tune import fetch_arrays
from dsim.model.selection import selection_mask

policies = [(f, s) for f in ("actual", "min", "avg") for s in ("actual", "min", "avg")]
def once(trace):
    rows = [
        {"run": trace.name, "fetch_align": f, "start_align": s, "selected_epochs": "1",
         "gpus": 0}
        for f, s in policies
    ]
    arrays = fetch_arrays(trace, trace.name)
    mask = selection_mask(arrays.epoch, arrays.iteration, [1], 10)
    cpu, wall = time.process_time(), time.perf_counter()
    calibrated = arrays if calibrate_pipeline is None else calibrate_pipeline(arrays)
    verdict = pipeline_verdict_on(rows, calibrated, mask, 0.03, None)
    return time.process_time() - cpu, time.perf_counter() - wall, verdict
once(Path(sys.argv[2]))  # a small run first: imports done, kernels from numba's cache
cpu, wall, verdict = once(Path(sys.argv[1]))
import dsim
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "ok": verdict is not None,
                  "cpu_aware": verdict is not None and "CPU-aware" in verdict.text,
                  "dsim": dsim.__file__}))
"""


def _output(cmd: list[str], what: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> str:
    """Standard output of one child; a failure stops the benchmark with its error."""
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def _parse(logs: Path, traces: Path) -> Path:
    """``dsim parse`` of one run's logs with today's tree; the parsed run's directory."""
    cmd = [sys.executable, "-m", "dsim", "parse", str(logs), "--out", str(traces), "-q"]
    _output(cmd, f"dsim parse {logs}")
    return traces / logs.name


def _measure(tree: Path, trace: Path, warm: Path) -> dict[str, float]:
    """One headline of ``trace`` in a fresh interpreter running ``tree``'s dsim.

    Run from ``tree`` itself: ``python -c`` puts its working directory first on
    ``sys.path``, so a child started in the repository imported today's dsim whatever
    ``PYTHONPATH`` said (every tree measured the same code until this was found); the
    child names the dsim it imported, and a different one stops the benchmark."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-c", _CHILD, str(trace.resolve()), str(warm.resolve())]
    out = _output(cmd, f"headline on {trace} with {tree}", env, cwd=tree)
    got = json.loads(out.strip().splitlines()[-1])
    imported = Path(got.pop("dsim")).resolve()
    if not imported.is_relative_to(tree.resolve()):
        raise SystemExit(f"the child for {tree} imported {imported}")
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", action="append", default=[], help="commit(s) to compare")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="8 GPUs x 2 epochs x 2,000")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dsim-bench")
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args(argv)
    shape = {"gpus": 8, "iterations": 2_000 if args.quick else 62_500, "epochs": 2}
    work = args.work / "memory"
    trees = [(f"baseline {ref}", baseline_tree(args.work, ref)[0]) for ref in args.baseline]
    trees.append((f"current {current_code()[:12]}", REPO))
    with tempfile.TemporaryDirectory(prefix="headline-", dir=args.work) as tmp:
        traces = {
            kind: _parse(_logs(work, shape, cpu), Path(tmp) / kind)
            for kind, cpu in (("with CPU times", True), ("without", False))
        }
        warm = _parse(_logs(work, WARM, True), Path(tmp) / "warm")
        gpu_iterations = shape["gpus"] * shape["iterations"] * shape["epochs"]
        print(f"machine: {json.dumps(machine())}")
        print(
            f"headline of one run of {gpu_iterations:,} GPU-iterations (9 policies), "
            f"{args.repeats} repeats alternating; load before {os.getloadavg()[0]:.2f}"
        )
        results: dict[str, dict[str, list[dict[str, float]]]] = {}
        for _ in range(args.repeats):
            for kind, trace in traces.items():
                for label, tree in trees:
                    got = _measure(tree, trace, warm)
                    if got.pop("cpu_aware") != (kind == "with CPU times"):
                        raise SystemExit(f"{label}: the headline on {kind} took the wrong path")
                    results.setdefault(kind, {}).setdefault(label, []).append(got)
                    print(f"  {kind:15s} {label:24s} cpu {got['cpu_s']:7.2f} s  wall "
                          f"{got['wall_s']:7.2f} s", flush=True)  # fmt: skip
        print(f"load after {os.getloadavg()[0]:.2f}")
        print(f"{'trace':15s} {'code':24s} {'CPU s, median':>14s} {'min':>7s} {'max':>7s}")
        for kind, by_tree in results.items():
            for label, runs in by_tree.items():
                cpu = [r["cpu_s"] for r in runs]
                print(
                    f"{kind:15s} {label:24s} {statistics.median(cpu):14.2f} "
                    f"{min(cpu):7.2f} {max(cpu):7.2f}"
                )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"shape": shape, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
