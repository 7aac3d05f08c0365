"""Throughput and memory of `dsim parse` on synthetic interleaved logs, on one core.

Usage::

    python bench/bench_parse.py                      # 10^4..10^6 lines x 8 GPUs, 10^5 x 1/8/64
    python bench/bench_parse.py --lines 1e7          # add sizes (needs ~1.2 GB of disk per 10^7)
    python bench/bench_parse.py --profile            # also where the time goes (cProfile)

Logs come from ``dsim.synth`` (the queueing model, interleaved ``output.log``)
and are cached under ``--work`` so that repeated runs time only the parse.
Each measurement runs in a fresh interpreter: Arrow and NumPy are imported,
the RSS is taken, then ``parse_run`` runs with Arrow limited to one CPU and
one I/O thread. Memory is reported as peak RSS minus the RSS after imports,
against the in-memory size of the tables the parse produced (``nbytes``):
the parser should hold little more than its result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()


def _child(run_dir: str, profile: bool) -> None:
    """Parse one run and print one JSON line of measurements (runs in its own process)."""
    import resource
    import time

    import pyarrow as pa

    from dsim.sources.rawlog.discover import discover_runs
    from dsim.sources.rawlog.parse import parse_run

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    [source] = discover_runs([Path(run_dir)])
    rss_base = _rss_bytes()
    started = time.perf_counter()
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        parsed = profiler.runcall(parse_run, source)
        seconds = time.perf_counter() - started
        stats = pstats.Stats(profiler, stream=sys.stderr)
        stats.sort_stats("cumulative").print_stats(r"dsim/(grammar|parse|logfile|epochs)\.py", 25)
    else:
        parsed = parse_run(source)
        seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    tables = parsed.tables.fetch.nbytes + parsed.tables.train.nbytes
    result = {
        "lines": parsed.report["lines"],
        "bytes": sum(p.stat().st_size for p in source.files),
        "seconds": seconds,
        "peak_over_base": peak - rss_base,
        "table_bytes": tables,
        "rejected": parsed.report["rejected"],
    }
    print(json.dumps(result))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _log(work: Path, gpus: int, lines: int) -> Path:
    """The cached synthetic run with about ``lines`` lines (one fetch + one train per rank/iter)."""
    from dsim.synth import SynthParams, synthesize

    iterations = max(1, round(lines / (2 * gpus)))
    params = SynthParams(
        gpus=gpus, iterations=iterations, epochs=1, workers=8, name=f"bench_g{gpus}_i{iterations}"
    )
    target = work / params.run_name
    if not target.exists():
        synthesize(params, work)
    return target


def _measure(run_dir: Path, profile: bool = False) -> dict:
    out = subprocess.run(
        [sys.executable, str(HERE), "--child", str(run_dir), *(["--profile"] if profile else [])],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"parse of {run_dir} failed:\n{out.stderr}")
    if profile:
        print(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        mem = f"{mem_kb / 2**20:.0f} GiB"
    except OSError:
        mem = "? GiB"
    python = sys.version.split()[0]
    return f"{platform.node()}: {os.cpu_count()} cores, {cpu}, {mem} RAM, Python {python}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dsim-bench")
    parser.add_argument("--lines", type=float, nargs="*", default=[], help="extra sizes (8 GPUs)")
    parser.add_argument("--profile", action="store_true", help="profile the 10^6-line parse")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.profile)
        return

    cases = [(8, 10**4), (8, 10**5), (8, 10**6), *((8, int(n)) for n in args.lines)]
    cases += [(1, 10**5), (64, 10**5)]
    print(_machine())
    print(
        "parse_run on one core (pyarrow cpu/io threads = 1); memory = peak RSS - RSS after imports"
    )
    header = f"{'gpus':>4} {'lines':>10} {'MB':>8} {'s':>7} {'lines/s':>10} {'MB/s':>6}"
    header += f" {'mem MB':>7} {'tbl MB':>7} {'mem/tbl':>7}"
    print(header)
    args.work.mkdir(parents=True, exist_ok=True)
    for gpus, lines in cases:
        m = _measure(_log(args.work, gpus, lines))
        assert m["rejected"] == 0, m
        mb = m["bytes"] / 1e6
        print(
            f"{gpus:>4} {m['lines']:>10} {mb:>8.1f} {m['seconds']:>7.2f}"
            f" {m['lines'] / m['seconds']:>10,.0f} {mb / m['seconds']:>6.1f}"
            f" {m['peak_over_base'] / 1e6:>7.1f} {m['table_bytes'] / 1e6:>7.1f}"
            f" {m['peak_over_base'] / m['table_bytes']:>7.2f}",
            flush=True,
        )
    if args.profile:
        _measure(_log(args.work, 8, 10**6), profile=True)


if __name__ == "__main__":
    main()
