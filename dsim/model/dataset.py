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
match). The replay files stay the source of truth (cache, provenance,
resume: §7.2, §7.3); a dataset file records the replay keys it was built from
and is rebuilt only when they change.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dsim.io import parquetio
from dsim.io.atomic import atomic_path
from dsim.model.columns import METRIC_COLUMNS
from dsim.model.resultinfo import ResultInfo
from dsim.model.results import ResultRun

DATASET_DIR = "dataset"
ITERATIONS = "iterations"
GPUS = "gpus"
DATASET_FORMAT_VERSION = 1

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


def dataset_path(out: str | Path, table: str, directory: str) -> Path:
    """``<out>/dataset/<table>/<directory>.parquet`` (``table``: iterations or gpus)."""
    return Path(out) / DATASET_DIR / table / f"{directory}.parquet"


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


def _constant(field: pa.Field, value: Any, n: int) -> pa.Array:
    """``value`` ``n`` times, typed as ``field`` (nulls for ``None``)."""
    if value is None:
        return pa.nulls(n, field.type)
    return pa.repeat(pa.scalar(value, field.type), n)


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
    """One replay table (wide, as written) → its (iterations, gpus) rows in long format."""
    n = replay.num_rows
    const = {**ident, "fetch_align": policy[0], "start_align": policy[1]}
    base = {f.name: _constant(f, const[f.name], n) for f in _KEY_FIELDS[:7]}
    epoch = replay.column("epoch").cast(pa.int32())
    iteration = replay.column("iteration").cast(pa.int32())
    iterations = pa.table(
        {**base, "epoch": epoch, "iteration": iteration}
        | {m: replay.column(m) for m in METRIC_COLUMNS},
        schema=ITERATIONS_SCHEMA,
    )
    stall_columns = [c for c in replay.column_names if c.startswith("stall_s_gpu")]
    gpus = np.array([int(c.removeprefix("stall_s_gpu")) for c in stall_columns], np.int32)
    g = len(gpus)
    stall = (
        np.column_stack([replay.column(c).to_numpy() for c in stall_columns])
        if g
        else np.empty((n, 0))
    )
    long = {f.name: _constant(f, const[f.name], n * g) for f in _KEY_FIELDS[:7]}
    long_table = pa.table(
        {
            **long,
            "epoch": np.repeat(epoch.to_numpy(), g),
            "iteration": np.repeat(iteration.to_numpy(), g),
            "gpu": np.tile(gpus, n),
            "stall_s": stall.reshape(-1),
        },
        schema=GPUS_SCHEMA,
    )
    return iterations, long_table


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


def _built_from(path: Path) -> dict[str, Any] | None:
    """The dsim metadata of an existing dataset file, or ``None`` if it is absent or unreadable."""
    try:
        raw = (pq.read_schema(path).metadata or {}).get(b"dsim")
        return json.loads(raw) if raw else None
    except (OSError, pa.ArrowException, ValueError):
        return None


def is_current(out: str | Path, directory: str, meta: dict[bytes, bytes]) -> bool:
    """Whether both dataset files of ``directory`` were built from the replays ``meta`` names."""
    wanted = json.loads(meta[b"dsim"])
    return all(_built_from(dataset_path(out, t, directory)) == wanted for t in (ITERATIONS, GPUS))


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
            parquetio.writer(tmp_it, ITERATIONS_SCHEMA.with_metadata(meta)),
            parquetio.writer(tmp_gpu, GPUS_SCHEMA.with_metadata(meta)),
        ]

    def add(self, iterations: pa.Table, gpus: pa.Table) -> None:
        for writer, table in zip(self._writers, (iterations, gpus), strict=True):
            writer.write_table(table.replace_schema_metadata(self.meta))

    def _close(self) -> None:
        for writer in self._writers:
            writer.close()

    def commit(self) -> list[Path]:
        """Close both files and move them into place."""
        self._close()
        self._stack.close()
        return self.paths

    def abort(self) -> None:
        """Close and remove the temporaries (the files in place are left as they were)."""
        with contextlib.suppress(Exception):
            self._close()
        self._stack.__exit__(RuntimeError, RuntimeError("aborted"), None)


def write_run_dataset(run: ResultRun, out: str | Path) -> list[Path]:
    """Write (or keep, when built from the same replay keys) one run directory's files."""
    meta = _metadata(run)
    if is_current(out, run.directory.name, meta):
        return []
    writer = DatasetWriter(out, run.directory.name, meta)
    try:
        for iterations, gpus in policy_tables(run):
            writer.add(iterations, gpus)
    except BaseException:
        writer.abort()
        raise
    return writer.commit()


def run_frames(run: ResultRun) -> tuple[pa.Table, pa.Table]:
    """One run directory's (iterations, gpus) tables, built in memory from its replays
    (results written before the dataset existed have no dataset files)."""
    parts = list(policy_tables(run))
    if not parts:
        return ITERATIONS_SCHEMA.empty_table(), GPUS_SCHEMA.empty_table()
    return pa.concat_tables([p[0] for p in parts]), pa.concat_tables([p[1] for p in parts])
