"""Profiled runs end to end (docs/SPEC.md §4.3): `dsim parse` → `dsim run` → `dsim summarize`
→ `dsim report` in subprocesses, on the shipped profiler traces, on the same traces recompressed
with zstd, and on rotated compressed raw logs; and the refusals that name the run."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zstandard
from conftest import REPO, run_dsim, run_dsim_in_process

from dsim.model.results import load_replay

PROFILED = REPO / "traces" / "profiler" / "cpuDDP_synthetic_none_mlp_epoch1_b128_worker2_thread0"
RUN = PROFILED.name
LOGS = REPO / "traces" / "profiler" / "raw" / RUN


def _replay_profiled(project: Path, source: Path, name: str = RUN) -> pd.DataFrame:
    project.mkdir(parents=True, exist_ok=True)
    parse = run_dsim("parse", str(source), "--name", name, "-q", cwd=project)
    assert parse.returncode == 0, parse.stderr
    run = run_dsim("run", name, "--executor", "local", cwd=project)
    assert run.returncode == 0, run.stderr
    return pd.read_parquet(project / "results" / "summary.parquet")


def test_a_profiled_run_replays_summarizes_and_reports(tmp_path: Path) -> None:
    summary = _replay_profiled(tmp_path, PROFILED)
    pairs = list(zip(summary["fetch_align"], summary["start_align"], strict=True))
    assert pairs == [("actual", "actual"), ("stall-avg", "actual"), ("stall-min", "actual")]
    assert set(summary["replay_model"]) == {"stall-only"}
    results = tmp_path / "results" / f"{RUN}@stall-only"
    assert sorted(p.name for p in results.glob("*.parquet")) == [
        "actual__actual.parquet",
        "stall-avg__actual.parquet",
        "stall-min__actual.parquet",
    ]
    assert json.loads((results / "result.json").read_text())["model"] == "stall-only"

    # The numbers, recomputed here from the train table itself (iterations > 10).
    train = pd.read_parquet(tmp_path / "traces" / RUN / "train.parquet")
    train = train[train["iteration"] > 10]
    by = train.groupby("iteration")
    max_t, max_st = by["iteration_s"].max(), by["stall_s"].max()
    min_st, mean_st = by["stall_s"].min(), by["stall_s"].mean()
    row = summary.set_index("fetch_align")
    assert row.loc["actual", "iterations"] == len(max_t) == 24
    assert row.loc["actual", "iteration_s_mean"] == pytest.approx(max_t.mean(), rel=1e-12)
    assert row.loc["actual", "delay_s_mean"] == pytest.approx((max_st - min_st).mean())
    assert row.loc["actual", "effective_delay_pct"] == pytest.approx(
        100 * ((max_st - min_st) > 0.03).mean()
    )
    smin = (max_t + (min_st - max_st)).mean()
    assert row.loc["stall-min", "iteration_s_mean"] == pytest.approx(smin, rel=1e-12)
    assert row.loc["stall-avg", "stall_s_mean"] == pytest.approx(mean_st.mean(), rel=1e-12)
    assert row.loc["stall-min", "delay_s_mean"] == 0.0
    assert row.loc["stall-min", "effective_delay_pct"] == 0.0
    assert np.isnan(row.loc["actual", "fetch_diff_s_mean"])  # no fetch records

    attribution = pd.read_parquet(tmp_path / "results" / "attribution.parquet")
    assert attribution["worker"].tolist() == [-1] * 4
    assert attribution["gpu_last_pct"].isna().all()

    summarize = run_dsim("summarize", "results", cwd=tmp_path)
    assert summarize.returncode == 0, summarize.stderr
    text = " ".join(summarize.stdout.split())
    assert "Replacing every rank's data wait by the least wait over ranks" in text
    assert "(stall-only replay model: from the measured stalls alone)" in text
    assert "no fetch records: judged by the largest data wait" in text
    assert "stall-min/actual" in text

    report = run_dsim("report", "results", "--out", "report.html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report.html").read_text()
    assert "Rows <b>stall-min</b> and <b>stall-avg</b>" in page
    assert "stall-min / actual" in page
    assert "no fetch records: judged by the largest data wait" in page  # the verdict's lines
    assert "No worker heatmap for this run" in page  # figures that need fetches say why
    assert "No “who was last” figure for this run" in page


def test_fetch_policies_models_and_configs_are_refused_for_a_profiled_run(
    tmp_path: Path,
) -> None:
    assert run_dsim("parse", str(PROFILED), "-q", cwd=tmp_path).returncode == 0
    conf = tmp_path / "sim_conf.json"
    conf.write_text(json.dumps({"FILE": RUN, "FETCH_ALIGN": [False, "min"]}))
    for args in (["--conf", str(conf)], [RUN, "-p", "min/min"], [RUN, "--model", "pipeline"]):
        proc = run_dsim_in_process("run", *args, "--executor", "local", cwd=tmp_path)
        assert proc.returncode == 3, (args, proc.stderr)
        assert f"run {RUN} has no fetch records" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "results").exists()  # refused before anything was written
    # A config that asks for no policies gets the stall what-ifs.
    conf.write_text(json.dumps({"FILE": RUN, "out": "from-config"}))
    ok = run_dsim("run", "--conf", str(conf), "--executor", "local", "-q", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert len(list((tmp_path / "from-config" / f"{RUN}@stall-only").glob("*.parquet"))) == 3
    # Stall alignments asked for explicitly are replayed (with the measured run).
    ok = run_dsim("run", RUN, "-p", "stall-min", "--executor", "local", "-q", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    summary = pd.read_parquet(tmp_path / "results" / "summary.parquet")
    assert set(summary["fetch_align"]) == {"actual", "stall-min"}


def test_stall_policies_on_a_run_with_fetch_records(tmp_path: Path) -> None:
    assert run_dsim("parse", str(LOGS), "--name", "logged", "-q", cwd=tmp_path).returncode == 0
    refused = run_dsim_in_process(
        "run", "logged", "-p", "stall-min", "--executor", "local", cwd=tmp_path
    )
    assert refused.returncode == 2
    assert "stall alignments are replayed by the stall-only model" in refused.stderr
    wrong = run_dsim_in_process(
        "run", "logged", "--model", "stall-only", "-p", "min/min", cwd=tmp_path
    )
    assert wrong.returncode == 2 and "replays only actual/actual" in wrong.stderr
    ok = run_dsim("run", "logged", "--model", "stall-only", "--executor", "local", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    summary = pd.read_parquet(tmp_path / "results" / "summary.parquet")
    assert set(summary["fetch_align"]) == {"actual", "stall-avg", "stall-min"}
    assert (summary["fetch_diff_s_mean"] > 0).all()  # measured fetches are still known


def test_zstd_profiler_traces_replay_like_the_gzip_ones(tmp_path: Path) -> None:
    recompressed = tmp_path / "zst" / RUN
    recompressed.mkdir(parents=True)
    for trace in sorted(PROFILED.glob("*.pt.trace.json.gz")):
        text = gzip.decompress(trace.read_bytes())
        target = recompressed / trace.name.removesuffix(".gz")
        target.with_name(target.name + ".zst").write_bytes(
            zstandard.ZstdCompressor().compress(text)
        )
    gz = _replay_profiled(tmp_path / "a", PROFILED)
    zst = _replay_profiled(tmp_path / "b", recompressed)
    numbers = [c for c in gz.columns if c.endswith(("_mean", "_std", "_pct"))]
    pd.testing.assert_frame_equal(gz[numbers], zst[numbers])
    info = json.loads((tmp_path / "b" / "traces" / RUN / "run.json").read_text())
    assert all(s["path"].endswith(".pt.trace.json.zst") for s in info["sources"])
    report = run_dsim("report", "results", "--out", "r.html", cwd=tmp_path / "b")
    assert report.returncode == 0, report.stderr


@pytest.mark.latest_only  # not in CI's floors phase: tests/test_dependency_floors.py says why
def test_rotated_compressed_raw_logs_replay_like_the_plain_ones(tmp_path: Path) -> None:
    rotated = tmp_path / "rotated" / RUN
    rotated.mkdir(parents=True)
    for log in sorted(LOGS.glob("rank*.log")):
        lines = log.read_bytes().splitlines(keepends=True)
        third = len(lines) // 3
        (rotated / f"{log.name}.2.gz").write_bytes(gzip.compress(b"".join(lines[:third])))
        (rotated / f"{log.name}.1.zst").write_bytes(
            zstandard.ZstdCompressor().compress(b"".join(lines[third : 2 * third]))
        )
        (rotated / log.name).write_bytes(b"".join(lines[2 * third :]))
    shutil.copytree(LOGS, tmp_path / "plain" / RUN)
    for name in ("plain", "rotated"):
        project = tmp_path / f"p-{name}"
        project.mkdir()
        # the plain logs' replay is the reference: built in-process (conftest); the rotated
        # ones go through the real CLI
        dsim = run_dsim_in_process if name == "plain" else run_dsim
        parse = dsim("parse", str(tmp_path / name / RUN), "-q", cwd=project)
        assert parse.returncode == 0, parse.stderr
        run = dsim("run", RUN, "--executor", "local", "-q", cwd=project)
        assert run.returncode == 0, run.stderr
        report = dsim("report", "results", "--out", "r.html", cwd=project)
        assert report.returncode == 0, report.stderr
    plain, rolled = (
        load_replay(tmp_path / f"p-{name}" / "results" / RUN / "min__min.parquet", remedy="")[0]
        for name in ("plain", "rotated")
    )
    assert plain.num_rows > 0
    assert plain.equals(rolled)
    info = json.loads((tmp_path / "p-rotated" / "traces" / RUN / "run.json").read_text())
    assert {s.get("compression") for s in info["sources"]} >= {"gzip", "zstd"}
