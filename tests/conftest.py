"""Shared test helpers: run the real ``dsim`` CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


@pytest.fixture
def dsim_cli():
    return run_dsim
