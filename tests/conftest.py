"""Shared test helpers: run the real ``dsim`` CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_dsim(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``dsim ARGS`` in a fresh interpreter, as a user would type it."""
    full_env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **(env or {})}
    full_env.pop("DSIM_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "dsim", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def dsim_cli():
    return run_dsim
