"""The stall-only model (docs/SPEC.md §4.3): against its row-by-row reference, by hand, and
its boundaries (which policies it replays, what the other models refuse)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsim.analysis.attribution import FIXED, attribute, attribution_table, describe
from dsim.errors import UsageError
from dsim.options import parse_policy_option
from dsim.replay.arrays import build_iteration_arrays
from dsim.replay.models import get_model
from dsim.replay.models.per_iteration import PerIterationModel, prepare, replay_prepared
from dsim.replay.models.stall_only import StallOnlyModel, prepare_stalls, replay_stalls
from dsim.replay.params import ReplayParams
from dsim.replay.policies import STALL_ONLY, needs_fetch, policy_pairs

try:
    from reference_stall_only import reference_stall_row
except ImportError:  # tests collected as a package
    from tests.reference_stall_only import reference_stall_row

_values = st.one_of(
    st.sampled_from([0.0, 0.000002, 0.01, 0.03, 0.5]),
    st.floats(0.0, 60.0, allow_nan=False, allow_infinity=False),
)


@st.composite
def tables(draw):
    """[N, G] iteration times ≥ stalls, and fetch/start with NaN where a rank has no record."""
    n = draw(st.integers(0, 12))
    g = draw(st.integers(1, 5))
    stall = np.array(draw(st.lists(_values, min_size=n * g, max_size=n * g))).reshape(n, g)
    extra = np.array(draw(st.lists(_values, min_size=n * g, max_size=n * g))).reshape(n, g)
    fetch = np.array(draw(st.lists(_values, min_size=n * g, max_size=n * g))).reshape(n, g)
    start = np.array(draw(st.lists(_values, min_size=n * g, max_size=n * g))).reshape(n, g)
    absent = np.array(draw(st.lists(st.booleans(), min_size=n * g, max_size=n * g)), bool)
    absent = absent.reshape(n, g) if draw(st.booleans()) else np.ones((n, g), bool)
    fetch[absent] = np.nan
    start[absent] = np.nan
    return stall + extra, stall, fetch, start


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=300, deadline=None)
@given(t=tables(), policy=st.sampled_from(STALL_ONLY), cut=st.integers(0, 12))
def test_kernel_equals_the_row_by_row_reference_bit_for_bit(t, policy, cut) -> None:
    iteration_time, stall, fetch, start = t
    prep = prepare_stalls(iteration_time, stall, fetch, start)
    out = replay_stalls(prep, policy)
    for i in range(stall.shape[0]):
        ref = reference_stall_row(
            iteration_time[i].tolist(), stall[i].tolist(), fetch[i].tolist(),
            start[i].tolist(), policy,
        )  # fmt: skip
        assert out.iteration_s[i] == ref.iteration_s
        assert out.stall_s[i] == ref.stall_s
        assert out.delay_s[i] == ref.delay_s
        assert _same(out.fetch_diff_s[i], ref.fetch_diff_s)
        assert _same(out.start_diff_s[i], ref.start_diff_s)
        assert out.gpu_stall_s[i].tolist() == ref.gpu_stall_s
    # Chunks replay like the whole (execution cuts anywhere).
    cut = min(cut, stall.shape[0])
    head, tail = (replay_stalls(prep.take(lo, hi), policy) for lo, hi in ((0, cut), (cut, None)))
    joined = np.concatenate([head.iteration_s, tail.iteration_s])
    assert np.array_equal(joined, out.iteration_s)


def test_a_hand_computed_iteration() -> None:
    # Rank 0 waited 0.5 s, rank 1 0.1 s, rank 2 0.3 s; iterations 1.0, 0.9, 0.95 s.
    t = np.array([[1.0, 0.9, 0.95]])
    stall = np.array([[0.5, 0.1, 0.3]])
    nan = np.full((1, 3), np.nan)
    prep = prepare_stalls(t, stall, nan, nan)
    measured = replay_stalls(prep, ("actual", "actual"))
    assert measured.iteration_s[0] == 1.0 and measured.stall_s[0] == 0.5
    assert measured.delay_s[0] == pytest.approx(0.4)
    assert math.isnan(measured.fetch_diff_s[0]) and math.isnan(measured.start_diff_s[0])
    smin = replay_stalls(prep, ("stall-min", "actual"))
    assert smin.stall_s[0] == 0.1 and smin.delay_s[0] == 0.0
    assert smin.iteration_s[0] == pytest.approx(0.6)  # the largest stall fell by 0.4 s
    assert smin.gpu_stall_s.tolist() == [[0.1, 0.1, 0.1]]
    savg = replay_stalls(prep, ("stall-avg", "actual"))
    assert savg.stall_s[0] == pytest.approx(0.3) and savg.iteration_s[0] == pytest.approx(0.8)


def test_the_measured_row_gives_back_the_measured_numbers_exactly() -> None:
    rng = np.random.default_rng(3)
    stall = rng.uniform(0, 2, (500, 4))
    t = stall + rng.uniform(0, 1, (500, 4))
    out = replay_stalls(prepare_stalls(t, stall, stall, stall), ("actual", "actual"))
    assert np.array_equal(out.iteration_s, t.max(axis=1))
    assert np.array_equal(out.stall_s, stall.max(axis=1))
    assert np.array_equal(out.delay_s, stall.max(axis=1) - stall.min(axis=1))


def test_each_model_refuses_the_others_policies() -> None:
    model = StallOnlyModel()
    assert get_model("stall-only") is not None and not model.needs_fetch
    assert all(model.supports(p) for p in STALL_ONLY)
    assert not model.supports(("min", "min")) and not model.supports(("stall-min", "min"))
    prep = prepare_stalls(np.ones((2, 2)), np.zeros((2, 2)), np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="stall-only model replays"):
        replay_stalls(prep, ("avg", "min"))
    assert not PerIterationModel().supports(("stall-min", "actual"))
    assert not get_model("pipeline").supports(("stall-avg", "actual"))
    per = prepare(build_iteration_arrays(*_tables(fetch=True)))
    with pytest.raises(ValueError, match="stall alignment"):  # never silently `actual`
        replay_prepared(per, ("stall-min", "actual"), ReplayParams())
    assert needs_fetch(("min", "actual")) and not needs_fetch(("stall-min", "actual"))
    assert not needs_fetch(("actual", "actual"))


def test_stall_alignments_stand_on_the_fetch_side_with_start_actual() -> None:
    assert parse_policy_option("stall-min") == ("stall-min", "actual")
    assert parse_policy_option("Stall-Avg/actual") == ("stall-avg", "actual")
    for bad in ("stall-min/min", "actual/stall-min"):
        with pytest.raises(UsageError, match="--policy: stall-min"):
            parse_policy_option(bad)
    pairs = policy_pairs([False, "stall-min", "min"], [False, "min"])
    assert pairs == [("actual", "actual"), ("actual", "min"), ("stall-min", "actual"),
                     ("min", "actual"), ("min", "min")]  # fmt: skip
    with pytest.raises(UsageError, match="fetch side"):
        policy_pairs([False], ["stall-avg"])


def _tables(fetch: bool) -> tuple[pa.Table, pa.Table]:
    """Two ranks, three iterations of epoch 0; rank 1 has the largest stall each time."""
    ts = pa.array([0, 0, 10**9, 10**9, 2 * 10**9, 2 * 10**9], pa.timestamp("ns"))
    keys = {
        "epoch": pa.array([0] * 6, pa.int32()),
        "iteration": pa.array([0, 0, 1, 1, 2, 2], pa.int32()),
        "gpu": pa.array([0, 1] * 3, pa.int32()),
    }
    train = pa.table(
        {
            **keys,
            "start": ts,
            "iteration_s": [1.0, 1.0, 1.1, 1.1, 1.2, 1.2],
            "stall_s": [0.1, 0.5, 0.2, 0.6, 0.0, 0.3],
        }
    )
    rows = 6 if fetch else 0
    fetch_table = pa.table(
        {
            "epoch": keys["epoch"][:rows],
            "iteration": keys["iteration"][:rows],
            "gpu": keys["gpu"][:rows],
            "worker": pa.array([0] * rows, pa.int32()),
            "start": ts[:rows],
            "end": ts[:rows],
            "fetch_s": pa.array([0.1] * rows, pa.float64()),
        }
    )
    return fetch_table, train


def test_arrays_without_fetch_records_keep_every_trained_iteration() -> None:
    fetch, train = _tables(fetch=False)
    assert build_iteration_arrays(fetch, train).n_iterations == 0  # the fetch models' view
    arrays = build_iteration_arrays(fetch, train, require_fetch=False)
    assert arrays.n_iterations == 3 and arrays.dropped == {}
    assert np.isnan(arrays.fetch).all() and np.isnan(arrays.start).all()
    assert (arrays.worker == -1).all()
    assert arrays.arrival[:, 0].tolist() == [0.0, 1.0, 2.0]  # relative to the first arrival
    full = build_iteration_arrays(*_tables(fetch=True), require_fetch=False)
    assert not np.isnan(full.fetch).any()


def test_attribution_without_fetch_records_blames_the_longest_wait() -> None:
    arrays = build_iteration_arrays(*_tables(fetch=False), require_fetch=False)
    a = attribute("r", arrays, arrays.worker)
    assert a.straggler == FIXED and a.straggler_gpu == 1
    assert [r.max_stall_pct for r in a.ranks] == [0.0, 100.0]
    assert all(math.isnan(r.last_pct) for r in a.ranks)
    table = attribution_table([a])
    assert table["worker"].tolist() == [-1, -1] and table["fetches"].tolist() == [0, 0]
    lines = describe(table)
    assert lines == [
        "Straggler: GPU 1's loader, fixed — it had the largest data wait in 100 % of "
        "iterations (no fetch records: judged by the largest data wait)."
    ]


def _row(fetch: str, iteration: float, stall: float, eff: float) -> dict:
    return {
        "run": "r",
        "fetch_align": fetch,
        "start_align": "actual",
        "iteration_s_mean": iteration,
        "stall_s_mean": stall,
        "effective_delay_pct": eff,
        "gpus": 4,
        "selected_epochs": "0",
    }


def test_the_verdict_says_what_a_stall_what_if_replays() -> None:
    from dsim.analysis.verdict import verdict

    rows = [_row("actual", 0.026, 0.012, 12.5), _row("stall-avg", 0.019, 0.005, 0.0)]
    rows.append(_row("stall-min", 0.019, 0.001, 0.0))  # a tie goes to stall-avg (first)
    v = verdict(rows, model="stall-only")
    assert v.best_policy == ("stall-avg", "actual") and v.helps
    assert v.text.startswith(
        "Replacing every rank's data wait by the mean wait over ranks (stall-avg/actual) "
        "would make iterations 1.37× faster"
    )
    assert v.text.endswith("(stall-only replay model: from the measured stalls alone)")
