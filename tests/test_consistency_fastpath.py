"""The consistency checks' fast reductions give what the plain NumPy ones gave, exactly.

``dsim.model.consistency`` finds ranks by counting, reduces [iterations, ranks]
grids a column at a time, takes row medians from a sort, and a parse makes the
train table's arrays once for both checks (``dsim parse`` spent ~17 ms a run of
80,000 training records on the two checks, ~8 % of the run, before). Each test
fails if a fast way diverges from the way it replaced; a complete table's grids are
copies of its columns instead of scatters.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dsim.model import consistency as c


def _grid(seed: int, rows: int, ranks: int, nan_share: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    grid = rng.normal(size=(rows, ranks)).round(rng.integers(0, 3))  # rounding: ties
    grid[rng.random(grid.shape) < 0.05] = 0.0
    grid[rng.random(grid.shape) < 0.02] = -0.0
    grid[rng.random(grid.shape) < nan_share] = np.nan
    return grid


@pytest.mark.parametrize("ranks", [1, 2, 3, 7, 8, 16])
@pytest.mark.parametrize("nan_share", [0.0, 0.05])
def test_row_reductions_equal_numpys(ranks: int, nan_share: float) -> None:
    for seed in range(4):
        grid = _grid(seed, 1001, ranks, nan_share)
        np.testing.assert_array_equal(c._row_max(grid), grid.max(axis=1))
        np.testing.assert_array_equal(c._row_min(grid), grid.min(axis=1))
        np.testing.assert_array_equal(c._row_has_nan(grid), np.isnan(grid).any(axis=1))
        median = c._row_median(grid)
        assert median.tobytes() == np.median(grid, axis=1).tobytes()  # bit for bit, NaN too


def test_row_reductions_of_no_rows() -> None:
    empty = np.zeros((0, 4))
    assert c._row_max(empty).shape == c._row_min(empty).shape == (0,)
    assert c._row_median(empty).shape == c._row_has_nan(empty).shape == (0,)


@pytest.mark.parametrize(
    "gpu",
    [
        np.array([3, 0, 3, 7, 0, 7, 3], np.int32),  # sparse ranks
        np.arange(1024, dtype=np.int32).repeat(3)[::-1].copy(),
        np.array([5], np.int64),
        np.array([-1, 4, 2], np.int32),  # not counted: the general way
        np.array([(1 << 20) + 5, 2, (1 << 20) + 5], np.int64),
    ],
)
def test_ranks_by_counting_equal_unique_and_searchsorted(gpu: np.ndarray) -> None:
    ranks, index = c._ranks_index(gpu)
    expected = np.unique(gpu)
    np.testing.assert_array_equal(ranks, expected)
    assert ranks.dtype == expected.dtype
    np.testing.assert_array_equal(index, np.searchsorted(expected, gpu))
    assert index.dtype == np.int32


def _timelines(seed: int, ranks: int, iterations: int, offset: float, missing: float):
    """A synchronous job's train table (as tests/test_consistency.py's), with rank 1's
    clock ``offset`` s off and a share of records ``missing``."""
    rng = np.random.default_rng(seed)
    now, rows = 0.0, []
    for i in range(iterations):
        stall = rng.exponential(0.02, ranks)
        arrival = now + stall
        end = arrival.max() + rng.uniform(0.01, 0.05)
        rows += [(i // 50, i % 50, r, arrival[r], stall[r], end - now) for r in range(ranks)]
        now = end
    epoch, iteration, rank, arrival, stall, time_s = (np.array(v) for v in zip(*rows, strict=True))
    arrival = arrival + offset * (rank == 1)
    keep = rng.random(len(rank)) >= missing
    start = (arrival * 1e9).round().astype(np.int64) + 1_700_000_000 * 10**9
    return pa.table(
        {
            "epoch": pa.array(epoch[keep], pa.int32()),
            "iteration": pa.array(iteration[keep], pa.int32()),
            "gpu": pa.array(rank[keep] * 2, pa.int32()),  # ranks 0, 2, 4...: not 0..n-1
            "start": pa.array(start[keep].view("datetime64[ns]")),
            "iteration_s": pa.array(time_s[keep], pa.float64()),
            "stall_s": pa.array(stall[keep], pa.float64()),
        }
    )


def _slow(monkeypatch) -> None:
    """The reductions as they were: plain NumPy, every grid scattered."""
    monkeypatch.setattr(c, "_in_row_order", lambda cell, size: False)
    monkeypatch.setattr(c, "_row_max", lambda g: g.max(axis=1))
    monkeypatch.setattr(c, "_row_min", lambda g: g.min(axis=1))
    monkeypatch.setattr(c, "_row_has_nan", lambda g: np.isnan(g).any(axis=1))
    monkeypatch.setattr(c, "_row_median", lambda g: np.median(g, axis=1))
    monkeypatch.setattr(
        c,
        "_ranks_index",
        lambda gpu: (np.unique(gpu), np.searchsorted(np.unique(gpu), gpu).astype(np.int32)),
    )


@pytest.mark.parametrize(
    "shape",
    [
        (2, 200, 0.0, 0.0),
        (8, 300, 0.0, 0.0),
        (8, 300, 3600.0, 0.0),  # a constant offset: found and correctable
        (5, 240, 0.3, 0.03),  # records missing: incomplete iterations
        (3, 120, 0.0, 0.2),
    ],
)
def test_checks_equal_the_plain_numpy_ones(monkeypatch, shape) -> None:
    ranks, iterations, offset, missing = shape
    for seed in range(3):
        train = _timelines(seed, ranks, iterations, offset, missing)
        fast = (c.clock_offsets(train), c.consistency(train))
        shared = c.train_arrays(train)  # what a parse passes to both
        assert (c.clock_offsets(train, shared), c.consistency(train, shared)) == fast
        with monkeypatch.context() as m:
            _slow(m)
            slow = (c.clock_offsets(train), c.consistency(train))
        assert repr(fast) == repr(slow)  # repr: -0.0 and 0.0 told apart
        if offset == 3600.0:
            assert fast[0] is not None and fast[0]["ranks"][0]["corrected"]


def test_a_grid_in_row_order_is_the_scattered_one() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(size=12)
    in_order = np.arange(12, dtype=np.int32)
    assert c._in_row_order(in_order, 12) and not c._in_row_order(in_order, 15)
    for cell, size in [
        (in_order, 12),
        (in_order[::-1].copy(), 12),  # every cell, another order
        (np.array([0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 3], np.int32), 12),
        (in_order, 15),  # cells left empty: NaN
        (np.array([0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], np.int32), 12),  # a repeat, a gap
    ]:
        shape = (size // 3, 3)
        scattered = np.full(size, np.nan)
        scattered[cell] = values
        got = c._grid(cell, shape, values)
        assert got.tobytes() == scattered.reshape(shape).tobytes()
        assert got.base is None or got.base is not values  # a grid of its own, not a view
    long = np.arange(3 * (1 << 16) + 5, dtype=np.int32)
    assert c._in_row_order(long, len(long))
    long[-1] = 0
    assert not c._in_row_order(long, len(long))
