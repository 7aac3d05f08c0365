"""CPU times in the tables (SPEC §2.1): present exactly when the logs carry them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dsim.instrument.lines import fetch_line, loader_line, training_line
from dsim.model.tables import FETCH_SCHEMA, TRAIN_SCHEMA, read_run, write_run
from dsim.sources.rawlog.discover import discover_runs
from dsim.sources.rawlog.parse import parse_run

SETTINGS = dict(num_workers=1, prefetch_factor=2, batch_size=4, persistent_workers=0, pin_memory=0)


def write_logs(
    directory: Path, cpu: bool, runq: bool = True, iterations: int = 5, proc: bool = False
) -> Path:
    """Two ranks, one epoch; with ``cpu`` every line carries the CPU fields (with ``proc``,
    every fetch line but the first the worker process's CPU since its previous batch)."""
    directory.mkdir(parents=True)
    for rank in (0, 1):
        node = {"cores": 2, "local_world_size": 2} if cpu else {}
        lines = [loader_line(1e9, rank, {**SETTINGS, **node})]
        t = 1e9 + 1
        for i in range(iterations):
            c, q = (0.03 + 0.001 * i, 0.01 if runq else None) if cpu else (None, None)
            p = 0.035 + 0.001 * i if proc and i else None
            lines.append(fetch_line(t + 0.05, rank, 0, 0.05, i, c, q, proc=p))
            tc = (0.02, 0.02) if cpu else None
            tq = (0.001, 0.001) if cpu and runq else None
            lines.append(training_line(t + 0.06, rank, 0, i, iterations, (0.1, 0.1), (0.01, 0.01),
                                       None, tc, tq))  # fmt: skip
            t += 0.1
        (directory / f"rank{rank}.log").write_text("".join(lines))
    return directory


def parse(directory: Path):
    (source,) = discover_runs([directory], name="run")
    return parse_run(source, strict=True).tables


def test_old_logs_get_the_old_schemas_and_run_json(tmp_path: Path) -> None:
    tables = parse(write_logs(tmp_path / "logs", cpu=False))
    assert tables.fetch.schema.equals(FETCH_SCHEMA) and tables.train.schema.equals(TRAIN_SCHEMA)
    assert "cores" not in tables.info.loader and "local_world_size" not in tables.info.loader


@pytest.mark.parametrize("runq", [True, False])
def test_cpu_columns_round_trip_through_the_run_directory(tmp_path: Path, runq: bool) -> None:
    tables = parse(write_logs(tmp_path / "logs", cpu=True, runq=runq))
    extra = ["cpu_s", "runq_s"] if runq else ["cpu_s"]
    assert tables.fetch.column_names == FETCH_SCHEMA.names + extra
    assert tables.train.column_names == TRAIN_SCHEMA.names + extra
    assert tables.info.loader["cores"] == 2 and tables.info.loader["local_world_size"] == 2
    write_run(tables, tmp_path / "out")
    back = read_run(tmp_path / "out")
    assert back.fetch.equals(tables.fetch) and back.train.equals(tables.train)
    cpu = back.fetch.column("cpu_s").to_numpy()
    assert np.allclose(np.sort(cpu), np.sort(np.repeat(0.03 + 0.001 * np.arange(5), 2)))
    assert back.info.loader["cores"] == 2


def test_worker_process_cpu_is_a_fetch_column_nan_on_each_first_batch(tmp_path: Path) -> None:
    tables = parse(write_logs(tmp_path / "logs", cpu=True, proc=True))
    assert tables.fetch.column_names == [*FETCH_SCHEMA.names, "cpu_s", "runq_s", "proc_cpu_s"]
    assert tables.train.column_names == [*TRAIN_SCHEMA.names, "cpu_s", "runq_s"]
    write_run(tables, tmp_path / "out")
    back = read_run(tmp_path / "out").fetch.to_pandas().sort_values(["gpu", "iteration"])
    expected = np.r_[np.nan, 0.035 + 0.001 * np.arange(1, 5)]
    for gpu in (0, 1):
        got = back[back.gpu == gpu].proc_cpu_s.to_numpy()
        assert np.allclose(got, expected, equal_nan=True)


def test_loader_lines_cpu_sets_parse_and_a_malformed_one_is_rejected(tmp_path: Path) -> None:
    """``cpus`` after the node's fields (SPEC §1.2): each rank's own set here, so the
    node's cores are their union and the logged count is kept as ``process_cores``; a
    set that is no Linux CPU list makes the loader line malformed (named in rejects)."""
    logs = write_logs(tmp_path / "logs", cpu=True)
    for rank, cpus in ((0, "0-1"), (1, "2,3")):
        path = logs / f"rank{rank}.log"
        text = path.read_text()
        first, rest = text.split("\n", 1)
        path.write_text(f"{first} cpus {cpus}\n{rest}")
    loader = parse(logs).info.loader
    assert (loader["cores"], loader["process_cores"]) == (4, 2)
    path = logs / "rank1.log"
    first, rest = path.read_text().split("\n", 1)
    path.write_text(first.replace("cpus 2,3", "cpus 2-") + "\n" + rest)
    (source,) = discover_runs([logs], name="run")
    parsed = parse_run(source, strict=False)
    assert parsed.report["skipped"] == {"malformed loader line": 1}
    assert (
        parsed.tables.info.loader["cores"] == 2 and "process_cores" not in parsed.tables.info.loader
    )
