"""Rough edges a careful user meets in the first minutes (issue #22, item 3).

Each test runs the real CLI, as a user would (the help texts through its entry
point in-process, ``run_dsim_in_process``: one message each), and failed before
its fix: help that hid the ``--fail-if`` syntax and showed ``<bool>`` after
flags, a report command without examples, a report written into directories it
silently created.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_dsim, run_dsim_in_process

WIDE = {"COLUMNS": "200"}


@pytest.mark.parametrize("command", ["run", "summarize"])
def test_help_shows_the_fail_if_syntax_and_flags_without_a_value(command: str) -> None:
    proc = run_dsim_in_process(command, "--help", env=WIDE)
    assert proc.returncode == 0, proc.stderr
    assert "METRIC[@FETCH/START] OP NUMBER" in proc.stdout
    assert "METRIC OP" not in proc.stdout
    assert "<bool>" not in proc.stdout
    assert "--quiet" in proc.stdout


def test_every_help_shows_flags_as_flags() -> None:
    for args in ([], ["parse"], ["report"], ["compare"], ["tune"], ["synth"], ["watch"]):
        proc = run_dsim_in_process(*args, "--help", env=WIDE)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "<bool>" not in proc.stdout, args


def test_report_help_has_examples() -> None:
    proc = run_dsim_in_process("report", "--help", env=WIDE)
    assert proc.returncode == 0, proc.stderr
    assert "Examples:" in proc.stdout
    assert "dsim report results/ --out report.html" in proc.stdout


def test_report_refuses_a_missing_directory(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    out = tmp_path / "no" / "such" / "r.html"
    proc = run_dsim("report", tmp_path / "results", "--out", out)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.count("\n") == 1
    assert f"directory {out.parent} does not exist" in proc.stderr
    assert not (tmp_path / "no").exists()


def test_parse_warns_when_almost_nothing_is_a_record(tmp_path: Path) -> None:
    """Parsing a text that is no training log (the README) says so, naming the file and the
    share of lines used; the exit stays 0, as for any log with lines dsim does not know."""
    readme = Path(__file__).parents[1] / "README.md"
    proc = run_dsim("parse", readme, "--out", tmp_path / "traces", "-q")
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "non-blank lines" in x]
    assert line.startswith(f"warning: {readme}: only ")
    assert " %) are dsim records" in line


def test_parse_of_a_real_log_does_not_warn(tmp_path: Path) -> None:
    sample = Path(__file__).parents[1] / "traces" / "raw"
    proc = run_dsim("parse", sample, "--out", tmp_path / "traces")
    assert proc.returncode == 0, proc.stderr
    assert "non-blank lines" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["tune", "x", "--warmup", "-1"], "Invalid value for '--warmup'"),
        (["run", "--bogus"], "No such option: --bogus"),
        (["parse"], "Missing argument"),
        (["bogus"], "No such command 'bogus'"),
    ],
)
def test_command_line_errors_are_one_line_like_every_error(args: list[str], words: str) -> None:
    """Click printed a three-line "Usage: ... / Try ... / Error: ..." block where every
    other error is one `dsim: error:` line (SPEC §9)."""
    proc = run_dsim(*args)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("dsim: error: ") and words in line and "--help" in line, line


def test_an_error_naming_a_path_with_a_line_break_stays_one_line(tmp_path: Path) -> None:
    """A path may hold a newline; printed raw, the error spanned two lines."""
    odd = tmp_path / "nl\ndir"
    odd.mkdir()
    proc = run_dsim("parse", odd, "--out", tmp_path / "traces")
    assert proc.returncode == 3
    (line,) = proc.stderr.splitlines()
    assert line.startswith("dsim: error: ") and "nl\\ndir: no log files" in line, line


def test_an_ascii_terminal_gets_replacements_not_an_internal_error(tmp_path: Path) -> None:
    """``LC_ALL=C`` / ``PYTHONIOENCODING=ascii``: the first × of the headline (or the … of
    ``--help``) was a UnicodeEncodeError, exit 1, after the results were written."""
    from tracegen import write_synthetic

    write_synthetic(tmp_path / "traces", "r1", iterations=30)
    ascii_env = {"PYTHONIOENCODING": "ascii"}
    proc = run_dsim("run", "r1", "--executor", "local", cwd=tmp_path, env=ascii_env)
    assert proc.returncode == 0, proc.stderr
    assert "\\xd7" in proc.stdout and "internal error" not in proc.stderr  # × as \xd7
    proc = run_dsim("run", "--help", cwd=tmp_path, env=ascii_env)
    assert proc.returncode == 0, proc.stderr


def test_parse_of_a_dash_points_to_dev_stdin(tmp_path: Path) -> None:
    """`dsim parse -` said "-: no such file or directory"; /dev/stdin reads a pipe."""
    proc = run_dsim_in_process("parse", "-", "--out", str(tmp_path / "t"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "to read standard input, give /dev/stdin" in proc.stderr
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("args", "said", "code"),
    [
        (["run", "--conf", "missing.json"], "config file not found", 2),
        (["run", "--fail-if", "bogus"], "--fail-if 'bogus'", 2),
        (["summarize", "results", "--format", "xml", "--out", "o"], "unknown output format", 2),
        (["summarize", "results", "--fail-if", "stall>"], "--fail-if 'stall>'", 2),
        (["summarize", "missing"], "dsim: error: missing: no such file or directory", 3),
        (["report", "missing"], "dsim: error: missing: no such file or directory", 3),
        (["watch", "missing", "--once"], "dsim: error: missing: no such file or directory", 3),
        (["tune", "missing"], "runs to tune: 1 problem: run(s) not found: missing", 2),
        (["compare", "missing", "results"], "dsim: error: missing: no such file or directory", 3),
        (["compare", "results/r1", "results"], "its results are in results/r1@stall-only", 3),
    ],
)
def test_a_usage_error_is_said_before_pandas_is_imported(
    args: list[str], said: str, code: int, tmp_path: Path
) -> None:
    """``dsim run --conf MISSING`` imported the answer object's pandas (0.3 s) before it read
    its arguments; a mistyped option, a missing config, a missing directory or run (a
    profiled run's model-variant results for ``compare``) is now said first, in the words
    the application used."""
    import os
    import subprocess
    import sys

    (tmp_path / "results" / "r1@stall-only").mkdir(parents=True)  # a profiled run's results
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dsim", *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr[-2000:]
    assert said in proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()}
    assert "dsim.cli" in imported and "pandas" not in imported
