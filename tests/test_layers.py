"""The layers of docs/ARCHITECTURE.md, enforced: import-linter contracts in pyproject.toml.

A lower layer importing a higher one (or a replay kernel importing I/O, or
an input format importing the replay) fails here, not in review.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept() -> None:
    script = Path(sys.executable).parent / "lint-imports"
    command = [str(script)] if script.exists() else ["lint-imports"]
    done = subprocess.run(
        [*command, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_execution_workers_do_not_load_parquet_io() -> None:
    """What a Ray worker imports to run a replay chunk loads no Parquet reader or writer."""
    code = (
        "import sys, dsim.execute.units, dsim.replay.models; "
        "print(sorted(m for m in sys.modules if m.startswith(('pyarrow.parquet', 'dsim.io'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_input_formats_are_found_through_the_registry() -> None:
    from dsim.errors import UsageError
    from dsim.sources import DEFAULT_SOURCE, get_source

    assert get_source().name == DEFAULT_SOURCE == "rawlog"
    try:
        get_source("profiler")
    except UsageError as exc:
        assert "known formats: rawlog" in str(exc)
    else:
        raise AssertionError("an unknown format must be a usage error")
