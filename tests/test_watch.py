"""dsim watch: a job's logs read while they grow give `dsim run`'s numbers for the same window.

The shipped sample's raw logs are written out piece by piece (cut in the
middle of lines, the logs rotated halfway) while ``Watch`` looks at them; a
real DDP job (examples/ddp_cpu.py, needs torch) is watched by ``dsim watch
--once`` in a subprocess while it trains.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_dsim_in_process

from dsim.app.watch import Watch

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "traces" / "raw" / "cpuDDP_synthetic_none_mlp_epoch2_b128_worker2_thread0"
EXAMPLE = REPO / "examples" / "ddp_cpu.py"
COMPARED = (
    "iterations",
    "iteration_s_mean",
    "iteration_s_std",
    "stall_s_mean",
    "stall_s_std",
    "delay_s_mean",
    "delay_s_std",
    "effective_delay_pct",
    "speedup",
    "stall_change_s",
    "effective_delay_change_pts",
)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) if isinstance(a, float) and math.isnan(a) else a == b


def _dsim_run_rows(logs: Path, tmp: Path, epochs: list[int], warmup: int) -> tuple:
    """`dsim run`'s summary rows (by policy), straggler, last shares and headline (the
    pipeline model's verdict, as its terminal leads with it) for ``epochs`` past ``warmup``."""
    import dsim
    from dsim.app.headline import pipeline_verdict
    from dsim.model.tables import read_run

    trace = dsim.parse(logs, out=tmp / "traces", quiet=True)
    results = dsim.run(trace, out=tmp / "results", epochs=epochs, warmup=warmup, quiet=True)
    summary = results.summary.to_dict("records")
    rows = {(r["fetch_align"], r["start_align"]): r for r in summary}
    import pandas as pd

    blame = pd.read_parquet(tmp / "results" / "attribution.parquet")
    run_dir = tmp / "traces" / logs.name
    headline = pipeline_verdict(summary, run_dir, read_run(run_dir).info.document())
    last_pct = blame.groupby("gpu")["gpu_last_pct"].first()
    return rows, int(blame["straggler_gpu"].iloc[0]), last_pct, headline


def test_a_growing_rotating_log_gives_dsim_runs_numbers(tmp_path: Path) -> None:
    logs = tmp_path / "logs" / SAMPLE.name
    logs.mkdir(parents=True)
    texts = {p.name: p.read_bytes() for p in sorted(SAMPLE.glob("*.log"))}
    for name in texts:
        (logs / name).touch()  # the job opens its logs before it writes a line
    pieces = 9
    with Watch(logs, window=20) as watch:
        for k in range(1, pieces + 1):
            for name, text in texts.items():
                lo, hi = len(text) * (k - 1) // pieces, len(text) * k // pieces
                hi = hi if k == pieces else hi - 17  # most pieces end inside a line
                lo = lo if k == 1 else len(text) * (k - 1) // pieces - 17
                if k == pieces // 2 + 1:  # the job ends its line in the file it had open
                    end = text.index(b"\n", lo) + 1
                    with open(logs / f"{name}.1", "ab") as handle:
                        handle.write(text[lo:end])
                    lo = end
                with open(logs / name, "ab") as handle:
                    handle.write(text[lo:hi])
                if k == pieces // 2:  # logrotate moves every log aside, then the job reopens
                    (logs / name).rename(logs / f"{name}.1")
            snapshot = watch.look()
            # Every piece but the last ends inside a line: never a record, nor a reject.
            assert watch.report["rejected"] == 0 and watch.report["other_lines"] == 0
            if snapshot.view is not None and snapshot.view.rows:  # never past what all logged
                last_logged = min((r.epoch, r.iteration) for r in snapshot.view.ranks)
                assert snapshot.view.last <= last_logged
        held = sum(len(lines) for lines in watch._held.values())
    assert held < sum(t.count(b"\n") for t in texts.values()) / 4  # old lines were let go
    view = snapshot.view
    assert snapshot.waiting is None and snapshot.files == 8
    assert [(r.gpu, r.iterations, r.epoch, r.iteration) for r in view.ranks] == [
        (g, 600, 1, 299) for g in range(4)
    ]
    assert (view.first, view.last, view.iterations) == ((1, 280), (1, 299), 20)

    # `dsim run` on the whole logs, selecting the same 20 iterations (epoch 1, > 279).
    rows, straggler, last_pct, _ = _dsim_run_rows(SAMPLE, tmp_path, [1], warmup=279)
    assert len(view.rows) == len(rows) == 9
    for row in view.rows:
        theirs = rows[(row["fetch_align"], row["start_align"])]
        for key in COMPARED:
            assert _same(row[key], theirs[key]), (row["fetch_align"], row["start_align"], key)
    assert view.attribution.straggler_gpu == straggler
    assert {r.gpu: r.last_pct for r in view.attribution.ranks} == last_pct.to_dict()


def test_the_view_leads_with_dsim_runs_headline_word_for_word(tmp_path: Path, dsim_cli) -> None:
    """Like `dsim run`, the view leads with the pipeline model's verdict and puts the
    per-iteration one a line below (SPEC §5.1). A window of every iteration past the
    warm-up calibrates the pipeline model on the whole logs, as `dsim run` does: the
    verdict is `dsim run`'s bit for bit, and the paragraph reads word for word as the one
    `dsim run` prints first."""
    with Watch(SAMPLE, window=598, warmup=0) as watch:
        view = watch.look().view
    assert (view.iterations, view.first, view.last) == (598, (0, 1), (1, 299))
    _, _, _, headline = _dsim_run_rows(SAMPLE, tmp_path, [0, 1], warmup=0)
    assert view.headline is not None and view.headline.model == "pipeline"
    assert repr(view.headline) == repr(headline)  # repr: every float's digits, NaN too
    assert view.verdict.model == "per-iteration"

    env = {"COLUMNS": "100"}
    run = dsim_cli("run", SAMPLE.name, "--traces", tmp_path / "traces", "--out",
                   tmp_path / "again", "--epochs", "0,1", "--warmup", "0", env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr
    paragraph = run.stdout[: run.stdout.index("\n\n")]
    assert paragraph.startswith(headline.text[:40])
    assert "the original analysis's per-iteration replay says" in paragraph
    watched = dsim_cli("watch", SAMPLE, "--once", "--window", "598", "--warmup", "0", env=env)
    assert watched.returncode == 0, watched.stderr
    assert f"skipped):\n{paragraph}\n\nPolicies, per-iteration replay:" in watched.stdout


def test_the_loader_line_is_kept_when_older_lines_are_let_go(tmp_path: Path) -> None:
    """A loader line comes once per epoch: the lines let go keep their last one, so the
    headline's pipeline model keeps the logged loader settings (as `dsim run` has them)
    long after the epoch's first lines went."""
    logs = tmp_path / SAMPLE.name
    logs.mkdir()
    texts = {}
    for log in sorted(SAMPLE.glob("*.log")):
        gpu = log.stem.removeprefix("rank")
        first = log.read_text().splitlines()[0][:26]  # the first line's timestamp
        loader = f"{first} GPU: {gpu} LOADER num_workers 2 prefetch_factor 3 batch_size 128 "
        loader += "persistent_workers 0 pin_memory 0\n"
        texts[log.name] = (loader + log.read_text()).encode()
        (logs / log.name).touch()
    with Watch(logs, window=20) as watch:
        for k in (1, 2):  # the first half, its old lines let go; then the rest
            for name, text in texts.items():
                half = text.index(b"\n", len(text) // 2) + 1
                with open(logs / name, "ab") as handle:
                    handle.write(text[:half] if k == 1 else text[half:])
            view = watch.look().view
        held = sum(len(lines) for lines in watch._held.values())
    assert held < sum(t.count(b"\n") for t in texts.values()) / 4  # old lines were let go
    assert "prefetch 3 (measured: the run's LOADER lines)" in view.headline.text


def test_the_view_waits_for_an_iteration_past_the_warm_up(tmp_path: Path) -> None:
    for log in sorted(SAMPLE.glob("*.log")):
        text = log.read_bytes()
        (tmp_path / log.name).write_bytes(text[: len(text) // 60])  # iterations 0 to ~8
    with Watch(tmp_path) as watch:
        snapshot = watch.look()
        assert snapshot.waiting == "no complete iteration past the warm-up (iteration > 10) yet"
        assert snapshot.view.complete > 0 and not snapshot.view.rows
    with Watch(tmp_path, warmup=0) as watch:
        assert watch.look().view.rows


def test_a_logdir_deleted_while_watched_is_said_and_its_return_followed(tmp_path: Path) -> None:
    """The last window stayed on screen, "0 log files followed" the only sign, when the
    logs were deleted or moved: the view now says they are gone, keeps what it had, and
    follows them again when they come back."""
    import io
    import shutil

    from rich.console import Console

    from dsim.render.live import renderable

    logs = tmp_path / "run"
    shutil.copytree(SAMPLE, logs)
    with Watch(logs) as watch:
        before = watch.look()
        assert before.waiting is None and before.view is not None and before.view.rows
        shutil.move(logs, tmp_path / "elsewhere")
        gone = watch.look()
        assert gone.waiting is not None and "is gone (deleted or moved)" in gone.waiting
        assert gone.view is before.view and gone.files == 0
        assert watch.look() is gone  # one snapshot while nothing changes (pipes print once)
        console = Console(width=1000, file=io.StringIO())  # no line wrapped
        with console.capture() as out:
            console.print(renderable(gone, 1000))
        assert f"waiting: {logs} is gone (deleted or moved)" in out.get()
        shutil.move(tmp_path / "elsewhere", logs)
        back = watch.look()
        assert back.waiting is None and back.files == 4 and back.view.rows


def test_once_prints_the_readmes_capture_and_json(dsim_cli) -> None:
    """The README's live-view capture is what `dsim watch --once` prints in 80 columns."""
    done = dsim_cli("watch", SAMPLE.relative_to(REPO), "--once", cwd=REPO, env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = f"$ dsim watch {SAMPLE.relative_to(REPO)} --once\n"
    shown = readme[readme.index(command) + len(command) :]
    assert done.stdout == shown[: shown.index("```")]
    doc = json.loads(dsim_cli("watch", SAMPLE, "--once", "--json", "--window", "50").stdout)
    window = doc["window"]
    assert (window["iterations"], len(window["policies"])) == (50, 9)
    assert window["first"] == {"epoch": 1, "iteration": 250}
    assert [r["iterations"] for r in doc["ranks"]] == [600] * 4
    assert window["straggler"]["kind"] in ("fixed", "wandering")


def test_missing_or_empty_logdir_is_one_line_and_exit_3(tmp_path: Path, dsim_cli) -> None:
    gone = dsim_cli("watch", tmp_path / "nothing", "--once")
    assert gone.returncode == 3
    assert gone.stderr.strip() == f"dsim: error: {tmp_path / 'nothing'}: no such file or directory"
    (tmp_path / "empty").mkdir()
    empty = dsim_cli("watch", tmp_path / "empty")
    assert empty.returncode == 3 and len(empty.stderr.strip().splitlines()) == 1
    assert "no log files" in empty.stderr
    for run in ("a", "b"):  # a tree of two runs: watch one
        (tmp_path / "tree" / run).mkdir(parents=True)
        (tmp_path / "tree" / run / "rank0.log").write_text("")
    # in-process (conftest's run_dsim_in_process): one message, and --once cannot hang
    tree = run_dsim_in_process("watch", tmp_path / "tree", "--once")
    assert tree.returncode == 2 and "holds 2 runs" in tree.stderr
    bad = dsim_cli("watch", SAMPLE, "--json")
    assert bad.returncode == 2 and "--once" in bad.stderr


def test_logs_without_records_are_exit_3_with_once(tmp_path: Path, dsim_cli) -> None:
    (tmp_path / "rank0.log").write_text("starting...\nloading data\n")
    done = dsim_cli("watch", tmp_path, "--once")
    assert done.returncode == 3
    assert "no fetch or training records" in done.stderr and "dsim-watch-" not in done.stderr


def test_ctrl_c_stops_the_live_view_with_130(tmp_path: Path) -> None:
    """Piped, the live view prints each new snapshot; SIGINT ends it as every command ends."""
    env = {**os.environ, "COLUMNS": "100"}
    env.pop("DSIM_DEBUG", None)
    out = tmp_path / "out.txt"
    with open(out, "w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dsim", "watch", str(SAMPLE), "--interval", "0.2"],
            stdout=handle,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            deadline = time.monotonic() + 60
            while "Straggler" not in out.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert out.read_text().count("Straggler") == 1  # nothing new came: printed once
    assert proc.returncode == 130 and err.strip() == "dsim: interrupted"


@pytest.mark.latest_only  # not in CI's floors phase: tests/test_dependency_floors.py says why
@pytest.mark.torch
def test_a_real_ddp_job_watched_while_it_trains(tmp_path: Path, dsim_cli) -> None:
    pytest.importorskip("torch")
    name = "watched"
    args = ["--ranks", "2", "--epochs", "2", "--iterations", "30", "--batch-size", "8"]
    args += ["--workers", "1", "--skew", "1.0", "--step-ms", "60", "--name", name]
    env = {**os.environ}
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    job = subprocess.Popen(
        [sys.executable, str(EXAMPLE), *args, "--out", str(tmp_path / "logs")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    logs = tmp_path / "logs" / name
    seen_running = []
    try:
        while job.poll() is None:
            time.sleep(0.3)
            if not logs.is_dir() or not any(logs.glob("*.log")):
                continue
            done = dsim_cli("watch", logs, "--once", "--json", "--window", "5", "--warmup", "0")
            if done.returncode == 3 and "no fetch or training records" in done.stderr:
                continue  # the job has created its files, not yet written a record
            assert done.returncode == 0, done.stderr
            doc = json.loads(done.stdout)
            if doc["window"] is not None and job.poll() is None:
                seen_running.append(doc)
                last = (doc["window"]["last"]["epoch"], doc["window"]["last"]["iteration"])
                assert all(last <= (r["epoch"], r["iteration"]) for r in doc["ranks"])
                assert doc["window"]["straggler"]["gpu"] in (0, 1, None)
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 0, err
    assert seen_running, "the job ended before dsim watch saw a complete window"
    # ... and at least once before its last iteration: a view of the job while it trained.
    assert any(d["window"]["last"] != {"epoch": 1, "iteration": 29} for d in seen_running)

    # Finished: the last 19 iterations are epoch 1's past warm-up 10, dsim run's selection.
    done = dsim_cli("watch", logs, "--once", "--json", "--window", "19")
    assert done.returncode == 0, done.stderr
    window = json.loads(done.stdout)["window"]
    assert (window["first"], window["last"]) == (
        {"epoch": 1, "iteration": 11},
        {"epoch": 1, "iteration": 29},
    )
    rows, straggler, _, headline = _dsim_run_rows(logs, tmp_path, [1], warmup=10)
    for row in window["policies"]:
        theirs = rows[(row["fetch_align"], row["start_align"])]
        for key in COMPARED:
            value = math.nan if row[key] is None else row[key]
            assert _same(value, theirs[key]), (row["fetch_align"], row["start_align"], key)
    assert window["straggler"]["gpu"] == straggler
    # The whole job is held (60 iterations, within the headline's calibration span): the
    # headline is `dsim run`'s, bit for bit (JSON keeps every float's digits).
    from dsim.render.machine import plain

    assert headline is not None
    assert window["headline"] == json.loads(
        json.dumps({k: plain(v) for k, v in headline.as_dict().items()})
    )
