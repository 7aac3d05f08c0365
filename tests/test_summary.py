"""Summary statistics (docs/SPEC.md §5) against hand-computed values on tiny result directories."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dsim.analysis.summary import (
    SUMMARY_COLUMNS,
    add_what_if,
    summarize_metrics,
    summarize_results,
)
from dsim.errors import UsageError
from dsim.model.results import find_result_runs, replay_table, write_replay, write_result_info
from dsim.model.selection import default_epochs, resolve_epochs, selection_mask

RUN = "fsNprepNloadNtrain_openimage_randaugment_resnet50_epoch2_b2048_worker12_thread0"
EPOCH = np.array([0, 0, 0, 0, 1, 1, 1, 1])
ITERATION = np.array([0, 1, 2, 3, 0, 1, 2, 3])
# Epoch 1, iterations 2 and 3 are what the default selection keeps (warm-up 1).
# Epoch 0 and the warm-up rows carry huge values so that counting them shows.
BIG = 100.0
POLICY_METRICS = {
    ("actual", "actual"): {
        "iteration_s": [BIG, BIG, BIG, BIG, BIG, BIG, 1.0, 3.0],
        "stall_s": [BIG, BIG, BIG, BIG, BIG, BIG, 0.2, 0.4],
        "delay_s": [BIG, BIG, BIG, BIG, BIG, BIG, 0.030, 0.031],
        "fetch_diff_s": [BIG, BIG, BIG, BIG, BIG, BIG, 0.5, 0.5],
        "start_diff_s": [BIG, BIG, BIG, BIG, BIG, BIG, 2.0, 4.0],
    },
    ("avg", "min"): {
        "iteration_s": [BIG, BIG, BIG, BIG, BIG, BIG, 0.5, 1.5],
        "stall_s": [BIG, BIG, BIG, BIG, BIG, BIG, 0.1, 0.1],
        "delay_s": [BIG, BIG, BIG, BIG, BIG, BIG, 0.0, 0.0],
        "fetch_diff_s": [0.0] * 8,
        "start_diff_s": [0.0] * 8,
    },
}


def write_results(out, run=RUN, policies=POLICY_METRICS, summary=None, gpus=2):
    for policy, metrics in policies.items():
        table = replay_table(
            EPOCH.astype(np.int32),
            ITERATION.astype(np.int32),
            {k: np.asarray(v, dtype=np.float64) for k, v in metrics.items()},
            np.arange(gpus),
            np.zeros((len(EPOCH), gpus)),
            run=run,
            policy=policy,
            key="test",
        )
        write_replay(table, out)
    info = {
        "trace": {"gpus": gpus, "metadata": {"model": "resnet50", "batch_size": 2048}},
        "summary": summary or {"epochs": None, "warmup": 1, "threshold_s": 0.030},
        "policies": {f"{f}__{s}": "test" for f, s in policies},
    }
    write_result_info(info, out, run)
    return out


def row(df, fetch, start):
    hit = df[(df.fetch_align == fetch) & (df.start_align == start)]
    assert len(hit) == 1
    return hit.iloc[0]


def test_summary_numbers_by_hand(tmp_path):
    df = summarize_results(find_result_runs([write_results(tmp_path / "results")]))
    assert list(df.columns[: len(SUMMARY_COLUMNS)]) == SUMMARY_COLUMNS
    base = row(df, "actual", "actual")
    assert base.run == RUN and base.gpus == 2 and base.model == "resnet50"
    assert base.iterations == 2
    assert base.selected_epochs == "1" and base.warmup == 1 and base.threshold_s == 0.030
    assert base.iteration_s_mean == pytest.approx(2.0)
    assert base.iteration_s_std == pytest.approx(math.sqrt(2.0))  # ddof = 1
    assert base.stall_s_mean == pytest.approx(0.3)
    assert base.start_diff_s_mean == pytest.approx(3.0)
    assert base.fetch_diff_s_std == pytest.approx(0.0)
    assert base.effective_delay_pct == pytest.approx(50.0)  # 0.030 is not > 0.030
    assert base.speedup == pytest.approx(1.0)
    aligned = row(df, "avg", "min")
    assert aligned.iteration_s_mean == pytest.approx(1.0)
    assert aligned.speedup == pytest.approx(2.0)
    assert aligned.stall_change_s == pytest.approx(-0.2)
    assert aligned.effective_delay_change_pts == pytest.approx(-50.0)


def test_options_override_the_recorded_selection(tmp_path):
    runs = find_result_runs([write_results(tmp_path / "results")])
    df = summarize_results(runs, epochs="all", warmup=0, threshold_s=0.0305)
    base = row(df, "actual", "actual")
    assert base.iterations == 6  # warm-up 0 still skips iteration 0 (iteration <= warmup)
    assert base.selected_epochs == "0,1"
    assert base.iteration_s_mean == pytest.approx((4 * BIG + 4.0) / 6)
    assert base.effective_delay_pct == pytest.approx(100 * 5 / 6)  # only 0.030 is below 0.0305
    df = summarize_results(runs, epochs=[0], warmup=2)
    assert row(df, "actual", "actual").iterations == 1
    assert math.isnan(row(df, "actual", "actual").iteration_s_std)


def test_policy_filter_keeps_what_if_against_the_measured_run(tmp_path):
    runs = find_result_runs([write_results(tmp_path / "results")])
    df = summarize_results(runs, policies=[("avg", "min")])
    assert list(zip(df.fetch_align, df.start_align, strict=True)) == [("avg", "min")]
    assert df.speedup.iloc[0] == pytest.approx(2.0)


def test_what_if_is_nan_without_actual_actual(tmp_path):
    out = write_results(tmp_path / "r", policies={("avg", "min"): POLICY_METRICS[("avg", "min")]})
    df = summarize_results(find_result_runs([out]))
    assert len(df) == 1
    assert df[["speedup", "stall_change_s", "effective_delay_change_pts"]].isna().all(axis=None)


def test_several_results_directories_with_the_same_run(tmp_path):
    a = write_results(tmp_path / "a")
    faster = {k: dict(v) for k, v in POLICY_METRICS.items()}
    faster[("actual", "actual")]["iteration_s"] = [BIG] * 6 + [0.5, 1.5]
    b = write_results(tmp_path / "b", policies=faster)
    other = write_results(tmp_path / "b", run="other_run")
    df = summarize_results(find_result_runs([a, b, other]))
    assert len(df) == 6
    same = df[df.run == RUN]
    # each directory is compared with its own actual/actual
    assert sorted(same[same.fetch_align == "avg"].speedup.round(6)) == [1.0, 2.0]
    assert df.run.tolist() == [RUN] * 4 + ["other_run"] * 2


def test_epoch_not_present_is_a_usage_error(tmp_path):
    runs = find_result_runs([write_results(tmp_path / "results")])
    with pytest.raises(UsageError, match=r"epoch\(s\) 7 not in run"):
        summarize_results(runs, epochs=[1, 7])


def test_empty_selection_is_a_usage_error(tmp_path):
    runs = find_result_runs([write_results(tmp_path / "results")])
    with pytest.raises(UsageError, match="no iterations selected"):
        summarize_results(runs, warmup=3)


def test_no_matching_policy_is_a_usage_error(tmp_path):
    runs = find_result_runs([write_results(tmp_path / "results")])
    with pytest.raises(UsageError, match="no replay matches"):
        summarize_results(runs, policies=[("min", "min")])


def test_default_epochs():
    assert default_epochs([1]) == [1]
    assert default_epochs([2, 0, 1, 1]) == [1, 2]
    assert default_epochs([]) == []


def test_resolve_epochs():
    assert resolve_epochs([0, 1], None) == [1]
    assert resolve_epochs([0, 1], "all") == [0, 1]
    assert resolve_epochs([0, 1], [1, 0, 1]) == [0, 1]
    with pytest.raises(UsageError):
        resolve_epochs([0, 1], "some")


def test_selection_mask_skips_warmup_inclusive():
    mask = selection_mask(EPOCH, ITERATION, [1], 1)
    assert mask.tolist() == [False] * 6 + [True, True]


def test_summarize_metrics_threshold_is_strict():
    metrics = {k: np.array([0.03, 0.03001, 0.0]) for k in POLICY_METRICS[("actual", "actual")]}
    stats = summarize_metrics(metrics, np.array([True, True, True]), 0.03)
    assert stats["iterations"] == 3
    assert stats["effective_delay_pct"] == pytest.approx(100 / 3)
    assert stats["delay_s_std"] == pytest.approx(np.std([0.03, 0.03001, 0.0], ddof=1))


def test_add_what_if_per_run():
    df = pd.DataFrame(
        {
            "run": ["a", "a", "b"],
            "fetch_align": ["actual", "min", "min"],
            "start_align": ["actual", "min", "min"],
            "iteration_s_mean": [3.0, 1.5, 1.0],
            "stall_s_mean": [1.0, 0.25, 0.5],
            "effective_delay_pct": [40.0, 10.0, 5.0],
        }
    )
    out = add_what_if(df)
    assert out.speedup.tolist()[:2] == [1.0, 2.0]
    assert out.stall_change_s.tolist()[:2] == [0.0, -0.75]
    assert out.effective_delay_change_pts.tolist()[:2] == [0.0, -30.0]
    assert out.iloc[2][["speedup", "stall_change_s", "effective_delay_change_pts"]].isna().all()
