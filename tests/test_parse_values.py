"""Values that cannot be true are rejected with a reason, never stored (rawlog.bounds)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import run_dsim, run_dsim_in_process
from loglines import T0, fetch_line, one_epoch, run_of, train_line

from dsim.commands import parse as parse_cmd
from dsim.sources.rawlog import grammar
from dsim.sources.rawlog.bounds import MAX_DURATION_S
from dsim.sources.rawlog.parse import STRAY_RANK_SHARE, parse_run

OVER_FETCH = "fetch duration above the maximum duration (86400 s, --max-duration)"
OVER_TIME = "iteration time above the maximum duration (86400 s, --max-duration)"
OVER_STALL = "training stall above the maximum duration (86400 s, --max-duration)"


def _skipped(tmp_path, extra: list[str], **kwargs) -> dict[str, int]:
    parsed = parse_run(run_of(tmp_path, {"output.log": one_epoch() + extra}), **kwargs)
    for table in (parsed.tables.fetch, parsed.tables.train):
        for name in ("fetch_s", "iteration_s", "stall_s", "throughput"):
            if name in table.column_names:
                values = [v for v in table[name].to_pylist() if v is not None]
                assert all(math.isfinite(v) for v in values), (name, values)
    return parsed.report["skipped"]


@pytest.mark.parametrize(
    "line",
    [
        fetch_line("20.0", 0, 0, "1e999", 3),
        fetch_line("20.0", 0, 0, "1e400", 3),
        train_line("20.0", 0, 0, 3, n=20, time="1e999"),
        train_line("20.0", 0, 0, 4, n=20, time="2", data="1e400"),
        train_line("20.0", 0, 0, 5, n=20, tp="1e999"),
        # as Python prints them (they were "non-numeric", which SPEC §1.3 does not say)
        fetch_line("20.0", 0, 0, "nan", 3),
        fetch_line("20.0", 0, 0, "inf", 3),
        fetch_line("20.0", 0, 0, "-Infinity", 3),
        train_line("20.0", 0, 0, 3, n=20, time="inf"),
        train_line("20.0", 0, 0, 4, n=20, time="2", data="NaN"),
    ],
)
def test_non_finite_values_are_rejected(tmp_path, line):
    assert _skipped(tmp_path, [line]) == {grammar.NON_FINITE: 1}


def test_durations_above_the_bound_are_rejected_naming_the_field(tmp_path):
    extra = [
        fetch_line("20.0", 0, 0, "86400.5", 3),
        train_line("20.0", 0, 0, 6, n=20, time="1e300", data="0.1"),
        train_line("20.1", 1, 0, 7, n=20, time="100000", data="90000"),
        train_line("20.2", 0, 0, 99, n=100, time="86400", data="86400.0005"),  # within the slack
    ]
    assert _skipped(tmp_path, extra) == {OVER_FETCH: 1, OVER_TIME: 2, OVER_STALL: 1}


def test_max_duration_is_a_parameter(tmp_path):
    extra = [fetch_line("20.0", 0, 0, "30.5", 3), train_line("20.0", 0, 0, 8, n=20, time="40")]
    assert _skipped(tmp_path, extra) == {}
    reason = "{} above the maximum duration (10 s, --max-duration)"
    assert _skipped(tmp_path, extra, max_duration=10) == {
        reason.format("fetch duration"): 1,
        reason.format("iteration time"): 1,
    }


def test_stall_longer_than_the_iteration_is_rejected(tmp_path):
    extra = [
        train_line("20.0", 0, 0, 9, n=20, time="1.0", data="1.0009"),  # rounding: kept
        train_line("20.1", 1, 0, 10, n=20, time="1.0", data="1.5"),
    ]
    assert _skipped(tmp_path, extra) == {grammar.STALL_OVER_TIME: 1}


@pytest.mark.parametrize(
    "tail",
    [
        "\tThroughput 52.3",  # cut inside the optional Throughput field
        "\tThroughput 52.3 (52",
        "\tThroughput",
        "\tLoss 6.9 (6.",  # cut inside a trailing field of the ImageNet example
        "\tLoss",
        " garbage",
    ],
)
def test_a_training_line_cut_inside_a_field_is_rejected(tmp_path, tail):
    line = train_line("20.0", 0, 0, 11, n=20, tp=None) + tail
    assert _skipped(tmp_path, [line]) == {grammar.MALFORMED_TRAIN: 1}


def test_whole_trailing_fields_of_the_imagenet_example_are_accepted(tmp_path):
    base = train_line("20.0", 0, 0, 12, n=20, tp=None)
    lines = [
        base + "\tLoss 6.9e+00 (6.9e+00)\tAcc@1   0.00 (  0.10)\tAcc@5   0.39 (  0.39)",
        train_line("20.1", 1, 0, 13, n=20, tp="52.3") + "\tLoss 6.9 (6.9)  ",
    ]
    parsed = parse_run(run_of(tmp_path, {"output.log": one_epoch() + lines}))
    assert parsed.report["rejected"] == 0
    rows = parsed.tables.train.filter(parsed.tables.train["iteration"].to_numpy() >= 3)
    assert sorted(rows["throughput"].to_pylist(), key=str) == [52.3, None]


@pytest.mark.parametrize("year", ["1969", "2262", "9021"])
def test_timestamps_outside_nanosecond_range_are_invalid(tmp_path, year):
    """A corrupt year would wrap around in int64 nanoseconds: it is an invalid timestamp."""
    lines = [
        f"{year}-09-01 19:48:20.0 DEBUG:\tGPU: 0 worker_id: 0, END FETCH at_time 0.5 data idx3",
        f"{year}-09-01 19:48:20.5 GPU: 0 Epoch: [0][  2/9]\tTime 0.9 (0.9)\tData 0.1 (0.1)",
    ]
    assert _skipped(tmp_path, lines) == {grammar.BAD_TIMESTAMP: 2}


def test_the_command_line_defaults_are_the_library_defaults():
    assert parse_cmd.MAX_DURATION_S == MAX_DURATION_S == grammar.MAX_DURATION_S
    assert parse_cmd.STRAY_RANK_SHARE == STRAY_RANK_SHARE


def test_max_duration_option_end_to_end(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("\n".join([*one_epoch(), fetch_line("20.0", 0, 0, "30.5", 3)]) + "\n")
    result = run_dsim("parse", str(log), "--max-duration", "10", "--out", "t", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "fetch duration above the maximum duration (10 s, --max-duration)" in result.stdout
    info = json.loads((tmp_path / "t" / "run" / "run.json").read_text())
    assert info["report"]["rejected"] == 1
    for bad in ("0", "-1", "nan", "inf"):
        # usage errors: one message each, in-process (conftest's run_dsim_in_process)
        result = run_dsim_in_process(
            "parse", str(log), "--max-duration", bad, "--out", "t", cwd=tmp_path
        )
        assert result.returncode == 2 and "--max-duration" in result.stderr, (bad, result.stderr)
    result = run_dsim_in_process(
        "parse", str(log), "--stray-rank-share", "2", "--out", "t", cwd=tmp_path
    )
    assert result.returncode == 2 and "--stray-rank-share" in result.stderr


def test_no_value_is_written_that_json_cannot_hold(tmp_path):
    log = tmp_path / "run.log"
    lines = [*one_epoch(), fetch_line("20.0", 0, 0, "1e999", 3), train_line("21.0", 0, 0, 2)]
    log.write_text("\n".join(lines) + "\n")
    assert run_dsim("parse", str(log), "--out", "t", cwd=tmp_path).returncode == 0
    text = (tmp_path / "t" / "run" / "run.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-finite {c} in run.json"))


def test_truncated_last_line_keeps_its_reason(tmp_path):
    lines = [*one_epoch(), f"{T0}20.0 GPU: 0 Epoch: [0][  2/3]\tTime 0.9 (0.9)\tData 0.1 (0"]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}, final_newline=False))
    assert parsed.report["skipped"] == {grammar.TRUNCATED: 1}
