"""The pipeline model end to end: executors, chunks, `dsim run --model pipeline`, loader lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_dsim, run_dsim_in_process
from tracegen import synthetic_run, write_synthetic

from dsim.errors import UsageError
from dsim.execute import Job, PolicyResult, execute
from dsim.replay.arrays import build_iteration_arrays
from dsim.replay.models.pipeline import PipelineModel
from dsim.replay.params import ReplayParams
from dsim.replay.policies import KNOWN, START_KNOWN

PAIRS = tuple((f, s) for f in KNOWN for s in START_KNOWN)
RUN = "pipe_run"


def _jobs(params: ReplayParams) -> tuple[list[Job], PipelineModel]:
    model = PipelineModel()
    jobs = []
    for k in range(2):
        run = synthetic_run(f"r{k}", iterations=40, seed=11 + k)
        arrays = build_iteration_arrays(run.fetch, run.train)
        jobs.append(
            Job(
                run.name,
                model.prepare(arrays, params),
                PAIRS,
                model=model.name,
                cuts=tuple(int(c) for c in model.cut_points(arrays)),
            )
        )
    return jobs, model


def _collect(jobs: list[Job], params: ReplayParams, **kwargs) -> dict:
    results: dict = {}

    def on_result(result: PolicyResult) -> None:
        results[(result.run, result.policy)] = result

    execute(jobs, params, on_result=on_result, **kwargs)
    return results


def _assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for key in a:
        for name in a[key].metrics:
            assert a[key].metrics[name].tobytes() == b[key].metrics[name].tobytes(), (key, name)
        assert a[key].gpu_stall.tobytes() == b[key].gpu_stall.tobytes(), key


@pytest.mark.parametrize("params", [ReplayParams(), ReplayParams(workers=5, prefetch_factor=3)])
def test_chunks_at_segment_bounds_give_the_whole_replay(params: ReplayParams) -> None:
    """The model may only be cut between segments; any chunk size then gives the same bytes."""
    jobs, _ = _jobs(params)
    assert all(len(job.cuts or ()) >= 2 for job in jobs)  # two epochs at least
    whole = _collect(jobs, params, executor="local", chunk_rows=10**6)
    for chunk_rows in (1, 7):
        _assert_identical(whole, _collect(jobs, params, executor="local", chunk_rows=chunk_rows))


def test_a_chunk_off_the_segment_bounds_is_refused() -> None:
    jobs, _ = _jobs(ReplayParams())
    with pytest.raises(ValueError, match="segment bounds"):
        jobs[0].prepared.take(0, 3)


@pytest.mark.ray
def test_ray_gives_the_same_bytes_as_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    params = ReplayParams(workers=2)
    jobs, _ = _jobs(params)
    local = _collect(jobs, params, executor="local")
    _assert_identical(local, _collect(jobs, params, executor="ray", num_cpus=2, chunk_rows=5))


def _summary(root: Path) -> pd.DataFrame:
    return pd.read_csv(root / "results" / "summary.csv")


def test_dsim_run_pipeline_sits_beside_per_iteration_and_reproduces_the_measured_run(
    tmp_path: Path,
) -> None:
    write_synthetic(tmp_path / "traces", RUN, iterations=30)
    per_iteration = run_dsim("run", RUN, "--executor", "local", "-q", cwd=tmp_path)
    assert per_iteration.returncode == 0, per_iteration.stderr
    first = _summary(tmp_path)
    pipeline = run_dsim("run", RUN, "--model", "pipeline", "--executor", "local", cwd=tmp_path)
    assert pipeline.returncode == 0, pipeline.stderr
    assert "pipeline model" in pipeline.stdout  # the table says which model made it
    results = tmp_path / "results"
    assert (results / RUN / "result.json").is_file()  # the per-iteration results are untouched
    info = json.loads((results / f"{RUN}@pipeline" / "result.json").read_text())
    assert info["run"] == RUN and info["model"] == "pipeline"
    assert info["loader"]["measured"] == {"workers": 3, "prefetch_factor": 2, "source": "implied"}
    assert info["loader"]["changed"] is False
    # Both directories are read together; the identity replays agree.
    both = run_dsim("summarize", "results", "--format", "csv", "--out", "both", cwd=tmp_path)
    assert both.returncode == 0, both.stderr
    table = pd.read_csv(tmp_path / "both" / "summary.csv")
    assert set(table["replay_model"]) == {"per-iteration", "pipeline"}
    base = table[(table.fetch_align == "actual") & (table.start_align == "actual")]
    assert len(base) == 2
    np.testing.assert_allclose(base["iteration_s_mean"].iloc[0], base["iteration_s_mean"].iloc[1])
    np.testing.assert_allclose(base["stall_s_mean"].iloc[0], base["stall_s_mean"].iloc[1])
    assert (base["speedup"] == 1.0).all()
    assert len(first) == 9 and set(first["replay_model"]) == {"per-iteration"}


def test_loader_what_if_is_compared_with_the_measured_run(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "traces", RUN, iterations=30)
    proc = run_dsim(
        "run", RUN, "--model", "pipeline", "--workers", "6", "--prefetch-factor", "4",
        "--executor", "local", "-q", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = tmp_path / "results"
    assert sorted(p.name for p in results.iterdir() if p.is_dir()) == [
        "attribution",  # each run's table (attribution/runs/)
        "dataset",  # docs/SPEC.md §7.5
        f"{RUN}@pipeline",
        f"{RUN}@pipeline-w6-p4",
    ]
    table = _summary(tmp_path)
    what_if = table[table["loader_changed"]]
    measured = table[~table["loader_changed"]]
    assert len(what_if) == len(measured) == 9
    assert set(what_if["loader_workers"]) == {6} and set(what_if["loader_prefetch_factor"]) == {4}
    base = measured[(measured.fetch_align == "actual") & (measured.start_align == "actual")]
    wi = what_if[(what_if.fetch_align == "actual") & (what_if.start_align == "actual")]
    # The speed-up of the loader change alone is against the measured run, not itself.
    expected = base["iteration_s_mean"].iloc[0] / wi["iteration_s_mean"].iloc[0]
    assert wi["speedup"].iloc[0] == pytest.approx(expected)


def test_loader_options_need_the_pipeline_model(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "traces", RUN, iterations=15)
    proc = run_dsim_in_process("run", RUN, "--workers", "4", "--executor", "local", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--workers is a what-if of the pipeline model: add --model pipeline" in proc.stderr
    bad = run_dsim_in_process("run", RUN, "--model", "nope", cwd=tmp_path)
    assert bad.returncode == 2 and "known models: per-iteration, pipeline" in bad.stderr


def test_repeated_or_listed_loader_options_are_refused_not_last_wins(tmp_path: Path) -> None:
    """Issue #19: `--workers 4 --workers 8` kept only 8; a sweep is `dsim tune`'s."""
    write_synthetic(tmp_path / "traces", RUN, iterations=15)
    proc = run_dsim_in_process(
        "run", RUN, "--model", "pipeline", "--workers", "4", "--workers", "8", cwd=tmp_path
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "dsim: error: --workers given 2 times (4, 8): dsim run replays one loader setting; "
        "sweep several with `dsim tune RUN --workers 4,8`"
    )
    assert not (tmp_path / "results").exists()
    from dsim.commands.run import one_loader_value

    assert one_loader_value(["3"], "--workers", 0) == 3 and one_loader_value(None, "-", 0) is None
    for values, why in [(["1-4"], "list or range"), (["2,4"], "list or range"),
                        (["0"], ">= 1"), (["x"], "not an integer")]:  # fmt: skip
        with pytest.raises(UsageError, match=why):
            one_loader_value(values, "--prefetch-factor", 1)


def test_config_keys_and_their_original_names(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "traces", RUN, iterations=15)
    conf = tmp_path / "conf.json"
    conf.write_text(json.dumps({"FILE": RUN, "model": "pipeline", "WORKER_NUM": 2}))
    proc = run_dsim("run", "--conf", str(conf), "--executor", "local", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "results" / f"{RUN}@pipeline-w2-p2" / "result.json").is_file()
    conf.write_text(json.dumps({"FILE": RUN, "workers": 2, "WORKER_NUM": 3}))
    clash = run_dsim_in_process("run", "--conf", str(conf), cwd=tmp_path)
    assert clash.returncode == 2 and "workers and WORKER_NUM disagree" in clash.stderr


def _log_lines(rank: int, settings: str) -> str:
    fetch = (
        "2026-01-01 10:00:{s:02d}.000000 DEBUG:\tGPU: {r} worker_id: {w}, "
        "END FETCH at_time 0.5{r} data idx{i}\n"
    )
    train = (
        "2026-01-01 10:00:{s:02d}.600000 GPU: {r} Epoch: [0][{i}/4]"
        "\tTime 0.9 (0.9)\tData 0.1 (0.1)\n"
    )
    lines = [f"2026-01-01 10:00:00.000000 GPU: {rank} LOADER {settings}\n"]
    for i in range(4):
        lines.append(fetch.format(s=i + 1, r=rank, w=i % 2, i=i))
        lines.append(train.format(s=i + 1, r=rank, i=i))
    return "".join(lines)


def test_loader_lines_reach_run_json_and_the_pipeline_replay(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    settings = "num_workers 2 prefetch_factor 3 batch_size 8 persistent_workers 0 pin_memory 1"
    for rank in (0, 1):
        (logs / f"rank{rank}.log").write_text(_log_lines(rank, settings))
    proc = run_dsim("parse", "logs", "--name", "lr", "--strict", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads((tmp_path / "traces" / "lr" / "run.json").read_text())
    assert info["loader"] == {
        "num_workers": 2, "prefetch_factor": 3, "batch_size": 8,
        "persistent_workers": False, "pin_memory": True, "lines": 2,
    }  # fmt: skip
    assert info["report"]["loader_lines"] == 2 and info["report"]["other_lines"] == 0
    run = run_dsim(
        "run", "lr", "--model", "pipeline", "--warmup", "0", "--executor", "local", "-q",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "results" / "lr@pipeline" / "result.json").read_text())
    assert result["loader"]["measured"] == {"workers": 2, "prefetch_factor": 3, "source": "log"}


def test_bad_and_disagreeing_loader_lines(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    good = "num_workers 2 prefetch_factor 3 batch_size 8 persistent_workers 0 pin_memory 1"
    other = "num_workers 4 prefetch_factor none batch_size none persistent_workers 1 pin_memory 0"
    (logs / "rank0.log").write_text(_log_lines(0, good))
    (logs / "rank1.log").write_text(_log_lines(1, other))
    (logs / "rank2.log").write_text(_log_lines(2, "num_workers two"))
    proc = run_dsim("parse", "logs", "--name", "lb", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads((tmp_path / "traces" / "lb" / "run.json").read_text())
    assert info["loader"]["num_workers"] == 2 and info["loader"]["disagreeing_lines"] == 1
    assert any("1 of 2 loader lines disagree" in w for w in info["report"]["warnings"])
    assert info["report"]["skipped"] == {"malformed loader line": 1}
    rejects = (tmp_path / "traces" / "lb" / "rejects.csv").read_text()
    assert "rank2.log,1," in rejects or "rank2.log" in rejects
