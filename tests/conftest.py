"""Shared test helpers: run the real ``dsim`` CLI in a subprocess, or in-process where allowed."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
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
