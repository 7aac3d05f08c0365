"""The Parquet writer's step: Arrow's default 1,024 values (dsim's) against 65,536.

Why: the writer has a fixed cost per step of values (statistics, the page-size
and dictionary-size checks); a first, noisy measurement put larger steps ~11 %
ahead on a tidy dataset's write, and they were adopted, then taken out when
this side-by-side run found no gain. This measures both, interleaved, on
what ``dsim run`` and ``dsim parse`` write for one synthetic run of 10,000
iterations x 8 GPUs: the two dataset files of its 9 replays (written through
``DatasetWriter``, as ``dsim run`` writes them) and its two trace tables (as
``dsim parse`` writes them), in fresh files, and checks that both steps give
the same bytes where every column chunk is under a page.

Usage (repository root)::

    python bench/bench_write_batch.py [--iterations 10000] [--gpus 8] [--repeats 15]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsim.io import parquetio
from dsim.model import dataset
from dsim.model.columns import METRIC_COLUMNS

POLICIES = [(f, s) for f in ("actual", "avg", "min") for s in ("actual", "avg", "min")]


def replay_table(rng: np.random.Generator, n: int, gpus: int) -> pa.Table:
    """A replay's wide table: per-iteration metrics, and stalls that repeat (zeros,
    a few values), as a replay's do."""
    columns: dict[str, np.ndarray] = {
        "epoch": np.zeros(n, np.int64),
        "iteration": np.arange(n, dtype=np.int64),
    }
    for m in METRIC_COLUMNS:
        columns[m] = rng.gamma(2.0, 0.01, n)
    levels = np.round(rng.gamma(1.5, 0.004, 64), 6)
    for g in range(gpus):
        columns[f"stall_s_gpu{g}"] = np.where(rng.random(n) < 0.6, 0.0, rng.choice(levels, n))
    return pa.table(columns)


def trace_tables(rng: np.random.Generator, n: int, gpus: int) -> list[pa.Table]:
    """A trace's fetch and training tables' shape: integer keys, nanosecond starts, float
    durations (nearly all distinct)."""
    rows = n * gpus
    keys = {
        "epoch": np.zeros(rows, np.int32),
        "gpu": np.tile(np.arange(gpus, dtype=np.int32), n),
        "iteration": np.repeat(np.arange(n, dtype=np.int32), gpus),
    }
    start = np.cumsum(rng.integers(1_000_000, 30_000_000, rows)).astype(np.int64)
    fetch = pa.table({**keys, "start": start, "fetch_s": rng.gamma(2, 0.01, rows)})
    train = pa.table({**keys, "start": start, "iteration_s": rng.gamma(2, 0.02, rows)})
    return [fetch, train]


def write_dataset(replays: list[pa.Table], out: Path) -> list[Path]:
    ident = {
        "run": "bench",
        "replay_model": "per_iteration",
        "loader_workers": None,
        "loader_prefetch_factor": None,
        "loader_changed": False,
    }
    writer = dataset.DatasetWriter(out, "bench", dataset.metadata("bench", "bench", {}))
    for policy, replay in zip(POLICIES, replays, strict=True):
        writer.add_replay(ident, policy, replay)
    return writer.commit()


def write_traces(tables: list[pa.Table], out: Path) -> list[Path]:
    paths = []
    for k, table in enumerate(tables):
        path = out / f"t{k}.parquet"
        parquetio.write_table(table, path, distinct=True)
        paths.append(path)
    return paths


def digest(paths: list[Path]) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()[:16]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    replays = [replay_table(rng, args.iterations, args.gpus) for _ in POLICIES]
    traces = trace_tables(rng, args.iterations, args.gpus)
    steps = {f"{parquetio.WRITE_BATCH_SIZE:,} (dsim)": None, "65,536": 65536}
    default = parquetio.WRITE_BATCH_SIZE
    times: dict[tuple[str, str], list[float]] = {}
    digests: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            for label, step in steps.items():
                parquetio.WRITE_BATCH_SIZE = default if step is None else step
                try:
                    for what, write, data in (
                        ("dataset", write_dataset, replays),
                        ("traces", write_traces, traces),
                    ):
                        out = Path(tmp) / f"{k}-{what}-{step}"
                        out.mkdir()
                        began = time.perf_counter()
                        paths = write(data, out)
                        times.setdefault((what, label), []).append(time.perf_counter() - began)
                        digests[(what, label)] = digest(paths)
                finally:
                    parquetio.WRITE_BATCH_SIZE = default
    print(
        f"one run of {args.iterations:,} x {args.gpus}, 9 policies; "
        f"{args.repeats} interleaved repeats; ms, median (min)"
    )
    for what in ("dataset", "traces"):
        medians = []
        for label in steps:
            values = times[(what, label)]
            medians.append(statistics.median(values))
            print(
                f"{what:8s} step {label:24s} {1000 * medians[-1]:7.1f} "
                f"({1000 * min(values):6.1f})  bytes sha256 {digests[(what, label)]}"
            )
        same = len({digests[(what, label)] for label in steps}) == 1
        print(f"{what:8s} ratio 65,536/dsim's {medians[1] / medians[0]:.2f}; same bytes: {same}")


if __name__ == "__main__":
    main()
