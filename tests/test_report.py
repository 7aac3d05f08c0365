"""`dsim report` end to end: the real CLI in a subprocess on synthetic results on disk."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dsim.model.results import replay_table, write_replay, write_result_info
from dsim.render.figures import short_labels
from dsim.replay.policies import KNOWN, Policy

ALL_KNOWN: list[Policy] = [(f, s) for f in KNOWN for s in KNOWN]
# How much of the measured imbalance each aligned side removes, in the synthetic world.
_ALIGN_GAIN = {"actual": 0.0, "avg": 0.55, "min": 0.8}


def write_synthetic_run(
    out: Path,
    run: str,
    *,
    gpus: int = 4,
    epochs: int = 2,
    iterations: int = 60,
    policies: list[Policy] | None = None,
    seed: int = 0,
) -> Path:
    """A results directory for one run, shaped like `dsim run` output, with made-up numbers.

    Measured per-GPU stalls are small with occasional long fetches on one GPU;
    each policy removes a share of the imbalance, so the figures have something
    to show. The numbers only need to be plausible, not replay-exact.
    """
    rng = np.random.default_rng(seed)
    n = epochs * iterations
    epoch = np.repeat(np.arange(epochs), iterations)
    iteration = np.tile(np.arange(iterations), epochs)
    base = rng.exponential(0.01, size=(n, gpus))
    spikes = rng.random((n, gpus)) < 0.08
    base[spikes] += rng.exponential(0.25, size=int(spikes.sum()))
    base[iteration == 0] += 3.0  # first batch of an epoch waits for the workers
    pure = 0.35 + rng.normal(0.0, 0.01, size=n)
    fetch_diff = rng.exponential(0.2, size=n)
    start_diff = rng.exponential(0.05, size=n)
    for policy in policies or ALL_KNOWN:
        gain = 1.0 - (1.0 - _ALIGN_GAIN[policy[0]]) * (1.0 - _ALIGN_GAIN[policy[1]])
        floor = base.min(axis=1, keepdims=True)
        stall = np.maximum(floor + (base - floor) * (1.0 - gain), 2e-6)
        metrics = {
            "iteration_s": stall.max(axis=1) + pure,
            "stall_s": stall.max(axis=1),
            "delay_s": stall.max(axis=1) - stall.min(axis=1),
            "fetch_diff_s": fetch_diff * (1.0 - _ALIGN_GAIN[policy[0]]),
            "start_diff_s": start_diff * (1.0 - _ALIGN_GAIN[policy[1]]),
        }
        table = replay_table(
            epoch, iteration, metrics, np.arange(gpus), stall, run=run, policy=policy, key="synth"
        )
        write_replay(table, out)
    info = {
        "trace": {"gpus": gpus},
        "summary": {"epochs": None, "warmup": 2, "threshold_s": 0.03},
        "policies": {f"{f}__{s}": "synth" for f, s in policies or ALL_KNOWN},
    }
    write_result_info(info, out, run)
    return out / run


RUN_A = "fsNprepNloadNtrain_imagenet_randaugment_resnet50_epoch2_b256_worker8_thread0"
RUN_B = "fsNprepNloadNtrain_openimage_default_resnet18_epoch2_b512_worker12_thread0"


def dsim(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DSIM_DEBUG": "0"}
    return subprocess.run(
        [sys.executable, "-m", "dsim", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def read_report(path: Path) -> str:
    """The page with plotly's JSON escapes (``\\u2014``) decoded, so titles read as written."""
    text = path.read_text(encoding="utf-8")
    return re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)


def figure_ids(html: str) -> set[str]:
    return set(re.findall(r"<div id=\"(fig-[\w-]+)\"", html))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("results")
    write_synthetic_run(out, RUN_A, seed=1)
    write_synthetic_run(out, RUN_B, gpus=2, seed=2)
    return out


@pytest.fixture(scope="module")
def report(results: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("report") / "report.html"
    proc = dsim("report", results, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout
    return read_report(out)


def test_report_is_self_contained(report: str) -> None:
    assert report.startswith("<!DOCTYPE html>")
    assert "Plotly" in report and len(report) > 3_000_000  # plotly.js embedded
    assert report.count("window.PlotlyConfig") == 1  # embedded once, not per figure
    assert not re.search(r"<script[^>]+src=", report)
    assert not re.search(r"<link[^>]+href=[\"']https?:", report)


def test_report_has_every_figure_and_table(report: str) -> None:
    assert figure_ids(report) == {
        "fig-whatif-0",
        "fig-whatif-1",
        "fig-bars",
        "fig-timeline",
        "fig-cdf",
        "fig-timeline-1",
        "fig-cdf-1",
    }
    short = short_labels([RUN_A, RUN_B])
    for title in (
        f"What-if grid — {short[RUN_A]}",
        f"What-if grid — {short[RUN_B]}",
        "Time per iteration, relative to each run",
        "÷ the run's measured mean iteration time; whiskers p10–p90 of iterations",
        f"Per-iteration timeline — {short[RUN_A]}",  # RUN_A has the larger predicted gain
        f"Distribution of per-iteration delay — {short[RUN_A]}",
        f"Per-iteration timeline — {short[RUN_B]}",  # in the switcher
        "effective-delay threshold 0.03 s",
    ):
        assert title in report
    assert "id='summary-table'" in report
    # 9 policies x 2 runs, mean ± std cells
    body = report.split("id='summary-table'")[1].split("</table>")[0]
    assert body.count("<tr class='policy") == 18
    assert "±" in body
    assert "warm-up iterations ≤ 2 skipped" in report  # the selection result.json recorded


def test_timeline_dropdown_offers_every_other_policy(report: str) -> None:
    timeline = report.split('id="fig-timeline"')[1].split("</script>")[0]
    labels = set(re.findall(r"\"label\":\"replayed: (fetch \w+ / start \w+)\"", timeline))
    assert len(labels) == 8
    assert "fetch actual / start actual" not in labels


def test_filters_run_policy_timeline(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "sub" / "r.html"
    proc = dsim(
        "report",
        results,
        "--out",
        out,
        "--run",
        "*openimage*",
        "--policy",
        "avg/min",
        "--policy",
        "min__min",
        "--warmup",
        "0",
        "--epochs",
        "all",
        "--threshold",
        "0.1",
    )
    assert proc.returncode == 0, proc.stderr
    html = read_report(out)
    assert figure_ids(html) == {"fig-whatif-0", "fig-bars", "fig-timeline", "fig-cdf"}
    assert "<select class='run-switch'" not in html  # one run: nothing to switch
    assert RUN_A not in html
    body = html.split("id='summary-table'")[1].split("</table>")[0]
    assert body.count("<tr class='policy") == 2
    assert "avg / min" in body and "min / min" in body and "actual / actual" not in body
    assert "epochs 0, 1, warm-up iterations ≤ 0 skipped" in html
    assert "effective-delay threshold 0.1 s" in html


def test_timeline_run_and_several_directories(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    write_synthetic_run(first, RUN_A, seed=3, policies=[("actual", "actual"), ("min", "min")])
    write_synthetic_run(second, RUN_B, gpus=8, seed=4, iterations=40)
    out = tmp_path / "r.html"
    proc = dsim("report", first, second / RUN_B, "--out", out, "--timeline-run", "*openimage*")
    assert proc.returncode == 0, proc.stderr
    html = read_report(out)
    assert f"Per-iteration timeline — {short_labels([RUN_A, RUN_B])[RUN_B]}" in html
    assert "fig-timeline-1" not in html  # only the runs --timeline-run names
    body = html.split("id='summary-table'")[1].split("</table>")[0]
    assert body.count("<tr class='policy") == 2 + 9


def test_same_run_in_two_directories_is_told_apart(tmp_path: Path) -> None:
    for name in ("x", "y"):
        write_synthetic_run(tmp_path / name, "myrun", policies=[("actual", "actual")])
    out = tmp_path / "r.html"
    proc = dsim("report", tmp_path / "x", tmp_path / "y", "--out", out)
    assert proc.returncode == 0, proc.stderr
    html = read_report(out)
    assert f"myrun [{tmp_path / 'x'}]" in html and f"myrun [{tmp_path / 'y'}]" in html


def test_long_run_is_downsampled(tmp_path: Path) -> None:
    write_synthetic_run(
        tmp_path / "res", "long", gpus=2, epochs=2, iterations=6000, policies=ALL_KNOWN[:2]
    )
    out = tmp_path / "r.html"
    proc = dsim("report", tmp_path / "res", "--out", out)
    assert proc.returncode == 0, proc.stderr
    html = read_report(out)
    assert "downsampled to ≤ 5,000 points per trace" in html
    assert "curves thinned to ≤ 5,000 points" in html


def test_images_without_renderer_say_so(results: Path, tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    try:
        import kaleido  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("kaleido is installed: the message for a missing renderer cannot show")
    out = tmp_path / "r.html"
    proc = dsim("report", results, "--out", out, "--images", "png")
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()
    assert "kaleido" in proc.stderr
    assert not (tmp_path / "r_images").exists()


# ----------------------------------------------------------------------------- bad input


def assert_fails(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_directory_without_results(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = tmp_path / "r.html"
    assert_fails(dsim("report", tmp_path / "empty", "--out", out), 3, "no dsim results")
    assert not out.exists()


def test_missing_directory(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert_fails(dsim("report", tmp_path / "nope", "--out", out), 3, "no such file")
    assert not out.exists()


def test_results_of_an_older_format(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "res", "old", policies=[("actual", "actual")])
    info = json.loads((run_dir / "result.json").read_text())
    info["format_version"] = 0
    (run_dir / "result.json").write_text(json.dumps(info))
    out = tmp_path / "r.html"
    assert_fails(dsim("report", tmp_path / "res", "--out", out), 3, "another dsim format")
    assert not out.exists()


def test_replay_table_of_an_older_format(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    run_dir = write_synthetic_run(tmp_path / "res", "old", policies=[("actual", "actual")])
    path = run_dir / "actual__actual.parquet"
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"dsim"])
    meta["format_version"] = 0
    pq.write_table(table.replace_schema_metadata({"dsim": json.dumps(meta)}), path)
    out = tmp_path / "r.html"
    assert_fails(dsim("report", tmp_path / "res", "--out", out), 3, "another dsim results format")
    assert not out.exists()


def test_run_without_replays(tmp_path: Path) -> None:
    write_result_info({"summary": {}, "policies": {}}, tmp_path / "res", "bare")
    out = tmp_path / "r.html"
    assert_fails(dsim("report", tmp_path / "res", "--out", out), 3, "no replay tables")
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--run", "nothing*"], "matches no run"),
        (["--policy", "min/avg", "--run", "*openimage*", "--timeline-run", RUN_A], "matches none"),
        (["--policy", "max/min"], "unknown policy"),
        (["--policy", "avg"], "expected FETCH/START"),
        (["--epochs", "7"], "not in the replay"),
        (["--epochs", "one"], "--epochs"),
        (["--warmup", "1000"], "no iterations selected"),
        (["--images", "gif"], "--images"),
    ],
)
def test_bad_options(results: Path, tmp_path: Path, args: list[str], needle: str) -> None:
    out = tmp_path / "r.html"
    assert_fails(dsim("report", results, "--out", out, *args), 2, needle)
    assert not out.exists()


def test_policy_missing_from_results(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path / "res", "few", policies=[("actual", "actual")])
    out = tmp_path / "r.html"
    assert_fails(
        dsim("report", tmp_path / "res", "--out", out, "--policy", "avg/avg"), 2, "no such replay"
    )


def test_unwritable_output(results: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("in the way")
    assert_fails(dsim("report", results, "--out", blocker / "r.html"), 4, "not a directory")
    assert_fails(dsim("report", results, "--out", tmp_path), 4, "is a directory")


def test_existing_report_is_replaced_whole(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    out.write_text("old")
    assert dsim("report", results, "--out", out, "--run", RUN_B).returncode == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left over


def test_short_flags_quiet_and_a_timeline_glob(tmp_path: Path) -> None:
    """-r/-p/-q as on the other commands; --timeline-run takes a glob like --run."""
    first, second = tmp_path / "a", tmp_path / "b"
    write_synthetic_run(first, RUN_A, seed=3, policies=[("actual", "actual"), ("min", "min")])
    write_synthetic_run(second, RUN_B, gpus=8, seed=4, iterations=40)
    out = tmp_path / "r.html"
    glob = "*openimage*"
    assert not fnmatch.fnmatchcase(RUN_A, glob)
    proc = dsim(
        "report", first, second, "-r", "*", "-p", "min/min", "-q", "--out", out,
        "--timeline-run", glob,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
    html = read_report(out)
    assert f"Per-iteration timeline — {short_labels([RUN_A, RUN_B])[RUN_B]}" in html
