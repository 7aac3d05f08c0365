"""dsim run by a user who may not write where dsim is installed, nor into a home.

The sessions run as root, where no permission check fails. These tests drop to the
``nobody`` user with ``setpriv`` (root, Linux) and skip elsewhere, or where that user
cannot reach this checkout's interpreter (a clone under a private temporary directory).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO
from tracegen import write_synthetic

from dsim.replay.models.jitcache import can_cache

NOBODY = [
    "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
    "--inh-caps=-all", "--bounding-set=-all",
]  # fmt: skip


def test_can_cache_needs_a_directory_it_may_write(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert can_cache(__file__, [tmp_path / "new" / "deeper"])  # made on the way
    assert not can_cache(__file__, [tmp_path / "file" / "numba"])  # a file in the way
    assert not can_cache(__file__, [])
    assert can_cache(__file__, [tmp_path / "file" / "numba", tmp_path])


def _as_nobody(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*NOBODY, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def nobody_dir():
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as another user")
    work = Path(tempfile.mkdtemp(prefix="dsim-nobody-", dir="/tmp"))
    work.chmod(0o777)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "HOME": "/nonexistent",  # no home to cache in
        "XDG_CACHE_HOME": "/nonexistent/.cache",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    # dsim itself may be readable where the virtualenv's packages are not (CI's clone
    # is public, its virtualenvs lie in a private temporary directory): probe them too
    probe = _as_nobody(
        sys.executable, "-c", "import dsim.cli, numba, pandas, pyarrow", cwd=work, env=env
    )
    if probe.returncode != 0:
        shutil.rmtree(work)
        pytest.skip(f"the nobody user cannot import this checkout: {probe.stderr[-200:]}")
    if (
        os.access(REPO / "dsim", os.W_OK)
        and _as_nobody(
            "test", "-w", str(REPO / "dsim" / "replay" / "models"), cwd=work, env=env
        ).returncode
        == 0
    ):
        shutil.rmtree(work)
        pytest.skip("the nobody user may write this checkout")
    yield work, env
    shutil.rmtree(work, ignore_errors=True)


def test_the_pipeline_model_runs_where_numba_cannot_cache(nobody_dir) -> None:
    """An internal error ("cannot cache function '_typical': no locator available")
    where neither the install nor a home could be written; and a result.json the user
    cannot read made a cached `dsim run` fail with a traceback."""
    work, env = nobody_dir
    write_synthetic(work / "traces", "r1", iterations=40)
    for path in (work / "traces").rglob("*"):
        path.chmod(0o777 if path.is_dir() else 0o666)
    dsim = [sys.executable, "-m", "dsim"]
    done = _as_nobody(*dsim, "run", "r1", "--model", "pipeline", "--executor", "local", "-q",
                      cwd=work, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((work / "results" / "r1@pipeline" / "result.json").read_text())
    (work / "results" / "r1@pipeline" / "result.json").chmod(0)
    done = _as_nobody(*dsim, "run", "r1", "--model", "pipeline", "--executor", "local", "-q",
                      cwd=work, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr  # not vouched for by the memo: replayed again
    assert "Traceback" not in done.stderr
    # a dataset file the user cannot read is named as that, not as "missing"
    held = work / "results" / "dataset" / "iterations" / "r1@pipeline.parquet"
    held.chmod(0)
    done = _as_nobody(*dsim, "summarize", "results", cwd=work, env=env)
    assert done.returncode == 3
    assert done.stderr.strip().endswith(
        "its rows are in the dataset file results/dataset/iterations/r1@pipeline.parquet, "
        "which cannot be read (Permission denied): check its permissions"
    )
