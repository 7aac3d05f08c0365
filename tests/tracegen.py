"""Small synthetic parsed runs (tables written as `dsim parse` would) for tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from dsim.model.tables import RunTables, write_run

# The original analysis's config, with the legacy keys dsim ignores: it must run unchanged.
# (Its TRAINING_TIME and FETCH_DELAY, the dependency replay's constant training time and fetch
# delay, are rejected: tests/test_config.py.)
ORIGINAL_CONFIG = {
    "FILE": "fsNprepNloadNtrain_openimage_randaugment_resnet50_epoch2_b2048_worker12_thread0",
    "IOFILE": "./log/io_time.csv",
    "FETCH_ALIGN": [False, "avg", "min"],
    "START_ALIGN": [False, "avg", "min"],
    "WORKER_NUM": 3,
    "PADDING_TIME": 0.0003,
    "PREFETCH_FACTOR": 2,
    "PREFETCH_DELAY": 0.2,
}

BASE_NS = 1_630_000_000 * 10**9


def synthetic_run(
    name: str = "synth_run", *, gpus: int = 4, epochs: int = 2, iterations: int = 40, seed: int = 0
) -> RunTables:
    """A small, irregular trace: random fetch starts, durations and stalls on every GPU.

    Stalls mix zeros, tiny values and values above stall_grow_min so that
    every branch of the replay rule is taken.
    """
    rng = np.random.default_rng(seed)
    e, i, g = np.meshgrid(np.arange(epochs), np.arange(iterations), np.arange(gpus), indexing="ij")
    e, i, g = e.ravel(), i.ravel(), g.ravel()
    n = e.size
    start_ns = BASE_NS + (e * 10_000 + i * 2) * 10**9 + rng.integers(0, 800_000_000, n)
    fetch_s = rng.exponential(1.0, n)
    end_ns = start_ns + (fetch_s * 1e9).astype(np.int64)
    stall = np.where(rng.random(n) < 0.3, 0.000002, rng.exponential(0.5, n))
    iteration_s = stall + rng.uniform(0.8, 1.0, n)
    train_ns = end_ns + rng.integers(0, 10**8, n)
    fetch = pa.table(
        {
            "epoch": pa.array(e, pa.int32()),
            "iteration": pa.array(i, pa.int32()),
            "gpu": pa.array(g, pa.int32()),
            "worker": pa.array(i % 3, pa.int32()),
            "start": pa.array(start_ns, pa.timestamp("ns")),
            "end": pa.array(end_ns, pa.timestamp("ns")),
            "fetch_s": pa.array(fetch_s, pa.float64()),
        }
    )
    train = pa.table(
        {
            "epoch": pa.array(e, pa.int32()),
            "iteration": pa.array(i, pa.int32()),
            "gpu": pa.array(g, pa.int32()),
            "start": pa.array(train_ns, pa.timestamp("ns")),
            "iteration_s": pa.array(iteration_s, pa.float64()),
            "stall_s": pa.array(stall, pa.float64()),
            "throughput": pa.array([None] * n, pa.float64()),
        }
    )
    info = {
        "gpus": gpus,
        "epochs": list(range(epochs)),
        "iterations_per_epoch": {str(k): iterations for k in range(epochs)},
        "metadata": {},
        "sources": [],
        "report": {},
    }
    return RunTables(name=name, fetch=fetch, train=train, info=info)


def write_synthetic(traces: Path, name: str = "synth_run", **kwargs: int) -> Path:
    return write_run(synthetic_run(name, **kwargs), traces / name)
