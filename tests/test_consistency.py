"""Trace consistency with synchronous DDP (docs/SPEC.md §2.3): figures and warning."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from conftest import run_dsim

from dsim.model.consistency import (
    CLOCK_OFFSET_MAX_S,
    END_SPREAD_MAX_S,
    TOLERANCE_S,
    clock_offsets,
    rank_offsets,
    timeline_consistency,
)
from dsim.model.runinfo import RunInfo

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "traces" / "raw" / "cpuDDP_synthetic_none_mlp_epoch2_b128_worker2_thread0"


def _ddp_timelines(seed: int, ranks: int = 4, iterations: int = 60):
    """Per-record arrays of a synchronous job: each rank asks when its last iteration ended,
    waits its own stall, and the all-reduce ends every rank's iteration together."""
    rng = np.random.default_rng(seed)
    now = 0.0
    rows = []
    for i in range(iterations):
        stall = rng.exponential(0.02, ranks)
        arrival = now + stall
        end = arrival.max() + rng.uniform(0.01, 0.05)
        rows += [(0, i, r, arrival[r], stall[r], end - now) for r in range(ranks)]
        now = end
    return [np.array(col) for col in zip(*rows, strict=True)]


def test_synchronous_timelines_are_consistent() -> None:
    for seed in range(5):
        figures = timeline_consistency(*_ddp_timelines(seed))
        assert figures is not None and figures["problems"] == []
        assert figures["end_spread_s"]["p95"] < 1e-9
        assert abs(figures["loop_gap_s"]["min"]) < 1e-9
        assert figures["compute_after_arrival"]["negative_share"] == 0.0


def test_one_rank_shifted_per_iteration_is_inconsistent() -> None:
    """One rank's timestamps moved by a random amount per iteration: all three rules break."""
    epoch, iteration, rank, arrival, stall, time_s = _ddp_timelines(0)
    rng = np.random.default_rng(1)
    shifted = rank == 3
    arrival = arrival.copy()
    arrival[shifted] += rng.uniform(-0.3, 0.3, int(shifted.sum()))
    figures = timeline_consistency(epoch, iteration, rank, arrival, stall, time_s)
    assert figures is not None
    assert figures["end_spread_s"]["median"] > END_SPREAD_MAX_S
    assert figures["end_spread_s"]["over_share"] > 0.5
    gap = figures["loop_gap_s"]
    assert gap["min"] < -TOLERANCE_S < gap["max"] and gap["negative_share"] > 0.05
    assert figures["compute_after_arrival"]["negative_share"] > 0.05
    assert len(figures["problems"]) == 3
    assert "iteration ends differ across ranks by more than 50 ms" in figures["problems"][0]


def test_too_few_iterations_say_nothing() -> None:
    assert timeline_consistency(*_ddp_timelines(0, iterations=2)) is None


def _parse(logs: Path, out: Path):
    result = run_dsim("parse", logs, "--out", out)
    assert result.returncode == 0, result.stderr
    return result, RunInfo.load(out / logs.name)


def test_shipped_real_sample_is_consistent_and_figures_are_kept(tmp_path: Path) -> None:
    result, info = _parse(SAMPLE, tmp_path / "out")
    assert "inconsistent" not in result.stderr + result.stdout
    assert info.consistency is not None and info.inconsistent == []
    assert info.consistency["iterations"] == 600
    assert info.consistency["end_spread_s"]["p95"] < END_SPREAD_MAX_S
    # the figures survive a load/save round trip, and a run.json without them keeps its bytes
    assert RunInfo.from_document(info.document()).document() == info.document()
    old = {k: v for k, v in info.document().items() if k != "consistency"}
    assert json.dumps(RunInfo.from_document(old).document()) == json.dumps(old)


def _shift_rank(logs: Path, rank: int, seconds: float, drift: float = 0.0) -> None:
    """Move every timestamp of one rank's log by ``seconds`` (its node's clock is off), plus
    ``drift`` seconds times the line's place in the file (0 to 1: a clock that drifts)."""
    path = logs / f"rank{rank}.log"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    out = []
    for n, line in enumerate(lines):
        stamp = dt.datetime.strptime(line[:26], "%Y-%m-%d %H:%M:%S.%f")
        moved = stamp + dt.timedelta(seconds=seconds + drift * n / len(lines))
        out.append(moved.strftime("%Y-%m-%d %H:%M:%S.%f") + line[26:])
    path.write_text("".join(out), encoding="utf-8")


def test_inconsistent_trace_warns_on_stderr_with_its_figures(tmp_path: Path) -> None:
    logs = tmp_path / "shifted_run"
    shutil.copytree(SAMPLE, logs)
    _shift_rank(logs, 3, 0.5, drift=1.0)  # a drifting clock: not a constant offset
    result, info = _parse(logs, tmp_path / "out")
    first, *rest = result.stderr.strip().splitlines()
    assert first.startswith("warning: run shifted_run: GPU 3's clock is 1.000 s ")
    assert first.endswith("ahead of the other ranks' (median), but not constant "
                          "(deviation p95 0.474 s); not corrected")  # fmt: skip
    assert rest[0].startswith(
        "warning: run shifted_run: per-rank timelines inconsistent with synchronous DDP: "
        "iteration ends differ across ranks by more than 50 ms in 100.0 % of iterations"
    )
    assert len(rest) == 2
    assert info.consistency["end_spread_s"]["median"] > 0.45
    assert info.consistency["compute_after_arrival"]["negative_share"] > 0.5
    assert info.inconsistent and info.inconsistent[0] in result.stderr


def _train_table(epoch, iteration, rank, arrival, stall, time_s) -> pa.Table:
    start = (np.asarray(arrival) * 1e9).round().astype(np.int64) + 1_700_000_000 * 10**9
    return pa.table(
        {
            "epoch": pa.array(epoch, pa.int32()),
            "iteration": pa.array(iteration, pa.int32()),
            "gpu": pa.array(rank, pa.int32()),
            "start": pa.array(start.view("datetime64[ns]")),
            "iteration_s": pa.array(time_s, pa.float64()),
            "stall_s": pa.array(stall, pa.float64()),
        }
    )


def test_a_constant_clock_offset_is_found_per_rank_and_marked_correctable() -> None:
    epoch, iteration, rank, arrival, stall, time_s = _ddp_timelines(0)
    arrival = arrival - 3600.0 * (rank == 2)  # rank 2's node clock an hour behind
    found = clock_offsets(_train_table(epoch, iteration, rank, arrival, stall, time_s))
    assert found is not None and found["tolerance_s"] == CLOCK_OFFSET_MAX_S
    [off] = found["ranks"]
    assert off["gpu"] == 2 and off["corrected"]
    assert abs(off["offset_s"] + 3600.0) < 1e-6 and off["spread_s"] < 1e-6
    # in sync (and within the tolerance): nothing to say
    assert clock_offsets(_train_table(*_ddp_timelines(0))) is None
    late = _ddp_timelines(0)
    late[3] = late[3] + 0.03 * (late[2] == 1)
    assert clock_offsets(_train_table(*late)) is None


def test_the_reference_is_the_largest_group_of_agreeing_clocks() -> None:
    ends = np.arange(10.0)[:, None] + np.array([0.0, 7.0, 7.0, 7.0])  # rank 0 is the odd one
    offsets, spread = rank_offsets(ends)
    assert np.allclose(offsets, [-7.0, 0, 0, 0]) and np.allclose(spread, 0)
    two = np.arange(10.0)[:, None] + np.array([0.0, 5.0])  # a tie: rank 0 is the reference
    assert np.allclose(rank_offsets(two)[0], [0.0, 5.0])


def test_a_wandering_offset_is_reported_not_corrected() -> None:
    epoch, iteration, rank, arrival, stall, time_s = _ddp_timelines(0)
    rng = np.random.default_rng(3)
    arrival = arrival + (rank == 1) * (2.0 + rng.uniform(-0.5, 0.5, len(rank)))
    found = clock_offsets(_train_table(epoch, iteration, rank, arrival, stall, time_s))
    [off] = found["ranks"]
    assert off["gpu"] == 1 and not off["corrected"] and off["spread_s"] > 0.2


def test_a_rank_an_hour_behind_is_corrected_and_says_so(tmp_path: Path) -> None:
    """The issue's case: one rank's file an hour behind changed the verdict without a word."""
    logs = tmp_path / "hour_run"
    shutil.copytree(SAMPLE, logs)
    _shift_rank(logs, 3, -3600.0)
    result, info = _parse(logs, tmp_path / "out")
    assert result.stderr.startswith(
        "warning: run hour_run: GPU 3's clock is 3600.000 s behind the other ranks' (constant: "
    )
    assert "corrected, its times shifted by +3600.000 s (run.json report.clock_offsets)" in (
        result.stderr
    )
    assert "inconsistent" not in result.stderr and info.inconsistent == []
    [off] = info.report["clock_offsets"]["ranks"]
    assert off["gpu"] == 3 and off["corrected"] and abs(off["offset_s"] + 3600) < 0.01
    # the corrected tables are the unshifted run's, to the offset's estimate (µs)
    _, plain = _parse(SAMPLE, tmp_path / "plain")
    for name in ("train", "fetch"):
        a = pq.read_table(tmp_path / "out" / "hour_run" / f"{name}.parquet")
        b = pq.read_table(tmp_path / "plain" / SAMPLE.name / f"{name}.parquet")
        gap = a["start"].cast(pa.int64()).to_numpy() - b["start"].cast(pa.int64()).to_numpy()
        assert np.abs(gap).max() < 100_000  # 0.1 ms
    assert "clock_offsets" not in plain.report
