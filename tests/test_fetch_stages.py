"""Inside a fetch (issue #23, item 3): stage timing, its lines, tables and the words on them.

The stage clock is checked against code whose time is known (a read that
sleeps, a collation that computes); the line through both grammar paths;
the shares and the sentence against hand-computed numbers; and a real torch
DataLoader end to end (skipped without torch).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import run_dsim
from test_attribution import FETCH, STALL, WORKERS, _tables

from dsim.analysis.attribution import attribute, attribution_table, describe
from dsim.fetchstages import STAGE_COLUMNS, describe_stages, stage_shares
from dsim.instrument import fetch_line
from dsim.instrument.stages import Stages, read_then_collate
from dsim.model.tables import RunTables, write_run
from dsim.replay.arrays import build_iteration_arrays
from dsim.sources.rawlog import grammar


def _burn(seconds: float) -> None:
    """Compute (not wait) for ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_stages_split_wall_and_cpu_between_reads_and_collation_and_add_up() -> None:
    def read() -> list[int]:
        time.sleep(0.05)  # waits: wall time, almost no CPU
        return [1, 2, 3]

    def collate(samples: list[int]) -> int:
        _burn(0.03)  # computes: CPU time
        return sum(samples)

    start, cpu_start = time.perf_counter(), time.thread_time()
    batch, mid = read_then_collate(read, collate)
    end, cpu_end = time.perf_counter(), time.thread_time()
    stages = Stages.between(start, cpu_start, mid, end, cpu_end)
    assert batch == 6
    assert stages.read >= 0.05 and stages.read_cpu < 0.02
    assert stages.collate_cpu >= 0.03 and stages.collate >= stages.collate_cpu - 1e-3
    assert stages.read + stages.collate == pytest.approx(end - start, abs=1e-12)
    assert stages.read_cpu + stages.collate_cpu == pytest.approx(cpu_end - cpu_start, abs=1e-12)


def test_a_stage_line_parses_to_its_values_and_a_plain_one_has_none() -> None:
    stages = Stages(0.04, 0.038, 0.002, 0.0015)
    with_stages = fetch_line(1_700_000_000.5, 3, 1, 0.05, 7, 0.0401, 0.001, stages)
    assert with_stages.rstrip("\n").endswith(
        "cpu 0.040100000 runq 0.001000000 read 0.040000000 read_cpu 0.038000000"
        " collate 0.002000000 collate_cpu 0.001500000"
    )
    plain = fetch_line(1_700_000_000.5, 3, 1, 0.05, 8, 0.0401, 0.001)
    assert "read" not in plain
    for fast in (True, False):
        rejects = grammar.Rejects()
        text = (with_stages + plain).encode()
        records = grammar.parse_lines(grammar.lines_of(text), 1, rejects, fast=fast)
        fetch = records.fetch
        assert list(fetch["idx"]) == [7, 8] and rejects.table().num_rows == 0
        got = [fetch[f"{name}_s"] for name in grammar.STAGE_FIELDS]
        assert [v[0] for v in got] == pytest.approx(list(stages), abs=1e-12)
        assert all(np.isnan(v[1]) for v in got)


def _with_stages(fetch: pa.Table, read: list[float], read_cpu: list[float]) -> pa.Table:
    """``fetch`` with per-GPU stage shares: read and collate parts of each fetch_s."""
    gpu = fetch["gpu"].to_numpy()
    secs = fetch["fetch_s"].to_numpy()
    r = np.asarray(read)[gpu] * secs
    c = (0.95 - np.asarray(read)[gpu]) * secs  # 5 % is dsim's own, in neither stage
    columns = {
        "read_s": r,
        "read_cpu_s": np.asarray(read_cpu)[gpu] * r,
        "collate_s": c,
        "collate_cpu_s": 0.5 * c,
    }
    for name, values in columns.items():
        fetch = fetch.append_column(name, pa.array(values, pa.float64()))
    return fetch


def test_shares_per_rank_and_the_sentence_name_the_dominating_stage() -> None:
    fetch, _ = _tables(FETCH, STALL, WORKERS)
    staged = _with_stages(fetch, read=[0.2, 0.5, 0.8], read_cpu=[0.1, 0.5, 0.95])
    shares = {s.gpu: s for s in stage_shares(staged)}
    assert shares[2].read_pct == pytest.approx(80.0) and shares[2].collate_pct == pytest.approx(15)
    assert shares[2].read_cpu_pct == pytest.approx(95.0)
    assert shares[0].collate_cpu_pct == pytest.approx(50.0) and shares[2].fetches == 5
    assert describe_stages(2, shares[2].row(), " (the straggler)") == (
        "Inside the fetch: GPU 2 (the straggler): 80 % of fetch time is sample reads "
        "(CPU-bound: CPU 95 % of wall); 15 % collation (CPU 50 % of wall)."
    )
    assert describe_stages(0, shares[0].row()) == (
        "Inside the fetch: GPU 0: 75 % of fetch time is collation (CPU 50 % of wall); "
        "20 % sample reads (waiting: CPU 10 % of wall; I/O, a lock or a busy core)."
    )
    keep = staged["iteration"].to_numpy() > 3  # a selection: iterations 4 and 5 only
    assert {s.gpu: s.fetches for s in stage_shares(staged, keep)} == {0: 2, 1: 2, 2: 2}
    assert stage_shares(fetch) == []  # logs without stages: nothing to say
    assert describe_stages(0, {}) is None


def test_attribution_table_and_lines_carry_stages_only_when_logged() -> None:
    fetch, train = _tables(FETCH, STALL, WORKERS)
    arrays = build_iteration_arrays(fetch, train)
    plain = attribute("hand", arrays, np.asarray(WORKERS))
    table = attribution_table([plain])
    assert not set(STAGE_COLUMNS) & set(table.columns)  # the table of earlier versions
    assert not any("Inside the fetch" in line for line in describe(table))
    staged = _with_stages(fetch, read=[0.2, 0.5, 0.8], read_cpu=[0.1, 0.5, 0.95])
    with_stages = attribute("hand", arrays, np.asarray(WORKERS))
    with_stages = type(with_stages)(
        **{**with_stages.__dict__, "stages": tuple(stage_shares(staged))}
    )
    lines = describe(attribution_table([with_stages]))
    assert lines[-1].startswith("Inside the fetch: GPU 2 (the straggler): 80 % of fetch time")


def test_dsim_run_and_report_name_the_straggler_s_dominating_stage(tmp_path: Path) -> None:
    fetch, train = _tables(FETCH, STALL, WORKERS)
    staged = _with_stages(fetch, read=[0.2, 0.5, 0.8], read_cpu=[0.1, 0.5, 0.95])
    info = {"gpus": 3, "epochs": [0], "iterations_per_epoch": {"0": 6}, "metadata": {}}
    write_run(RunTables("hand", staged, train, info), tmp_path / "traces" / "hand")
    proc = run_dsim("run", "hand", "--warmup", "0", cwd=tmp_path, env={"COLUMNS": "300"})
    assert proc.returncode == 0, proc.stderr
    line = (
        "Inside the fetch: GPU 2 (the straggler): 80 % of fetch time is sample reads "
        "(CPU-bound: CPU 95 % of wall); 15 % collation (CPU 50 % of wall)."
    )
    assert line in proc.stdout
    csv = pd.read_csv(tmp_path / "results" / "attribution.csv")
    assert csv[csv["gpu"] == 2]["stage_read_pct"].iloc[0] == pytest.approx(80.0)
    proc = run_dsim("report", "results", "--out", "report.html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert line in (tmp_path / "report.html").read_text()


# ---------------------------------------------------------------- a real DataLoader


class SlowReads:
    """Each sample read sleeps 4 ms: a dataset waiting on storage."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        import torch

        time.sleep(0.004)
        return torch.full((2,), float(i))


def computing_collate(samples):
    """Stacks after 6 ms of computation: a collate_fn that works."""
    import torch

    _burn(0.006)
    return torch.stack(samples)


@pytest.mark.torch
def test_a_real_loader_records_stages_that_parse_and_add_up(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from dsim.instrument import TrainingTimer, instrument_loader
    from dsim.sources.rawlog.discover import discover_runs
    from dsim.sources.rawlog.parse import parse_run

    tables = {}
    for stages in (True, False):
        log_dir = tmp_path / f"stages{stages}"
        plain = DataLoader(SlowReads(), batch_size=4, num_workers=2, collate_fn=computing_collate)
        loader = instrument_loader(plain, log_dir=log_dir, rank=0, stages=stages)
        timer = TrainingTimer(log_dir=log_dir, rank=0)
        got = [batch.clone() for batch in timer.iterate(loader, epoch=0)]
        assert all(torch.equal(a, b) for a, b in zip(got, list(plain), strict=True))
        (source,) = discover_runs([log_dir], name="run")
        tables[stages] = parse_run(source, strict=True).tables
    assert not {"read_s", "collate_s"} & set(tables[False].fetch.column_names)
    fetch = tables[True].fetch.to_pandas()
    assert len(fetch) == 4
    assert (fetch.read_s >= 4 * 0.004).all() and (fetch.read_cpu_s < fetch.read_s).all()
    assert (fetch.collate_cpu_s >= 0.006).all()
    # The stages split the fetch's own span: they add up to it (9 printed decimals each).
    assert np.allclose(fetch.read_s + fetch.collate_s, fetch.fetch_s, rtol=0, atol=2e-9)
    assert np.allclose(fetch.read_cpu_s + fetch.collate_cpu_s, fetch.cpu_s, rtol=0, atol=2e-9)
    (share,) = stage_shares(tables[True].fetch)
    assert share.gpu == 0 and share.read_pct + share.collate_pct == pytest.approx(100.0)


def test_a_line_with_a_stream_position_and_stages_parses_on_both_paths() -> None:
    """An IterableDataset's ``stream K`` (after ``data idx``) and the stages (last) together."""
    stages = Stages(0.04, 0.038, 0.002, 0.0015)
    both = fetch_line(1_700_000_000.5, 3, 1, 0.05, 7, 0.0401, 0.001, stages, stream=4)
    assert " data idx7 stream 4 cpu 0.040100000 runq 0.001000000 read 0.040000000" in both
    only_stream = fetch_line(1_700_000_000.5, 3, 1, 0.05, 8, stream=5)
    for fast in (True, False):
        rejects = grammar.Rejects()
        text = (both + only_stream).encode()
        records = grammar.parse_lines(grammar.lines_of(text), 1, rejects, fast=fast)
        fetch = records.fetch
        assert rejects.table().num_rows == 0
        assert list(fetch["idx"]) == [7, 8] and list(fetch["stream"]) == [4, 5]
        assert fetch["read_s"][0] == pytest.approx(0.04, abs=1e-12)
        assert np.isnan(fetch["read_s"][1]) and np.isnan(fetch["cpu_s"][1])
