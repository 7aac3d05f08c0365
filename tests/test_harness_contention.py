"""The contention harness's torch-free parts: CPU work, calibration, start-align board, plan.

The physical runs (cpu, mixed, decode, start-align max) are in
tests/test_fidelity_smoke.py; these need neither torch nor a DDP job.
"""

from __future__ import annotations

import multiprocessing
import platform
import sys
import time

import numpy as np
import pytest
from conftest import REPO

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from validation import startalign
from validation.cpuwork import calibrate, spin, units_for
from validation.regimes import REGIMES, Regime, cost_table, size_factors
from validation.sweep import calibration, parse_args, plan_cpu, sweep


def test_calibration_makes_work_take_its_cpu_time() -> None:
    units = calibrate(rounds=3, units=5_000)
    assert units > 0
    t0 = time.thread_time()
    spin(units_for(30, units))
    used_ms = (time.thread_time() - t0) * 1e3
    assert 15 < used_ms < 90  # ~30 ms of CPU time; generous for a shared CI machine
    assert units_for(0, units) == 0
    with pytest.raises(ValueError):
        units_for(1, 0)


def _rank(path: str, mode: str, rank: int, delays: list[float], out) -> None:
    gate = startalign.StartGate(path, mode, (1, len(delays), 3))
    for batch, delay in enumerate(delays):
        time.sleep(delay * rank)  # rank 2 posts last, by 2 x delay
        gate.enter(0, batch, rank)
    out.put(rank)


def _run_board(mode: str, delays: list[float]) -> np.ndarray:
    ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    path = startalign.create_board(1, len(delays), 3, tag="test")
    try:
        done = ctx.Queue()
        procs = [
            ctx.Process(target=_rank, args=(str(path), mode, r, delays, done)) for r in range(3)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        gate = startalign.StartGate(path, mode, (1, len(delays), 3))
        return gate.read()
    finally:
        startalign.remove_board(path)
        assert not path.exists()


def test_start_max_is_a_barrier_and_min_never_waits() -> None:
    delays = [0.01, 0.0, 0.02, 0.005]
    board = _run_board("max", delays)
    posted, began = board[0, 0], board[1, 0]
    assert (began >= posted.max(axis=1, keepdims=True) - 1e-9).all()  # all gated to the last
    summary = startalign.summarize(board, "max")
    assert summary["ranks"][2]["waited"]["mean_ms"] < summary["ranks"][0]["waited"]["mean_ms"]

    board = _run_board("min", delays)
    posted, began = board[0, 0], board[1, 0]
    # causal, and gated to no one: it starts at its own start. Gating to the last poster would
    # wait up to 40 ms; a loaded CI machine may deschedule a process for a few ms (the median).
    lag = began - posted
    assert (lag >= -1e-9).all() and np.median(lag) < 0.005 and lag.max() < 0.02
    summary = startalign.summarize(board, "min")
    by_rank = {r["rank"]: r for r in summary["ranks"]}
    # a batch is clipped on every rank that posted more than CLIP_S after its earliest
    # poster, never on that poster. Which rank posts first is the scheduler's (a loaded
    # machine once ran rank 0, which sleeps least, 1+ ms after rank 1 twice), so the
    # expectation is counted from the board itself
    late = posted - posted.min(axis=1, keepdims=True) > startalign.CLIP_S
    assert [by_rank[r]["clipped"]["count"] for r in range(3)] == late.sum(axis=0).tolist()
    assert not late[np.arange(len(delays)), posted.argmin(axis=1)].any()
    assert by_rank[2]["clipped"]["count"] >= 2  # rank 2 posted 20 and 40 ms late
    assert by_rank[2]["clipped"]["p90_ms"] >= 15


def _wait_at_barrier(path: str, out) -> None:
    gate = startalign.StartGate(path, "max", (1, 1, 2))
    gate._open()  # the file's mapping is not the waiting's cost
    cpu, wall = time.process_time(), time.monotonic()
    gate.enter(0, 0, 0)
    out.put((time.process_time() - cpu, time.monotonic() - wall))


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"),
    reason="no futex here: the barrier polls",
)
def test_start_max_waits_asleep_not_spinning() -> None:
    """A rank held 2 s at the barrier spends almost no CPU: polling every 0.2 ms spent
    ~0.2 s of CPU per 2 s here, CPU the trainers sharing the cores then lacked."""
    ctx = multiprocessing.get_context("fork")
    path = startalign.create_board(1, 1, 2, tag="test")
    try:
        done = ctx.Queue()
        waiter = ctx.Process(target=_wait_at_barrier, args=(str(path), done))
        waiter.start()
        time.sleep(2.0)
        startalign.StartGate(path, "max", (1, 1, 2)).enter(0, 0, 1)
        cpu, wall = done.get(timeout=30)
        waiter.join(timeout=30)
        assert waiter.exitcode == 0
    finally:
        startalign.remove_board(path)
    assert wall >= 1.5  # it did wait for the other rank
    assert cpu < 0.1, f"{cpu:.3f} s of CPU while waiting {wall:.2f} s"


def test_unposted_board_is_refused() -> None:
    board = np.full((2, 1, 2, 2), np.nan)
    with pytest.raises(ValueError, match="never posted"):
        startalign.summarize(board, "max")
    with pytest.raises(ValueError):
        startalign.StartGate("x", "none", (1, 1, 1))


def test_sleep_regimes_record_as_before_and_decode_sizes_follow_the_table() -> None:
    assert "kind" not in REGIMES["balanced"].as_dict()  # the committed sweep's records hold
    assert REGIMES["cpu"].as_dict()["kind"] == "cpu"
    assert Regime(**REGIMES["decode"].as_dict()) == REGIMES["decode"]
    with pytest.raises(ValueError):
        Regime("x", 1, 0, 0, 0, 1, 0, kind="gpu")
    dec = REGIMES["decode"]
    sizes = size_factors(dec, 1, 50, 4, seed=0)
    assert np.allclose(sizes * dec.batch_ms / 1000, cost_table(dec, 1, 50, 4, seed=0))
    assert sizes[:, :, 3].mean() > sizes[:, :, 0].mean()  # rank 3's images are larger


def test_cpu_plan_interleaves_repeats_and_names_runs() -> None:
    runs = plan_cpu(["cpu", "decode"], [1, 2, 4, 8], repeats=3)
    names = [r.name for r in runs]
    assert len(names) == len(set(names)) == 3 * (11 + 4)
    cpu = [n for n in names if n.startswith("cpu_")]
    assert cpu[:11] == [n.replace("_r2", "_r1") for n in cpu[11:22]]  # A, B, C, A, B, C
    assert all(n.endswith("_r1") for n in cpu[:11]) and cpu[11].endswith("_r2")
    assert {"cpu_w2_p2_none_smin_r1", "cpu_w2_p2_none_smax_r3", "cpu_w2_p2_none_sctl_r2"} <= set(
        names
    )
    assert "cpu_w1_p2_min_r3" in names and "cpu_w8_p2_none_r1" in names
    assert not [n for n in names if n.startswith("decode_") and ("_min" in n or "_s" in n)]


def test_cpu_plan_prefetch_cells_at_every_worker_count() -> None:
    """--prefetch adds a cell per factor at every worker count (tunecheck's grid needs the
    product), unaligned, repeated like the rest; the base factor is not a what-if."""
    args = parse_args(["--regime", "decode", "--workers", "1", "4", "--prefetch", "4", "1", "2"])
    assert args.prefetch == [1, 4]
    names = [r.name for r in plan_cpu(args.regime, args.workers, 2, tuple(args.prefetch))]
    assert names[:6] == [
        "decode_w1_p2_none_r1", "decode_w4_p2_none_r1", "decode_w1_p1_none_r1",
        "decode_w1_p4_none_r1", "decode_w4_p1_none_r1", "decode_w4_p4_none_r1",
    ]  # fmt: skip
    assert names[6:] == [n.replace("_r1", "_r2") for n in names[:6]]
    with pytest.raises(SystemExit):
        parse_args(["--prefetch", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--plan", "legacy", "--prefetch", "4"])


def test_dry_run_prints_plan_count_and_estimate(tmp_path, capsys) -> None:
    sweep(parse_args(["--dry-run", "--out", str(tmp_path)]))
    out = capsys.readouterr().out.splitlines()
    assert sum("validation.job" in line for line in out) == 111
    assert "--cpu-units-per-ms CALIBRATED" in out[0] and "--name cpu_w1_p2_none_r1" in out[0]
    assert out[-1].startswith("# plan cpu: 111 runs of 111, estimated ")
    minutes = float(out[-1].split("estimated ")[1].split()[0])
    assert 5 < minutes <= 30
    assert not (tmp_path / "manifest.json").exists()


def test_sweep_refuses_a_gpu_plan_for_cpu_regimes() -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--device", "cuda", "--regime", "cpu", "--dry-run"])
    assert exc.value.code == 2
    assert parse_args(["--device", "cuda", "--dry-run"]).regime == ["decode"]


def test_calibration_is_measured_once_and_kept_for_a_resumed_sweep(tmp_path) -> None:
    manifest: dict = {"format": 1, "runs": {}}
    args = parse_args(["--out", str(tmp_path)])
    first = calibration(manifest, args)
    assert first > 0 and manifest["calibration"]["cpu_units_per_ms"] == first
    assert manifest["calibration"]["how"] == "measured at the sweep's start"
    manifest["calibration"]["cpu_units_per_ms"] = 123.0  # a resumed sweep reuses it
    assert calibration(manifest, args) == 123.0
    given = parse_args(["--out", str(tmp_path), "--cpu-units-per-ms", "77"])
    assert calibration(manifest, given) == 77.0 and manifest["calibration"]["how"] == "argument"
