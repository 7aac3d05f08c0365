"""examples/ddp_cpu.py: a real 2-rank DDP job whose logs go through `dsim parse` and `dsim run`."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

# latest_only: not in CI's floors phase (.ci/run): the job is torch and dsim.instrument
# (standard library only); its logs' grammar is parsed there by every other parse test
pytestmark = [pytest.mark.torch, pytest.mark.latest_only]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ddp_cpu.py"
DSIM = Path(sys.executable).with_name("dsim")
NAME = "cpuDDP_example_none_mlp_epoch2_b16_worker1_thread0"  # not the shipped sample's name


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS"):
        env.pop(var, None)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_example_ddp_job_parses_and_replays(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    iterations = 12
    example_args = ["--ranks", "2", "--epochs", "2", "--iterations", str(iterations)]
    example_args += ["--batch-size", "8", "--workers", "1", "--skew", "1.0"]
    example_args += ["--straggler-prob", "0.05", "--out", str(tmp_path / "logs")]
    job = _run([sys.executable, str(EXAMPLE), *example_args], cwd=tmp_path)
    assert job.returncode == 0, job.stderr
    log_dir = tmp_path / "logs" / NAME
    assert sorted(p.name for p in log_dir.iterdir()) == ["rank0.log", "rank1.log"]

    parse = _run([str(DSIM), "parse", str(log_dir), "--out", str(tmp_path / "traces")], tmp_path)
    assert parse.returncode == 0, parse.stderr
    from dsim.model.tables import read_run

    run = read_run(tmp_path / "traces" / NAME)
    assert run.info.gpu_count == 2
    assert list(run.info.epochs_present) == [0, 1]
    assert run.info.metadata["batch_size"] == 16 and run.info.metadata["workers"] == 1
    report = run.info.report
    assert report["rejected"] == 0 and report["other_lines"] == 0, report
    assert report["incomplete_iterations"]["count"] == 0
    assert run.fetch.num_rows == run.train.num_rows == 2 * 2 * iterations
    train = run.train.to_pandas()
    assert (train.iteration_s >= train.stall_s).all() and (train.stall_s >= 0).all()
    # --skew 1.0: rank 1 loads each sample twice as slowly as rank 0.
    fetch = run.fetch.to_pandas()
    per_rank = fetch.groupby("gpu").fetch_s.median()
    assert per_rank[1] > per_rank[0]

    traces, results = str(tmp_path / "traces"), str(tmp_path / "results")
    replay_args = ["--traces", traces, "--out", results, "--executor", "local"]
    replay_args += ["--warmup", "0", "--quiet"]
    replay = _run([str(DSIM), "run", NAME, *replay_args], tmp_path)
    assert replay.returncode == 0, replay.stderr
    with open(tmp_path / "results" / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["fetch_align"], r["start_align"]) for r in rows} == {
        (a, b) for a in ("actual", "avg", "min") for b in ("actual", "avg", "min")
    }
    assert all(r["run"] == NAME for r in rows)
    actual = next(r for r in rows if r["fetch_align"] == r["start_align"] == "actual")
    assert int(actual["iterations"]) == iterations - 1  # epoch 1 without iteration 0 (warm-up)


def test_the_example_does_not_name_its_runs_like_the_shipped_samples() -> None:
    """`python examples/ddp_cpu.py --out logs && dsim parse logs --out traces` with the
    samples' settings must not replace the shipped sample's parsed trace (issue #22)."""
    pytest.importorskip("torch")
    import importlib.util

    spec = importlib.util.spec_from_file_location("ddp_cpu_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    samples = Path(__file__).resolve().parents[1] / "traces"
    shipped = {p.name for p in (samples / "raw").iterdir()}
    shipped |= {p.name for p in (samples / "profiler").iterdir()}
    for epochs in ("1", "2"):
        args = example.parse_args(["--ranks", "4", "--epochs", epochs, "--workers", "2"])
        assert example.run_name(args) not in shipped
