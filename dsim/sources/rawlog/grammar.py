"""The raw log grammar of docs/SPEC.md §1, applied to whole blocks of text at once.

Logs of long runs hold millions of lines, so nothing here loops over lines in
Python: a block of bytes becomes one Arrow string array (zero-copy, split at
newlines with NumPy). Lines spelled exactly as below are cut by position in
``dsim.sources.rawlog.fastpath``; every other line goes through the full-line regular
expressions here (RE2, inside Arrow), whose captured fields are cast to typed
NumPy arrays. Both paths give identical records. Lines that look like
records but break the grammar become *rejects* with a reason and their line
number; all other lines are counted and ignored.

A fetch line::

    2021-09-01 19:48:54.841 DEBUG:\tGPU: 0 worker_id: 2, END FETCH at_time 8.11 data idx0

A training line::

    2021-09-01 19:48:55.191641 GPU: 0 Epoch: [1][  0/851]\tTime 9.77 (9.77)\tData 8.59 (8.59)\t...

Both may carry any prefix before the timestamp (``(pid=1) ``, ``[rank0]:``),
tabs or spaces between fields, a fraction of 1 to 9 digits and CRLF ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsim.io.arrowtables import array_of, flags_of, numpy_of, strings_of
from dsim.sources.rawlog import bounds
from dsim.sources.rawlog.fastpath import fast_records
from dsim.sources.rawlog.wallclock import civil_seconds, civil_seconds_arrow

_TS = r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(?P<frac>\d{1,9})"
_NUM = r"[^\s()]+"  # captured loosely, validated by NUMBER below for a precise reason
# A rank is captured as any word, then checked (``_ranks``): a ``GPU: -1`` or a 7-digit
# rank must be rejected, not skipped over as prefix text (which gave the line the file's
# default rank, GPU 0).
_RANK = r"\S+"

FETCH_PATTERN = (
    r"^.*?" + _TS + r"\s.*?(?:GPU:\s*(?P<gpu>" + _RANK + r")\s+)?worker_id:\s*(?P<worker>\d{1,6}),?"
    r"\s+END FETCH\s+at_time\s+(?P<at>" + _NUM + r")\s+data\s+idx(?P<idx>\d{1,9})"
    # A batch of an IterableDataset: its position in its worker's stream (SPEC §1.2)
    r"(?:\s+stream\s+(?P<stream>\d{1,9}))?"
    # dsim >= 0.x appends the batch's CPU seconds and run-queue wait (SPEC §1.1)
    r"(?:\s+cpu\s+(?P<cpu>" + _NUM + r")(?:\s+runq\s+(?P<runq>" + _NUM + r"))?"
    # then the worker process's CPU seconds, every thread, since its previous batch
    r"(?:\s+proc\s+(?P<proc>" + _NUM + r"))?)?"
    # with instrument_loader(stages=True), the stages' wall and CPU seconds (SPEC §1.2)
    r"(?:\s+read\s+(?P<read>" + _NUM + r")\s+read_cpu\s+(?P<read_cpu>" + _NUM + r")"
    r"\s+collate\s+(?P<collate>" + _NUM + r")\s+collate_cpu\s+(?P<collate_cpu>" + _NUM + r"))?"
    r"\s*$"
)
# The fetch record's optional stage columns, in the line's order (SPEC §2.1).
STAGE_FIELDS = ("read", "read_cpu", "collate", "collate_cpu")
TRAIN_PATTERN = (
    r"^.*?"
    + _TS
    + r"\s+(?:GPU:\s*(?P<gpu>"
    + _RANK
    + r")\s+)?Epoch:\s*\[\s*(?P<epoch>\d{1,6})\s*\]"
    r"\[\s*(?P<iteration>\d{1,9})\s*/\s*(?P<total>\d{1,9})\s*\]"
    r"\s+Time\s+(?P<time>" + _NUM + r")\s+\([^)]*\)"
    r"\s+Data\s+(?P<data>" + _NUM + r")\s+\([^)]*\)"
    r"(?:\s+Throughput\s+(?P<throughput>" + _NUM + r")\s+\([^)]*\))?"
    # The training process's CPU seconds and run-queue wait, right after (SPEC §1.2).
    r"(?:\s+CPU\s+(?P<cpu>" + _NUM + r")\s+\([^)]*\)"
    r"(?:\s+Runq\s+(?P<runq>" + _NUM + r")\s+\([^)]*\))?)?"
    # Then nothing, or only whole ``Name value (avg)`` fields (the ImageNet example prints
    # ``Loss 6.9 (6.9)\tAcc@1   0.00 (  0.10)``): a line cut inside a field never matches.
    r"(?:\s+[A-Za-z][^\s()]*\s+" + _NUM + r"\s+\([^)]*\))*\s*$"
)
NUMBER = r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$"
NON_FINITE_NUMBER = r"^[+-]?(?i:inf|infinity|nan)$"
# The loader's settings, once per rank and epoch (dsim.instrument.lines.loader_line).
LOADER_FIELDS = ("num_workers", "prefetch_factor", "batch_size", "persistent_workers", "pin_memory")
LOADER_PATTERN = (
    r"^.*?" + _TS + r"\s+(?:GPU:\s*(?P<gpu>" + _RANK + r")\s+)?LOADER"
    r"\s+num_workers\s+(?P<num_workers>\d{1,6})\s+prefetch_factor\s+(?P<prefetch_factor>\d{1,6}|none)"
    r"\s+batch_size\s+(?P<batch_size>\d{1,9}|none)\s+persistent_workers\s+(?P<persistent_workers>[01])"
    r"\s+pin_memory\s+(?P<pin_memory>[01])"
    # A process runs on at least one core, a node holds at least one rank: 0 is malformed.
    r"(?:\s+cores\s+(?P<cores>[1-9]\d{0,5})"
    r"\s+local_world_size\s+(?P<local_world_size>[1-9]\d{0,5}|none)"
    # The CPUs the process may use, as Linux lists them (0-7,16-23): a node's cores are the
    # union of its ranks' sets where a launcher bound each rank to its own (SPEC §1.2).
    r"(?:\s+cpus\s+(?P<cpus>\d{1,6}(?:-\d{1,6})?(?:,\d{1,6}(?:-\d{1,6})?)*))?)?"
    # The bytes of the tensors of the epoch's first batch, when dsim.instrument counted them.
    r"(?:\s+batch_bytes\s+(?P<batch_bytes>\d{1,15}))?"
    r"\s*$"
)
NODE_FIELDS = ("cores", "local_world_size")  # optional: absent from older loader lines

FETCH_MARK = "END FETCH"
TRAIN_MARK = "Epoch:"
START_MARK = "START FETCH"
LOADER_MARK = " LOADER "

# Reasons a line is rejected; the parse report counts by these exact strings.
MALFORMED_FETCH = "malformed fetch line"
MALFORMED_TRAIN = "malformed training line"
MALFORMED_LOADER = "malformed loader line"
IMPOSSIBLE_LOADER = (
    "impossible loader settings (prefetch_factor 0 with workers, batch_size 0, or "
    f"num_workers or prefetch_factor above {bounds.LOADER_SETTING_LIMIT})"
)
TRUNCATED = "truncated last line (no line end)"
BINARY = "binary data (not UTF-8 text)"
BAD_TIMESTAMP = "invalid timestamp"
NON_NUMERIC_FETCH = "non-numeric fetch duration"
NEGATIVE_FETCH = "negative fetch duration"
NON_NUMERIC_TRAIN = "non-numeric training value"
NON_FINITE = "non-finite value"
BAD_CPU = "invalid CPU time (not a number of seconds from 0 to --max-duration)"
CPU_BEYOND_FETCH = (
    f"CPU time beyond its fetch (cpu or runq more than {bounds.CPU_SLACK_S:g} s longer than "
    "at_time)"
)
WAIT_BEYOND_ITERATION = (
    f"run-queue wait beyond its iteration (Runq more than {bounds.CPU_SLACK_S:g} s longer "
    "than Time)"
)
BAD_STAGE = "invalid stage time (not a number of seconds from 0 to --max-duration)"
NEGATIVE_TRAIN = "negative training value"
STALL_OVER_TIME = "training stall longer than the iteration time"
ITERATION_RANGE = "iteration index not below iterations per epoch"
BAD_RANK = bounds.BAD_RANK
MAX_DURATION_S = bounds.MAX_DURATION_S


@dataclass
class Rejects:
    """Rejected lines of one file: 1-based line numbers, reasons and the text."""

    line: list[np.ndarray] = field(default_factory=list)
    reason: list[str | np.ndarray] = field(default_factory=list)
    text: list[pa.Array] = field(default_factory=list)

    def add(self, lines: np.ndarray, reason: str | np.ndarray, text: pa.Array) -> None:
        if len(lines):
            self.line.append(np.asarray(lines, dtype=np.int64))
            if isinstance(reason, str):
                reason = np.full(len(lines), reason, dtype=object)
            self.reason.append(reason)
            self.text.append(text.cast(pa.large_string()))

    def table(self) -> pa.Table:
        if not self.line:
            return pa.table(
                {
                    "line": pa.nulls(0, pa.int64()),
                    "reason": pa.nulls(0, pa.string()),
                    "text": pa.nulls(0, pa.large_string()),
                }
            )
        text = pa.concat_arrays(self.text)
        text = pc.utf8_slice_codeunits(pc.utf8_rtrim(text, characters="\r\n"), 0, 300)
        return pa.table(
            {
                "line": array_of(np.concatenate(self.line)),
                "reason": strings_of(np.concatenate(self.reason)),
                "text": text,
            }
        )


@dataclass
class BlockRecords:
    """Typed columns of the records found in some lines, plus the counts of the rest."""

    fetch: dict[str, np.ndarray]
    train: dict[str, np.ndarray]
    counts: dict[str, int]
    loader: list[dict[str, int | None]] = field(default_factory=list)  # a few per file


def lines_of(block: bytes | memoryview, newlines: np.ndarray | None = None) -> pa.LargeStringArray:
    """Split a block that ends with a newline into one string per line, without copying.

    Each value keeps its trailing ``\\n`` (Arrow offsets are contiguous); the
    patterns allow trailing white space, and reject texts are trimmed.
    Invalid UTF-8 (binary garbage) is replaced by U+FFFD so that the lines it
    touches are caught as binary data instead of breaking the string kernels.
    ``newlines``: the positions of the block's ``\\n`` bytes when the caller has
    them already (the reader finds them to bound line lengths), saving a pass.
    """
    if not block:
        return pa.nulls(0, pa.large_string())
    buf = np.frombuffer(block, dtype=np.uint8)
    ends = (np.flatnonzero(buf == 10) if newlines is None else newlines) + 1
    if len(ends) == 0 or ends[-1] != len(buf):  # the unterminated tail, if any
        ends = np.append(ends, len(buf))
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    lines = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(offsets), pa.py_buffer(block))
    try:
        lines.validate(full=True)
    except pa.ArrowInvalid:
        return lines_of(bytes(block).decode("utf-8", errors="replace").encode("utf-8"))
    return lines


def _numbers(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Parse decimal strings; returns (values, ok) with NaN where not a number.

    ``inf`` and ``nan`` (as Python prints them) are numbers, NaN here, so that the
    caller's finiteness check rejects them as non-finite values, not as non-numeric.
    """
    ok = _np(pc.match_substring_regex(values, NUMBER))
    out = np.full(len(values), np.nan)
    if ok.any():
        out[ok] = numpy_of(pc.cast(values.filter(array_of(ok)), pa.float64()))
    special = _np(pc.match_substring_regex(values, NON_FINITE_NUMBER))
    return out, ok | special


def _ranks(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``GPU:`` fields to ranks (-1 where absent) and where present but out of range.

    Checked as text first, so that a 30-digit rank is rejected instead of overflowing the cast.
    """
    present = numpy_of(pc.utf8_length(values)) > 0  # (a null's NaN is not)
    plain = _np(pc.match_substring_regex(values, r"^\+?\d{1,7}$"))
    out = np.full(len(values), -1, dtype=np.int64)
    if plain.any():
        digits = pc.utf8_ltrim(values.filter(array_of(plain)), characters="+")
        out[plain] = numpy_of(pc.cast(digits, pa.int64()))
    bad = present & ~(plain & (out >= 0) & (out < bounds.RANK_LIMIT))
    out[bad] = -1
    return out, bad


def _ints(values: pa.Array, default: int = -1) -> np.ndarray:
    """Digit strings to integers; an optional group that did not match ("") gives ``default``."""
    given = numpy_of(pc.utf8_length(values)) > 0  # not "" and not null
    out = np.full(len(values), default, dtype=np.int64)
    if given.any():
        out[given] = numpy_of(pc.cast(values.filter(array_of(given)), pa.int64()))
    return out


def _timestamps(parts: pa.StructArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nanoseconds since 1970 (naive wall clock), a validity mask, and the fraction's digits.

    Whole seconds come from the digits at their fixed places (``dsim.sources.rawlog.wallclock``);
    a date that does not exist (February 30, hour 24) is invalid, not rolled over.
    The fraction of 1 to 9 digits is scaled to nanoseconds exactly.
    """
    text = parts.field("ts")
    civil = civil_seconds(text)
    if civil is None:
        whole, ok = civil_seconds_arrow(text)
    else:
        whole, ok = civil
    frac = parts.field("frac")
    digits = numpy_of(pc.utf8_length(frac)).astype(np.int64)
    frac_ns = _ints(frac, 0) * (10 ** (9 - digits))
    return whole * 1_000_000_000 + frac_ns, ok, digits


def _reasons(checks: list[tuple[np.ndarray, str]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows failing any check and, for those rows only, the first failed check's reason.

    A reason string per row (nested ``np.where``) cost more than parsing the
    numbers; bad rows are few, so only they get one.
    """
    bad = np.zeros(len(checks[0][0]), dtype=bool)
    for failed, _ in checks:
        bad |= failed
    rows = np.flatnonzero(bad)
    reason = np.empty(len(rows), dtype=object)
    for failed, text in reversed(checks):  # the first check that failed wins
        reason[failed[rows]] = text
    return bad, reason


def parse_lines(
    lines: pa.LargeStringArray,
    first_line: int,
    rejects: Rejects,
    *,
    fast: bool = True,
    max_duration: float = MAX_DURATION_S,
) -> BlockRecords:
    """Dissect lines numbered ``first_line``, ``first_line + 1``, ...; rejects go to ``rejects``.

    Lines written exactly as docs/SPEC.md §1 shows them (the canonical spelling)
    are cut by position in NumPy (``dsim.sources.rawlog.fastpath``); all others -- prefixes,
    extra white space, odd numbers, bad records -- take the general regular
    expressions. ``fast=False`` sends every line the general way (tests compare).
    Durations above ``max_duration`` seconds are rejected (``dsim.sources.rawlog.bounds``).
    """
    numbers = np.arange(first_line, first_line + len(lines), dtype=np.int64)
    empty = _empty_lines(lines)
    if empty is not None:  # counted here: millions of them cost nothing in the regexes
        kept = np.flatnonzero(~empty)
        out = _parse_numbered(
            lines.take(array_of(kept)), numbers[kept], rejects, fast, max_duration
        )
        out.counts["lines"] = len(lines)
        out.counts["blank_lines"] += len(lines) - len(kept)
        return out
    return _parse_numbered(lines, numbers, rejects, fast, max_duration)


def _empty_lines(lines: pa.LargeStringArray) -> np.ndarray | None:
    """Which lines are only a line end (``\\n``, ``\\r\\n``) or nothing; ``None`` when none is.

    One pass over the line lengths; a text of nothing but line ends (a
    decompression bomb of newlines) then costs a few ns a line instead of
    the regexes' microsecond.
    """
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[
        lines.offset : lines.offset + len(lines) + 1
    ]
    lengths = np.diff(offsets)
    short = np.flatnonzero(lengths <= 2)
    if not len(short):
        return None
    data = lines.buffers()[2]
    text = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    n, start = lengths[short], offsets[short]
    if not len(text):
        return np.ones(len(lines), dtype=bool)  # every line is ""
    last = len(text) - 1
    first = np.where(n >= 1, text[np.minimum(start, last)], 0)
    second = np.where(n == 2, text[np.minimum(start + 1, last)], 0)
    blank = (n == 0) | ((n == 1) & (first == 10)) | ((n == 2) & (first == 13) & (second == 10))
    if not blank.any():
        return None
    empty = np.zeros(len(lines), dtype=bool)
    empty[short[blank]] = True
    return empty


def _parse_numbered(
    lines: pa.LargeStringArray,
    numbers: np.ndarray,
    rejects: Rejects,
    fast: bool,
    max_duration: float,
) -> BlockRecords:
    """``parse_lines`` for lines numbered ``numbers`` (not necessarily consecutive)."""
    if not fast or len(lines) == 0:
        return _general_records(lines, numbers, rejects, max_duration)
    fast_fetch, fast_train, rest = fast_records(lines, numbers, max_duration)
    if len(rest) == len(lines):
        return _general_records(lines, numbers, rejects, max_duration)
    if len(rest) == 0:
        counts = {
            "lines": len(lines),
            "start_fetch_lines": 0,
            "loader_lines": 0,
            "blank_lines": 0,
            "other_lines": 0,
        }
        return BlockRecords(fetch=fast_fetch, train=fast_train, counts=counts)
    general = _general_records(lines.take(array_of(rest)), numbers[rest], rejects, max_duration)
    general.counts["lines"] = len(lines)
    return BlockRecords(
        fetch=_merge_by_line(fast_fetch, general.fetch),
        train=_merge_by_line(fast_train, general.train),
        counts=general.counts,
        loader=general.loader,
    )


def _merge_by_line(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Records of both paths in file order, as if one path had found them all."""
    if len(b["line"]) == 0:
        return a
    if len(a["line"]) == 0:
        return b
    order = np.argsort(np.concatenate([a["line"], b["line"]]), kind="stable")
    return {k: np.concatenate([a[k], b[k].astype(a[k].dtype, copy=False)])[order] for k in a}


def _general_records(
    lines: pa.Array, numbers: np.ndarray, rejects: Rejects, max_duration: float
) -> BlockRecords:
    """The full grammar (RE2 over every line): any spelling, every reject reason."""
    counts = {"lines": len(lines)}

    # Binary data anywhere in a line, a record's too (a NUL after its `DEBUG:`): the
    # fast path leaves such lines here, and the patterns' free text would take them.
    binary_any = pc.or_(pc.match_substring(lines, "\ufffd"), pc.match_substring(lines, "\x00"))
    is_fetch = pc.and_not(pc.match_substring_regex(lines, FETCH_PATTERN), binary_any)
    rest = pc.invert(is_fetch)
    is_train = pc.and_(rest, pc.and_not(pc.match_substring_regex(lines, TRAIN_PATTERN), binary_any))
    other = pc.and_not(rest, is_train)

    fetch = _fetch_records(lines.filter(is_fetch), numbers[_np(is_fetch)], rejects, max_duration)
    train = _train_records(lines.filter(is_train), numbers[_np(is_train)], rejects, max_duration)

    # Lines that are neither: a record that breaks the grammar, or text we ignore.
    other_np = _np(other)
    text = lines.filter(other)
    nums = numbers[other_np]
    binary = _np(binary_any.filter(other))
    rejects.add(nums[binary], BINARY, text.filter(array_of(binary)))
    bad_fetch = ~binary & _np(pc.match_substring(text, FETCH_MARK))
    rejects.add(nums[bad_fetch], MALFORMED_FETCH, text.filter(array_of(bad_fetch)))
    bad_train = ~binary & ~bad_fetch & _np(pc.match_substring(text, TRAIN_MARK))
    rejects.add(nums[bad_train], MALFORMED_TRAIN, text.filter(array_of(bad_train)))
    marked = ~binary & ~bad_fetch & ~bad_train & _np(pc.match_substring(text, LOADER_MARK))
    loader = (
        _loader_records(text.filter(array_of(marked)), nums[marked], rejects)
        if marked.any()
        else []
    )
    ignored = ~binary & ~bad_fetch & ~bad_train & ~marked
    starts = ignored & _np(pc.match_substring(text, START_MARK))
    blank = ignored & (numpy_of(pc.utf8_length(pc.utf8_trim_whitespace(text))) == 0)
    counts["start_fetch_lines"] = int(starts.sum())
    counts["loader_lines"] = len(loader)
    counts["blank_lines"] = int(blank.sum())
    counts["other_lines"] = int((ignored & ~starts & ~blank).sum())
    return BlockRecords(fetch=fetch, train=train, counts=counts, loader=loader)


def _loader_records(
    lines: pa.Array, numbers: np.ndarray, rejects: Rejects
) -> list[dict[str, int | None]]:
    """Loader-settings lines as dicts (they are few: one per rank and epoch)."""
    ok = _np(pc.match_substring_regex(lines, LOADER_PATTERN))
    rejects.add(numbers[~ok], MALFORMED_LOADER, lines.filter(array_of(~ok)))
    lines, numbers = lines.filter(array_of(ok)), numbers[ok]
    parts = pc.extract_regex(lines, LOADER_PATTERN)
    gpu, gpu_bad = _ranks(parts.field("gpu"))
    rejects.add(numbers[gpu_bad], BAD_RANK, lines.filter(array_of(gpu_bad)))
    out: list[dict[str, int | None]] = []
    for row, line in enumerate(numbers):
        if gpu_bad[row]:
            continue
        record: dict[str, int | None] = {"line": int(line), "gpu": int(gpu[row])}
        for name in LOADER_FIELDS:
            text = parts.field(name)[row].as_py()
            record[name] = None if text == "none" else int(text)
        if _impossible(record):  # no DataLoader runs so: taken as measured, it would mislead
            rejects.add(numbers[row : row + 1], IMPOSSIBLE_LOADER, lines.slice(row, 1))
            continue
        if parts.field("cores")[row].as_py():  # an unmatched optional group gives ""
            for name in NODE_FIELDS:
                text = parts.field(name)[row].as_py()
                record[name] = None if text == "none" else int(text)
            cpus = parts.field("cpus")[row].as_py()
            if cpus:
                record["cpus"] = cpus
        if parts.field("batch_bytes")[row].as_py():
            record["batch_bytes"] = int(parts.field("batch_bytes")[row].as_py())
        out.append(record)
    return out


def _impossible(record: dict[str, int | None]) -> bool:
    """Settings PyTorch's DataLoader refuses (workers with a prefetch_factor of 0, a
    batch_size of 0), or more workers or prefetch than any node runs."""
    workers, prefetch = record["num_workers"], record["prefetch_factor"]
    limit = bounds.LOADER_SETTING_LIMIT
    too_many = (workers or 0) > limit or (prefetch or 0) > limit
    return bool(workers and prefetch == 0) or record["batch_size"] == 0 or too_many


def _np(mask: pa.Array) -> np.ndarray:
    return flags_of(mask)  # null: False


def _fetch_records(
    lines: pa.Array, numbers: np.ndarray, rejects: Rejects, max_duration: float
) -> dict[str, np.ndarray]:
    parts = pc.extract_regex(lines, FETCH_PATTERN)
    end_ns, ts_ok, digits = _timestamps(parts)
    fetch_s, num_ok = _numbers(parts.field("at"))
    finite = num_ok & np.isfinite(fetch_s)
    negative = finite & (fetch_s < 0)
    huge = finite & (fetch_s > max_duration)
    cpu_s, cpu_bad = _optional_seconds(parts.field("cpu"), max_duration)
    runq_s, runq_bad = _optional_seconds(parts.field("runq"), max_duration)
    proc_s, proc_bad = _optional_seconds(parts.field("proc"), max_duration)
    stages, stage_bad = {}, np.zeros(len(numbers), dtype=bool)
    for name in STAGE_FIELDS:
        stages[f"{name}_s"], bad_here = _optional_seconds(parts.field(name), max_duration)
        stage_bad |= bad_here
    gpu, gpu_bad = _ranks(parts.field("gpu"))
    bad, reason = _reasons(
        [(~ts_ok, BAD_TIMESTAMP), (gpu_bad, BAD_RANK), (~num_ok, NON_NUMERIC_FETCH),
         (num_ok & ~finite, NON_FINITE),
         (negative, NEGATIVE_FETCH), (huge, bounds.over_max("fetch duration", max_duration)),
         (cpu_bad | runq_bad | proc_bad, BAD_CPU),
         (finite & bounds.beyond_span(fetch_s, cpu_s, runq_s), CPU_BEYOND_FETCH),
         (stage_bad, BAD_STAGE)]
    )  # fmt: skip
    rejects.add(numbers[bad], reason, lines.filter(array_of(bad)))
    keep = ~bad
    return {
        "line": numbers[keep],
        "gpu": gpu[keep],
        "worker": _ints(parts.field("worker"))[keep],
        "idx": _ints(parts.field("idx"))[keep],
        "end": end_ns[keep],
        "end_digits": digits[keep].astype(np.int8),  # resolution: see rawlog.epochs
        "fetch_s": fetch_s[keep],
        "cpu_s": cpu_s[keep],
        "runq_s": runq_s[keep],
        "proc_cpu_s": proc_s[keep],
        **{name: values[keep] for name, values in stages.items()},
        "stream": _optional_count(parts.field("stream"))[keep],
    }


def _optional_count(text: pa.Array) -> np.ndarray:
    """An optional count (``stream``) as float64, NaN where the line does not carry it.

    Float so that it shares the optional columns' machinery (absent: a view of
    one NaN); counts of at most 9 digits are exact doubles.
    """
    present = numpy_of(pc.utf8_length(text)) > 0  # an unmatched group gives "" (a null: NaN)
    out = np.full(len(present), np.nan)
    if present.any():
        out[present] = numpy_of(pc.cast(text.filter(array_of(present)), pa.float64()))
    return out


def _train_records(
    lines: pa.Array, numbers: np.ndarray, rejects: Rejects, max_duration: float
) -> dict[str, np.ndarray]:
    parts = pc.extract_regex(lines, TRAIN_PATTERN)
    start_ns, ts_ok, _ = _timestamps(parts)
    iteration_s, time_ok = _numbers(parts.field("time"))
    stall_s, data_ok = _numbers(parts.field("data"))
    tp_text = parts.field("throughput")
    throughput, tp_ok = _numbers(tp_text)
    tp_present = numpy_of(pc.utf8_length(tp_text)) > 0  # an unmatched group gives "" (a null: NaN)
    iteration = _ints(parts.field("iteration"))
    total = _ints(parts.field("total"))
    numeric = time_ok & data_ok & (tp_ok | ~tp_present)
    cpu_s, cpu_bad = _optional_seconds(parts.field("cpu"), max_duration)
    runq_s, runq_bad = _optional_seconds(parts.field("runq"), max_duration)
    gpu, gpu_bad = _ranks(parts.field("gpu"))
    with np.errstate(invalid="ignore"):
        finite = numeric & np.isfinite(iteration_s) & np.isfinite(stall_s)
        finite &= ~tp_present | np.isfinite(throughput)
        negative = finite & ((iteration_s < 0) | (stall_s < 0) | (tp_present & (throughput < 0)))
        long_time = finite & (iteration_s > max_duration)
        long_stall = finite & (stall_s > max_duration)
        stall_over = finite & bounds.stall_too_long(iteration_s, stall_s)
    bad, reason = _reasons(
        [(~ts_ok, BAD_TIMESTAMP), (gpu_bad, BAD_RANK), (~numeric, NON_NUMERIC_TRAIN),
         (numeric & ~finite, NON_FINITE),
         (negative, NEGATIVE_TRAIN),
         (long_time, bounds.over_max("iteration time", max_duration)),
         (long_stall, bounds.over_max("training stall", max_duration)),
         (stall_over, STALL_OVER_TIME), (iteration >= total, ITERATION_RANGE),
         (cpu_bad | runq_bad, BAD_CPU),
         (finite & bounds.beyond_span(iteration_s, runq_s), WAIT_BEYOND_ITERATION)]
    )  # fmt: skip
    rejects.add(numbers[bad], reason, lines.filter(array_of(bad)))
    keep = ~bad
    return {
        "line": numbers[keep],
        "gpu": gpu[keep],
        "epoch": _ints(parts.field("epoch"))[keep],
        "iteration": iteration[keep],
        "total": total[keep],
        "start": start_ns[keep],
        "iteration_s": iteration_s[keep],
        "stall_s": stall_s[keep],
        "throughput": np.where(tp_present, throughput, np.nan)[keep],
        "cpu_s": cpu_s[keep],
        "runq_s": runq_s[keep],
    }


def _optional_seconds(text: pa.Array, max_duration: float) -> tuple[np.ndarray, np.ndarray]:
    """An optional seconds field: values (NaN where absent) and where present but invalid."""
    values, ok = _numbers(text)
    present = numpy_of(pc.utf8_length(text)) > 0  # an unmatched group gives "" (a null: NaN)
    with np.errstate(invalid="ignore"):
        valid = ok & np.isfinite(values) & (values >= 0) & (values <= max_duration)
    return np.where(present & valid, values, np.nan), present & ~valid
