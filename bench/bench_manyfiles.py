"""Parse of many small per-rank files against a few large ones, old code beside new, one run.

Why: a run logged as ``rank<N>.log`` per rank reaches 1024 small files, and
the parse used to pay a fixed cost per file (issue 21, item 4). Two runs with
the same lines -- 1024 files x 100 iterations and 8 files x 12,800 -- are
parsed by each code tree: the fixed cost per file is the difference of
their times over the difference of their file counts. The base tree (the
code before the change, ``--base``, checked out with ``git worktree add`` and removed after)
and this tree are measured alternately in the same run, each case in a fresh
interpreter with Arrow on one thread:

- ``seconds``: ``parse_run`` alone, best of ``--repeats``;
- ``rss/tbl``: peak RSS minus the RSS after imports, over the tables' ``nbytes``
  (includes the ~8 MB a first parse pages in: code, lazy imports);
- ``traced/tbl``: the peak of what the parse allocates (``tracemalloc``: Python
  and NumPy) plus Arrow's pool peak, over the tables' ``nbytes`` (another run:
  tracing slows the parse).

Usage (repository root)::

    python bench/bench_manyfiles.py                   # base b1c11d7 vs this tree, ~1 min
    python bench/bench_manyfiles.py --base none       # this tree only
    python bench/bench_manyfiles.py --quick           # small cases, this tree only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
BASE = "b1c11d7"  # the parent of the batched reader (dsim.sources.rawlog.smallfiles)
FULL = ((1024, 100), (8, 12_800))  # (files, iterations): the same 204,800 lines
QUICK = ((64, 20), (8, 160))


def _child(run_dir: str, trace: bool) -> None:
    """Parse one run in this interpreter; print one JSON line of measurements."""
    import resource
    import time
    import tracemalloc

    import pyarrow as pa

    import dsim
    from dsim.sources.rawlog.discover import discover_runs
    from dsim.sources.rawlog.parse import parse_run

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    [source] = discover_runs([Path(run_dir)])
    rss_base = _rss_bytes()
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    parsed = parse_run(source)
    seconds = time.perf_counter() - started
    out: dict[str, Any] = {"seconds": seconds, "dsim": str(Path(dsim.__file__).parent)}
    if trace:
        out["traced_peak"] = tracemalloc.get_traced_memory()[1]
        out["traced_peak"] += pa.default_memory_pool().max_memory()
    else:
        out["rss_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_base
    out["lines"] = parsed.report["lines"]
    out["files"] = len(source.files)
    out["table_bytes"] = parsed.tables.fetch.nbytes + parsed.tables.train.nbytes
    print(json.dumps(out))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _run_dir(work: Path, files: int, iterations: int) -> Path:
    """The cached synthetic per-rank run: one fetch and one training line a rank and iteration."""
    from dsim.synth import SynthParams, synthesize

    params = SynthParams(
        gpus=files, iterations=iterations, epochs=1, workers=8, per_rank=True,
        name=f"manyfiles_g{files}_i{iterations}",
    )  # fmt: skip
    target = work / params.run_name
    if not target.exists():
        synthesize(params, work)
    return target


def _base_tree(work: Path, commit: str) -> Path:
    """A checkout of ``commit`` beside the repository (``git worktree add``), removed after."""
    tree = work / f"base-{commit}"
    if not (tree / "dsim").is_dir():
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit],
            check=True,
            capture_output=True,
        )
    return tree


def _measure(tree: Path, run_dir: Path, trace: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(HERE), "--child", str(run_dir), *(["--trace"] if trace else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"parse of {run_dir} with {tree} failed:\n{done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(out["dsim"]).resolve() != (tree / "dsim").resolve():
        raise SystemExit(f"{tree} imported dsim from {out['dsim']}: check PYTHONPATH")
    return out


def measure(work: Path, trees: dict[str, Path], cases, repeats: int) -> dict[str, Any]:
    """Every tree on every case, alternating trees so that load changes hit both alike."""
    runs = {case: _run_dir(work, *case) for case in cases}
    got: dict[str, dict] = {name: {case: [] for case in cases} for name in trees}
    traced: dict[str, dict] = {name: {} for name in trees}
    for _ in range(repeats):
        for case in cases:
            for name, tree in trees.items():
                got[name][case].append(_measure(tree, runs[case], trace=False))
    for case in cases:
        for name, tree in trees.items():
            traced[name][case] = _measure(tree, runs[case], trace=True)
    rows = []
    for name in trees:
        for case in cases:
            best = min(got[name][case], key=lambda m: m["seconds"])
            rows.append(
                {
                    "tree": name,
                    "files": case[0],
                    "iterations": case[1],
                    "lines": best["lines"],
                    "seconds": best["seconds"],
                    "all_s": [m["seconds"] for m in got[name][case]],
                    "lines_per_s": best["lines"] / best["seconds"],
                    "table_bytes": best["table_bytes"],
                    "rss_ratio": min(m["rss_peak"] for m in got[name][case]) / best["table_bytes"],
                    "traced_ratio": traced[name][case]["traced_peak"] / best["table_bytes"],
                }
            )
    many, few = cases
    fixed = {}
    for name in trees:
        t = {(r["files"], r["iterations"]): r["seconds"] for r in rows if r["tree"] == name}
        fixed[name] = (t[many] - t[few]) / (many[0] - few[0]) * 1e3
    return {"rows": rows, "fixed_ms_per_file": fixed}


def report(res: dict[str, Any]) -> None:
    print(f"{'tree':>5} {'files':>5} {'iters':>6} {'lines':>8} {'s':>7} {'lines/s':>10}"
          f" {'rss/tbl':>7} {'traced/tbl':>10}")  # fmt: skip
    for r in res["rows"]:
        print(
            f"{r['tree']:>5} {r['files']:>5} {r['iterations']:>6} {r['lines']:>8}"
            f" {r['seconds']:>7.3f} {r['lines_per_s']:>10,.0f} {r['rss_ratio']:>7.2f}"
            f" {r['traced_ratio']:>10.2f}"
        )
    fixed = res["fixed_ms_per_file"]
    print("fixed cost per file (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in fixed.items()))
    if "base" in fixed and fixed["new"] > 0:
        print(f"base / new fixed cost per file: {fixed['base'] / fixed['new']:.1f}x")
    by = {(r["tree"], r["files"]): r for r in res["rows"]}
    many = res["rows"][0]["files"]
    if ("base", many) in by:
        ratio = by[("new", many)]["lines_per_s"] / by[("base", many)]["lines_per_s"]
        print(f"new / base lines/s at {many} files: {ratio:.1f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dsim-bench")
    parser.add_argument("--base", default=None, help=f"commit to compare with (default {BASE})")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small cases, no base unless named")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.trace)
        return 0
    base = args.base if args.base is not None else (None if args.quick else BASE)
    work = args.work / "manyfiles"
    work.mkdir(parents=True, exist_ok=True)
    trees = {"new": REPO}
    if base and base != "none":
        trees = {"base": _base_tree(work, base), "new": REPO}
    cases = QUICK if args.quick else FULL
    print(f"== many files: parse_run, {' vs '.join(trees)} (base {base}), one Arrow thread ==")
    try:
        res = measure(work, trees, cases, 1 if args.quick else args.repeats)
    finally:  # leave no checkout registered in the repository
        if "base" in trees:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(trees["base"])],
                check=False,
                capture_output=True,
            )
    res |= {"base": base, "cases": [list(c) for c in cases], "quick": args.quick}
    res["load"] = [round(x, 2) for x in os.getloadavg()]
    report(res)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
