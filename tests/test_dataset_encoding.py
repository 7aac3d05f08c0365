"""How the tidy dataset's files are encoded (docs/SPEC.md §7.6; issue 21 item 1).

The constant key columns (run, model, loader, policy) reach the Parquet writer as
one-value dictionary arrays and only the columns a reader selects by carry
statistics; the files record the plain schema. These tests pin that every reader
gets what the previous encoding gave (pyarrow, pandas, dsim's own policy reader),
and that files of the previous encoding still read.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsim.io import parquetio
from dsim.model import dataset, datasetfiles
from dsim.model.columns import METRIC_COLUMNS
from dsim.model.results import replay_table

IDENTS = [
    {
        "run": "a_run_with_a_long_name_like_real_ones",
        "replay_model": "pipeline",
        "loader_workers": 4,
        "loader_prefetch_factor": 2,
        "loader_changed": True,
    },
    {
        "run": "r",
        "replay_model": "per-iteration",
        "loader_workers": None,
        "loader_prefetch_factor": None,
        "loader_changed": False,
    },
]
POLICIES = [("actual", "actual"), ("min", "avg"), ("avg", "max")]


def _replay(n: int, g: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return replay_table(
        np.repeat(np.arange(2, dtype=np.int32), -(-n // 2))[:n],
        np.arange(n, dtype=np.int32),
        {m: np.round(rng.random(n), 3) for m in METRIC_COLUMNS},
        np.array([0, 3, 5][:g], np.int32),
        np.asfortranarray(np.round(rng.random((n, g)), 2)),
        run="r",
        policy=POLICIES[0],
        key="k",
    )


def _write_both(out: Path, ident: dict) -> dict[str, tuple[Path, Path]]:
    """One run directory's files as ``DatasetWriter`` writes them (``new``) and as the
    previous encoding did (``old``: plain columns, every column's statistics)."""
    meta = dataset.metadata(ident["run"], "d", {f"{f}__{s}": "k" for f, s in POLICIES})
    replays = {p: _replay(301, 3, seed=k) for k, p in enumerate(POLICIES)}
    writer = dataset.DatasetWriter(out / "new", "d", meta)
    for policy, replay in replays.items():
        writer.add_replay(ident, policy, replay)
    new = writer.commit()
    old = []
    tables = [(dataset.ITERATIONS, dataset.ITERATIONS_SCHEMA), (dataset.GPUS, dataset.GPUS_SCHEMA)]
    for table, schema in tables:
        path = datasetfiles.dataset_path(out / "old", table, "d")
        path.parent.mkdir(parents=True)
        plain = parquetio.writer(path, schema.with_metadata(meta))
        for policy, replay in replays.items():
            if table == dataset.ITERATIONS:
                rows = [dataset.iterations_table(ident, policy, replay)]
            else:
                rows = list(dataset.gpu_pieces(ident, policy, replay, rows=100))
            for piece in rows:
                plain.write_table(piece.replace_schema_metadata(meta), row_group_size=100)
        plain.close()
        old.append(path)
    return {dataset.ITERATIONS: (old[0], new[0]), dataset.GPUS: (old[1], new[1])}


@pytest.mark.parametrize("ident", IDENTS, ids=["pipeline", "per-iteration"])
def test_every_reader_gets_what_the_previous_encoding_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ident: dict
) -> None:
    """pyarrow (schema, metadata, values), pandas (dtypes: ``object`` strings, not
    categoricals) and ``read_policy`` read the new files as the previous encoding's."""
    monkeypatch.setattr(dataset, "ROW_GROUP_ROWS", 100)  # gpus rows in several row groups
    files = _write_both(tmp_path, ident)
    for old, new in files.values():
        before, after = pq.read_table(old), pq.read_table(new)
        assert after.schema.equals(before.schema, check_metadata=True)
        assert after.equals(before)
        assert pq.read_schema(new).metadata == pq.read_schema(old).metadata
        assert not any(pa.types.is_dictionary(f.type) for f in after.schema)
        frame_before, frame_after = pd.read_parquet(old), pd.read_parquet(new)
        pd.testing.assert_frame_equal(frame_after, frame_before)
        assert (frame_after.dtypes == frame_before.dtypes).all()
        assert datasetfiles.built_from(new) == datasetfiles.built_from(old)
    for policy in POLICIES:
        got = {
            side: datasetfiles.read_policy(tmp_path / side, "d", policy, (0, 3, 5), remedy="r")
            for side in ("old", "new")
        }
        assert got["new"].equals(got["old"])  # an old-encoding file reads as before


def test_constant_key_columns_are_written_as_their_dictionary(tmp_path: Path) -> None:
    """The writer is given the constant string columns as one-value dictionaries; the run's
    own columns carry no statistics, the policy's (which ``read_policy`` selects by) and
    the per-row values do; the one-value columns are not compressed, the rest are."""
    files = _write_both(tmp_path, IDENTS[0])
    piece = next(dataset.gpu_pieces(IDENTS[0], POLICIES[1], _replay(5, 3, 0), encoded=True))
    for name in ("run", "replay_model", "fetch_align", "start_align"):
        column = piece.column(name)
        assert pa.types.is_dictionary(column.type)
        assert column.chunk(0).dictionary.to_pylist() == [piece.column(name)[0].as_py()]
    for table, (_, new) in files.items():
        meta = pq.ParquetFile(new).metadata
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            with_stats = {n for i, n in enumerate(names) if group.column(i).is_stats_set}
            assert with_stats == set(names) & dataset.STATISTICS_COLUMNS, (table, with_stats)
            assert {"fetch_align", "start_align", "epoch", "iteration"} <= with_stats
            plain = {n for i, n in enumerate(names) if group.column(i).compression != "ZSTD"}
            assert plain == set(names) & dataset.UNCOMPRESSED_COLUMNS, (table, plain)
            assert "loader_changed" not in plain and "stall_s" not in plain


def test_a_read_as_schema_of_other_columns_is_refused(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("a", pa.dictionary(pa.int8(), pa.string()))])
    with pytest.raises(ValueError, match="are not"):
        parquetio.writer(tmp_path / "x.parquet", schema, read_as=pa.schema([("b", pa.string())]))


def test_polars_and_duckdb_read_what_they_read_before(tmp_path: Path) -> None:
    """The other readers SPEC §7.6 names: the same frames, types and query answers."""
    pl = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    files = _write_both(tmp_path, IDENTS[0])
    for old, new in files.values():
        before, after = pl.read_parquet(old), pl.read_parquet(new)
        assert after.schema == before.schema
        assert after.equals(before)
        query = (
            "SELECT run, fetch_align, start_align, count(*) AS n, sum(iteration) AS s "
            "FROM read_parquet('{}') WHERE fetch_align = 'min' GROUP BY ALL ORDER BY ALL"
        )
        answers = [duckdb.sql(query.format(path)).fetchall() for path in (old, new)]
        assert answers[0] == answers[1] and answers[0]


def test_iterations_floats_are_plain_and_gpu_stalls_keep_their_dictionary(tmp_path: Path) -> None:
    """A replay's per-iteration metrics are nearly all distinct: plain pages (a dictionary
    cost time and bytes); the per-GPU stalls repeat and keep theirs."""
    files = _write_both(tmp_path, IDENTS[1])
    for table, (_, new) in files.items():
        meta = pq.ParquetFile(new).metadata
        for g in range(meta.num_row_groups):
            for i in range(meta.num_columns):
                column = meta.row_group(g).column(i)
                if column.physical_type != "DOUBLE":
                    continue
                plain = table == dataset.ITERATIONS
                assert column.has_dictionary_page is not plain, (table, column.path_in_schema)


def test_a_small_files_policies_are_cut_from_one_read_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_policy`` gives the same tables whether a file is read whole once and each
    policy cut from it (``WHOLE_FILE_ROWS``) or one policy's row groups at a time; one
    read serves every policy of the file, and a file replaced since is read anew."""
    monkeypatch.setattr(datasetfiles, "_LAST", threading.local())
    _write_both(tmp_path, IDENTS[0])
    out = tmp_path / "new"

    def read_all() -> list[pa.Table]:
        return [datasetfiles.read_policy(out, "d", p, (0, 3, 5), remedy="r") for p in POLICIES]

    monkeypatch.setattr(datasetfiles, "WHOLE_FILE_ROWS", 0)
    by_group = read_all()
    monkeypatch.setattr(datasetfiles, "WHOLE_FILE_ROWS", 1 << 18)
    reads: list[str] = []
    real = pq.ParquetFile.read
    monkeypatch.setattr(pq.ParquetFile, "read", lambda h, **k: reads.append(".") or real(h, **k))
    whole = read_all()
    assert all(a.equals(b) for a, b in zip(whole, by_group, strict=True))
    for a, b in zip(whole, by_group, strict=True):
        assert a.schema.equals(b.schema, check_metadata=True)
    assert len(reads) == 2  # each of the two files once, for every policy
    for policy in POLICIES:  # a summary's columns: the iterations file once more
        datasetfiles.read_policy(out, "d", policy, (0, 3, 5), remedy="r", gpus=False)
    assert len(reads) == 2

    meta = dataset.metadata(IDENTS[0]["run"], "d", {f"{f}__{s}": "k" for f, s in POLICIES})
    writer = dataset.DatasetWriter(out, "d", meta)  # the same file, other numbers
    replays = {p: _replay(301, 3, seed=10 + k) for k, p in enumerate(POLICIES)}
    for policy, replay in replays.items():
        writer.add_replay(IDENTS[0], policy, replay)
    writer.commit()
    again = datasetfiles.read_policy(out, "d", POLICIES[2], (0, 3, 5), remedy="r", gpus=False)
    expected = replays[POLICIES[2]].select(again.column_names)
    assert again.column("delay_s").equals(expected.column("delay_s"))


def test_a_damaged_policys_rows_refuse_only_that_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flipped byte in one policy's row group of a file read whole: the other policies
    still read (from their own row groups), the damaged one is refused naming the file."""
    from dsim.errors import InputError

    monkeypatch.setattr(datasetfiles, "_LAST", threading.local())
    _write_both(tmp_path, IDENTS[0])
    out = tmp_path / "new"
    path = datasetfiles.dataset_path(out, dataset.ITERATIONS, "d")
    meta = pq.ParquetFile(path).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    chunk = meta.row_group(1).column(names.index("delay_s"))  # POLICIES[1]'s rows
    data = bytearray(path.read_bytes())
    at = chunk.data_page_offset + chunk.total_compressed_size // 2
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    for policy in (POLICIES[0], POLICIES[2]):
        got = datasetfiles.read_policy(out, "d", policy, (0, 3, 5), remedy="r", gpus=False)
        assert got.num_rows == 301
    with pytest.raises(InputError, match="re-run it") as caught:
        datasetfiles.read_policy(out, "d", POLICIES[1], (0, 3, 5), remedy="re-run it", gpus=False)
    assert str(path) in str(caught.value)
