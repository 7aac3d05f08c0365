"""Nothing written or deleted outside ``--out``, nor a directory dsim did not write (#20).

The reproductions are the real CLI (the refused run names, one message and exit 2
each, in-process: conftest's ``run_dsim_in_process``): run names that are paths,
a log file whose name gives the run name ``.``, a user's directory or a link
where a run directory would go, a link planted at the lock file, and a
results directory written by a newer dsim.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import run_dsim, run_dsim_in_process
from loglines import one_epoch
from tracegen import write_synthetic

import dsim.api
from dsim.errors import OutputError, UsageError
from dsim.io.lock import exclusive, shared
from dsim.io.names import check_run_name, name_problem
from dsim.model.resultinfo import RESULTS_FORMAT_VERSION


def _log(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(one_epoch(gpus=(0, 1), iters=3)) + "\n")
    return path


def _tree(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` and its bytes: what must survive a refused command."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


@pytest.mark.parametrize("name", ["ok", "a b", "r\u00e9sum\u00e9", "a.b", "x" * 200])
def test_good_names_pass(name):
    assert name_problem(name) is None and check_run_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        ".hidden",
        "../x",
        "/abs",
        "a/b",
        "a\\b",
        "a\nb",
        "a\x00b",
        " a",
        "x" * 201,
        "a@pipeline",
    ],
)
def test_bad_names_are_refused(name):
    with pytest.raises(UsageError, match="is not a valid run name"):
        check_run_name(name)


@pytest.mark.parametrize("name", ["../mydata", ".", "ABS"])
def test_parse_name_cannot_leave_out(tmp_path, name):
    log = _log(tmp_path / "logs" / "run1" / "output.log")
    mydata = tmp_path / "mydata"
    mydata.mkdir()
    (mydata / "thesis.tex").write_text("years of work")
    dsim.api.parse(log, out=tmp_path / "traces")
    before = _tree(tmp_path)
    name = str(tmp_path / "abs" / "path") if name == "ABS" else name
    result = run_dsim_in_process("parse", log, "--name", name, "--out", "traces", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "is not a valid run name" in result.stderr and "Traceback" not in result.stderr
    assert _tree(tmp_path) == before  # mydata/ and the run already in traces/ untouched
    assert not (tmp_path / "abs").exists()


def test_log_file_named_dotdot_log_does_not_wipe_out(tmp_path):
    dsim.api.parse(_log(tmp_path / "logs" / "run1" / "output.log"), out=tmp_path / "traces")
    bad = _log(tmp_path / "..log")
    before = _tree(tmp_path / "traces")
    result = run_dsim_in_process("parse", bad.name, "--out", "traces", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "..log: the run name '.'" in result.stderr and "--name" in result.stderr
    assert _tree(tmp_path / "traces") == before
    dsim.api.parse(bad, out=tmp_path / "traces", name="dots")  # what the message suggests
    assert (tmp_path / "traces" / "dots" / "run.json").is_file()


def test_parse_replaces_only_its_own_run_directories(tmp_path):
    log = _log(tmp_path / "logs" / "run1" / "output.log")
    traces = tmp_path / "traces"
    (traces / "mine").mkdir(parents=True)
    (traces / "mine" / "notes.txt").write_text("keep")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "run.json").write_text('{"format_version": 1}')
    (traces / "link").symlink_to(elsewhere)
    (traces / "empty").mkdir()
    before = _tree(tmp_path)
    for name, message in (("mine", "not a run directory dsim wrote"), ("link", "symbolic link")):
        with pytest.raises(OutputError, match=message):
            dsim.api.parse(log, out=traces, name=name)
    assert _tree(tmp_path) == before and (traces / "link").is_symlink()
    dsim.api.parse(log, out=traces, name="empty")  # an empty directory holds nothing to lose
    dsim.api.parse(log, out=traces, name="empty")  # and its own run directory is replaced
    assert (traces / "empty" / "run.json").is_file()
    info = traces / "empty" / "run.json"
    info.write_text(info.read_text().replace('"format_version": 1', '"format_version": 2'))
    with pytest.raises(OutputError, match=r"written by a newer dsim \(format 2"):
        dsim.api.parse(log, out=traces, name="empty")


def test_results_in_the_traces_directory_are_refused_and_never_replaced(tmp_path):
    """`dsim run --out T --traces T` put result.json and the replays inside the parsed run
    directories, and the next `dsim parse --out T` replaced them without a word."""
    log = _log(tmp_path / "logs" / "run1" / "output.log")
    traces = tmp_path / "traces"
    dsim.api.parse(log, out=traces, name="run1")
    proc = run_dsim("run", "run1", "--traces", traces, "--out", traces, "--executor", "local")
    assert proc.returncode == 2 and "is the traces directory" in proc.stderr, proc.stderr
    assert not (traces / "run1" / "result.json").exists()
    for inside in (traces / "run1", traces / "run1" / "deeper"):
        # results inside a parsed run: the next parse of it replaced them, with exit 0
        proc = run_dsim_in_process("run", "run1", "--traces", traces, "--out", inside)
        assert proc.returncode == 2, proc.stderr
        assert f"is inside the parsed run {traces.resolve() / 'run1'}" in proc.stderr
        assert not inside.exists() or not (inside / "summary.parquet").exists()
    (traces / "run1" / "tune").mkdir()  # `dsim tune --out traces/run1` writes run1/tune/
    (traces / "run1" / "tune" / "run1.csv").write_text("kept")
    before = _tree(tmp_path)
    with pytest.raises(OutputError, match=r"holds tune beside its parsed run, which dsim parse"):
        dsim.api.parse(log, out=traces, name="run1")  # it replaced the run, tune table and all
    assert _tree(tmp_path) == before
    shutil.rmtree(traces / "run1" / "tune")
    (traces / "run1" / "result.json").write_text("{}")  # as an older dsim left it
    before = _tree(tmp_path)
    with pytest.raises(OutputError, match=r"holds dsim results \(result.json\)"):
        dsim.api.parse(log, out=traces, name="run1")
    assert _tree(tmp_path) == before


def test_symlink_at_lock_path_is_refused_and_its_target_kept(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("do not truncate me")
    (results / ".dsim.lock").symlink_to(target)
    write_synthetic(tmp_path / "traces", "r1")
    result = run_dsim(
        "run", "r1", "--traces", "traces", "--out", "results", "--executor", "local", cwd=tmp_path
    )
    assert result.returncode == 4, result.stderr
    assert "results/.dsim.lock is a symbolic link" in result.stderr
    assert "Traceback" not in result.stderr
    assert target.read_text() == "do not truncate me"
    with pytest.raises(OutputError, match="symbolic link"), shared([results]):
        pass


def test_lock_file_is_never_truncated_nor_a_hard_link(tmp_path):
    lock_path = tmp_path / ".dsim.lock"
    with exclusive(tmp_path):
        assert lock_path.read_text().strip() == str(os.getpid())
    assert lock_path.read_text().strip() == "" and lock_path.stat().st_size == 21
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "file").write_text("x" * 100)
    os.link(tmp_path / "file", other / ".dsim.lock")
    with pytest.raises(OutputError, match="hard link"), exclusive(other):
        pass
    assert (tmp_path / "file").read_text() == "x" * 100


def test_run_never_downgrades_a_newer_result_json(tmp_path):
    write_synthetic(tmp_path / "traces", "r1")
    run_dir = tmp_path / "results" / "r1"
    run_dir.mkdir(parents=True)
    newer = {"format_version": RESULTS_FORMAT_VERSION + 1, "run": "r1", "policies": {}}
    newer["future"] = True
    (run_dir / "result.json").write_text(json.dumps(newer))
    result = run_dsim(
        "run", "r1", "--traces", "traces", "--out", "results", "--executor", "local", "--force",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert f"written by a newer dsim (format {RESULTS_FORMAT_VERSION + 1}" in result.stderr
    assert "upgrade dsim or choose another --out" in result.stderr
    assert json.loads((run_dir / "result.json").read_text()) == newer
    assert sorted(p.name for p in run_dir.iterdir()) == ["result.json"]


@pytest.mark.parametrize("case", ["parse into it", "parse below it", "summarize below it"])
def test_a_file_in_the_way_of_an_output_directory_is_named(tmp_path, case):
    """These said "cannot write ...: File exists" (mkdir's words), where `report` said
    which path is a file; now every command names it."""
    block = tmp_path / "block"
    block.write_text("in the way")
    if case.startswith("parse"):
        out = block if case == "parse into it" else block / "sub"
        proc = run_dsim("parse", _log(tmp_path / "logs" / "run1" / "output.log"), "--out", out)
    else:
        traces, results = tmp_path / "traces", tmp_path / "results"
        write_synthetic(traces, "run1", iterations=40)
        assert run_dsim("run", "run1", "--traces", traces, "--out", results).returncode == 0
        proc = run_dsim("summarize", results, "--out", block / "x")
    assert proc.returncode == 4, proc.stderr
    assert f"{block} is a file, not a directory" in proc.stderr, proc.stderr
    assert block.read_text() == "in the way"
