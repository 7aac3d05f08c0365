"""Inputs `dsim parse` must read or refuse clearly: pipes, unreadable files,
per-rank runs with repeated lines, stray ranks, logs cut short, runs without training lines.

What parse or run says about one input (a warning, a refusal) is checked through the
CLI's entry point in-process (conftest's ``run_dsim_in_process``); pipes, process
substitution and repeated lines through the real CLI in a subprocess.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run_dsim, run_dsim_in_process
from loglines import T0, fetch_line, one_epoch, run_of, timed_lines

from dsim.analysis.verdict import loader_calibration
from dsim.app.runplan import logged_loader
from dsim.errors import InputError
from dsim.sources.rawlog.discover import RunSource, discover_runs
from dsim.sources.rawlog.parse import STRAY_RANK, parse_run

SAMPLE = REPO / "traces" / "raw" / "cpuDDP_synthetic_none_mlp_epoch2_b128_worker2_thread0"


def _per_rank_copy(tmp_path: Path) -> Path:
    run = tmp_path / "r"
    shutil.copytree(SAMPLE, run)
    return run


def test_per_rank_files_that_each_repeat_their_last_line(tmp_path):
    """A job re-run into the same directory appends: once crashed with KeyError 'r/rank1.log'."""
    run = _per_rank_copy(tmp_path)
    for rank in (0, 1):
        path = run / f"rank{rank}.log"
        path.write_bytes(path.read_bytes() + path.read_bytes().splitlines(keepends=True)[-1])
    result = run_dsim("parse", str(run), "--out", "t", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "t" / "r" / "rejects.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(Path(r["file"]).name, r["reason"]) for r in rows] == [
        ("rank0.log", "duplicate training record"),
        ("rank1.log", "duplicate training record"),
    ]
    assert all(r["text"].startswith("2026-") and "Epoch: [1][299/300]" in r["text"] for r in rows)


def test_per_rank_files_with_a_clock_going_back_in_two_files(tmp_path):
    run = _per_rank_copy(tmp_path)
    for rank in (2, 0):
        path = run / f"rank{rank}.log"
        lines = path.read_text().splitlines(keepends=True)
        lines[100] = lines[100].replace("2026-11-21 16:", "2026-11-21 15:", 1)
        path.write_text("".join(lines))
    parsed = parse_run(discover_runs([run])[0])
    assert parsed.report["skipped"] == {"timestamp out of order (outlier)": 2}
    rows = parsed.rejects.to_pylist()
    assert [(Path(r["file"]).name, r["line"]) for r in rows] == [
        ("rank0.log", 101),
        ("rank2.log", 101),
    ]
    assert all(" 15:" in r["text"] for r in rows)


def test_rejects_carry_the_text_of_their_line(tmp_path):
    lines = [text for _, text in timed_lines(iters=60)]
    lines.insert(5, lines[3])  # a training line written twice
    k = next(n for n, line in enumerate(lines) if "GPU: 1 Epoch: [1][ 30/60]" in line)
    lines[k] = lines[k].replace("GPU: 1", "GPU: 7").replace("\t", "  ")  # a stray rank
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}, newline="\r\n"))
    texts = {r["reason"]: r["text"] for r in parsed.rejects.to_pylist()}
    assert texts == {"duplicate training record": lines[5], STRAY_RANK: lines[k]}


def test_a_log_cut_short_reports_the_iterations_it_holds(tmp_path):
    lines = one_epoch(gpus=(0, 1), iters=3, epoch=0) + one_epoch(iters=2, epoch=1, base=20)
    log = tmp_path / "cut" / "output.log"
    log.parent.mkdir()
    log.write_text("\n".join(lines) + "\n")
    parsed = parse_run(discover_runs([log])[0])
    assert parsed.tables.info.iterations_per_epoch == {"0": 3, "1": 2}
    assert parsed.tables.info.declared_iterations_per_epoch == {"0": 3, "1": 3}
    result = run_dsim_in_process("parse", str(log), "--out", "t", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "epochs 0,1, 3 iterations per epoch, epoch 1: 2 of 3 iterations;" in result.stdout


def test_fetch_only_epochs_count_their_batches(tmp_path):
    lines = [fetch_line(f"{10 + k}.0", 0, 0, "0.5", i) for k, i in enumerate([0, 1, 2, 0, 1])]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert parsed.tables.info.iterations_per_epoch == {"0": 3, "1": 2}
    assert parsed.tables.info.declared_iterations_per_epoch is None
    assert any("no training lines" in w for w in parsed.report["warnings"])


def test_dev_null_is_an_empty_input_not_a_directory(tmp_path):
    result = run_dsim_in_process("parse", "/dev/null", "--out", "t", cwd=tmp_path)
    assert result.returncode == 3
    assert "/dev/null: no fetch or training records found (the input is empty)" in result.stderr


def test_a_fifo_and_a_process_substitution_are_files(tmp_path):
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    text = (SAMPLE / "rank1.log").read_bytes()
    writer = subprocess.Popen(["sh", "-c", f"cat '{SAMPLE / 'rank1.log'}' > '{fifo}'"])
    try:
        result = run_dsim("parse", str(fifo), "--name", "piped", "--out", "t", cwd=tmp_path)
    finally:
        writer.wait(timeout=30)
    assert result.returncode == 0, result.stderr
    info = json.loads((tmp_path / "t" / "piped" / "run.json").read_text())
    assert info["gpus"] == 1 and info["report"]["lines"] == text.count(b"\n")
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is needed for a process substitution")
    command = f"'{os.sys.executable}' -m dsim parse <(cat '{SAMPLE / 'rank1.log'}') --name sub"
    done = subprocess.run([bash, "-c", command + " --out t"], cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "t" / "sub" / "fetch.parquet").exists()


def test_unreadable_file_is_an_input_error_exit_3(tmp_path, monkeypatch):
    """Root reads anything, so the refusal is simulated: click's check and open() both say no."""
    log = tmp_path / "secret.log"
    log.write_text("\n".join(one_epoch()) + "\n")
    real_open = open

    def deny(path, *args, **kwargs):
        if Path(path) == log:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", deny)
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    # through run_dsim_in_process, which restores the signal handlers: dsim.cli.main
    # ignores SIGINT/SIGTERM as it leaves, and called bare it left this test process so
    done = run_dsim_in_process("parse", log, "--out", tmp_path / "t")
    assert done.returncode == 3
    assert f"{log}: cannot read: Permission denied" in done.stderr


def test_unreadable_file_for_real_when_a_user_namespace_can_be_made(tmp_path):
    """``unshare -U`` drops root's right to read any file (where the kernel allows it)."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-U", "true"]).returncode != 0:
        pytest.skip("no unprivileged user namespaces here")
    log = tmp_path / "secret.log"
    log.write_text("\n".join(one_epoch()) + "\n")
    log.chmod(0)
    done = subprocess.run(
        [unshare, "-U", os.sys.executable, "-m", "dsim", "parse", str(log), "--out", "t"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    if "Permission denied" not in done.stderr and done.returncode == 0:
        pytest.skip("the namespace could still read the file")
    assert done.returncode == 3, done.stderr
    assert f"{log}: cannot read: Permission denied" in done.stderr
    closed = tmp_path / "closed"
    closed.mkdir()
    closed.chmod(0)
    done = subprocess.run(
        [unshare, "-U", os.sys.executable, "-m", "dsim", "parse", str(closed), "--out", "t"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    closed.chmod(0o755)
    assert done.returncode == 3, done.stderr
    assert f"{closed}: cannot read: Permission denied" in done.stderr


def test_tiny_files_are_read_whole(tmp_path):
    """The first bytes are read apart (for compression magic): short files must not suffer.

    Compressed files: tests/test_parse_compressed.py.
    """
    one = (fetch_line("10.0", 0, 0, "0.5", 0) + "\n").encode()
    for content, records in ((b"x\n", 0), (one, 1)):
        log = tmp_path / "tiny.log"
        log.write_bytes(content)
        if records:
            assert parse_run(RunSource("run", (log,))).report["fetch_records"] == records
        else:
            with pytest.raises(InputError):
                parse_run(RunSource("run", (log,)))
    log.write_bytes(b"a\nbc\n")
    with pytest.raises(InputError, match=r"2 lines read"):
        parse_run(RunSource("run", (log,)))


def test_a_flipped_rank_digit_is_a_stray_rank(tmp_path):
    """``GPU: 1`` -> ``GPU: 7`` on one line: 2 GPUs, not 3, and the stray is named."""
    lines = [text for _, text in timed_lines(iters=60)]
    k = next(n for n, line in enumerate(lines) if "GPU: 1 Epoch: [0][ 30/60]" in line)
    lines[k] = lines[k].replace("GPU: 1", "GPU: 7")
    log = tmp_path / "output.log"
    log.write_text("\n".join(lines) + "\n")
    result = run_dsim_in_process("parse", str(log), "--name", "run", "--out", "t", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    info = json.loads((tmp_path / "t" / "run" / "run.json").read_text())
    assert info["gpus"] == 2 and info["gpu_ids"] == [0, 1]
    assert info["report"]["skipped"] == {STRAY_RANK: 1}
    assert info["report"]["incomplete_iterations"]["count"] == 1
    assert info["report"]["stray_ranks"] == [{"gpu": 7, "records": 1}]
    message = (
        f"GPU 7 appears in only 1 record (output.log:{k + 1}); left out as a stray rank "
        "(--stray-rank-share 0 keeps it)"
    )
    assert f"warning: {message}" in result.stdout
    result = run_dsim_in_process(
        "parse", str(log), "--name", "run", "--stray-rank-share", "0", "--out", "t", cwd=tmp_path
    )
    info = json.loads((tmp_path / "t" / "run" / "run.json").read_text())
    assert info["gpus"] == 3 and info["report"]["rejected"] == 0


def test_run_without_training_lines_says_what_to_do(tmp_path):
    log = tmp_path / "logs" / "fetchonly" / "output.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(line for line in one_epoch() if "FETCH" in line) + "\n")
    result = run_dsim_in_process("parse", str(log), "--out", "traces", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "warning: no training lines (did you wrap your loop with" in result.stdout
    result = run_dsim_in_process(
        "run", "fetchonly", "--traces", "traces", "--out", "res", cwd=tmp_path
    )
    assert result.returncode == 3
    assert (
        "no training lines in this run: did you wrap your training loop with "
        "dsim.instrument.TrainingTimer.iterate?" in result.stderr
    )
    assert "{" not in result.stderr


def test_run_with_a_gpu_lacking_training_lines_names_it(tmp_path):
    lines = [line for line in one_epoch(gpus=(0, 1)) if "GPU: 1 Epoch" not in line]
    log = tmp_path / "logs" / "half" / "output.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(lines) + "\n")
    assert run_dsim_in_process("parse", str(log), "--out", "traces", cwd=tmp_path).returncode == 0
    result = run_dsim_in_process("run", "half", "--traces", "traces", "--out", "res", cwd=tmp_path)
    assert result.returncode == 3
    assert (
        "no complete iteration to replay: 0 iterations lack a fetch record for some GPU, "
        "3 lack a training record; GPU 1 has no training records" in result.stderr
    )


@pytest.mark.parametrize("entry", ["broken link", "link loop", "fifo"])
def test_a_log_named_entry_that_cannot_be_read_is_an_error_not_a_missing_rank(tmp_path, entry):
    """A directory run skipped such entries without a word: the run lost that rank's logs
    and parsed as fewer GPUs (found by an adversarial check of the CLI)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.log").write_text("\n".join(one_epoch(gpus=(0,), iters=3)) + "\n")
    bad = run / "rank1.log"
    if entry == "broken link":
        bad.symlink_to(tmp_path / "nowhere.log")
    elif entry == "link loop":
        bad.symlink_to(run / "rank2.log")
        (run / "rank2.log").symlink_to(bad)
    else:
        os.mkfifo(bad)
    with pytest.raises(InputError, match="cannot read") as caught:
        discover_runs([run])
    assert caught.value.path in (bad, run / "rank2.log")
    with pytest.raises(InputError, match="cannot read"):
        discover_runs([tmp_path])  # found below a directory too
    proc = run_dsim("parse", run, "--out", tmp_path / "traces")
    assert proc.returncode == 3 and "cannot read" in proc.stderr, proc.stderr
    assert not (tmp_path / "traces").exists() or not any((tmp_path / "traces").iterdir())


@pytest.mark.parametrize(("logged", "warned"), [(0, True), (1, True), (2, False), (4, False)])
def test_loader_lines_that_count_fewer_workers_than_the_fetch_lines_show_are_warned(
    tmp_path, logged, warned
):
    """`num_workers 0` beside fetch lines from workers 0 and 1 was taken as measured
    without a word (found by an adversarial check of the CLI)."""
    prefetch = "none" if logged == 0 else "2"
    loader = [
        f"{T0}09.0 GPU: {g} LOADER num_workers {logged} prefetch_factor {prefetch} batch_size 8 "
        "persistent_workers 0 pin_memory 0"
        for g in (0, 1)
    ]
    parsed = parse_run(run_of(tmp_path, {"output.log": loader + one_epoch(iters=4)}))
    found = [w for w in parsed.report.get("warnings", []) if "the loader lines say" in w]
    assert bool(found) == warned, parsed.report.get("warnings")
    settings = logged_loader(parsed.tables.info)
    if warned:
        assert f"num_workers {logged}, but GPU 0's fetch lines come from 2 workers" in found[0]
        assert "the pipeline model calibrates with 2 (the fetch lines')" in found[0]
        # ... and does: it replayed the loader lines' count as measured (1 worker where 2 ran)
        assert parsed.tables.info.loader["fetch_workers"] == 2
        assert (settings.workers, settings.source) == (2, "log+ids")
        measured = {"measured": settings.document()}
        assert "counted from the fetch lines' worker ids" in loader_calibration(measured)
    else:
        assert "fetch_workers" not in parsed.tables.info.loader
        assert (settings.workers, settings.source) == (logged, "log")


@pytest.mark.parametrize(
    ("loader", "said"),
    [
        ({"num_workers": 2, "prefetch_factor": 0}, "loader prefetch_factor 0 is not an integer"),
        ({"num_workers": -1, "prefetch_factor": 2}, "loader num_workers -1 is not an integer"),
        ({"num_workers": 100000}, "loader num_workers 100000 is not an integer from 0 to 1024"),
        ({"num_workers": 2, "cores": "many"}, "loader cores 'many' is not an integer"),
    ],
)
def test_a_run_json_whose_loader_no_dataloader_runs_with_is_refused(tmp_path, loader, said):
    """An edited run.json with prefetch_factor 0 gave a 300-digit speed-up and exit 0."""
    from tracegen import write_synthetic

    run_dir = write_synthetic(tmp_path / "traces", "r1", iterations=30)
    info = json.loads((run_dir / "run.json").read_text())
    info["loader"] = loader
    (run_dir / "run.json").write_text(json.dumps(info))
    proc = run_dsim_in_process("run", "r1", "--model", "pipeline", "-q", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().startswith(f"dsim: error: {Path('traces/r1/run.json')}: {said}")


@pytest.mark.parametrize(
    ("pattern", "into", "reason"),
    [
        # an iteration count of 10 digits: every line malformed
        (r"\]\[( *\d+)/\d+\]", r"][\1/9999999999]", "malformed training line"),
        # a Time past a day: a reason that does not say "training"
        (r"\tTime [0-9.]+ \(", "\tTime 999999.0 (", None),
    ],
)
def test_training_lines_that_are_all_rejected_are_not_blamed_on_the_instrumentation(
    tmp_path, pattern, into, reason
):
    """Every training line rejected read "no training lines (did you wrap your loop with
    dsim.instrument.TrainingTimer.iterate?)", and `dsim run` asked the same."""
    import re

    lines = [re.sub(pattern, into, x) if "Epoch:" in x else x for x in one_epoch(iters=6)]
    (tmp_path / "logs").mkdir()
    run = run_of(tmp_path / "logs", {"output.log": lines})
    parsed = parse_run(run)
    if reason is not None:
        assert parsed.report["skipped"] == {reason: 12}
    assert parsed.report["training_lines_rejected"] == 12
    assert (
        "no training line kept: 12 training lines rejected (see rejects.csv)"
        in (parsed.report["warnings"])
    )
    assert not any("TrainingTimer" in w for w in parsed.report["warnings"])
    proc = run_dsim_in_process("parse", tmp_path / "logs", "--out", tmp_path / "traces", "-q")
    assert proc.returncode == 0, proc.stderr
    proc = run_dsim_in_process("run", "logs", "--traces", tmp_path / "traces", cwd=tmp_path)
    assert proc.returncode == 3
    assert (
        "no training line of this run was kept: parse rejected them (12 training lines; "
        "all rejects by reason: " in proc.stderr
    )
    assert "TrainingTimer" not in proc.stderr
