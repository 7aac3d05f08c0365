"""Parsing dsim.instrument's optional fetch-line fields, this tree beside another, in one run.

Why: the fast path reads the optional suffixes (``cpu C runq Q``, since this
version ``proc P``) only on lines that carry them; this measures what a new
suffix costs logs that carry the old ones, and what it costs to carry it.
Two logs of 8 ranks x ``--iterations`` (a fetch and a training line each):
with ``cpu``/``runq`` only, and with ``proc`` too. Each parse runs in a fresh
interpreter pinned to one core (taskset, where present; pyarrow's pools at one thread), the trees
alternating, ``--rounds`` times; medians and every time are printed.

Usage (repository root)::

    git worktree add /tmp/dsim-old <commit>
    python bench/bench_parse_fields.py --other /tmp/dsim-old [--iterations 60000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMER = """
import sys, time
from pathlib import Path
import pyarrow as pa
pa.set_cpu_count(1)
pa.set_io_thread_count(1)
from dsim.sources.rawlog.discover import discover_runs
from dsim.sources.rawlog.parse import parse_run
(source,) = discover_runs([Path(sys.argv[1])], name="run")
began = time.perf_counter()
parse_run(source, strict=True)
print(time.perf_counter() - began)
"""


def write_log(directory: Path, iterations: int, proc: bool) -> Path:
    """8 per-rank files of dsim.instrument's lines, CPU fields on every line."""
    from dsim.instrument.lines import fetch_line, training_line

    directory.mkdir(parents=True, exist_ok=True)
    for rank in range(8):
        lines, t = [], 1.7e9
        for i in range(iterations):
            t += 0.05
            p = 0.023 if proc else None
            lines.append(fetch_line(t, rank, i % 4, 0.04, i, 0.02, 0.001, proc=p))
            lines.append(
                training_line(
                    t + 0.01, rank, 0, i, iterations, (0.05, 0.05), (0.001, 0.001), None,
                    (0.01, 0.01), (0.001, 0.001),
                )
            )  # fmt: skip
        (directory / f"rank{rank}.log").write_text("".join(lines))
    return directory


def parse_seconds(tree: Path, log: Path) -> float:
    """One parse of ``log`` by the dsim in ``tree``, in a fresh interpreter on one core."""
    pin = []
    if shutil.which("taskset") and hasattr(os, "sched_getaffinity"):
        pin = ["taskset", "-c", str(min(os.sched_getaffinity(0)))]
    done = subprocess.run(
        [*pin, sys.executable, "-c", TIMER, str(log)],
        env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tempfile.gettempdir(),
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, help="the other tree (a worktree)")
    parser.add_argument("--iterations", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dsim-fields-") as tmp:
        logs = {
            "cpu runq": write_log(Path(tmp) / "cpu", args.iterations, proc=False),
            "cpu runq proc": write_log(Path(tmp) / "proc", args.iterations, proc=True),
        }
        cases = [("this tree", REPO, "cpu runq"), ("this tree", REPO, "cpu runq proc"),
                 ("other tree", args.other, "cpu runq")]  # fmt: skip
        times: dict[tuple[str, str], list[float]] = {(c[0], c[2]): [] for c in cases}
        for _ in range(args.rounds):
            for name, tree, fields in cases:
                times[(name, fields)].append(parse_seconds(tree, logs[fields]))
    print(f"{16 * args.iterations:,} lines, one core, load {os.getloadavg()[0]:.2f} at the end")
    for (name, fields), values in times.items():
        shown = " ".join(f"{v:.2f}" for v in values)
        print(f"{name:<11}{fields:<15} median {statistics.median(values):.3f} s  ({shown})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
