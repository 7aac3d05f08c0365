"""The fidelity harness end to end: two real 2-rank DDP runs, parsed, predicted, tabulated.

``validation.sweep`` runs run A and its align=min re-run (a few iterations,
2 ranks, 1 worker), then ``validation.compare`` parses them with the real
dsim CLI and predicts the re-run with both replay models. Checked: the
files a sweep leaves, the table's rows and finite numbers, the pipeline
model's identity on A, that every batch's loading lasted at least its
cost-table entry (the table lookup is exact), and that a stored run made
with other settings is refused.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_dsim

# latest_only: not in CI's floors phase (.ci/run): validation/ is the fidelity harness, developer
# tooling outside the package; the dsim parse and replay it drives are tested there directly
pytestmark = [pytest.mark.torch, pytest.mark.latest_only]

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SWEEP = [
    "--plan",
    "legacy",
    "--ranks",
    "2",
    "--iterations",
    "16",
    "--epochs",
    "2",
    "--regime",
    "balanced",
]
SWEEP += ["--workers", "1", "--variants", "min"]
METRICS = ("iteration_ms", "stall_ms", "delay_ms", "effective_delay_pct", "epoch_s")


def _python(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS"):
        env.pop(var, None)
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_sweep_and_compare_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "sweep"
    sweep = _python("-m", "validation.sweep", "--out", str(out), *SWEEP)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr

    a, rerun = "balanced_w1_p2_none", "balanced_w1_p2_min"
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["runs"]) == sorted([a, rerun])
    for name in (a, rerun):
        entry = manifest["runs"][name]
        assert entry["wall_s"] > 0 and entry["machine"]["cores"] >= 1 and entry["git_commit"]
        assert len(entry["load_before"]) == 3 and len(entry["load_after"]) == 3
        # node_cpu.json: rank 0's samples of the node's CPU counters, where /proc/stat is
        node = ["node_cpu.json"] if Path("/proc/stat").exists() else []
        assert sorted(p.name for p in (out / name).iterdir()) == sorted(
            ["job.json", *node, "rank0.log.gz", "rank1.log.gz"]
        )

    with open(out / "fidelity.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["kind"], r["what_if"]) for r in rows] == [
        ("align", "align min, 1 w"),
        ("identity", "identity, 1 w"),
    ]
    align, identity = rows
    assert (align["base_run"], align["target_run"]) == (a, rerun)
    assert align["per_iteration_policy"] == align["pipeline_policy"] == "min/actual"
    for row in rows:
        for metric in METRICS:
            for model in ("measured", "per_iteration", "pipeline"):
                assert math.isfinite(float(row[f"{metric}_{model}"])), (metric, model)
    for target in ("iteration", "share"):
        assert align[f"target_{target}_pipeline"] in ("met", "missed")
    for metric in METRICS:  # the pipeline model reproduces A from A's own logs
        assert abs(float(identity[f"{metric}_err_pipeline"])) < 1e-6, metric

    text = (out / "FIDELITY.md").read_text()
    assert text.count("<!-- fidelity:begin") == 1 and text.count("<!-- fidelity:end -->") == 1
    assert "### balanced" in text and "| align min, 1 w |" in text
    assert "python -m validation.sweep" in text and manifest["runs"][a]["machine"]["cpu"] in text

    _check_costs_match_table(tmp_path, out, a, rerun)

    again = _python("-m", "validation.sweep", "--out", str(out), *SWEEP, "--no-compare")
    assert again.returncode == 0 and "already there" in again.stdout, again.stderr
    other = [*SWEEP, "--no-compare"]
    other[other.index("16")] = "17"
    refused = _python("-m", "validation.sweep", "--out", str(out), *other)
    assert refused.returncode == 2
    assert f"run {a}" in refused.stderr and "other settings" in refused.stderr


def _check_costs_match_table(tmp_path: Path, out: Path, a: str, rerun: str) -> None:
    """Every logged fetch lasted at least its table cost; align=min made the ranks' costs equal."""
    import pandas as pd

    from validation.compare import unpack_logs
    from validation.regimes import Regime, align_table, cost_table

    for name in (a, rerun):
        unpack_logs(out / name, tmp_path / "logs" / name)
        parse = run_dsim("parse", str(tmp_path / "logs" / name), "--out", str(tmp_path / "tr"))
        assert parse.returncode == 0, parse.stderr
        job = json.loads((out / name / "job.json").read_text())
        table = cost_table(
            Regime(**job["regime"]), job["epochs"], job["iterations"], job["ranks"], job["seed"]
        )
        table = align_table(table, job["align"])
        fetch = pd.read_parquet(tmp_path / "tr" / name / "fetch.parquet")
        assert len(fetch) == job["epochs"] * job["iterations"] * job["ranks"]
        cost = table[fetch.epoch, fetch.iteration, fetch.gpu]
        assert (fetch.fetch_s.to_numpy() >= cost - 1e-6).all()  # sleeps never end early
    assert (table == table[:, :, :1]).all()  # the last one read: align=min


# The contention regimes, each a tiny physical run parsed by `dsim parse`: cpu with the
# start-max barrier at 1 worker, mixed with it at 2 workers (the barrier cannot deadlock
# with prefetch windows: validation/startalign.py), decode (Pillow + conv net, the GPU
# variant's code path with pin_memory off) with the control mechanism.
CONTENTION_RUNS = {
    "cpu_max_w1": ["--regime", "cpu", "--workers", "1", "--start-align", "max"],
    "mixed_max_w2": ["--regime", "mixed", "--workers", "2", "--start-align", "max"],
    "decode_ctl_w2": ["--regime", "decode", "--workers", "2", "--start-align", "control"],
}


@pytest.mark.parametrize("name", sorted(CONTENTION_RUNS))
def test_contention_run_parses(tmp_path: Path, name: str) -> None:
    pytest.importorskip("torch")
    if "decode" in name:
        pytest.importorskip("PIL")
    out = tmp_path / "runs"
    shape = ["--ranks", "2", "--iterations", "16", "--epochs", "1", "--batch-size", "4"]
    args = [*shape, *CONTENTION_RUNS[name], "--out", str(out), "--name", name]
    if "decode" not in name:
        args += ["--cpu-units-per-ms", "500"]  # a fixed calibration: less time in the test
    job = _python("-m", "validation.job", *args)
    assert job.returncode == 0, job.stdout + job.stderr
    run = out / name
    settings = json.loads((run / "job.json").read_text())
    assert settings["local_world_size"] == 2 and settings["cores_available"] >= 1
    assert settings["device"] == "cpu" and settings["pin_memory"] is False
    if "decode" not in name:
        assert settings["cpu_units_per_ms"] == 500 and settings["cpu_calibrated_by"] == "argument"
        # the machine's own speed just before and after the run (the same calibration, alone)
        assert len(settings["cpu_speed_units_per_ms"]) == 2
        assert all(speed > 0 for speed in settings["cpu_speed_units_per_ms"])
    else:
        assert "cpu_speed_units_per_ms" not in settings
    align = json.loads((run / "start_align.json").read_text())
    assert align["mode"] == settings["start_align"]
    assert [r["batches"] for r in align["ranks"]] == [16, 16]
    parse = run_dsim("parse", str(run), "--out", str(tmp_path / "tr"))
    assert parse.returncode == 0, parse.stderr
    import pandas as pd

    fetch = pd.read_parquet(tmp_path / "tr" / name / "fetch.parquet")
    assert len(fetch) == 16 * 2
    if name.startswith("cpu"):
        # CPU work is logged as such (its wall time depends on this machine's speed, as the
        # calibration here is a fixed 500 units per ms), and no fetch spends more CPU than
        # wall time. (The start-max barrier's polling adds CPU of its own to each fetch.)
        cpu = fetch.cpu_s.to_numpy()
        assert (cpu > 0).all()
        assert (fetch.fetch_s.to_numpy() >= 0.95 * cpu).all()


def test_gpu_variant_refuses_cleanly_without_cuda(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the refusal is for machines without one")
    args = ["--regime", "decode", "--device", "cuda", "--out", str(tmp_path), "--name", "g"]
    job = _python("-m", "validation.job", *args, timeout=60)
    assert job.returncode == 2
    assert job.stderr.strip().splitlines()[-1] == (
        "validation.job: error: --device cuda: CUDA is not available here "
        "(use --device cpu, or a GPU machine)"
    )
    assert not (tmp_path / "g").exists()
    wrong = _python("-m", "validation.job", "--regime", "cpu", "--device", "cuda", "--name", "g")
    assert wrong.returncode == 2 and "decode regime only" in wrong.stderr


def test_ranks_share_gpus_only_when_asked_and_then_all_reduce_with_gloo(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    from validation import job

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert "4 ranks need 4 GPUs, 1 found (--share-gpus" in job.check_cuda(4)
    assert job.check_cuda(4, share=True) is None
    base = ["--regime", "decode", "--device", "cuda", "--ranks", "4", "--name", "g"]
    args = job.parse_args([*base, "--share-gpus"])
    args.gpus = 1
    assert [job.gpu_of(r, args) for r in range(4)] == [0, 0, 0, 0]
    assert job.backend_of(args) == "gloo"
    args.gpus = 4  # enough GPUs: each rank its own, NCCL even with the flag
    assert [job.gpu_of(r, args) for r in range(4)] == [0, 1, 2, 3]
    assert job.backend_of(args) == "nccl"
    assert job.backend_of(job.parse_args(base)) == "nccl"
    cpu = job.parse_args(["--regime", "decode", "--name", "g"])
    assert job.backend_of(cpu) == "gloo"
    with pytest.raises(SystemExit):
        job.parse_args(["--regime", "decode", "--share-gpus", "--name", "g"])


def test_bound_ranks_log_their_own_cpus_and_parse_to_the_nodes(tmp_path: Path) -> None:
    """``--bind`` (validation/job.py): each rank and its workers on their own share of the
    CPUs, as srun --cpu-bind runs them; each loader line then names its rank's set, and
    parse gives the node the union (SPEC §1.2)."""
    pytest.importorskip("torch")
    from validation.job import rank_cpus

    assert [rank_cpus(r, 4, [0, 1]) for r in range(4)] == [[0], [0], [1], [1]]
    assert [rank_cpus(r, 2, [0, 1, 2, 3]) for r in range(2)] == [[0, 1], [2, 3]]
    cpus = sorted(os.sched_getaffinity(0))
    out = tmp_path / "runs"
    args = ["--ranks", "2", "--iterations", "8", "--epochs", "1", "--batch-size", "4",
            "--regime", "cpu", "--workers", "1", "--cpu-units-per-ms", "500", "--bind",
            "--out", str(out), "--name", "bound"]  # fmt: skip
    job = _python("-m", "validation.job", *args)
    assert job.returncode == 0, job.stdout + job.stderr
    assert json.loads((out / "bound" / "job.json").read_text())["bind"] is True
    parse = run_dsim("parse", str(out / "bound"), "--out", str(tmp_path / "tr"))
    assert parse.returncode == 0, parse.stderr
    loader = json.loads((tmp_path / "tr" / "bound" / "run.json").read_text())["loader"]
    shares = [rank_cpus(r, 2, cpus) for r in range(2)]
    assert loader["cores"] == len({c for share in shares for c in share})
    if len(cpus) > 1:  # one CPU: both ranks share it, and the count is the union's
        assert loader["process_cores"] == len(shares[0])
