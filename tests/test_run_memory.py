"""`dsim run`'s memory (issue 21 item 5): the same numbers and bytes from less memory.

Each test pins one change: the dataset's per-GPU rows built one row group at a
time (and the file bytes of one whole write), the iteration arrays scattered
straight into column-major matrices (the values of a plain reference pivot),
chunk outputs joined in place and taken by the replay table without a copy, and
a plan that keeps only what attribution reads of the run's tables.
"""

from __future__ import annotations

import math
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tracegen import write_synthetic

from dsim.analysis.attribution import attribution_table
from dsim.app.attribution import run_attribution
from dsim.app.runplan import plan_runs_of
from dsim.config import Overrides, load_config
from dsim.execute.units import ChunkJoin, join_chunks
from dsim.model import dataset
from dsim.model.columns import METRIC_COLUMNS
from dsim.model.results import replay_table
from dsim.model.tables import FETCH_SCHEMA, TRAIN_SCHEMA, read_run
from dsim.replay.arrays import build_iteration_arrays

POLICY = ("min", "min")
IDENT = {
    "run": "a_run_with_a_long_name_like_real_ones",
    "replay_model": "per-iteration",
    "loader_workers": None,
    "loader_prefetch_factor": None,
    "loader_changed": False,
}


def _replay(n: int, g: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    epoch = np.repeat(np.arange(2, dtype=np.int32), -(-n // 2))[:n]
    iteration = np.arange(n, dtype=np.int32)
    metrics = {m: rng.random(n) for m in METRIC_COLUMNS}
    stall = np.asfortranarray(rng.random((n, g)))
    gpus = np.array([0, 2, 3, 7, 9, 11, 12, 15][:g], np.int32)
    return replay_table(epoch, iteration, metrics, gpus, stall, run="r", policy=POLICY, key="k")


def _write(out: Path, add) -> list[bytes]:
    meta = dataset.metadata(IDENT["run"], "d", {"min__min": "k"})
    writer = dataset.DatasetWriter(out, "d", meta)
    add(writer)
    return [p.read_bytes() for p in writer.commit()]


def _whole_constant(field: pa.Field, value, n: int) -> pa.Array:
    """A constant column as the previous version built it: one array of ``n`` values."""
    return pa.nulls(n, field.type) if value is None else pa.repeat(pa.scalar(value, field.type), n)


def _old_gpus_table(replay: pa.Table) -> pa.Table:
    """The gpus rows as the previous version built them: whole, by repeat and tile."""
    n = replay.num_rows
    columns = [c for c in replay.column_names if c.startswith("stall_s_gpu")]
    gpus = np.array([int(c.removeprefix("stall_s_gpu")) for c in columns], np.int32)
    g = len(gpus)
    const = {**IDENT, "fetch_align": POLICY[0], "start_align": POLICY[1]}
    fields = dataset.GPUS_SCHEMA
    return pa.table(
        {
            **{f.name: _whole_constant(f, const[f.name], n * g) for f in list(fields)[:7]},
            "epoch": np.repeat(replay.column("epoch").to_numpy(), g),
            "iteration": np.repeat(replay.column("iteration").to_numpy(), g),
            "gpu": np.tile(gpus, n),
            "stall_s": np.column_stack([replay.column(c).to_numpy() for c in columns]).reshape(-1),
        },
        schema=fields,
    )


@pytest.mark.parametrize("rows", [7, 64, 1000])
def test_gpu_rows_in_pieces_are_the_rows_and_bytes_of_one_whole_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    """Pieces of any size (7 cuts inside iterations of 3 GPUs) are the previous version's
    rows, and each piece is one row group: the file is byte for byte one whole write."""
    monkeypatch.setattr(dataset, "ROW_GROUP_ROWS", rows)
    replay = _replay(50, 3)
    pieces = list(dataset.gpu_pieces(IDENT, POLICY, replay, rows))
    assert len(pieces) == math.ceil(150 / rows) and max(p.num_rows for p in pieces) <= rows
    assert pa.concat_tables(pieces).equals(_old_gpus_table(replay))
    whole = _write(tmp_path / "whole", lambda w: w.add(*dataset.long_tables(IDENT, POLICY, replay)))
    piecewise = _write(tmp_path / "pieces", lambda w: w.add_replay(IDENT, POLICY, replay))
    assert piecewise == whole
    path = dataset.dataset_path(tmp_path / "pieces", dataset.GPUS, "d")
    assert pq.ParquetFile(path).metadata.num_row_groups == math.ceil(150 / rows)


def test_default_pieces_write_the_bytes_of_one_whole_write_per_policy(tmp_path: Path) -> None:
    """At the default size a dataset file is what one ``write_table`` call per policy of
    the previous version's whole rows writes (no row group size given)."""
    replays = [_replay(40, 4, seed=1), _replay(40, 4, seed=2)]
    new = _write(tmp_path / "new", lambda w: [w.add_replay(IDENT, POLICY, r) for r in replays])
    meta = dataset.metadata(IDENT["run"], "d", {"min__min": "k"})
    path = tmp_path / "old.parquet"
    encoded = dataset._ENCODED[dataset.GPUS_SCHEMA]
    old = dataset.file_writer(path, dataset.GPUS_SCHEMA, meta, distinct=False)
    for r in replays:
        old.write_table(_old_gpus_table(r).cast(encoded))
    old.close()
    assert new[1] == path.read_bytes()


def test_gpu_rows_are_built_one_row_group_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built whole, the long rows' NumPy columns alone were 20 bytes a row (the strings,
    in Arrow's memory, several times more); in pieces the peak is one piece's."""
    monkeypatch.setattr(dataset, "ROW_GROUP_ROWS", 4096)
    replay = _replay(25_000, 8)  # 200,000 rows
    meta = dataset.metadata(IDENT["run"], "d", {"min__min": "k"})
    writer = dataset.DatasetWriter(tmp_path, "d", meta)
    tracemalloc.start()
    try:
        writer.add_replay(IDENT, POLICY, replay)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    writer.commit()
    assert peak < 200_000 * 20 / 4, peak


def _tables(n: int, g: int, seed: int, holes: bool, cpu: bool) -> tuple[pa.Table, pa.Table]:
    """Shuffled fetch and train rows of 2 epochs, some cells missing (``holes``)."""
    rng = np.random.default_rng(seed)
    e, i, k = np.meshgrid(np.arange(2), np.arange(n), np.array([0, 3, 4, 9][:g]), indexing="ij")
    e, i, k = e.ravel(), i.ravel(), k.ravel()
    start = 1_630_000_000 * 10**9 + rng.integers(0, 10**13, e.size)

    def table(schema: pa.Schema, keep: np.ndarray, values: dict) -> pa.Table:
        order = rng.permutation(np.flatnonzero(keep))
        columns = {"epoch": e, "iteration": i, "gpu": k, **values}
        if cpu:
            columns["cpu_s"] = rng.random(e.size)
            schema = schema.append(pa.field("cpu_s", pa.float64()))
        return pa.table({c: pa.array(np.asarray(v)[order]) for c, v in columns.items()}).cast(
            schema
        )

    keep_f = rng.random(e.size) > (0.05 if holes else 0)
    keep_t = rng.random(e.size) > (0.05 if holes else 0)
    fetch = table(
        FETCH_SCHEMA,
        keep_f,
        {
            "worker": rng.integers(0, 4, e.size),
            "start": start,
            "end": start + 5,
            "fetch_s": rng.random(e.size),
        },
    )
    train = table(
        TRAIN_SCHEMA,
        keep_t,
        {
            "start": start + rng.integers(0, 10**9, e.size),
            "iteration_s": rng.random(e.size),
            "stall_s": rng.random(e.size),
            "throughput": np.full(e.size, np.nan),
        },
    )
    return fetch, train


def _reference(fetch: pa.Table, train: pa.Table, require_fetch: bool) -> dict:
    """The pivot written out cell by cell in plain Python."""

    def rows(table: pa.Table) -> dict:
        ints = table.set_column(
            table.column_names.index("start"), "start", table["start"].cast(pa.int64())
        )
        return {(r["epoch"], r["iteration"], r["gpu"]): r for r in ints.to_pylist()}

    f, t = rows(fetch), rows(train)
    keys = sorted({x[:2] for x in f} | {x[:2] for x in t})
    gpus = sorted({x[2] for x in f} | {x[2] for x in t})
    kept = [
        k
        for k in keys
        if all((*k, g) in t for g in gpus)
        and (not require_fetch or all((*k, g) in f for g in gpus))
    ]
    if f:
        origin = min(r["start"] for r in f.values())
    else:
        origin = min(r["start"] for r in t.values()) if t and not require_fetch else 0
    nan = float("nan")

    def grid(rows: dict, get, missing) -> np.ndarray:
        return np.array(
            [[get(rows[(*k, g)]) if (*k, g) in rows else missing for g in gpus] for k in kept]
        )

    out = {
        "start": grid(f, lambda r: (r["start"] - origin) / 1e9, nan),
        "fetch": grid(f, lambda r: r["fetch_s"], nan),
        "worker": grid(f, lambda r: r["worker"], -1),
        "iteration_time": grid(t, lambda r: r["iteration_s"], nan),
        "stall": grid(t, lambda r: r["stall_s"], nan),
        "arrival": grid(t, lambda r: (r["start"] - origin) / 1e9, nan),
    }
    if "cpu_s" in fetch.column_names:
        out["fetch_cpu"] = grid(f, lambda r: r["cpu_s"], nan)
        out["train_cpu"] = grid(t, lambda r: r["cpu_s"], nan)
    return {"keys": kept, "gpus": gpus, "origin": origin, **out}


@pytest.mark.parametrize(
    ("holes", "require_fetch", "cpu"),
    [(False, True, False), (True, True, True), (True, False, False), (False, False, True)],
)
def test_arrays_are_the_plain_pivot_in_column_major_order(
    holes: bool, require_fetch: bool, cpu: bool
) -> None:
    fetch, train = _tables(60, 4, seed=7, holes=holes, cpu=cpu)
    arrays = build_iteration_arrays(fetch, train, require_fetch=require_fetch)
    ref = _reference(fetch, train, require_fetch)
    assert list(zip(arrays.epoch.tolist(), arrays.iteration.tolist(), strict=True)) == ref["keys"]
    assert arrays.gpus.tolist() == ref["gpus"] and arrays.origin_ns == ref["origin"]
    names = ["start", "fetch", "worker", "iteration_time", "stall", "arrival"]
    names += ["fetch_cpu", "train_cpu"] if cpu else []
    for name in names:
        got = getattr(arrays, name)
        assert got.flags.f_contiguous, name
        np.testing.assert_array_equal(got, ref[name].reshape(got.shape), err_msg=name)
    assert arrays.worker.dtype == np.int32 and arrays.start.dtype == np.float64


def test_arrays_are_built_without_full_grid_copies() -> None:
    """The build's own allocations (NumPy; the tables are Arrow's): about 70 bytes per
    GPU-iteration at its peak, of which 44 are the result; the previous build made a
    row-major grid of every iteration, its kept rows and a column-major copy of each."""
    fetch, train = _tables(12_500, 8 // 2, seed=3, holes=False, cpu=False)
    cells = 2 * 12_500 * 4
    tracemalloc.start()
    try:
        arrays = build_iteration_arrays(fetch, train)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert arrays.n_iterations * arrays.n_gpus == cells
    assert peak / cells < 90, peak / cells


def test_chunks_join_in_place_and_the_replay_table_takes_columns_without_copy() -> None:
    rng = np.random.default_rng(0)
    whole = (
        {m: rng.random(10) for m in METRIC_COLUMNS},
        np.asfortranarray(rng.random((10, 3))),
    )
    parts = [
        ({m: v[lo:hi] for m, v in whole[0].items()}, whole[1][lo:hi])
        for lo, hi in ((0, 4), (4, 10))
    ]
    joined = join_chunks("r", POLICY, parts)
    np.testing.assert_array_equal(joined.gpu_stall, whole[1])
    for m in METRIC_COLUMNS:
        np.testing.assert_array_equal(joined.metrics[m], whole[0][m])
    assert joined.gpu_stall.flags.f_contiguous
    one = ChunkJoin(10)
    one.add(whole)
    assert one.result("r", POLICY).gpu_stall is whole[1]  # one chunk: adopted, not copied
    with pytest.raises(ValueError, match="cover 4 of 10"):
        partial = ChunkJoin(10)
        partial.add(parts[0])
        partial.result("r", POLICY)
    table = replay_table(
        np.zeros(10, np.int32), np.arange(10, dtype=np.int32), joined.metrics,
        np.arange(3, dtype=np.int32), joined.gpu_stall, run="r", policy=POLICY, key="k",
    )  # fmt: skip
    column = table.column("stall_s_gpu1").chunk(0).to_numpy()
    assert np.shares_memory(column, joined.gpu_stall)


def test_a_plan_keeps_only_what_attribution_reads(tmp_path: Path) -> None:
    """The plans hold one fetch column (its row count) and no train table, and attribute
    the run as the whole tables do (the worker of each cell from the arrays)."""
    run_dir = write_synthetic(tmp_path / "traces", "r1", iterations=30)
    config = load_config(
        None, Overrides(runs=("r1",), traces=tmp_path / "traces", out=tmp_path / "out")
    )
    [plan] = plan_runs_of("r1", run_dir, config, read_run(run_dir))
    assert plan.tables is not None and plan.tables.train.num_rows == 0
    assert plan.tables.fetch.column_names == ["gpu"]  # no fetch stages in these logs
    assert plan.tables.fetch.num_rows == read_run(run_dir).fetch.num_rows
    whole = read_run(run_dir)
    epochs = sorted(set(plan.arrays.epoch.tolist()))
    selection = [(",".join(map(str, epochs)), 2)]
    slim = run_attribution("r1", plan.tables, epochs, 2, plan.arrays)
    assert attribution_table([slim], selection).equals(
        attribution_table([run_attribution("r1", whole, epochs, 2)], selection)
    )


def test_arrows_freed_memory_is_handed_back_once_the_tables_are_let_go_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arrow's pool keeps freed table memory, which NumPy's arrays made next cannot use:
    ``dsim run`` (after planning) and the pipeline model's callers (after building the
    arrays) hand it back when the tables are gone, not while they are still held."""
    from dsim.app import run as app_run
    from dsim.app import tune
    from dsim.io import memory

    run_dir = write_synthetic(tmp_path / "traces", "r1", iterations=400)
    whole = read_run(run_dir)
    size = whole.fetch.nbytes + whole.train.nbytes
    del whole
    overrides = Overrides(
        runs=("r1",), traces=tmp_path / "traces", out=tmp_path / "out", executor="local"
    )
    calls = {
        tune: lambda: tune.fetch_arrays(run_dir, "r1"),
        app_run: lambda: app_run.run_replays(load_config(None, overrides)),
    }
    for module, call in calls.items():
        held: list[int] = []
        before = pa.total_allocated_bytes()

        def spy(held: list[int] = held, before: int = before) -> None:
            # Arrow's reader threads can hold a decoded buffer a moment longer (seen once
            # in a few calls: 150 KB, gone by the next call): what dsim holds stays held
            deadline = time.monotonic() + 2.0
            while pa.total_allocated_bytes() - before >= size / 4:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            held.append(pa.total_allocated_bytes())

        monkeypatch.setattr(module, "release_freed", spy)
        if module is tune:  # a run this small skips the release (malloc_trim's cost) ...
            call()
            assert held == []
            # ... which a larger run makes, as this one does with a lower bar
            monkeypatch.setattr(memory, "RELEASE_MIN_GPU_ITERATIONS", 0)
            before = pa.total_allocated_bytes()
            monkeypatch.setattr(module, "release_freed", lambda h=held, b=before: spy(h, b))
        call()
        assert len(held) == 1 and held[0] - before < size / 4, (module.__name__, held, size)
