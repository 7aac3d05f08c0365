"""Tables → IterationArrays: pivoting, dropping incomplete iterations, time origin."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dsim.errors import InputError
from dsim.model.tables import FETCH_SCHEMA, TRAIN_SCHEMA
from dsim.replay.arrays import MISSING_BOTH, MISSING_FETCH, MISSING_TRAIN, build_iteration_arrays

T0 = 1_630_525_734_000_000_000  # 2021-09-01 19:48:54 as ns since 1970


def fetch_table(rows):
    """rows: (epoch, iteration, gpu, start_ns, fetch_s)."""
    return pa.table(
        {
            "epoch": [r[0] for r in rows],
            "iteration": [r[1] for r in rows],
            "gpu": [r[2] for r in rows],
            "worker": [0 for _ in rows],
            "start": pa.array([r[3] for r in rows], pa.timestamp("ns")),
            "end": pa.array([r[3] + int(r[4] * 1e9) for r in rows], pa.timestamp("ns")),
            "fetch_s": [float(r[4]) for r in rows],
        },
        schema=FETCH_SCHEMA,
    )


def train_table(rows):
    """rows: (epoch, iteration, gpu, iteration_s, stall_s)."""
    return pa.table(
        {
            "epoch": [r[0] for r in rows],
            "iteration": [r[1] for r in rows],
            "gpu": [r[2] for r in rows],
            "start": pa.array([T0 for _ in rows], pa.timestamp("ns")),
            "iteration_s": [float(r[3]) for r in rows],
            "stall_s": [float(r[4]) for r in rows],
            "throughput": pa.array([None for _ in rows], pa.float64()),
        },
        schema=TRAIN_SCHEMA,
    )


def full_rows(epochs, iterations, gpus):
    fetch, train = [], []
    for e in epochs:
        for i in iterations:
            for g in gpus:
                fetch.append((e, i, g, T0 + (e * 1000 + i) * 10**9 + g, 1.0 + g / 4))
                train.append((e, i, g, 2.0 + i, 0.5 * g))
    return fetch, train


def test_pivot_sorts_rows_and_gpus():
    fetch, train = full_rows([2, 1], [3, 0, 1], [3, 0])
    # shuffle row order: the arrays must not depend on it
    fetch, train = fetch[::-1], train[1::2] + train[0::2]
    arrays = build_iteration_arrays(fetch_table(fetch), train_table(train))
    assert arrays.epoch.tolist() == [1, 1, 1, 2, 2, 2]
    assert arrays.iteration.tolist() == [0, 1, 3, 0, 1, 3]
    assert arrays.gpus.tolist() == [0, 3]
    assert arrays.fetch[:, 1].tolist() == [1.75] * 6
    assert arrays.iteration_time[:, 0].tolist() == [2.0, 3.0, 5.0, 2.0, 3.0, 5.0]
    assert arrays.stall[0].tolist() == [0.0, 1.5]
    assert arrays.dropped == {}
    assert arrays.epoch.dtype == np.int32 and arrays.start.dtype == np.float64


def test_start_is_relative_to_origin_with_nanosecond_precision():
    fetch = [(1, 0, 0, T0 + 1, 0.5), (1, 0, 1, T0 + 3_000_000_007, 0.5)]
    train = [(1, 0, 0, 1.0, 0.0), (1, 0, 1, 1.0, 0.0)]
    arrays = build_iteration_arrays(fetch_table(fetch), train_table(train))
    assert arrays.origin_ns == T0 + 1
    assert arrays.start[0].tolist() == [0.0, 3.000000006]


def test_incomplete_iterations_are_dropped_and_counted():
    fetch, train = full_rows([1], range(5), [0, 1])
    fetch = [r for r in fetch if not (r[1] == 1 and r[2] == 1)]  # no fetch for it 1 on GPU 1
    train = [r for r in train if not (r[1] == 2 and r[2] == 0)]  # no training for it 2 on GPU 0
    fetch = [r for r in fetch if r[1] != 3]  # iteration 3: no fetch on any GPU ...
    train = [r for r in train if not (r[1] == 3 and r[2] == 1)]  # ... and training only on GPU 0
    arrays = build_iteration_arrays(fetch_table(fetch), train_table(train))
    assert arrays.iteration.tolist() == [0, 4]
    assert arrays.dropped == {MISSING_FETCH: 1, MISSING_TRAIN: 1, MISSING_BOTH: 1}


def test_gpu_set_is_the_union_of_both_tables():
    fetch, train = full_rows([1], range(3), [0, 1])
    train = [*train, (1, 0, 2, 1.0, 0.0)]  # a GPU only the training table knows
    arrays = build_iteration_arrays(fetch_table(fetch), train_table(train))
    assert arrays.gpus.tolist() == [0, 1, 2]
    assert arrays.n_iterations == 0
    # iteration 0 lacks only the fetch of GPU 2; iterations 1 and 2 lack both records
    assert arrays.dropped == {MISSING_FETCH: 1, MISSING_BOTH: 2}


@pytest.mark.parametrize("which", ["fetch", "train"])
def test_duplicate_records_are_an_input_error(which):
    fetch, train = full_rows([1], range(2), [0, 1])
    if which == "fetch":
        fetch.append(fetch[1])
    else:
        train.append(train[2])
    with pytest.raises(InputError, match="expected one"):
        build_iteration_arrays(fetch_table(fetch), train_table(train))


def test_missing_column_is_an_input_error():
    fetch, train = full_rows([1], range(2), [0])
    with pytest.raises(InputError, match="stall_s"):
        build_iteration_arrays(fetch_table(fetch), train_table(train).drop_columns(["stall_s"]))


def test_empty_tables():
    arrays = build_iteration_arrays(fetch_table([]), train_table([]))
    assert arrays.n_iterations == 0 and arrays.n_gpus == 0
    assert arrays.start.shape == (0, 0)
