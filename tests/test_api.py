"""The Python API (``dsim.api``, re-exported by ``import dsim``): the README's
notebook example run verbatim, and the API agreeing with the CLI."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, run_dsim

import dsim
from dsim.errors import UsageError


def readme_example() -> str:
    """The ```python block of the README's "Python API" paragraph."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("**Python API.**") :]
    return re.search(r"```python\n(.*?)\n```", section, re.DOTALL).group(1)


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "traces" / "raw", tmp_path / "traces" / "raw")
    return tmp_path


def test_the_readme_example_runs_verbatim(sample: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", readme_example()],
        cwd=sample,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Aligning ") or proc.stdout.startswith("Loaders are")
    assert (sample / "results" / "summary.csv").is_file()


def test_api_and_cli_write_and_read_the_same_results(sample: Path) -> None:
    trace = dsim.parse(sample / "traces" / "raw", out=sample / "traces")
    assert trace.info.gpu_count == 4 and len(trace.fetch) > 0
    assert dsim.load_trace(trace.directory) == trace
    assert importlib.import_module("dsim.replay.policies")  # the package: no clash with dsim.run

    api = dsim.run(trace, policies=["avg/min"], out=sample / "api")
    proc = run_dsim("run", trace.name, "-p", "avg/min", "--out", "cli", "--json", cwd=sample)
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(proc.stdout)
    doc = api.to_json()
    for a, c in zip(doc["summary"], cli["summary"], strict=True):
        assert {k: v for k, v in a.items() if k != "results"} == {
            k: v for k, v in c.items() if k != "results"
        }
    assert doc["verdicts"][0]["text"] == cli["verdicts"][0]["text"]
    loaded = dsim.load_results(sample / "api")
    pd.testing.assert_frame_equal(loaded.summary, api.summary)
    on_disk = pd.read_parquet(sample / "api" / "dataset" / "gpus")
    pd.testing.assert_frame_equal(loaded.gpus(), on_disk)
    [check] = loaded.check("speedup@avg/min>1")
    assert check.run == trace.name and check.held == (check.value > 1)


def test_api_errors_are_dsim_errors(sample: Path) -> None:
    with pytest.raises(UsageError, match=r"dsim\.run: the runs must lie in one traces directory"):
        dsim.run([sample / "a" / "x", sample / "b" / "y"])
    with pytest.raises(UsageError, match="unknown metric"):
        dsim.Results(pd.DataFrame(), []).check("nope>1")


def test_import_dsim_stays_light() -> None:
    code = "import sys, dsim; print('pandas' in sys.modules, 'dsim.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    assert set(dsim.__all__) >= {"parse", "run", "load_results", "Results", "Trace"}
