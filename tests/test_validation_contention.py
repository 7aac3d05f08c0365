"""validation/contention.py: how a fetch alignment moves the node's contention.

Pure parts on hand-made arrays; the command on the committed logs of the eleventh
held-out sweep (two repeats, to stay quick).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from validation.contention import runnable_overlap


def test_runnable_overlap_counts_the_fetches_on_a_core_or_waiting() -> None:
    start = np.array([[0.0, 0.0]])
    fetch = np.array([[1.0, 1.0]])
    rows = np.ones((1, 2), dtype=bool)
    busy = np.array([[0.4, 0.4]])  # CPU 0.4 s, run-queue wait 0.6 s: runnable throughout
    assert abs(runnable_overlap(start, fetch, busy, 1.0 - busy, rows) - 2.0) < 1e-12
    # apart in time: each sees itself only
    apart = np.array([[0.0, 5.0]])
    assert abs(runnable_overlap(apart, fetch, busy, 1.0 - busy, rows) - 1.0) < 1e-12
    # the second asleep (I/O) half of its wall time: it counts for half, for both batches
    cpu, runq = np.array([[0.4, 0.25]]), np.array([[0.6, 0.25]])
    assert abs(runnable_overlap(start, fetch, cpu, runq, rows) - 1.5) < 1e-12


def test_the_aligned_re_runs_wait_longer_per_cpu_second_and_the_model_says_so() -> None:
    """The held-out sweep's mixed regime at 2 workers: aligned fetches overlap more, and each
    CPU second waits longer for a core than in the unaligned runs (3.20 against 2.28 over ten
    repeats); the model's solved stretch replays that level (3.20), so its share miss there is
    not the contention's level: at the re-runs' stretch the share hardly moves."""
    done = subprocess.run(
        [sys.executable, "-m", "validation.contention", "--data",
         "validation/data-holdout10", "--regime", "mixed", "--workers", "2", "--repeats", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = {line.split("|")[1].strip(): line.split("|") for line in done.stdout.splitlines()
            if line.startswith("| align ")}  # fmt: skip
    assert set(rows) == {"align mean", "align min"}
    base, model, rerun = (float(x) for x in rows["align mean"][2].split("→"))
    assert rerun > base + 0.5 and abs(model - rerun) < 0.3
    before, after = (float(x) for x in rows["align mean"][4].split("→"))
    assert after > before
    share = [float(x) for x in rows["align mean"][7].split("/")]  # measured, predicted, swapped
    assert abs(share[2] - share[1]) < 3.0
    # the tried rules on A's start times and on the replayed schedule: both under A at align min
    on_a_starts, on_replayed = (float(x) for x in rows["align min"][3].split(","))
    assert on_a_starts < base and on_replayed < base


def test_a_regime_without_aligned_re_runs_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "validation.contention", "--data",
         "validation/data-holdout10", "--regime", "mixed", "--workers", "4"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "no unaligned run and fetch-aligned re-run of mixed at 4 workers" in done.stderr


def test_not_a_sweep_directory_or_no_repeats_is_one_line(tmp_path) -> None:
    for args, code, words in (
        (["--data", str(tmp_path)], 3, f"{tmp_path}: no manifest.json (not a sweep directory)"),
        (["--data", "validation/data-holdout10", "--repeats", "0"], 2,
         "--repeats must be at least 1"),
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "validation.contention", *args, "--regime", "mixed",
             "--workers", "2"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == code, done.stderr
        assert words in done.stderr and "Traceback" not in done.stderr


def test_in_flight_is_the_others_overlap_over_each_interval() -> None:
    from validation.cpugrowth import in_flight

    start, end = np.array([0.0, 0.5, 3.0, 4.0]), np.array([1.0, 1.5, 3.0, 6.0])
    # the first two overlap by 0.5 s each; the third has no length; the fourth is alone
    np.testing.assert_allclose(in_flight(start, end), [0.5, 0.5, 0.0, 0.0])
    inside = in_flight(np.array([0.0, 1.0]), np.array([4.0, 2.0]))
    np.testing.assert_allclose(inside, [0.25, 1.0])  # a short one wholly inside a long one


def test_cpu_growth_table_on_the_committed_logs() -> None:
    """The decode regime's CPU time per batch on the first sweep: more with more workers."""
    done = subprocess.run(
        [sys.executable, "-m", "validation.cpugrowth", "--data", "validation/data-cpu",
         "--only", "^decode_w(1|2)_p2_none_r(1|2)$"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines()[2:]]
    assert [(r[0].strip(), r[1].strip(), r[2].strip()) for r in rows] == [
        ("decode", "1", "2"),
        ("decode", "2", "2"),
    ]
    assert float(rows[0][4]) == 1.0 and float(rows[1][4]) > 1.0
    # and each batch waited longer for a core (it took more turns) at 2 workers
    wait = [float(r[6].split("±")[0]) for r in rows]
    assert 0 < wait[0] < wait[1]


def test_timeslice_rounds_rotate_and_the_table_divides_by_the_process_alone() -> None:
    from validation.timeslice import Row, rounds, table

    assert rounds([1, 2, 4], 4) == [[1, 2, 4], [2, 4, 1], [4, 1, 2], [1, 2, 4]]
    text = table(
        [Row("decode", 2, [1.1, 1.3]), Row("decode", 1, [1.0, 1.0]), Row("spin", 4, [2.0])]
    )
    lines = text.splitlines()
    assert lines[2] == "| decode | 1 | 2 | 1.000 ± 0.000 | 1.000 |"
    assert lines[3] == "| decode | 2 | 2 | 1.200 ± 0.141 | 1.200 |"
    assert lines[4] == "| spin | 4 | 1 | 2.000 ± 0.000 | n/a |"  # no alone row to divide by
    # beside a training process: divided by the work alone, without one
    beside = table([Row("decode", 1, [1.0]), Row("decode + train", 2, [1.5])])
    assert beside.splitlines()[3] == "| decode + train | 2 | 1 | 1.500 ± 0.000 | 1.500 |"


def _timeslice(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "validation.timeslice", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_timeslice_command_times_both_works_on_one_core() -> None:
    """Real processes pinned to one core: every cell measured, CPU per unit positive."""
    done = _timeslice("--repeats", "1", "--units", "5", "--processes", "1,2")
    assert done.returncode == 0, done.stderr
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert [(r[1].strip(), r[2].strip()) for r in rows] == [
        ("decode", "1"),
        ("decode", "2"),
        ("spin", "1"),
        ("spin", "2"),
    ]
    assert all(float(r[4].split("±")[0]) > 0 for r in rows)
    bad = _timeslice("--processes", "0")
    assert bad.returncode == 2 and "must be >= 1" in bad.stderr
    too_many = _timeslice("--cores", "4096")
    assert too_many.returncode == 2 and "--cores 4096: this process may use" in too_many.stderr


def test_timeslice_beside_a_training_process() -> None:
    pytest.importorskip("torch")
    done = _timeslice("--work", "decode", "--repeats", "1", "--units", "3", "--processes", "1",
                      "--beside-train")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [line.split("|")[1].strip() for line in done.stdout.splitlines()[4:6]] == [
        "decode",
        "decode + train",
    ]


def test_a_timeslice_process_that_dies_is_an_error_not_a_hang() -> None:
    """A child that fails (here: a work it does not know) before the start: the others would
    wait at the barrier and no result would come; the cell ends in seconds with the reason."""
    import os
    import time

    from validation.timeslice import measure

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with 1"):
        measure("nonsense", 2, 1, [min(os.sched_getaffinity(0))])
    assert time.monotonic() - t0 < 60
