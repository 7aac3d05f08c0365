"""The tidy replay dataset: every run's replays in long format (docs/SPEC.md §7.6).

The per-policy replay files (``<out>/<run>/<fetch>__<start>.parquet``) are
wide (one ``stall_s_gpu<rank>`` column per GPU), carry neither run nor policy
as columns and sit beside ``result.json``, so no one glob reads them as one
dataset. ``dsim run`` therefore also writes, per run directory (a run, or a
model variant ``RUN@...``)::

    <out>/dataset/iterations/<directory>.parquet   one row per policy × iteration
    <out>/dataset/gpus/<directory>.parquet         one row per policy × iteration × GPU

with one schema for every run (``ITERATIONS_SCHEMA``, ``GPUS_SCHEMA``), so
that ``pd.read_parquet("results/dataset/iterations")``,
``pl.scan_parquet("results/*/dataset/iterations/*.parquet")`` or DuckDB's
``read_parquet('results/dataset/gpus/*.parquet')`` read every run at once.
The directories hold nothing but these files (temporaries of a write in
progress start with ``.``, which pyarrow ignores and ``*.parquet`` does not
match). A dataset file records the replay keys it was built from and is
rebuilt only when they change. Since results format 2 it is the stored copy of
the numbers: once both files are in place, ``dsim run`` writes each replay file
as a stub (its metadata, no rows; ``dsim.model.results.stub_replays``), which
keeps what cache, provenance and resume read (§7.2, §7.3); readers read a stub's
rows from here (``dsim.model.datasetfiles``). Deleting ``<out>/dataset`` loses them.

Writing is most of what ``dsim run`` does besides the replay, so the constant key
columns reach the Parquet writer as one-value dictionaries (``_encoded``) and only the
columns a reader selects by carry statistics (``STATISTICS_COLUMNS``); the files record
the plain schema, so readers get plain strings (SPEC §7.6, "Encoding").
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dsim.errors import OutputError
from dsim.io import parquetio
from dsim.io.arrowtables import empty_table
from dsim.io.atomic import atomic_path
from dsim.model.columns import METRIC_COLUMNS
from dsim.model.datasetfiles import DATASET_DIR, GPUS, ITERATIONS, built_from, dataset_path
from dsim.model.resultinfo import ResultInfo
from dsim.model.results import ResultRun

__all__ = [
    "DATASET_DIR",
    "DATASET_FORMAT_VERSION",
    "GPUS",
    "GPUS_SCHEMA",
    "ITERATIONS",
    "ITERATIONS_DISTINCT",
    "ITERATIONS_SCHEMA",
    "ROW_GROUP_ROWS",
    "STATISTICS_COLUMNS",
    "DatasetWriter",
    "dataset_path",
    "file_writer",
    "gpu_pieces",
    "identity",
    "is_current",
    "iterations_table",
    "long_tables",
    "metadata",
    "policy_tables",
    "run_frames",
    "write_run_dataset",
]

DATASET_FORMAT_VERSION = 1
#: Rows per row group of a dataset file: pyarrow's own default for one ``write_table``
#: call (1024 * 1024), named so that the gpus rows, written in pieces of this many rows
#: (``gpu_pieces``), fall into the very row groups, hence bytes, of one whole write.
ROW_GROUP_ROWS = 1024 * 1024

#: Columns that say which replay a row belongs to, first in both tables.
_KEY_FIELDS = [
    pa.field("run", pa.string(), nullable=False),
    pa.field("replay_model", pa.string(), nullable=False),
    pa.field("loader_workers", pa.int32()),
    pa.field("loader_prefetch_factor", pa.int32()),
    pa.field("loader_changed", pa.bool_(), nullable=False),
    pa.field("fetch_align", pa.string(), nullable=False),
    pa.field("start_align", pa.string(), nullable=False),
    pa.field("epoch", pa.int32(), nullable=False),
    pa.field("iteration", pa.int32(), nullable=False),
]
ITERATIONS_SCHEMA = pa.schema(
    [*_KEY_FIELDS, *(pa.field(m, pa.float64(), nullable=False) for m in METRIC_COLUMNS)]
)
GPUS_SCHEMA = pa.schema(
    [
        *_KEY_FIELDS,
        pa.field("gpu", pa.int32(), nullable=False),
        pa.field("stall_s", pa.float64(), nullable=False),
    ]
)
#: The key columns constant over one replay's rows: the run directory's and the policy's.
_CONSTANT_FIELDS = _KEY_FIELDS[:7]


def _encoded(schema: pa.Schema) -> pa.Schema:
    """``schema`` as the writer is given its tables: the constant string key columns as
    one-value dictionary arrays (``_block``), which the Parquet writer writes as their
    dictionary and indices instead of hashing every row's string (``parquetio.writer``);
    the files record ``schema`` itself, so readers get plain strings back."""
    constant = {f.name for f in _CONSTANT_FIELDS if pa.types.is_string(f.type)}
    return pa.schema(
        [
            pa.field(f.name, pa.dictionary(pa.int8(), f.type), f.nullable)
            if f.name in constant
            else f
            for f in schema
        ]
    )


_ENCODED = {ITERATIONS_SCHEMA: _encoded(ITERATIONS_SCHEMA), GPUS_SCHEMA: _encoded(GPUS_SCHEMA)}

#: The columns whose row groups carry min/max statistics: the policy's, by which readers
#: find a policy's row groups (``dsim.model.datasetfiles``), and the per-row values a query
#: may filter on. Left out: the run's name, model and loader settings, one value over a
#: whole file (its name and ``dsim`` metadata say them), whose statistics were ~15 % of a
#: dataset's write (a dictionary column's are computed by a pass over its indices).
STATISTICS_COLUMNS = frozenset(
    {"fetch_align", "start_align", "epoch", "iteration", "gpu", "stall_s", *METRIC_COLUMNS}
)
#: Whether ``iterations``' float columns are written in plain pages (``parquetio``'s
#: ``distinct``): a replay's per-iteration metrics are nearly all distinct, and their
#: dictionaries cost time and bytes. Measured on the 30 first measured runs of
#: ``validation/data`` and on ten synthetic 10,000 x 8 runs: ~0.7x the table's write time
#: and 14-15 % fewer bytes. The gpus table's ``stall_s`` keeps its dictionary: a
#: synthetic run's stalls repeat and its file was 2.1x smaller so (measured runs': 1.17x
#: larger, at about the same time).
ITERATIONS_DISTINCT = True


def _identity(run: ResultRun) -> dict[str, Any]:
    """The values of the key columns that are constant over one run directory."""
    return identity(run.name, run.info)


def identity(run: str, info: ResultInfo) -> dict[str, Any]:
    """The key columns' values constant over one run directory, from its ``result.json``."""
    loader = info.loader or {}
    assumed = loader.get("assumed") or {}
    return {
        "run": run,
        "replay_model": info.model,
        "loader_workers": assumed.get("workers"),
        "loader_prefetch_factor": assumed.get("prefetch_factor"),
        "loader_changed": bool(loader.get("changed", False)),
    }


#: Rows of the one block a constant column repeats (a multiple of the Parquet writer's
#: batch of 1,024 values, so that its pages are cut where one whole array's are).
CONSTANT_BLOCK = 64 * 1024


def _constant(field: pa.Field, value: Any, n: int) -> pa.ChunkedArray:
    """``value`` ``n`` times, typed as ``field`` (nulls for ``None``): one block of at most
    ``CONSTANT_BLOCK`` rows, the same chunk repeated. Why: the run's name, the model and the
    policy were strings repeated on every row, ~60 of the ~100 bytes a dataset row cost in
    memory; the same values in the same order, written to the same bytes. A dictionary
    ``field`` (``_encoded``) gets a one-value dictionary and zero indices."""
    block = min(n, CONSTANT_BLOCK)
    one = _block(field.type, value, block)
    whole, rest = divmod(n, block) if block else (0, 0)
    chunks = [one] * whole + ([one.slice(0, rest)] if rest else [])
    return pa.chunked_array(chunks or [one], type=field.type)


@functools.lru_cache(maxsize=16, typed=True)
def _block(kind: pa.DataType, value: Any, block: int) -> pa.Array:
    """``value`` ``block`` times as an array of ``kind``, made once per distinct value:
    Arrow arrays are immutable, so every policy's and every piece's key columns share it.
    Why: made anew, it was ~0.2 ms a call, 2,520 calls in a 20-run ``dsim run`` (5 % of
    it); the run's name, model and policy repeat across every piece of a run. Every
    chunk of a dictionary column shares one dictionary object, so the Parquet writer
    keeps writing indices against it (an unequal one would make it fall back to plain)."""
    if value is None:
        return pa.nulls(block, kind)
    if pa.types.is_dictionary(kind):
        indices = pa.array(np.zeros(block, kind.index_type.to_pandas_dtype()), kind.index_type)
        return pa.DictionaryArray.from_arrays(indices, pa.array([value], kind.value_type))
    return pa.repeat(pa.scalar(value, kind), block)


def policy_tables(run: ResultRun) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Per listed policy (label order): its (iterations, gpus) rows in long format.

    Each replay is read with its checksums and provenance checked
    (``ResultRun.read``), one at a time, so memory holds one policy.
    """
    ident = _identity(run)
    for policy in run.replays:
        yield long_tables(ident, policy, run.read(policy))


def long_tables(
    ident: dict[str, Any], policy: tuple[str, str], replay: pa.Table
) -> tuple[pa.Table, pa.Table]:
    """One replay table (wide, as written) → its (iterations, gpus) rows in long format,
    whole (``run_frames``; ``DatasetWriter.add_replay`` writes the gpus rows in pieces)."""
    pieces = list(gpu_pieces(ident, policy, replay, rows=max(1, replay.num_rows * _gpus(replay))))
    gpus = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
    return iterations_table(ident, policy, replay), gpus


def _stall_columns(replay: pa.Table) -> list[str]:
    return [c for c in replay.column_names if c.startswith("stall_s_gpu")]


def _gpus(replay: pa.Table) -> int:
    return len(_stall_columns(replay))


def iterations_table(
    ident: dict[str, Any], policy: tuple[str, str], replay: pa.Table, *, encoded: bool = False
) -> pa.Table:
    """One replay's rows of ``dataset/iterations``: its per-iteration columns.
    ``encoded``: with the constant string key columns as the writer takes them
    (``_encoded``; the values are the same)."""
    n = replay.num_rows
    schema = _ENCODED[ITERATIONS_SCHEMA] if encoded else ITERATIONS_SCHEMA
    const = {**ident, "fetch_align": policy[0], "start_align": policy[1]}
    base = {f.name: _constant(f, const[f.name], n) for f in list(schema)[:7]}
    return pa.table(
        {
            **base,
            "epoch": replay.column("epoch").cast(pa.int32()),
            "iteration": replay.column("iteration").cast(pa.int32()),
        }
        | {m: replay.column(m) for m in METRIC_COLUMNS},
        schema=schema,
    )


def gpu_pieces(
    ident: dict[str, Any],
    policy: tuple[str, str],
    replay: pa.Table,
    rows: int | None = None,
    *,
    encoded: bool = False,
) -> Iterator[pa.Table]:
    """One replay's rows of ``dataset/gpus`` (iteration-major, then rank), in consecutive
    pieces of at most ``rows`` rows (default ``ROW_GROUP_ROWS``), each built only when asked;
    ``encoded`` as in ``iterations_table``.

    Why pieces: the long rows cost ~100 bytes each in memory (the run's name and the
    policy are strings repeated on every row), ~13x the replay's 8 bytes per
    GPU-iteration; built whole they were the largest part of ``dsim run``'s peak. A
    table with no row yields one empty piece.
    """
    rows = ROW_GROUP_ROWS if rows is None else rows
    schema = _ENCODED[GPUS_SCHEMA] if encoded else GPUS_SCHEMA
    n = replay.num_rows
    stall_columns = _stall_columns(replay)
    gpus = np.array([int(c.removeprefix("stall_s_gpu")) for c in stall_columns], np.int32)
    g = len(gpus)
    const = {**ident, "fetch_align": policy[0], "start_align": policy[1]}
    total = n * g
    for lo in range(0, max(total, 1), rows):
        hi = min(lo + rows, total)
        first, last = lo // g if g else 0, -(-hi // g) if g else 0  # iterations touched
        cut = slice(lo - first * g, hi - first * g)

        def part(name: str, first: int = first, last: int = last) -> np.ndarray:
            column = replay.column(name).slice(first, last - first)
            return column.to_numpy()

        stall = (
            np.column_stack([part(c) for c in stall_columns]).reshape(-1)[cut] if g else np.empty(0)
        )
        yield pa.table(
            {
                **{f.name: _constant(f, const[f.name], hi - lo) for f in list(schema)[:7]},
                "epoch": np.repeat(part("epoch").astype(np.int32, copy=False), g)[cut],
                "iteration": np.repeat(part("iteration").astype(np.int32, copy=False), g)[cut],
                "gpu": np.tile(gpus, last - first)[cut],
                "stall_s": stall,
            },
            schema=schema,
        )


def _metadata(run: ResultRun) -> dict[bytes, bytes]:
    return metadata(run.name, run.directory.name, dict(run.info.policies))


def metadata(run: str, directory: str, policies: dict[str, str]) -> dict[bytes, bytes]:
    """The schema metadata ``dsim`` of a run directory's dataset files (``policies``:
    label → replay key, as ``result.json`` lists them)."""
    meta = {
        "format_version": DATASET_FORMAT_VERSION,
        "run": run,
        "directory": directory,
        "policies": policies,
    }
    return {b"dsim": json.dumps(meta, sort_keys=True).encode()}


def is_current(out: str | Path, directory: str, meta: dict[bytes, bytes]) -> bool:
    """Whether both dataset files of ``directory`` were built from the replays ``meta`` names."""
    wanted = json.loads(meta[b"dsim"])
    return all(built_from(dataset_path(out, t, directory)) == wanted for t in (ITERATIONS, GPUS))


#: The constant key columns written without zstd: each page of theirs is a one-value
#: dictionary and a run of zero indices, or a run of nulls or equal deltas, a few bytes
#: either way, and its zstd call cost more than the column's encoding (~0.1 ms a column
#: and policy of 80,000 rows; zstd framing made them larger, not smaller). The boolean
#: ``loader_changed`` is bit-packed, one bit a row, and keeps zstd.
UNCOMPRESSED_COLUMNS = frozenset(
    f.name for f in _CONSTANT_FIELDS if not pa.types.is_boolean(f.type)
)
#: Values the dataset's writers take per step: a constant column's whole block
#: (``CONSTANT_BLOCK``) at once. A policy's gpus rows of a 10,000 x 8 run wrote in 4.75
#: ms against 5.17 at the default 1,024 (medians of 6 x 10 interleaved writes).
WRITE_BATCH_SIZE = CONSTANT_BLOCK


def file_writer(
    path: str | Path, schema: pa.Schema, meta: dict[bytes, bytes], *, distinct: bool
) -> pq.ParquetWriter:
    """The writer of one dataset file of ``schema`` (``ITERATIONS_SCHEMA`` or
    ``GPUS_SCHEMA``): given ``_encoded`` tables, it records ``schema`` with ``meta``."""
    return parquetio.writer(
        path,
        _ENCODED[schema],
        read_as=schema.with_metadata(meta),
        statistics=STATISTICS_COLUMNS,
        distinct=distinct,
        uncompressed=UNCOMPRESSED_COLUMNS,
        batch_size=WRITE_BATCH_SIZE,
    )


class DatasetWriter:
    """One run directory's two dataset files, written policy by policy (label order) into
    temporaries and moved into place by ``commit``: ``dsim run`` adds each replay from
    memory as it is computed, so the dataset costs no second read of the replays."""

    def __init__(self, out: str | Path, directory: str, meta: dict[bytes, bytes]) -> None:
        self.paths = [dataset_path(out, t, directory) for t in (ITERATIONS, GPUS)]
        self.meta = meta
        self._stack = contextlib.ExitStack()
        tmp_it, tmp_gpu = (self._stack.enter_context(atomic_path(p)) for p in self.paths)
        self._writers = [
            file_writer(path, schema, meta, distinct=distinct)
            for path, schema, distinct in (
                (tmp_it, ITERATIONS_SCHEMA, ITERATIONS_DISTINCT),
                (tmp_gpu, GPUS_SCHEMA, False),
            )
        ]

    def add(self, iterations: pa.Table, gpus: pa.Table) -> None:
        """A policy's rows, whole (``long_tables``: plain columns, cast here)."""
        for writer, table in zip(self._writers, (iterations, gpus), strict=True):
            self._write(writer, table.cast(writer.schema))

    def add_replay(self, ident: dict[str, Any], policy: tuple[str, str], replay: pa.Table) -> None:
        """A policy's rows from its replay table, the gpus rows one row group at a time
        (``gpu_pieces``): the same bytes as ``add(*long_tables(...))``, a bounded peak."""
        it_writer, gpu_writer = self._writers
        self._write(it_writer, iterations_table(ident, policy, replay, encoded=True))
        for piece in gpu_pieces(ident, policy, replay, ROW_GROUP_ROWS, encoded=True):
            self._write(gpu_writer, piece)

    def _write(self, writer: pq.ParquetWriter, table: pa.Table) -> None:
        try:
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        except OSError as exc:  # a full disk: the user's to act on, naming the file (exit 4)
            raise self._cannot_write(writer, exc) from exc

    def _close(self) -> None:
        for writer in self._writers:
            try:
                writer.close()
            except OSError as exc:
                raise self._cannot_write(writer, exc) from exc

    def _cannot_write(self, writer: pq.ParquetWriter, exc: OSError) -> OutputError:
        path = self.paths[self._writers.index(writer)]
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        return OutputError(f"cannot write {path}: {reason}")

    def commit(self) -> list[Path]:
        """Close both files and move them into place."""
        _block.cache_clear()
        self._close()
        self._stack.close()
        return self.paths

    def abort(self) -> None:
        """Close and remove the temporaries (the files in place are left as they were)."""
        _block.cache_clear()
        with contextlib.suppress(Exception):
            self._close()
        self._stack.__exit__(RuntimeError, RuntimeError("aborted"), None)


def write_run_dataset(run: ResultRun, out: str | Path) -> list[Path]:
    """Write (or keep, when built from the same replay keys) one run directory's files."""
    meta = _metadata(run)
    if is_current(out, run.directory.name, meta):
        return []
    writer = DatasetWriter(out, run.directory.name, meta)
    ident = _identity(run)
    try:
        for policy in run.replays:
            writer.add_replay(ident, policy, run.read(policy))
    except BaseException:
        writer.abort()
        raise
    return writer.commit()


def run_frames(run: ResultRun) -> tuple[pa.Table, pa.Table]:
    """One run directory's (iterations, gpus) tables, built in memory from its replays
    (results written before the dataset existed have no dataset files)."""
    parts = list(policy_tables(run))
    if not parts:
        return empty_table(ITERATIONS_SCHEMA), empty_table(GPUS_SCHEMA)
    return pa.concat_tables([p[0] for p in parts]), pa.concat_tables([p[1] for p in parts])
