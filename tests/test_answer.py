"""One answer behind every output (docs/SPEC.md §5 "One answer"), end to end in subprocesses.

One results directory holds several runs and both replay models (two synthetic runs, one of
them also under the pipeline model, and a profiled run replayed by the stall-only model),
written by four separate `dsim run`s. The directory-level files describe all of them; the
terminal, `--json` and the CSV of `dsim summarize` agree on every number, verdict and
attribution line; a mixed selection skips what does not apply with a note.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, run_dsim

A = "synth_queue_seed5_gpus3_epoch2_b96_worker2_thread0"
B = "synth_queue_seed6_gpus2_epoch2_b64_worker2_thread0"
PROFILED = REPO / "traces" / "profiler" / "cpuDDP_synthetic_none_mlp_epoch1_b128_worker2_thread0"
P = PROFILED.name
WIDE = {"COLUMNS": "400"}


def dsim(*args: str | Path, cwd: Path, code: int = 0) -> subprocess.CompletedProcess:
    proc = run_dsim(*args, cwd=cwd, env=WIDE, timeout=180)
    assert proc.returncode == code, (args, proc.stderr)
    return proc


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("answer")
    common = ("--iterations", "20", "--epochs", "2", "--workers", "2", "--out", "raw", "-q")
    dsim("synth", "--gpus", "3", "--seed", "5", "--skew", "0.5", "--batch-size", "32", *common,
         cwd=work)  # fmt: skip
    dsim("synth", "--gpus", "2", "--seed", "6", "--fetch-mean", "0.2", "--compute", "0.05",
         "--batch-size", "32", *common, cwd=work)  # fmt: skip
    dsim("parse", "raw", "--out", "traces", "-q", cwd=work)
    dsim("parse", PROFILED, "--out", "traces", "-q", cwd=work)
    for args in ((A,), (B,), (A, "--model", "pipeline"), (P,)):  # four `dsim run`s, one dir
        dsim("run", *args, "--warmup", "2", "--executor", "local", "-q", cwd=work)
    return work


def test_directory_files_describe_every_run_not_only_the_last_dsim_run(work: Path) -> None:
    summary = pd.read_csv(work / "results" / "summary.csv")
    assert sorted(set(summary["results"])) == sorted(
        [f"results/{A}", f"results/{A}@pipeline", f"results/{B}", f"results/{P}@stall-only"]
    )
    assert set(summary["replay_model"]) == {"per-iteration", "pipeline", "stall-only"}
    parquet = pd.read_parquet(work / "results" / "summary.parquet")
    assert len(parquet) == len(summary) == 9 + 9 + 9 + 3
    attribution = pd.read_csv(work / "results" / "attribution.csv")
    assert sorted(set(attribution["run"])) == sorted({A, B, P})
    # each run's own attribution file, from which the directory's is rebuilt
    assert (work / "results" / "attribution" / "runs" / f"{B}.parquet").is_file()


def _numbers_equal(a: object, b: object) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=1e-15)
    return str(a) == str(b)


def _words(text: str) -> str:
    return " ".join(text.split())


def test_terminal_json_and_csv_agree_on_every_number_verdict_and_attribution(work: Path) -> None:
    doc = json.loads(dsim("summarize", "results", "--json", cwd=work).stdout)
    csv = pd.read_csv(io.StringIO(dsim("summarize", "results", "--out", "-", "--format", "csv",
                                       cwd=work).stdout))  # fmt: skip
    terminal = dsim("summarize", "results", cwd=work).stdout
    said = _words(terminal)

    # numbers: every cell of every row, CSV against JSON (the same rows, in the same order)
    rows = doc["summary"]
    assert len(rows) == len(csv) == 30
    for record, (_, row) in zip(rows, csv.iterrows(), strict=True):
        for key, value in record.items():
            cell = row[key]
            cell = None if isinstance(cell, float) and math.isnan(cell) else cell
            assert _numbers_equal(value, cell.item() if hasattr(cell, "item") else cell), key

    # verdicts, caveats and attribution lines: the terminal says what the JSON says
    assert len(doc["verdicts"]) == len(doc["runs"]) == 4
    for verdict, run in zip(doc["verdicts"], doc["runs"], strict=True):
        assert (verdict["run"], verdict["results"]) == (run["run"], run["results"])
        assert _words(verdict["text"]) in said
        for caveat in verdict["caveats"]:
            assert _words(f"caveat: {caveat}") in said
        if run["model"] != "stall-only":  # a profiled run is judged by its stalls (one line)
            assert run["attribution"], run["run"]
        for line in run["attribution"]:
            assert _words(line) in said
        # one best policy: the verdict's, the run's, the table's marker (the tie rule)
        assert (run["best_fetch_align"], run["best_start_align"]) == (
            verdict["best_fetch_align"],
            verdict["best_start_align"],
        )
    marked = [line.split()[0] for line in terminal.splitlines() if line.rstrip().endswith("best")]
    expected = [
        f"{r['best_fetch_align']}/{r['best_start_align']}"
        for r, o in zip(doc["runs"], doc["overview"], strict=True)
        if o["best"] is not None
    ]
    assert marked == expected and len(expected) >= 3
    # the terminal's rounded numbers are the JSON's: every speed-up and measured mean
    for record in rows:
        assert f"{record['speedup']:.2f}×" in terminal
    for o in doc["overview"]:
        unit_ms = o["iteration_s"] < 1
        shown = f"{o['iteration_s'] * 1000:.1f}" if unit_ms else f"{o['iteration_s']:.4f}"
        assert shown in terminal, (o["run"], shown)


def test_a_mixed_selection_skips_the_run_that_cannot_replay_the_policy(work: Path) -> None:
    proc = dsim("run", "-r", "*", "-p", "avg/min", "--warmup", "2", "--out", "mixed",
                "--executor", "local", "--json", cwd=work)  # fmt: skip
    doc = json.loads(proc.stdout)
    assert {r["run"] for r in doc["runs"]} == {A, B}
    assert f"skipped run {P}: run {P} has no fetch records" in _words(proc.stderr)
    assert any(note.startswith(f"skipped run {P}") for note in doc["notes"])
    assert not list((work / "mixed").glob(f"{P}*"))
    # nothing could be replayed: the refusal, as before (exit 3)
    alone = dsim("run", P, "-p", "avg/min", "--out", "alone", cwd=work, code=3)
    assert f"run {P} has no fetch records" in alone.stderr


def test_report_and_summarize_epochs_skip_a_run_without_that_epoch(work: Path) -> None:
    proc = dsim("report", "results", "--epochs", "1", "--out", "r.html", cwd=work)
    assert f"skipped run {P}" in proc.stderr and "no epoch(s) 1 (it has 0)" in proc.stderr
    page = (work / "r.html").read_text()
    assert A in page and P not in page
    doc = json.loads(dsim("summarize", "results", "--epochs", "1", "--json", cwd=work).stdout)
    assert {r["run"] for r in doc["runs"]} == {A, B}
    assert any("no epoch(s) 1" in note for note in doc["notes"])
    dsim("summarize", f"results/{P}@stall-only", "--epochs", "1", cwd=work, code=2)  # alone
