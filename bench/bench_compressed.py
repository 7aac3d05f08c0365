"""Parse speed and memory of one log as text, gzip and zstd (and bzip2, xz), side by side.

Usage::

    python bench/bench_compressed.py                       # 10^6 lines x 8 GPUs (~100 MB of text)
    python bench/bench_compressed.py --lines 2e4 --repeats 1 --formats plain,gz,zst,bz2,xz

The log is one synthetic interleaved run (``dsim.synth``), cached under
``--work`` with its compressed copies (written with the default levels of
Python's gzip/bz2/lzma and of ``zstandard``; writing them is not timed).
Each parse runs in a fresh interpreter with Arrow on one thread, as in
``bench_parse.py``: time of ``parse_run``, and memory as peak RSS minus the
RSS after imports. MB/s are given both of text (the decompressed log, the
same work for every format) and of the file as stored.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

SUFFIX = {"plain": "", "gz": ".gz", "zst": ".zst", "bz2": ".bz2", "xz": ".xz"}


def _compress(fmt: str, src: Path, dst: Path) -> None:
    """Stream ``src`` into ``dst`` compressed, without holding the log in memory."""
    if fmt == "zst":
        import zstandard

        with open(src, "rb") as i, open(dst, "wb") as o:
            zstandard.ZstdCompressor().copy_stream(i, o)
        return
    opener = {"gz": gzip.open, "bz2": bz2.open, "xz": lzma.open}[fmt]
    with open(src, "rb") as i, opener(dst, "wb") as o:
        while chunk := i.read(1 << 20):
            o.write(chunk)


def _files(work: Path, lines: int, formats: list[str]) -> dict[str, Path]:
    import bench_parse

    run = bench_parse._log(work, 8, lines)
    [log] = list(run.glob("*.log"))
    out = {}
    for fmt in formats:
        path = work / f"{run.name}{'.log' + SUFFIX[fmt] if fmt != 'plain' else '.log'}"
        if fmt == "plain":
            path = log
        elif not path.exists():
            tmp = path.with_suffix(path.suffix + ".part")
            _compress(fmt, log, tmp)
            tmp.rename(path)
        out[fmt] = path
    return out


def _child(path: str) -> None:
    import resource
    import time

    import pyarrow as pa

    from dsim.sources.base import RunSource
    from dsim.sources.rawlog.parse import parse_run

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    base = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    started = time.perf_counter()
    parsed = parse_run(RunSource("bench", (Path(path),)))
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(
        json.dumps(
            {
                "seconds": seconds,
                "lines": parsed.report["lines"],
                "stored": Path(path).stat().st_size,
                "peak_over_base": peak - base,
                "table_bytes": parsed.tables.fetch.nbytes + parsed.tables.train.nbytes,
                "rejected": parsed.report["rejected"],
            }
        )
    )


def _measure(path: Path) -> dict:
    done = subprocess.run(
        [sys.executable, str(HERE), "--child", str(path)], capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"parse of {path} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dsim-bench")
    parser.add_argument("--lines", type=float, default=1e6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", default="plain,gz,zst")
    parser.add_argument("--out", type=Path, help="also save the numbers as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return
    import bench_parse

    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if set(formats) - set(SUFFIX):
        parser.error(f"--formats takes {', '.join(SUFFIX)}")
    args.work.mkdir(parents=True, exist_ok=True)
    files = _files(args.work, int(args.lines), formats)
    text_bytes = files["plain"].stat().st_size if "plain" in files else None
    print(bench_parse._machine())
    print(f"parse_run on one core, best (median) of {args.repeats}; text = decompressed log")
    print(
        f"{'format':>6} {'stored MB':>9} {'ratio':>6} {'s':>13} {'text MB/s':>9}"
        f" {'stored MB/s':>11} {'lines/s':>10} {'mem MB':>7} {'mem/tbl':>7}"
    )
    results = {}
    for fmt, path in files.items():
        runs = [_measure(path) for _ in range(args.repeats)]
        assert all(r["rejected"] == 0 for r in runs), runs
        best = min(r["seconds"] for r in runs)
        median = statistics.median(r["seconds"] for r in runs)
        m = runs[0]
        text = text_bytes or m["stored"]
        mem = max(r["peak_over_base"] for r in runs)
        results[fmt] = {**m, "best_s": best, "median_s": median, "text_bytes": text, "mem": mem}
        print(
            f"{fmt:>6} {m['stored'] / 1e6:>9.1f} {text / m['stored']:>6.1f}"
            f" {best:>6.2f} ({median:>4.2f}) {text / 1e6 / best:>9.1f}"
            f" {m['stored'] / 1e6 / best:>11.1f} {m['lines'] / best:>10,.0f}"
            f" {mem / 1e6:>7.1f} {mem / m['table_bytes']:>7.2f}",
            flush=True,
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
