"""Throughput and weak-scaling efficiency (docs/SPEC.md §5.5): the pure rules, then the real
CLI on `dsim synth` runs of one job at 1, 2 and 4 GPUs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_dsim, run_dsim_in_process
from tracegen import write_synthetic

from dsim.analysis.throughput import (
    NO_BATCH,
    NO_JOB,
    ONE_SIZE,
    add_throughput,
    batch_from_throughput,
    batch_size,
    trace_batch_size,
)


def test_batch_from_the_throughput_field() -> None:
    times = np.array([0.5, 0.25, 2.0, np.nan])
    printed = np.round(32 / times, 3)  # the field carries a few decimals
    assert batch_from_throughput(printed, times) == 32.0
    assert batch_from_throughput(np.array([10.0, 10.0]), np.array([3.3, 3.3])) == pytest.approx(33)
    assert batch_from_throughput(np.array([10.0, 10.0]), np.array([3.1, 3.1])) == pytest.approx(
        31.0
    )
    assert batch_from_throughput(np.array([10.0]), np.array([3.15])) == pytest.approx(31.5)
    assert batch_from_throughput(np.array([np.nan, 0.0]), np.array([1.0, 1.0])) is None


def test_batch_size_sources_in_order() -> None:
    trace = {"gpus": 4, "metadata": {"batch_size": 512}, "loader": {"batch_size": 64}}
    assert trace_batch_size(trace, 100.0) == (64.0, "loader")
    assert trace_batch_size({**trace, "loader": None}, 100.0) == (100.0, "throughput")
    assert trace_batch_size({**trace, "loader": None}, None) == (128.0, "run_name")
    assert trace_batch_size({"gpus": 4, "metadata": {}}, None) == (None, None)
    # what `dsim run` recorded wins; results written before it fall back to the trace
    assert batch_size({"batch": {"per_rank": 16, "source": "throughput"}, "trace": trace}) == (
        16.0,
        "throughput",
    )
    assert batch_size({"trace": trace}) == (64.0, "loader")


def _rows(**columns: list) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    base = {
        "logtype": ["job"] * n,
        "dataset": ["d"] * n,
        "augmentation": ["none"] * n,
        "model": ["m"] * n,
        "epochs": [2] * n,
        "batch_size": [None] * n,
        "workers": [4] * n,
        "threads": [0] * n,
        "replay_model": ["per-iteration"] * n,
        "loader_workers": [None] * n,
        "loader_prefetch_factor": [None] * n,
        "loader_changed": [False] * n,
        "fetch_align": ["actual"] * n,
        "start_align": ["actual"] * n,
        "speedup": [1.0] * n,
    }
    return pd.DataFrame({**base, **columns})


def test_throughput_per_rank_job_and_gain() -> None:
    df = add_throughput(
        _rows(
            gpus=[4, 4],
            batch_size_rank=[32.0, 32.0],
            iteration_s_mean=[0.5, 0.25],
            speedup=[1.0, 2.0],
            start_align=["actual", "min"],
        )
    )
    assert list(df["throughput_rank_samples_s"]) == [64.0, 128.0]
    assert list(df["throughput_job_samples_s"]) == [256.0, 512.0]
    assert list(df["throughput_gain_samples_s"]) == [0.0, 256.0]  # 512 replayed - 256 measured


def test_weak_scaling_efficiency_against_the_smallest_run() -> None:
    # job throughput 100 on 1 GPU, 190 on 2, 360 on 4: efficiency 1, 0.95, 0.9
    df = add_throughput(
        _rows(
            gpus=[1, 2, 4],
            batch_size_rank=[10.0, 10.0, 10.0],
            iteration_s_mean=[0.1, 2 * 10 / 190, 4 * 10 / 360],
        )
    )
    assert df["scaling_efficiency"].tolist() == pytest.approx([1.0, 0.95, 0.9])
    assert df["scaling_base_gpus"].tolist() == [1.0, 1.0, 1.0]
    assert df["throughput_note"].isna().all()
    # without a one-GPU run the smallest is the base: per-rank throughput relative to it
    two_four = add_throughput(
        _rows(gpus=[2, 4], batch_size_rank=[10.0, 10.0], iteration_s_mean=[0.1, 0.125])
    )
    assert two_four["scaling_efficiency"].tolist() == pytest.approx([1.0, 0.8])


def test_why_no_throughput_or_efficiency() -> None:
    df = add_throughput(
        _rows(gpus=[4], batch_size_rank=[math.nan], iteration_s_mean=[0.5]).astype(
            {"batch_size_rank": "float64"}
        )
    )
    assert math.isnan(df["throughput_job_samples_s"][0]) and df["throughput_note"][0] == NO_BATCH
    one = add_throughput(_rows(gpus=[4], batch_size_rank=[8.0], iteration_s_mean=[0.5]))
    assert one["throughput_note"][0] == ONE_SIZE and math.isnan(one["scaling_efficiency"][0])
    nameless = _rows(gpus=[1, 2], batch_size_rank=[8.0, 8.0], iteration_s_mean=[0.5, 0.5])
    for field in ("logtype", "dataset", "augmentation", "model", "epochs", "workers", "threads"):
        nameless[field] = None
    assert list(add_throughput(nameless)["throughput_note"]) == [NO_JOB, NO_JOB]
    twice = add_throughput(
        _rows(gpus=[1, 1, 2], batch_size_rank=[8.0] * 3, iteration_s_mean=[0.5] * 3)
    )
    assert twice["scaling_efficiency"].isna().all()
    assert "2 runs of this job with 1 GPU," in twice["throughput_note"][0]
    # another per-rank batch, policy or model is another job
    other = add_throughput(
        _rows(gpus=[1, 2], batch_size_rank=[8.0, 16.0], iteration_s_mean=[0.5, 0.5])
    )
    assert list(other["throughput_note"]) == [ONE_SIZE, ONE_SIZE]


def test_summary_of_synth_runs_at_three_gpu_counts(tmp_path: Path) -> None:
    for gpus in (1, 2, 4):  # inputs: the CLI's entry point in this process (conftest)
        proc = run_dsim_in_process(
            "synth", "--gpus", str(gpus), "--iterations", "60", "--epochs", "1",
            "--batch-size", "64", "--seed", "3", "--workers", "2", "--out", "logs", "-q",
            cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    proc = run_dsim("parse", "logs", "--out", "traces", "-q", cwd=tmp_path)  # 3 runs: --jobs 2
    assert proc.returncode == 0, proc.stderr
    proc = run_dsim_in_process("run", "synth_*", "-p", "min/min", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(tmp_path / "results" / "summary.csv")
    assert len(summary) == 6
    assert (summary["batch_size_rank"] == 64).all()
    assert (summary["batch_size_source"] == "throughput").all()
    assert np.allclose(
        summary["throughput_rank_samples_s"], 64 / summary["iteration_s_mean"], rtol=1e-12
    )
    assert np.allclose(
        summary["throughput_job_samples_s"], summary["throughput_rank_samples_s"] * summary["gpus"]
    )
    for (fetch, start), rows in summary.groupby(["fetch_align", "start_align"]):
        rows = rows.sort_values("gpus")
        assert rows["gpus"].tolist() == [1, 2, 4]
        assert rows["scaling_base_gpus"].tolist() == [1, 1, 1]
        single = rows["throughput_job_samples_s"].iloc[0]
        expected = rows["throughput_job_samples_s"] / (rows["gpus"] * single)
        assert np.allclose(rows["scaling_efficiency"], expected, rtol=1e-12), (fetch, start)
        assert rows["scaling_efficiency"].iloc[0] == 1.0
    info = json.loads(next((tmp_path / "results").glob("synth_*gpus2*/result.json")).read_text())
    assert info["batch"] == {"per_rank": 64.0, "source": "throughput"}


def test_unknown_batch_size_is_null_with_a_note(tmp_path: Path) -> None:
    """A trace with no loader line, no Throughput field and no b<B> in its name."""
    write_synthetic(tmp_path / "traces", "plain_run", iterations=30)
    # in-process (conftest): the subject is what the run wrote, not its start-up
    proc = run_dsim_in_process("run", "plain_run", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(tmp_path / "results" / "summary.csv")
    assert summary["throughput_job_samples_s"].isna().all()
    assert (summary["throughput_note"] == NO_BATCH).all()
    info = json.loads((tmp_path / "results" / "plain_run" / "result.json").read_text())
    assert "batch" not in info


def test_scaling_figure_draws_what_it_can_and_says_why_not() -> None:
    from dsim.render.figures import scaling_figure

    rows = add_throughput(
        _rows(
            gpus=[1, 2, 4],
            batch_size_rank=[10.0] * 3,
            iteration_s_mean=[0.1, 2 * 10 / 190, 4 * 10 / 360],
            run=["a_g1", "a_g2", "a_g4"],
        )
    )
    fig = scaling_figure(rows)
    bars = [t for t in fig.data if t.type == "bar"]
    lines = [t for t in fig.data if t.type == "scatter"]
    assert len(bars) == 1 and list(bars[0].y) == pytest.approx([100.0, 190.0, 360.0])
    assert len(lines) == 1 and list(lines[0].y) == pytest.approx([1.0, 0.95, 0.9])
    assert not fig.layout.annotations or all(
        "no scaling" not in a.text for a in fig.layout.annotations
    )

    single = add_throughput(_rows(gpus=[4], batch_size_rank=[8.0], iteration_s_mean=[0.5]))
    fig = scaling_figure(single.assign(run=["b"]))
    # no second panel to sit empty: the reason is a line of the subtitle, not a note
    # centred in an empty panel (it ran into the run labels above it)
    assert f"<sup>{ONE_SIZE}</sup>" in fig.layout.title.text  # short enough for one line
    assert "yaxis2" not in fig.layout.to_plotly_json()
    assert not fig.layout.annotations or all(ONE_SIZE not in a.text for a in fig.layout.annotations)
    unknown = add_throughput(
        _rows(gpus=[4], batch_size_rank=[math.nan], iteration_s_mean=[0.5]).astype(
            {"batch_size_rank": "float64"}
        )
    )
    fig = scaling_figure(unknown.assign(run=["c"]))
    texts = " ".join(a.text for a in fig.layout.annotations)
    assert "throughput unknown" in texts
    # the note names the run name's b<B>: escaped, or plotly draws "B>…" in bold
    assert "b&lt;B&gt;" in texts and "<B>" not in texts + fig.layout.title.text
