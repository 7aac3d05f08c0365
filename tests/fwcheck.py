"""What the framework tests share: skip or fail on a framework, the job's environment,
and the checks of a 2-rank job's logs through the real `dsim parse` and `dsim run`."""

from __future__ import annotations

import contextlib
import csv
import importlib
import importlib.util
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import run_dsim

BATCH, EPOCHS, RANKS, WORKERS = 8, 2, 2, 2  # as in fwjob_lightning.py and fwjob_hf.py
HERE = Path(__file__).resolve().parent


def require(*modules: str) -> None:
    """A skip, with the reason, when a framework is not installed. Installed but broken
    (an error while importing it) fails: never a silent skip."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module} (pip install {module.split('.')[0]})")
    for module in modules:
        importlib.import_module(module)


def job_env() -> dict[str, str]:
    """The job on loopback only (gloo too), dsim from this checkout, no launcher's leftovers."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT", "NODE_RANK"):
        env.pop(var, None)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(HERE)])
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run_job(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    """Run a framework job to completion and return its stderr; fail with its output.

    The job runs in a session of its own with its output in files: on a timeout the
    whole session (launcher, ranks, loader workers) is killed and the failure shows
    what the job printed up to then, which a pipe to a killed launcher loses (a hang
    once seen in CI left nothing to read)."""
    out, err = cwd / "job.stdout", cwd / "job.stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        job = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=stdout, stderr=stderr, start_new_session=True
        )
        try:
            job.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # the session may end meanwhile
                os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            pytest.fail(f"job timed out after {timeout} s; {_tails(out, err)}")
    if job.returncode != 0:
        pytest.fail(f"job exited with {job.returncode}; {_tails(out, err)}")
    return err.read_text(errors="replace")


def _tails(*files: Path, chars: int = 3000) -> str:
    return "; ".join(f"{f.name} ends:\n{f.read_text(errors='replace')[-chars:]}" for f in files)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_parse_and_replay(log_dir: Path, out: Path, iterations: int) -> None:
    """The logs parse with nothing rejected, as a 2-rank, 2-epoch run whose every batch
    has its fetch and training record, loader settings included, and replay."""
    assert sorted(p.name for p in log_dir.iterdir()) == ["rank0.log", "rank1.log"]
    traces, results = out / "traces", out / "results"
    parse = run_dsim("parse", log_dir, "--out", traces)
    assert parse.returncode == 0, parse.stderr
    from dsim.model.tables import read_run

    run = read_run(traces / log_dir.name)
    assert run.info.gpu_count == RANKS
    assert list(run.info.epochs_present) == list(range(EPOCHS))
    report = run.info.report
    assert report["rejected"] == 0 and report["other_lines"] == 0, report
    assert report["incomplete_iterations"]["count"] == 0, report
    assert report["loader_lines"] == RANKS * EPOCHS, report
    assert run.fetch.num_rows == run.train.num_rows == RANKS * EPOCHS * iterations
    loader = run.info.loader
    assert (loader["num_workers"], loader["batch_size"]) == (WORKERS, BATCH), loader
    assert loader["local_world_size"] == RANKS and loader["cores"] >= 1, loader
    assert loader["batch_bytes"] == BATCH * (16 + 1) * 4, loader  # float32 x and label
    fetch = run.fetch.to_pandas()
    assert fetch.groupby("gpu").worker.agg(lambda w: sorted(set(w))).to_dict() == {
        g: list(range(WORKERS)) for g in range(RANKS)
    }
    # Rank 1 reads each sample 3 ms, rank 0 1 ms: its fetches are the slow ones.
    assert fetch.groupby("gpu").fetch_s.median().idxmax() == 1
    train = run.train.to_pandas()
    assert (train.iteration_s >= train.stall_s).all() and (train.stall_s >= 0).all()
    assert sorted(set(train.iteration)) == list(range(iterations))

    replay = run_dsim("run", log_dir.name, "--traces", traces, "--out", results,
                      "--executor", "local", "--warmup", "0", "--quiet")  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    with open(results / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 9 and {r["run"] for r in rows} == {log_dir.name}
    actual = next(r for r in rows if r["fetch_align"] == r["start_align"] == "actual")
    assert int(actual["iterations"]) == iterations - 1  # epoch 1 without iteration 0


def check_cut_epoch(log_dir: Path, out: Path, epoch: int, iterations: int) -> None:
    """A run of one epoch cut short (``max_steps``) after a resume: training lines for
    iterations 0..iterations-1 of ``epoch`` on every rank, each with its fetch; the only
    incomplete iterations are batches the workers built ahead that no step took (fetch
    records without a training record, all past the last one trained); it replays."""
    traces, results = out / "traces", out / "results"
    parse = run_dsim("parse", log_dir, "--out", traces)
    assert parse.returncode == 0, parse.stderr
    from dsim.model.tables import read_run

    run = read_run(traces / log_dir.name)
    assert list(run.info.epochs_present) == [epoch]
    report = run.info.report
    assert report["rejected"] == 0 and report["other_lines"] == 0, report
    train = run.train.to_pandas()
    assert train.groupby("gpu").iteration.agg(sorted).to_dict() == {
        g: list(range(iterations)) for g in range(RANKS)
    }
    fetch = run.fetch.to_pandas()
    for g in range(RANKS):  # every trained batch was fetched; the rest lies beyond
        fetched = set(fetch[fetch.gpu == g].iteration)
        assert set(range(iterations)) <= fetched
        assert min(fetched - set(range(iterations)), default=iterations) >= iterations
    replay = run_dsim("run", log_dir.name, "--traces", traces, "--out", results,
                      "--executor", "local", "--warmup", "0", "--quiet")  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    with open(results / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {int(r["iterations"]) for r in rows} == {iterations - 1}  # without iteration 0
