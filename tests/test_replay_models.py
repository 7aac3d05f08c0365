"""The seams of the replay layer: models and policies behind registries, chunking by cut points."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_dsim, run_dsim_in_process
from tracegen import ORIGINAL_CONFIG, write_synthetic

from dsim.errors import UsageError
from dsim.execute import Job, PolicyResult, execute
from dsim.execute.units import chunk_bounds
from dsim.replay import models
from dsim.replay.arrays import IterationArrays
from dsim.replay.models import DEFAULT_MODEL, MODELS, get_model
from dsim.replay.models.per_iteration import (
    PerIterationModel,
    prepare,
    prepare_columns,
    replay_prepared,
)
from dsim.replay.params import ReplayParams
from dsim.replay.policies import (
    DEFAULT,
    KNOWN,
    REGISTRY,
    STALL_ALIGNMENTS,
    START_KNOWN,
    Alignment,
    normalize_policy,
    policy_pairs,
)

RUN = "synth_run"


def test_default_model_is_per_iteration_and_unknown_names_list_the_known() -> None:
    assert DEFAULT_MODEL == "per-iteration"
    assert isinstance(get_model(DEFAULT_MODEL), PerIterationModel)
    with pytest.raises(UsageError, match="known models: per-iteration, pipeline"):
        get_model("median")


def test_chunk_bounds_split_only_at_the_models_cut_points() -> None:
    assert chunk_bounds(10, 3, cuts=(5,)) == [(0, 5), (5, 10)]
    assert chunk_bounds(10, 3, cuts=(2, 4, 6, 8)) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_bounds(10, 3, cuts=()) == [(0, 10)]
    assert chunk_bounds(0, 3, cuts=()) == [(0, 0)]


def _arrays(n: int, g: int) -> IterationArrays:
    rng = np.random.default_rng(3)
    stall = rng.uniform(0, 0.05, (n, g))
    return IterationArrays(
        epoch=np.repeat(np.array([1, 2], dtype=np.int32), n // 2),
        iteration=np.tile(np.arange(n // 2, dtype=np.int32), 2),
        gpus=np.arange(g, dtype=np.int32),
        start=rng.uniform(0, 1, (n, g)),
        fetch=rng.uniform(0.1, 0.2, (n, g)),
        iteration_time=stall + 0.9,
        stall=stall,
        arrival=np.zeros((n, g)),
        worker=np.zeros((n, g), dtype=np.int32),
        origin_ns=0,
    )


class _CutAtEpochs(PerIterationModel):
    """The per-iteration kernel, but only cut where the epoch changes (a stand-in)."""

    name = "test-epochs"

    def cut_points(self, arrays):
        return np.flatnonzero(np.diff(arrays.epoch)) + 1


def test_execution_chunks_where_the_model_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = _arrays(40, 3)
    model = _CutAtEpochs()
    monkeypatch.setitem(models.MODELS, model.name, model)
    seen: list[tuple[int, int]] = []
    import dsim.execute.units as units

    real = units.replay_rows

    def spy(name, prep, policy, params, lo, hi):
        seen.append((lo, hi))
        return real(name, prep, policy, params, lo, hi)

    monkeypatch.setattr("dsim.execute.local.replay_rows", spy)
    cuts = tuple(int(c) for c in model.cut_points(arrays))
    job = Job("r", model.prepare(arrays, ReplayParams()), (("avg", "min"),), model.name, cuts)
    results: list[PolicyResult] = []
    execute([job], ReplayParams(), executor="local", chunk_rows=7, on_result=results.append)
    assert seen == [(0, 20), (20, 40)]
    whole = replay_prepared(prepare(arrays), ("avg", "min"))
    assert np.array_equal(results[0].metrics["stall_s"], whole.stall_s)


def test_known_policies_are_separate_from_the_default_set(monkeypatch) -> None:
    """A registered policy is accepted by name, and no default set grows with it."""
    assert DEFAULT == ("actual", "avg", "min")
    assert set(DEFAULT) <= set(KNOWN)
    assert set(START_KNOWN) == set(REGISTRY) - set(STALL_ALIGNMENTS) == {*KNOWN, "max"}
    assert "max" not in DEFAULT  # known, asked for by name only
    monkeypatch.setitem(REGISTRY, "test-extra", Alignment("test-extra", "x", np.min, np.min))
    assert normalize_policy("TEST-EXTRA") == "test-extra"
    assert DEFAULT == ("actual", "avg", "min")


def test_max_aligns_starts_only() -> None:
    """A barrier on fetch durations means nothing: ``max`` on the fetch side is refused."""
    from dsim.options import parse_policy_option

    assert parse_policy_option("avg/max") == ("avg", "max")
    with pytest.raises(UsageError, match="max aligns fetch starts only"):
        parse_policy_option("max/actual")
    with pytest.raises(UsageError, match="max aligns fetch starts only"):
        policy_pairs(["max"], [False])
    assert policy_pairs([False], ["max"]) == [("actual", "max")]
    start = np.array([[0.0, 0.1], [0.2, 0.25]])
    prep = prepare_columns(
        start, np.full((2, 2), 0.05), np.full((2, 2), 0.2), np.full((2, 2), 0.02)
    )
    with pytest.raises(ValueError, match="starts only"):
        replay_prepared(prep, ("max", "actual"))
    # The per-iteration model sets every start to the last one's, as §3 does with min and avg:
    # GPU 0 of row 0 now ends its fetch 0.1 s later: its stall (above 10 ms) grows by 0.1 s.
    out = replay_prepared(prep, ("actual", "max"))
    np.testing.assert_allclose(out.gpu_stall_s[0], [0.12, 0.02])
    np.testing.assert_allclose(out.start_diff_s, [0.0, 0.0])


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_synthetic(tmp_path / "traces", RUN, iterations=20)
    conf = {**ORIGINAL_CONFIG, "FILE": RUN}
    (tmp_path / "sim_conf.json").write_text(json.dumps(conf), encoding="utf-8")
    return tmp_path


def test_model_name_is_recorded_and_unknown_models_are_usage_errors(project: Path) -> None:
    # the usage errors in-process (conftest's run_dsim_in_process): one message each
    bad = run_dsim_in_process("run", "--conf", "sim_conf.json", "--model", "median", cwd=project)
    assert bad.returncode == 2, bad.stderr
    assert "unknown replay model 'median'; known models: per-iteration, pipeline" in bad.stderr
    conf = json.loads((project / "sim_conf.json").read_text())
    (project / "bad.json").write_text(json.dumps({**conf, "model": "nope"}), encoding="utf-8")
    bad = run_dsim_in_process("run", "--conf", "bad.json", cwd=project)
    assert bad.returncode == 2 and "unknown replay model 'nope'" in bad.stderr

    done = run_dsim("run", "--conf", "sim_conf.json", "--model", "per-iteration", "-q", cwd=project)
    assert done.returncode == 0, done.stderr
    info = json.loads((project / "results" / RUN / "result.json").read_text())
    assert info["model"] == "per-iteration"
    meta = pq.read_schema(project / "results" / RUN / "avg__min.parquet").metadata
    assert json.loads(meta[b"dsim"])["model"] == "per-iteration"


def test_run_policy_and_run_options_select_pairs_and_runs(project: Path) -> None:
    done = run_dsim("run", "-r", "synth*", "-p", "avg/min", "-p", "min__min", "-q", cwd=project)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in (project / "results" / RUN).glob("*.parquet"))
    assert names == ["actual__actual.parquet", "avg__min.parquet", "min__min.parquet"]
    assert set(MODELS) == {"per-iteration", "pipeline", "stall-only"}


def test_arrays_carry_arrival_and_worker_for_models_that_need_them() -> None:
    """``arrival`` is train ``start`` relative to the fetch-start origin; ``worker`` the fetcher."""
    from tracegen import synthetic_run

    from dsim.replay.arrays import build_iteration_arrays

    tables = synthetic_run(gpus=2, epochs=1, iterations=5)
    arrays = build_iteration_arrays(tables.fetch, tables.train)
    train_ns = tables.train["start"].cast("int64").to_numpy().reshape(5, 2)
    assert np.array_equal(arrays.arrival, (train_ns - arrays.origin_ns) / 1e9)
    assert arrays.worker.tolist() == [[i % 3] * 2 for i in range(5)]
