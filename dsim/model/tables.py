"""The per-run tables every step after parsing reads (docs/SPEC.md §2).

A parsed run is a directory holding ``fetch.parquet``, ``train.parquet`` and
``run.json``. This module owns their schemas and is the only place that
reads or writes them, so a change of format happens here and nowhere else.
Timestamps are wall-clock times without a time zone (the logs carry none),
at nanosecond resolution.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from dsim.errors import InputError
from dsim.io import parquetio
from dsim.io.atomic import atomic_dir
from dsim.model.runinfo import FORMAT_VERSION, RunInfo, check_run_directory

FETCH_FILE = "fetch.parquet"
TRAIN_FILE = "train.parquet"
REJECTS_FILE = "rejects.csv"
GPU_UTIL_FILE = "gpu_util.parquet"

TIMESTAMP = pa.timestamp("ns")

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


def with_cpu(schema: pa.Schema, columns) -> pa.Schema:
    """``schema`` plus those of ``CPU_COLUMNS`` named in ``columns``, in that order."""
    for name in CPU_COLUMNS:
        if name in columns:
            schema = schema.append(pa.field(name, pa.float64(), nullable=True))
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
    with atomic_dir(directory, check_existing=check_run_directory) as tmp:
        for table, schema, name in (
            (run.fetch, FETCH_SCHEMA, FETCH_FILE),
            (run.train, TRAIN_SCHEMA, TRAIN_FILE),
        ):
            full = with_cpu(schema, table.column_names)
            parquetio.write_table(table.select(full.names).cast(full), tmp / name)
        if run.gpu_util is not None:
            parquetio.write_table(run.gpu_util, tmp / GPU_UTIL_FILE)
        if rejects is not None and rejects.num_rows:
            # one chunk: pyarrow 17 writes the header again after an empty first chunk
            pacsv.write_csv(rejects.combine_chunks(), tmp / REJECTS_FILE)
        run.info.save(tmp)
    return directory


def read_info(directory: str | Path) -> RunInfo:
    """``<directory>/run.json``, typed and version-checked (``RunInfo.load``)."""
    return RunInfo.load(directory)


def read_run(directory: str | Path) -> RunTables:
    """Read and validate one run directory written by ``write_run``."""
    directory = Path(directory)
    info = read_info(directory)
    tables = []
    for name, schema in ((FETCH_FILE, FETCH_SCHEMA), (TRAIN_FILE, TRAIN_SCHEMA)):
        path = directory / name
        try:
            table = parquetio.read_table(path, remedy="re-run `dsim parse` for this run")
        except FileNotFoundError:
            raise InputError(f"missing {name} (re-run `dsim parse`)", directory) from None
        tables.append(_check_schema(table, schema, path))
    util = None
    if (directory / GPU_UTIL_FILE).exists():
        util = parquetio.read_table(
            directory / GPU_UTIL_FILE, remedy="re-run `dsim parse` for this run"
        )
    return RunTables(
        name=info.name or directory.name,
        fetch=tables[0],
        train=tables[1],
        info=info,
        gpu_util=util,
    )
