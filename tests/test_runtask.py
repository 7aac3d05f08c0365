"""`dsim run`'s per-run pipeline: the work of a run done once, the same files wherever it ran.

Issue #21 items 1-2: attribution used to read both trace tables again and build a
run's iteration arrays a second time, and the dataset re-read every replay; on
Ray only the replay kernel left the driver. Now one function (``dsim.app.runtask``)
does a run's read, replay and writes, in-process or as one Ray task per run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import run_dsim
from tracegen import write_synthetic

from dsim.app import attribution as app_attribution
from dsim.app import runplan, runtask
from dsim.app.run import run_replays
from dsim.config import Overrides, load_config
from dsim.model import datasetfiles
from dsim.model import results as results_module

RUNS = ("ra", "rb", "rc")


def _traces(root: Path, iterations: int = 30) -> Path:
    for k, name in enumerate(RUNS):
        write_synthetic(root / "traces", name, iterations=iterations, seed=11 + k)
    return root / "traces"


def _config(tmp_path: Path, **kwargs):
    overrides = Overrides(
        runs=RUNS, traces=tmp_path / "traces", out=tmp_path / "out", executor="local", **kwargs
    )
    return load_config(None, overrides)


def test_a_runs_arrays_are_built_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One build per run, shared by the replay, the attribution and, for a loader what-if,
    by both of its plans (the what-if and its measured baseline)."""
    _traces(tmp_path)
    calls: list[int] = []
    real = runplan.build_iteration_arrays

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(runplan, "build_iteration_arrays", counting)
    monkeypatch.setattr(app_attribution, "build_iteration_arrays", counting)
    outcome = run_replays(_config(tmp_path))
    assert outcome.computed == 3 * 9 and len(calls) == 3
    assert (tmp_path / "out" / "attribution.parquet").is_file()

    calls.clear()
    what_if = run_replays(_config(tmp_path, model="pipeline", workers=4))
    assert what_if.computed == 2 * 3 * 9  # RUN@pipeline-w4-p2 and its baseline RUN@pipeline
    assert len(calls) == 3


def test_dataset_comes_from_memory_and_a_cached_run_reads_no_replay_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh run builds the dataset and its summary rows from the replays it computed
    (no replay file or dataset row is read back, §8); a fully cached run rebuilds
    nothing, and its summary reads each policy's per-iteration rows once, from the
    dataset (the replay files are stubs, §7.1; no per-GPU row is decoded)."""
    _traces(tmp_path)
    reads: list[Path] = []
    real = results_module.parquetio.read_table
    rows: list[Path] = []
    real_rows = datasetfiles._policy_rows

    def counting(path, *args, **kwargs):
        reads.append(Path(path))
        return real(path, *args, **kwargs)

    def counting_rows(path, *args, **kwargs):
        rows.append(Path(path))
        return real_rows(path, *args, **kwargs)

    monkeypatch.setattr(results_module.parquetio, "read_table", counting)
    monkeypatch.setattr(datasetfiles, "_policy_rows", counting_rows)
    first = run_replays(_config(tmp_path))
    assert first.computed == 27
    assert [p for p in reads if "__" in p.name] == []  # no replay file read back
    assert rows == []  # the summary rows were made from the tables in memory
    before = {p: p.read_bytes() for p in (tmp_path / "out" / "dataset").rglob("*.parquet")}
    assert len(before) == 2 * len(RUNS)

    reads.clear()
    rows.clear()
    rebuilt: list[str] = []
    monkeypatch.setattr(runtask, "DatasetWriter", lambda *a, **k: rebuilt.append("x"))
    again = run_replays(_config(tmp_path))
    assert (again.computed, again.cached) == (0, 27)
    assert [p for p in reads if "__" in p.name] == [] and len(rows) == 27 and not rebuilt
    assert {p.parent.name for p in rows} == {"iterations"}
    assert again.summary.equals(first.summary)
    after = {p: p.read_bytes() for p in (tmp_path / "out" / "dataset").rglob("*.parquet")}
    assert after == before


def test_a_fresh_what_if_run_summarises_each_directory_from_its_own_replays(
    tmp_path: Path,
) -> None:
    """A loader what-if replays two directories (RUN@pipeline-w4-p2 and its baseline
    RUN@pipeline); the rows a fresh run makes from its replays in memory belong to the
    directory they were replayed for. They were paired in scan order, which puts the
    baseline first though its plan comes second: the fresh summary showed each
    directory with the other's numbers, and disagreed with a cached run's and with
    ``dsim summarize``'s."""
    _traces(tmp_path)
    config = _config(tmp_path, model="pipeline", workers=4)
    fresh = run_replays(config)
    assert fresh.computed == 2 * 3 * 9
    summary = tmp_path / "out" / "summary.parquet"
    written = summary.read_bytes()
    again = run_replays(config)
    assert (again.computed, again.cached) == (0, 2 * 3 * 9)
    assert fresh.summary.equals(again.summary)
    assert summary.read_bytes() == written


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.ray
def test_ray_tasks_write_the_same_bytes_as_in_process(tmp_path: Path) -> None:
    """The same sweep (all 9 policies) in-process and as one Ray task per run (embedded
    Ray, 2 CPUs; an empty RAY_ADDRESS is no address): every output file byte for byte the
    same (no output holds a timestamp; the results directories are named alike, each in
    its own working directory). The suite's one CLI check of Ray against in-process."""
    _traces(tmp_path / "local")
    shutil.copytree(tmp_path / "local" / "traces", tmp_path / "ray" / "traces")
    args = ["run", *RUNS, "--out", "out"]
    local = run_dsim(*args, "--executor", "local", cwd=tmp_path / "local")
    assert local.returncode == 0, local.stderr
    on_ray = run_dsim(
        *args, "--executor", "ray", "--num-cpus", "2", cwd=tmp_path / "ray",
        env={"RAY_ADDRESS": ""},
    )  # fmt: skip
    assert on_ray.returncode == 0, on_ray.stderr
    assert "27 replays computed on ray" in on_ray.stderr
    expected, got = _tree(tmp_path / "local" / "out"), _tree(tmp_path / "ray" / "out")
    # per run: 9 replays, result.json, dataset, its attribution table and memo; summary
    # and attribution (2 + 2), the lock
    assert len(expected) == 3 * (9 + 1 + 2 + 1 + 1) + 5
    assert got.keys() == expected.keys()
    differ = [name for name in expected if got[name] != expected[name]]
    assert not differ, differ


@pytest.mark.ray
def test_a_bad_run_in_a_ray_task_is_dsims_one_line(tmp_path: Path) -> None:
    """An input error raised inside a task reaches the user as dsim's own line and exit
    code, not as Ray's wrapped traceback."""
    _traces(tmp_path)
    (tmp_path / "traces" / "rb" / "train.parquet").write_bytes(b"not parquet")
    proc = run_dsim(
        "run", *RUNS, "--out", "out", "--executor", "ray", "--num-cpus", "2", cwd=tmp_path
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("dsim: error: "), proc.stderr
    assert "train.parquet" in proc.stderr and "Traceback" not in proc.stderr
