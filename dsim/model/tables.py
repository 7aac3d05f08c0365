"""The per-run tables every step after parsing reads (docs/SPEC.md §2).

A parsed run is a directory holding ``fetch.parquet``, ``train.parquet`` and
``run.json``. This module owns their schemas and is the only place that
reads or writes them, so a change of format happens here and nowhere else.
Timestamps are wall-clock times without a time zone (the logs carry none),
at nanosecond resolution.

``dsim parse`` may rewrite a run while another command reads it. Writers
swap whole directories (``atomic_dir``) and record in ``run.json`` the
digest of the tables they wrote; ``read_run`` reads ``run.json``, the
tables' bytes and ``run.json`` again, and accepts them only when the bytes
match that digest and ``run.json`` did not change meanwhile, else it reads
again (docs/SPEC.md §2.3, "Snapshots"). No lock: a reader never waits for or
blocks a writer, and read-only trace directories read the same way.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from dsim.errors import InputError
from dsim.io import parquetio
from dsim.io.atomic import atomic_dir, leftover_of_dead_writer
from dsim.model.runinfo import (
    FORMAT_VERSION,
    RUN_FILE,
    RunInfo,
    check_run_directory,
    digest_document,
    file_digest,
    path_digest,
)

FETCH_FILE = "fetch.parquet"
TRAIN_FILE = "train.parquet"
REJECTS_FILE = "rejects.csv"
GPU_UTIL_FILE = "gpu_util.parquet"

TIMESTAMP = pa.timestamp("ns")

# The files a run's digest covers (gpu_util only when the run has one), in reading order.
_TABLE_FILES = (FETCH_FILE, TRAIN_FILE, GPU_UTIL_FILE)
_REQUIRED = (FETCH_FILE, TRAIN_FILE)
_REMEDY = "re-run `dsim parse` for this run"

# How often ``read_run`` reads a run that changes under it before giving up, and the first
# pause between reads (doubled each time: 0.62 s in all), long enough for a swap to end.
SNAPSHOT_ATTEMPTS = 6
SNAPSHOT_PAUSE_S = 0.02

FETCH_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int32(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("gpu", pa.int32(), nullable=False),
        pa.field("worker", pa.int32(), nullable=False),
        pa.field("start", TIMESTAMP, nullable=False),
        pa.field("end", TIMESTAMP, nullable=False),
        pa.field("fetch_s", pa.float64(), nullable=False),
    ]
)

TRAIN_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int32(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("gpu", pa.int32(), nullable=False),
        pa.field("start", TIMESTAMP, nullable=False),
        pa.field("iteration_s", pa.float64(), nullable=False),
        pa.field("stall_s", pa.float64(), nullable=False),
        pa.field("throughput", pa.float64(), nullable=True),
    ]
)

# Optional float64 columns of both tables, present only when the logs carry CPU times
# (SPEC §2.1): the training process's or the batch's CPU seconds and run-queue wait.
CPU_COLUMNS = ("cpu_s", "runq_s")
# Optional float64 columns of the fetch table, present only when the logs carry a fetch's
# stages (SPEC §2.1): wall and CPU seconds of the sample reads and of the collation.
STAGE_COLUMNS = ("read_s", "read_cpu_s", "collate_s", "collate_cpu_s")
# Optional float64 column of the fetch table, present only when the logs carry it (SPEC
# §2.1): the CPU seconds of the worker's whole process since its previous batch.
PROC_COLUMN = "proc_cpu_s"
OPTIONAL_COLUMNS = (*CPU_COLUMNS, *STAGE_COLUMNS, PROC_COLUMN)


# Optional int32 column of the fetch table, present only when the logs come from an
# IterableDataset (SPEC §2.1): the batch's position in its worker's stream.
STREAM_COLUMN = "stream"


def with_cpu(schema: pa.Schema, columns) -> pa.Schema:
    """``schema`` plus those of ``OPTIONAL_COLUMNS`` named in ``columns``, in that order, then
    ``STREAM_COLUMN`` when named (the optional columns; tables without them keep their bytes)."""
    for name in OPTIONAL_COLUMNS:
        if name in columns:
            schema = schema.append(pa.field(name, pa.float64(), nullable=True))
    if STREAM_COLUMN in columns:
        schema = schema.append(pa.field(STREAM_COLUMN, pa.int32(), nullable=True))
    return schema


@dataclass
class RunTables:
    """One parsed run: its two tables and its ``run.json`` (``RunInfo``).

    ``info`` may be given as a mapping of ``run.json`` keys (tests and tools
    build runs by hand); it is typed into a ``RunInfo`` named ``name``.

    ``gpu_util``: utilisation samples (time, gpu, util_pct, memory_used_mib),
    or ``None`` when the run has none (SPEC §1.9).
    """

    name: str
    fetch: pa.Table
    train: pa.Table
    info: RunInfo = field(default_factory=lambda: RunInfo("", 0, (), (), {}))
    gpu_util: pa.Table | None = None
    # size and sha256 of the table files as read (``read_run``), by file name: exactly the
    # bytes these tables were decoded from, for cache keys and ``result.json``
    files: Mapping[str, Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.info, Mapping):
            document = {"format_version": FORMAT_VERSION, **self.info, "name": self.name}
            self.info = RunInfo.from_document(document)
        elif self.info.name != self.name:
            self.info = replace(self.info, name=self.name)


def _check_schema(table: pa.Table, schema: pa.Schema, path: Path) -> pa.Table:
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise InputError(
            f"not a dsim table: missing column(s) {', '.join(missing)} "
            f"(re-run `dsim parse` to rebuild it)",
            path,
        )
    schema = with_cpu(schema, table.column_names)
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(f"column types do not match the dsim table format: {exc}", path) from exc


def write_run(run: RunTables, directory: str | Path, rejects: pa.Table | None = None) -> Path:
    """Write a run directory atomically: readers see the old run or the new one, never a mix.

    ``rejects`` (file, line, reason, text), when it has rows, goes to
    ``rejects.csv`` beside the tables so that users can read what was skipped.
    An existing ``directory`` is replaced only if it is a run directory dsim
    wrote (``check_run_directory``), never a user's.
    """
    directory = Path(directory)
    write_run_info(run, directory, rejects)
    return directory


def write_run_info(run: RunTables, directory: Path, rejects: pa.Table | None = None) -> RunInfo:
    """``write_run``, returning the ``run.json`` written: ``run.info`` with the digest of
    the tables written (SPEC §2.3), the version this write made."""
    with atomic_dir(directory, check_existing=check_run_directory) as tmp:
        for table, schema, name in (
            (run.fetch, FETCH_SCHEMA, FETCH_FILE),
            (run.train, TRAIN_SCHEMA, TRAIN_FILE),
        ):
            full = with_cpu(schema, table.column_names)
            # measurements nearly all distinct: plain pages (parquetio.write_options)
            parquetio.write_table(table.select(full.names).cast(full), tmp / name, distinct=True)
        if run.gpu_util is not None:
            parquetio.write_table(run.gpu_util, tmp / GPU_UTIL_FILE)
        if rejects is not None and rejects.num_rows:
            # one chunk: pyarrow 17 writes the header again after an empty first chunk
            pacsv.write_csv(rejects.combine_chunks(), tmp / REJECTS_FILE)
        files = {name: path_digest(tmp / name) for name in _TABLE_FILES if (tmp / name).exists()}
        info = replace(run.info, digest=digest_document(files))
        info.save(tmp)
    return info


def read_info(directory: str | Path) -> RunInfo:
    """``<directory>/run.json``, typed and version-checked (``RunInfo.load``)."""
    return RunInfo.load(directory)


@dataclass(frozen=True)
class _Snapshot:
    """One pass over a run directory: ``run.json`` before and after, and the tables' bytes."""

    before: bytes
    after: bytes | None
    blobs: Mapping[str, bytes]  # the table files found
    files: Mapping[str, Mapping[str, Any]]  # their ``file_digest``s, hashed once

    def same_as(self, other: _Snapshot | None) -> bool:
        """Whether two passes saw the same bytes (the run is not changing)."""
        return (
            other is not None
            and (self.before, self.after) == (other.before, other.after)
            and self.files == other.files
        )


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc


def _being_swapped(directory: Path) -> bool:
    """Whether a live ``atomic_dir`` is between its two renames: the old run moved aside
    (``.<name>.old-<pid>``, ``pid`` running), the new one not yet in place. One a killed
    writer left is no swap under way (the next write puts it back)."""
    pattern = os.path.join(
        glob.escape(str(directory.parent)), f".{glob.escape(directory.name)}.old-*"
    )
    return any(leftover_of_dead_writer(Path(p).name) is None for p in glob.glob(pattern))


def _read_pass(directory: Path) -> _Snapshot | None:
    """``run.json``, every table file, ``run.json`` again; ``None`` while a swap is under way."""
    before = _read_bytes(directory / RUN_FILE)
    if before is None:
        if _being_swapped(directory):
            return None
        raise InputError(
            f"no parsed run here (missing {RUN_FILE}; run `dsim parse` first)", directory
        )
    blobs = {}
    for name in _TABLE_FILES:
        data = _read_bytes(directory / name)
        if data is not None:
            blobs[name] = data
    files = {name: file_digest(data) for name, data in blobs.items()}
    return _Snapshot(before, _read_bytes(directory / RUN_FILE), blobs, files)


def _mismatch(directory: Path, snapshot: _Snapshot, info: RunInfo) -> InputError | None:
    """Why a pass is not one version of the run (``None`` when it is)."""
    if snapshot.after != snapshot.before:
        return InputError(f"{RUN_FILE} changed while the tables were read", directory)
    missing = [name for name in _REQUIRED if name not in snapshot.blobs]
    if missing:
        return InputError(f"missing {missing[0]} (re-run `dsim parse`)", directory)
    recorded = info.files
    if recorded is None:  # parsed before dsim recorded digests: nothing to check against
        return None
    found = snapshot.files
    for name in sorted(set(recorded) | set(found)):
        if recorded.get(name) != found.get(name):
            if name not in found:
                what = f"missing, though the digest in {RUN_FILE} lists it"
            else:
                what = f"does not match the digest in {RUN_FILE} (changed since `dsim parse`?)"
            return InputError(f"{what}; {_REMEDY}", directory / name)
    return None


def read_run(
    directory: str | Path, leave_out: Mapping[str, Collection[str]] | None = None
) -> RunTables:
    """Read and validate one run directory written by ``write_run``: one version of it.

    The bytes read are checked against the digest ``run.json`` records (see the
    module docstring); a run that changes under the reader is read again, up to
    ``SNAPSHOT_ATTEMPTS`` times, and then refused: ``dsim parse`` is rewriting it.
    Tables that differ from that digest the same way on two reads were changed by
    hand and are refused at once. The tables are decoded from the very bytes checked.
    ``leave_out``: by file name (``FETCH_FILE``, ``TRAIN_FILE``), columns the caller never
    reads, not decoded (``dsim run`` reads no fetch ``end``: 8 bytes per GPU-iteration).
    """
    directory = Path(directory)
    leave_out = leave_out or {}
    last: _Snapshot | None = None
    for attempt in range(SNAPSHOT_ATTEMPTS):
        snapshot = _read_pass(directory)
        if snapshot is not None:
            info = RunInfo.from_bytes(snapshot.before, directory / RUN_FILE)
            problem = _mismatch(directory, snapshot, info)
            if problem is None:
                return _decode(directory, snapshot, info, leave_out)
            # the same on two reads is not a parse under way, unless run.json itself moved
            # under the read (a writer swapping two versions back and forth repeats a pass)
            if snapshot.after == snapshot.before and snapshot.same_as(last):
                if all(name in snapshot.blobs for name in _REQUIRED):
                    _decode(directory, snapshot, info, leave_out)  # a corrupted page says so first
                raise problem
            last = snapshot
        if attempt + 1 < SNAPSHOT_ATTEMPTS:
            time.sleep(SNAPSHOT_PAUSE_S * 2**attempt)
    raise InputError(
        "trace changed while it was read; run again when `dsim parse` has finished", directory
    )


def read_version(directory: str | Path) -> tuple[RunInfo, dict[str, dict[str, Any]]]:
    """One version of a run directory as ``read_run`` would read it, without decoding a
    table: its ``run.json`` and the ``file_digest`` of each table file (the very
    ``RunTables.info`` and ``RunTables.files`` a ``read_run`` of it gives). Raises
    ``InputError`` where ``read_run`` would refuse the run; a run changing under the
    read is read again, as ``read_run`` does.

    Why: a fully cached ``dsim run`` only needs to know that the trace is the one its
    results were computed from (``dsim.app.runmemo``); decoding the tables and building
    the arrays was ~18 % of it (issue #21).
    """
    directory = Path(directory)
    for attempt in range(SNAPSHOT_ATTEMPTS):
        snapshot = _read_pass(directory)
        if snapshot is not None:
            info = RunInfo.from_bytes(snapshot.before, directory / RUN_FILE)
            problem = _mismatch(directory, snapshot, info)
            if problem is not None:
                raise problem
            return info, {name: dict(value) for name, value in snapshot.files.items()}
        if attempt + 1 < SNAPSHOT_ATTEMPTS:
            time.sleep(SNAPSHOT_PAUSE_S * 2**attempt)
    raise InputError(
        "trace changed while it was read; run again when `dsim parse` has finished", directory
    )


def _decode(
    directory: Path,
    snapshot: _Snapshot,
    info: RunInfo,
    leave_out: Mapping[str, Collection[str]],
) -> RunTables:
    tables = []
    for name, schema in ((FETCH_FILE, FETCH_SCHEMA), (TRAIN_FILE, TRAIN_SCHEMA)):
        path = directory / name
        unread = leave_out.get(name, ())
        table = parquetio.read_bytes(snapshot.blobs[name], path, remedy=_REMEDY, leave_out=unread)
        if unread:
            schema = pa.schema([f for f in schema if f.name not in unread])
        tables.append(_check_schema(table, schema, path))
    util = None
    if GPU_UTIL_FILE in snapshot.blobs:
        util = parquetio.read_bytes(
            snapshot.blobs[GPU_UTIL_FILE], directory / GPU_UTIL_FILE, remedy=_REMEDY
        )
    return RunTables(
        name=info.name or directory.name,
        fetch=tables[0],
        train=tables[1],
        info=info,
        gpu_util=util,
        files=dict(snapshot.files),
    )
