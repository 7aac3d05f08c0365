"""What cannot be one job is refused, naming files and lines (docs/SPEC.md §1.6)."""

from __future__ import annotations

import pytest
from loglines import run_of, stamp

from dsim.errors import InputError
from dsim.sources.rawlog.parse import parse_run


def _job(gpus: range, t0: float, iters: int = 12, pace: float = 1.0) -> list[str]:
    """One synchronous job: every rank's iteration ends at the same time (the all-reduce)."""
    out = []
    for i in range(iters):
        for g in gpus:
            end = stamp(t0 + i * pace + 0.3 + 0.01 * g)
            out.append(
                f"{end} DEBUG:\tGPU: {g} worker_id: {i % 2}, END FETCH at_time 0.25 data idx{i}"
            )
        for g in gpus:
            data = 0.2 + 0.01 * g  # later arrival, shorter compute: the same end for all
            start = stamp(t0 + i * pace + data)
            body = f"Epoch: [0][{i:>3}/{iters}]\tTime {pace:.6f} ({pace:.6f})\tData {data:.6f} (0)"
            out.append(f"{start} GPU: {g} {body}")
    return out


def test_a_second_set_of_ranks_at_other_times_is_refused(tmp_path):
    lines = _job(range(0, 4), 100.0) + _job(range(4, 8), 7300.0, pace=1.3)
    with pytest.raises(InputError) as err:
        parse_run(run_of(tmp_path, {"output.log": lines}))
    assert str(err.value) == (
        f"{tmp_path}/output.log: GPUs 0-3 (output.log:5-96) and GPUs 4-7 (output.log:101-192) "
        "log their iterations at disjoint times, and their iterations do not end together as "
        "one job's all-reduce ends them (nor apart by a constant clock offset): two jobs in one "
        "run; give each job its own log file or directory"
    )


def test_ranks_apart_by_a_constant_clock_offset_are_one_job(tmp_path):
    lines = _job(range(0, 4), 100.0)
    behind = _job(range(4, 8), 100.0 - 3600.0)  # the same job, its clock an hour off
    parsed = parse_run(run_of(tmp_path, {"output.log": lines, "node1.log": behind}))
    assert parsed.tables.info.gpu_count == 8  # corrected later (dsim.app.parse.with_clocks_set)
