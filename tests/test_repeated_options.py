"""An option that takes one value, given twice, is refused; tune's grids take every value.

Click keeps the last value silently: `dsim parse --name x --name y` named the run y,
`dsim tune --workers 1 --workers 2` swept only 2 (issue #19: never last-wins). Found by
an adversarial check of the CLI, with `dsim tune --warmup -1` (accepted, iteration 0
selected) and `dsim parse --jobs -1`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_dsim
from tracegen import write_synthetic

import dsim.cli


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["parse", "logs", "--name", "x", "--name", "y"], "--name"),
        (["parse", "logs", "--out=a", "-o", "b"], "--out"),
        (["summarize", "results", "--format", "csv", "--format=parquet"], "--format"),
        (["run", "-r", "x", "--executor", "local", "--executor", "ray"], "--executor"),
        (["tune", "x", "--warmup", "1", "--warmup", "2"], "--warmup"),
    ],
)
def test_an_option_of_one_value_given_twice_is_refused(args: list[str], option: str) -> None:
    proc = run_dsim(*args)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"dsim: error: {option} given 2 times"), line


def test_repeatable_options_and_values_that_look_like_options_are_not_counted() -> None:
    """-r/--policy/--fail-if repeat by design; a value after an option is not an option."""
    import typer

    command = typer.main.get_command(dsim.cli.app).commands["run"]
    ctx = command.make_context("run", ["-r", "x"], resilient_parsing=True)
    dsim.cli.refuse_repeated_options(command, ctx, ["-r", "a", "-r", "b", "-p", "min/min"])
    dsim.cli.refuse_repeated_options(command, ctx, ["--out", "--out", "--traces", "t"])
    dsim.cli.refuse_repeated_options(command, ctx, ["-r", "a", "--", "--out", "--out"])
    with pytest.raises(dsim.errors.UsageError, match="--out given 2 times"):
        dsim.cli.refuse_repeated_options(command, ctx, ["--out", "a", "--out=b"])


def test_tune_sweeps_every_value_of_a_repeated_grid_option(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    write_synthetic(traces, "r1", iterations=40)
    proc = run_dsim(
        "tune", "r1", "--traces", traces, "--out", tmp_path / "results", "--no-alignment",
        "--workers", "1", "--workers", "3", "--prefetch", "2", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    import json

    (doc,) = json.loads(proc.stdout)
    tried = {row["workers"] for row in doc["grid"]}
    assert tried == {1, 3}, tried
    proc = run_dsim("tune", "r1", "--traces", traces, "--warmup", "-1")
    assert proc.returncode == 2 and "--warmup" in proc.stderr
