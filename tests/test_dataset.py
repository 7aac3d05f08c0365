"""The tidy replay dataset (docs/SPEC.md §7.6), read back as one dataset by pandas,
polars and DuckDB, across runs of different GPU counts and replay models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import run_dsim, run_dsim_in_process

from dsim.model.dataset import GPUS_SCHEMA, ITERATIONS_SCHEMA
from dsim.model.results import load_replay

pl = pytest.importorskip("polars")
duckdb = pytest.importorskip("duckdb")

RUNS = {"two": 2, "five": 5}  # run name -> GPU count


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs replayed under both models, through the CLI's entry point in this process
    (tests/conftest.py; the dataset files are the subject, not the start-up)."""
    work = tmp_path_factory.mktemp("dataset")
    for name, gpus in RUNS.items():
        synth = ("--gpus", str(gpus), "--iterations", "30", "--epochs", "2", "--workers", "2")
        for args in (
            ("synth", *synth, "--name", name, "--out", "logs"),
            ("parse", f"logs/{name}", "--out", "traces"),
        ):
            proc = run_dsim_in_process(*args, "-q", cwd=work)
            assert proc.returncode == 0, proc.stderr
    for args in (("-p", "min/min"), ("--model", "pipeline", "-p", "avg/avg")):
        proc = run_dsim_in_process("run", *RUNS, *args, "-q", cwd=work)
        assert proc.returncode == 0, proc.stderr
    return work / "results"


def _replay(results: Path, directory: str, label: str) -> pd.DataFrame:
    """A replay as readers see it (its file is a stub: rows from the dataset, §7.1)."""
    table, _ = load_replay(results / directory / f"{label}.parquet", remedy="re-run")
    return table.to_pandas()


def test_directories_hold_only_parquet_files_of_one_schema(results: Path) -> None:
    for table, schema in (("iterations", ITERATIONS_SCHEMA), ("gpus", GPUS_SCHEMA)):
        files = sorted(p.name for p in (results / "dataset" / table).iterdir())
        assert files == [
            "five.parquet",
            "five@pipeline.parquet",
            "two.parquet",
            "two@pipeline.parquet",
        ]
        for name in files:
            assert pq.read_schema(results / "dataset" / table / name).remove_metadata() == schema


def test_pandas_reads_every_run_as_one_table_matching_the_replays(results: Path) -> None:
    it = pd.read_parquet(results / "dataset" / "iterations")
    assert set(it["run"]) == set(RUNS) and set(it["replay_model"]) == {"per-iteration", "pipeline"}
    per_iter = it[(it["run"] == "five") & (it["replay_model"] == "per-iteration")]
    assert set(zip(per_iter["fetch_align"], per_iter["start_align"], strict=True)) == {
        ("actual", "actual"),
        ("min", "min"),
    }
    rows = per_iter[per_iter["fetch_align"] == "min"].reset_index(drop=True)
    replay = _replay(results, "five", "min__min")
    for col in ("epoch", "iteration", "iteration_s", "stall_s", "delay_s"):
        assert np.array_equal(rows[col].to_numpy(), replay[col].to_numpy())
    gpus = pd.read_parquet(results / "dataset" / "gpus")
    g = gpus[(gpus["run"] == "five") & (gpus["replay_model"] == "per-iteration")]
    g = g[g["fetch_align"] == "min"]
    assert sorted(set(g["gpu"])) == [0, 1, 2, 3, 4]
    wide = g.pivot(index=["epoch", "iteration"], columns="gpu", values="stall_s")
    for rank in range(5):
        assert np.array_equal(wide[rank].to_numpy(), replay[f"stall_s_gpu{rank}"].to_numpy())


def test_polars_scans_runs_of_different_gpu_counts(results: Path) -> None:
    gpus = pl.scan_parquet(str(results / "dataset" / "gpus" / "*.parquet"))
    counts = (
        gpus.filter(pl.col("replay_model") == "pipeline")
        .group_by("run")
        .agg(pl.col("gpu").n_unique().alias("n"))
        .collect()
    )
    assert dict(zip(counts["run"], counts["n"], strict=True)) == RUNS
    it = pl.read_parquet(str(results / "dataset" / "iterations" / "*.parquet"))
    assert it.schema["epoch"] == pl.Int32 and it.schema["loader_workers"] == pl.Int32
    assert it.filter(pl.col("replay_model") == "pipeline")["loader_workers"].to_list()[0] == 2


def test_duckdb_queries_the_dataset_with_sql(results: Path) -> None:
    glob = str(results / "dataset" / "iterations" / "*.parquet")
    rows = duckdb.sql(
        f"SELECT run, replay_model, count(*) AS n, max(stall_s) AS worst "
        f"FROM read_parquet('{glob}') WHERE fetch_align = 'actual' AND start_align = 'actual' "
        "GROUP BY ALL ORDER BY run, replay_model"
    ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [
        ("five", "per-iteration"),
        ("five", "pipeline"),
        ("two", "per-iteration"),
        ("two", "pipeline"),
    ]
    measured = _replay(results, "two", "actual__actual")
    assert rows[2][2] == len(measured) and rows[2][3] == measured["stall_s"].max()


def test_a_cached_run_keeps_its_dataset_files(results: Path) -> None:
    path = results / "dataset" / "gpus" / "two.parquet"
    before = (path.stat().st_mtime_ns, path.read_bytes())
    proc = run_dsim("run", "two", "-p", "min/min", "-q", cwd=results.parent)
    assert proc.returncode == 0, proc.stderr
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before
    # a new policy changes the replays the file is built from: rebuilt, with it
    proc = run_dsim("run", "two", "-p", "avg/min", "-q", cwd=results.parent)
    assert proc.returncode == 0, proc.stderr
    policies = set(
        pd.read_parquet(path, columns=["fetch_align", "start_align"]).itertuples(index=False)
    )
    assert policies == {("actual", "actual"), ("avg", "min")}
