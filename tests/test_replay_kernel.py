"""The replay kernel against the plain row-by-row reference, and hand-computed cases."""

from __future__ import annotations

import itertools
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsim.replay.models.per_iteration
from dsim.replay.arrays import IterationArrays
from dsim.replay.models.per_iteration import (
    ReplayParams,
    prepare,
    prepare_columns,
    replay,
    replay_prepared,
)
from dsim.replay.policies import KNOWN, START_KNOWN

try:
    from reference_replay import reference_replay
except ImportError:  # tests collected as a package
    from tests.reference_replay import reference_replay

ALL_PAIRS = list(itertools.product(KNOWN, START_KNOWN))


def make_arrays(start, fetch, iteration_time, stall) -> IterationArrays:
    start = np.asarray(start, dtype=np.float64)
    n, g = start.shape
    return IterationArrays(
        epoch=np.ones(n, dtype=np.int32),
        iteration=np.arange(n, dtype=np.int32),
        gpus=np.arange(g, dtype=np.int32),
        start=start,
        fetch=np.asarray(fetch, dtype=np.float64),
        iteration_time=np.asarray(iteration_time, dtype=np.float64),
        stall=np.asarray(stall, dtype=np.float64),
        arrival=np.zeros((n, g)),
        worker=np.zeros((n, g), dtype=np.int32),
        origin_ns=0,
        dropped={},
    )


# Small pools make ties (equal starts, equal fetch times, zero gaps) frequent;
# the stall pool sits exactly on the thresholds.
_times = st.one_of(
    st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.1, 8.0]),
    st.floats(0.0, 60.0, allow_nan=False, allow_infinity=False),
)
_stalls = st.one_of(
    st.sampled_from([0.0, 0.000002, 0.01, 0.03, 0.0100000001, 0.5]),
    st.floats(0.0, 10.0, allow_nan=False, allow_infinity=False),
)


@st.composite
def traces(draw, max_gpus: int = 64, max_iterations: int = 5):
    gpus = draw(st.integers(1, max_gpus))
    n = draw(st.integers(1, max_iterations))
    cells = n * gpus

    def matrix(elements):
        values = draw(st.lists(elements, min_size=cells, max_size=cells))
        return np.array(values, dtype=np.float64).reshape(n, gpus)

    start = matrix(_times)
    fetch = matrix(_times)
    stall = matrix(_stalls)
    iteration_time = stall + matrix(_times)
    return start, fetch, iteration_time, stall


_params = st.one_of(
    st.just(ReplayParams()),
    st.builds(
        ReplayParams,
        stall_floor_s=st.sampled_from([0.0, 0.000002, 0.001, 0.5]),
        stall_grow_min_s=st.sampled_from([0.0, 0.01, 0.03, 1.0]),
    ),
)


def assert_matches_reference(arrays: IterationArrays, params: ReplayParams) -> None:
    prep = prepare(arrays)
    for policy in ALL_PAIRS:
        got = replay_prepared(prep, policy, params)
        want = reference_replay(
            arrays.start.tolist(),
            arrays.fetch.tolist(),
            arrays.iteration_time.tolist(),
            arrays.stall.tolist(),
            policy,
            params.stall_floor_s,
            params.stall_grow_min_s,
        )
        for i, row in enumerate(want):
            # Gap-sign decisions must agree exactly, hence bitwise-equal stalls.
            assert got.gpu_stall_s[i].tolist() == row.gpu_stall_s, (policy, i)
            assert got.stall_s[i] == row.stall_s, (policy, i)
            assert got.delay_s[i] == row.delay_s, (policy, i)
            assert got.fetch_diff_s[i] == row.fetch_diff_s, (policy, i)
            assert got.start_diff_s[i] == row.start_diff_s, (policy, i)
            assert math.isclose(got.iteration_s[i], row.iteration_s, rel_tol=1e-12, abs_tol=1e-12)


@settings(max_examples=150, deadline=None)
@given(trace=traces(), params=_params)
def test_kernel_matches_reference_for_every_policy(trace, params):
    assert_matches_reference(make_arrays(*trace), params)


@settings(max_examples=50, deadline=None)
@given(trace=traces(max_gpus=8, max_iterations=3))
def test_kernel_matches_reference_on_wall_clock_magnitudes(trace):
    """Starts around 1.6e9 s make rounding in D = S + F matter; decisions must still agree."""
    start, fetch, iteration_time, stall = trace
    assert_matches_reference(
        make_arrays(start + 1.6e9, fetch, iteration_time, stall), ReplayParams()
    )


@settings(max_examples=100, deadline=None)
@given(trace=traces())
def test_actual_actual_reproduces_the_measured_run_exactly(trace):
    start, fetch, iteration_time, stall = trace
    got = replay(make_arrays(*trace), ("actual", "actual"))
    assert np.array_equal(got.iteration_s, iteration_time.max(axis=1))
    assert np.array_equal(got.stall_s, stall.max(axis=1))
    assert np.array_equal(got.delay_s, stall.max(axis=1) - stall.min(axis=1))
    assert np.array_equal(got.gpu_stall_s, stall)
    assert np.array_equal(got.fetch_diff_s, fetch.max(axis=1) - fetch.min(axis=1))
    assert np.array_equal(got.start_diff_s, start.max(axis=1) - start.min(axis=1))


@settings(max_examples=50, deadline=None)
@given(trace=traces(max_gpus=8, max_iterations=12), cut=st.integers(0, 12))
def test_iterations_are_replayed_independently(trace, cut):
    """A chunk of iterations replays to the same chunk of the whole (execution chunks freely)."""
    arrays = make_arrays(*trace)
    rows = slice(0, min(cut, arrays.n_iterations))
    for policy in ALL_PAIRS:
        whole = replay(arrays, policy)
        part = replay(arrays.take(rows), policy)
        for name, values in part.metrics().items():
            assert np.array_equal(values, whole.metrics()[name][rows])
        assert np.array_equal(part.gpu_stall_s, whole.gpu_stall_s[rows])


@settings(max_examples=60, deadline=None)
@given(trace=traces(max_gpus=8, max_iterations=12), params=_params, block=st.integers(1, 5))
def test_kernel_in_small_row_blocks_matches_reference(trace, params, block):
    """prepare and replay walk iterations in blocks; tiny blocks exercise every boundary."""
    with mock.patch.object(dsim.replay.models.per_iteration, "BLOCK_ROWS", block):
        assert_matches_reference(make_arrays(*trace), params)


def test_results_do_not_depend_on_block_size():
    """Bitwise the same for any block size, NaN rows and a ragged last block included."""
    rng = np.random.default_rng(11)
    start, fetch, stall = (rng.uniform(0, 5, size=(1_001, 5)) for _ in range(3))
    stall[::13, 2] = np.nan
    stall[::17, 0] = 0.0
    arrays = make_arrays(start, fetch, stall + 1, stall)

    def everything(block: int) -> list[np.ndarray]:
        with mock.patch.object(dsim.replay.models.per_iteration, "BLOCK_ROWS", block):
            prep = prepare(arrays)
            out = [getattr(prep, name) for name in prep.__dataclass_fields__]
            out = [v for a in out for v in (a.values() if isinstance(a, dict) else [a])]
            for policy in ALL_PAIRS:
                got = replay_prepared(prep, policy)
                out += [*got.metrics().values(), got.gpu_stall_s]
        return out

    want = everything(dsim.replay.models.per_iteration.BLOCK_ROWS)
    for block in (1, 7, 64, 1_000, 1_001):
        got = everything(block)
        assert all(
            np.array_equal(a.view(np.uint64), b.view(np.uint64))
            for a, b in zip(got, want, strict=True)
        )


# Two GPUs, values exact in binary, worked out by hand from docs/SPEC.md §4.1:
#   GPU0: S=0.0 F=1.0 (D=1.0) T=1.5 ST=0.5
#   GPU1: S=0.5 F=2.0 (D=2.5) T=1.5 ST=1.25
#   max T = 1.5, max ST = 1.25, pure = [0.25, 0.25]
HAND = make_arrays([[0.0, 0.5]], [[1.0, 2.0]], [[1.5, 1.5]], [[0.5, 1.25]])
HAND_EXPECTED = {
    # policy: (gpu stalls, iteration, stall, delay, fetch diff, start diff)
    # D' = D: nothing changes.
    ("actual", "actual"): ([0.5, 1.25], 1.5, 1.25, 0.75, 1.0, 0.5),
    # D' = [1.0, 1.0]: gap0 = 0; gap1 = 1.5 > 1.25 -> floor.
    ("min", "min"): ([0.5, 0.000002], 0.75, 0.5, 0.499998, 0.0, 0.0),
    # F' = 1.5, S' = 0.5 - 0.5/2 = 0.25, D' = 1.75: gap0 = -0.75 (0.5 > 0.01 grows), gap1 = 0.75.
    ("avg", "avg"): ([1.25, 0.5], 1.5, 1.25, 0.75, 0.0, 0.0),
    # D' = [0 + 1, 0 + 2]: gap0 = 0, gap1 = 0.5.
    ("actual", "min"): ([0.5, 0.75], 1.0, 0.75, 0.25, 1.0, 0.0),
    # D' = [0 + 1, 0.5 + 1]: gap0 = 0, gap1 = 1.0.
    ("min", "actual"): ([0.5, 0.25], 0.75, 0.5, 0.25, 0.0, 0.5),
    # D' = [0.25 + 1, 0.25 + 2]: gap0 = -0.25 grows, gap1 = 0.25.
    ("actual", "avg"): ([0.75, 1.0], 1.25, 1.0, 0.25, 1.0, 0.0),
}


@pytest.mark.parametrize("policy", list(HAND_EXPECTED))
def test_hand_computed_two_gpus(policy):
    stalls, iteration, stall, delay, fetch_diff, start_diff = HAND_EXPECTED[policy]
    got = replay(HAND, policy)
    assert got.gpu_stall_s[0].tolist() == pytest.approx(stalls, abs=1e-15)
    assert got.iteration_s[0] == pytest.approx(iteration, abs=1e-15)
    assert got.stall_s[0] == pytest.approx(stall, abs=1e-15)
    assert got.delay_s[0] == pytest.approx(delay, abs=1e-15)
    assert got.fetch_diff_s[0] == fetch_diff
    assert got.start_diff_s[0] == start_diff


# A stall of exactly stall_grow_min does not grow (the rule is strictly greater):
#   GPU0: S=0 F=1 ST=0.01 T=1.0;  GPU1: S=0 F=3 ST=0 T=1.0
#   avg/actual: F' = 2, gap0 = -1 (ST = 0.01, not > 0.01: stays), gap1 = +1 -> floor.
THRESHOLD = make_arrays([[0.0, 0.0]], [[1.0, 3.0]], [[1.0, 1.0]], [[0.01, 0.0]])


def test_stall_exactly_at_grow_threshold_does_not_grow():
    got = replay(THRESHOLD, ("avg", "actual"))
    assert got.gpu_stall_s[0].tolist() == [0.01, 0.000002]
    assert got.stall_s[0] == 0.01
    assert got.delay_s[0] == pytest.approx(0.009998, abs=1e-15)
    assert got.iteration_s[0] == pytest.approx(1.0, abs=1e-15)  # 0.01 + (1.0 - 0.01)


def test_custom_thresholds():
    params = ReplayParams(stall_floor_s=0.001, stall_grow_min_s=0.005)
    got = replay(THRESHOLD, ("avg", "actual"), params)
    assert got.gpu_stall_s[0].tolist() == pytest.approx([1.01, 0.001], abs=1e-15)
    assert got.stall_s[0] == pytest.approx(1.01, abs=1e-15)
    assert got.delay_s[0] == pytest.approx(1.009, abs=1e-15)
    assert got.iteration_s[0] == pytest.approx(2.0, abs=1e-15)  # 1.01 + 0.99


def test_stall_exactly_zero_after_gap_is_not_floored():
    """ST - gap == 0 is not negative, so it stays 0 (only negatives are floored)."""
    arrays = make_arrays([[0.0, 0.0]], [[1.0, 2.0]], [[3.0, 3.0]], [[0.0, 1.0]])
    got = replay(arrays, ("min", "actual"))  # gap1 = 1.0 = ST1
    assert got.gpu_stall_s[0].tolist() == [0.0, 0.0]


def test_avg_fetch_is_a_sequential_sum():
    """Bitwise Python ``sum(row) / G``, which pairwise summation would not always give."""
    rng = np.random.default_rng(7)
    fetch = rng.uniform(0, 10, size=(200, 33))
    prep = prepare_columns(np.zeros_like(fetch), fetch, fetch, np.zeros_like(fetch))
    assert prep.fetch_aligned["avg"].tolist() == [sum(row) / 33 for row in fetch.tolist()]


def test_c_and_fortran_order_give_identical_results():
    rng = np.random.default_rng(3)
    start, fetch, stall = (rng.uniform(0, 5, size=(50, 6)) for _ in range(3))
    c = make_arrays(start, fetch, stall + 1, stall)
    f = make_arrays(*(np.asfortranarray(a) for a in (start, fetch, stall + 1, stall)))
    for policy in ALL_PAIRS:
        a, b = replay(c, policy), replay(f, policy)
        for name in a.metrics():
            assert np.array_equal(a.metrics()[name], b.metrics()[name])


def test_empty_run():
    arrays = make_arrays(np.zeros((0, 4)), np.zeros((0, 4)), np.zeros((0, 4)), np.zeros((0, 4)))
    got = replay(arrays, ("avg", "min"))
    assert got.gpu_stall_s.shape == (0, 4)
    assert all(len(v) == 0 for v in got.metrics().values())


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="unknown policy"):
        replay(HAND, ("no-such-policy", "actual"))
