"""`dsim compare`: measured deltas and the realised share, on runs with known numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_dsim, run_dsim_in_process

from dsim.analysis.comparison import compare
from dsim.errors import UsageError
from dsim.model.results import replay_table, write_replay, write_result_info

EPOCH = np.array([1, 1], dtype=np.int32)
ITERATION = np.array([1, 2], dtype=np.int32)


def make_run(out: Path, run: str, iteration_s: dict, gpus: int = 4) -> Path:
    """A results run whose replays have the given per-iteration times (2 iterations each);
    stall = half the iteration time, delay = 0.05 s where the iteration takes > 2.5 s."""
    for policy, values in iteration_s.items():
        it = np.asarray(values, dtype=float)
        metrics = {
            "iteration_s": it,
            "stall_s": it / 2,
            "delay_s": np.where(it > 2.5, 0.05, 0.01),
            "fetch_diff_s": np.zeros(2),
            "start_diff_s": np.zeros(2),
        }
        table = replay_table(
            EPOCH, ITERATION, metrics, np.arange(gpus), np.zeros((2, gpus)),
            run=run, policy=policy, key="k",
        )  # fmt: skip
        write_replay(table, out)
    info = {
        "trace": {"gpus": gpus},
        "summary": {"epochs": [1], "warmup": 0, "threshold_s": 0.03},
        "policies": {f"{f}__{s}": "k" for f, s in iteration_s},
    }
    write_result_info(info, out, run)
    return out / run


# BEFORE: measured mean 3.0 s (2, 4); min/min predicts 1.0 s, avg/avg 2.0 s
BEFORE = {("actual", "actual"): [2.0, 4.0], ("min", "min"): [1.0, 1.0], ("avg", "avg"): [2.0, 2.0]}
# AFTER: measured mean 2.0 s (1, 3); min/min would still reach 1.5 s
AFTER = {("actual", "actual"): [1.0, 3.0], ("min", "min"): [1.5, 1.5]}


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    return make_run(tmp_path / "results", "old", BEFORE), make_run(
        tmp_path / "results", "new", AFTER
    )


def test_compare_text_with_known_deltas(runs) -> None:
    proc = run_dsim("compare", *map(str, runs), env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "BEFORE old → AFTER new" in out
    assert "iteration time 3.0000 s 2.0000 s −1.0000 s (−33 %)" in out
    assert "stall 1.5000 s 1.0000 s −0.5000 s (−33 %)" in out
    # delay 0.05 where > 2.5 s: before (0.01 + 0.05) / 2, after (0.01 + 0.05) / 2
    assert "delay 30.0 ms 30.0 ms +0.0 ms (+0 %)" in out  # ms below 1 s (SPEC §5)
    assert "effective delay 50.0 % 50.0 % +0.0 pts" in out
    # predicted by min/min (the best): 3 - 1 = 2 s; realised 3 - 2 = 1 s: 50 %
    assert "AFTER realised 50 % of the gain BEFORE predicted for min/min (1 s of 2 s" in out
    assert "min/min would still save 500 ms per iteration." in out


def test_compare_json_and_csv(runs) -> None:
    proc = run_dsim("compare", *map(str, runs), "--format", "json", "--policy", "avg/avg")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["policy"] == "avg/avg"
    assert data["iteration_s_before"] == 3.0 and data["iteration_s_after"] == 2.0
    assert data["iteration_s_change_pct"] == pytest.approx(-100 / 3)
    assert data["predicted_gain_s"] == 1.0 and data["realised_gain_s"] == 1.0
    assert data["realised_pct"] == 100.0
    assert data["remaining_gain_s"] is None  # AFTER did not replay avg/avg
    assert data["warnings"] == []
    proc = run_dsim("compare", *map(str, runs), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    from io import StringIO

    row = pd.read_csv(StringIO(proc.stdout)).iloc[0]
    assert row["policy"] == "min/min" and row["realised_pct"] == 50.0


def test_compare_of_a_run_with_itself_says_so(runs) -> None:
    """Every change is zero, which read as "no effect" without a word."""
    old = runs[0]
    proc = run_dsim("compare", old, old.parent / "." / old.name, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    (warning,) = json.loads(proc.stdout)["warnings"]
    assert warning.startswith("BEFORE and AFTER are the same run directory")


def test_compare_refuses_what_it_cannot_answer(runs, tmp_path: Path) -> None:
    proc = run_dsim_in_process("compare", str(runs[0].parent), str(runs[1]))
    assert proc.returncode == 2 and "holds 2 runs" in proc.stderr
    proc = run_dsim_in_process("compare", *map(str, runs), "--policy", "min/avg")
    assert proc.returncode == 2 and "BEFORE has no replay of min/avg" in proc.stderr
    proc = run_dsim_in_process("compare", *map(str, runs), "--format", "xml")
    assert proc.returncode == 2
    proc = run_dsim("compare", str(tmp_path / "nowhere"), str(runs[1]))
    assert proc.returncode == 3


def rows(run: str, table: dict, **extra) -> list[dict]:
    return [
        {
            "run": run,
            "fetch_align": f,
            "start_align": s,
            "iteration_s_mean": float(np.mean(v)),
            "stall_s_mean": float(np.mean(v)) / 2,
            "delay_s_mean": 0.0,
            "effective_delay_pct": 0.0,
            **extra,
        }
        for (f, s), v in table.items()
    ]


def test_shares_and_warnings() -> None:
    c = compare(rows("a", BEFORE, gpus=4), rows("b", AFTER, gpus=8))
    assert c.policy == ("min", "min") and c.realised_pct == 50.0
    assert c.remaining_gain_s == 0.5
    assert c.warnings == ["different GPU counts (4 before, 8 after)"]
    # AFTER slower than BEFORE: a negative share
    assert compare(rows("a", AFTER), rows("b", BEFORE)).realised_pct == pytest.approx(-200.0)
    # nothing predicted: no share
    flat = {("actual", "actual"): [1.0], ("min", "min"): [1.0]}
    c = compare(rows("a", flat), rows("b", flat))
    assert math.isnan(c.realised_pct) and "predicted no gain" in c.text
    with pytest.raises(ValueError, match="actual/actual"):
        compare(rows("a", {("min", "min"): [1.0]}), rows("b", flat))


def test_a_prediction_is_labelled_never_called_measured() -> None:
    """Issue #19: a run against its own 8-worker what-if said "27 ms → 16 ms measured"."""
    what_if = {"replay_model": "pipeline", "loader_changed": True, "loader_workers": 8,
               "loader_prefetch_factor": 2}  # fmt: skip
    c = compare(rows("r", BEFORE, loader_changed=False), rows("r", AFTER, **what_if))
    assert (c.before_label, c.after_label) == (
        "measured",
        "predicted (pipeline model, 8 workers, prefetch 2)",
    )
    assert c.text.startswith(
        "Iterations 3 s measured → 2 s predicted (pipeline model, 8 workers, prefetch 2) (−33 %)"
    )
    assert "measured (" not in c.text and "AFTER would realise 50 %" in c.text
    assert c.warnings == ["the same run on both sides: one side is a prediction, not a re-run"]
    assert c.record()["after_label"].startswith("predicted")
    plain = compare(rows("a", BEFORE), rows("b", AFTER))
    assert (plain.before_label, plain.after_label) == ("measured", "measured")
    assert " measured (" in plain.text and "AFTER realised" in plain.text


def test_api_compare_is_the_command_and_short_in_a_notebook(tmp_path: Path) -> None:
    import dsim

    old = make_run(tmp_path / "results", "old<i>", BEFORE)
    new = make_run(tmp_path / "results", "new", AFTER)
    result = dsim.compare(old, new, policy="avg/avg")
    proc = run_dsim("compare", str(old), str(new), "--json", "--policy", "avg/avg")
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(proc.stdout)
    assert result.realised_pct == cli["realised_pct"] == 100.0 and result.text == cli["text"]
    text = repr(result)  # the dataclass default printed every field and delta
    assert text.startswith("Comparison(old<i> → new: Iterations 3 s → 2 s measured")
    assert len(text) < 300
    html = result._repr_html_()
    assert "old&lt;i&gt;" in html and "<i>" not in html
    assert "<td>iteration time</td><td>3 s</td><td>2 s</td>" in html
    with pytest.raises(UsageError, match="holds 2 runs"):
        dsim.compare(old.parent, new)


def test_a_side_of_several_runs_is_listed_by_directory(tmp_path: Path) -> None:
    """A run and its pipeline variant read "holds 2 runs (r1, r1)", and the example
    pointed at r1 whatever the directories were."""
    from tracegen import write_synthetic

    write_synthetic(tmp_path / "traces", "r1", iterations=30)
    for extra in ([], ["--model", "pipeline"]):
        proc = run_dsim_in_process("run", "r1", "--executor", "local", "-q", *extra, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    proc = run_dsim_in_process("compare", "results", "results/r1", cwd=tmp_path)
    assert proc.returncode == 2
    assert "BEFORE results holds 2 runs (r1, r1@pipeline); name one run directory, e.g. " in (
        proc.stderr
    )


def test_a_run_whose_results_are_a_model_variant_is_pointed_to_it(tmp_path: Path) -> None:
    """A profiled run's results are RUN@stall-only only: `dsim compare results/RUN X` said
    "no such file or directory"."""
    from tracegen import write_synthetic

    write_synthetic(tmp_path / "traces", "r1", iterations=30)
    proc = run_dsim_in_process(
        "run", "r1", "--model", "stall-only", "--executor", "local", "-q", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    proc = run_dsim_in_process("compare", "results/r1", "results/r1@stall-only", cwd=tmp_path)
    assert proc.returncode == 3
    assert proc.stderr.strip() == (
        "dsim: error: BEFORE results/r1: no such run directory; its results are in "
        "results/r1@stall-only (results of another replay model): name that directory"
    )
