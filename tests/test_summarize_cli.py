"""`dsim summarize` end to end: the real CLI in a subprocess on real Parquet result directories.

Usage errors and help, one message and an exit code each, go through the same entry
point in-process (``dsim_here``; conftest's ``run_dsim_in_process`` says when that is
allowed); the subprocess tests keep the success paths and the input and output errors.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_dsim, run_dsim_in_process

from dsim.model.results import replay_table, write_replay, write_result_info

EPOCH = np.array([0, 0, 0, 1, 1, 1], dtype=np.int32)
ITERATION = np.array([0, 1, 2, 0, 1, 2], dtype=np.int32)
METRICS = {
    # policy: iteration_s of the rows; selection epoch 1, warm-up 0 keeps the last two
    ("actual", "actual"): [9.0, 9.0, 9.0, 9.0, 2.0, 4.0],
    ("avg", "min"): [9.0, 9.0, 9.0, 9.0, 1.0, 2.0],
    ("min", "actual"): [9.0, 9.0, 9.0, 9.0, 1.5, 3.0],
}


def make_results(out: Path, run: str, scale: float = 1.0) -> Path:
    for policy, iteration_s in METRICS.items():
        it = np.asarray(iteration_s) * scale
        metrics = {
            "iteration_s": it,
            "stall_s": it / 2,
            "delay_s": np.where(it > 3.5, 0.05, 0.01),
            "fetch_diff_s": np.zeros(6),
            "start_diff_s": np.ones(6),
        }
        table = replay_table(
            EPOCH, ITERATION, metrics, np.arange(4), np.zeros((6, 4)),
            run=run, policy=policy, key="k",
        )  # fmt: skip
        write_replay(table, out)
    info = {
        "trace": {"gpus": 4},
        "summary": {"epochs": [1], "warmup": 0, "threshold_s": 0.03},
        "policies": {f"{f}__{s}": "k" for f, s in METRICS},
    }
    write_result_info(info, out, run)
    return out


def dsim(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real CLI (conftest's ``run_dsim``) with a wide terminal, so tables keep one layout."""
    return run_dsim(*args, cwd=cwd, env={"COLUMNS": "200"}, timeout=120)


def dsim_here(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``dsim`` as above, in this process (``run_dsim_in_process``)."""
    return run_dsim_in_process(*args, cwd=cwd, env={"COLUMNS": "200"})


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return make_results(tmp_path / "results", "runA")


def test_prints_the_table(results):
    proc = dsim("summarize", results)
    assert proc.returncode == 0, proc.stderr
    assert "runA (4 GPUs, 2 iterations)" in proc.stdout
    for label in ("actual/actual", "avg/min", "min/actual"):
        assert label in proc.stdout
    assert "2.00×" in proc.stdout  # avg/min: 3.0 / 1.5
    assert "3.000" in proc.stdout and "±1.414" in proc.stdout  # actual/actual mean ± std
    assert not list(results.glob("summary.*"))  # nothing written without --out


def test_writes_every_format_atomically(results, tmp_path):
    out = tmp_path / "summaries"
    proc = dsim("summarize", results, "--out", out, "--format", "csv,parquet,json", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert sorted(p.name for p in out.iterdir()) == [
        "summary.csv",
        "summary.json",
        "summary.parquet",
    ]
    table = pq.read_table(out / "summary.parquet").to_pandas()
    assert len(table) == 3
    aligned = table[table.fetch_align == "avg"].iloc[0]
    assert aligned.iteration_s_mean == pytest.approx(1.5)
    assert aligned.speedup == pytest.approx(2.0)
    assert aligned.effective_delay_change_pts == pytest.approx(-50.0)
    records = json.loads((out / "summary.json").read_text())
    assert [r["run"] for r in records] == ["runA"] * 3
    assert records[0]["logtype"] is None  # NaN/None become null, valid JSON
    assert (out / "summary.csv").read_text().splitlines()[0].startswith("run,logtype,")


def test_filters_and_several_results_directories(results, tmp_path):
    other = make_results(tmp_path / "other", "runB", scale=2.0)
    proc = dsim(
        "summarize", results, other, "--run", "run[B]", "--policy", "avg/min",
        "--out", tmp_path / "s", "--format", "csv",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "s" / "summary.csv").read_text().splitlines()
    assert len(lines) == 2 and lines[1].startswith("runB,")
    proc = dsim("summarize", results, other, "--policy", "min__actual", "--epochs", "all")
    assert proc.returncode == 0, proc.stderr
    assert "runA" in proc.stdout and "runB" in proc.stdout
    assert "avg/min" not in proc.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--run", "nomatch*"], 2, "--run nomatch* matches no run"),
        (["--policy", "median/min"], 2, "unknown policy 'median'"),
        (["--policy", "avg"], 2, "--policy: expected FETCH/START"),
        (["--epochs", "7"], 2, "epoch(s) 7 not in run"),
        (["--epochs", "x"], 2, "--epochs: expected"),
        (["--warmup", "5"], 2, "no iterations selected"),
        (["--format", "xlsx", "--out", "o"], 2, "unknown output format xlsx"),
    ],
)
def test_bad_options_give_one_line_and_write_nothing(results, tmp_path, args, code, message):
    proc = dsim_here("summarize", results, *args, cwd=tmp_path)
    assert proc.returncode == code
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_missing_or_empty_results_directory(tmp_path):
    proc = dsim("summarize", tmp_path / "nope")
    assert proc.returncode == 3 and "no such file or directory" in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = dsim("summarize", tmp_path / "empty")
    assert proc.returncode == 3 and "no dsim results here" in proc.stderr


def test_unwritable_out_is_an_output_error(results, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    proc = dsim("summarize", results, "--out", blocker / "sub")
    assert proc.returncode == 4
    assert "cannot write" in proc.stderr and "Traceback" not in proc.stderr
    assert blocker.read_text() == "in the way"


def test_help_has_examples():
    proc = dsim_here("summarize", "--help")
    assert proc.returncode == 0
    assert "Examples" in proc.stdout and "--policy" in proc.stdout


@pytest.mark.parametrize("extra", [(), ("--json",), ("--format", "csv", "--out", "-")])
def test_a_reader_that_closes_stdout_early_ends_it_quietly(results, extra):
    """Issue #20: `dsim summarize | head -1` exited 1 (rich's SystemExit) or printed an
    internal error. The pipe is closed before dsim writes: 141 (128 + SIGPIPE), no output."""
    import os
    import sys

    env = {**os.environ, "COLUMNS": "200"}
    env.pop("DSIM_DEBUG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsim", "summarize", str(results), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("extra", [(), ("--json",), ("--format", "csv", "--out", "-")])
def test_stdout_on_a_full_device_is_an_output_error(results, extra):
    """stdout on a full device (`> /dev/full`) was an internal error (exit 1, "a bug in
    dsim"): it is the user's to act on, one line and exit 4 (SPEC §9)."""
    import os
    import sys

    env = {**os.environ, "COLUMNS": "200"}
    env.pop("DSIM_DEBUG", None)
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "dsim", "summarize", str(results), *extra],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=120,
        )
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsim: error: cannot write"), proc.stderr
    assert "No space left on device" in lines[0]


def test_epochs_of_iteration_0_alone_do_not_ask_for_a_smaller_warmup() -> None:
    """The hint said "a smaller --warmup" at --warmup 0, where iteration 0 is always
    skipped (iterations > N are kept): no warm-up can select anything there."""
    from dsim.analysis.summary import selected_iterations
    from dsim.errors import UsageError

    epoch, iteration = np.array([0, 1, 2]), np.zeros(3, dtype=np.int64)
    with pytest.raises(UsageError) as caught:
        selected_iterations(epoch, iteration, "all", 0, "r")
    assert "smaller --warmup" not in str(caught.value)
    assert "hold only iteration 0" in str(caught.value)
    with pytest.raises(UsageError, match="a smaller --warmup"):
        selected_iterations(epoch, np.array([0, 3, 5]), "all", 10, "r")
