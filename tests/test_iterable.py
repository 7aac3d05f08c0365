"""IterableDataset loaders (docs/SPEC.md §1.2 ``stream``, §2.1, §4.2).

The record round trip and the pipeline model's refusal need no PyTorch; the
instrumentation is checked with real DataLoaders, and end to end by a real
2-rank DDP job (gloo, loopback) whose logs the real CLI parses and replays.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dsim.errors import UsageError
from dsim.instrument.lines import fetch_line, training_line
from dsim.sources.rawlog import grammar

JOB = Path(__file__).with_name("iterable_job.py")
DSIM = [sys.executable, "-m", "dsim"]
WALL = 1_764_000_000.0


def _records(text: str, fast: bool) -> dict[str, np.ndarray]:
    lines = grammar.lines_of(text.encode())
    return grammar.parse_lines(lines, 1, grammar.Rejects(), fast=fast).fetch


def test_stream_position_round_trips_and_old_lines_parse_as_before() -> None:
    stream = fetch_line(WALL, 1, 3, 0.25, 17, 0.125, 0.0625, stream=5)
    assert stream.endswith(" data idx17 stream 5 cpu 0.125000000 runq 0.062500000\n")
    bare = fetch_line(WALL, 1, 3, 0.25, 17, stream=0)
    assert bare.endswith(" data idx17 stream 0\n")
    old = fetch_line(WALL, 1, 3, 0.25, 17, 0.125)
    assert "stream" not in old
    text = stream + bare + old
    from dsim.sources.rawlog.fastpath import fast_records

    lines = grammar.lines_of(text.encode())
    assert len(fast_records(lines, np.arange(1, 4), 86_400.0)[2]) == 0  # all cut by position
    for fast in (True, False):  # both paths give the same records
        records = _records(text, fast)
        assert records["idx"].tolist() == [17, 17, 17]
        assert records["worker"].tolist() == [3, 3, 3]
        np.testing.assert_array_equal(records["stream"], [5.0, 0.0, np.nan])
        np.testing.assert_array_equal(records["cpu_s"], [0.125, np.nan, 0.125])
        np.testing.assert_array_equal(records["fetch_s"], [0.25, 0.25, 0.25])
    assert np.isnan(_records(old * 3, True)["stream"]).all()
    # A stream field in the wrong place, or not a count of 1 to 9 digits, is malformed.
    bad = old.replace(" cpu", " stream x cpu") + stream.replace(" stream 5", " stream -5")
    bad += bare.replace("stream 0", "stream 1234567890") + old.replace("\n", " stream 1\n")
    for fast in (True, False):
        rejects = grammar.Rejects()
        grammar.parse_lines(grammar.lines_of(bad.encode()), 1, rejects, fast=fast)
        assert rejects.table()["reason"].to_pylist() == [grammar.MALFORMED_FETCH] * 4


def _stream_log(path: Path, iterations: int = 40, marked: bool = True) -> None:
    """Two ranks, two workers taking batches in turn, one epoch."""
    lines = []
    for rank in (0, 1):
        t = WALL
        for i in range(iterations):
            f = 0.05 + 0.01 * ((i * 7 + rank) % 3)
            stream = i // 2 if marked else None
            lines.append(fetch_line(t + 0.02, rank, i % 2, f, i, stream=stream))
            times = (0.1, 0.1), (0.03, 0.03)
            lines.append(training_line(t + 0.03, rank, 0, i, iterations, *times, None))
            t += 0.1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))


def _parse(log: Path, out: Path, name: str):
    from dsim.api import parse

    return parse(log, out=out, name=name, quiet=True)


def test_parser_keeps_stream_positions_and_says_what_replays(tmp_path: Path) -> None:
    _stream_log(tmp_path / "logs" / "s" / "rank0.log")
    _stream_log(tmp_path / "logs" / "m" / "rank0.log", marked=False)
    streamed = _parse(tmp_path / "logs" / "s", tmp_path / "traces", "s")
    plain = _parse(tmp_path / "logs" / "m", tmp_path / "traces", "m")
    fetch = streamed.fetch
    assert str(fetch["stream"].dtype) == "int32"
    assert (fetch["stream"] == fetch["iteration"] // 2).all()
    assert streamed.info.report["stream_fetches"] == 80
    assert "stream" not in plain.fetch.columns and "stream_fetches" not in plain.info.report

    cli = subprocess.run(
        [*DSIM, "parse", str(tmp_path / "logs" / "s"), "--out", str(tmp_path / "t2")],
        capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert "80 fetch records from an IterableDataset" in cli.stdout
    assert "cannot change the worker count" in cli.stdout


def test_pipeline_refuses_other_worker_counts_and_keeps_measured_workers(tmp_path: Path) -> None:
    from dsim.analysis.verdict import STREAM_NOTE, verdict
    from dsim.model.tables import read_run
    from dsim.replay.arrays import build_iteration_arrays
    from dsim.replay.models.pipeline import check_stream_workers
    from dsim.replay.params import ReplayParams

    _stream_log(tmp_path / "logs" / "s" / "rank0.log")
    _stream_log(tmp_path / "logs" / "m" / "rank0.log", marked=False)
    arrays = {}
    for name in ("s", "m"):
        _parse(tmp_path / "logs" / name, tmp_path / "traces", name)
        run = read_run(tmp_path / "traces" / name)
        arrays[name] = build_iteration_arrays(run.fetch, run.train)
    assert arrays["s"].stream and not arrays["m"].stream
    with pytest.raises(UsageError, match=r"--workers 4: run s read an IterableDataset with 2"):
        check_stream_workers(arrays["s"], 4, "s")
    check_stream_workers(arrays["s"], 2, "s")  # the measured count is no what-if
    check_stream_workers(arrays["s"], None, "s")
    check_stream_workers(arrays["m"], 4, "m")  # map-style: replayed as before

    from dsim.replay.models import get_model

    model = get_model("pipeline")
    with pytest.raises(UsageError, match="IterableDataset"):
        model.prepare(arrays["s"], ReplayParams(workers=3))
    prepared = model.prepare(arrays["s"], ReplayParams())
    assert prepared.calibration.keep_worker_ids
    with pytest.raises(UsageError, match="IterableDataset"):
        model.replay(prepared, ("actual", "actual"), ReplayParams(workers=1))
    # Prefetch what-ifs replay; at the measured settings the run is reproduced.
    same = model.replay(prepared, ("actual", "actual"), ReplayParams(prefetch_factor=2))
    np.testing.assert_allclose(same.iteration_s, arrays["s"].iteration_time.max(axis=1))
    more = model.replay(prepared, ("actual", "actual"), ReplayParams(prefetch_factor=4))
    assert np.isfinite(more.iteration_s).all()

    rows = [
        {"run": "s", "fetch_align": f, "start_align": s, "iteration_s_mean": t,
         "stall_s_mean": 0.03, "effective_delay_pct": 0.0, "iterations": 40, "gpus": 2}
        for f, s, t in (("actual", "actual", 0.1), ("min", "actual", 0.09))
    ]  # fmt: skip
    trace = {"report": {"stream_fetches": 80}}
    assert STREAM_NOTE in verdict(rows, trace=trace, model="pipeline").caveats
    assert STREAM_NOTE not in verdict(rows, trace={}, model="pipeline").caveats
    assert STREAM_NOTE not in verdict(rows, trace=trace).caveats  # per-iteration: no mapping used


def test_tune_sweeps_only_the_prefetch_factor_of_an_iterable_run(tmp_path: Path) -> None:
    from dsim.app.tune import STREAM_CAVEAT, tune_run

    _stream_log(tmp_path / "logs" / "s" / "rank0.log")
    _parse(tmp_path / "logs" / "s", tmp_path / "traces", "s")
    result = tune_run(tmp_path / "traces" / "s", prefetch=[1, 2], alignment=False)
    assert {(p.workers, p.prefetch) for p in result.alone} == {(2, 1), (2, 2)}
    assert STREAM_CAVEAT in result.caveats
    with pytest.raises(UsageError, match="--workers 4: run s read an IterableDataset"):
        tune_run(tmp_path / "traces" / "s", workers=[2, 4], alignment=False)


# ------------------------------------------------------------------ with PyTorch


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


try:  # the tests that use it skip without PyTorch
    from torch.utils.data import IterableDataset as _Iterable
except ImportError:  # pragma: no cover - CI installs torch
    _Iterable = object  # type: ignore[assignment,misc]


class Counting(_Iterable):  # type: ignore[misc,valid-type]
    """An IterableDataset of ``n`` integers, sharded over workers; picklable (spawn)."""

    def __init__(self, n: int):
        self.n = n
        self.note = "passes through"

    def __iter__(self):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        for i in range(worker, self.n, workers):
            time.sleep(0.0005)
            yield i


@pytest.mark.torch
def test_iterable_loader_yields_the_same_batches_and_logs_each_as_handed_out(
    torch, tmp_path: Path
) -> None:
    from torch.utils.data import DataLoader

    from dsim.instrument import instrument_loader
    from dsim.instrument.iterable import timed_iterable_class

    plain = DataLoader(Counting(10), batch_size=3)
    loader = instrument_loader(plain, log_dir=tmp_path, rank=2)
    assert isinstance(loader.dataset, timed_iterable_class())
    assert loader.dataset.note == "passes through" and loader.dataset.wrapped is plain.dataset
    for _ in range(2):  # two epochs
        got = [b.tolist() for b in loader]
        assert got == [b.tolist() for b in plain] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    lines = (tmp_path / "rank2.log").read_text().splitlines()
    fetches = [line for line in lines if "END FETCH" in line]
    assert len(fetches) == 8 and sum(" LOADER " in line for line in lines) == 2
    for k, line in enumerate(fetches):
        assert "GPU: 2 worker_id: 0, END FETCH at_time " in line
        assert f" data idx{k % 4} stream {k % 4} cpu " in line
    with pytest.raises(UsageError, match="already"):
        instrument_loader(loader, log_dir=tmp_path)


@pytest.mark.torch
def test_wrapped_dataset_and_collate_pickle_together_for_spawned_workers(torch) -> None:
    from torch.utils.data import IterableDataset
    from torch.utils.data._utils.collate import default_collate

    from dsim.instrument.iterable import TimedCollate, timed_iterable_class

    dataset = timed_iterable_class()(Counting(4))
    collate = TimedCollate(default_collate, dataset)
    copy, copied = pickle.loads(pickle.dumps((dataset, collate)))
    assert isinstance(copy, IterableDataset) and copied.dataset is copy  # one clock per worker
    samples = iter(copy)
    built = copied([next(samples), next(samples)])
    assert built.value.tolist() == [0, 1] and built.stream == 0 and built.seconds > 0


@pytest.mark.latest_only  # not in CI's floors phase: tests/test_dependency_floors.py says why
@pytest.mark.torch
def test_ddp_job_over_an_iterable_dataset_parses_and_replays(torch, tmp_path: Path) -> None:
    """2 ranks (gloo), loaders with 0 and 2 workers; worker 1's shard ends mid-epoch."""
    env = {**os.environ, "NO_COLOR": "1"}
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS"):
        env.pop(var, None)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
        )

    job = run(sys.executable, str(JOB), str(tmp_path / "logs"), "0", "2")
    assert job.returncode == 0, job.stderr
    from dsim.model.tables import read_run

    parse = run(*DSIM, "parse", str(tmp_path / "logs"), "--out", "traces")  # both runs
    assert parse.returncode == 0, parse.stderr
    for workers in (0, 2):
        name = f"w{workers}"
        trace = read_run(tmp_path / "traces" / name)
        report = trace.info.report
        assert report["rejected"] == 0 and report["other_lines"] == 0, report
        assert report["incomplete_iterations"]["count"] == 0
        assert report["stream_fetches"] == trace.fetch.num_rows == 2 * 2 * 6
        assert trace.info.loader["num_workers"] == workers
        fetch = trace.fetch.to_pandas()
        for _, group in fetch.groupby(["gpu", "epoch"]):
            by_worker = {
                int(w): (g.iteration.tolist(), g.stream.tolist())
                for w, g in group.sort_values("iteration").groupby("worker")
            }
            if workers == 0:
                assert by_worker == {0: (list(range(6)), list(range(6)))}
            else:  # round-robin until worker 1 runs dry, then worker 0 alone
                assert by_worker == {0: ([0, 2, 4, 5], [0, 1, 2, 3]), 1: ([1, 3], [0, 1])}
        assert (fetch.cpu_s >= 0).all()
        # The worker process's CPU (SPEC §1.2): from workers only, on all but each
        # worker process's first batch, and never below the building thread's.
        if workers == 0:
            assert "proc_cpu_s" not in fetch
        else:
            first = fetch.groupby(["gpu", "epoch", "worker"]).iteration.transform("min")
            assert fetch.proc_cpu_s.isna().eq(fetch.iteration == first).all()
            logged = fetch.dropna(subset=["proc_cpu_s"])
            assert (logged.proc_cpu_s + 1e-6 >= logged.cpu_s).all()

    replay = run(*DSIM, "run", "w2", "--traces", "traces", "--out", "results", "--warmup", "0")
    assert replay.returncode == 0, replay.stderr
    assert "IterableDataset" in replay.stdout  # the pipeline headline's caveat
    assert (tmp_path / "results" / "summary.csv").exists()
    refused = run(
        *DSIM, "run", "w2", "--traces", "traces", "--out", "results", "--model", "pipeline",
        "--workers", "4", "--warmup", "0",
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "IterableDataset with 2 workers" in refused.stderr
