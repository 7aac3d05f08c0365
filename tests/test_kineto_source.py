"""Profiler traces through `dsim parse` (the kineto source) and what `dsim run` says of them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
from conftest import run_dsim, run_dsim_in_process

from dsim.sources import SOURCES, detect_source

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "traces" / "profiler" / "cpuDDP_synthetic_none_mlp_epoch1_b128_worker2_thread0"
RUN = SHIPPED.name


def test_the_registry_knows_both_formats_and_detects_traces(tmp_path: Path) -> None:
    assert set(SOURCES) == {"rawlog", "kineto"}
    assert detect_source([SHIPPED]) == "kineto"
    assert detect_source([REPO / "traces" / "raw"]) == "rawlog"
    assert detect_source([SHIPPED, REPO / "traces" / "raw"]) == "rawlog"  # mixed: raw logs


def test_dsim_parse_reads_the_shipped_traces(tmp_path: Path) -> None:
    proc = run_dsim("parse", str(SHIPPED), "--out", "traces", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "from 20336 trace events" in proc.stdout and "no fetch records" in proc.stdout
    run_dir = tmp_path / "traces" / RUN
    info = json.loads((run_dir / "run.json").read_text())
    assert info["format"] == "kineto" and info["gpus"] == 4 and info["gpu_ids"] == [0, 1, 2, 3]
    assert info["iterations_per_epoch"] == {"0": 30}
    for source in info["sources"]:  # provenance as for raw logs: the file as stored
        stored = Path(source["path"]).read_bytes()
        assert source["size"] == len(stored)
        assert source["sha256"] == hashlib.sha256(stored).hexdigest()
        assert source.get("compression") == ("gzip" if stored[:2] == b"\x1f\x8b" else None)
    assert pq.read_table(run_dir / "fetch.parquet").num_rows == 0
    train = pq.read_table(run_dir / "train.parquet")
    assert train.num_rows == 120 and set(train["epoch"].to_pylist()) == {0}
    explicit = run_dsim(
        "parse", str(SHIPPED), "--format", "kineto", "--out", "t2", "--name", "p", cwd=tmp_path
    )
    assert explicit.returncode == 0, explicit.stderr
    assert (tmp_path / "t2" / "p" / "train.parquet").read_bytes() == (
        run_dir / "train.parquet"
    ).read_bytes()


def test_dsim_run_refuses_fetch_policies_for_a_trace_naming_the_run(tmp_path: Path) -> None:
    # in-process (conftest): a one-run parse for the input, and `dsim run`'s one message and
    # exit code before any replay (the parses above are subprocesses)
    parsed = run_dsim_in_process("parse", str(SHIPPED), "-q", cwd=tmp_path)
    assert parsed.returncode == 0, parsed.stderr
    proc = run_dsim_in_process("run", RUN, "-p", "avg/min", "--executor", "local", cwd=tmp_path)
    assert proc.returncode == 3
    assert f"run {RUN} has no fetch records (profiler traces?), so avg/min" in proc.stderr
    assert "stall-min/actual" in proc.stderr  # what it can replay instead
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1
    assert not (tmp_path / "results").exists()
