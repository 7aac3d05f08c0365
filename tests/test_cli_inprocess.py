"""``conftest.run_dsim_in_process`` answers as the real CLI in a subprocess does.

Tests of messages and exit codes use it instead of ``run_dsim`` to save a
fresh interpreter per call; this checks, for a usage error, an input error,
help and ``--version``, that exit code, stdout and stderr are the same
byte for byte, and that the process it runs in is left as it was.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import run_dsim, run_dsim_in_process

CASES = {
    "version": ["--version"],
    "help": ["summarize", "--help"],
    "usage error": ["summarize", "--epochs", "x", "results"],
    "missing input": ["summarize", "nowhere"],
    "bad option": ["run", "--no-such-option"],
    "policy": ["compare", "a", "b", "--policy", "x/y/z"],
}


@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_same_answer_as_the_subprocess(tmp_path: Path, args: list[str]) -> None:
    real = run_dsim(*args, cwd=tmp_path, env={"COLUMNS": "100"})
    here = run_dsim_in_process(*args, cwd=tmp_path, env={"COLUMNS": "100"})
    assert (here.returncode, here.stdout, here.stderr) == (
        real.returncode,
        real.stdout,
        real.stderr,
    )


def _process_state() -> tuple:
    """What an in-process CLI call could leave changed in the test's process."""
    return (
        os.getcwd(),
        dict(os.environ),
        signal.getsignal(signal.SIGINT),
        signal.getsignal(signal.SIGTERM),
        sys.stdout,
        sys.stderr,
        sys.unraisablehook,
    )


def test_process_state_is_restored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSIM_DEBUG", "1")  # dropped inside, as run_dsim drops it
    before = _process_state()
    proc = run_dsim_in_process("summarize", "--epochs", "x", "r", cwd=tmp_path)
    assert proc.returncode == 2 and "--epochs" in proc.stderr
    assert _process_state() == before


def test_debug_is_refused() -> None:
    with pytest.raises(AssertionError, match="--debug"):
        run_dsim_in_process("--debug", "summarize", "nowhere")
