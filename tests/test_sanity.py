"""Unit traps: a threshold typed in ms, view options moving recorded defaults, synth names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_dsim, run_dsim_in_process
from tracegen import write_synthetic

from dsim.analysis.sanity import check_threshold, selection_changes
from dsim.errors import UsageError
from dsim.model.runname import parse_run_name
from dsim.synth import SynthParams


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_synthetic(tmp_path / "traces", "synth_run", iterations=30)
    return tmp_path


def test_threshold_of_a_second_or_more_is_refused_naming_the_unit() -> None:
    check_threshold(0.999, force=False)
    check_threshold(None, force=False)
    check_threshold(30.0, force=True)
    with pytest.raises(UsageError) as info:
        check_threshold(30.0, force=False)
    text = str(info.value)
    assert "--threshold 30: the threshold is in seconds; 30 s is longer than any iteration" in text
    assert "use 0.030 for 30 ms" in text and "--force" in text
    with pytest.raises(UsageError):
        check_threshold(1.0, force=False)
    with pytest.raises(UsageError) as info:  # it printed the 306 digits of 1e308 / 1000
        check_threshold(1e308, force=False)
    assert "use 1e+305 for 1e+308 ms" in str(info.value) and len(str(info.value)) < 300


def test_a_threshold_that_is_no_number_of_seconds_is_named() -> None:
    for value, reason in ((float("nan"), "not a finite number"), (-0.5, "negative")):
        with pytest.raises(UsageError) as info:  # nan passed as if it were < 1 s
            check_threshold(value, force=True)
        assert reason in str(info.value)


@pytest.mark.parametrize(
    ("command", "option", "value", "reason"),
    [
        ("summarize", "--threshold", "nan", "nan is not a number"),
        ("summarize", "--threshold", "1e400", "inf is not a finite number"),
        ("run", "--threshold", "-inf", "-inf is not a finite number"),
        ("report", "--threshold", "-1", "-1 is below 0"),
        ("watch", "--interval", "nan", "nan is not a number"),
        ("watch", "--interval", "0.05", "0.05 is below 0.1"),
        ("watch", "--interval", "1e10", "1e+10 is above 86400"),  # time.sleep overflowed
    ],
)
def test_the_cli_names_a_number_option_that_is_nan_or_infinite(
    project: Path, command: str, option: str, value: str, reason: str
) -> None:
    # A range check let nan through as "should be ≥ 0" and inf to a message on units.
    target = {"run": "synth_run", "watch": "traces"}.get(command, "results")
    proc = run_dsim_in_process(command, target, option, value, cwd=project)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"dsim: error: Invalid value for '{option}': {reason} (see `dsim {command} --help`)"
    )
    assert not (project / "results").exists()


def test_run_refuses_before_writing_anything(project: Path) -> None:
    proc = run_dsim_in_process("run", "synth_run", "--threshold", "30", cwd=project)
    assert proc.returncode == 2
    assert "the threshold is in seconds" in proc.stderr and "0.030 for 30 ms" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (project / "results").exists()
    conf = {"FILE": "synth_run", "effective_delay_threshold_s": 5}
    (project / "c.json").write_text(json.dumps(conf), encoding="utf-8")
    proc = run_dsim_in_process("run", "--conf", "c.json", cwd=project)
    assert proc.returncode == 2 and "effective_delay_threshold_s in c.json 5:" in proc.stderr
    assert not (project / "results").exists()


# The commands below run through the CLI's entry point in-process (conftest's
# ``run_dsim_in_process``): their subject is a message, an exit code or what result.json
# records, on pure-Python paths (`run` in-process, no Ray); `run`, `summarize` and `report`
# keep their real-subprocess tests (test_run_cli, test_summarize_cli, test_report). Six
# fresh interpreters, each importing pandas and numba anew, cost this file ~14 s.
def test_force_keeps_a_large_threshold_everywhere(project: Path) -> None:
    proc = run_dsim_in_process("run", "synth_run", "--threshold", "1.5", "--force", cwd=project)
    assert proc.returncode == 0, proc.stderr
    for command in (["summarize", "results"], ["report", "results", "--out", "r.html"]):
        proc = run_dsim_in_process(*command, "--threshold", "2", cwd=project)
        assert proc.returncode == 2 and "the threshold is in seconds" in proc.stderr
        proc = run_dsim_in_process(*command, "--threshold", "2", "--force", cwd=project)
        assert proc.returncode == 0, proc.stderr
    info = json.loads((project / "results" / "synth_run" / "result.json").read_text())
    assert info["summary"]["threshold_s"] == 1.5  # summarize/report never write it


def test_run_says_when_it_moves_the_recorded_defaults(project: Path) -> None:
    dsim = run_dsim_in_process
    assert dsim("run", "synth_run", cwd=project).returncode == 0
    proc = dsim("run", "synth_run", "--threshold", "0.05", "--warmup", "3", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert (
        "dsim: note: synth_run: `dsim summarize` and `dsim report` now default to "
        "warm-up 10 → 3, threshold 0.03 s → 0.05 s (recorded by this run)"
    ) in " ".join(proc.stderr.split())
    proc = dsim("run", "synth_run", "--threshold", "0.05", "--warmup", "3", cwd=project)
    assert proc.returncode == 0 and "now default to" not in proc.stderr  # nothing moved
    proc = dsim("run", "synth_run", cwd=project)  # back to the defaults: said, too
    assert "warm-up 3 → 10, threshold 0.05 s → 0.03 s" in " ".join(proc.stderr.split())


def test_selection_changes_ignores_first_records() -> None:
    before = {"a": {"epochs": [1], "warmup": 10, "threshold_s": 0.03}}
    after = {
        "a": {"epochs": [0, 1], "warmup": 10, "threshold_s": 0.03},
        "b": {"epochs": [1], "warmup": 0, "threshold_s": 0.1},
    }
    assert selection_changes(before, after) == [
        "note: a: `dsim summarize` and `dsim report` now default to epochs 1 → 0,1 "
        "(recorded by this run)"
    ]


def test_synth_run_names_give_right_or_empty_metadata() -> None:
    name = SynthParams(gpus=8, iterations=10, epochs=2, workers=4).run_name
    assert name == "synth_queue_seed0_gpus8_epoch2_b2048_worker4_thread0"
    assert parse_run_name(name) == {
        "logtype": "synth",
        "dataset": None,
        "augmentation": None,
        "model": None,
        "epochs": 2,
        "batch_size": 2048,
        "workers": 4,
        "threads": 0,
    }
    # the original analysis's names are read as before
    original = "fsNprepNloadNtrain_openimage_randaugment_resnet50_epoch2_b2048_worker12_thread0"
    assert parse_run_name(original)["model"] == "resnet50"
    assert parse_run_name("synth_queue_x")["logtype"] is None


def test_synth_then_parse_records_no_nonsense(tmp_path: Path) -> None:
    proc = run_dsim(
        "synth", "--gpus", "2", "--iterations", "12", "--epochs", "1", "--workers", "2",
        "--out", "logs", "--quiet", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "logs").iterdir()
    proc = run_dsim("parse", str(run_dir), "--out", "traces", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads((tmp_path / "traces" / run_dir.name / "run.json").read_text())
    assert info["metadata"]["dataset"] is None and info["metadata"]["model"] is None
    assert info["metadata"]["workers"] == 2 and info["metadata"]["logtype"] == "synth"
