"""dsim.instrument.lightning: a real Lightning DDP job (2 CPU ranks, gloo on loopback),
instrumented by its callback alone, gives logs that `dsim parse` and `dsim run` replay."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fwcheck import HERE, check_parse_and_replay, free_port, job_env, require

pytestmark = pytest.mark.torch

ITERATIONS = 12


def test_lightning_ddp_job_parses_and_replays(tmp_path: Path) -> None:
    require("torch", "lightning")
    log_dir = tmp_path / "logs" / "lightning"
    env = {**job_env(), "MASTER_PORT": str(free_port())}
    # Lightning's "ddp" strategy starts rank 1 by running the same command again.
    job = subprocess.run(
        [sys.executable, str(HERE / "fwjob_lightning.py"), str(log_dir), str(ITERATIONS)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    check_parse_and_replay(log_dir, tmp_path, ITERATIONS)


def test_importing_the_integrations_imports_no_framework() -> None:
    code = (
        "import sys, dsim.instrument.lightning, dsim.instrument.huggingface; "
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', "
        "'accelerate', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_callback_refuses_two_destinations_or_none() -> None:
    require("lightning")
    from dsim.errors import UsageError
    from dsim.instrument.lightning import DsimCallback

    with pytest.raises(UsageError, match="exactly one"):
        DsimCallback()
    with pytest.raises(UsageError, match="exactly one"):
        DsimCallback(log_dir="x", logger="y")


def test_pytorch_lightning_users_get_a_callback_of_their_package() -> None:
    require("pytorch_lightning")
    import pytorch_lightning

    from dsim.instrument.lightning import callback_class

    callback = callback_class("pytorch_lightning")(log_dir="x")
    assert isinstance(callback, pytorch_lightning.Callback)
