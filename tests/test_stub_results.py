"""Results format 2 (docs/SPEC.md §7.1): one stored copy of the replayed numbers.

Issue #21 item 5: results took ~1.07-1.22x the traces on disk because the tidy
dataset copied every replay. Now the dataset files are the stored copy and each
replay file becomes a zero-row stub (its key, run, policy and provenance) once
they are in place. These tests hold the rules that made that safe: per-policy
resume (§7.2), provenance (§7.3), readers unchanged, version 1 results unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_dsim, run_dsim_in_process
from tracegen import write_synthetic

import dsim
from dsim.app import runtask
from dsim.app.run import run_replays
from dsim.config import Overrides, load_config
from dsim.errors import InputError
from dsim.io.atomic import write_parquet
from dsim.model import datasetfiles
from dsim.model import results as results_module
from dsim.model.dataset import (
    GPUS_SCHEMA,
    ITERATIONS_SCHEMA,
    gpu_pieces,
    iterations_table,
    run_frames,
)
from dsim.model.resultinfo import RESULT_FILE, RESULTS_FORMAT_VERSION, ResultInfo
from dsim.model.results import (
    REPLAY_FORMAT_VERSION,
    STUB_FORMAT_VERSION,
    find_result_runs,
    load_replay,
    replay_metadata,
    stub_replays,
    unstub_stale,
    write_stub,
)
from dsim.model.runinfo import check_version

RUN = "stubbed"


def _config(root: Path, **kwargs):
    overrides = Overrides(
        runs=(RUN,), traces=root / "traces", out=root / "out", executor="local", **kwargs
    )
    return load_config(None, overrides)


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    write_synthetic(tmp_path / "traces", RUN, gpus=3, iterations=25, seed=5)
    return tmp_path


def _formats(run_dir: Path) -> dict[str, int]:
    """Each replay file's format version, by file name."""
    return {
        p.name: replay_metadata(pq.read_schema(p), p)["format_version"]
        for p in sorted(run_dir.glob("*__*.parquet"))
    }


def _files(root: Path, *, summary: bool = True) -> dict[str, bytes]:
    """Every file under ``root`` but the lock; without ``summary.*`` (whose ``results``
    column names the directory) to compare two results directories."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".dsim.lock" and (summary or p.stem != "summary")
    }


def _no_stubs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dsim run`` as before format 2: replays left whole (what version 1 wrote). A
    computed replay is written once, as a stub; here its stub is written back whole from
    the dataset, the bytes ``write_replay`` gives (``unstub_stale``'s rule)."""

    def whole(table: pa.Table, out: Path) -> Path:
        path = write_stub(table, out)
        replay, _ = load_replay(path, remedy="test")
        write_parquet(replay, path)
        return path

    monkeypatch.setattr(runtask, "write_stub", whole)
    monkeypatch.setattr(runtask, "stub_replays", lambda *args: [])


def test_stubs_after_a_run_and_after_force(traces: Path) -> None:
    run_replays(_config(traces))
    run_dir = traces / "out" / RUN
    assert set(_formats(run_dir).values()) == {STUB_FORMAT_VERSION} and len(_formats(run_dir)) == 9
    for path in run_dir.glob("*__*.parquet"):
        assert pq.read_metadata(path).num_rows == 0 and pq.read_metadata(path).num_columns == 0
    assert json.loads((run_dir / RESULT_FILE).read_text())["format_version"] == 2
    first = _files(traces / "out")

    outcome = run_replays(_config(traces), force=True)
    assert outcome.computed == 9
    assert set(_formats(run_dir).values()) == {STUB_FORMAT_VERSION}
    assert _files(traces / "out") == first  # the same stubs, the same dataset bytes


def test_a_stub_reads_as_the_whole_replay_it_replaced(
    traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader's table from a stub is the whole replay's, metadata included; a stale
    stub written back is the very file it was."""
    with monkeypatch.context() as patch:
        _no_stubs(patch)
        run_replays(_config(traces))
    run_dir = traces / "out" / RUN
    assert set(_formats(run_dir).values()) == {REPLAY_FORMAT_VERSION}
    whole = {p.name: p.read_bytes() for p in run_dir.glob("*__*.parquet")}
    before = {
        p: find_result_runs([run_dir])[0].read(p) for p in find_result_runs([run_dir])[0].keys
    }

    info = ResultInfo.load(run_dir)
    stubs = stub_replays(traces / "out", RUN, info.policies)
    assert len(stubs) == 9 and set(_formats(run_dir).values()) == {STUB_FORMAT_VERSION}
    run = find_result_runs([run_dir])[0]
    run.verify()
    for policy, table in before.items():
        again = run.read(policy)
        assert again.equals(table) and again.schema.metadata == table.schema.metadata
        narrow = run.read(policy, gpus=False)
        assert narrow.column_names == table.column_names[:7]
        assert narrow.equals(table.select(narrow.column_names))

    written = unstub_stale(traces / "out", RUN, {})  # every policy dropped: all written back
    assert len(written) == 9
    assert {p.name: p.read_bytes() for p in run_dir.glob("*__*.parquet")} == whole


def test_an_interrupted_run_resumes_per_run_directory(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A computed replay is written once, as its stub, after the dataset holding its rows
    is in place (issue #21 item 1: written whole first, it was 13 % of a fresh run, and
    the dataset is rebuilt whole whenever a policy is replayed anyway): a run stopped
    after four policies leaves no replay and no dataset, and the re-run computes all nine
    and writes the files an uninterrupted run writes."""
    reference = tmp_path / "reference"
    reference.mkdir()
    shutil.copytree(traces / "traces", reference / "traces")
    run_replays(_config(reference))

    real = runtask._replay
    done: list[object] = []

    def stopping(plan, prepared, policy, *args):
        if len(done) == 4:
            raise KeyboardInterrupt
        done.append(policy)
        return real(plan, prepared, policy, *args)

    with monkeypatch.context() as patch:
        patch.setattr(runtask, "_replay", stopping)
        with pytest.raises(KeyboardInterrupt):
            run_replays(_config(traces))
    run_dir = traces / "out" / RUN
    assert not list(run_dir.glob("*__*.parquet"))
    assert not (traces / "out" / "dataset" / "iterations" / f"{RUN}.parquet").exists()

    outcome = run_replays(_config(traces))
    assert (outcome.computed, outcome.cached) == (9, 0)
    assert _files(traces / "out", summary=False) == _files(reference / "out", summary=False)


def test_a_computed_replay_is_written_once(traces: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each replay file of a fresh run is written once (its stub), not whole and then
    again as a stub: the Parquet writes of replay files are counted."""
    writes: list[str] = []
    real = results_module.write_parquet

    def counted(table: pa.Table, target: Path) -> None:
        writes.append(Path(target).name)
        real(table, target)

    monkeypatch.setattr(results_module, "write_parquet", counted)
    monkeypatch.setattr(runtask, "write_parquet", counted)
    run_replays(_config(traces))
    replays = [name for name in writes if "__" in name]
    assert len(replays) == 9 and len(set(replays)) == 9
    assert set(_formats(traces / "out" / RUN).values()) == {STUB_FORMAT_VERSION}


@pytest.mark.parametrize("damage", ["missing", "stale"])
def test_a_stub_without_its_dataset_rows_is_refused_and_recomputed(
    traces: Path, damage: str
) -> None:
    out = traces / "out"
    write_synthetic(traces / "traces", "other", gpus=3, iterations=25, seed=6)
    for name in (RUN, "other"):
        overrides = Overrides(runs=(name,), traces=traces / "traces", out=out, executor="local")
        run_replays(load_config(None, overrides))
    reference = _files(out)
    path = datasetfiles.dataset_path(out, datasetfiles.GPUS, RUN)
    if damage == "missing":
        path.unlink()
    else:  # a dataset file of other replays: another run's, under this run's name
        shutil.copy(datasetfiles.dataset_path(out, datasetfiles.GPUS, "other"), path)
    for command in (["summarize", "out"], ["report", "out", "--out", "r.html"]):
        proc = run_dsim_in_process(*command, cwd=traces)  # one line, exit 3 (conftest)
        assert proc.returncode == 3, proc.stderr
        line = proc.stderr.strip()
        assert "\n" not in line and f"out/{RUN}/actual__actual.parquet: " in line, line
        assert "which are missing or were built from other replays" in line, line
        assert line.endswith("re-run `dsim run` for this run"), line
    with pytest.raises(InputError, match="missing or were built from other replays"):
        find_result_runs([out / RUN])[0].verify()

    outcome = run_replays(_config(traces))
    assert (outcome.computed, outcome.cached) == (9, 0)
    assert set(_formats(out / RUN).values()) == {STUB_FORMAT_VERSION}
    assert _files(out) == reference
    assert run_dsim("summarize", "out", cwd=traces).returncode == 0


def _version_1(traces: Path, monkeypatch: pytest.MonkeyPatch, *, dataset: bool) -> Path:
    """Results as dsim wrote them before format 2: whole replays, ``result.json``
    version 1 (its only difference), with or without the dataset files."""
    with monkeypatch.context() as patch:
        _no_stubs(patch)
        run_replays(_config(traces))
    info = traces / "out" / RUN / RESULT_FILE
    info.write_text(info.read_text().replace('"format_version": 2,', '"format_version": 1,', 1))
    if not dataset:
        shutil.rmtree(traces / "out" / "dataset")
    return traces / "out"


@pytest.mark.parametrize("dataset", [True, False], ids=["with-dataset", "before-dataset"])
def test_version_1_results_read_unchanged_and_upgrade_without_recomputing(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dataset: bool
) -> None:
    new = tmp_path / "new"
    new.mkdir()
    shutil.copytree(traces / "traces", new / "traces")
    run_replays(_config(new))
    old = _version_1(traces, monkeypatch, dataset=dataset)
    assert ResultInfo.load(old / RUN).format_version == 1

    outputs = {}
    for root in (traces, new):
        proc = run_dsim("summarize", "out", "--format", "csv", "--out", "-", cwd=root)
        assert proc.returncode == 0, proc.stderr
        outputs[root] = proc.stdout
    assert outputs[traces] == outputs[new]

    outcome = run_replays(_config(traces))  # the upgrade: stubs, no replay recomputed
    assert (outcome.computed, outcome.cached) == (0, 9)
    assert _files(traces / "out", summary=False) == _files(new / "out", summary=False)


def test_a_stub_read_by_the_rules_of_version_1_gives_the_format_message(traces: Path) -> None:
    run_replays(_config(traces))
    path = traces / "out" / RUN / "min__min.parquet"
    with pytest.raises(InputError) as caught:
        replay_metadata(pq.read_schema(path), path, versions=(1,))
    assert str(caught.value) == (
        f"{path}: replay written by another dsim results format (2, expected 1); "
        "re-run `dsim run --force`"
    )
    document = json.loads((traces / "out" / RUN / RESULT_FILE).read_text())
    with pytest.raises(InputError, match=r"newer dsim \(format_version 2; this dsim reads 1\)"):
        check_version(document, 1, path, "result description", "re-run `dsim run --force`")
    assert RESULTS_FORMAT_VERSION == 2


def test_readers_give_the_same_outputs_from_stubs_on_the_sample_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dsim summarize`, `dsim report`, `load_results` and `dsim.model.dataset` on the
    shipped sample: the same output from whole replays (before format 2) and from stubs."""
    whole, stubbed = tmp_path / "whole", tmp_path / "stubbed"
    whole.mkdir()
    raw = Path(__file__).resolve().parents[1] / "traces" / "raw"
    proc = run_dsim_in_process("parse", raw, "--out", "traces", "-q", cwd=whole)  # one run
    assert proc.returncode == 0, proc.stderr
    (name,) = [p.name for p in (whole / "traces").iterdir() if p.is_dir()]
    monkeypatch.chdir(whole)
    with monkeypatch.context() as patch:
        _no_stubs(patch)
        overrides = Overrides(
            runs=(name,), traces=Path("traces"), out=Path("results"), executor="local"
        )
        run_replays(load_config(None, overrides))
    shutil.copytree(whole, stubbed)
    info = ResultInfo.load(stubbed / "results" / name)
    assert len(stub_replays(stubbed / "results", name, info.policies)) == 9
    assert set(_formats(whole / "results" / name).values()) == {REPLAY_FORMAT_VERSION}

    seen: dict[Path, list[object]] = {}
    for root in (whole, stubbed):
        monkeypatch.chdir(root)
        outputs: list[object] = []
        for command in (
            ["summarize", "results"],
            ["summarize", "results", "--json"],
            ["report", "results", "--out", "report.html"],
        ):
            # in-process (conftest): the subject is what the readers give, not start-up;
            # summarize and report keep their subprocess tests (six interpreters: ~8 s)
            proc = run_dsim_in_process(*command, cwd=root)
            assert proc.returncode == 0, proc.stderr
            outputs += [proc.stdout, proc.stderr]
        outputs.append((root / "report.html").read_bytes())
        results = dsim.load_results("results")
        outputs += [results.summary, results.iterations(), results.gpus()]
        outputs += list(run_frames(results.runs[0]))
        seen[root] = outputs
    for before, after in zip(seen[whole], seen[stubbed], strict=True):
        if hasattr(before, "equals"):
            assert before.equals(after)
        else:
            assert before == after


@pytest.mark.parametrize("statistics", [True, False], ids=["statistics", "no-statistics"])
def test_a_policy_sharing_a_row_group_is_read_by_its_rows(tmp_path: Path, statistics: bool) -> None:
    """dsim starts every policy's rows in a row group of their own, found by statistics;
    a dataset written otherwise (two policies in one row group, or no statistics, as
    another tool may write it) still gives each policy its own rows."""
    whole = {}
    parts: dict[str, list] = {"iterations": [], "gpus": []}
    ident = {"run": "r", "replay_model": "per-iteration", "loader_changed": False}
    ident |= {"loader_workers": None, "loader_prefetch_factor": None}
    for k, policy in enumerate([("actual", "actual"), ("min", "min")]):
        columns = {
            "epoch": pa.array([0, 0, 1], pa.int32()),
            "iteration": pa.array([1, 2, 1], pa.int32()),
        }
        for j, name in enumerate(("iteration_s", "stall_s", "delay_s", "fetch_diff_s")):
            columns[name] = pa.array([k + j + 0.5, k + j + 1.5, k + j + 2.5], pa.float64())
        columns["start_diff_s"] = pa.array([0.0, 0.1, 0.2], pa.float64())
        for rank in (3, 7):
            columns[f"stall_s_gpu{rank}"] = pa.array([rank + k, rank * 2.0, -k], pa.float64())
        whole[policy] = pa.table(columns)
        parts["iterations"].append(iterations_table(ident, policy, whole[policy]))
        parts["gpus"].extend(gpu_pieces(ident, policy, whole[policy]))
    for table, schema in (("iterations", ITERATIONS_SCHEMA), ("gpus", GPUS_SCHEMA)):
        path = datasetfiles.dataset_path(tmp_path, table, "r")
        path.parent.mkdir(parents=True)
        rows = pa.concat_tables(parts[table]).cast(schema)
        pq.write_table(rows, path, write_statistics=statistics)  # one row group for both
        assert pq.ParquetFile(path).metadata.num_row_groups == 1
    for policy, table in whole.items():
        got = datasetfiles.read_policy(tmp_path, "r", policy, (3, 7), remedy="re-run")
        assert got.equals(table)
