"""Trace consistency with synchronous DDP (docs/SPEC.md §2.3): figures and warning."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import numpy as np
from conftest import run_dsim

from dsim.model.consistency import END_SPREAD_MAX_S, TOLERANCE_S, timeline_consistency
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


def _shift_rank(logs: Path, rank: int, seconds: float) -> None:
    """Move every timestamp of one rank's log by ``seconds`` (its node's clock is off)."""
    path = logs / f"rank{rank}.log"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    out = []
    for line in lines:
        stamp = dt.datetime.strptime(line[:26], "%Y-%m-%d %H:%M:%S.%f")
        out.append((stamp + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S.%f"))
        out[-1] += line[26:]
    path.write_text("".join(out), encoding="utf-8")


def test_inconsistent_trace_warns_on_stderr_with_its_figures(tmp_path: Path) -> None:
    logs = tmp_path / "shifted_run"
    shutil.copytree(SAMPLE, logs)
    _shift_rank(logs, 3, 0.5)
    result, info = _parse(logs, tmp_path / "out")
    assert result.stderr.startswith(
        "warning: run shifted_run: per-rank timelines inconsistent with synchronous DDP: "
        "iteration ends differ across ranks by more than 50 ms in 100.0 % of iterations"
    )
    assert len(result.stderr.strip().splitlines()) == 2
    assert info.consistency["end_spread_s"]["median"] > 0.45
    assert info.consistency["compute_after_arrival"]["negative_share"] > 0.5
    assert info.inconsistent and info.inconsistent[0] in result.stderr
