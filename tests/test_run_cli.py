"""`dsim run` end to end: the real CLI in a subprocess on a fresh directory.

Config and option errors, one message and an exit code each and found before any
replay, go through the same entry point in-process (conftest's
``run_dsim_in_process``); a missing config stays a subprocess test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_dsim, run_dsim_in_process
from tracegen import ORIGINAL_CONFIG, synthetic_run, write_synthetic

from dsim.model.results import METRIC_COLUMNS, load_replay, read_replay_key

RUN = "synth_run"
DESIGN_COLUMNS = [
    "run",
    "fetch_align",
    "start_align",
    "iterations",
    "iteration_s_mean",
    "iteration_s_std",
    "stall_s_mean",
    "stall_s_std",
    "delay_s_mean",
    "delay_s_std",
    "start_diff_s_mean",
    "start_diff_s_std",
    "fetch_diff_s_mean",
    "fetch_diff_s_std",
    "effective_delay_pct",
]
LABELS = sorted(f"{f}__{s}" for f in ("actual", "avg", "min") for s in ("actual", "avg", "min"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's directory: ./traces/synth_run and the original analysis's config."""
    write_synthetic(tmp_path / "traces", RUN, iterations=30)
    conf = {**ORIGINAL_CONFIG, "FILE": RUN}
    (tmp_path / "sim_conf.json").write_text(json.dumps(conf), encoding="utf-8")
    return tmp_path


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``project`` after `dsim run --conf sim_conf.json` (a subprocess): the first run that
    five tests below began with, the same command on the same inputs, run once for the
    module (never changed: each test edits its own copy, ``ran``)."""
    root = tmp_path_factory.mktemp("replayed")
    write_synthetic(root / "traces", RUN, iterations=30)
    conf = {**ORIGINAL_CONFIG, "FILE": RUN}
    (root / "sim_conf.json").write_text(json.dumps(conf), encoding="utf-8")
    proc = run_dsim("run", "--conf", "sim_conf.json", "--quiet", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture
def ran(replayed: Path, tmp_path: Path) -> Path:
    """A fresh copy of ``replayed``, modification times kept (nothing in it names its
    directory: result.json and the replays' metadata hold content hashes and relative names)."""
    return Path(shutil.copytree(replayed, tmp_path / "project", symlinks=True))


def _mtimes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(directory.glob("*.parquet"))}


def test_run_writes_replays_result_and_summary(project: Path) -> None:
    proc = run_dsim("run", "--conf", "sim_conf.json", cwd=project)
    assert proc.returncode == 0, proc.stderr
    out = project / "results"
    assert sorted(p.stem for p in (out / RUN).glob("*.parquet")) == LABELS
    assert not list(out.rglob("*.tmp"))  # atomic writes leave no temporaries

    summary = pq.read_table(out / "summary.parquet").to_pandas()
    assert set(DESIGN_COLUMNS) <= set(summary.columns)
    assert sorted(summary["fetch_align"] + "__" + summary["start_align"]) == LABELS
    assert (summary["iterations"] == 30 - 11).all()  # default: epoch 1 only, iterations > 10
    csv = (out / "summary.csv").read_text(encoding="utf-8").splitlines()
    assert csv[0].split(",")[: len(DESIGN_COLUMNS)] == list(summary.columns[: len(DESIGN_COLUMNS)])
    assert len(csv) == 1 + 9

    info = json.loads((out / RUN / "result.json").read_text(encoding="utf-8"))
    assert info["run"] == RUN
    assert info["trace"]["name"] == RUN and info["trace"]["epochs"] == [0, 1]
    assert info["summary"] == {"epochs": [1], "warmup": 10, "threshold_s": 0.03}
    assert info["params"] == {"stall_floor_s": 0.000002, "stall_grow_min_s": 0.01}
    assert info["dropped"] == {}

    assert "actual/actual" in proc.stdout and "min/min" in proc.stdout
    assert "9 replays computed on local" in proc.stderr


def test_measured_run_is_reproduced(ran: Path) -> None:
    """actual/actual replays the trace: max iteration time and stall over GPUs, per iteration."""
    project = ran
    table, _ = load_replay(project / "results" / RUN / "actual__actual.parquet", remedy="")
    train = synthetic_run(RUN, iterations=30).train.to_pandas()
    expected = train.groupby(["epoch", "iteration"]).agg(
        iteration_s=("iteration_s", "max"), stall_s=("stall_s", "max")
    )
    assert table.column("epoch").to_pylist() == [e for e, _ in expected.index]
    assert np.array_equal(table.column("iteration_s").to_numpy(), expected["iteration_s"])
    assert np.array_equal(table.column("stall_s").to_numpy(), expected["stall_s"])
    assert set(METRIC_COLUMNS) <= set(table.column_names)
    assert [c for c in table.column_names if c.startswith("stall_s_gpu")] == [
        f"stall_s_gpu{g}" for g in range(4)
    ]


def test_second_run_reuses_results_force_recomputes(ran: Path) -> None:
    project = ran
    replays = project / "results" / RUN
    first = _mtimes(replays)

    again = run_dsim("run", "--conf", "sim_conf.json", cwd=project)
    assert again.returncode == 0, again.stderr
    assert "0 replays computed, 9 reused" in again.stderr
    assert _mtimes(replays) == first

    (replays / "avg__min.parquet").unlink()
    resumed = run_dsim("run", "--conf", "sim_conf.json", cwd=project)
    assert "1 replay computed on local, 8 reused" in resumed.stderr
    now = _mtimes(replays)
    assert {k: v for k, v in now.items() if k != "avg__min.parquet"} == {
        k: v for k, v in first.items() if k != "avg__min.parquet"
    }
    assert "avg__min.parquet" in now

    forced = run_dsim("run", "--conf", "sim_conf.json", "--force", cwd=project)
    assert "9 replays computed" in forced.stderr
    assert all(now[k] != v for k, v in _mtimes(replays).items())


def test_changed_trace_or_params_invalidate_the_cache(ran: Path) -> None:
    project = ran
    key_path = project / "results" / RUN / "min__min.parquet"
    key = read_replay_key(key_path)
    write_synthetic(project / "traces", RUN, iterations=30, seed=9)
    proc = run_dsim("run", "--conf", "sim_conf.json", cwd=project)
    assert "9 replays computed" in proc.stderr
    assert read_replay_key(key_path) != key

    conf = json.loads((project / "sim_conf.json").read_text(encoding="utf-8"))
    conf["stall_grow_min_s"] = 0.5
    (project / "sim_conf.json").write_text(json.dumps(conf), encoding="utf-8")
    proc = run_dsim("run", "--conf", "sim_conf.json", cwd=project)
    assert "9 replays computed" in proc.stderr


def test_a_models_revision_enters_its_keys_and_the_original_analysis_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dsim whose pipeline model predicts differently computes its replays again (their
    keys carry the model's revision, SPEC §7.2); the per-iteration model's numbers never
    change, and its keys are those earlier versions wrote (pinned: none recomputed)."""
    from dsim.execute.cache import replay_key
    from dsim.replay.models import get_model
    from dsim.replay.params import ReplayParams

    trace = {
        "fetch.parquet": {"bytes": 10, "sha256": "ab"},
        "train.parquet": {"bytes": 20, "sha256": "cd"},
    }
    pipeline, original = get_model("pipeline"), get_model("per-iteration")
    before = replay_key(trace, pipeline, ReplayParams(), ("min", "min"))
    monkeypatch.setattr(type(pipeline), "revision", "2099-01-01")
    assert replay_key(trace, pipeline, ReplayParams(), ("min", "min")) != before
    assert original.revision is None
    assert replay_key(trace, original, ReplayParams(), ("min", "min")) == (
        "303215bc9c945f76cdbe8f7cff6cd9f86b35e384562f8d2beb103d1d9a1e8c55"
    )


def test_summary_options_do_not_recompute(ran: Path) -> None:
    project = ran
    proc = run_dsim(
        "run", "--conf", "sim_conf.json", "--epochs", "all", "--warmup", "0", "--threshold",
        "0.5", cwd=project,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "0 replays computed, 9 reused" in proc.stderr
    summary = pq.read_table(project / "results" / "summary.parquet").to_pandas()
    assert (summary["iterations"] == 2 * 29).all()
    assert (summary["threshold_s"] == 0.5).all()


def test_subset_of_policies_still_replays_baseline(project: Path) -> None:
    conf = {"FILE": RUN, "FETCH_ALIGN": ["min"], "START_ALIGN": ["min"], "out": "res"}
    (project / "small.json").write_text(json.dumps(conf), encoding="utf-8")
    proc = run_dsim("run", "--conf", "small.json", "--quiet", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
    assert sorted(p.stem for p in (project / "res" / RUN).glob("*.parquet")) == [
        "actual__actual",
        "min__min",
    ]
    summary = pq.read_table(project / "res" / "summary.parquet").to_pandas()
    assert len(summary) == 2
    assert summary["speedup"].notna().all()


def test_runs_named_on_the_command_line(project: Path) -> None:
    proc = run_dsim("run", RUN, "--out", "cli_out", "--epochs", "0", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert len(list((project / "cli_out" / RUN).glob("*.parquet"))) == 9


@pytest.mark.parametrize(
    ("conf", "needle"),
    [
        ({"FILE": RUN, "FETCH_ALIGN": ["fastest"]}, "unknown policy 'fastest'"),
        ({"FILE": "nope"}, f"run(s) not found: nope; available in traces: {RUN}"),
        ({"FILE": RUN, "epochs": [4]}, "epoch(s) 4 not in run synth_run; available epochs: 0, 1"),
        ({"FILE": RUN, "PREFETCH": 2}, "unknown key 'PREFETCH'"),
        ({"IOFILE": "x"}, "FILE is missing"),
    ],
)
def test_bad_config_exits_2_and_writes_nothing(project: Path, conf: dict, needle: str) -> None:
    (project / "bad.json").write_text(json.dumps(conf), encoding="utf-8")
    proc = run_dsim_in_process("run", "--conf", "bad.json", cwd=project)
    assert proc.returncode == 2
    assert proc.stderr.startswith("dsim: error: invalid config")
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert not (project / "results").exists()


def test_bad_options_exit_2(project: Path) -> None:
    proc = run_dsim_in_process("run", "--conf", "sim_conf.json", "--epochs", "x", cwd=project)
    assert proc.returncode == 2 and "--epochs" in proc.stderr
    proc = run_dsim("run", "--conf", "missing.json", cwd=project)
    assert proc.returncode == 2 and "config file not found" in proc.stderr
    proc = run_dsim_in_process("run", cwd=project)
    assert proc.returncode == 2 and "nothing to run" in proc.stderr
    # ... naming the run there is to type (it said only "give --conf or run names")
    assert proc.stderr.strip().endswith(f"traces holds one parsed run: dsim run {RUN}")
    write_synthetic(project / "more", "b", iterations=30)
    write_synthetic(project / "more", "a", iterations=30)
    proc = run_dsim_in_process("run", "--traces", "more", cwd=project)
    assert proc.returncode == 2 and proc.stderr.strip().endswith(
        "more holds 2 parsed runs (a, b): dsim run --traces more '*' takes them all"
    )
    assert not (project / "results").exists()


# Ray against in-process through the CLI, all 9 policies byte for byte (summary included):
# tests/test_runtask.py::test_ray_tasks_write_the_same_bytes_as_in_process.


def test_incomplete_iterations_are_dropped_and_reported(tmp_path: Path) -> None:
    """An iteration that one GPU has no fetch record for is not replayed, and the user is told."""
    from dsim.model.tables import write_run

    run = synthetic_run("holey", gpus=2, epochs=2, iterations=20)
    fetch = run.fetch.to_pandas()
    missing = (fetch.epoch == 1) & (fetch.iteration == 15) & (fetch.gpu == 1)
    run.fetch = run.fetch.filter(np.asarray(~missing))
    write_run(run, tmp_path / "traces" / "holey")
    proc = run_dsim("run", "holey", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "holey: 1 incomplete iteration not replayed (missing fetch record: 1)" in proc.stderr
    info = json.loads((tmp_path / "results" / "holey" / "result.json").read_text())
    assert info["dropped"] == {"missing fetch record": 1} and info["iterations"] == 39
    table, _ = load_replay(tmp_path / "results" / "holey" / "actual__actual.parquet", remedy="")
    rows = set(zip(table["epoch"].to_pylist(), table["iteration"].to_pylist(), strict=True))
    assert (1, 15) not in rows and len(rows) == 39


def test_empty_selection_fails_before_touching_results(ran: Path) -> None:
    """A warm-up that leaves no iteration is refused before any file changes."""
    project = ran
    result_json = project / "results" / RUN / "result.json"
    before = result_json.read_bytes()
    proc = run_dsim("run", "--conf", "sim_conf.json", "--warmup", "1000", "--force", cwd=project)
    assert proc.returncode == 2
    assert "no iterations selected" in proc.stderr and "Traceback" not in proc.stderr
    assert result_json.read_bytes() == before
    assert run_dsim("summarize", "results", "--quiet", cwd=project).returncode == 0


def test_a_large_runs_headline_says_it_is_being_worked_out() -> None:
    """After the replay's bar is gone, the headline replays every policy again (~11 s per
    10^6 GPU-iterations on a trace with CPU times, BENCHMARKS.md): a large run gets a
    transient status line on the terminal, a small one nothing, and off a terminal rich
    draws nothing."""
    import io

    import pandas as pd
    from rich.console import Console

    from dsim.commands.run import PROGRESS_MIN_ROWS, _headline_status

    def status(iterations: int, terminal: bool = True) -> str:
        out = io.StringIO()
        console = Console(file=out, force_terminal=terminal, width=100)
        summary = pd.DataFrame(
            {"results": ["a", "a", "b"], "iterations": [iterations] * 3, "gpus": [4, 4, 4]}
        )
        with _headline_status(console, summary):
            pass
        return out.getvalue()

    edge = PROGRESS_MIN_ROWS // 8  # two results of 4 GPUs: the count the status compares
    assert "working out the headline" in status(edge)
    assert status(edge - 1) == ""
    assert status(edge, terminal=False) == ""
    empty = _headline_status(Console(file=io.StringIO()), pd.DataFrame())
    with empty:
        pass
