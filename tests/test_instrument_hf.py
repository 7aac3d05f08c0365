"""dsim.instrument.huggingface: real Hugging Face DDP jobs (2 CPU ranks under torchrun,
gloo on loopback) — a transformers.Trainer with the callback (then resumed from a
checkpoint and cut by max_steps) and a plain accelerate loop with instrument_accelerate,
all accumulating gradients over 2 batches, run in one job — give logs that `dsim parse`
and `dsim run` replay."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fwcheck import HERE, check_cut_epoch, check_parse_and_replay, free_port, job_env, require

# latest_only: not in CI's floors phase (.ci/run), where transformers is not installed
pytestmark = [pytest.mark.torch, pytest.mark.latest_only]

ITERATIONS = 12


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One torchrun job: the Trainer run, then the accelerate run (one start-up for both)."""
    require("torch", "transformers", "accelerate")
    root = tmp_path_factory.mktemp("hf")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               str(HERE / "fwjob_hf.py"), "both", str(root / "logs"), str(ITERATIONS)]  # fmt: skip
    job = subprocess.run(
        command, cwd=root, env=job_env(), capture_output=True, text=True, timeout=300
    )
    assert job.returncode == 0, job.stderr[-3000:]
    return root


def test_trainer_job_parses_and_replays(logs: Path) -> None:
    check_parse_and_replay(logs / "logs" / "trainer", logs / "trainer", ITERATIONS)


def test_a_resumed_trainer_cut_by_max_steps_logs_up_to_its_last_step(logs: Path) -> None:
    """Resumed mid-epoch 1 (step 9 of 6 per epoch): the rest of epoch 1 is not logged
    (the Trainer skips the batches done through a loader accelerate builds anew); epoch 2
    stops after 3 steps (6 batches): iterations 0-5, and iteration 6 (the wait for batch
    6, then step 3's two batches) ended where max_steps stopped the Trainer."""
    check_cut_epoch(logs / "logs" / "trainer-cut", logs / "trainer-cut", 2, 7)


def test_accelerate_job_parses_and_replays(logs: Path) -> None:
    check_parse_and_replay(logs / "logs" / "accelerate", logs / "accelerate", ITERATIONS)


def test_instrument_accelerate_refuses_a_loader_accelerate_did_not_prepare(tmp_path) -> None:
    require("torch", "accelerate")
    from torch.utils.data import DataLoader

    from dsim.errors import UsageError
    from dsim.instrument.huggingface import instrument_accelerate

    with pytest.raises(UsageError, match=r"Accelerator\.prepare"):
        instrument_accelerate(DataLoader(range(4)), log_dir=tmp_path)
