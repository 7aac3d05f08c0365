"""`dsim parse` end to end: a real subprocess on a fresh directory.

Usage errors, help and inputs without records (one message and an exit code each)
go through the same entry point in-process (conftest's ``run_dsim_in_process``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from conftest import run_dsim, run_dsim_in_process
from loglines import fetch_line, one_epoch, train_line


def write(path, lines, tail="\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + tail)
    return path


def test_parse_writes_tables_and_report(tmp_path):
    log = write(
        tmp_path / "logs" / "myrun" / "output.log",
        [*one_epoch(gpus=(0, 1), iters=3), "noise", fetch_line("50.0", 0, 0, "-2", 9)],
    )
    result = run_dsim("parse", str(log), "--out", str(tmp_path / "traces"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "myrun: 2 GPUs, epochs 0, 3 iterations per epoch" in result.stdout
    assert "negative fetch duration" in result.stdout
    run_dir = tmp_path / "traces" / "myrun"
    assert pq.read_table(run_dir / "fetch.parquet").num_rows == 6
    assert pq.read_table(run_dir / "train.parquet").num_rows == 6
    info = json.loads((run_dir / "run.json").read_text())
    assert info["gpus"] == 2 and info["report"]["skipped"] == {"negative fetch duration": 1}
    assert info["sources"][0]["sha256"] and info["sources"][0]["size"] == log.stat().st_size
    rejects = (run_dir / "rejects.csv").read_text().splitlines()
    assert len(rejects) == 2 and ",14," in rejects[1]
    assert not list((tmp_path / "traces").glob(".*"))  # no temporary leftovers


def test_parse_tree_of_runs_in_parallel_and_quiet(tmp_path):
    for name in ("a", "b", "c"):
        write(
            tmp_path / "tree" / name / "rank0.log",
            [fetch_line("10.0", None, 0, "0.5", 0), train_line("10.5", None, 0, 0, n=1)],
        )
    result = run_dsim("parse", "tree", "-o", "out", "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a", "b", "c"]


def test_strict_stops_with_file_and_line(tmp_path):
    log = write(tmp_path / "run.log", [*one_epoch(gpus=(0,), iters=1), "GPU: 0 Epoch: [0] oops"])
    result = run_dsim("parse", str(log), "--strict", "--out", "t", cwd=tmp_path)
    assert result.returncode == 3
    assert f"{log}:3: malformed training line" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "t").exists()


def test_garbage_empty_and_missing_inputs(tmp_path):
    (tmp_path / "empty.log").write_bytes(b"")
    (tmp_path / "junk.log").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" * 1000)
    for name in ("empty.log", "junk.log"):
        result = run_dsim_in_process("parse", name, "--out", "t", cwd=tmp_path)
        assert result.returncode == 3, result.stderr
        assert "no fetch or training records" in result.stderr and name in result.stderr
        assert "Traceback" not in result.stderr
    result = run_dsim("parse", "nope.log", cwd=tmp_path)
    assert result.returncode == 3 and "nope.log: no such file or directory" in result.stderr
    assert not (tmp_path / "t").exists()


def test_usage_errors_exit_2(tmp_path):
    result = run_dsim_in_process("parse", cwd=tmp_path)
    assert result.returncode == 2
    write(tmp_path / "a" / "x.log", one_epoch(gpus=(0,), iters=1))
    write(tmp_path / "b" / "y.log", one_epoch(gpus=(0,), iters=1))
    result = run_dsim_in_process("parse", "a", "b", "--name", "one", cwd=tmp_path)
    assert result.returncode == 2 and "--name names one run" in result.stderr


def test_help_and_version():
    result = run_dsim_in_process("parse", "--help")
    assert result.returncode == 0 and "Examples" in result.stdout
    result = run_dsim("--version")
    assert result.returncode == 0 and result.stdout.startswith("dsim ")


def test_a_parse_worker_killed_from_outside_is_one_line_naming_its_run(tmp_path):
    """Issue #20: SIGKILL to one ``--jobs 2`` worker (as the OOM killer sends) was an internal
    error (BrokenProcessPool). Now: exit 1, one line naming the run, nothing half-written."""
    import os
    import signal
    import subprocess
    import sys

    for seed in (1, 2):  # a few seconds of parsing each on a loaded 2-core machine
        args = ("synth", "--gpus", "4", "--iterations", "10000", "--epochs", "2", "--workers", "4")
        made = run_dsim_in_process(*args, "--seed", str(seed), "-q", "--out", tmp_path / "logs")
        assert made.returncode == 0, made.stderr
    env = {**os.environ}
    env.pop("DSIM_DEBUG", None)
    for _ in range(5):  # a parse that ended before a worker was seen writing is started again
        shutil.rmtree(tmp_path / "traces", ignore_errors=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "dsim", "parse", "logs", "--out", "traces", "--jobs", "2"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        victim = _a_worker_writing_into(proc, tmp_path / "traces")
        if victim is not None:
            break
        proc.communicate(timeout=120)
    assert victim is not None, "no parse worker was ever seen writing its run"
    os.kill(victim, signal.SIGKILL)  # surely inside its run: its files are open
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsim: error: a parse worker process"), err
    assert "while parsing run synth_queue_seed" in err and "internal error" not in err
    left = (
        sorted(p.name for p in (tmp_path / "traces").iterdir())
        if (tmp_path / "traces").exists()
        else []
    )
    assert all(name.startswith("synth_queue_seed") for name in left), left  # no temporaries


def _a_worker_writing_into(proc, directory: Path) -> int | None:
    """A child of ``proc`` with a file under ``directory`` open, or None once ``proc`` ended.

    Why not a fixed delay: on an idle machine both runs were parsed within the
    0.5 s the test once slept, and the kill then hit a worker with nothing to do.
    """
    import os
    import time

    prefix = str(directory) + os.sep
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as listing:
                children = [int(pid) for pid in listing.read().split()]
        except OSError:
            return None
        for child in children:
            try:
                fds = os.listdir(f"/proc/{child}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{child}/fd/{fd}").startswith(prefix):
                        return child
                except OSError:
                    continue
        time.sleep(0.001)
    return None
