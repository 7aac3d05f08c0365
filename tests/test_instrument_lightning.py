"""dsim.instrument.lightning: a real Lightning DDP job (2 CPU ranks, gloo on loopback),
instrumented by its callback alone, gives logs that `dsim parse` and `dsim run` replay."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fwcheck import (
    HERE,
    check_cut_epoch,
    check_parse_and_replay,
    free_port,
    job_env,
    require,
    run_job,
)

# latest_only: not in CI's floors phase (.ci/run), where Lightning is not installed
pytestmark = [pytest.mark.torch, pytest.mark.latest_only]

ITERATIONS = 12
STEP_S = 0.02  # each training step's sleep in fwjob_lightning.py


def test_lightning_ddp_job_parses_and_replays(tmp_path: Path) -> None:
    """Gradient accumulation, resume from a checkpoint and max_steps (fwjob_lightning.py):
    a training line per batch, the resumed epochs numbered on, the cut epoch's lines up to
    its last step, a mid-epoch resume's lines numbered from 0 in its own log_dir."""
    require("torch", "lightning")
    env = {**job_env(), "MASTER_PORT": str(free_port())}
    # Lightning's "ddp" strategy starts rank 1 by running the same command again.
    run_job(
        [sys.executable, str(HERE / "fwjob_lightning.py"), str(tmp_path / "logs"), str(ITERATIONS)],
        tmp_path, env,
    )  # fmt: skip
    check_parse_and_replay(tmp_path / "logs" / "lightning", tmp_path, ITERATIONS)
    # Lightning asks for batch i+1 after the step on batch i (it does not read ahead of a
    # loader with a length): every iteration holds its step, the epoch's last one too.
    from dsim.model.tables import read_run

    train = read_run(tmp_path / "traces" / "lightning").train.to_pandas()
    assert (train.iteration_s - train.stall_s >= STEP_S * 0.9).all()
    # Resumed 4 batches into epoch 0 (a mid-epoch checkpoint) and cut by max_steps 2
    # optimizer steps (4 batches) later: Lightning starts the loader over, so iterations
    # 0-3, the last ended where max_steps stopped the loop.
    check_cut_epoch(tmp_path / "logs" / "lightning-cut", tmp_path / "cut", 0, 4)
    # Resumed there to the epoch's end: the 8 batches left, as iterations 0-7.
    check_cut_epoch(tmp_path / "logs" / "lightning-resumed", tmp_path / "resumed", 0, 8)


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
