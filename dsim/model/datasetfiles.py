"""Where a run directory's tidy dataset files are, what they were built from, and one
policy's rows read back from them as the wide replay table (docs/SPEC.md §7.1, §7.6).

Why this is its own module: since results format 2 the dataset files are the stored
copy of the replayed numbers, and a replay file is a *stub* (its metadata, zero rows)
once they are in place. ``dsim.model.results`` (the readers) therefore reads the
dataset, and ``dsim.model.dataset`` (the writer) builds on ``results``; both import
the layout from here, which imports neither.

Each policy's rows start a row group of their own in both files (``DatasetWriter``
writes each policy with its own ``write_table``), so a policy is found from the row
groups' ``fetch_align``/``start_align`` statistics and no other policy is decoded.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dsim.errors import InputError
from dsim.io import parquetio
from dsim.model.columns import METRIC_COLUMNS, gpu_stall_column

DATASET_DIR = "dataset"
ITERATIONS = "iterations"
GPUS = "gpus"
TABLES = (ITERATIONS, GPUS)


def dataset_path(out: str | Path, table: str, directory: str) -> Path:
    """``<out>/dataset/<table>/<directory>.parquet`` (``table``: iterations or gpus)."""
    return Path(out) / DATASET_DIR / table / f"{directory}.parquet"


#: ``built_from``'s answers, by path, with the file's identity when they were read.
_BUILT_FROM: dict[Path, tuple[tuple[int, ...], dict[str, Any] | None]] = {}
_BUILT_FROM_MAX = 4096


def built_from(path: Path) -> dict[str, Any] | None:
    """The ``dsim`` metadata of an existing dataset file, or ``None`` if it is absent or
    unreadable (footer only: no page is decoded).

    Remembered per path while the file is the same file (device, inode, size, mtime):
    a summary asks for each run's files once per policy and stub (``holds``), ~56 footer
    reads a run, 2 s of a cached ``dsim run`` of 100 runs. Dataset files are replaced
    whole by a rename, which gives the path another inode and change time, so a rewrite
    is not mistaken for the file remembered.
    """
    try:
        st = path.stat()
    except OSError:
        return None
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _BUILT_FROM.get(path)
    if known is not None and known[0] == identity:
        return known[1]
    try:
        raw = (pq.read_schema(path).metadata or {}).get(b"dsim")
        meta = json.loads(raw) if raw else None
    except (OSError, pa.ArrowException, ValueError, RecursionError):
        return None
    meta = meta if isinstance(meta, dict) else None
    if len(_BUILT_FROM) >= _BUILT_FROM_MAX:
        _BUILT_FROM.clear()
    _BUILT_FROM[path] = (identity, meta)
    return meta


def modified_ns(out: str | Path, directory: str) -> list[int]:
    """The modification times (ns) of the dataset files of ``directory`` that exist: set
    against the run's memo, they say whether a file changed since dsim wrote it."""
    found = []
    for table in TABLES:
        try:
            found.append(dataset_path(out, table, directory).stat().st_mtime_ns)
        except OSError:
            continue
    return found


def intact(out: str | Path, directory: str) -> bool:
    """Whether both dataset files of ``directory`` (those present) decode whole with every
    page checksum verified: one record batch at a time, so memory stays a batch's.

    Why: the replay files are stubs and the numbers live only here; a file damaged
    after dsim wrote it was reported by nothing until a reader decoded its pages.
    """
    for table in TABLES:
        path = dataset_path(out, table, directory)
        if not path.exists():
            continue
        try:
            with pq.ParquetFile(path, page_checksum_verification=True) as handle:
                for _ in handle.iter_batches(batch_size=1 << 16):
                    pass
        except (OSError, pa.ArrowException, ValueError):
            return False
    return True


def holds(out: str | Path, directory: str, label: str, key: str) -> bool:
    """Whether both dataset files of ``directory`` hold the rows of replay ``key`` of
    policy ``label`` (their ``policies`` list it): a stub is usable only then."""
    for table in TABLES:
        meta = built_from(dataset_path(out, table, directory))
        policies = meta.get("policies") if meta is not None else None
        if not isinstance(policies, dict) or policies.get(label) != key:
            return False
    return True


def _policy_groups(meta: pq.FileMetaData, policy: tuple[str, str]) -> tuple[list[int], bool]:
    """The row groups that may hold ``policy``'s rows, and whether every one of them holds
    only that policy (then no row needs filtering). A row group without statistics is
    read and filtered."""
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    where = [names.index("fetch_align"), names.index("start_align")]
    groups: list[int] = []
    pure = True
    for g in range(meta.num_row_groups):
        row_group = meta.row_group(g)
        if row_group.num_rows == 0:
            continue
        inside, only = True, True
        for column, value in zip(where, policy, strict=True):
            stats = row_group.column(column).statistics
            if stats is None or not stats.has_min_max:
                only = False
                continue
            if not (stats.min <= value <= stats.max):
                inside = False
            elif stats.min != stats.max:
                only = False
        if inside:
            groups.append(g)
            pure = pure and only
    return groups, pure


#: A dataset file of at most this many rows is read whole, once, when one of its policies
#: is asked for, and its other policies are cut from that read (``_whole``): a summary
#: asks for each of a run's nine policies in turn, and nine reads of one row group each
#: took 5.7 ms on a 10,000 x 8 run's ``iterations`` file against 2.6 for one read of all
#: of it. Kept per thread: the last file of each of the two tables (~12 MB of columns
#: each at most), until that thread reads another run's.
WHOLE_FILE_ROWS = 1 << 18

_LAST = threading.local()  # per thread: table name -> (path, footer, columns, rows read)


def _whole(path: Path, meta: pq.FileMetaData, columns: list[str]) -> pa.Table:
    """``columns`` of every row of ``path`` (``meta``: its footer, ``parquetio.footer``'s,
    which is the same object while the file is the same file), read once per thread
    while it is the last file of its table (``iterations`` or ``gpus``) read whole."""
    kept = getattr(_LAST, "files", None)
    if kept is None:
        kept = _LAST.files = {}
    table = path.parent.name
    last = kept.pop(table, None)  # the previous file's columns go before this one's come
    if last is not None and last[0] == path and last[1] is meta and last[2] == columns:
        kept[table] = last
        return last[3]
    del last
    handle = pq.ParquetFile(path, metadata=meta, page_checksum_verification=True)
    rows = handle.read(columns=columns)
    kept[table] = (path, meta, list(columns), rows)
    return rows


def _groups_of(whole: pa.Table, meta: pq.FileMetaData, groups: list[int]) -> pa.Table:
    """The rows of row groups ``groups`` (ascending) of a table read whole from ``meta``'s file."""
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    starts = np.concatenate(([0], np.cumsum(sizes)))
    parts = [whole.slice(int(starts[g]), sizes[g]) for g in groups]
    return pa.concat_tables(parts) if len(parts) != 1 else parts[0]


def _policy_rows(path: Path, policy: tuple[str, str], columns: list[str], remedy: str) -> pa.Table:
    """``columns`` of ``policy``'s rows of one dataset file, page checksums verified."""
    try:
        meta = parquetio.footer(path)
        groups, pure = _policy_groups(meta, policy)
        if pure and groups and meta.num_rows <= WHOLE_FILE_ROWS:
            try:
                return _groups_of(_whole(path, meta, columns), meta, groups)
            except (OSError, pa.ArrowException):
                pass  # a damaged page: read this policy's groups alone, as below, so that
                # only the policy whose rows are damaged is refused (by name, below)
        handle = pq.ParquetFile(path, metadata=meta, page_checksum_verification=True)
        wanted = columns if pure else [*columns, "fetch_align", "start_align"]
        table = handle.read_row_groups(groups, columns=wanted)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise parquetio.unreadable(exc, path, remedy) from exc
    if not pure:
        fetch = np.asarray(table.column("fetch_align").to_pylist(), dtype=object)
        start = np.asarray(table.column("start_align").to_pylist(), dtype=object)
        table = table.filter(pa.array((fetch == policy[0]) & (start == policy[1])))
    return table.select(columns)


def read_policy(
    out: str | Path,
    directory: str,
    policy: tuple[str, str],
    ranks: tuple[int, ...],
    *,
    gpus: bool = True,
    remedy: str,
) -> pa.Table:
    """One policy's replay table, wide as the replay file held it before it became a stub:
    ``epoch``, ``iteration``, the metrics, then ``stall_s_gpu<rank>`` per rank (only
    when ``gpus``), from ``dataset/iterations`` and ``dataset/gpus``.

    The gpus rows are iteration-major, then rank (§7.6), so they pivot back by a
    reshape; ``ranks`` (``result.json``'s) names the ranks of a replay without rows.
    Rows that do not tile as ``iterations × ranks`` are refused (``InputError``).
    """
    it_path = dataset_path(out, ITERATIONS, directory)
    rows = _policy_rows(it_path, policy, ["epoch", "iteration", *METRIC_COLUMNS], remedy)
    # the replay table's own schema (nullable fields, as ``replay_table`` builds it)
    columns: dict[str, Any] = {name: rows.column(name) for name in rows.column_names}
    if gpus:
        n = rows.num_rows
        gpu_path = dataset_path(out, GPUS, directory)
        long = _policy_rows(gpu_path, policy, ["gpu", "stall_s"], remedy)
        rank = long.column("gpu").to_numpy()
        g = len(rank) // n if n else len(ranks)
        order = rank[:g] if n else np.asarray(ranks, dtype=np.int32)
        if len(rank) != n * g or (n and not np.array_equal(rank, np.tile(order, n))):
            raise InputError(
                f"its rows of policy {policy[0]}/{policy[1]} ({len(rank)}) are not "
                f"{n} iterations × the same ranks; {remedy}",
                gpu_path,
            )
        stall = long.column("stall_s").to_numpy().reshape(n, g)
        for j, gpu in enumerate(order):
            columns[gpu_stall_column(int(gpu))] = pa.array(stall[:, j], pa.float64())
    return pa.table(columns)
