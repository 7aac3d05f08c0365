"""Clocks: an out-of-order timestamp blames itself, not its neighbours; a step back is reported."""

from __future__ import annotations

import json

import pytest
from conftest import run_dsim
from loglines import timed_lines

from dsim.clock import K, scan
from dsim.discover import RunSource
from dsim.errors import InputError
from dsim.parse import CLOCK_OUTLIER, parse_run

HOUR = 3600.0


def _write(tmp_path, lines, name="output.log"):
    path = tmp_path / name
    path.write_text("\n".join(text for _, text in lines) + "\n")
    return path


def _parse(tmp_path, lines, **kwargs):
    return parse_run(RunSource("run", (_write(tmp_path, lines),)), **kwargs)


def _keys(parsed) -> set[tuple]:
    """(kind, epoch, iteration, gpu) of every record kept."""
    fetch, train = parsed.tables.fetch, parsed.tables.train
    cols = ("epoch", "iteration", "gpu")
    return {("fetch", *k) for k in zip(*(fetch[c].to_pylist() for c in cols), strict=True)} | {
        ("train", *k) for k in zip(*(train[c].to_pylist() for c in cols), strict=True)
    }


def _line_of(lines, key) -> int:
    return next(n for n, (k, _) in enumerate(lines, 1) if k == key)


# -- the rule on plain sequences -------------------------------------------------------------


@pytest.mark.parametrize(
    ("times", "rejected"),
    [
        ([10, 20, 3600, 30, 40, 50], [2]),  # one jump forward: itself, not what follows
        ([10, 20, -3600, 30, 40], [2]),  # one dip
        ([10, 20, 30, 3600, 3601, 3602, 40, 50, 60, 70], [3, 4, 5]),  # K jumps in a row
        ([10, 20, 30, 1, 2, 3, 40, 50], [3, 4, 5]),  # K dips in a row
        ([3600, 10, 20, 30, 40, 50], [0]),  # the first record
        ([10, 20, 30, 40, 5], [4]),  # the last record
        ([10, 35, 30, 40], [2]),  # one pair out of order: the later one (a tie goes to L)
    ],
)
def test_outliers(times, rejected):
    assert scan(times) == (rejected, [])


def test_more_than_k_in_a_row_is_a_step_and_nothing_is_rejected():
    times = [10, 20, 30, *range(3600, 3600 + K + 1), 40, 50, 60, 70, 80]
    assert scan(times) == ([], [(3 + K + 1, 3600 + K - 40)])
    step_back = [10, 20, 30, 40, 1, 2, 3, 4, 5, 6]
    assert scan(step_back) == ([], [(4, 39)])


# -- in a parse ------------------------------------------------------------------------------


@pytest.mark.parametrize("hours", [1, -1])
def test_one_bad_fetch_and_training_timestamp_reject_only_themselves(tmp_path, hours):
    bad = [("fetch", 0, 10, 0), ("train", 1, 5, 1)]
    good = timed_lines()
    lines = timed_lines(shift={k: hours * HOUR for k in bad})
    parsed = _parse(tmp_path, lines)
    assert parsed.report["skipped"] == {CLOCK_OUTLIER: 2}
    assert parsed.rejects["line"].to_pylist() == sorted(_line_of(lines, k) for k in bad)
    assert parsed.report["incomplete_iterations"]["count"] == 2
    assert parsed.report["clock_steps"] == []
    assert _keys(parsed) == _keys(_parse(tmp_path, good)) - set(bad)


def test_three_consecutive_outliers_of_one_group_are_rejected(tmp_path):
    bad = [("train", 0, i, 0) for i in (10, 11, 12)]  # one rank's training lines
    bad += [("fetch", 1, i, 1) for i in (3, 6, 9)]  # one worker's fetch lines (i % 3 == 0)
    lines = timed_lines(shift={k: HOUR for k in bad})
    parsed = _parse(tmp_path, lines)
    assert parsed.report["skipped"] == {CLOCK_OUTLIER: 6}
    assert sorted(parsed.rejects["line"].to_pylist()) == sorted(_line_of(lines, k) for k in bad)
    assert _keys(parsed) == _keys(_parse(tmp_path, timed_lines())) - set(bad)


def test_a_clock_step_back_keeps_every_line_and_is_reported_once(tmp_path):
    """The host's clock goes back an hour at the start of epoch 1 (NTP): all lines after it."""
    lines = timed_lines(shift={(kind, 1, i, g): -HOUR for kind in ("fetch", "train")
                          for i in range(30) for g in range(2)})  # fmt: skip
    parsed = _parse(tmp_path, lines)
    assert parsed.report["rejected"] == 0
    assert _keys(parsed) == _keys(_parse(tmp_path, timed_lines()))
    [step] = parsed.report["clock_steps"]
    assert step["line"] == _line_of(lines, ("fetch", 1, 0, 0))
    assert step["file"].endswith("output.log")
    assert HOUR - 2 < step["seconds"] < HOUR
    assert [w for w in parsed.report["warnings"] if "clock stepped back" in w] == [
        f"clock stepped back by {step['seconds']:.3f} s at output.log:{step['line']}; "
        "records kept, iterations around it may be off"
    ]
    with pytest.raises(InputError) as err:
        _parse(tmp_path, lines, strict=True)
    assert err.value.line == step["line"] and "clock stepped back by" in str(err.value)


def test_a_step_back_in_one_file_of_a_per_rank_run(tmp_path):
    shift = {(kind, 1, i, 1): -HOUR for kind in ("fetch", "train") for i in range(30)}
    lines = timed_lines(shift=shift)
    files = []
    for g in (0, 1):
        files.append(_write(tmp_path, [x for x in lines if x[0][3] == g], f"rank{g}.log"))
    parsed = parse_run(RunSource("run", tuple(files)))
    assert parsed.report["rejected"] == 0
    assert parsed.report["incomplete_iterations"]["count"] == 0
    [step] = parsed.report["clock_steps"]
    assert step["file"] == str(files[1])
    mine = [x for x in lines if x[0][3] == 1]
    assert step["line"] == _line_of(mine, ("fetch", 1, 0, 1))


def test_the_cli_prints_steps_and_strict_stops_at_them(tmp_path):
    lines = timed_lines(shift={(kind, 1, i, g): -HOUR for kind in ("fetch", "train")
                          for i in range(30) for g in range(2)})  # fmt: skip
    log = _write(tmp_path, lines)
    result = run_dsim("parse", str(log), "--name", "run", "--out", "t", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "2 GPUs, epochs 0,1, 30 iterations per epoch" in result.stdout
    info = json.loads((tmp_path / "t" / "run" / "run.json").read_text())
    [step] = info["report"]["clock_steps"]
    line = _line_of(lines, ("fetch", 1, 0, 0))
    assert step["line"] == line
    said = f"clock stepped back by {step['seconds']:.3f} s"
    assert f"warning: {said} at output.log:{line}; records kept" in result.stdout
    result = run_dsim("parse", str(log), "--strict", "--out", "t2", cwd=tmp_path)
    assert result.returncode == 3
    assert f"{log}:{line}: {said}" in result.stderr
