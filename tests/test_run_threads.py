"""In-process `dsim run` finishes runs side by side on threads, with the serial loop's outcome.

Issue #21 item 1: most of a run's finish is pyarrow, NumPy and pandas, which release
the GIL, so the in-process executor finishes a few runs at once
(``dsim.execute.threads``). What must not change: every file byte for byte, the
first error in config order, nothing half-written, a prompt and clean Ctrl-C.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tracegen import write_synthetic

from dsim.app import run as app_run
from dsim.app.run import run_replays
from dsim.config import Overrides, load_config
from dsim.errors import InputError
from dsim.execute import threads as run_threads
from dsim.execute.threads import Cancelled, map_in_order, thread_count
from dsim.io import atomic

RUNS = ("ra", "rb", "rc")
TEMP = re.compile(r"^\.(.+)\.([0-9]+)\.[a-z0-9_]{8}\.tmp$|^\.(.+)\.old-([0-9]+)$")


def _traces(root: Path, runs: tuple[str, ...] = RUNS, iterations: int = 30) -> None:
    for k, name in enumerate(runs):
        write_synthetic(root / "traces", name, iterations=iterations, seed=21 + k)


def _config(root: Path, runs: tuple[str, ...] = RUNS, **kwargs):
    overrides = Overrides(
        runs=runs, traces=root / "traces", out=root / "out", executor="local", **kwargs
    )
    return load_config(None, overrides)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if TEMP.match(p.name)]


# -- the thread count ---------------------------------------------------------------------


def test_thread_count_is_runs_then_cpus_then_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_threads, "usable_cores", lambda: 2)
    assert thread_count(1) == 1  # one run: no pool
    assert thread_count(0) == 1
    assert thread_count(5) == 2  # the usable cores
    assert thread_count(5, num_cpus=3) == 3  # num_cpus configured beats the cores
    assert thread_count(50, num_cpus=64) == run_threads.MAX_THREADS  # each holds a run
    monkeypatch.undo()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert run_threads.usable_cores() == 3  # the affinity mask, not os.cpu_count()


# -- map_in_order ---------------------------------------------------------------------------


def test_one_item_or_one_thread_runs_in_the_calling_thread() -> None:
    where: list[bool] = []

    def record(k: int, checkpoint) -> int:
        where.append(threading.current_thread() is threading.main_thread())
        return k * 10

    assert map_in_order(record, 1, threads=4) == [0]
    assert map_in_order(record, 3, threads=1) == [0, 10, 20]
    assert where == [True] * 4
    assert map_in_order(record, 3, threads=2) == [0, 10, 20]  # results in order
    assert where[4:] == [False] * 3


def test_the_first_error_in_order_is_raised_and_later_items_are_not_started() -> None:
    """Item 1 fails first in time, item 0 later: item 0's error is the serial loop's.
    Item 2 comes after a failure and is never started."""
    one_failed = threading.Event()
    started: list[int] = []

    def work(k: int, checkpoint) -> int:
        started.append(k)
        if k == 0:
            assert one_failed.wait(10)
            time.sleep(0.2)  # item 1's thread is free meanwhile: it must not take item 2
            raise ValueError("item 0")
        if k == 1:
            one_failed.set()
            raise ValueError("item 1")
        return k

    with pytest.raises(ValueError, match="item 0"):
        map_in_order(work, 3, threads=2)
    assert sorted(started) == [0, 1]


def test_an_item_after_a_failed_one_is_cancelled_at_its_checkpoint() -> None:
    """Item 0 fails while item 1 runs: item 1 stops at its next checkpoint, its finally
    blocks run, and item 0's error is raised once it has."""
    running = threading.Event()
    unwound: list[int] = []
    cancelled: list[int] = []

    def work(k: int, checkpoint) -> int:
        if k == 0:
            assert running.wait(10)
            raise ValueError("item 0")
        running.set()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                checkpoint()
                time.sleep(0.005)
            return k  # never cancelled: the test fails below
        except Cancelled:
            cancelled.append(k)
            raise
        finally:
            unwound.append(k)

    with pytest.raises(ValueError, match="item 0"):
        map_in_order(work, 2, threads=2)
    assert cancelled == [1] and unwound == [1]


def test_an_interrupt_stops_every_worker_at_its_checkpoint_and_waits_for_them() -> None:
    """A signal reaches the main thread, which waits: every worker is cancelled at its
    next checkpoint and has run its finally blocks before the interrupt goes on up; the
    items not started are not started."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    unwound: list[int] = []
    started: list[int] = []
    both = threading.Barrier(2, timeout=10)

    def work(k: int, checkpoint) -> int:
        started.append(k)
        try:
            both.wait()
            if k == 1:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                checkpoint()
                time.sleep(0.005)
            return k
        finally:
            time.sleep(0.05)  # a cleanup that takes a moment: it is waited for
            unwound.append(k)

    try:
        with pytest.raises(KeyboardInterrupt):
            map_in_order(work, 4, threads=2)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(unwound) == [0, 1] and sorted(started) == [0, 1]


def test_cancelled_is_not_an_exception() -> None:
    """``except Exception`` on a worker's way up must not swallow its cancel."""
    assert not issubclass(Cancelled, Exception)


# -- dsim run -------------------------------------------------------------------------------


def test_two_threads_write_every_file_as_one_thread_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same sweep (3 runs, 9 policies, and a loader what-if of each: two results
    directories a run) finished with one thread and with two: every file the same bytes
    (each sweep in its own working directory, so ``summary.*``'s paths read alike)."""
    _traces(tmp_path / "one", iterations=3000)  # long enough for the runs to overlap
    shutil.copytree(tmp_path / "one" / "traces", tmp_path / "two" / "traces")
    trees = {}
    for label, threads in (("one", 1), ("two", 2)):
        monkeypatch.chdir(tmp_path / label)
        for kwargs in ({}, {"model": "pipeline", "workers": 4}):
            config = _config(Path("."), **kwargs)
            assert config.out == Path("out")  # relative: the summaries name the same paths
            run_replays(config, threads=threads)
        trees[label] = _tree(tmp_path / label / "out")
    assert trees["one"].keys() == trees["two"].keys()
    assert [name for name in trees["one"] if trees["one"][name] != trees["two"][name]] == []


@pytest.mark.parametrize(
    ("step", "run_of"),
    [("finish_run", lambda first: first[0].name), ("_plan", lambda first: first)],
    ids=["finished", "read_and_checked"],
)
def test_runs_are_worked_on_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, run_of
) -> None:
    """Two runs are in the step (``finish_run``; ``_plan``, which reads and checks a run)
    at the same moment: the serial loop never is, the first would wait at the barrier for
    the second and break it. Planned one after another, the reads left a core idle
    (BENCHMARKS.md, "Seventh run")."""
    _traces(tmp_path)
    both = threading.Barrier(2, timeout=10)
    calls: list[str] = []
    real = getattr(app_run, step)

    def at_once(first, *args):
        calls.append(run_of(first))
        if len(calls) <= 2:
            both.wait()
        return real(first, *args)

    monkeypatch.setattr(app_run, step, at_once)
    outcome = run_replays(_config(tmp_path), threads=2)
    assert outcome.computed == 3 * 9 and sorted(calls) == sorted(RUNS)


def test_the_first_failing_plan_in_config_order_is_raised_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rb's plan fails first in time, ra's later: ra's error is raised (the one the runs
    planned one after another would give), rc is never planned, and since every run is
    checked before anything is written, the output directory holds no results."""
    _traces(tmp_path)
    rb_failed = threading.Event()
    calls: list[str] = []
    real = app_run._plan

    def plan(name, *args):
        calls.append(name)
        if name == "rb":
            rb_failed.set()
            raise InputError("rb: broken on purpose")
        if name == "ra":
            assert rb_failed.wait(10)
            raise InputError("ra: broken too")
        return real(name, *args)

    monkeypatch.setattr(app_run, "_plan", plan)
    with pytest.raises(InputError, match="ra: broken too"):
        run_replays(_config(tmp_path), threads=2)
    assert sorted(calls) == ["ra", "rb"]
    out = tmp_path / "out"
    assert not any(p.suffix in (".parquet", ".json") for p in out.rglob("*"))


def test_one_run_is_finished_in_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No pool for one run: a single huge run's memory is what it was."""
    _traces(tmp_path, runs=("ra",))
    where: list[bool] = []
    real = app_run.finish_run

    def finish(*args):
        where.append(threading.current_thread() is threading.main_thread())
        return real(*args)

    monkeypatch.setattr(app_run, "finish_run", finish)
    monkeypatch.setattr(run_threads, "usable_cores", lambda: 8)
    run_replays(_config(tmp_path, runs=("ra",)))
    assert where == [True]


def test_a_failed_run_raises_its_error_after_the_runs_before_it_and_writes_no_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rb fails while ra still works: ra is finished (complete files), rc is never
    started, rb's error is the one raised, and no temporary file is left."""
    _traces(tmp_path)
    rb_failed = threading.Event()
    calls: list[str] = []
    real = app_run.finish_run

    def finish(plans, *args):
        name = plans[0].name
        calls.append(name)
        if name == "rb":
            rb_failed.set()
            raise InputError("rb: broken on purpose")
        assert rb_failed.wait(10)
        return real(plans, *args)

    monkeypatch.setattr(app_run, "finish_run", finish)
    with pytest.raises(InputError, match="rb: broken on purpose"):
        run_replays(_config(tmp_path), threads=2)
    assert sorted(calls) == ["ra", "rb"]
    out = tmp_path / "out"
    assert (out / "attribution" / "memo" / "ra.json").is_file()  # written last by finish_run
    assert not (out / "rc").exists() and not (out / "rb").exists()
    assert _temporaries(out) == []


def test_progress_is_reported_one_call_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The progress callback (a rich bar in the CLI) is called from the runs' threads,
    never two calls at once: the first call waits up to 2 s for a second to enter."""
    _traces(tmp_path)
    entered = threading.Semaphore(0)  # a token per call after the first
    overlapped: list[bool] = []
    first = [True]
    first_lock = threading.Lock()

    def on_rows(rows: int) -> None:
        with first_lock:
            is_first, first[0] = first[0], False
        if is_first:
            overlapped.append(entered.acquire(timeout=2))
        else:
            entered.release()

    run_replays(_config(tmp_path), threads=2, progress=lambda total: on_rows)
    assert overlapped == [False]


# -- atomic writes from threads -------------------------------------------------------------


def test_atomic_writes_keep_the_umask_and_never_set_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files 0666 and directories 0777 less the umask, without ``os.umask``: setting it to
    read it changes it for every thread (another run's file made meanwhile got 0 as its
    umask, or the 0 was read and kept)."""
    old = os.umask(0o027)
    try:
        monkeypatch.setattr(os, "umask", lambda mask: pytest.fail("os.umask called"))
        atomic.write_text("x", tmp_path / "a.txt")
        with atomic.atomic_dir(tmp_path / "d", check_existing=lambda p: None) as tmp:
            (tmp / "f").write_text("y")
    finally:
        monkeypatch.undo()
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o750


# -- Ctrl-C in the middle of a sweep ---------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals as on Linux")
def test_an_interrupted_sweep_stops_its_runs_leaves_nothing_and_resumes(tmp_path: Path) -> None:
    """SIGINT once the small run is finished, while the big one is mid-replay on the other
    thread: exit 130, the big run stopped (not finished first: no ``result.json``), no
    temporary file; the re-run reuses the small run and finishes the big one."""
    write_synthetic(tmp_path / "traces", "small", gpus=2, epochs=2, iterations=40, seed=1)
    write_synthetic(tmp_path / "traces", "big", gpus=8, epochs=2, iterations=40000, seed=2)
    args = [sys.executable, "-m", "dsim", "run", "small", "big", "--executor", "local"]
    args += ["--num-cpus", "2", "--out", "out"]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("DSIM_DEBUG", None)
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    memo = tmp_path / "out" / "attribution" / "memo"
    deadline = time.monotonic() + 120
    while not (memo / "small.json").is_file() and proc.poll() is None:
        assert time.monotonic() < deadline, "the small run never finished"
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "dsim: interrupted" and "Traceback" not in err, err
    out = tmp_path / "out"
    assert _temporaries(out) == []
    assert not (out / "big" / "result.json").exists() and not (memo / "big.json").exists()

    rerun = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert "9 replays computed" in rerun.stderr and "9 reused" in rerun.stderr, rerun.stderr
    assert (memo / "big.json").is_file() and _temporaries(out) == []
