"""dsim's replay kernel against the original pandas analysis (bench/original_method.py).

The two share no code: the original works on pandas Timestamps with
``iterrows()`` and Timedelta gaps, dsim on float64 [iterations × GPUs] arrays.
Agreement on every iteration of every policy pair is the cross-check that
dsim reproduces the analysis it replaces.

Tolerance 1e-6 s: the original rounds every fetch-done time to whole
nanoseconds (``start + pd.to_timedelta(fetch, "s")``) and measures gaps in
integer nanoseconds, while dsim subtracts float64 seconds; each value can
therefore differ by a few nanoseconds. 1e-6 s is far above that and still
below the stall floor (2e-6 s), so a wrong branch (floor vs. not, grow vs.
keep) cannot hide inside it.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dsim.model.tables import FETCH_SCHEMA, TRAIN_SCHEMA
from dsim.replay.arrays import build_iteration_arrays
from dsim.replay.models.per_iteration import replay
from dsim.replay.policies import DEFAULT

# The original analysis knows exactly the default alignments (actual, avg, min).
ALL_PAIRS = list(itertools.product(DEFAULT, DEFAULT))
TOLERANCE_S = 1e-6
METRICS = ["iteration_s", "stall_s", "delay_s", "fetch_diff_s", "start_diff_s"]
ORIGIN_NS = 1_630_525_726_000_000_000  # 2021-09-01 19:48:46, the real run's day


def _load_original():
    path = Path(__file__).resolve().parents[1] / "bench" / "original_method.py"
    spec = importlib.util.spec_from_file_location("bench_original_method", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


original = _load_original()


def random_tables(
    seed: int, iterations: int, gpus: int, epochs: tuple[int, ...] = (0, 1)
) -> tuple[pa.Table, pa.Table]:
    """A small trace shaped like the real one: ~8 s fetches, stalls that are often ~0.

    Stalls are drawn so that every branch of the replay is taken: near-zero
    stalls (the floor), stalls just below and above the 0.01 s grow threshold,
    and seconds-long ones. Some fetch starts and durations repeat across GPUs
    so that the min/avg policies produce exact zero gaps.
    """
    rng = np.random.default_rng(seed)
    fetch_rows: dict[str, list] = {name: [] for name in FETCH_SCHEMA.names}
    train_rows: dict[str, list] = {name: [] for name in TRAIN_SCHEMA.names}
    clock_ns = ORIGIN_NS
    for epoch in epochs:
        for it in range(iterations):
            starts = clock_ns + rng.integers(0, 3_000_000_000, size=gpus)
            durations = rng.uniform(7.0, 9.5, size=gpus)
            if rng.random() < 0.2:
                starts[:] = starts[0]
            if rng.random() < 0.2:
                durations[:] = durations[0]
            stalls = rng.choice(
                [0.000002, 0.000006, 0.009, 0.011, 0.5, 3.0], size=gpus
            ) * rng.uniform(0.5, 1.5, size=gpus)
            pure = rng.uniform(0.85, 0.95)
            train_start = int(clock_ns) + 10_000_000_000
            for g in range(gpus):
                start_ns = int(starts[g])
                fetch_rows["epoch"].append(epoch)
                fetch_rows["iteration"].append(it)
                fetch_rows["gpu"].append(g)
                fetch_rows["worker"].append(it % 12)
                fetch_rows["start"].append(start_ns)
                fetch_rows["end"].append(start_ns + round(float(durations[g]) * 1e9))
                fetch_rows["fetch_s"].append(float(durations[g]))
                train_rows["epoch"].append(epoch)
                train_rows["iteration"].append(it)
                train_rows["gpu"].append(g)
                train_rows["start"].append(train_start + g * 1_000_000)
                train_rows["iteration_s"].append(float(stalls.max() + pure + 1e-4 * g))
                train_rows["stall_s"].append(float(stalls[g]))
                train_rows["throughput"].append(None)
            clock_ns += int(rng.integers(500_000_000, 1_500_000_000))
    return (
        pa.Table.from_pydict(fetch_rows, schema=FETCH_SCHEMA),
        pa.Table.from_pydict(train_rows, schema=TRAIN_SCHEMA),
    )


@pytest.fixture(scope="module", params=[(11, 40, 2), (12, 30, 3), (13, 24, 4)])
def trace(request):
    seed, iterations, gpus = request.param
    fetch, train = random_tables(seed, iterations, gpus)
    return fetch, train, iterations, gpus


@pytest.mark.parametrize("policy", ALL_PAIRS, ids=[f"{f}__{s}" for f, s in ALL_PAIRS])
def test_dsim_equals_original_method(trace, policy):
    fetch, train, iterations, _gpus = trace
    epoch = 1
    expected = original.original_replay(fetch, train, epoch, policy)
    assert len(expected) == iterations

    arrays = build_iteration_arrays(fetch, train)
    rows = np.flatnonzero(arrays.epoch == epoch)
    got = replay(arrays.take(rows), policy)

    np.testing.assert_array_equal(arrays.iteration[rows], expected["iteration"].to_numpy())
    for metric in METRICS:
        np.testing.assert_allclose(
            getattr(got, metric),
            expected[metric].to_numpy(dtype=np.float64),
            rtol=0,
            atol=TOLERANCE_S,
            err_msg=f"{metric} under {policy}",
        )


def test_trace_exercises_every_branch():
    """Guard the generator: the comparison above is only as strong as the cases it covers."""
    fetch, train = random_tables(13, 24, 4)
    arrays = build_iteration_arrays(fetch, train)
    stall = arrays.stall
    assert ((stall > 0.01) & (stall < 0.02)).any()
    assert ((stall > 0.001) & (stall <= 0.01)).any()
    assert (stall < 0.00001).any()
    floored = replay(arrays, ("min", "min")).gpu_stall_s == 0.000002
    assert floored.any()
    actual = replay(arrays, ("actual", "actual"))
    assert not np.allclose(replay(arrays, ("avg", "avg")).stall_s, actual.stall_s)


def test_original_method_actual_reproduces_measured_run():
    """``actual/actual`` of the original gives back the measured maxima (a sanity anchor)."""
    fetch, train = random_tables(5, 12, 3, epochs=(1,))
    got = original.original_replay(fetch, train, 1, ("actual", "actual"))
    t = train.to_pandas()
    by_iter = t.groupby("iteration")
    np.testing.assert_allclose(got["iteration_s"], by_iter["iteration_s"].max(), atol=0)
    np.testing.assert_allclose(got["stall_s"], by_iter["stall_s"].max(), atol=0)
    spread = by_iter["stall_s"].max() - by_iter["stall_s"].min()
    np.testing.assert_allclose(got["delay_s"], spread, atol=0)
