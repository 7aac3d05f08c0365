"""A seeded fuzzer past the parse: edited instrumented logs through run, tune and report.

``test_fuzz_parse`` checks that a damaged log parses to its undamaged records;
what it keeps must then be replayable. Each case here takes an instrumented
run (the harness's logs: CPU times, the worker process's CPU, LOADER lines),
gives a few of its optional values adversarial spellings and sizes (0, -1,
nan, inf, 1e308, 3.5e3, 0x10, a LOADER field out of range, a LOADER line
copied into another rank's file), and runs ``dsim parse``, ``dsim run`` (both
models, a worker what-if), ``dsim tune`` and ``dsim report`` in process. The
oracle: every command ends in success or in a user's error (exit 2 or 3, one
line), never an internal error, and no NumPy warning (an overflow, an invalid
value) on the way. The first version of this fuzzer found two: 3500 s of
run-queue wait in a 53 ms fetch made the CPU-aware model's stretch 327x, a
predicted iteration time negative and ``dsim tune`` fail (``bounds.CPU_SLACK_S``
now rejects such a line); a CPU time of 1e-320 s made an aligned fetch's
run-queue share overflow to inf (``pipeline.CPU_RESOLUTION_S``).

``DSIM_FUZZ_DOWNSTREAM_CASES`` sets the number of cases (default 8, about 15 s);
``DSIM_FUZZ_SEED`` the first case's seed, to reproduce a failure alone.
"""

from __future__ import annotations

import gzip
import os
import random
import re
from pathlib import Path

import pytest
from conftest import REPO, run_dsim_in_process

CASES = int(os.environ.get("DSIM_FUZZ_DOWNSTREAM_CASES", "8"))
FIRST = int(os.environ.get("DSIM_FUZZ_SEED", "0"))
#: Instrumented runs of three regimes (2-core VM, 4 ranks x 100 iterations).
RUNS = [
    REPO / "validation" / "data-holdout24" / name
    for name in ("cpu_w2_p2_none_r1", "mixed_w1_p2_none_r1", "decode_w4_p2_none_r1")
]
VALUES = ["0", "-1", "-0.001", "1e308", "nan", "inf", "99999999", "1e-320", "0x10", "3.5e3",
          "0.5", "5", "1" * 40, ""]  # fmt: skip
LOADER_VALUES = {
    "cores": ["0", "1", "100000", "-2", "2.5", "x"],
    "local_world_size": ["0", "1", "1000", "-1", "y"],
    "cpus": ["0-1000000", "x", "5-2", "0,0,0", "-1"],
    "num_workers": ["0", "1000", "-1", "1"],
    "prefetch_factor": ["0", "1", "100000", "-3"],
    "batch_bytes": ["0", "1" * 30, "-5"],
}


def _edited(run: Path, rng: random.Random) -> dict[str, list[str]]:
    files = {
        p.name.removesuffix(".gz"): gzip.decompress(p.read_bytes()).decode().split("\n")
        for p in sorted(run.glob("rank*.log.gz"))
    }
    names = sorted(files)
    for _ in range(rng.randint(1, 30)):
        lines = files[rng.choice(names)]
        i = rng.randrange(len(lines))
        if "LOADER" in lines[i] and rng.random() < 0.7:
            key = rng.choice(list(LOADER_VALUES))
            lines[i] = re.sub(rf"{key} \S*", f"{key} {rng.choice(LOADER_VALUES[key])}", lines[i])
        else:
            key = rng.choice(["cpu", "runq", "proc", "CPU", "Runq"])
            lines[i] = re.sub(rf"\b{key} \S+", f"{key} {rng.choice(VALUES)}", lines[i])
        if rng.random() < 0.1:  # a LOADER line copied into another rank's file
            loader = [line for line in lines if "LOADER" in line]
            if loader:
                target = files[rng.choice(names)]
                target.insert(rng.randrange(1, len(target)), rng.choice(loader))
    return files


@pytest.mark.filterwarnings("error::RuntimeWarning")  # NumPy's overflow: the replay's inf
@pytest.mark.parametrize("case", range(FIRST, FIRST + CASES))
def test_edited_instrumented_logs_replay_or_fail_as_a_users_error(case: int, tmp_path: Path):
    rng = random.Random(case)
    run = RUNS[case % len(RUNS)]
    logs = tmp_path / "logs" / run.name
    logs.mkdir(parents=True)
    for name, lines in _edited(run, rng).items():
        (logs / name).write_text("\n".join(lines))
    traces, results = tmp_path / "traces", tmp_path / "results"
    steps = [
        ("parse", str(logs), "--out", traces),
        ("run", run.name, "--traces", traces, "--out", results, "--executor", "local"),
        ("run", run.name, "--traces", traces, "--out", tmp_path / "p", "--executor", "local",
         "--model", "pipeline", "--workers", "4"),
        ("tune", run.name, "--traces", traces, "--out", results),
        ("report", results, "--out", tmp_path / "report.html"),
    ]  # fmt: skip
    for step in steps:
        done = run_dsim_in_process(*step, "--quiet", cwd=tmp_path)
        said = f"case {case} (DSIM_FUZZ_SEED={case}), dsim {step[0]}: {done.stderr[-800:]}"
        assert "internal error" not in done.stderr, said
        assert done.returncode in (0, 2, 3), said
        if done.returncode:
            assert len(done.stderr.strip().splitlines()) == 1, said
            break


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_cpu_time_below_the_logs_resolution_is_zero_to_the_cpu_aware_model(tmp_path: Path):
    """Case 2247 of a longer run of the fuzzer: ``cpu 1e-320`` on a fetch that waited longer
    than it lasted (nothing left but its CPU time) made that fetch's CPU rate in the
    trainer passes overflow to inf, and ``dsim tune`` an internal error; a time below the
    logs' 1 ns resolution is now 0 to the model, a fetch that short spends no CPU at a
    rate."""
    run = RUNS[0]
    logs = tmp_path / "logs" / run.name
    logs.mkdir(parents=True)
    edited = False
    for p in sorted(run.glob("rank*.log.gz")):
        lines = gzip.decompress(p.read_bytes()).decode().split("\n")
        for i, line in enumerate(lines):
            found = re.search(r"at_time \S+ data idx(\d+) cpu \S+ runq \S+ proc", line)
            if not edited and found and int(found.group(1)) > 20:
                # the fastest rank's fetch of its batch (align min takes its work), waiting
                # longer than it lasted: nothing of it left but its CPU time
                lines[i] = re.sub(
                    r"at_time \S+ (data idx\d+) cpu \S+ runq \S+",
                    r"at_time 0.001000000 \1 cpu 1e-320 runq 0.002000000",
                    line,
                )
                edited = True
        (logs / p.name.removesuffix(".gz")).write_text("\n".join(lines))
    assert edited
    assert run_dsim_in_process("parse", logs, "--out", tmp_path / "t", cwd=tmp_path).returncode == 0
    done = run_dsim_in_process(
        "tune", run.name, "--traces", tmp_path / "t", "--out", tmp_path / "r", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "use num_workers=" in done.stdout
