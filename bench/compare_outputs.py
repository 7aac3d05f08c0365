"""Byte-for-byte comparison of dsim's outputs between two revisions.

A restructuring must not change what dsim writes. This script checks out a
base revision (default: the merge-base of HEAD and ``main``) into a temporary
git worktree, then runs the same commands with each tree on ``PYTHONPATH``
(the same interpreter and dependencies for both) in two scratch directories:

1. ``dsim parse`` of the shipped sample (``traces/raw``), ``dsim run`` of its
   nine policy pairs, ``dsim summarize --format csv,parquet,json``,
   ``dsim report``;
2. the same for two ``dsim synth`` runs (one log file, and one file per rank).

Every file either tree wrote is compared byte for byte; the script prints
each difference and exits 1 if there is any. Usage::

    python bench/compare_outputs.py [--base REV] [--head DIR]
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SYNTH = [
    ["--gpus", "4", "--iterations", "300", "--epochs", "2", "--workers", "2", "--seed", "7"],
    ["--gpus", "3", "--iterations", "200", "--epochs", "3", "--workers", "4", "--seed", "11",
     "--per-rank", "--skew", "0.3", "--name", "synth_per_rank"],
]  # fmt: skip


def _dsim(tree: Path, cwd: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "dsim", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"dsim {' '.join(args)} failed in {tree}:\n{done.stderr}")


def build(tree: Path, work: Path) -> None:
    """Every output of the scenario, written by the dsim of ``tree`` under ``work``."""
    work.mkdir(parents=True)
    (work / "raw").symlink_to(REPO / "traces" / "raw")
    for k, args in enumerate(SYNTH):
        _dsim(tree, work, "synth", *args, "--out", f"synth{k}", "-q")
    _dsim(tree, work, "parse", "raw", "synth0", "synth1", "--out", "traces", "-q")
    _dsim(tree, work, "run", "*", "--executor", "local", "-q")
    _dsim(
        tree, work, "summarize", "results", "--out", "summaries", "--format", "csv,parquet,json",
        "-q",
    )  # fmt: skip
    _dsim(tree, work, "report", "results", "--out", "report.html")


def files(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and "raw" not in p.relative_to(root).parts[:1]
    }


def compare(base: Path, head: Path) -> list[str]:
    """Differences between the two output trees, one line each (empty: identical)."""
    a, b = files(base), files(head)
    problems = [f"only in base: {p}" for p in sorted(a - b)]
    problems += [f"only in head: {p}" for p in sorted(b - a)]
    for name in sorted(a & b):
        if not filecmp.cmp(base / name, head / name, shallow=False):
            problems.append(f"differs: {name}: {_first_difference(base / name, head / name)}")
    return problems


def _first_difference(a: Path, b: Path) -> str:
    """Where two files part, with a little context, so a difference can be judged at once."""
    x, y = a.read_bytes(), b.read_bytes()
    at = next(
        (i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y))
    )
    return (
        f"first at byte {at} of {len(x)}/{len(y)}: "
        f"base {x[max(at - 20, 0) : at + 60]!r} / head {y[max(at - 20, 0) : at + 60]!r}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="base revision (default: merge-base of HEAD and main)")
    parser.add_argument("--head", type=Path, default=REPO, help="tree to compare (default: this)")
    args = parser.parse_args()
    git = ["git", "-C", str(REPO)]
    base_rev = (
        args.base
        or subprocess.check_output([*git, "merge-base", "HEAD", "main"], text=True).strip()
    )
    with tempfile.TemporaryDirectory(prefix="dsim-compare-") as tmp:
        tmp_path = Path(tmp)
        base_tree = tmp_path / "base-tree"
        subprocess.run(
            [*git, "worktree", "add", "--detach", "-q", str(base_tree), base_rev], check=True
        )
        try:
            build(base_tree, tmp_path / "base")
            build(args.head.resolve(), tmp_path / "head")
            problems = compare(tmp_path / "base", tmp_path / "head")
            count = len(files(tmp_path / "head"))
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(base_tree)], check=True)
    print(f"base {base_rev[:12]} vs {args.head}: {count} files compared")
    for line in problems:
        print(line)
    print("identical" if not problems else f"{len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
