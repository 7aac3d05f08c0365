"""Machine interfaces (docs/SPEC.md §5.6): ``--json``, ``--out -``, ``--fail-if``.

The real CLI in a subprocess on a real parsed run (its usage errors, one line
each, in-process: conftest's ``run_dsim_in_process``); the JSON is validated
against the schema block of docs/SPEC.md §5.6 itself (with ``jsonschema``)
and read with ``jq`` when it is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run_dsim, run_dsim_in_process

jsonschema = pytest.importorskip("jsonschema")

RUN = "synth_queue_seed5_gpus3_epoch2_b96_worker2_thread0"


def spec_schema(title: str | None = None) -> dict:
    """The JSON Schema block of docs/SPEC.md §5.6: the first one, or the one with ``title``."""
    spec = (REPO / "docs" / "SPEC.md").read_text(encoding="utf-8")
    section = spec[spec.index("### 5.6 ") : spec.index("## 6. ")]
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", section, re.DOTALL)]
    assert blocks, "no schema block in SPEC §5.6"
    if title is None:
        return blocks[0]
    [schema] = [b for b in blocks if b.get("title") == title]
    return schema


def validate(doc: dict, title: str | None = None) -> None:
    schema = spec_schema(title)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("machine")
    synth = ("--gpus", "3", "--iterations", "40", "--epochs", "2", "--workers", "2")
    for args in (
        ("synth", *synth, "--batch-size", "32", "--seed", "5", "--skew", "0.5", "--out", "."),
        ("parse", RUN, "--out", "traces"),
    ):
        proc = run_dsim_in_process(*args, "-q", cwd=work)  # inputs: in-process (conftest)
        assert proc.returncode == 0, proc.stderr
    return work


@pytest.fixture(scope="module")
def run_json(work: Path) -> subprocess.CompletedProcess:
    proc = run_dsim("run", RUN, "--json", cwd=work)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_run_json_is_one_object_on_stdout_valid_against_the_spec(run_json) -> None:
    doc = json.loads(run_json.stdout)  # nothing but the object on stdout
    validate(doc)
    assert len(doc["summary"]) == 9 and doc["checks"] == []
    [v] = doc["verdicts"]
    assert v["run"] == RUN and v["results"] == f"results/{RUN}"
    assert v["text"].endswith("(per-iteration replay model)")
    measured = next(
        r for r in doc["summary"] if (r["fetch_align"], r["start_align"]) == ("actual",) * 2
    )
    assert measured["speedup"] == 1.0 and measured["gpus"] == 3
    assert " reused, in " in run_json.stderr  # the rest goes to stderr


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_jq_reads_the_json(run_json) -> None:
    out = subprocess.run(
        ["jq", "-r", ".verdicts[0].run, (.summary | length)"],
        input=run_json.stdout,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == [RUN, "9"]


def test_summarize_json_writes_null_for_undefined_numbers(work: Path, run_json) -> None:
    # warm-up 38 leaves one iteration per epoch: every standard deviation is NaN
    proc = run_dsim("summarize", "results", "--json", "--warmup", "38", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "NaN" not in proc.stdout and "Infinity" not in proc.stdout
    doc = json.loads(proc.stdout)
    validate(doc)
    assert all(r["iteration_s_std"] is None for r in doc["summary"])
    assert all(r["iterations"] == 1 and r["warmup"] == 38 for r in doc["summary"])


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_out_dash_writes_the_file_bytes_to_stdout(work: Path, run_json, fmt: str) -> None:
    to_file = run_dsim("summarize", "results", "--out", f"sum-{fmt}", "--format", fmt, cwd=work)
    assert to_file.returncode == 0, to_file.stderr
    proc = subprocess.run(
        [*_dsim_argv(), "summarize", "results", "--out", "-", "--format", fmt],
        cwd=work,
        capture_output=True,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (work / f"sum-{fmt}" / f"summary.{fmt}").read_bytes()
    assert not (work / "-").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--format", "json"), "--format chooses the files --out writes"),
        (("--out", "-", "--format", "csv,json"), "--out - writes one file to stdout"),
        (("--out", "-", "--format", "csv", "--json"), "--out - writes one file to stdout"),
        (("--fail-if", "speedup>>1"), "expected METRIC[@FETCH/START] OP NUMBER"),
        (("--fail-if", "speed>1"), "unknown metric 'speed'"),
        (("-p", "min/min", "--fail-if", "speedup@avg/avg>1"), "has no avg/avg row"),
    ],
)
def test_usage_errors(work: Path, run_json, args: tuple, message: str) -> None:
    proc = run_dsim_in_process("summarize", "results", *args, cwd=work)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1


def test_fail_if_exits_5_naming_run_and_condition(work: Path, run_json) -> None:
    doc = json.loads(run_json.stdout)
    measured = next(r for r in doc["summary"] if r["fetch_align"] == r["start_align"] == "actual")
    best = next(r for r in doc["summary"] if r["fetch_align"] == r["start_align"] == "min")
    eff = measured["effective_delay_pct"]
    passing = run_dsim(
        "summarize", "results", "-q", "--fail-if", f"effective_delay_pct>{eff + 1}", cwd=work
    )
    assert passing.returncode == 0, passing.stderr
    proc = run_dsim(
        "summarize",
        "results",
        "--json",
        "--fail-if",
        f"effective_delay_pct > {eff - 1}",
        "--fail-if",
        f"speedup@min/min<{best['speedup'] + 1}",
        "--fail-if",
        "iterations<1",
        cwd=work,
    )
    assert proc.returncode == 5
    assert proc.stderr.strip() == (
        f"dsim: error: --fail-if: 2 conditions hold: {RUN}: effective_delay_pct > {eff - 1} "
        f"(measured: {eff:g}); {RUN}: speedup@min/min<{best['speedup'] + 1} "
        f"(min/min: {best['speedup']:g})"
    )
    checks = json.loads(proc.stdout)["checks"]  # the JSON is still printed, with the checks
    validate(json.loads(proc.stdout))
    assert [c["held"] for c in checks] == [True, True, False]
    assert checks[1]["value"] == best["speedup"]


def test_run_fail_if_gates_the_measured_run(work: Path, run_json) -> None:
    proc = run_dsim("run", RUN, "-q", "--fail-if", "iteration_s_mean>0", cwd=work)
    assert proc.returncode == 5
    assert f"{RUN}: iteration_s_mean>0 (measured: " in proc.stderr


def _dsim_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "dsim"]


def _env() -> dict:
    import os

    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("DSIM_DEBUG", None)
    return env


def test_report_out_dash_writes_the_html_to_stdout(work: Path, run_json) -> None:
    to_file = run_dsim("report", "results", "--out", "r.html", "-q", cwd=work)
    assert to_file.returncode == 0, to_file.stderr
    proc = run_dsim("report", "results", "--out", "-", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (work / "r.html").read_text(encoding="utf-8")
    assert not (work / "-").exists()
    refused = run_dsim("report", "results", "--out", "-", "--images", "png", cwd=work)
    assert refused.returncode == 2 and "--images writes files" in refused.stderr


def test_parse_json_is_one_object_per_parse_valid_against_the_spec(work: Path) -> None:
    proc = run_dsim("parse", RUN, "--out", "traces-json", "--json", cwd=work)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # nothing but the object on stdout
    validate(doc, "dsim parse --json")
    [run] = doc["runs"]
    assert doc["errors"] == [] and run["run"] == RUN and run["gpus"] == 3
    assert run["directory"] == f"traces-json/{RUN}" and run["format"] == "rawlog"
    assert f"traces-json/{RUN}/fetch.parquet" in run["files"]
    assert all((work / f).is_file() for f in run["files"])
    info = json.loads((work / "traces-json" / RUN / "run.json").read_text())
    assert run["fetch_records"] == info["report"]["fetch_records"] > 0
    assert run["read"] == info["report"]["lines"]


def test_parse_json_lists_the_runs_that_failed(work: Path) -> None:
    bad = work / "bad" / "rank0.log"
    bad.parent.mkdir(exist_ok=True)
    bad.write_text("not a dsim log line\n")
    proc = run_dsim("parse", RUN, "bad", "--out", "traces-mixed", "--json", "-j", "1", cwd=work)
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc, "dsim parse --json")
    assert [r["run"] for r in doc["runs"]] == [RUN]
    [error] = doc["errors"]
    assert "bad" in error


def test_compare_json_valid_against_the_spec_and_format_json_is_the_same(
    work: Path, run_json
) -> None:
    side = f"results/{RUN}"
    proc = run_dsim("compare", side, side, "--json", "-p", "min/min", cwd=work)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc, "dsim compare --json")
    assert doc["before_run"] == doc["after_run"] == RUN and doc["policy"] == "min/min"
    assert doc["iteration_s_change"] == 0 and doc["realised_gain_s"] == 0
    alias = run_dsim("compare", side, side, "--format", "json", "-p", "min/min", cwd=work)
    assert alias.returncode == 0 and alias.stdout == proc.stdout
    refused = run_dsim("compare", side, side, "--json", "--format", "csv", cwd=work)
    assert refused.returncode == 2 and "--json prints JSON" in refused.stderr
