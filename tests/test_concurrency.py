"""Concurrent and killed processes: the lock, leftovers of killed writers, parse workers.

Real `dsim` subprocesses on real directories; nothing here asserts a timing.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import run_dsim, run_dsim_in_process
from tracegen import write_synthetic

from dsim.io.atomic import remove_leftovers

RUN = "synth_run"


def _dsim_popen(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "COLUMNS": "200"}
    env.pop("DSIM_DEBUG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "dsim", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _conf(directory: Path, name: str, runs: list[str], **extra: object) -> str:
    conf = {"FILE": runs, "FETCH_ALIGN": [False, "avg", "min"], "START_ALIGN": [False, "min"]}
    (directory / name).write_text(json.dumps({**conf, **extra}), encoding="utf-8")
    return name


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _wait_for_waiters(lock_file: Path, count: int, timeout: float = 120) -> None:
    """Until ``count`` processes are blocked on ``lock_file`` (Linux lists them in /proc/locks)."""
    inode = f":{lock_file.stat().st_ino} "
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            locks = Path("/proc/locks").read_text().splitlines()
        except OSError:  # not Linux: give them time instead
            time.sleep(3)
            return
        if sum(" -> " in line and inode in line for line in locks) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} processes ever waited for {lock_file}")


@pytest.mark.latest_only  # not in CI's floors phase: tests/test_dependency_floors.py says why
def test_two_runs_on_one_directory_take_turns(tmp_path: Path) -> None:
    """Different parameters and runs, one output directory: each prints its own numbers."""
    for seed, name in enumerate((RUN, "other_run")):
        write_synthetic(tmp_path / "traces", name, iterations=400, seed=seed)
    a = _conf(tmp_path, "a.json", [RUN])
    b = _conf(tmp_path, "b.json", [RUN, "other_run"], stall_grow_min_s=0.3, stall_floor_s=0.001)
    expected = {}
    for conf in (a, b):  # what each prints alone
        proc = _dsim_popen("run", "--conf", conf, "--out", f"alone_{conf}", cwd=tmp_path)
        expected[conf], err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert expected[a] != expected[b]

    # Hold the lock ourselves so that both really start together and wait for it.
    results = tmp_path / "results"
    results.mkdir()
    fd = os.open(results / ".dsim.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    procs = {conf: _dsim_popen("run", "--conf", conf, cwd=tmp_path) for conf in (a, b)}
    _wait_for_waiters(results / ".dsim.lock", 2)
    os.ftruncate(fd, 0)
    os.close(fd)
    outputs = {conf: proc.communicate(timeout=300) for conf, proc in procs.items()}
    for conf, (out, err) in outputs.items():
        assert procs[conf].returncode == 0, err
        assert out == expected[conf], conf
        assert f"waiting for another dsim run (pid {os.getpid()}) on results/ ..." in err
    # The directory is consistent: each run's result.json and every replay it lists are
    # byte for byte those of one of the two runs alone, and summarize accepts them.
    for run in (RUN, "other_run"):
        result = (results / run / "result.json").read_bytes()
        source = [c for c in (a, b) if (tmp_path / f"alone_{c}" / run / "result.json").is_file()]
        source = [
            c
            for c in source
            if (tmp_path / f"alone_{c}" / run / "result.json").read_bytes() == result
        ]
        assert source, run
        for label in json.loads(result)["policies"]:
            name = f"{label}.parquet"
            alone = tmp_path / f"alone_{source[0]}" / run / name
            assert (results / run / name).read_bytes() == alone.read_bytes(), (run, name)
    proc = run_dsim("summarize", "results", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not [p for p in results.rglob("*") if p.name.endswith(".tmp")]


def test_reader_waits_for_a_writer(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "traces", RUN, iterations=30)
    assert run_dsim("run", RUN, "--quiet", cwd=tmp_path).returncode == 0
    fd = os.open(tmp_path / "results" / ".dsim.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, b"4242\n", 0)
    reader = _dsim_popen("summarize", "results", cwd=tmp_path)
    _wait_for_waiters(tmp_path / "results" / ".dsim.lock", 1)
    assert reader.poll() is None  # still waiting
    os.close(fd)
    _, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err
    assert "dsim: waiting for dsim run (pid 4242) to finish writing results/ ..." in err


def test_read_only_results_are_read_without_a_lock(tmp_path: Path, monkeypatch) -> None:
    """Where no lock file can be opened (a read-only directory), readers go on without one."""
    from dsim.io import lock

    (tmp_path / "results").mkdir()
    real_open = os.open

    def read_only(path, flags, *args):
        if Path(path).name == lock.LOCK_FILE:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with lock.shared([tmp_path / "results", tmp_path / "missing"]):
        pass
    assert not (tmp_path / "results" / lock.LOCK_FILE).exists()


def _plant(directory: Path, name: str, *, is_dir: bool = False) -> Path:
    path = directory / name
    directory.mkdir(parents=True, exist_ok=True)
    if is_dir:
        path.mkdir()
        (path / "half.parquet").write_bytes(b"PAR1 half")
    else:
        path.write_bytes(b"half")
    return path


@pytest.mark.latest_only  # not in CI's floors phase: tests/test_dependency_floors.py says why
def test_leftovers_of_killed_writers_are_removed(tmp_path: Path) -> None:
    dead, alive = _dead_pid(), os.getpid()
    write_synthetic(tmp_path / "traces", RUN, iterations=30)
    results = tmp_path / "results"
    gone = [
        _plant(results, f".summary.csv.{dead}.abcd_123.tmp"),
        _plant(results / RUN, f".avg__min.parquet.{dead}.x1y2z3w4.tmp"),
        _plant(results / RUN, f".result.json.{dead}.qqqqqqqq.tmp"),
    ]
    kept = [
        _plant(results / RUN, f".avg__avg.parquet.{alive}.a0a0a0a0.tmp"),  # a live writer's
        _plant(results / RUN, "notes.txt"),  # not dsim's
    ]
    proc = run_dsim("run", RUN, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [p for p in gone if p.exists()] == [] and all(p.exists() for p in kept)

    # dsim parse: the out directory, including atomic_dir's directories
    logs = tmp_path / "logs"
    assert (
        run_dsim(
            "synth",
            "--gpus",
            "2",
            "--iterations",
            "20",
            "--epochs",
            "1",
            "--workers",
            "1",
            "--out",
            "logs",
            cwd=tmp_path,
        ).returncode
        == 0
    )
    (log_run,) = [p.name for p in logs.iterdir()]
    traces = tmp_path / "parsed"
    gone = [_plant(traces, f".{log_run}.{dead}.k9k9k9k9.tmp", is_dir=True)]
    old = _plant(traces, f".{log_run}.old-{dead}", is_dir=True)  # its target is missing
    (old / "run.json").write_text('{"format_version": 1}')  # a run directory dsim wrote
    proc = run_dsim("parse", "logs", "--out", "parsed", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not gone[0].exists() and not old.exists()
    assert (traces / log_run / "run.json").is_file()

    # dsim report: its directory
    stale = _plant(tmp_path / "pages", f".r.html.{dead}.zzzzzzzz.tmp")
    proc = run_dsim("report", "results", "--out", "pages/r.html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and (tmp_path / "pages" / "r.html").is_file()


def test_swapped_out_directory_is_restored_or_removed(tmp_path: Path) -> None:
    dead = _dead_pid()
    old = _plant(tmp_path, f".run1.old-{dead}", is_dir=True)
    assert remove_leftovers(tmp_path) == [old]
    assert (tmp_path / "run1" / "half.parquet").is_file()  # the previous version is back
    old = _plant(tmp_path, f".run1.old-{dead}", is_dir=True)
    remove_leftovers(tmp_path)
    assert not old.exists() and (tmp_path / "run1").is_dir()


def _children(pid: int, at_least: int, timeout: float = 60) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = psutil.Process(pid).children(recursive=True)
        if len(found) >= at_least:
            return found
        time.sleep(0.02)
    raise AssertionError("the parse never started its workers")


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="psutil children on Linux")
def test_parse_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    for seed in (1, 2, 3):
        args = ["--gpus", "4", "--iterations", "20000", "--epochs", "2", "--workers", "2"]
        args += ["--seed", str(seed)]
        made = run_dsim_in_process("synth", *args, "--out", "logs", cwd=tmp_path)  # inputs
        assert made.returncode == 0, made.stderr
    parent = subprocess.Popen(
        [sys.executable, "-m", "dsim", "parse", "logs", "--out", "traces", "--jobs", "2"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,  # a surviving worker would hold pipes open
        stderr=subprocess.DEVNULL,
    )
    workers = _children(parent.pid, 2)
    try:
        time.sleep(0.5)  # mid-parse: a run takes seconds
        written = sorted((tmp_path / "traces").glob("*/run.json"))
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 2
        while _running(workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _running(workers) == []
        time.sleep(3)  # a surviving worker would finish and write its run meanwhile
        assert sorted((tmp_path / "traces").glob("*/run.json")) == written
    finally:
        for worker in _running(workers):  # only when the test fails: leave no orphans
            worker.kill()
