"""dsim.instrument.huggingface: real Hugging Face DDP jobs (2 CPU ranks under torchrun,
gloo on loopback) — a transformers.Trainer with the callback (then one stopped at a
mid-epoch checkpoint and one resumed from it, cut by max_steps) and a plain accelerate
loop with instrument_accelerate (then one resumed mid-epoch), all accumulating gradients
over 2 batches, run in one job — give logs that `dsim parse` and `dsim run` replay."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import pytest
from conftest import run_dsim
from fwcheck import (
    HERE,
    RANKS,
    WORKERS,
    check_parse_and_replay,
    free_port,
    job_env,
    require,
    run_job,
)

# latest_only: not in CI's floors phase (.ci/run), where transformers is not installed
pytestmark = [pytest.mark.torch, pytest.mark.latest_only]

ITERATIONS = 12
SKIP, PREFETCH = 6, 2  # fwjob_hf.py: batches of epoch 1 done at the checkpoint; torch's default


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One torchrun job: the Trainer run, then the accelerate run (one start-up for both)."""
    require("torch", "transformers", "accelerate")
    root = tmp_path_factory.mktemp("hf")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               str(HERE / "fwjob_hf.py"), "both", str(root / "logs"), str(ITERATIONS)]  # fmt: skip
    run_job(command, root, job_env())
    return root


def test_trainer_job_parses_and_replays(logs: Path) -> None:
    check_parse_and_replay(logs / "logs" / "trainer", logs / "trainer", ITERATIONS)


def _parse(log_dir: Path, out: Path):
    parse = run_dsim("parse", log_dir, "--out", out / "traces")
    assert parse.returncode == 0, parse.stderr
    from dsim.model.tables import read_run

    run = read_run(out / "traces" / log_dir.name)
    return run, run.train.to_pandas(), run.fetch.to_pandas()


def _replay(log_dir: Path, out: Path, *options: str) -> list[dict[str, str]]:
    replay = run_dsim("run", log_dir.name, "--traces", out / "traces", "--out", out / "results",
                      "--executor", "local", "--warmup", "0", "--quiet", *options)  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    with open(out / "results" / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def _iterations(table, epoch: int) -> dict[int, list[int]]:
    return table[table.epoch == epoch].groupby("gpu").iteration.agg(sorted).to_dict()


def test_a_trainer_resumed_mid_epoch_into_the_first_jobs_log_dir_continues_it(
    logs: Path,
) -> None:
    """The first Trainer stops at its checkpoint, step 9 of 6 per epoch (batch SKIP-1 of
    epoch 1 trained); the resumed one skips epoch 1's first SKIP batches (a loader
    accelerate rebuilds), logs the rest as iterations SKIP-11, and stops 3 steps into
    epoch 2 (iterations 0-6, the last ended where max_steps stopped it). One run: the
    only repeats are the seam's. Iteration SKIP is in both jobs (the first's wait for
    batch SKIP, read ahead, with the step on SKIP-1; the second's wait for it): both
    rejected as conflicting. Batches the first job's workers built ahead (at most
    P·W past SKIP) conflict with the second's fetches of them."""
    log_dir, out = logs / "logs" / "trainer-cut", logs / "trainer-cut"
    run, train, fetch = _parse(log_dir, out)
    assert list(run.info.epochs_present) == [0, 1, 2]
    report = run.info.report
    assert report["other_lines"] == 0, report
    conflicts = report["skipped"]
    assert conflicts.pop("conflicting training records (same GPU, epoch and iteration)") == (
        2 * RANKS
    )
    seam = set(range(SKIP, SKIP + PREFETCH * WORKERS + 1))
    assert set(conflicts) <= {"conflicting fetch records (same GPU, epoch and batch)"}, report
    assert sum(conflicts.values()) <= 2 * RANKS * len(seam), report
    everything = list(range(ITERATIONS))
    assert _iterations(train, 0) == {g: everything for g in range(RANKS)}
    assert _iterations(train, 1) == {g: sorted(set(everything) - {SKIP}) for g in range(RANKS)}
    assert _iterations(train, 2) == {g: list(range(7)) for g in range(RANKS)}
    for g, fetched in _iterations(fetch, 1).items():  # positions, the skipped ones counted
        assert set(range(SKIP)) | {ITERATIONS - 1} <= set(fetched) <= set(everything), g
        assert set(everything) - set(fetched) <= seam, g
    rows = _replay(log_dir, out)
    assert len(rows) == 9
    # Epochs 1 and 2 without iteration 0: at least 1-5, 11 and 1-6.
    assert min(int(r["iterations"]) for r in rows) >= 12


def test_accelerate_resumed_mid_epoch_logs_that_epochs_rest(logs: Path) -> None:
    """An accelerate loop resumed at batch SKIP of epoch 1 (``skip_first_batches``, its
    loader instrumented too, into the first loader's log directory): epoch 1's lines are
    iterations SKIP-11 with fetches of the same positions, epoch 2's 0-11; nothing
    rejected or incomplete; the resumed epoch replays on its own."""
    log_dir, out = logs / "logs" / "accelerate-resumed", logs / "accelerate-resumed"
    run, train, fetch = _parse(log_dir, out)
    assert list(run.info.epochs_present) == [1, 2]
    report = run.info.report
    assert report["rejected"] == 0 and report["other_lines"] == 0, report
    assert report["incomplete_iterations"]["count"] == 0, report
    assert report["loader_lines"] == RANKS * 2, report
    rest = list(range(SKIP, ITERATIONS))
    assert _iterations(train, 1) == _iterations(fetch, 1) == {g: rest for g in range(RANKS)}
    everything = list(range(ITERATIONS))
    assert _iterations(train, 2) == _iterations(fetch, 2) == {g: everything for g in range(RANKS)}
    assert (train[train.epoch == 1].iteration_s >= train[train.epoch == 1].stall_s).all()
    rows = _replay(log_dir, out, "--epochs", "1")
    assert {int(r["iterations"]) for r in rows} == {len(rest)}


def test_accelerate_job_parses_and_replays(logs: Path) -> None:
    check_parse_and_replay(logs / "logs" / "accelerate", logs / "accelerate", ITERATIONS)


def test_instrument_accelerate_refuses_a_loader_accelerate_did_not_prepare(tmp_path) -> None:
    require("torch", "accelerate")
    from torch.utils.data import DataLoader

    from dsim.errors import UsageError
    from dsim.instrument.huggingface import instrument_accelerate

    with pytest.raises(UsageError, match=r"Accelerator\.prepare"):
        instrument_accelerate(DataLoader(range(4)), log_dir=tmp_path)


def test_instrument_accelerate_takes_a_rebuilt_shard_into_its_original_place(tmp_path) -> None:
    """A shard rebuilt around an instrumented loader's dataset with a SkipBatchSampler
    (what skip_first_batches builds) logs where that loader logs, at positions from the
    count skipped; a log_dir elsewhere is refused rather than splitting a rank's lines."""
    require("torch", "accelerate")
    from accelerate.data_loader import DataLoaderShard, SkipBatchSampler
    from torch.utils.data import DataLoader

    from dsim.errors import UsageError
    from dsim.instrument import instrument_loader
    from dsim.instrument.huggingface import instrument_accelerate

    loader = instrument_loader(DataLoader(range(8), batch_size=2), log_dir=tmp_path / "a", rank=0)
    skipper = SkipBatchSampler(loader.batch_sampler, skip_batches=1)
    shard = DataLoaderShard(loader.dataset, batch_sampler=skipper, collate_fn=loader.collate_fn)
    with pytest.raises(UsageError, match="logs where the one it was rebuilt from logs"):
        instrument_accelerate(shard, log_dir=tmp_path / "b")
    assert instrument_accelerate(shard, log_dir=tmp_path / "a") is shard
    assert [b.tolist() for b in shard] == [[2, 3], [4, 5], [6, 7]]
    text = (tmp_path / "a" / "rank0.log").read_text()
    assert [int(i) for i in re.findall(r"data idx(\d+)", text)] == [1, 2, 3]
    assert re.findall(r"Epoch: \[0\]\[(\d)/4\]", text) == ["1", "2", "3"]
    assert not (tmp_path / "b").exists()
