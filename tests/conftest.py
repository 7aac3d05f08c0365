"""Shared test helpers: run the real ``dsim`` CLI in a subprocess, or in-process where allowed."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_dsim(
    *args: str | Path, cwd: Path | None = None, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``dsim ARGS`` in a fresh interpreter, as a user would type it (``env``: extra
    variables; ``DSIM_DEBUG`` of the test's own environment is dropped)."""
    full_env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    full_env.pop("DSIM_DEBUG", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "dsim", *map(str, args)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def started_as_a_shell_starts_commands():
    """Children started in this block begin with SIGINT and SIGTERM at their default action.

    Why: an ignored signal stays ignored through fork and exec. A script's background
    job starts with SIGINT ignored, and a test that called ``dsim.cli.main`` bare left
    its xdist worker ignoring SIGINT and SIGTERM. A child then ignores a Ctrl-C until
    dsim's entry point installs its handler, where a shell's foreground command would
    have been stopped by it; tests that signal a command's first milliseconds must
    start it as a shell does. Handled (not ignored) here, the signals are reset to
    their default by exec.
    """
    ignored = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) == signal.SIG_IGN]
    for signum in ignored:
        signal.signal(signum, lambda *_: None)  # this process keeps ignoring them
    try:
        yield
    finally:
        for signum in ignored:
            signal.signal(signum, signal.SIG_IGN)


@pytest.fixture(autouse=True)
def _signal_handlers_kept():
    """Each test's SIGINT/SIGTERM handlers are given back after it, whatever it called.

    Why: ``dsim.cli.main`` ignores both as it leaves (the process is exiting), and a
    test that called it bare left its xdist worker ignoring them; a later test's
    children then inherited that (``started_as_a_shell_starts_commands``).
    """
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in handlers.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


def run_dsim_in_process(
    *args: str | Path, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``dsim ARGS`` through the same entry point (``dsim.cli.main``), in this process.

    Why: a fresh interpreter costs ~0.5-1 s of start-up and imports, and most
    CLI tests check one message or exit code; hundreds of subprocesses made
    the suite miss its CI time. Returns what ``run_dsim`` returns (exit code,
    stdout and stderr as text with universal newlines), from an isolated
    environment: ``os.environ`` replaced as ``run_dsim`` builds it, ``cwd``
    changed, stdin empty, stdout/stderr captured (not terminals, as in a
    pipe), and the signal handlers and ``dsim.processes``' state restored after.

    The rule (keep it): only for tests whose subject is a message or exit code
    of a pure-Python path: no Ray, no worker processes (``dsim parse --jobs``
    above 1), no signals, no ``--debug`` tracebacks, no Python warnings (shown
    once per process), nothing read from the environment at import time. Every
    command keeps real-subprocess end-to-end tests (``run_dsim``) of its success
    path and of an error path: those check what a user runs, this one does not.
    The same paths may also build a test's inputs (``synth``, a one-run ``parse``,
    an in-process ``run``, ``report``) where its subject is what they wrote or
    what reads it, not the command's start-up (a fixture's fifteen commands cost
    the Chromium tests 30 s).
    """
    import dsim.cli
    from dsim import processes

    assert "--debug" not in map(str, args), "--debug raises its traceback: use run_dsim"

    full_env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    full_env.pop("DSIM_DEBUG", None)
    full_env.update(env or {})
    out, err = io.BytesIO(), io.BytesIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    stderr = io.TextIOWrapper(err, encoding="utf-8", write_through=True)
    stdin = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    saved = (sys.unraisablehook, processes._received, processes._owner_pid)
    here = os.getcwd()
    had_ray = "ray" in sys.modules
    code: object = None
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.dict(os.environ, full_env, clear=True))
            stack.enter_context(mock.patch.multiple(sys, stdin=stdin, stdout=stdout, stderr=stderr))
            if cwd is not None:
                os.chdir(cwd)
            try:
                dsim.cli.main([str(a) for a in args])
            except SystemExit as exc:  # how dsim.cli.main always ends
                code = exc.code
            stdout.flush()
            stderr.flush()
    finally:
        os.chdir(here)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        sys.unraisablehook, processes._received, processes._owner_pid = saved
    assert not processes.hard_exit_requested(), "a hard exit: test this path with run_dsim"
    assert had_ray or "ray" not in sys.modules, "Ray was started: test this path with run_dsim"
    assert isinstance(code, int), f"dsim.cli.main ended without an exit code: {code!r}"

    def text(data: bytes) -> str:  # what subprocess.run(text=True) makes of the bytes
        return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")

    return subprocess.CompletedProcess(
        ["dsim", *map(str, args)], code, text(out.getvalue()), text(err.getvalue())
    )


@pytest.fixture
def dsim_cli():
    return run_dsim


# The slowest test files, slowest first (worker-seconds in a `--durations` run of the whole
# suite, 28 Nov 2026). Under README's `-n auto --dist loadfile` xdist hands the files out
# with the most tests first, so these (few tests, tens of seconds each: Chromium, Ray
# clusters, real training jobs, killed processes) came last, and the last of them ran alone
# while the other worker sat idle. Handed out first, the short files fill in at the end.
# Only an order: a file missing here, or renamed, still runs (tests/test_scheduling.py
# checks that every name is a test file).
SLOW_FILES = (
    "test_report_browser.py",
    "test_bench_smoke.py",
    "test_kill_resume.py",
    "test_watch.py",
    "test_fidelity_smoke.py",
    "test_ray_cluster.py",
    "test_ray_errors.py",
    "test_runtask.py",
    "test_pipeline_cli.py",
    "test_profiled_replay.py",
    "test_gpu_util.py",
    "test_instrument_lightning.py",
    "test_kill_ray.py",
    "test_provenance.py",
    "test_fuzz_parse.py",
    "test_report.py",
    "test_instrument_hf.py",
    "test_answer.py",
    "test_parse_bounds.py",
    "test_concurrency.py",
)


def slowest_first(queue: dict) -> None:
    """Move the slowest of the files still queued (``SLOW_FILES``' order) to the front of an
    xdist work queue (an ``OrderedDict`` keyed by ``tests/test_x.py``, or any path ending so)."""
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    queued = [scope for scope in queue if Path(scope).name in rank]
    if queued:
        queue.move_to_end(min(queued, key=lambda s: rank[Path(s).name]), last=False)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
    """``--dist loadfile``: xdist's own file scheduler, handing out ``SLOW_FILES`` first.

    Other ``--dist`` modes, or an xdist without the queue this relies on, get xdist's own
    scheduler unchanged (None: xdist's default hook decides).
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SlowFilesFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):  # type: ignore[no-untyped-def]
            if isinstance(getattr(self, "workqueue", None), OrderedDict):
                slowest_first(self.workqueue)
            super()._assign_work_unit(node)

    return SlowFilesFirst(config, log)
