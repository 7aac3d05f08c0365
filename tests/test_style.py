"""The codebase stays ruff-clean (lint and format), checked with every test run."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import REPO


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff")
    command = [exe] if exe else [sys.executable, "-m", "ruff"]
    return subprocess.run([*command, *args], cwd=REPO, capture_output=True, text=True)


@pytest.mark.parametrize("args", [("check", "."), ("format", "--check", ".")])
def test_ruff(args):
    result = _ruff(*args)
    if "No module named ruff" in result.stderr:
        pytest.skip("ruff is not installed (it comes with the test extras)")
    assert result.returncode == 0, result.stdout + result.stderr
