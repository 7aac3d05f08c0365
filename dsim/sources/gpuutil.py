"""GPU utilisation logs (``nvidia-smi --query-gpu=... --format=csv -lms N``) beside a run's logs.

Utilisation says whether a stall left the GPU idle or only delayed the
loop: users ask for it next to the stall timeline. nvidia-smi prints local
wall-clock time without a zone, like the training logs, so both are kept
as naive wall-clock times on one axis and aligned by time alone. The files
are small (one row per GPU and sample), so they are read with the standard
library's ``csv`` line by line: every bad row is rejected with its line,
like a bad log line (docs/SPEC.md §1.9).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsim.errors import InputError
from dsim.io import compression
from dsim.io.arrowtables import empty_table
from dsim.model.tables import RunTables
from dsim.sources.base import ParsedRun
from dsim.sources.rawlog.logfile import MAX_LINE_BYTES
from dsim.sources.rawlog.rejects import SCHEMA as REJECT_SCHEMA
from dsim.sources.rawlog.rejects import TEXT_CHARS

UTIL_SCHEMA = pa.schema(
    [
        pa.field("time", pa.timestamp("ns"), nullable=False),
        pa.field("gpu", pa.int32(), nullable=False),
        pa.field("util_pct", pa.float64(), nullable=False),
        pa.field("memory_used_mib", pa.float64(), nullable=True),
    ]
)
UTIL_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.xz", ".csv.zst")
_HEAD_BYTES = 4096
_TIMESTAMP = re.compile(
    r"^\s*(\d{4})[/-](\d{2})[/-](\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*$"
)
_NUMBER = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*(%|MiB)?\s*$")
_NOT_REPORTED = re.compile(r"^\s*\[(N/A|Not Supported|Unknown Error|GPU is lost)\]\s*$", re.I)


@dataclass(frozen=True)
class UtilLog:
    """One utilisation file read: its samples, its rejected rows and where it came from."""

    samples: pa.Table
    rejects: pa.Table
    source: dict[str, Any]
    rows: int


def _column(header: list[str], name: str) -> int | None:
    """Index of ``name`` in nvidia-smi's header (``utilization.gpu [%]``), units ignored."""
    for i, field in enumerate(header):
        if field.split("[")[0].strip().lower() == name:
            return i
    return None


def _header(line: str) -> list[str] | None:
    fields = next(csv.reader([line]), [])
    has = {f.split("[")[0].strip().lower() for f in fields}
    return fields if {"timestamp", "index", "utilization.gpu"} <= has else None


def is_util_log(path: Path) -> bool:
    """Whether ``path`` starts with nvidia-smi's CSV header (name and compression aside)."""
    if not path.name.lower().endswith(UTIL_SUFFIXES) or not path.is_file():
        return False
    try:
        with compression.open_text(path) as handle:
            head = handle.read(_HEAD_BYTES)
    except (OSError, compression.StreamError):
        return False
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace").strip("\r\ufeff")
    return _header(first) is not None


def _seconds(match: re.Match[str]) -> int | None:
    """Nanoseconds since 1970 of a naive civil time, or ``None`` if no such time exists."""
    from dsim.sources.rawlog.wallclock import civil

    year, month, day, hour, minute, second = (np.array([int(g)]) for g in match.groups()[:6])
    seconds, valid = civil(year, month, day, hour, minute, second)
    if not valid[0]:
        return None
    fraction = (match.group(7) or "0").ljust(9, "0")
    return int(seconds[0]) * 1_000_000_000 + int(fraction)


def _value(text: str, name: str, low: float, high: float | None) -> tuple[float | None, str | None]:
    if _NOT_REPORTED.match(text):
        return None, f"{name} not reported ({text.strip()})"
    match = _NUMBER.match(text)
    if match is None:
        return None, f"non-numeric {name}"
    value = float(match.group(1))
    if value < low or (high is not None and value > high):
        bound = f"{low:g}–{high:g}" if high is not None else f"≥ {low:g}"
        return None, f"{name} out of range ({bound})"
    return value, None


def _text_lines(path: Path, max_line: int) -> list[str]:
    """The lines of a file (``str.splitlines`` of its text), read a line at a time, so that
    a line longer than ``max_line`` bytes is an error naming it before it is held whole."""
    lines: list[str] = []
    number = 0
    with compression.open_text(path) as handle:
        while raw := handle.readline(max_line + 1):
            number += 1
            if len(raw) > max_line and not raw.endswith(b"\n"):
                raise InputError(f"line longer than {max_line} bytes", path, number)
            lines += raw.decode("utf-8", errors="replace").splitlines()
    return lines


def read_util_log(path: Path, max_line: int = MAX_LINE_BYTES) -> UtilLog:
    """Samples and rejected rows of one nvidia-smi CSV file (header required).

    Memory follows the rows; a line longer than ``max_line`` bytes is an ``InputError``.
    """
    try:
        identity = compression.identify(path)
        lines = _text_lines(path, max_line)
    except compression.StreamError as exc:
        raise InputError(f"cannot read: {exc}", path) from None
    except MemoryError:
        raise InputError("out of memory reading this file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    header = _header(lines[0].lstrip("\ufeff")) if lines else None
    if header is None:
        raise InputError(
            "not an nvidia-smi CSV log (no header with timestamp, index, utilization.gpu)", path
        )
    cols = {n: _column(header, n) for n in ("timestamp", "index", "utilization.gpu", "memory.used")}
    time, gpu, util, memory = [], [], [], []
    bad_lines, bad_reasons, bad_texts = [], [], []

    def reject(number: int, reason: str, line: str) -> None:
        bad_lines.append(number)
        bad_reasons.append(reason)
        bad_texts.append(line[:TEXT_CHARS])

    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = next(csv.reader([line]), [])
        if _header(line) is not None:  # a header repeated (nvidia-smi restarted, files joined)
            continue
        if len(fields) != len(header):
            reject(number, "malformed utilisation row (wrong number of fields)", line)
            continue
        stamp = _TIMESTAMP.match(fields[cols["timestamp"]])
        ns = _seconds(stamp) if stamp else None
        if ns is None:
            reject(number, "invalid timestamp", line)
            continue
        index = fields[cols["index"]].strip()
        if not index.isdigit():
            reject(number, "non-numeric GPU index", line)
            continue
        value, problem = _value(fields[cols["utilization.gpu"]], "utilisation", 0, 100)
        used = None
        if problem is None and cols["memory.used"] is not None:
            used, problem = _value(fields[cols["memory.used"]], "memory used", 0, None)
        if problem is not None:
            reject(number, problem, line)
            continue
        time.append(ns)
        gpu.append(int(index))
        util.append(value)
        memory.append(used)
    samples = pa.table(
        {
            "time": pa.array(np.array(time, dtype="datetime64[ns]"), pa.timestamp("ns")),
            "gpu": pa.array(gpu, pa.int32()),
            "util_pct": pa.array(util, pa.float64()),
            "memory_used_mib": pa.array(memory, pa.float64()),
        },
        schema=UTIL_SCHEMA,
    )
    rejects = pa.table(
        {
            "file": pa.array([str(path)] * len(bad_lines), pa.string()),
            "line": pa.array(bad_lines, pa.int64()),
            "reason": pa.array(bad_reasons, pa.string()),
            "text": pa.array(bad_texts, pa.large_string()),
        },
        schema=REJECT_SCHEMA,
    )
    source = {"path": str(path), **identity, "kind": "gpu_util"}
    return UtilLog(samples, rejects, source, rows=len(lines) - 1)


def _iteration_spans(train: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Begin and end (ns) of each training row's iteration.

    A training line's time is its batch's arrival; the iteration began
    ``stall_s`` earlier (when the batch was requested) and lasted
    ``iteration_s``, the wait included (SPEC §1.2).
    """
    arrival = train["start"].cast(pa.int64()).to_numpy()
    begin = arrival - np.round(train["stall_s"].to_numpy() * 1e9).astype(np.int64)
    return begin, begin + np.round(train["iteration_s"].to_numpy() * 1e9).astype(np.int64)


def epoch_means(samples: pa.Table, train: pa.Table) -> list[dict[str, Any]]:
    """Mean utilisation of each GPU over each epoch's span of its own iterations.

    An epoch's span on a GPU runs from the beginning of its first iteration
    to the end of its last: the part of the timeline the stall tables
    describe. Samples outside every span (start-up, evaluation) do not count.
    """
    if samples.num_rows == 0 or train.num_rows == 0:
        return []
    t_gpu = train["gpu"].to_numpy()
    t_epoch = train["epoch"].to_numpy()
    t_begin, t_end = _iteration_spans(train)
    s_gpu = samples["gpu"].to_numpy()
    s_time = samples["time"].cast(pa.int64()).to_numpy()
    s_util = samples["util_pct"].to_numpy()
    out = []
    for epoch in np.unique(t_epoch):
        for g in np.unique(t_gpu):
            mine = (t_epoch == epoch) & (t_gpu == g)
            if not mine.any():
                continue
            lo, hi = t_begin[mine].min(), t_end[mine].max()
            inside = (s_gpu == g) & (s_time >= lo) & (s_time <= hi)
            n = int(inside.sum())
            out.append(
                {
                    "epoch": int(epoch),
                    "gpu": int(g),
                    "samples": n,
                    "mean_util_pct": round(float(s_util[inside].mean()), 3) if n else None,
                }
            )
    return out


NEAREST_NS = 1_000_000_000  # a sample this close before an iteration's end stands in for it


def iteration_means(samples: pa.Table, train: pa.Table) -> np.ndarray:
    """Per training row, its GPU's mean utilisation during the iteration (NaN if unknown).

    The mean of the GPU's samples within [begin, end] of the iteration;
    an iteration shorter than the sampling interval holds none, and then the
    last sample before its end stands in, if it is at most 1 s old.
    """
    out = np.full(train.num_rows, np.nan)
    if samples.num_rows == 0 or train.num_rows == 0:
        return out
    t_gpu = train["gpu"].to_numpy()
    t_begin, t_end = _iteration_spans(train)
    s_gpu = samples["gpu"].to_numpy()
    s_time = samples["time"].cast(pa.int64()).to_numpy()
    s_util = samples["util_pct"].to_numpy()
    for g in np.unique(t_gpu):
        rows = np.flatnonzero(t_gpu == g)
        mine = s_gpu == g
        if not mine.any():
            continue
        order = np.argsort(s_time[mine], kind="stable")
        time, util = s_time[mine][order], s_util[mine][order]
        total = np.concatenate([[0.0], np.cumsum(util)])
        lo = np.searchsorted(time, t_begin[rows], side="left")
        hi = np.searchsorted(time, t_end[rows], side="right")
        count = hi - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = (total[hi] - total[lo]) / count
        last = hi - 1
        near = (count == 0) & (last >= 0)
        near &= t_end[rows] - time[np.maximum(last, 0)] <= NEAREST_NS
        mean[near] = util[last[near]]
        out[rows] = np.where((count > 0) | near, mean, np.nan)
    return out


def summarise(logs: list[UtilLog], train: pa.Table, gpu_ids: list[int]) -> tuple[pa.Table, dict]:
    """All samples of a run, sorted by (gpu, time), and the run.json ``gpu_util`` entry."""
    samples = pa.concat_tables([log.samples for log in logs]) if logs else empty_table(UTIL_SCHEMA)
    samples = samples.take(pc.sort_indices(samples, [("gpu", "ascending"), ("time", "ascending")]))
    seen = sorted({int(g) for g in samples["gpu"].to_pylist()})
    info: dict[str, Any] = {
        "files": [log.source["path"] for log in logs],
        "samples": samples.num_rows,
        "gpus": seen,
        "per_epoch": epoch_means(samples, train),
    }
    warnings = []
    if seen and gpu_ids and not set(gpu_ids) <= set(seen):
        missing = sorted(set(gpu_ids) - set(seen))
        warnings.append(
            f"GPU utilisation: no samples for GPU(s) {missing}; nvidia-smi's index is taken "
            "as the rank (one node)"
        )
    covered = [e for e in info["per_epoch"] if e["samples"]]
    if samples.num_rows and not covered:
        warnings.append(
            "GPU utilisation: no sample falls inside any iteration (are both clocks the same "
            "machine's local time?)"
        )
    if warnings:
        info["warnings"] = warnings
    return samples, info


def attach(
    parsed: ParsedRun,
    paths: tuple[Path, ...],
    strict: bool = False,
    max_line: int = MAX_LINE_BYTES,
) -> ParsedRun:
    """A parsed run with the utilisation logs found beside its logs added.

    Their samples become the run's ``gpu_util`` table, their bad rows join
    the run's rejects (``--strict``: the first one is an error), the files
    join ``sources``, and ``gpu_util`` in run.json holds the per-epoch means.
    """
    if not paths:
        return parsed
    logs = [read_util_log(path, max_line) for path in paths]
    if strict:
        for log in logs:
            if log.rejects.num_rows:
                row = log.rejects.slice(0, 1).to_pylist()[0]
                raise InputError(row["reason"], row["file"], row["line"])
    tables = parsed.tables
    samples, entry = summarise(logs, tables.train, list(tables.info.gpu_ids))
    report = dict(parsed.report)
    bad = [log.rejects for log in logs if log.rejects.num_rows]
    if bad:
        reasons = pa.concat_tables(bad)["reason"].to_pylist()
        skipped = dict(report.get("skipped", {}))
        for reason in reasons:
            skipped[reason] = skipped.get(reason, 0) + 1
        report["skipped"] = skipped
        report["rejected"] = report.get("rejected", 0) + len(reasons)
    if entry.get("warnings"):
        report["warnings"] = [*report.get("warnings", []), *entry.pop("warnings")]
    info = replace(
        tables.info,
        sources=(*tables.info.sources, *(log.source for log in logs)),
        gpu_util=entry,
        report=report,
    )
    rejects = pa.concat_tables(
        [parsed.rejects.cast(REJECT_SCHEMA), *(b.cast(REJECT_SCHEMA) for b in bad)]
    ).combine_chunks()
    new_tables = RunTables(tables.name, tables.fetch, tables.train, info, gpu_util=samples)
    return ParsedRun(new_tables, rejects, report, parsed.lines)


__all__ = [
    "UTIL_SCHEMA",
    "UtilLog",
    "attach",
    "epoch_means",
    "is_util_log",
    "iteration_means",
    "read_util_log",
    "summarise",
]
