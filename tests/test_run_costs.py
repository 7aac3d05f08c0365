"""Costs removed from ``dsim run`` stay removed (issue #21 item 1), counted, not timed.

A profile of a 20-run ``dsim run`` found three costs that grew with the runs and not with
the replay: one ``DataFrame.to_dict`` per run and answer (pandas converts column by column,
~10 ms a run for a summary's ~65 columns; two answers and their verdicts per ``dsim run``),
``itertuples`` over every column of the attribution table in ``describe`` (one Series per
column), and the dataset's constant key columns made anew for every policy and piece
(``pa.repeat``). Each test counts the calls, so it fails if the per-run cost comes back,
and checks that what is computed is what the old way gave.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from tracegen import write_synthetic

from dsim.analysis.attribution import attribute, attribution_table, describe
from dsim.analysis.summary import add_what_if, summarize_results
from dsim.analysis.verdict import record_groups, run_verdicts
from dsim.app import run as run_module
from dsim.app.run import run_replays
from dsim.config import Overrides, load_config
from dsim.model import dataset
from dsim.model.columns import METRIC_COLUMNS
from dsim.model.dataset import DatasetWriter, metadata
from dsim.model.results import ResultRun, find_result_runs
from dsim.options import parse_conditions
from dsim.render.machine import answer_document
from dsim.replay.arrays import IterationArrays


def _summary(runs: int) -> pd.DataFrame:
    """Rows of ``runs`` runs (three policies each, two results directories for the first),
    interleaved, with columns of several types."""
    rows = []
    for k in range(3):
        for r in range(runs):
            rows.append(
                {
                    "run": f"run{r}",
                    "results": f"results/run{r}" + ("@pipeline" if r == 0 and k == 2 else ""),
                    "fetch_align": ["actual", "min", "avg"][k],
                    "start_align": "actual",
                    "iteration_s_mean": 1.0 + r + k / 10,
                    "stall_s_mean": 0.1 * (3 - k),
                    "effective_delay_pct": 10.0 - k,
                    "selected_epochs": "1",
                    "gpus": 4,
                    "flag": bool(k),
                    "note": None if k else "x",
                }
            )
    return pd.DataFrame(rows)


def _pandas_groups(summary: pd.DataFrame) -> list[list[dict]]:
    keys = [k for k in ("run", "results") if k in summary.columns]
    return [g.to_dict("records") for _, g in summary.groupby(keys, sort=False, dropna=False)]


@pytest.mark.parametrize("runs", [1, 7])
def test_record_groups_are_pandas_groups_records(runs: int) -> None:
    summary = _summary(runs)
    assert record_groups(summary) == _pandas_groups(summary)
    assert record_groups(summary.iloc[:0]) == []


def test_record_groups_with_a_missing_key_are_pandas_groups_records() -> None:
    summary = _summary(3)
    summary.loc[1, "results"] = None
    assert record_groups(summary) == _pandas_groups(summary)


def test_verdicts_convert_the_summary_once_not_once_per_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    to_dict = pd.DataFrame.to_dict

    def counted(self: pd.DataFrame, *args: object, **kwargs: object) -> object:
        calls.append(len(self))
        return to_dict(self, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_dict", counted)
    summary = add_what_if(_summary(12))
    calls.clear()
    record_groups(summary)
    assert calls == [len(summary)]  # one conversion of the whole frame
    calls.clear()
    run_verdicts(summary)
    assert len(calls) == 1


def _arrays(gpus: int, n: int, seed: int) -> IterationArrays:
    rng = np.random.default_rng(seed)
    return IterationArrays(
        epoch=np.zeros(n, np.int32),
        iteration=np.arange(n, dtype=np.int32),
        gpus=np.arange(gpus, dtype=np.int32),
        start=np.zeros((n, gpus)),
        fetch=rng.exponential(0.1, (n, gpus)),
        iteration_time=np.ones((n, gpus)),
        stall=rng.exponential(0.01, (n, gpus)),
        arrival=np.zeros((n, gpus)),
        worker=np.zeros((n, gpus), np.int32),
        origin_ns=0,
    )


def test_describe_iterates_only_the_columns_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """``describe`` lines are the same; ``itertuples`` never walks the table's every column."""
    workers = np.random.default_rng(3).integers(0, 2, (40, 6))
    a = attribute("r", _arrays(6, 40, 3), workers)
    table = attribution_table([a], [("0", 0)])
    before = describe(table)
    widths: list[int] = []
    itertuples = pd.DataFrame.itertuples

    def counted(self: pd.DataFrame, *args: object, **kwargs: object) -> object:
        widths.append(self.shape[1])
        return itertuples(self, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "itertuples", counted)
    assert describe(table) == before
    assert all(width <= 3 for width in widths) and table.shape[1] > 3


def test_dataset_key_blocks_are_made_once_per_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nine policies' rows of one run make each constant block once, not per policy and
    piece; the files are the same bytes as with a block made every time."""
    n, gpus = 3000, 4
    replay = pa.table(
        {
            "epoch": np.zeros(n, np.int64),
            "iteration": np.arange(n, dtype=np.int64),
            "iteration_s": np.full(n, 0.5),
            **{f"stall_s_gpu{g}": np.full(n, 0.01 * g) for g in range(gpus)},
        }
    )
    for m in METRIC_COLUMNS:
        if m not in replay.column_names:
            replay = replay.append_column(m, pa.array(np.linspace(0, 1, n)))
    ident = {
        "run": "r",
        "replay_model": "per-iteration",
        "loader_workers": None,
        "loader_prefetch_factor": None,
        "loader_changed": False,
    }
    policies = [(f, s) for f in ("actual", "avg", "min") for s in ("actual", "avg", "min")]

    def write(out: object) -> list[bytes]:
        writer = DatasetWriter(out, "r", metadata("r", "r", {}))
        for policy in policies:
            writer.add_replay(ident, policy, replay)
        return [p.read_bytes() for p in writer.commit()]

    made: list[tuple[str, object]] = []
    build = dataset._block.__wrapped__

    def counted(kind: pa.DataType, value: object, block: int) -> pa.Array:
        made.append((str(kind), value))
        return build(kind, value, block)

    size = dataset._block.cache_info().maxsize
    monkeypatch.setattr(dataset, "_block", functools.lru_cache(size, typed=True)(counted))
    cached = write(tmp_path / "a")
    # run, model, the loader's nulls, loader_changed and the 3 alignments (fetch and start
    # share them): 7 blocks per block size
    distinct = set(made)
    assert len(distinct) == 7, distinct
    assert len(made) <= 2 * len(distinct)  # iterations' and gpus' block sizes, no more
    assert len(made) < 9 * 2 * 5  # per policy, per table, per key column: what it was
    made.clear()
    uncached = functools.lru_cache(maxsize=0)(counted)  # made every time
    monkeypatch.setattr(dataset, "_block", uncached)
    assert write(tmp_path / "b") == cached
    assert len(made) >= 9 * 2 * 5


def _replayed(root: Path, runs: tuple[str, ...]) -> tuple[Any, Any]:
    config = load_config(
        None,
        Overrides(runs=runs, traces=root / "traces", out=root / "out", executor="local"),
    )
    return run_replays(config), config


def test_dsim_run_builds_its_answer_once_when_the_directory_holds_only_its_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The results directory's answer serves as the run's: ``build_answer`` once, and the
    answer (verdicts, attribution lines, ``--fail-if`` checks, notes, files) the same as
    one built anew."""
    for k, name in enumerate(("first", "second")):
        write_synthetic(tmp_path / "traces", name, gpus=3, iterations=25, seed=5 + k)
    built: list[int] = []
    real = run_module.build_answer

    def counted(summary: pd.DataFrame, *args: Any, **kwargs: Any) -> Any:
        built.append(len(summary))
        return real(summary, *args, **kwargs)

    monkeypatch.setattr(run_module, "build_answer", counted)
    outcome, config = _replayed(tmp_path, ("first", "second"))
    conditions = parse_conditions(["stall_s_mean@actual/actual > 0"])
    once = run_module.outcome_answer(outcome, config, conditions)
    assert len(built) == 1  # the directory's; the outcome's reused it
    anew = run_module.outcome_answer(replace(outcome, directory=None), config, conditions)
    assert len(built) == 2
    assert answer_document(once) == answer_document(anew)
    assert once.checks == anew.checks and len(once.checks) == 2
    assert once.summary is outcome.summary


def test_another_run_in_the_directory_gets_the_run_its_own_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run replayed into a directory that holds another: the directory's answer has more
    rows, so the run's answer is built for its own rows."""
    for k, name in enumerate(("first", "second")):
        write_synthetic(tmp_path / "traces", name, gpus=3, iterations=25, seed=5 + k)
    _replayed(tmp_path, ("first",))
    outcome, config = _replayed(tmp_path, ("second",))
    assert outcome.directory is not None and len(outcome.directory.runs) == 2
    answer = run_module.outcome_answer(outcome, config)
    assert [r.run for r in answer.runs] == ["second"]
    anew = run_module.outcome_answer(replace(outcome, directory=None), config)
    assert answer_document(answer) == answer_document(anew)


def test_a_fresh_run_summarises_its_replays_without_reading_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary rows of the replays ``dsim run`` computed come from the tables it held
    (no ``ResultRun.read``, which for a stub decodes the dataset just written), and are
    the rows ``dsim summarize`` reads from the files."""
    write_synthetic(tmp_path / "traces", "first", gpus=3, iterations=25, seed=5)
    reads: list[object] = []
    real = ResultRun.read

    def counted(self: ResultRun, policy: Any, **kwargs: Any) -> Any:
        reads.append(policy)
        return real(self, policy, **kwargs)

    monkeypatch.setattr(ResultRun, "read", counted)
    outcome, config = _replayed(tmp_path, ("first",))
    assert outcome.computed == 9 and reads == []
    read_back = summarize_results(find_result_runs([config.out / "first"]))
    assert len(reads) == 9
    pd.testing.assert_frame_equal(outcome.summary, read_back)
