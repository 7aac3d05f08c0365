"""GPU utilisation logs (nvidia-smi CSV) beside a run's logs: read, checked, aligned by time.

The CSV files are written here in nvidia-smi's own format
(``nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used
--format=csv -lms 100``: a header with units, ``YYYY/MM/DD HH:MM:SS.mmm``
local times, values with units); these machines have no GPU.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import REPO, run_dsim, run_dsim_in_process

from dsim.errors import InputError
from dsim.sources.gpuutil import epoch_means, is_util_log, iteration_means, read_util_log

SAMPLE = REPO / "traces" / "raw" / "cpuDDP_synthetic_none_mlp_epoch2_b128_worker2_thread0"
HEADER = "timestamp, index, utilization.gpu [%], memory.used [MiB]"
# The sample's logs run from 16:11:59 to 16:12:15 on 2026-11-21 (local time).
T0 = dt.datetime(2026, 11, 21, 16, 11, 58)


def smi_row(t: dt.datetime, gpu: int, util: str, memory: str = "1024 MiB") -> str:
    return f"{t:%Y/%m/%d %H:%M:%S}.{t.microsecond // 1000:03d}, {gpu}, {util}, {memory}"


def samples(n: int = 200, gpus: int = 4) -> list[str]:
    """Every 100 ms for n steps from T0; GPU g at step k is (10 g + k) mod 101 %."""
    rows = []
    for k in range(n):
        t = T0 + dt.timedelta(milliseconds=100 * k)
        rows += [smi_row(t, g, f"{(10 * g + k) % 101} %") for g in range(gpus)]
    return rows


def write_csv(path: Path, rows: list[str], header: str = HEADER) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_reads_samples_and_rejects_bad_rows_with_their_lines(tmp_path):
    t = T0
    rows = [
        smi_row(t, 0, "45 %"),  # line 2
        smi_row(t, 1, "[N/A]"),  # 3
        smi_row(t, 2, "101 %"),  # 4
        "2026/02/30 10:00:00.000, 0, 5 %, 1 MiB",  # 5: no such day
        smi_row(t, 3, "7 %")[:-10],  # 6: cut short
        HEADER,  # 7: a repeated header is skipped, not rejected
        smi_row(t, 3, "[Not Supported]"),  # 8
        smi_row(t, 3, "12", "2048"),  # 9: nounits values
        smi_row(t, 3, "1x %"),  # 10
    ]
    log = read_util_log(write_csv(tmp_path / "smi.csv", rows))
    assert log.samples.to_pydict()["util_pct"] == [45.0, 12.0]
    assert log.samples.to_pydict()["memory_used_mib"] == [1024.0, 2048.0]
    assert log.samples.to_pydict()["gpu"] == [0, 3]
    assert pd.Timestamp(log.samples["time"][0].as_py()) == pd.Timestamp(T0)
    got = list(zip(log.rejects["line"].to_pylist(), log.rejects["reason"].to_pylist(), strict=True))
    assert got == [
        (3, "utilisation not reported ([N/A])"),
        (4, "utilisation out of range (0–100)"),
        (5, "invalid timestamp"),
        (6, "malformed utilisation row (wrong number of fields)"),
        (8, "utilisation not reported ([Not Supported])"),
        (10, "non-numeric utilisation"),
    ]
    assert log.source["kind"] == "gpu_util" and len(log.source["sha256"]) == 64


def test_only_nvidia_smi_csv_files_are_taken(tmp_path):
    assert is_util_log(write_csv(tmp_path / "a.csv", samples(2)))
    gz = tmp_path / "b.csv.gz"
    gz.write_bytes(gzip.compress((HEADER + "\n" + "\n".join(samples(2)) + "\n").encode()))
    assert is_util_log(gz)
    assert not is_util_log(write_csv(tmp_path / "c.csv", ["1,2"], header="epoch,loss"))
    assert not is_util_log(write_csv(tmp_path / "d.txt", samples(2)))
    with pytest.raises(InputError, match="not an nvidia-smi CSV log"):
        read_util_log(write_csv(tmp_path / "e.csv", ["1,2"], header="epoch,loss"))


def test_epoch_means_count_only_samples_inside_each_epochs_iterations():
    ns = lambda s: np.datetime64("2026-01-01T00:00:00", "ns") + np.timedelta64(int(s * 1e9), "ns")  # noqa: E731
    train = pa.table(
        {
            "epoch": pa.array([0, 0, 1], pa.int32()),
            "gpu": pa.array([0, 0, 0], pa.int32()),
            "start": pa.array([ns(0.5), ns(1), ns(10)], pa.timestamp("ns")),
            "iteration_s": [1.0, 1.0, 2.0],
            "stall_s": [0.5, 0.0, 0.0],  # the first iteration began at 0 s, its batch came at 0.5 s
        }
    )
    smi = pa.table(
        {
            "time": pa.array(
                [ns(t) for t in (-1, 0, 1.5, 2, 3, 10, 11, 12, 13)], pa.timestamp("ns")
            ),
            "gpu": pa.array([0] * 8 + [1], pa.int32()),
            "util_pct": [99.0, 10.0, 20.0, 30.0, 99.0, 40.0, 50.0, 60.0, 70.0],
            "memory_used_mib": [None] * 9,
        }
    )
    # epoch 0 spans [0, 2] s: 10, 20, 30; epoch 1 spans [10, 12] s: 40, 50, 60;
    # GPU 1 has no training rows.
    assert epoch_means(smi, train) == [
        {"epoch": 0, "gpu": 0, "samples": 3, "mean_util_pct": 20.0},
        {"epoch": 1, "gpu": 0, "samples": 3, "mean_util_pct": 50.0},
    ]


def _run_with_csv(tmp_path: Path, rows: list[str], name: str = "nvidia-smi.csv") -> Path:
    run = tmp_path / "logs" / "run"
    shutil.copytree(SAMPLE, run)
    write_csv(run / name, rows)
    return run


def test_parse_writes_utilisation_aligned_to_the_iterations(tmp_path):
    run = _run_with_csv(tmp_path, [*samples(), smi_row(T0, 2, "[N/A]")])
    (run / "notes.csv").write_text("epoch,loss\n0,1.5\n")  # another CSV: not a utilisation log
    done = run_dsim("parse", str(run), "--out", str(tmp_path / "traces"))
    assert done.returncode == 0, done.stderr
    assert "skipped 1 bad line " in done.stdout
    assert "1  utilisation not reported ([N/A])" in done.stdout
    assert "GPU utilisation: 800 samples of GPUs 0-3 from 1 file; mean per epoch:" in done.stdout
    out = tmp_path / "traces" / "run"
    info = json.loads((out / "run.json").read_text())
    assert [s.get("kind") for s in info["sources"]] == [None] * 4 + ["gpu_util"]
    util = pd.read_parquet(out / "gpu_util.parquet")
    assert len(util) == 800
    train = pd.read_parquet(out / "train.parquet")
    expected = []
    for (epoch, gpu), rows in train.groupby(["epoch", "gpu"]):
        begin = rows["start"] - pd.to_timedelta(rows["stall_s"], unit="s")
        lo = begin.min()
        hi = (begin + pd.to_timedelta(rows["iteration_s"], unit="s")).max()
        mine = util[(util.gpu == gpu) & (util.time >= lo) & (util.time <= hi)]
        assert len(mine) > 10  # the fixture covers every epoch
        expected.append((epoch, gpu, len(mine), mine.util_pct.mean()))
    per_epoch = info["gpu_util"]["per_epoch"]
    got = [(e["epoch"], e["gpu"], e["samples"], e["mean_util_pct"]) for e in per_epoch]
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    assert np.allclose([g[3] for g in got], [e[3] for e in expected], atol=1e-3)
    rejects = pd.read_csv(out / "rejects.csv")
    assert rejects.to_dict("records") == [
        {
            "file": str(run / "nvidia-smi.csv"),
            "line": 802,
            "reason": "utilisation not reported ([N/A])",
            "text": smi_row(T0, 2, "[N/A]"),
        }
    ]


def test_strict_stops_at_the_first_bad_row_and_replays_ignore_utilisation(tmp_path):
    run = _run_with_csv(tmp_path, [*samples(5), smi_row(T0, 1, "150 %")])
    done = run_dsim("parse", str(run), "--out", str(tmp_path / "strict"), "--strict")
    assert done.returncode == 3
    assert f"{run / 'nvidia-smi.csv'}:22: utilisation out of range (0–100)" in done.stderr
    assert not (tmp_path / "strict").exists() or not any((tmp_path / "strict").iterdir())

    plain = tmp_path / "plain" / "run"
    shutil.copytree(SAMPLE, plain)
    for logs, traces in ((run, "t1"), (plain, "t2")):  # in-process: the replays are the subject
        parsed = run_dsim_in_process("parse", str(logs), "--out", str(tmp_path / traces), "-q")
        assert parsed.returncode == 0, parsed.stderr
        done = run_dsim_in_process(
            "run",
            "run",
            "--traces",
            str(tmp_path / traces),
            "--out",
            str(tmp_path / f"r{traces}"),
            "--executor",
            "local",
            "-q",
        )
        assert done.returncode == 0, done.stderr
    with_util = pd.read_parquet(tmp_path / "rt1" / "summary.parquet")
    without = pd.read_parquet(tmp_path / "rt2" / "summary.parquet")
    metrics = [c for c in without.columns if c.endswith(("_mean", "_std"))]
    assert metrics and with_util[metrics].equals(without[metrics])


def test_a_utilisation_log_with_no_sample_inside_the_run_is_reported(tmp_path):
    late = [smi_row(T0 + dt.timedelta(hours=1), g, "50 %") for g in range(4)]
    run = _run_with_csv(tmp_path, late)
    done = run_dsim("parse", str(run), "--out", str(tmp_path / "traces"))
    assert done.returncode == 0, done.stderr
    assert "mean per epoch: no sample in any" in done.stdout
    assert "warning: GPU utilisation: no sample falls inside any iteration" in done.stdout


def test_iteration_means_average_the_samples_inside_each_iteration():
    ns = lambda s: np.datetime64("2026-01-01T00:00:00", "ns") + np.timedelta64(int(s * 1e9), "ns")  # noqa: E731
    # Iterations of GPU 0: [0, 1], [1.02, 1.05], [5, 5.01]; GPU 1 has no samples.
    train = pa.table(
        {
            "epoch": pa.array([0, 0, 0, 0], pa.int32()),
            "gpu": pa.array([0, 0, 0, 1], pa.int32()),
            "start": pa.array([ns(0.2), ns(1.02), ns(5.0), ns(0)], pa.timestamp("ns")),
            "iteration_s": [1.0, 0.03, 0.01, 1.0],
            "stall_s": [0.2, 0.0, 0.0, 0.0],
        }
    )
    smi = pa.table(
        {
            "time": pa.array([ns(t) for t in (0.0, 0.5, 1.0, 3.5)], pa.timestamp("ns")),
            "gpu": pa.array([0, 0, 0, 0], pa.int32()),
            "util_pct": [10.0, 20.0, 60.0, 90.0],
            "memory_used_mib": [None] * 4,
        }
    )
    got = iteration_means(smi, train)
    # [0, 1]: 10, 20, 60 -> 30; [1.02, 1.05]: none inside, 1.0 is 0.05 s before its end -> 60;
    # [5, 5.01]: last sample 3.5 is 1.51 s old -> NaN; GPU 1 has no samples -> NaN.
    assert got[:2].tolist() == [30.0, 60.0]
    assert np.isnan(got[2]) and np.isnan(got[3])


def test_the_report_draws_utilisation_per_iteration_under_the_measured_stalls(tmp_path):
    from dsim.app.report import run_utilisation
    from dsim.model.results import scan_results
    from dsim.render.figures import timeline_figure
    from dsim.replay.policies import BASELINE

    run = _run_with_csv(tmp_path, samples())
    traces, results = tmp_path / "traces", tmp_path / "results"
    # the CLI's entry point in this process: what the report draws from them is the subject
    assert run_dsim_in_process("parse", str(run), "--out", str(traces), "-q").returncode == 0
    done = run_dsim_in_process("run", "run", "--traces", str(traces), "--out", str(results), "-q")
    assert done.returncode == 0, done.stderr

    result = scan_results([results]).runs[0]
    frame = result.read(BASELINE).to_pandas()
    util = run_utilisation(result, traces, frame)
    assert list(util.columns) == [f"util_pct_gpu{g}" for g in range(4)] and len(util) == len(frame)
    # By hand, for every iteration of GPU 2: the mean of its samples inside the iteration.
    train = pd.read_parquet(traces / "run" / "train.parquet").set_index(
        ["epoch", "iteration", "gpu"]
    )
    smi = pd.read_parquet(traces / "run" / "gpu_util.parquet")
    smi = smi[smi.gpu == 2]
    for i, (epoch, iteration) in enumerate(zip(frame.epoch, frame.iteration, strict=True)):
        row = train.loc[(epoch, iteration, 2)]
        begin = row.start - pd.to_timedelta(row.stall_s, unit="s")
        end = begin + pd.to_timedelta(row.iteration_s, unit="s")
        inside = smi[(smi.time >= begin) & (smi.time <= end)].util_pct
        last = smi[smi.time <= end].tail(1)
        if len(inside):
            want = inside.mean()
        elif len(last) and (end - last.time.iloc[0]) <= pd.Timedelta(seconds=1):
            want = last.util_pct.iloc[0]
        else:
            want = np.nan
        assert np.isclose(util["util_pct_gpu2"].iloc[i], want, equal_nan=True), (epoch, iteration)

    replays = {p: result.read(p).to_pandas() for p in result.replays}
    fig = timeline_figure("run", replays, threshold_s=0.03, utilisation=util)
    drawn = [t for t in fig.data if t.name == "GPU 2 utilisation"]
    assert len(drawn) == 1 and drawn[0].yaxis == "y2"
    assert np.allclose(drawn[0].y, util["util_pct_gpu2"].to_numpy(np.float32), equal_nan=True)
    assert fig.layout.yaxis2.title.text == "util. (%)"

    page = tmp_path / "report.html"
    done = run_dsim("report", str(results), "--traces", str(traces), "--out", str(page))
    assert done.returncode == 0, done.stderr
    assert "GPU utilisation per iteration (nvidia-smi, %)" in page.read_text()
    # Without the trace (or without utilisation samples) the timeline keeps its three panels.
    done = run_dsim("report", str(results), "--traces", str(tmp_path), "--out", str(page))
    assert done.returncode == 0, done.stderr
    assert "GPU utilisation per iteration" not in page.read_text()
