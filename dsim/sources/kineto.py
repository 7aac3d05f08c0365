"""PyTorch profiler (Kineto) traces to dsim's train table: reading and table building only.

``torch.profiler`` with ``tensorboard_trace_handler`` writes one Chrome-trace
JSON file per rank (``<worker>.<time>.pt.trace.json[.gz]``). Of the
hundreds of events per training step, dsim needs two kinds of complete
spans (``"ph": "X"``) of the training loop:

* ``ProfilerStep#N``: one step of the loop, from one ``prof.step()`` to the
  next: the iteration (start and duration);
* ``enumerate(DataLoader)#<iterator>.__next__``: the loop waiting for its
  next batch, inside the step: the data wait, dsim's training stall.

A trace holds no fetch records (which worker built which batch, when it
started and how long it took), so the fetch table of a profiled run is
empty; what can be replayed without it is in docs/SPEC.md §1.8.

Reading: traces are often hundreds of MB, and a step's two spans are lost
among hundreds of operator events. The events are streamed one object at a
time with ``ijson`` (its C backend): as fast as loading the whole document
with ``json`` or ``orjson`` and holding one event instead of all of them
(bench/bench_profiler_read.py; numbers in BENCHMARKS.md). The few header
keys dsim needs (``distributedInfo``, ``baseTimeNanoseconds``) are read from
the start of the document, before ``traceEvents``, where Kineto writes them.

Bounds: the bytes go through ``dsim.sources.jsonbounds.BoundedReader`` on their
way to ijson, so a document nested deeper than ``MAX_DEPTH`` levels or holding
a string longer than ``MAX_STRING_BYTES`` is refused (an ``InputError``
naming the file and the byte) before ijson holds it: ijson's memory grows
with the square of the depth and with the longest string.

Bad events are rejected like bad log lines: each with its file, its index
in ``traceEvents`` and a reason; whole-file problems (truncated JSON, no
``traceEvents``, no rank) are one ``InputError`` naming the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dsim.errors import InputError
from dsim.io import compression
from dsim.model.tables import TRAIN_SCHEMA
from dsim.sources import jsonbounds
from dsim.sources.jsonbounds import BoundedReader, JsonBoundError
from dsim.sources.rawlog.bounds import BAD_RANK, MAX_DURATION_S, over_max, rank_ok
from dsim.sources.rawlog.discover import rank_from_file_name

STEP_PREFIX = "ProfilerStep#"
LOADER_PREFIX = "enumerate(DataLoader)#"
LOADER_SUFFIX = "__next__"
TRACE_SUFFIXES = (".pt.trace.json", *(".pt.trace.json" + s for s in compression.SUFFIXES))
JSON_SUFFIXES = (".json", *(".json" + s for s in compression.SUFFIXES))

# Reject reasons (exact texts: tests and users match them).
NO_DUR = "span without dur"
NO_TS = "span without ts"
NEGATIVE_DUR = "span with a negative dur"
BAD_STEP_NAME = "ProfilerStep name without a step number"
STEP_TOO_LARGE = "ProfilerStep number past 2147483647 (the tables' int32 iteration)"
_MAX_STEP = 2**31 - 1
REPEATED_STEP = "repeated profiler step (same number twice on one rank)"
OVERLAPPING_STEP = "overlapping profiler steps (every one rejected)"
NO_LOADER = "profiler step without a DataLoader span"
LOADER_CROSSES = "DataLoader span crosses the end of its step"
OVERLAPPING_LOADER = "overlapping DataLoader spans in one step"
# Whole-file error: a trace without steps has no iterations to replay (a profiler run
# without a schedule, or a trace of something else than a training loop).
OUT_OF_TIME = "profiler step's time outside 1970-2261 (ts or baseTimeNanoseconds)"
#: The latest time the tables hold: int64 nanoseconds since 1970 end in April 2262.
_LAST_NS = float(np.iinfo(np.int64).max) - 1e12
NO_STEPS = "no ProfilerStep#N spans: not a trace of a profiled training loop (prof.step())"

REJECT_SCHEMA = pa.schema(
    [("file", pa.string()), ("event", pa.int64()), ("reason", pa.string()), ("name", pa.string())]
)
_STEP_NUMBER = re.compile(r"ProfilerStep#(\d+)")
_HEADER_KEYS = ("distributedInfo", "baseTimeNanoseconds")
_READ_BYTES = 64 << 10  # ijson's reads (its default size; larger ones read small traces slower)


@dataclass
class RankTrace:
    """What one rank's trace file gave: its spans as arrays, its rejects, its identity.

    ``steps``: ``event`` (index in ``traceEvents``), ``step``, ``ts`` and
    ``dur`` (microseconds, as in the trace). ``loader``: ``event``, ``ts``,
    ``dur``. Only spans with a usable ``ts`` and ``dur`` are here.
    """

    path: Path
    rank: int
    rank_from: str  # "distributedInfo" or "file name"
    world_size: int | None
    base_ns: int | None
    events: int
    steps: dict[str, np.ndarray]
    loader: dict[str, np.ndarray]
    rejects: list[tuple[int, str, str]] = field(default_factory=list)
    # why the file name gave the rank (the warning's words): "no distributedInfo", ...
    rank_note: str = ""


@dataclass
class ProfiledRun:
    """A profiled run's train table (dsim's TRAIN_SCHEMA), its rejects and report."""

    train: pa.Table
    rejects: pa.Table
    report: dict[str, Any]
    sources: list[dict[str, Any]]


def is_trace_name(path: Path) -> bool:
    """``*.pt.trace.json`` (maybe compressed): named like ``tensorboard_trace_handler`` does."""
    return path.name.endswith(TRACE_SUFFIXES)


def find_traces(directory: Path) -> list[Path]:
    """The trace files of a directory: ``*.pt.trace.json[.gz]``, or ``*.json[.gz]`` holding
    ``traceEvents`` (looked for before any event, where Kineto writes it)."""
    found = []
    for path in sorted(directory.iterdir()):
        if not path.is_file():
            continue
        if is_trace_name(path):
            found.append(path)
        elif path.name.endswith(JSON_SUFFIXES):
            try:
                header = _header(path)
            except InputError:
                continue
            if header.get("traceEvents"):
                found.append(path)
    return found


def _ijson():
    import ijson

    return ijson


def _json_error(exc: Exception, path: Path) -> InputError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return InputError(f"truncated or invalid JSON ({text})", path)


def _bounded(path: Path) -> BoundedReader:
    """The text of a trace, checked against the bounds as ijson reads it (the bounds are
    read at each call, so tests may lower them)."""
    return BoundedReader(
        compression.open_text(path), jsonbounds.MAX_DEPTH, jsonbounds.MAX_STRING_BYTES
    )


def _header(path: Path) -> dict[str, Any]:
    """Top-level keys before ``traceEvents`` (and whether it was found): a few KB, not the events.

    Stops at the start of the ``traceEvents`` array; reads the whole document
    only when it has no ``traceEvents``.
    """
    ijson = _ijson()
    out: dict[str, Any] = {}
    try:
        with _bounded(path) as handle:
            events = ijson.parse(handle, use_float=True, buf_size=_READ_BYTES)
            builder = None
            key = None
            for prefix, event, value in events:
                if builder is not None:
                    builder.event(event, value)
                    if prefix == key and event in ("end_map", "end_array"):
                        out[key] = builder.value
                        builder = None
                    continue
                if prefix == "" and event == "map_key":
                    key = value
                    continue
                if prefix == "traceEvents" and event == "start_array":
                    out["traceEvents"] = True
                    break
                if prefix in _HEADER_KEYS and event in ("start_map", "start_array"):
                    builder = ijson.ObjectBuilder()
                    builder.event(event, value)
                elif prefix in _HEADER_KEYS:
                    out[prefix] = value
                elif prefix == "" and event not in ("start_map", "end_map"):
                    raise InputError("not a profiler trace (a JSON object expected)", path)
    except InputError:
        raise
    except JsonBoundError as exc:
        raise InputError(str(exc), path) from None
    except MemoryError:
        raise InputError("out of memory reading this trace", path) from None
    except (compression.StreamError, OSError) as exc:
        raise InputError(f"cannot read: {exc}", path) from None
    except Exception as exc:  # ijson's errors: JSONError, IncompleteJSONError, ...
        if type(exc).__module__.startswith("ijson"):
            raise _json_error(exc, path) from None
        raise
    return out


def _events(path: Path) -> Iterator[Any]:
    """The objects of ``traceEvents``, one at a time."""
    ijson = _ijson()
    with _bounded(path) as handle:
        yield from ijson.items(handle, "traceEvents.item", use_float=True, buf_size=_READ_BYTES)


def _rank(path: Path, header: dict[str, Any]) -> tuple[int, str, int | None, str]:
    """(rank, where it came from, world size, why the file name gave it) of one trace."""
    info = header.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    if isinstance(rank, int) and not isinstance(rank, bool):
        # checked here, before the train table's int32 column (10**12 wrapped to -727379968),
        # and never replaced by the file name's rank: a corrupt rank is not some other rank
        if not rank_ok(rank):
            raise InputError(f"distributedInfo.rank {rank}: {BAD_RANK}", path)
        world = info.get("world_size")
        return rank, "distributedInfo", world if isinstance(world, int) else None, ""
    from_name = rank_from_file_name(Path(path.name.split(".")[0]))
    if from_name is not None:
        if not rank_ok(from_name):
            raise InputError(f"rank {from_name} in the file name: {BAD_RANK}", path)
        note = (
            "no distributedInfo"
            if not isinstance(info, dict)
            else "no distributedInfo.rank"
            if rank is None
            else f"distributedInfo.rank {rank!r} is not an integer"
        )
        return from_name, "file name", None, note
    raise InputError(
        "no rank: the trace has no distributedInfo.rank and the file name no rank<N> "
        "(name the files rank<N>..., e.g. tensorboard_trace_handler(dir, worker_name='rank0'))",
        path,
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if np.isfinite(value) else None


def read_trace(path: Path) -> RankTrace:
    """Read one rank's trace: its rank, its step and DataLoader spans, rejected spans."""
    header = _header(path)
    if not header.get("traceEvents"):
        raise InputError("no traceEvents: not a profiler trace", path)
    rank, rank_from, world, rank_note = _rank(path, header)
    base = header.get("baseTimeNanoseconds")
    base_ns = int(base) if isinstance(base, int | float) and not isinstance(base, bool) else None
    steps: list[tuple[int, int, float, float]] = []
    loader: list[tuple[int, float, float]] = []
    rejects: list[tuple[int, str, str]] = []
    index = -1
    try:
        for index, event in enumerate(_events(path)):
            if not isinstance(event, dict) or event.get("ph") != "X":
                continue
            name = event.get("name")
            if not isinstance(name, str):
                continue
            is_step = name.startswith(STEP_PREFIX)
            if not is_step and not (
                name.startswith(LOADER_PREFIX) and name.endswith(LOADER_SUFFIX)
            ):
                continue
            ts, dur = _number(event.get("ts")), _number(event.get("dur"))
            reason = (
                NO_TS
                if ts is None
                else NO_DUR
                if dur is None
                else NEGATIVE_DUR
                if dur < 0
                else None
            )
            if reason is None and is_step:
                match = _STEP_NUMBER.fullmatch(name)
                reason = (
                    BAD_STEP_NAME
                    if not match
                    # a longer number would wrap in the int32 iteration column, or not fit int64
                    else STEP_TOO_LARGE
                    if len(match[1].lstrip("0")) > 10 or int(match[1]) > _MAX_STEP
                    else None
                )
            if reason is not None:
                rejects.append((index, reason, name))
            elif is_step:
                steps.append((index, int(match[1]), ts, dur))
            else:
                loader.append((index, ts, dur))
    except InputError:
        raise
    except JsonBoundError as exc:
        raise InputError(str(exc), path) from None
    except MemoryError:
        raise InputError("out of memory reading this trace", path) from None
    except (compression.StreamError, OSError) as exc:
        raise InputError(f"cannot read: {exc}", path) from None
    except Exception as exc:
        if type(exc).__module__.startswith("ijson"):
            raise _json_error(exc, path) from None
        raise
    if not steps and not any(name.startswith(STEP_PREFIX) for _, _, name in rejects):
        raise InputError(NO_STEPS, path)
    return RankTrace(
        path=path,
        rank=rank,
        rank_from=rank_from,
        world_size=world,
        base_ns=base_ns,
        events=index + 1,
        steps=_columns(steps, ("event", "step", "ts", "dur"), (np.int64, np.int64, float, float)),
        loader=_columns(loader, ("event", "ts", "dur"), (np.int64, float, float)),
        rejects=rejects,
        rank_note=rank_note,
    )


def _columns(rows: list[tuple], names: tuple[str, ...], dtypes: tuple) -> dict[str, np.ndarray]:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(names)
    return {n: np.array(c, dtype=d) for n, c, d in zip(names, columns, dtypes, strict=True)}


@dataclass
class _Steps:
    """One rank's kept steps, after the rules across spans."""

    step: np.ndarray
    start_ns: np.ndarray
    iteration_s: np.ndarray
    stall_s: np.ndarray
    several_loader_spans: int
    loader_outside: int


def _rank_steps(trace: RankTrace, max_duration: float = MAX_DURATION_S) -> _Steps:
    """Apply the rules across one rank's spans (order: repeats, overlaps, DataLoader spans).

    Rejected steps go to ``trace.rejects``.
    """
    s = trace.steps
    reject = trace.rejects
    keep = np.ones(len(s["event"]), dtype=bool)
    # A step number twice on one rank: no way to tell which is right, so every copy goes.
    numbers, counts = np.unique(s["step"], return_counts=True)
    for n in numbers[counts > 1]:
        for row in np.flatnonzero(s["step"] == n):
            keep[row] = False
            reject.append((int(s["event"][row]), REPEATED_STEP, f"{STEP_PREFIX}{n}"))
    # Steps follow one another. Two that overlap cannot both be right and nothing says which
    # is wrong (a span too long, or one too early), so both go, like conflicting log records.
    order = np.argsort(s["ts"], kind="stable")
    order = order[keep[order]]
    ends = s["ts"][order] + s["dur"][order]
    reach = np.maximum.accumulate(ends) if len(order) else ends  # the latest end so far
    overlap = np.zeros(len(order), dtype=bool)
    starts = s["ts"][order]
    overlap[1:] = starts[1:] < reach[:-1]  # starts before an earlier step ended
    overlap[:-1] |= ends[:-1] > starts[1:]  # ends after the next step (the earliest later) began
    for row in order[overlap]:
        keep[row] = False
        reject.append((int(s["event"][row]), OVERLAPPING_STEP, f"{STEP_PREFIX}{s['step'][row]}"))
    rows = order[keep[order]]  # kept steps by start time
    ts, end = s["ts"][rows], s["ts"][rows] + s["dur"][rows]

    lo = trace.loader
    at = np.searchsorted(ts, lo["ts"], side="right") - 1  # the step each DataLoader span starts in
    # (every step may have been rejected: then no DataLoader span lies inside one)
    step_end = end[np.maximum(at, 0)] if len(end) else np.zeros(len(at))
    inside = (at >= 0) & (lo["ts"] < np.where(at >= 0, step_end, 0))
    stall = np.zeros(len(rows))
    count = np.zeros(len(rows), dtype=np.int64)
    arrival = np.full(len(rows), np.nan)
    bad: dict[int, str] = {}
    last_loader_end = np.full(len(rows), -np.inf)
    for k in np.argsort(lo["ts"], kind="stable"):
        if not inside[k]:
            continue
        j = int(at[k])
        span_end = lo["ts"][k] + lo["dur"][k]
        if span_end > end[j]:
            bad.setdefault(j, LOADER_CROSSES)
        elif lo["ts"][k] < last_loader_end[j]:
            bad.setdefault(j, OVERLAPPING_LOADER)
        last_loader_end[j] = max(last_loader_end[j], span_end)
        stall[j] += lo["dur"][k]
        count[j] += 1
        arrival[j] = span_end
    # a step longer than --max-duration, or at a time the tables cannot hold (a ts of
    # 1e20 µs wrapped to 1734; a dur of 1e15 µs passed any --max-duration), as raw logs
    base = trace.base_ns or 0
    spanned = count > 0
    too_long = spanned & (s["dur"][rows] / 1e6 > max_duration)
    with np.errstate(invalid="ignore"):
        when = base + arrival * 1000.0  # ns since 1970, as a float: no wrap
        outside = spanned & ~too_long & ~((when >= 0) & (when <= _LAST_NS))
    for j in np.flatnonzero(too_long):
        bad.setdefault(int(j), over_max("profiler step dur", max_duration))
    for j in np.flatnonzero(outside):
        bad.setdefault(int(j), OUT_OF_TIME)
    for j in range(len(rows)):
        reason = bad.get(j, NO_LOADER if count[j] == 0 else None)
        if reason is not None:
            row = rows[j]
            reject.append((int(s["event"][row]), reason, f"{STEP_PREFIX}{s['step'][row]}"))
    good = np.array([j not in bad and count[j] > 0 for j in range(len(rows))], dtype=bool)
    arrival_ns = base + np.round(arrival[good] * 1000).astype(np.int64)
    return _Steps(
        step=s["step"][rows][good],
        start_ns=arrival_ns,
        iteration_s=s["dur"][rows][good] / 1e6,
        stall_s=stall[good] / 1e6,
        several_loader_spans=int((count[good] > 1).sum()),
        loader_outside=int((~inside).sum()),
    )


def build_train(traces: Iterable[RankTrace], max_duration: float = MAX_DURATION_S) -> ProfiledRun:
    """The train table of a profiled run from its ranks' traces (one per rank); steps
    longer than ``max_duration`` seconds are rejected (``--max-duration``)."""
    traces = sorted(traces, key=lambda t: t.rank)
    seen: dict[int, Path] = {}
    for t in traces:
        if t.rank in seen:
            raise InputError(
                f"rank {t.rank} also comes from {seen[t.rank]}: one trace per rank", t.path
            )
        seen[t.rank] = t.path
    parts = {t.rank: _rank_steps(t, max_duration) for t in traces}
    warnings: list[str] = []
    for t in traces:
        if t.rank_from != "distributedInfo":
            warnings.append(f"{t.path.name}: {t.rank_note}; rank {t.rank} from the file name")
        if t.base_ns is None:
            warnings.append(f"{t.path.name}: no baseTimeNanoseconds; start times are relative")
    worlds = {t.world_size for t in traces if t.world_size is not None}
    if len(worlds) > 1 or (worlds and len(traces) != next(iter(worlds))):
        warnings.append(
            f"world size {sorted(worlds)} in distributedInfo, {len(traces)} traces read"
        )
    ranges = {r: (int(p.step.min()), int(p.step.max())) for r, p in parts.items() if len(p.step)}
    if len(set(ranges.values())) > 1:
        shown = ", ".join(f"rank {r}: {a}-{b}" for r, (a, b) in ranges.items())
        warnings.append(
            f"ranks cover different profiler steps ({shown}); replays use the common ones"
        )

    train = _train_table(parts)
    rejects = _rejects_table(traces)
    every = set.intersection(*(set(p.step.tolist()) for p in parts.values())) if parts else set()
    union = set().union(*(set(p.step.tolist()) for p in parts.values())) if parts else set()
    reasons = rejects["reason"].to_pylist()
    report: dict[str, Any] = {
        "events": sum(t.events for t in traces),
        "train_records": train.num_rows,
        "fetch_records": 0,
        "rejected": rejects.num_rows,
        "skipped": {r: reasons.count(r) for r in dict.fromkeys(reasons)},
        "incomplete_iterations": {"count": len(union - every)},
        "steps_with_several_dataloader_spans": sum(p.several_loader_spans for p in parts.values()),
        "dataloader_spans_outside_steps": sum(p.loader_outside for p in parts.values()),
        "rank_from": {str(t.rank): t.rank_from for t in traces},
    }
    if warnings:
        report["warnings"] = warnings
    sources = [
        {"path": str(t.path), **compression.identify(t.path), "rank": t.rank, "events": t.events}
        for t in traces
    ]
    return ProfiledRun(train, rejects, report, sources)


def _train_table(parts: dict[int, _Steps]) -> pa.Table:
    """Rows by (iteration, gpu), like the raw-log parser's train table; epoch is 0 throughout."""
    step = np.concatenate([p.step for p in parts.values()]) if parts else np.zeros(0, np.int64)
    gpu = np.concatenate([np.full(len(p.step), r) for r, p in parts.items()]) if parts else step
    values = {
        c: np.concatenate([getattr(p, c) for p in parts.values()]) if parts else np.zeros(0)
        for c in ("start_ns", "iteration_s", "stall_s")
    }
    order = np.lexsort((gpu, step))
    return pa.table(
        {
            "epoch": pa.array(np.zeros(len(order), np.int32)),
            "iteration": pa.array(step[order].astype(np.int32)),
            "gpu": pa.array(gpu[order].astype(np.int32)),
            "start": pa.array(values["start_ns"][order].astype(np.int64).view("datetime64[ns]")),
            "iteration_s": pa.array(values["iteration_s"][order], pa.float64()),
            "stall_s": pa.array(values["stall_s"][order], pa.float64()),
            "throughput": pa.nulls(len(order), pa.float64()),
        },
        schema=TRAIN_SCHEMA,
    )


def _rejects_table(traces: list[RankTrace]) -> pa.Table:
    rows = sorted(
        (str(t.path), event, reason, name) for t in traces for event, reason, name in t.rejects
    )
    files, events, reasons, names = (
        (list(c) for c in zip(*rows, strict=True)) if rows else ([],) * 4
    )
    return pa.table(
        {"file": files, "event": pa.array(events, pa.int64()), "reason": reasons, "name": names},
        schema=REJECT_SCHEMA,
    )


def read_profiled_run(paths: Iterable[Path], max_duration: float = MAX_DURATION_S) -> ProfiledRun:
    """Read the per-rank trace files of one run (a directory is searched with ``find_traces``)."""
    files: list[Path] = []
    for path in paths:
        path = Path(path)
        files += find_traces(path) if path.is_dir() else [path]
    if not files:
        raise InputError("no profiler traces (*.pt.trace.json[.gz], *.json with traceEvents)")
    return build_train((read_trace(p) for p in files), max_duration)


__all__ = [
    "ProfiledRun",
    "RankTrace",
    "build_train",
    "find_traces",
    "read_profiled_run",
    "read_trace",
]
