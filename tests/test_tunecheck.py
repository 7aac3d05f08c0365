"""dsim tune's recommendation judged against a measured grid (validation/tunecheck.py).

Small synthetic inputs with known answers: the verdict rule (best, gap,
max(2 %, 2σ), the 5 % target, the predicted error), the knee of a measured
curve, the grid a sweep's names give, FIDELITY.md's section, and dsim's tune
run end to end on two synthetic loading-bound traces named like a sweep's runs.
"""

from __future__ import annotations

import math
import sys

import pandas as pd
import pytest
from conftest import REPO

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import dsim
from dsim.synth import SynthParams, synthesize
from validation.cells import Stat, stat
from validation.report import tune_section
from validation.tunecheck import (
    change_row,
    judge,
    knee,
    knee_field,
    knees_within_noise,
    measured_best,
    measured_grids,
    tune_rows,
)

GRID = {
    (1, 2): Stat(100.0, 1.0, 3),
    (2, 2): Stat(60.0, 0.5, 3),
    (4, 2): Stat(59.0, 0.5, 3),
    (8, 2): Stat(61.0, 2.0, 3),
}


def test_the_measured_best_and_a_recommendation_that_is_it() -> None:
    assert measured_best(GRID) == (4, 2)
    assert measured_best({(1, 2): Stat(5.0, None, 1), (2, 2): Stat(5.0, None, 1)}) == (1, 2)
    row = judge((4, 2), 61.95, GRID)
    assert row["is_best"] and row["within"] and row["within_target"]
    assert row["gap_pct"] == 0.0 and row["two_sigma_pct"] == 0.0
    assert row["predicted_err_pct"] == pytest.approx(5.0)  # 61.95 against the measured 59


def test_near_the_best_by_threshold_or_by_noise_and_not_near() -> None:
    near = judge((2, 2), 58.0, GRID)  # 60 against 59: +1.69 %, inside 2 %
    assert not near["is_best"] and near["within"]
    assert near["gap_pct"] == pytest.approx(100 / 59)
    assert near["predicted_err_pct"] == pytest.approx(-100 * 2 / 60)
    noisy = {**GRID, (2, 2): Stat(61.0, 3.0, 3)}  # +3.39 %, but 2σ = 2·sqrt(9.25)/59 = 10.3 %
    row = judge((2, 2), 60.0, noisy)
    assert row["within"] and row["two_sigma_pct"] == pytest.approx(200 * math.sqrt(9.25) / 59)
    far = judge((1, 2), 90.0, GRID)  # 100 against 59
    assert not far["within"] and not far["within_target"]
    assert far["gap_pct"] == pytest.approx(100 * 41 / 59)
    target_only = judge((8, 2), 60.0, {**GRID, (8, 2): Stat(61.5, 0.1, 3)})  # +4.2 %
    assert not target_only["within"] and target_only["within_target"]


def test_a_recommendation_outside_the_grid_is_not_judged() -> None:
    row = judge((16, 2), 50.0, GRID)
    assert not row["is_best"] and row["best_workers"] == 4
    assert row["within"] is None and row["gap_pct"] is None and row["predicted_err_pct"] is None


def test_knees_the_measured_noise_cannot_rule_out() -> None:
    # The cpu regime's curve: 1 -> 2 w gains 3 %, 2 -> 4 w nothing, 4 -> 8 w 7 %, all
    # within 2 sigma of 2 %: every knee is possible, and so is "past the grid".
    cpu = {1: Stat(52.30, 2.82, 3), 2: Stat(50.71, 2.21, 3), 4: Stat(50.91, 0.85, 3),
           8: Stat(47.64, 1.92, 3)}  # fmt: skip
    assert knee({w: s.mean for w, s in cpu.items()}, 0.02) == 2
    assert knees_within_noise(cpu, 0.02) == [1, 2, 4, None]
    # A clear curve: 1 -> 2 w nearly halves the time, 2 -> 4 w loses, with small sds:
    # only 2 w.
    clear = {1: Stat(43.09, 0.24, 3), 2: Stat(24.18, 0.16, 3), 4: Stat(24.50, 0.20, 3)}
    assert knees_within_noise(clear, 0.02) == [2]
    # Still gaining clearly at every step: only past the grid.
    steep = {1: Stat(100.0, 1.0, 3), 2: Stat(60.0, 1.0, 3), 4: Stat(40.0, 1.0, 3)}
    assert knees_within_noise(steep, 0.02) == [None]
    # One value per cell (sd None counts as 0): the plain knee.
    plain = {1: Stat(100.0, None, 1), 2: Stat(60.0, None, 1), 4: Stat(59.0, None, 1)}
    assert knees_within_noise(plain, 0.02) == [2]
    assert knee_field([1, 2, None]) == "1;2;past"


def test_knee_of_a_measured_curve() -> None:
    assert knee({1: 100.0, 2: 60.0, 4: 59.0, 8: 61.0}, 0.02) == 2
    assert knee({1: 100.0, 2: 80.0, 4: 60.0}, 0.02) is None
    assert knee({8: 40.0, 2: 70.0, 1: 71.0}, 0.02) == 1  # in worker order: 1 -> 2 gains < 2 %
    assert knee({1: 50.0, 2: 50.5}, 0.02) == 1


def test_grids_keep_only_unaligned_cells_per_regime() -> None:
    names = ["a_w1_p2_none_r1", "a_w1_p2_none_r2", "a_w2_p2_none_r1", "a_w1_p2_min_r1",
             "a_w2_p2_none_smin_r1", "b_w2_p4_none_r1"]  # fmt: skip
    ms = dict.fromkeys(names, 10.0) | {"a_w1_p2_none_r2": 14.0}
    grids = measured_grids(names, ms)
    assert set(grids) == {"a", "b"}
    assert list(grids["a"]) == [(1, 2), (2, 2)]
    assert grids["a"][(1, 2)] == stat([10.0, 14.0]) and grids["b"][(2, 4)].n == 1


def _identity(regime: str, workers: int, ms: float, sd: float) -> dict:
    return {"kind": "identity", "regime": regime, "workers": workers, "pipeline_prefetch": 2,
            "iteration_ms_measured": ms, "iteration_ms_measured_sd": sd, "n_target": 3}  # fmt: skip


def _row(regime: str, base: int, rec: int, predicted: float, grid: dict) -> dict:
    curve = {w: s.mean for (w, _), s in grid.items()}
    return {"regime": regime, "regime_kind": "cpu", "base_run": f"{regime}_w{base}_p2_none_r1",
            "base_workers": base, "base_prefetch": 2, "grid_workers": "1;2;4;8",
            "grid_prefetch": "2", **judge((rec, 2), predicted, grid),
            "predicted_knee_workers": 2, "predicted_knee_reason": "stall-left",
            "measured_knee_workers": knee(curve, 0.02),
            "measured_knees_within_noise": knee_field(
                knees_within_noise({w: s for (w, _), s in grid.items()}, 0.02)),
            "knee_within_noise": 2 in knees_within_noise({w: s for (w, _), s in grid.items()},
                                                         0.02)}  # fmt: skip


def test_fidelity_section_counts_and_target() -> None:
    frame = pd.DataFrame([_identity("x", w, s.mean, s.sd) for (w, _), s in GRID.items()])
    tune = pd.DataFrame([_row("x", 1, 4, 60.0, GRID), _row("x", 2, 2, 60.0, GRID)])
    text = "\n".join(tune_section(tune, frame))
    assert (
        "| x (cpu) | 1 w 100.00 ± 1.00; 2 w 60.00 ± 0.50; 4 w 59.00 ± 0.50; 8 w 61.00 ± 2.00"
        in text
    )
    assert "| 4 w (59.00 ms) | 4 w ×1, 2 w ×1 | 1/2 | 2/2 | +1.7 % | 2/2 |" in text
    # 1 -> 2 w gains 67 %; 2 -> 4 w 1.7 % ± 2.4 and 4 -> 8 w -3.3 % ± 6.8 could gain 2 % or not
    assert "| 2 w / 2 w ×2 | 2 w, 4 w or past the grid; 2/2 |" in text
    assert "tune's predicted knee is one the measured curve's noise allows from 2/2" in text
    old = tune.drop(columns=["measured_knees_within_noise", "knee_within_noise"])
    assert "| 2 w / 2 w ×2 | n/a |" in "\n".join(tune_section(old, frame))  # an older CSV
    assert "from every base run of every regime: met." in text
    assert "Recommendations that cost more" not in text  # a CSV without the columns
    noted = tune.assign(
        costs_more=[True, False], within_error=[True, False], change_gain_pct=[-3.0, 0.0]
    )
    assert (
        "Recommendations that cost more than the base run had (1), and tune's note that the "
        "gain is within the model's error: with the note: 1, measured gain over the recorded "
        "setting median -3.0 % (range -3.0 to -3.0 %), no faster in 1; without it: none."
    ) in "\n".join(tune_section(noted, frame))
    bad = pd.DataFrame([_row("x", 1, 1, 95.0, GRID)])
    assert "regime: missed (x)." in "\n".join(tune_section(bad, frame))
    assert "not checked" in "\n".join(tune_section(pd.DataFrame(), frame))


# One batch takes 0.2 s to build, an iteration computes 0.07 s: 4 workers keep up, 1 cannot.
LOADING = {"fetch_mean_s": 0.2, "compute_s": 0.05, "gpus": 2, "iterations": 40, "epochs": 1}


def test_tune_rows_runs_dsim_tune_on_every_base_run(tmp_path) -> None:
    for workers in (1, 4):
        name = f"lb_w{workers}_p2_none_r1"
        params = SynthParams(
            **LOADING, workers=workers, seed=workers, straggler_prob=0.0, name=name
        )
        dsim.parse(synthesize(params, tmp_path / "logs"), out=tmp_path / "traces")
    names = ["lb_w1_p2_none_r1", "lb_w4_p2_none_r1"]
    rows = tune_rows(tmp_path / "traces", names, {names[0]: 280.0, names[1]: 90.0}, {"lb": "x"}, 2)
    assert list(rows["base_run"]) == names
    assert set(rows["recommended_workers"]) == {4} and rows["is_best"].all()
    # From 1 worker, 4 cost more and clearly gain (no note); from 4, the recorded setting.
    assert list(rows["costs_more"]) == [True, False]
    assert not rows["within_error"].any()
    assert list(rows["change_gain_pct"]) == pytest.approx([100 * (280 / 90 - 1), 0.0])
    assert (rows["grid_workers"] == "1;4").all() and (rows["regime_kind"] == "x").all()
    # The same recommendation against a grid where 1 worker measured faster: not the best.
    flipped = tune_rows(tmp_path / "traces", names, {names[0]: 80.0, names[1]: 90.0}, {}, 2)
    assert not flipped["is_best"].any()
    assert list(flipped["gap_pct"]) == pytest.approx([12.5, 12.5])
    # A prefetch factor measured at one worker count only is left out of tune's grid and of
    # the judged one: tune could recommend its product with other counts, never measured.
    partial = tune_rows(
        tmp_path / "traces", [*names, "lb_w1_p4_none_r1"],
        {names[0]: 280.0, names[1]: 90.0, "lb_w1_p4_none_r1": 50.0}, {}, 2,
    )  # fmt: skip
    assert (partial["grid_prefetch"] == "2").all() and partial["is_best"].all()
    # No factor measured at every worker count (4 w only at p4): nothing to judge, no error.
    ragged = {names[0]: 280.0, "lb_w4_p4_none_r1": 90.0}
    assert tune_rows(tmp_path / "traces", list(ragged), ragged, {}, 2).empty


def test_a_changes_measured_gain_over_the_recorded_setting() -> None:
    row = change_row(True, True, Stat(60.0, 1.0, 3), Stat(66.0, 1.0, 3))
    assert row["costs_more"] and row["within_error"]
    assert row["change_gain_pct"] == pytest.approx(100 * (60 / 66 - 1))  # measured slower
    assert change_row(False, False, None, Stat(66.0, 1.0, 3))["change_gain_pct"] is None
    assert change_row(True, False, Stat(math.nan, None, 1), GRID[(2, 2)])["change_gain_pct"] is None
