"""Results are trusted only with their provenance: the real CLI on real `dsim run` output.

`result.json` lists the replays of the last completed `dsim run` of a run;
summarize and report refuse replays that do not match it, ignore stale ones
with a note, skip run directories without it, and detect corrupted pages.
Their refusals (one line and exit 3 each, no replay) and notes go through the CLI's
entry point in-process (conftest's ``run_dsim_in_process``); `dsim run` stays a subprocess,
and so does one `dsim summarize` (the JSON writer's).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_dsim, run_dsim_in_process
from tracegen import write_synthetic

from dsim.model.results import replay_table, write_replay, write_result_info

RUN = "synth_run"
OTHER = "other_run"


def _conf(directory: Path, name: str, **extra: object) -> str:
    conf = {"FILE": [RUN, OTHER], "FETCH_ALIGN": [False, "avg", "min"]}
    conf.update({"START_ALIGN": [False, "avg", "min"], **extra})
    (directory / name).write_text(json.dumps(conf), encoding="utf-8")
    return name


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two parsed runs, replayed once under all nine policies into ./results: one `dsim run`
    for the module (never changed: each test edits its own copy, ``project``)."""
    root = tmp_path_factory.mktemp("replayed")
    write_synthetic(root / "traces", RUN, iterations=30, seed=0)
    write_synthetic(root / "traces", OTHER, iterations=30, seed=1)
    proc = run_dsim("run", "--conf", _conf(root, "sim_conf.json"), "--quiet", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture
def project(replayed: Path, tmp_path: Path) -> Path:
    """A fresh copy of ``replayed`` (nothing in it names its directory: result.json and the
    replays' metadata hold content hashes and relative names)."""
    return Path(shutil.copytree(replayed, tmp_path / "project", symlinks=True))


def _fails(proc, needle: str, code: int = 3) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert needle in line, line
    return line


def test_replays_record_their_provenance(project: Path) -> None:
    info = json.loads((project / "results" / RUN / "result.json").read_text())
    meta = json.loads(
        pq.read_schema(project / "results" / RUN / "avg__min.parquet").metadata[b"dsim"]
    )
    assert meta["run"] == RUN and (meta["fetch_align"], meta["start_align"]) == ("avg", "min")
    assert meta["model"] == info["model"] == "per-iteration"
    assert meta["input"] == info["input"] and set(meta["input"]) == {
        "fetch.parquet",
        "train.parquet",
    }
    assert meta["params"] == info["params"] == {"stall_floor_s": 2e-06, "stall_grow_min_s": 0.01}
    assert meta["key"] == info["policies"]["avg__min"]


def test_replay_copied_from_another_run_is_refused(project: Path) -> None:
    results = project / "results"
    shutil.copy(results / OTHER / "avg__min.parquet", results / RUN / "avg__min.parquet")
    for command in (["summarize", "results"], ["report", "results", "--out", "r.html"]):
        line = _fails(run_dsim_in_process(*command, cwd=project), "avg__min.parquet")
        assert f"replay of run '{OTHER}', not of '{RUN}'" in line
        assert "re-run `dsim run` for this run" in line
    assert not (project / "r.html").exists()


def test_replay_of_other_parameters_is_refused(project: Path) -> None:
    """A replay left by another (e.g. interrupted) `dsim run` with other parameters: never mixed."""
    conf = _conf(project, "other.json", stall_grow_min_s=0.5)
    proc = run_dsim("run", "--conf", conf, "--out", "elsewhere", "--quiet", cwd=project)
    assert proc.returncode == 0, proc.stderr
    shutil.copy(project / "elsewhere" / RUN / "min__avg.parquet", project / "results" / RUN)
    line = _fails(run_dsim_in_process("summarize", "results", cwd=project), "min__avg.parquet")
    assert "made with other replay parameters than result.json lists" in line
    # `dsim run` repairs it: the foreign replay's key is not the config's, so it is recomputed
    proc = run_dsim("run", "--conf", "sim_conf.json", cwd=project)
    assert proc.returncode == 0 and "1 replay computed" in proc.stderr, proc.stderr
    assert run_dsim_in_process("summarize", "results", "--quiet", cwd=project).returncode == 0


def test_replay_claiming_another_policy_is_refused(project: Path) -> None:
    run_dir = project / "results" / RUN
    shutil.copy(run_dir / "min__min.parquet", run_dir / "avg__avg.parquet")
    line = _fails(run_dsim_in_process("summarize", "results", cwd=project), "avg__avg.parquet")
    assert "holds policy min/min, not the avg/avg its name says" in line


def test_listed_replay_missing_is_refused(project: Path) -> None:
    (project / "results" / RUN / "avg__avg.parquet").unlink()
    line = _fails(run_dsim_in_process("summarize", "results", cwd=project), "avg__avg.parquet")
    assert "result.json lists policy avg/avg but its replay is not there" in line


def test_stale_replays_are_ignored_with_one_note_and_reused(project: Path) -> None:
    few = _conf(project, "few.json", FETCH_ALIGN=["avg"], START_ALIGN=["min"])
    proc = run_dsim("run", "--conf", few, cwd=project)
    assert proc.returncode == 0 and "0 replays computed" in proc.stderr, proc.stderr
    info = json.loads((project / "results" / RUN / "result.json").read_text())
    assert sorted(info["policies"]) == ["actual__actual", "avg__min"]
    assert len(list((project / "results" / RUN).glob("*.parquet"))) == 9  # nothing deleted

    proc = run_dsim_in_process("summarize", "results", "--out", "s", "--format", "csv", cwd=project)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "stale" in line]
    assert notes == [
        f"dsim: note: ignored 7 stale replays in results/{run}/ not made by its last `dsim run`"
        for run in (OTHER, RUN)
    ]
    summary = (project / "s" / "summary.csv").read_text().splitlines()
    assert len(summary) == 1 + 2 * 2  # header + two policies of two runs, stale ones left out

    proc = run_dsim_in_process("report", "results", "--out", "r.html", cwd=project)
    assert proc.returncode == 0 and proc.stderr.count("stale replays") == 2, proc.stderr

    proc = run_dsim("run", "--conf", "sim_conf.json", cwd=project)  # the policies come back
    assert proc.returncode == 0 and "0 replays computed, 18 reused" in proc.stderr
    proc = run_dsim_in_process("summarize", "results", cwd=project)
    assert proc.returncode == 0 and "stale" not in proc.stderr


def test_run_directory_without_result_json_is_reported(project: Path) -> None:
    (project / "results" / OTHER / "result.json").unlink()
    proc = run_dsim_in_process("summarize", "results", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert f"dsim: note: results/{OTHER}: no result.json (an interrupted `dsim run`?); skipped" in (
        proc.stderr
    )
    assert RUN in proc.stdout and OTHER not in proc.stdout

    (project / "results" / RUN / "result.json").unlink()
    line = _fails(run_dsim_in_process("summarize", "results", cwd=project), "no dsim results here")
    assert "hold(s) replays but no result.json" in line
    line = _fails(
        run_dsim_in_process("summarize", f"results/{RUN}", cwd=project), "no result.json here"
    )


def _flip_in_data_page(path: Path, column: str) -> None:
    """Flip one byte near the end of a column chunk: inside its last data page's values."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    index = [meta.column(i).path_in_schema for i in range(meta.num_columns)].index(column)
    chunk = meta.column(index)
    begin = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[begin + chunk.total_compressed_size - 8] ^= 0x5A
    path.write_bytes(bytes(data))


def test_corrupted_replay_page_is_detected(project: Path) -> None:
    """The replays' numbers are in the dataset files (the replay files are stubs, §7.1):
    a flipped bit there is refused by name, and `dsim run --force` rewrites them."""
    path = project / "results" / "dataset" / "iterations" / f"{RUN}.parquet"
    _flip_in_data_page(path, "iteration_s")
    for command in (["summarize", "results"], ["report", "results", "--out", "r.html"]):
        line = _fails(run_dsim_in_process(*command, cwd=project), str(path.relative_to(project)))
        assert "corrupted Parquet data (checksum mismatch)" in line
        assert "re-run `dsim run --force` for this run" in line
    again = run_dsim("run", "--conf", "sim_conf.json", "--force", "-q", cwd=project)
    assert again.returncode == 0, again.stderr
    assert run_dsim_in_process("summarize", "results", cwd=project).returncode == 0


def test_corrupted_table_page_is_detected(project: Path) -> None:
    path = project / "traces" / RUN / "fetch.parquet"
    _flip_in_data_page(path, "fetch_s")
    line = _fails(run_dsim("run", RUN, "--force", cwd=project), "fetch.parquet")
    assert "corrupted Parquet data (checksum mismatch): re-run `dsim parse`" in line


def test_json_summary_writes_null_for_non_finite_values(tmp_path: Path) -> None:
    """A std over one iteration (NaN) and an infinite mean must not break the JSON writer."""
    epoch, iteration = np.array([1, 1], np.int32), np.array([0, 1], np.int32)
    for policy, value in ((("actual", "actual"), 1.0), (("avg", "min"), np.inf)):
        metrics = {m: np.array([value, value]) for m in ("iteration_s", "stall_s", "delay_s")}
        metrics |= {"fetch_diff_s": np.zeros(2), "start_diff_s": np.zeros(2)}
        stall = np.zeros((2, 1))
        table = replay_table(
            epoch, iteration, metrics, np.arange(1), stall, run="r", policy=policy, key="k"
        )
        write_replay(table, tmp_path / "res")
    info = {"summary": {"epochs": [1], "warmup": 0}, "policies": {"actual__actual": "k"}}
    info["policies"]["avg__min"] = "k"
    write_result_info(info, tmp_path / "res", "r")
    proc = run_dsim("summarize", "res", "--out", "out", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {
        (r["fetch_align"], r["start_align"]): r
        for r in json.loads((tmp_path / "out" / "summary.json").read_text())
    }
    assert rows[("actual", "actual")]["iteration_s_std"] is None  # NaN: one iteration selected
    assert rows[("avg", "min")]["iteration_s_mean"] is None  # inf
    assert rows[("avg", "min")]["speedup"] == 0.0
