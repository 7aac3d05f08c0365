"""How long ``dsim`` takes to start and answer, per command: paths that do no real work,
and ``dsim parse`` of two small inputs, where the start-up is most of the time.

Why: every CLI call pays the interpreter's start-up and the imports of the
modules it loads before it can say anything. ``dsim --version``, ``--help``
and usage or input errors (a missing file: exit 2 or 3) should answer
before pandas, pyarrow, plotly or Ray are loaded; the test suite also runs
hundreds of such calls. This times each case in a fresh interpreter,
interleaved (one round of every case, then the next), and prints the
median and best of the repeats next to a bare ``python -c pass``.

Usage (repository root)::

    python bench/bench_startup.py                 # 5 repeats
    python bench/bench_startup.py --repeats 9 --json out.json
    python bench/bench_startup.py --tree ../before --tree .   # two checkouts, side by side

``--tree DIR`` runs ``python -m dsim`` with ``PYTHONPATH=DIR`` (a checkout's root), so
two versions are timed interleaved on the same load; without it, the ``dsim`` on the
current path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: name -> arguments after ``python -m dsim`` ({missing}: a path that does not exist)
CASES: dict[str, list[str]] = {
    "dsim --version": ["--version"],
    "dsim --help": ["--help"],
    "dsim parse --help": ["parse", "--help"],
    "dsim parse MISSING": ["parse", "{missing}"],
    "dsim run --conf MISSING": ["run", "--conf", "{missing}"],
    "dsim summarize MISSING": ["summarize", "{missing}"],
    "dsim report MISSING": ["report", "{missing}"],
    "dsim compare MISSING": ["compare", "{missing}", "{missing}"],
    "dsim tune MISSING": ["tune", "{missing}"],
    "dsim watch MISSING": ["watch", "{missing}"],
    "dsim summarize --epochs x": ["summarize", "--epochs", "x", "{missing}"],
    "dsim run --fail-if x": ["run", "--fail-if", "x"],
    "dsim summarize --format xml": ["summarize", "{missing}", "--format", "xml", "--out", "o"],
    "dsim help spec 9": ["help", "spec", "9"],
    # real work, small: the shipped sample (4 ranks x 600 iterations), and one validation
    # run's compressed per-rank logs as dsim.instrument writes them (CPU times, LOADER lines)
    "dsim parse SAMPLE": ["parse", "{sample}", "--out", "{out}", "--quiet"],
    "dsim parse INSTRUMENTED": ["parse", "{instrumented}", "--out", "{out}", "--quiet"],
}
REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "traces" / "raw"
INSTRUMENTED = REPO / "validation" / "data-h200cpu" / "cpu_w4_p2_none_r1"


def _time(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, int]:
    """Seconds from start to exit of ``argv``, and its exit code. ``cwd``: a directory
    without a ``dsim`` package (``python -m`` puts the working directory first on the path,
    ahead of ``--tree``'s ``PYTHONPATH``)."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=False)
    return time.perf_counter() - start, done.returncode


def main() -> None:
    """Time every case ``--repeats`` times, interleaved, and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the timings here")
    parser.add_argument(
        "--tree", action="append", type=Path, help="a checkout to time (repeat to compare)"
    )
    args = parser.parse_args()
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("DSIM_DEBUG", None)
    trees = [tree.resolve() for tree in args.tree] if args.tree else [None]
    envs = {tree: {**env, "PYTHONPATH": str(tree)} if tree else env for tree in trees}
    envs[None] = env
    with tempfile.TemporaryDirectory() as tmp:
        missing = str(Path(tmp) / "missing")
        cases = {("python -c pass", None): [sys.executable, "-c", "pass"]}
        for name, rest in CASES.items():
            for tree in trees:
                where = {
                    "missing": missing,
                    "sample": str(SAMPLE),
                    "instrumented": str(INSTRUMENTED),
                    "out": str(Path(tmp) / "traces"),  # parse replaces its own run directories
                }
                argv = [sys.executable, "-m", "dsim", *(a.format(**where) for a in rest)]
                cases[(name, tree)] = argv
        times: dict[tuple, list[float]] = {key: [] for key in cases}
        codes: dict[tuple, int] = {}
        start = os.getloadavg()
        for _ in range(args.repeats):
            for key, argv in cases.items():
                seconds, codes[key] = _time(argv, envs[key[1]], tmp)
                times[key].append(seconds)
    load = os.getloadavg()
    print(f"load average (1, 5, 15 min): {start[0]:.2f} {start[1]:.2f} {start[2]:.2f} at the")
    print(f"start, {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
    print(f"{'case':32} {'tree':>12} {'exit':>4} {'median s':>9} {'best s':>7}")
    for (name, tree), values in times.items():
        median, best = statistics.median(values), min(values)
        where = tree.name if tree else "-"
        print(f"{name:32} {where:>12} {codes[(name, tree)]:>4} {median:>9.3f} {best:>7.3f}")
    if args.json:
        rows = [
            {"case": name, "tree": str(tree), "code": codes[(name, tree)], "seconds": values}
            for (name, tree), values in times.items()
        ]
        args.json.write_text(json.dumps({"load": [start, load], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
