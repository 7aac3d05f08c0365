"""`dsim synth`: the queueing model, its raw-log output, and the round trip through `dsim parse`."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import run_dsim, run_dsim_in_process
from hypothesis import given, settings
from hypothesis import strategies as st

from dsim.errors import UsageError
from dsim.model.runname import parse_run_name
from dsim.model.tables import read_run
from dsim.synth import SynthParams, simulate, synthesize
from dsim.synth.writer import estimated_bytes
from dsim.words import byte_size

TS = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})"
NUM = r"(\d+\.\d{6})"
FETCH_RE = re.compile(
    TS + r" DEBUG:\tGPU: (\d+) worker_id: (\d+), END FETCH at_time " + NUM + r" data idx(\d+)$"
)
TRAIN_RE = re.compile(
    TS + r" GPU: (\d+) Epoch: \[(\d+)\]\[ *(\d+)/(\d+)\]\tTime " + NUM + r" \(" + NUM + r"\)"
    r"\tData " + NUM + r" \(" + NUM + r"\)\tThroughput (\d+\.\d{3}) \((\d+\.\d{3})\)$"
)

SMALL = SynthParams(
    gpus=3,
    iterations=23,
    epochs=2,
    workers=3,
    prefetch=2,
    seed=7,
    fetch_mean_s=0.8,
    fetch_cv=0.5,
    skew=0.5,
    straggler_prob=0.2,
    straggler_factor=5.0,
    compute_s=0.2,
    allreduce_s=0.03,
    name="small",
)


def cli_args(params: SynthParams, out: Path) -> list[str]:
    args = [
        "synth",
        *("--gpus", str(params.gpus), "--iterations", str(params.iterations)),
        *("--epochs", str(params.epochs), "--workers", str(params.workers)),
        *("--prefetch", str(params.prefetch), "--seed", str(params.seed)),
        *("--fetch-mean", str(params.fetch_mean_s), "--fetch-cv", str(params.fetch_cv)),
        *("--skew", str(params.skew), "--straggler-prob", str(params.straggler_prob)),
        *("--straggler-factor", str(params.straggler_factor), "--compute", str(params.compute_s)),
        *("--allreduce", str(params.allreduce_s), "--out", str(out)),
    ]
    if params.name is not None:
        args += ["--name", params.name]
    if params.per_rank:
        args.append("--per-rank")
    return args


def model(params: SynthParams, chunk_iterations: int | None = None) -> dict[str, np.ndarray]:
    """The model's values stacked over all chunks: [E·N] or [E·N, G] arrays."""
    chunks = list(simulate(params, chunk_iterations))
    out = {
        "epoch": np.concatenate([np.full(len(c.iteration), c.epoch) for c in chunks]),
        "iteration": np.concatenate([c.iteration for c in chunks]),
    }
    for key in ("fetch_us", "fetch_end_us", "train_start_us", "stall_us", "time_us"):
        out[key] = np.concatenate([getattr(c, key) for c in chunks])
    return out


def naive(params: SynthParams, fetch_us: np.ndarray, t0: int) -> dict[str, np.ndarray]:
    """The model written as the plain loop it describes, one iteration and rank at a time."""
    g, n, w, p = params.gpus, params.iterations, params.workers, params.prefetch
    step = round(params.compute_s * 1e6) + round(params.allreduce_s * 1e6)
    fe = np.zeros((params.epochs * n, g), dtype=np.int64)
    ts = np.zeros_like(fe)
    stall = np.zeros_like(fe)
    time = np.zeros(params.epochs * n, dtype=np.int64)
    for e in range(params.epochs):
        end = t0
        for i in range(n):
            row = e * n + i
            for r in range(g):
                worker_free = fe[row - w, r] if i >= w else t0
                released = ts[row - w * p, r] if i >= w * p else t0
                fe[row, r] = max(worker_free, released) + fetch_us[row, r]
            for r in range(g):
                ts[row, r] = max(fe[row, r], end)
                stall[row, r] = ts[row, r] - end
            new_end = int(ts[row].max()) + step
            time[row] = new_end - end
            end = new_end
        t0 = end
    return {"fetch_end_us": fe, "train_start_us": ts, "stall_us": stall, "time_us": time}


def check_against_naive(params: SynthParams, chunk_iterations: int | None = None) -> None:
    got = model(params, chunk_iterations)
    t0 = int((np.datetime64(params.start, "us") - np.datetime64(0, "us")).astype(np.int64))
    want = naive(params, got["fetch_us"], t0)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_model_matches_the_plain_loop():
    check_against_naive(SMALL)
    check_against_naive(SMALL, chunk_iterations=1)  # one prefetch window per chunk
    check_against_naive(SynthParams(gpus=2, iterations=9, epochs=3, workers=1, prefetch=1))


@settings(max_examples=40, deadline=None)
@given(
    gpus=st.integers(1, 4),
    iterations=st.integers(1, 30),
    epochs=st.integers(1, 2),
    workers=st.integers(1, 4),
    prefetch=st.integers(1, 3),
    seed=st.integers(0, 2**32),
    fetch_mean=st.floats(0.001, 3.0),
    cv=st.floats(0.0, 2.0),
    compute=st.floats(0.001, 1.0),
    chunk=st.integers(1, 40),
)
def test_model_matches_the_plain_loop_for_any_parameters(
    gpus, iterations, epochs, workers, prefetch, seed, fetch_mean, cv, compute, chunk
):
    params = SynthParams(
        gpus=gpus,
        iterations=iterations,
        epochs=epochs,
        workers=workers,
        prefetch=prefetch,
        seed=seed,
        fetch_mean_s=fetch_mean,
        fetch_cv=cv,
        straggler_prob=0.1,
        compute_s=compute,
    )
    check_against_naive(params, chunk_iterations=chunk)


def test_queueing_behaviour():
    """Few workers starve training; many hide fetch time; rank skew creates delay between GPUs."""
    base = {"gpus": 4, "iterations": 400, "epochs": 1, "fetch_mean_s": 1.0, "compute_s": 0.25}
    starved = model(SynthParams(workers=1, straggler_prob=0.0, **base))
    fed = model(SynthParams(workers=8, straggler_prob=0.0, fetch_cv=0.05, **base))
    skewed = model(SynthParams(workers=2, skew=1.0, straggler_prob=0.0, fetch_cv=0.05, **base))
    # One worker per rank supplies ~1 batch/s against 0.27 s of step: the slowest rank stalls.
    assert abs(starved["time_us"][50:].mean() / 1e6 - 1.0) < 0.1
    assert starved["stall_us"][50:].max(axis=1).mean() > 0.6e6
    assert fed["stall_us"][50:].max(axis=1).mean() < 0.01e6
    assert fed["time_us"][50:].mean() == pytest.approx(0.27e6)
    # With skew the slow rank waits for its data while the others wait in the all-reduce:
    # the difference of their stalls is the inter-GPU delay.
    stall = skewed["stall_us"][50:].mean(axis=0)
    assert stall[-1] > stall[0] + 0.2e6
    # Drawn fetch times have the configured mean.
    draws = model(SynthParams(gpus=8, iterations=5000, epochs=1, workers=4, straggler_prob=0.0))
    assert abs(draws["fetch_us"].mean() / 1e6 - 1.0) < 0.01


def test_chunking_and_layout_do_not_change_the_bytes(tmp_path):
    paths = [
        synthesize(SMALL, tmp_path / str(chunk), chunk_iterations=chunk) / "output.log"
        for chunk in (1, 7, None)
    ]
    data = [p.read_bytes() for p in paths]
    assert data[0] == data[1] == data[2]
    per_rank = synthesize(
        SynthParams(**{**SMALL.__dict__, "per_rank": True}), tmp_path / "per_rank"
    )
    lines = data[0].decode().splitlines(keepends=True)
    for r in range(SMALL.gpus):
        mine = [line for line in lines if f"GPU: {r} " in line]
        assert (per_rank / f"rank{r}.log").read_text() == "".join(mine)
    assert sorted(p.name for p in per_rank.iterdir()) == ["rank0.log", "rank1.log", "rank2.log"]


def test_every_line_follows_the_grammar_in_time_order(tmp_path):
    path = synthesize(SMALL, tmp_path) / "output.log"
    lines = path.read_text().splitlines()
    g, n, e = SMALL.gpus, SMALL.iterations, SMALL.epochs
    assert len(lines) == SMALL.lines == 2 * g * n * e
    fetches = [m for m in map(FETCH_RE.match, lines) if m]
    trains = [m for m in map(TRAIN_RE.match, lines) if m]
    assert len(fetches) == len(trains) == g * n * e
    stamps = [line[:26] for line in lines]
    assert stamps == sorted(stamps)  # one chronological stream, as a real interleaved log
    seen = sorted((int(m[3]), int(m[2]), int(m[4])) for m in trains)
    assert seen == sorted((ep, r, i) for ep in range(e) for r in range(g) for i in range(n))
    assert {m[5] for m in trains} == {str(n)}
    assert all(int(m[3]) == int(m[5]) % SMALL.workers for m in fetches)
    # The printed values are the model's, exactly (everything is whole microseconds).
    truth = model(SMALL)
    by_key = {(int(m[3]), int(m[4]), int(m[2])): m for m in trains}
    for row in (0, 1, n - 1, n, 2 * n - 1):
        for r in range(g):
            m = by_key[(int(truth["epoch"][row]), int(truth["iteration"][row]), r)]
            assert round(float(m[6]) * 1e6) == truth["time_us"][row]
            assert round(float(m[8]) * 1e6) == truth["stall_us"][row, r]
            assert float(m[10]) == pytest.approx(256 / float(m[6]), abs=1e-3)
    # The first iteration's running average is the value itself.
    assert all(m[6] == m[7] and m[8] == m[9] for m in trains if m[4].strip() == "0")


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    outs = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        params = SynthParams(**{**SMALL.__dict__, "seed": seed, "name": "run"})
        result = run_dsim(*cli_args(params, tmp_path / name))
        assert result.returncode == 0, result.stderr
        assert "wrote" in result.stdout and f"{SMALL.lines:,} lines" in result.stdout
        outs.append((tmp_path / name / "run" / "output.log").read_bytes())
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]


def test_parse_round_trip(tmp_path):
    for per_rank in (False, True):
        params = SynthParams(**{**SMALL.__dict__, "name": None, "per_rank": per_rank})
        logs, traces = tmp_path / f"logs{per_rank}", tmp_path / f"traces{per_rank}"
        result = run_dsim(*cli_args(params, logs))
        assert result.returncode == 0, result.stderr
        run_dir = logs / params.run_name
        result = run_dsim("parse", str(run_dir), "--out", str(traces))
        assert result.returncode == 0, result.stderr
        run = read_run(traces / params.run_name)
        report = run.info.report
        assert report["rejected"] == 0 and report["skipped"] == {}
        assert report["incomplete_iterations"]["count"] == 0
        assert run.info.gpu_count == params.gpus
        assert run.info.iterations_per_epoch == {str(e): params.iterations for e in range(2)}
        assert run.info.metadata == parse_run_name(params.run_name)
        assert run.info.metadata["workers"] == params.workers
        truth = model(params)
        g = params.gpus
        for table in (run.fetch, run.train):
            assert table.num_rows == g * params.iterations * params.epochs
            df = table.to_pandas().sort_values(["epoch", "iteration", "gpu"])
            np.testing.assert_array_equal(df["epoch"], np.repeat(truth["epoch"], g))
            np.testing.assert_array_equal(df["iteration"], np.repeat(truth["iteration"], g))
            if "fetch_s" in df:
                np.testing.assert_allclose(
                    df["fetch_s"], truth["fetch_us"].ravel() / 1e6, atol=1e-9
                )
                np.testing.assert_array_equal(df["worker"], df["iteration"] % params.workers)
                end_us = df["end"].to_numpy().astype("datetime64[us]").astype(np.int64)
                np.testing.assert_array_equal(end_us, truth["fetch_end_us"].ravel())
            else:
                np.testing.assert_allclose(
                    df["iteration_s"], np.repeat(truth["time_us"], g) / 1e6, atol=1e-9
                )
                np.testing.assert_allclose(
                    df["stall_s"], truth["stall_us"].ravel() / 1e6, atol=1e-9
                )
                start_us = df["start"].to_numpy().astype("datetime64[us]").astype(np.int64)
                np.testing.assert_array_equal(start_us, truth["train_start_us"].ravel())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0"], "--gpus must be an integer >= 1"),
        (["--prefetch", "0"], "--prefetch must be an integer >= 1"),
        (["--fetch-mean", "nan"], "--fetch-mean must be a finite number > 0"),
        (["--name", "../escape"], "is not a valid run name"),
        (["--gpus", "two"], "Invalid value"),
    ],
)
def test_bad_parameters_exit_2_and_write_nothing(tmp_path, args, message):
    base = {"--gpus": "2", "--iterations": "5", "--epochs": "1", "--workers": "2"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    flat = [item for pair in base.items() for item in pair]
    # one case in a subprocess (synth's end-to-end error path), the others in-process
    run = run_dsim if args == ["--gpus", "two"] else run_dsim_in_process
    result = run("synth", *flat, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"iterations": 0}, "--iterations must be an integer >= 1"),
        ({"epochs": -1}, "--epochs must be an integer >= 1"),
        ({"workers": 0}, "--workers must be an integer >= 1"),
        ({"batch_size": 0}, "--batch-size must be an integer >= 1"),
        ({"seed": -3}, "--seed must be an integer >= 0"),
        ({"fetch_mean_s": -1.0}, "--fetch-mean must be a finite number > 0"),
        ({"fetch_cv": float("inf")}, "--fetch-cv must be a finite number >= 0"),
        ({"compute_s": 0.0}, "--compute must be a finite number > 0"),
        ({"compute_s": 1e-9}, "at least 1 microsecond"),
        ({"allreduce_s": -0.1}, "--allreduce must be a finite number >= 0"),
        ({"skew": -0.5}, "--skew must be a finite number >= 0"),
        ({"straggler_prob": 1.5}, "--straggler-prob must be a finite number >= 0.0 and <= 1"),
        ({"straggler_factor": 0.5}, "--straggler-factor must be a finite number >= 1"),
        ({"name": ".hidden"}, "is not a valid run name"),
        ({"name": "a/b"}, "is not a valid run name"),
        ({"iterations": 10**9, "fetch_mean_s": 1e4}, "would last for centuries"),
        # logs whose own parse rejects their longest lines (--max-duration, a day)
        ({"fetch_mean_s": 1e5}, "would last a day or more"),
        ({"fetch_mean_s": 2e4, "straggler_factor": 5.0}, "would last a day or more"),
        ({"compute_s": 86_000.0, "allreduce_s": 400.0}, "would last a day or more"),
    ],
)
def test_impossible_parameters_are_refused_before_writing(tmp_path, change, message):
    params = SynthParams(**{**SMALL.__dict__, **change})
    with pytest.raises(UsageError, match=re.escape(message)):
        synthesize(params, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_out_must_be_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        synthesize(SMALL, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "x"


def test_replaces_its_own_output_but_never_other_files(tmp_path):
    args = ["synth", "--gpus", "1", "--iterations", "3", "--epochs", "1", "--workers", "1"]
    args += ["--out", str(tmp_path), "--name", "run", "-q"]
    assert run_dsim(*args).returncode == 0
    assert run_dsim(*args, "--seed", "5").returncode == 0  # a new synth run replaces the old
    assert len((tmp_path / "run" / "output.log").read_text().splitlines()) == 6
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = run_dsim(*args[:-5], "--out", str(tmp_path), "--name", "mine")
    assert result.returncode == 2 and "dsim synth did not write" in result.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "run"]  # no temporary leftovers


@pytest.mark.parametrize(
    ("gpus", "iterations", "epochs"), [(1, 1, 1), (3, 40, 2), (70, 120, 1), (2, 1200, 1)]
)
def test_the_size_estimate_is_within_a_few_percent_below_the_bytes_written(
    tmp_path, gpus, iterations, epochs
):
    params = SynthParams(**{**SMALL.__dict__, "gpus": gpus, "iterations": iterations,
                            "epochs": epochs})  # fmt: skip
    written = (synthesize(params, tmp_path) / "output.log").stat().st_size
    assert 0.9 * written <= estimated_bytes(params) <= written


def test_a_run_that_cannot_fit_the_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    """`--gpus 1024 --iterations 300000` wrote for five minutes until the disk was full."""
    import shutil

    free = estimated_bytes(SynthParams(gpus=3, iterations=40, epochs=2, workers=2)) - 1
    usage = shutil.disk_usage(tmp_path)._replace(free=free)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)
    args = ["synth", "--gpus", "3", "--iterations", "40", "--epochs", "2", "--workers", "2"]
    proc = run_dsim_in_process(*args, "--out", "out/deeper", cwd=tmp_path)
    assert proc.returncode == 2
    assert "480 lines (3 GPUs × 40 iterations × 2 epochs × 2) take about" in proc.stderr
    assert f"and {tmp_path} has {byte_size(free)} free" in proc.stderr
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=free + 1))
    proc = run_dsim_in_process(*args, "--out", "out", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
