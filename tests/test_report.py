"""`dsim report` end to end: the real CLI in a subprocess on synthetic results on disk."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
from pathlib import Path

import markupsafe
import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_dsim, run_dsim_in_process

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


dsim = run_dsim  # the real CLI in a subprocess (tests/conftest.py)
# its entry point in-process, for the refusals below (one line and an exit code each);
# a missing directory stays a subprocess test (conftest's run_dsim_in_process says why)
dsim_here = run_dsim_in_process


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
        "fig-scaling",
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
    (tmp_path / "sub").mkdir()  # a file output's directory must exist (SPEC §9)
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
    assert figure_ids(html) == {
        "fig-whatif-0",
        "fig-bars",
        "fig-scaling",
        "fig-timeline",
        "fig-cdf",
    }
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


def test_images_without_renderer_are_refused_before_any_work(results: Path, tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    try:
        import kaleido  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("kaleido is installed: the message for a missing renderer cannot show")
    out = tmp_path / "r.html"
    proc = dsim("report", results, "--out", out, "--images", "png")
    # refused before any work, nothing written (was: the report, a note and exit 0, so a
    # script went on without the images it asked for)
    assert_fails(proc, 2, "--images png: static export needs the kaleido package", "leave")
    assert not out.exists() and not (tmp_path / "r_images").exists()


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
    assert_fails(dsim_here("report", tmp_path / "empty", "--out", out), 3, "no dsim results")
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
    assert_fails(dsim_here("report", tmp_path / "res", "--out", out), 3, "another dsim format")
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
    assert_fails(
        dsim_here("report", tmp_path / "res", "--out", out), 3, "another dsim results format"
    )
    assert not out.exists()


def test_run_without_replays(tmp_path: Path) -> None:
    write_result_info({"summary": {}, "policies": {}}, tmp_path / "res", "bare")
    out = tmp_path / "r.html"
    assert_fails(dsim_here("report", tmp_path / "res", "--out", out), 3, "no replay tables")
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--run", "nothing*"], "matches no run"),
        (["--policy", "min/avg", "--run", "*openimage*", "--timeline-run", RUN_A], "matches none"),
        (["--policy", "median/min"], "unknown policy"),
        (["--policy", "avg"], "expected FETCH/START"),
        (["--epochs", "7"], "epoch(s) 7 not in run"),
        (["--epochs", "one"], "--epochs"),
        (["--warmup", "1000"], "no iterations selected"),
        (["--images", "gif"], "--images"),
    ],
)
def test_bad_options(results: Path, tmp_path: Path, args: list[str], needle: str) -> None:
    out = tmp_path / "r.html"
    assert_fails(dsim_here("report", results, "--out", out, *args), 2, needle)
    assert not out.exists()


def test_policy_missing_from_results(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path / "res", "few", policies=[("actual", "actual")])
    out = tmp_path / "r.html"
    assert_fails(
        dsim_here("report", tmp_path / "res", "--out", out, "--policy", "avg/avg"),
        2,
        "no such replay",
    )


def test_unwritable_output(results: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("in the way")
    assert_fails(dsim_here("report", results, "--out", blocker / "r.html"), 4, "not a directory")
    assert_fails(dsim_here("report", results, "--out", tmp_path), 4, "is a directory")


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


# ----------------------------------------------------------------------------- verdict, attribution


def figure_data(path: Path, div_id: str) -> tuple[list[dict], dict]:
    """The data and layout plotly draws in ``div_id``, with typed arrays decoded."""
    import base64

    text = path.read_text(encoding="utf-8")
    match = re.search(r"Plotly\.newPlot\(\s*\"" + re.escape(div_id) + r"\",\s*", text)
    assert match, div_id
    decoder = json.JSONDecoder()
    data, end = decoder.raw_decode(text, match.end())
    layout, _ = decoder.raw_decode(text, text.index("{", end))

    def decode(value: object) -> object:
        if isinstance(value, dict) and "bdata" in value:
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
            shape = value.get("shape")
            if shape:
                array = array.reshape([int(s) for s in str(shape).split(",")])
            return array.tolist()
        if isinstance(value, dict):
            return {k: decode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [decode(v) for v in value]
        return value

    return decode(data), layout  # type: ignore[return-value]


def read_title(layout: dict) -> str:
    return str(layout["title"]["text"])


def test_verdict_at_the_top_is_the_terminals(results: Path, report: str) -> None:
    """Every verdict sentence of `dsim summarize` opens the report, in the first section."""
    proc = dsim("summarize", results, env={"COLUMNS": "1000"})
    assert proc.returncode == 0, proc.stderr
    sentences = [
        line.split(": ", 1)[1]
        for line in proc.stdout.splitlines()
        if line.startswith((RUN_A + ": ", RUN_B + ": "))
    ]
    assert len(sentences) == 2 and all("replay model)" in s for s in sentences)
    main = report.split("<main>", 1)[1]
    assert main.startswith("<section id='verdict'>")
    verdict = main.split("</section>", 1)[0]
    for sentence in sentences:
        # escaped as the page's templates escape (markupsafe: ' is &#39;)
        assert f"<p class='say'>{markupsafe.escape(sentence)}</p>" in verdict
    # the synthetic results have no trace and no attribution table: the page says so
    attribution = report.split("<section id='attribution'>", 1)[1].split("</section>")[0]
    assert "No worker heatmap for this run:" in attribution
    assert "attribution.parquet does not exist, and its trace is not in traces" in attribution
    assert "fig-attr" not in report


# Fixed straggler over 50 iterations of 3 GPUs (all fetches of an iteration start together):
# k % 10 == 0: fetch [1, 2, 2] (GPUs 1 and 2 tie: nobody last, no fetch above the median);
# else k % 5 == 4: [3, 1, 2] (GPU 0 last, 1 s above the median 2);
# else [1, 1, 2] (GPU 2 last, 1 s above the median 1). Worker k % 2 on every GPU.
# Last: GPU 0 in 10 (20 %), GPU 2 in 35 (70 %: fixed), ties 5. Excess: GPU 2 worker 0 in 15
# iterations, worker 1 in 20; GPU 0 worker 0 in 5, worker 1 in 5: total 45 s.
def _straggler_fetch(k: int) -> list[float]:
    if k % 10 == 0:
        return [1.0, 2.0, 2.0]
    return [3.0, 1.0, 2.0] if k % 5 == 4 else [1.0, 1.0, 2.0]


STRAGGLER_LAST = [-1 if k % 10 == 0 else 0 if k % 5 == 4 else 2 for k in range(50)]
STRAGGLER_SHARES = {(0, 0): 5 / 45, (0, 1): 5 / 45, (1, 0): 0.0, (1, 1): 0.0,
                    (2, 0): 15 / 45, (2, 1): 20 / 45}  # fmt: skip


@pytest.fixture(scope="module")
def straggler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A parsed trace with a fixed straggler, replayed by `dsim run` (the CLI's entry point
    in this process: the attribution it prints and the report read are the subject)."""
    from test_attribution import _tables

    from dsim.model.tables import RunTables, write_run

    root = tmp_path_factory.mktemp("straggler")
    fetch = [_straggler_fetch(k) for k in range(50)]
    stall = [[f - 1.0 for f in row] for row in fetch]  # the last rank stalls most
    workers = [[k % 2] * 3 for k in range(50)]
    fetch_t, train_t = _tables(fetch, stall, workers)
    info = {"gpus": 3, "epochs": [0], "iterations_per_epoch": {"0": 50}, "metadata": {}}
    write_run(RunTables("hand", fetch_t, train_t, info), root / "traces" / "hand")
    proc = run_dsim_in_process("run", "hand", "--warmup", "0", cwd=root, env={"COLUMNS": "1000"})
    assert proc.returncode == 0, proc.stderr
    (root / "run.out").write_text(proc.stdout)
    return root


def test_attribution_figures_match_hand_computed_shares(straggler: Path) -> None:
    out = straggler / "r.html"
    proc = dsim("report", "results", "--out", out, cwd=straggler)
    assert proc.returncode == 0, proc.stderr
    page = read_report(out)
    assert {"fig-attr-workers", "fig-attr-last"} <= figure_ids(page)

    # rank x worker heatmap: each (GPU, worker)'s share of the fetch time above the median
    (heat,), layout = figure_data(out, "fig-attr-workers")
    assert heat["x"] == ["worker 0", "worker 1"]
    assert heat["y"] == ["GPU 0 · last 20 %", "GPU 1 · last 0 %", "GPU 2 · last 70 %"]
    expected = [[100 * STRAGGLER_SHARES[(g, w)] for w in (0, 1)] for g in (0, 1, 2)]
    assert np.allclose(heat["z"], expected)
    assert "above each iteration's median fetch" in read_title(layout)

    # who was last, per window of 2 iterations (50 iterations: at most 40 windows)
    bars, layout = figure_data(out, "fig-attr-last")
    assert [b["name"] for b in bars] == [
        "GPU 0 (20 % overall)",
        "GPU 1 (0 % overall)",
        "GPU 2 (70 % overall)",
        "no single last (tie)",
    ]
    for bar in bars:
        assert bar["x"] == [2 * w + 0.5 for w in range(25)] and set(bar["width"]) == {2}
    for rank, bar in zip((0, 1, 2, -1), bars, strict=True):
        hand = [50.0 * STRAGGLER_LAST[2 * w : 2 * w + 2].count(rank) for w in range(25)]
        assert bar["y"] == hand, bar["name"]
    # the straggler in the words of the terminal's line (printed by `dsim run`, below)
    title = read_title(layout)
    assert "50 iterations in windows of 2" in title
    straggler_line = "Straggler: GPU 2's loader, fixed — it finished its fetch last in 70 % of"
    assert straggler_line in title
    assert straggler_line in (straggler / "run.out").read_text()

    # the verdict section: the lines `dsim run` printed, verdict and attribution
    verdict = page.split("<section id='verdict'>", 1)[1].split("</section>", 1)[0]
    printed = (straggler / "run.out").read_text().splitlines()
    straggler_line = (
        "Straggler: GPU 2's loader, fixed — it finished its fetch last in 70 % of "
        "iterations and had the largest stall in 70 %."
    )
    workers_line = (
        "Slowest workers (share of fetch time above the iteration's median): "
        "GPU 2 worker 1 44 %, GPU 2 worker 0 33 %, GPU 0 worker 0 11 %."
    )
    for line in (printed[0], straggler_line, workers_line):
        assert markupsafe.escape(line) in verdict, line
        assert any(p.strip() == line for p in printed), line
    assert "from trace traces/hand" in page


def test_attribution_without_the_trace(straggler: Path) -> None:
    """No trace: the heatmap comes from results/attribution.parquet (same numbers) and the
    figure over time says why it is absent; another selection leaves both out, saying why."""
    out = straggler / "r2.html"
    proc = dsim("report", "results", "--out", out, "--traces", "elsewhere", cwd=straggler)
    assert proc.returncode == 0, proc.stderr
    page = read_report(out)
    assert "fig-attr-workers" in figure_ids(page) and "fig-attr-last" not in figure_ids(page)
    (heat,), _ = figure_data(out, "fig-attr-workers")
    expected = [[100 * STRAGGLER_SHARES[(g, w)] for w in (0, 1)] for g in (0, 1, 2)]
    assert np.allclose(heat["z"], expected)
    why = (
        "No “who was last” figure for this run: who was last over time needs the run's trace, "
        "and its trace is not in elsewhere"
    )
    assert markupsafe.escape(why) in page
    assert markupsafe.escape("Straggler: GPU 2's loader, fixed") in page
    proc = dsim(
        "report", "results", "--out", out, "--traces", "elsewhere", "--warmup", "4",
        cwd=straggler,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    page = read_report(out)
    assert "fig-attr" not in page and "Straggler:" not in page
    assert markupsafe.escape("covers epochs 0, warm-up 0, not this report's selection") in page


def test_changed_trace_is_not_attributed(straggler: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(straggler / "results", tmp_path / "results")
    shutil.copytree(straggler / "traces", tmp_path / "traces")
    fetch = tmp_path / "traces" / "hand" / "fetch.parquet"
    table = pq.read_table(fetch)
    pq.write_table(table.slice(0, table.num_rows - 1), fetch)  # edited after the replay
    out = tmp_path / "r.html"
    proc = dsim("report", "results", "--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = read_report(out)
    assert "fig-attr-last" not in page
    # edited by hand, not by `dsim parse`: the table no longer matches run.json's digest
    assert "fetch.parquet: does not match the digest in run.json" in page


def test_profiler_trace_run_says_why_there_is_no_attribution(tmp_path: Path) -> None:
    """A profiler trace has no fetch records: the page says so instead of drawing."""
    from dsim.execute.cache import trace_fingerprint

    name = "cpuDDP_synthetic_none_mlp_epoch1_b128_worker2_thread0"
    source = Path(__file__).parents[1] / "traces" / "profiler" / name
    proc = dsim("parse", source, "--out", tmp_path / "traces", "-q")
    assert proc.returncode == 0, proc.stderr
    run_dir = write_synthetic_run(tmp_path / "results", name, gpus=2, seed=5)
    info = json.loads((run_dir / "result.json").read_text())
    info["input"] = trace_fingerprint(tmp_path / "traces" / name)
    (run_dir / "result.json").write_text(json.dumps(info))
    out = tmp_path / "r.html"
    proc = dsim("report", "results", "--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = read_report(out)
    assert "fig-attr" not in page and "<p class='say'>" in page
    assert page.count("its trace has no fetch records (a profiler trace has none)") == 2


def test_a_reader_that_leaves_after_part_of_the_report_ends_it_with_141(results: Path) -> None:
    """`dsim report --out - | head -c 10` exited 0: CPython's buffered stdout dropped the
    rest of the large write without an error once the reader had gone (SPEC §9)."""
    import os
    import sys

    env = {**os.environ}
    env.pop("DSIM_DEBUG", None)
    writer = subprocess.Popen(
        [sys.executable, "-m", "dsim", "report", str(results), "--out", "-", "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert writer.stdout.read(10) == b"<!DOCTYPE "
    writer.stdout.close()  # the reader leaves with most of the page unread
    assert writer.wait(timeout=300) == 141, writer.stderr.read()
    assert writer.stderr.read() == b""
