"""How fast `dsim synth` writes raw logs, in lines per second, and how much memory it needs.

Why: synthetic logs feed every other benchmark (10^7-line runs for the parser
and the replay), so their generation must not be the bottleneck, and it must
stream: peak memory has to stay flat however many lines are written.

Usage (from the repository root):

    python bench/synth_speed.py                      # default shapes, 10^6 lines each
    python bench/synth_speed.py --lines 10000000     # the 10^7-line streaming check
    python bench/synth_speed.py --json out.json      # machine-readable results

Both wall-clock and CPU time are reported: on a shared machine wall time
includes waiting for a core, CPU time is what the generator itself costs.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from dsim.synth import SynthParams, synthesize

# (gpus, workers, prefetch): a common DDP node, a smaller one, and a degenerate
# prefetch window of one batch (the model's slowest case: one window per iteration).
SHAPES = ((8, 8, 2), (4, 4, 2), (4, 1, 1))


def measure(gpus: int, workers: int, prefetch: int, lines: int, out: Path) -> dict:
    iterations = max(1, lines // (2 * gpus))
    params = SynthParams(
        gpus=gpus, iterations=iterations, epochs=1, workers=workers, prefetch=prefetch, name="bench"
    )
    wall, cpu = time.perf_counter(), time.process_time()
    path = synthesize(params, out)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    size = sum(p.stat().st_size for p in path.iterdir())
    shutil.rmtree(path)
    return {
        "gpus": gpus,
        "workers": workers,
        "prefetch": prefetch,
        "lines": params.lines,
        "bytes": size,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "lines_per_s_wall": round(params.lines / wall),
        "lines_per_s_cpu": round(params.lines / cpu),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="lines per shape")
    parser.add_argument("--out", type=Path, default=None, help="scratch directory (default: tmp)")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="dsim-synth-bench-", dir=args.out))
    results = []
    try:
        for gpus, workers, prefetch in SHAPES:
            row = measure(gpus, workers, prefetch, args.lines, scratch)
            results.append(row)
            print(
                f"G={gpus} W={workers} P={prefetch}: {row['lines']:,} lines, "
                f"{row['bytes'] / 1e6:,.0f} MB in {row['wall_s']:.2f} s wall "
                f"({row['lines_per_s_wall']:,} lines/s), {row['cpu_s']:.2f} s CPU "
                f"({row['lines_per_s_cpu']:,} lines/s); peak RSS {row['peak_rss_mb']} MB",
                flush=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
