"""Ranks that cannot be right are rejected with their line numbers, never re-attributed.

``GPU: -1`` and 7-digit ranks used to be skipped over as prefix text, giving the
line the file's default rank (GPU 0); a profiler trace's rank 10**12 wrapped to
a negative int32 (docs/SPEC.md §1.3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loglines import T0, fetch_line, one_epoch, run_of, train_line

from dsim.errors import InputError
from dsim.sources.kineto import read_trace
from dsim.sources.rawlog.bounds import BAD_RANK, RANK_LIMIT
from dsim.sources.rawlog.parse import parse_run


def _fetch(rank: str, idx: int = 1) -> str:
    return f"{T0}20.5 DEBUG:\tGPU: {rank} worker_id: 0, END FETCH at_time 1.0 data idx{idx}"


@pytest.mark.parametrize("rank", ["-1", "1234567", "+-3", str(RANK_LIMIT), "9" * 30])
def test_out_of_range_fetch_ranks_are_rejected_not_given_to_gpu_0(tmp_path, rank):
    parsed = parse_run(run_of(tmp_path, {"output.log": [*one_epoch(), _fetch(rank)]}))
    assert parsed.report["skipped"] == {BAD_RANK: 1}
    rows = parsed.rejects.to_pylist()
    assert [(Path(r["file"]).name, r["line"]) for r in rows] == [("output.log", 13)]
    assert parsed.tables.fetch.num_rows == 6  # GPU 0 kept only its own fetches


def test_out_of_range_training_and_loader_ranks_are_rejected(tmp_path):
    lines = [
        *one_epoch(),
        f"{T0}20.0 GPU: -2 Epoch: [0][  1/3]\tTime 0.9 (0.9)\tData 0.1 (0.1)",
        f"{T0}20.0 GPU: 2000000 LOADER num_workers 2 prefetch_factor 2 batch_size 8 "
        "persistent_workers 0 pin_memory 1",
    ]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert parsed.report["skipped"] == {BAD_RANK: 2}
    assert sorted(r["line"] for r in parsed.rejects.to_pylist()) == [13, 14]
    assert parsed.tables.info.loader is None


def test_the_largest_rank_is_accepted(tmp_path):
    top = RANK_LIMIT - 1
    lines = [fetch_line("10.5", top, 0, "1.0", 0), train_line("10.75", top, 0, 0)]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert parsed.report["skipped"] == {} and parsed.tables.info.gpu_ids == (top,)


def test_fetches_of_a_rank_without_training_lines_are_named_not_moved(tmp_path):
    extra = [fetch_line("20.5", 5, 0, "1.0", 1), fetch_line("21.5", 5, 0, "1.0", 2)]
    parsed = parse_run(run_of(tmp_path, {"output.log": [*one_epoch(), *extra]}))
    assert parsed.tables.info.gpu_ids == (0, 1, 5)
    assert (
        "GPU 5 has 2 fetch record(s) but no training line (first: output.log:13); its "
        "iterations are incomplete and `dsim run` refuses the run (training ranks: 0-1)"
    ) in parsed.report["warnings"]
    # a run with no training line at all is said once, not per rank (SPEC §1.4, last paragraph)
    only = parse_run(run_of(tmp_path, {"fetch.log": extra}))
    assert not any("GPU 5 has" in w for w in only.report["warnings"])


def test_a_file_name_rank_out_of_range_is_an_error_naming_the_file(tmp_path):
    lines = [f"{T0}10.5 DEBUG:\tworker_id: 0, END FETCH at_time 1.0 data idx0"]
    with pytest.raises(InputError, match="rank 99999999 in the file name") as err:
        parse_run(run_of(tmp_path, {"rank99999999.log": lines}))
    assert "rank99999999.log" in str(err.value)


@pytest.mark.parametrize("rank", [10**12, -1, RANK_LIMIT])
def test_a_profiler_rank_out_of_range_is_an_error_not_wrapped(tmp_path, rank):
    path = tmp_path / "rank0.pt.trace.json"
    doc = {"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": []}
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=f"distributedInfo.rank {rank}: GPU rank out of range"):
        read_trace(path)
