"""From the raw logs of one run to its tables (DESIGN.md §1 and §2).

The grammar (``dsim.grammar``) finds records line by line; this module
applies the rules that need the whole run: the rank of per-rank files
without ``GPU:`` fields, duplicated records, clocks that go backwards, the
epoch of every fetch, and the parse report. It returns tables and rejects;
writing them is the caller's business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from dsim import grammar
from dsim.discover import RunSource, rank_from_file_name
from dsim.epochs import assign_fetch_epochs, lexsort_order
from dsim.errors import InputError
from dsim.logfile import FileRecords, read_log
from dsim.runname import parse_run_name
from dsim.tables import FETCH_SCHEMA, TRAIN_SCHEMA, RunTables

NO_RANK = "no GPU rank (line has no 'GPU:' and file name has no rank<N>)"
DUPLICATE_FETCH = "duplicate fetch record"
DUPLICATE_TRAIN = "duplicate training record"
CLOCK_BACKWARDS = "clock went backwards"


@dataclass
class ParsedRun:
    """A parsed run, its rejected lines (file, line, reason, text) and its report."""

    tables: RunTables
    rejects: pa.Table
    report: dict[str, Any]


def _default_rank(files: tuple, path) -> int | None:
    from_name = rank_from_file_name(path)
    if from_name is not None:
        return from_name
    return 0 if len(files) == 1 else None


def _collect(source: RunSource, progress: Callable[[int], None] | None):
    """Read every file; fill in missing ranks; stack the records of all files.

    Rows stay in file order (files in ``source.files`` order, lines ascending):
    that order breaks ties later, so no per-row order key is kept. Each row
    carries the index of its file, in the narrowest integer type that holds it.
    """
    fetch_parts, train_parts, reject_parts = [], [], []
    file_dtype = np.min_scalar_type(max(len(source.files) - 1, 0))
    counts: dict[str, int] = {}
    sources = []
    for index, path in enumerate(source.files):
        records: FileRecords = read_log(path, progress)
        sources.append({"path": str(path), "size": records.size, "sha256": records.sha256})
        for key, value in records.counts.items():
            counts[key] = counts.get(key, 0) + value
        default = _default_rank(source.files, path)
        for part, out in ((records.fetch, fetch_parts), (records.train, train_parts)):
            missing = part["gpu"] < 0
            if missing.any():
                if default is None:
                    rows = np.flatnonzero(missing)
                    records.rejects.add(
                        part["line"][rows], NO_RANK, pa.array([""] * len(rows), pa.large_string())
                    )
                    part = {k: v[~missing] for k, v in part.items()}
                else:
                    part["gpu"] = np.where(missing, default, part["gpu"])
            part["file"] = np.full(len(part["line"]), index, dtype=file_dtype)
            out.append(part)
        rejected = records.rejects.table()
        reject_parts.append(
            rejected.append_column("file", pa.array([str(path)] * rejected.num_rows, pa.string()))
        )
    fetch, train = _join(fetch_parts), _join(train_parts)
    return fetch, train, reject_parts, counts, sources


def _join(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The records of all files, column by column, freeing each file's copy as it goes."""
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p.pop(k) for p in parts]) for k in list(parts[0])}


def _drop(columns: dict[str, np.ndarray], bad: np.ndarray) -> dict[str, np.ndarray]:
    if not bad.any():
        return columns
    return {k: v[~bad] for k, v in columns.items()}


def _group_starts(sort: np.ndarray, keys: list[np.ndarray]) -> np.ndarray:
    """In ``sort`` order: True where a row's ``keys`` differ from the row before (a new group)."""
    new = np.zeros(len(sort), dtype=bool)
    if len(sort):
        new[0] = True
        for key in keys:
            k = key[sort]
            new[1:] |= k[1:] != k[:-1]
    return new


def _duplicates(columns: dict[str, np.ndarray], keys: list[str]) -> np.ndarray:
    """Rows repeating an earlier row's ``keys`` (earlier in file order).

    Repeats are rare, so a 64-bit hash of the keys and one sort of those
    plain integers rule almost every row out; only rows whose hash repeats
    get the exact comparison.
    """
    dup = np.zeros(len(columns["line"]), dtype=bool)
    hashed = _hash([columns[k] for k in keys])
    ordered = np.sort(hashed)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if len(repeated) == 0:
        return dup
    rows = np.flatnonzero(np.isin(hashed, repeated))
    dup[rows] = _exact_duplicates({k: columns[k][rows] for k in keys}, rows, keys)
    return dup


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _hash(values: list[np.ndarray]) -> np.ndarray:
    """A 64-bit hash per row; equal rows hash alike (``-0.0`` is made ``0.0`` first)."""
    h = np.zeros(len(values[0]), dtype=np.uint64)
    for v in values:
        bits = (v + 0.0).view(np.uint64) if v.dtype.kind == "f" else v.astype(np.uint64)
        h ^= bits
        h *= _MIX
        h ^= h >> np.uint64(29)
    return h


def _exact_duplicates(
    columns: dict[str, np.ndarray], rows: np.ndarray, keys: list[str]
) -> np.ndarray:
    """Rows repeating an earlier row's ``keys``; ``rows`` (ascending) is their file order."""
    values = [columns[k] for k in keys]
    sort = np.lexsort((rows, *reversed(values)))
    dup = np.empty(len(sort), dtype=bool)
    dup[sort] = ~_group_starts(sort, values)
    return dup


def _backwards(columns: dict[str, np.ndarray], groups: list[str], by: str, time: str) -> np.ndarray:
    """Rows whose clock reads earlier than a row before them (by ``by``) in the same group.

    A running maximum per group is one ``maximum.accumulate`` once every group
    lives in its own band of values: the time since the earliest one plus group
    number times the time span (or, were that to overflow, the time's rank plus
    group number times the row count; ties are not "backwards" either way).
    """
    n = len(columns[time])
    if n == 0:
        return np.zeros(0, dtype=bool)
    values = [columns[g] for g in groups]
    sort = lexsort_order([*values, columns[by]])
    group = np.cumsum(_group_starts(sort, values)) - 1
    t = columns[time][sort]
    lo = int(t.min())
    span = int(t.max()) - lo + 1
    if (int(group[-1]) + 1) * span < 1 << 62:
        key = group.astype(np.int64) * span + (t - lo)
    else:
        _, rank = np.unique(t, return_inverse=True)
        key = group.astype(np.int64) * n + rank.reshape(-1)
    back = np.empty(n, dtype=bool)
    back[sort] = key < np.maximum.accumulate(key)
    return back


def _reject_rows(columns, bad, reason, files, reject_parts) -> None:
    if not bad.any():
        return
    rows = np.flatnonzero(bad)
    reject_parts.append(
        pa.table(
            {
                "line": columns["line"][rows],
                "reason": pa.array([reason] * len(rows), pa.string()),
                "text": pa.array([""] * len(rows), pa.large_string()),
                "file": pa.array([str(files[i]) for i in columns["file"][rows]], pa.string()),
            }
        )
    )


def parse_run(
    source: RunSource, *, strict: bool = False, progress: Callable[[int], None] | None = None
) -> ParsedRun:
    """Parse one run. With ``strict``, the first rejected line raises ``InputError``."""
    fetch, train, reject_parts, counts, sources = _collect(source, progress)
    files = source.files

    # Duplicates first, so that they neither trip the clock check nor shift epoch ordinals.
    bad = _duplicates(train, ["gpu", "epoch", "iteration"])
    _reject_rows(train, bad, DUPLICATE_TRAIN, files, reject_parts)
    train = _drop(train, bad)
    bad = _duplicates(fetch, ["gpu", "worker", "idx", "end", "fetch_s"])
    _reject_rows(fetch, bad, DUPLICATE_FETCH, files, reject_parts)
    fetch = _drop(fetch, bad)

    # A worker writes its lines in time order; an iteration starts after the one before it.
    bad = _backwards(fetch, ["file", "gpu", "worker"], "line", "end")
    _reject_rows(fetch, bad, CLOCK_BACKWARDS, files, reject_parts)
    fetch = _drop(fetch, bad)
    bad = _backwards(train, ["gpu", "epoch"], "iteration", "start")
    _reject_rows(train, bad, CLOCK_BACKWARDS, files, reject_parts)
    train = _drop(train, bad)

    rejects = _rejects_table(reject_parts)
    if strict and rejects.num_rows:
        first = rejects.slice(0, 1).to_pylist()[0]
        text = f": {first['text']!r}" if first["text"] else ""
        raise InputError(f"{first['reason']}{text}", first["file"], first["line"])

    # Rows are in file order, so no order keys are passed (``None``) to break ties.
    fetch["epoch"], _matched = assign_fetch_epochs(
        fetch["gpu"], fetch["idx"], fetch["end"], None,
        train["gpu"], train["iteration"], train["start"], None, train["epoch"],
    )  # fmt: skip
    # The records go as their tables come (each column freed once copied into its
    # table): peak memory stays near the tables.
    fetch_table = _fetch_table(fetch)
    del fetch, _matched
    kept = {k: train[k] for k in ("epoch", "total")}
    train_table = _train_table(train)
    train = kept
    if fetch_table.num_rows == 0 and train_table.num_rows == 0:
        raise InputError(
            f"no fetch or training records found ({_describe(counts, rejects)})",
            files[0] if len(files) == 1 else files[0].parent,
        )
    report = _report(counts, rejects, fetch_table, train_table)
    info = _info(source, train, fetch_table, train_table, sources, report)
    return ParsedRun(RunTables(source.name, fetch_table, train_table, info), rejects, report)


def _rejects_table(parts: list[pa.Table]) -> pa.Table:
    schema = pa.schema(
        [
            ("file", pa.string()),
            ("line", pa.int64()),
            ("reason", pa.string()),
            ("text", pa.large_string()),
        ]
    )
    tables = [t.select(schema.names).cast(schema) for t in parts if t.num_rows]
    if not tables:
        return schema.empty_table()
    order = {str(p): i for i, p in enumerate(dict.fromkeys(t["file"][0].as_py() for t in tables))}
    table = pa.concat_tables(tables)
    file_rank = np.array([order[f] for f in table["file"].to_pylist()])
    sort = np.lexsort((table["line"].to_numpy(), file_rank))
    return table.take(sort)


def _fetch_table(fetch: dict[str, np.ndarray]) -> pa.Table:
    """The fetch table from the records (and their ``epoch``), emptying ``fetch`` as it goes.

    Each record column is dropped once its sorted copy is made, and the copies
    become Arrow columns without another copy, so the records turn into the
    table instead of living beside it.
    """
    sort = lexsort_order([fetch["epoch"], fetch["idx"], fetch["gpu"]])
    columns = {k: fetch.pop(k)[sort] for k in ("epoch", "idx", "gpu", "worker", "end", "fetch_s")}
    fetch.clear()
    start = columns["fetch_s"] * 1e9
    np.round(start, out=start)
    start = np.subtract(columns["end"], start.astype(np.int64))
    return pa.table(
        {
            "epoch": pa.array(columns.pop("epoch"), pa.int32()),
            "iteration": pa.array(columns.pop("idx"), pa.int32()),
            "gpu": pa.array(columns.pop("gpu"), pa.int32()),
            "worker": pa.array(columns.pop("worker"), pa.int32()),
            "start": pa.array(start.view("datetime64[ns]")),
            "end": pa.array(columns.pop("end").view("datetime64[ns]")),
            "fetch_s": pa.array(columns.pop("fetch_s"), pa.float64()),
        },
        schema=FETCH_SCHEMA,
    )


def _train_table(train: dict[str, np.ndarray]) -> pa.Table:
    """The training table from the records, emptying ``train`` as it goes (see ``_fetch_table``)."""
    sort = lexsort_order([train["epoch"], train["iteration"], train["gpu"]])
    keys = ("epoch", "iteration", "gpu", "start", "iteration_s", "stall_s", "throughput")
    columns = {k: train.pop(k)[sort] for k in keys}
    train.clear()
    return pa.table(
        {
            "epoch": pa.array(columns.pop("epoch"), pa.int32()),
            "iteration": pa.array(columns.pop("iteration"), pa.int32()),
            "gpu": pa.array(columns.pop("gpu"), pa.int32()),
            "start": pa.array(columns.pop("start").view("datetime64[ns]")),
            "iteration_s": pa.array(columns.pop("iteration_s"), pa.float64()),
            "stall_s": pa.array(columns.pop("stall_s"), pa.float64()),
            "throughput": pa.array(columns.pop("throughput"), pa.float64(), from_pandas=True),
        },
        schema=TRAIN_SCHEMA,
    )


def _gpus_per_iteration(table: pa.Table) -> pd.Series:
    """Distinct ranks per (epoch, iteration), sorted by both: a ``groupby(...).nunique()``."""
    epoch, iteration, gpu = (table[c].to_numpy() for c in ("epoch", "iteration", "gpu"))
    sort = lexsort_order([epoch, iteration, gpu])
    keys = [epoch, iteration]
    distinct = _group_starts(sort, [*keys, gpu])
    first = _group_starts(sort, keys)
    count = np.add.reduceat(distinct, np.flatnonzero(first)) if len(sort) else np.zeros(0, int)
    rows = sort[first]
    index = pd.MultiIndex.from_arrays([epoch[rows], iteration[rows]], names=["epoch", "iteration"])
    return pd.Series(count.astype(np.int64), index=index, name="gpu")


def _distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of small non-negative integers (ranks, epochs) by counting, without a sort."""
    if len(values) and values.min() >= 0 and values.max() < 1 << 20:
        return np.flatnonzero(np.bincount(values))
    return np.unique(values)


def _gpu_ids(fetch: pa.Table, train: pa.Table) -> list[int]:
    both = np.concatenate([fetch["gpu"].to_numpy(), train["gpu"].to_numpy()])
    return [int(g) for g in _distinct(both)]


def _incomplete_iterations(fetch: pa.Table, train: pa.Table, gpus: int) -> dict[str, Any]:
    """Iterations that some rank lacks a fetch or a training record for (dropped from replays)."""
    per = [
        _gpus_per_iteration(table).rename(kind)
        for table, kind in ((fetch, "fetch"), (train, "train"))
    ]
    both = pd.concat(per, axis=1).fillna(0)
    incomplete = both[(both["fetch"] < gpus) | (both["train"] < gpus)]
    examples = [
        {
            "epoch": int(e),
            "iteration": int(i),
            "fetch_gpus": int(r.fetch),
            "train_gpus": int(r.train),
        }
        for (e, i), r in incomplete.head(5).iterrows()
    ]
    return {"count": len(incomplete), "examples": examples}


def _report(counts, rejects: pa.Table, fetch: pa.Table, train: pa.Table) -> dict[str, Any]:
    reasons = rejects["reason"].to_pylist()
    skipped = {reason: reasons.count(reason) for reason in dict.fromkeys(reasons)}
    gpu_ids = _gpu_ids(fetch, train)
    report: dict[str, Any] = {
        "lines": counts.get("lines", 0),
        "fetch_records": fetch.num_rows,
        "train_records": train.num_rows,
        "start_fetch_lines": counts.get("start_fetch_lines", 0),
        "blank_lines": counts.get("blank_lines", 0),
        "other_lines": counts.get("other_lines", 0),
        "rejected": rejects.num_rows,
        "skipped": skipped,
        "incomplete_iterations": _incomplete_iterations(fetch, train, len(gpu_ids)),
    }
    if gpu_ids and gpu_ids != list(range(len(gpu_ids))):
        report["warnings"] = [f"GPU ranks {gpu_ids} are not 0..{len(gpu_ids) - 1}"]
    return report


def _describe(counts: dict[str, int], rejects: pa.Table) -> str:
    lines = counts.get("lines", 0)
    if lines == 0:
        return "the input is empty"
    return (
        f"{lines} lines read: {rejects.num_rows} rejected, "
        f"{counts.get('other_lines', 0)} unrecognised, {counts.get('blank_lines', 0)} blank"
    )


def _info(source, train, fetch_table, train_table, sources, report) -> dict[str, Any]:
    gpu_ids = _gpu_ids(fetch_table, train_table)
    both = [fetch_table["epoch"].to_numpy(), train_table["epoch"].to_numpy()]
    epochs = [int(e) for e in _distinct(np.concatenate(both))]
    per_epoch: dict[str, int] = {}
    for e in epochs:
        declared = train["total"][train["epoch"] == e]
        if len(declared):
            values, freq = np.unique(declared, return_counts=True)
            per_epoch[str(e)] = int(values[np.argmax(freq)])
        else:
            mask = fetch_table["epoch"].to_numpy() == e
            per_epoch[str(e)] = len(np.unique(fetch_table["iteration"].to_numpy()[mask]))
    return {
        "name": source.name,
        "gpus": len(gpu_ids),
        "gpu_ids": gpu_ids,
        "epochs": epochs,
        "iterations_per_epoch": per_epoch,
        "metadata": parse_run_name(source.name),
        "sources": sources,
        "report": report,
    }


__all__ = ["ParsedRun", "grammar", "parse_run"]
