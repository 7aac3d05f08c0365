"""dsim.sources.kineto: real Kineto traces (shipped, and made here with torch) and malformed ones.

The shipped traces come with the ``dsim.instrument`` logs of the same run, so
the table built from the trace is checked against what the training loop
itself logged, step by step.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_dsim

from dsim.errors import InputError
from dsim.model.tables import TRAIN_SCHEMA
from dsim.sources.kineto import (
    LOADER_CROSSES,
    NO_DUR,
    NO_LOADER,
    OUT_OF_TIME,
    OVERLAPPING_LOADER,
    OVERLAPPING_STEP,
    REPEATED_STEP,
    STEP_TOO_LARGE,
    find_traces,
    read_profiled_run,
    read_trace,
)
from dsim.sources.rawlog.bounds import over_max
from dsim.sources.rawlog.discover import discover_runs
from dsim.sources.rawlog.parse import parse_run

RUN = "cpuDDP_synthetic_none_mlp_epoch1_b128_worker2_thread0"
SHIPPED = REPO / "traces" / "profiler" / RUN
LOGS = REPO / "traces" / "profiler" / "raw" / RUN
LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
BASE_NS = 1_790_000_000_000_000_000


def test_shipped_traces_give_the_train_table_the_loop_logged():
    run = read_profiled_run([SHIPPED])
    assert run.train.schema == TRAIN_SCHEMA
    assert run.rejects.num_rows == 0 and run.report["rejected"] == 0
    assert run.report["rank_from"] == {str(r): "distributedInfo" for r in range(4)}
    assert run.report["incomplete_iterations"]["count"] == 0
    t = run.train.to_pandas()
    assert sorted(t["gpu"].unique()) == [0, 1, 2, 3]
    assert sorted(t["iteration"].unique()) == list(range(5, 35))
    assert (t["epoch"] == 0).all() and t["throughput"].isna().all()
    assert (t["stall_s"] <= t["iteration_s"]).all()

    logged = parse_run(discover_runs([LOGS])[0]).tables.train.to_pandas()
    both = t.merge(logged, on=["epoch", "iteration", "gpu"], suffixes=("", "_log"))
    assert len(both) == len(t) == 120
    # One wait, two clocks: the trace's __next__ span and the timer around it.
    assert np.abs(both["stall_s"] - both["stall_s_log"]).max() < 0.002
    # The last profiled step's prof.step() stops the profiler and writes the trace: the loop's
    # timer counts that in the iteration, the trace's ProfilerStep span ends before it.
    inner = both[both["iteration"] < 34]
    assert np.abs(inner["iteration_s"] - inner["iteration_s_log"]).max() < 0.005
    assert (both["iteration_s_log"] - both["iteration_s"]).min() > -0.005
    # start = when the batch arrived (the end of the DataLoader span), on the same clock.
    gap = (both["start"] - both["start_log"]).dt.total_seconds().abs()
    assert gap.max() < 0.005


def _event(name: str, ts: float, dur: float | None, ph: str = "X") -> dict:
    event = {"ph": ph, "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts}
    if dur is not None:
        event["dur"] = dur
    return event


def _step(n: int, ts: float, dur: float = 10_000, wait: float | None = 2_000) -> list[dict]:
    """A step of ``dur`` µs whose DataLoader span (``wait`` µs) starts 50 µs in, plus an op."""
    events = [_event(f"ProfilerStep#{n}", ts, dur)]
    if wait is not None:
        events.append(_event(LOADER, ts + 50, wait))
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": ts + 3000, "dur": 10})
    return events


def _write(path: Path, events: list[dict], rank: int | None = 0, **extra) -> Path:
    doc: dict = {"schemaVersion": 1, "baseTimeNanoseconds": BASE_NS, **extra}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": 2}
    doc["traceEvents"] = events
    data = json.dumps(doc, indent=1).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def _steps(first: int, last: int, t0: float = 1e9) -> list[dict]:
    return [e for n in range(first, last + 1) for e in _step(n, t0 + n * 20_000)]


def test_values_of_a_clean_pair_of_ranks(tmp_path):
    _write(tmp_path / "a.pt.trace.json", _steps(3, 6), rank=0)
    _write(tmp_path / "b.pt.trace.json.gz", _steps(3, 6), rank=1)
    run = read_profiled_run([tmp_path])
    t = run.train.to_pandas()
    assert list(zip(t["iteration"], t["gpu"], strict=True)) == [
        (i, g) for i in range(3, 7) for g in (0, 1)
    ]
    assert np.allclose(t["iteration_s"], 0.01) and np.allclose(t["stall_s"], 0.002)
    first = t.iloc[0]["start"].value  # the end of step 3's DataLoader span, in ns since 1970
    assert first == BASE_NS + round((1e9 + 3 * 20_000 + 50 + 2_000) * 1000)
    assert run.report["events"] == 2 * 12 and run.report["fetch_records"] == 0


def test_bad_spans_are_rejected_and_counted_exactly(tmp_path):
    events = _steps(1, 10)
    events += _step(11, 1e9 + 11 * 20_000, wait=None)  # no DataLoader span
    events += [_event("ProfilerStep#12", 1e9 + 12 * 20_000, None)]  # no dur
    events += [_event(LOADER, 1e9 + 12 * 20_000 + 50, 100)]  # outside any kept step
    events += _step(13, 1e9 + 13 * 20_000) + _step(13, 1e9 + 14 * 20_000)  # a repeat
    events += _step(15, 1e9 + 15 * 20_000, dur=30_000)  # runs into step 16: both go
    events += _step(16, 1e9 + 16 * 20_000)
    events += _step(17, 1e9 + 17 * 20_000, wait=12_000)  # DataLoader span ends after the step
    events += [*_step(18, 1e9 + 18 * 20_000), _event(LOADER, 1e9 + 18 * 20_000 + 100, 500)]
    events += [*_step(19, 1e9 + 19 * 20_000), _event(LOADER, 1e9 + 19 * 20_000 + 5_000, 500)]
    path = _write(tmp_path / "rank0.pt.trace.json", events)
    _write(tmp_path / "rank1.pt.trace.json", _steps(1, 19), rank=1)
    run = read_profiled_run([tmp_path])
    assert run.report["skipped"] == {
        NO_LOADER: 1,
        NO_DUR: 1,
        REPEATED_STEP: 2,
        OVERLAPPING_STEP: 2,
        LOADER_CROSSES: 1,
        OVERLAPPING_LOADER: 1,
    }
    rows = [r for r in run.rejects.to_pylist() if r["file"] == str(path)]
    names = {r["reason"]: r["name"] for r in rows}
    assert names[NO_LOADER] == "ProfilerStep#11" and names[LOADER_CROSSES] == "ProfilerStep#17"
    assert all(events[r["event"]]["name"] == r["name"] for r in rows)  # event = index in the file
    t = run.train.to_pandas()
    kept = sorted(t[t["gpu"] == 0]["iteration"])
    assert kept == [*range(1, 11), 19]
    assert t[(t["gpu"] == 0) & (t["iteration"] == 19)]["stall_s"].item() == pytest.approx(0.0025)
    assert run.report["steps_with_several_dataloader_spans"] == 1
    assert run.report["incomplete_iterations"]["count"] == 19 - 11


@pytest.mark.parametrize("number", ["2147483648", "9" * 20, "1" + "0" * 5000])
def test_a_step_number_past_the_int32_iteration_is_rejected(tmp_path, number):
    """``ProfilerStep#99999999999999999999999`` was an internal error (OverflowError into
    int64), and 2^31 .. 2^63 wrapped silently in the int32 iteration column."""
    events = [*_steps(1, 4), _event(f"ProfilerStep#{number}", 1e9 + 9 * 20_000, 10_000)]
    path = _write(tmp_path / "rank0.pt.trace.json", events)
    _write(tmp_path / "rank1.pt.trace.json", _steps(1, 4), rank=1)
    run = read_profiled_run([tmp_path])
    assert run.report["skipped"] == {STEP_TOO_LARGE: 1}
    (row,) = [r for r in run.rejects.to_pylist() if r["file"] == str(path)]
    assert row["reason"] == STEP_TOO_LARGE
    assert sorted(run.train.to_pandas()["iteration"].unique()) == [1, 2, 3, 4]
    zeros = _steps(1, 5)
    zeros[-3]["name"] = "ProfilerStep#" + "0" * 30 + "5"  # step 5: the number, padded
    _write(tmp_path / "rank0.pt.trace.json", zeros)
    _write(tmp_path / "rank1.pt.trace.json", _steps(1, 5), rank=1)
    assert 5 in set(read_profiled_run([tmp_path]).train.to_pandas()["iteration"])


def test_ranks_with_different_step_ranges_are_reported(tmp_path):
    _write(tmp_path / "rank0.pt.trace.json", _steps(5, 20), rank=0)
    _write(tmp_path / "rank1.pt.trace.json", _steps(7, 22), rank=1)
    run = read_profiled_run([tmp_path])
    assert run.report["incomplete_iterations"]["count"] == 4
    assert any("rank 0: 5-20, rank 1: 7-22" in w for w in run.report["warnings"])


def test_rank_from_the_file_name_or_an_error_naming_the_file(tmp_path):
    good = _write(tmp_path / "rank3.123.pt.trace.json", _steps(1, 3), rank=None)
    trace = read_trace(good)
    assert (trace.rank, trace.rank_from) == (3, "file name")
    run = read_profiled_run([good])
    assert "no distributedInfo; rank 3 from the file name" in run.report["warnings"][0]
    (tmp_path / "more").mkdir()
    named = _write(tmp_path / "more" / "rank3.pt.trace.json", _steps(1, 3), rank="zero")
    (warning,) = [w for w in read_profiled_run([named]).report["warnings"] if "rank 3" in w]
    # it said "no distributedInfo", though the block is there
    assert "distributedInfo.rank 'zero' is not an integer; rank 3 from the file name" in warning
    bad = _write(tmp_path / "host_123.pt.trace.json", _steps(1, 3), rank=None)
    with pytest.raises(InputError, match="no rank") as err:
        read_trace(bad)
    assert str(bad) in str(err.value)
    twin = _write(tmp_path / "x.pt.trace.json", _steps(1, 3), rank=3)
    with pytest.raises(InputError, match="rank 3 also comes from"):
        read_profiled_run([good, twin])


def test_truncated_json_and_missing_trace_events_are_errors(tmp_path):
    whole = json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": _steps(1, 50)})
    cut = tmp_path / "rank0.pt.trace.json"
    cut.write_text(whole[: len(whole) * 2 // 3])
    with pytest.raises(InputError, match="truncated or invalid JSON") as err:
        read_trace(cut)
    assert str(err.value).startswith(f"{cut}: ")
    data = next(SHIPPED.glob("rank1.*")).read_bytes()
    gz = tmp_path / "rank1.pt.trace.json.gz"
    gz.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="gzip data ends early") as err:
        read_trace(gz)
    assert str(gz) in str(err.value)
    none = tmp_path / "rank2.pt.trace.json"
    none.write_text(json.dumps({"distributedInfo": {"rank": 2}, "events": []}))
    with pytest.raises(InputError, match="no traceEvents"):
        read_trace(none)


def _no_steps(first: int, last: int) -> list[dict]:
    """DataLoader spans and ops as ``_steps`` writes them, without the ProfilerStep spans."""
    return [e for e in _steps(first, last) if not e["name"].startswith("ProfilerStep")]


@pytest.mark.parametrize("ranks_without_steps", [(0, 1), (1,)])
def test_a_trace_without_profiler_steps_is_an_input_error_naming_it(tmp_path, ranks_without_steps):
    """Issue #20: no ProfilerStep in one rank's file (or all) was an internal IndexError."""
    run = tmp_path / "run"
    run.mkdir()
    for rank in (0, 1):
        events = _no_steps(1, 4) if rank in ranks_without_steps else _steps(1, 4)
        _write(run / f"rank{rank}.pt.trace.json", events, rank=rank)
    proc = run_dsim("parse", run, "--out", tmp_path / "traces", "-q")
    assert proc.returncode == 3, proc.stderr
    first = run / f"rank{ranks_without_steps[0]}.pt.trace.json"
    assert proc.stderr.startswith(f"dsim: error: {first}: no ProfilerStep#N spans"), proc.stderr
    assert "internal error" not in proc.stderr and not (tmp_path / "traces" / "run").exists()


def test_a_rank_whose_steps_are_all_rejected_keeps_the_others(tmp_path):
    """Steps present but none kept (every one without dur): rejects, not an IndexError."""
    steps = _steps(1, 4)
    bad = [{**e, "dur": None} if e["name"].startswith("ProfilerStep") else e for e in steps]
    _write(tmp_path / "rank0.pt.trace.json", bad, rank=0)
    _write(tmp_path / "rank1.pt.trace.json", _steps(1, 4), rank=1)
    run = read_profiled_run([tmp_path])
    assert run.report["skipped"] == {NO_DUR: 4}
    assert sorted(run.train.to_pandas()["gpu"].unique()) == [1]


def test_find_traces_by_name_or_content(tmp_path):
    _write(tmp_path / "rank0.1.pt.trace.json.gz", _steps(1, 2))
    _write(tmp_path / "events.json", _steps(1, 2), rank=1)
    (tmp_path / "run.json").write_text(json.dumps({"name": "x", "gpus": 2}))
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "notes.txt").write_text("x")
    assert [p.name for p in find_traces(tmp_path)] == ["events.json", "rank0.1.pt.trace.json.gz"]


@pytest.mark.torch
def test_a_profiled_ddp_job_makes_traces_dsim_reads(tmp_path):
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "ddp_cpu.py"),
            *("--ranks", "2", "--epochs", "1", "--iterations", "12", "--batch-size", "8"),
            *("--workers", "1", "--out", str(tmp_path / "logs"), "--profile", str(tmp_path / "p")),
            *("--profile-skip", "2", "--profile-steps", "6"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    traces = find_traces(tmp_path / "p")
    assert len(traces) == 2 and all(p.name.endswith(".pt.trace.json.gz") for p in traces)
    run = read_profiled_run([tmp_path / "p"])
    assert run.rejects.num_rows == 0
    assert sorted(run.train["iteration"].to_pylist()) == sorted(list(range(3, 9)) * 2)


def test_steps_too_long_or_at_no_time_the_tables_hold_are_rejected(tmp_path):
    """A ``ts`` of 1e20 µs wrapped to 1734 in the int64 start column, and a ``dur`` of
    1e15 µs (31 years) passed any ``--max-duration``: both parsed with exit 0."""
    events = _steps(1, 4)
    events += _step(5, 1e20)  # a time past 2262
    events += _step(6, 1e9 + 6 * 20_000, dur=2e6, wait=1_000)  # 2 s: above a 1 s bound
    path = _write(tmp_path / "rank0.pt.trace.json", events)
    _write(tmp_path / "rank1.pt.trace.json", _steps(1, 6), rank=1)
    run = read_profiled_run([tmp_path], max_duration=1.0)
    too_long = over_max("profiler step dur", 1.0)
    assert run.report["skipped"] == {OUT_OF_TIME: 1, too_long: 1}
    rows = {r["reason"]: r["name"] for r in run.rejects.to_pylist() if r["file"] == str(path)}
    assert rows == {OUT_OF_TIME: "ProfilerStep#5", too_long: "ProfilerStep#6"}
    assert read_profiled_run([tmp_path]).report["skipped"] == {OUT_OF_TIME: 1}  # one day
    # every step rejected: no run (exit 3), as a raw log with no record left
    _write(tmp_path / "rank0.pt.trace.json", _step(1, 1e20))
    _write(tmp_path / "rank1.pt.trace.json", _step(1, 1e20), rank=1)
    proc = run_dsim("parse", tmp_path, "--out", tmp_path / "out")
    assert proc.returncode == 3
    assert "no profiler step left to replay, every one rejected" in proc.stderr
    assert "RuntimeWarning" not in proc.stderr and not (tmp_path / "out").exists()
