"""The raw log grammar of DESIGN.md §1, applied to whole blocks of text at once.

Logs of long runs hold millions of lines, so nothing here loops over lines in
Python: a block of bytes becomes one Arrow string array (zero-copy, split at
newlines with NumPy), full-line regular expressions (RE2, inside Arrow)
classify and dissect every line, and the captured fields are cast to typed
NumPy arrays. Lines that look like records but break the grammar become
*rejects* with a reason and their line number; all other lines are counted
and ignored.

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

_TS = r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(?P<frac>\d{1,9})"
_NUM = r"[^\s()]+"  # captured loosely, validated by NUMBER below for a precise reason

FETCH_PATTERN = (
    r"^.*?" + _TS + r"\s.*?(?:GPU:\s*(?P<gpu>\d{1,6})\s+)?worker_id:\s*(?P<worker>\d{1,6}),?"
    r"\s+END FETCH\s+at_time\s+(?P<at>" + _NUM + r")\s+data\s+idx(?P<idx>\d{1,9})\s*$"
)
TRAIN_PATTERN = (
    r"^.*?" + _TS + r"\s+(?:GPU:\s*(?P<gpu>\d{1,6})\s+)?Epoch:\s*\[\s*(?P<epoch>\d{1,6})\s*\]"
    r"\[\s*(?P<iteration>\d{1,9})\s*/\s*(?P<total>\d{1,9})\s*\]"
    r"\s+Time\s+(?P<time>" + _NUM + r")\s+\([^)]*\)"
    r"\s+Data\s+(?P<data>" + _NUM + r")\s+\([^)]*\)"
    r"(?:\s+Throughput\s+(?P<throughput>" + _NUM + r")\s+\([^)]*\))?"
)
NUMBER = r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$"

FETCH_MARK = "END FETCH"
TRAIN_MARK = "Epoch:"
START_MARK = "START FETCH"

# Reasons a line is rejected; the parse report counts by these exact strings.
MALFORMED_FETCH = "malformed fetch line"
MALFORMED_TRAIN = "malformed training line"
TRUNCATED = "truncated last line (no line end)"
BINARY = "binary data (not UTF-8 text)"
BAD_TIMESTAMP = "invalid timestamp"
NON_NUMERIC_FETCH = "non-numeric fetch duration"
NEGATIVE_FETCH = "negative fetch duration"
FETCH_RANGE = "fetch duration out of range (over a year)"
MAX_FETCH_S = 365 * 86400.0
NON_NUMERIC_TRAIN = "non-numeric training value"
NEGATIVE_TRAIN = "negative training value"
ITERATION_RANGE = "iteration index not below iterations per epoch"


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
                    "line": pa.array([], pa.int64()),
                    "reason": pa.array([], pa.string()),
                    "text": pa.array([], pa.large_string()),
                }
            )
        text = pa.concat_arrays(self.text)
        text = pc.utf8_slice_codeunits(pc.utf8_rtrim(text, characters="\r\n"), 0, 300)
        return pa.table(
            {
                "line": np.concatenate(self.line),
                "reason": pa.array(np.concatenate(self.reason).astype(str)),
                "text": text,
            }
        )


@dataclass
class BlockRecords:
    """Typed columns of the records found in some lines, plus the counts of the rest."""

    fetch: dict[str, np.ndarray]
    train: dict[str, np.ndarray]
    counts: dict[str, int]


def lines_of(block: bytes) -> pa.LargeStringArray:
    """Split a block that ends with a newline into one string per line, without copying.

    Each value keeps its trailing ``\\n`` (Arrow offsets are contiguous); the
    patterns allow trailing white space, and reject texts are trimmed.
    Invalid UTF-8 (binary garbage) is replaced by U+FFFD so that the lines it
    touches are caught as binary data instead of breaking the string kernels.
    """
    if not block:
        return pa.array([], pa.large_string())
    buf = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10) + 1
    if len(ends) == 0 or ends[-1] != len(buf):  # the unterminated tail, if any
        ends = np.append(ends, len(buf))
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    lines = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(offsets), pa.py_buffer(block))
    try:
        lines.validate(full=True)
    except pa.ArrowInvalid:
        return lines_of(block.decode("utf-8", errors="replace").encode("utf-8"))
    return lines


def _numbers(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Parse decimal strings; returns (values, ok) with NaN where not a number."""
    ok = pc.fill_null(pc.match_substring_regex(values, NUMBER), False)
    out = np.full(len(values), np.nan)
    if pc.any(ok).as_py():
        okn = ok.to_numpy(zero_copy_only=False)
        out[okn] = pc.cast(values.filter(ok), pa.float64()).to_numpy(zero_copy_only=False)
    return out, ok.to_numpy(zero_copy_only=False)


def _ints(values: pa.Array, default: int = -1) -> np.ndarray:
    """Digit strings to integers; an optional group that did not match ("") gives ``default``."""
    empty = pc.equal(pc.utf8_length(values), 0)
    filled = pc.if_else(pc.fill_null(empty, True), str(default), values)
    return pc.cast(filled, pa.int64()).to_numpy(zero_copy_only=False)


def _timestamps(parts: pa.StructArray) -> tuple[np.ndarray, np.ndarray]:
    """Nanoseconds since 1970 (naive wall clock) and a validity mask.

    Whole seconds come from the digits at their fixed places (``_civil_seconds``);
    a date that does not exist (February 30, hour 24) is invalid, not rolled over.
    The fraction of 1 to 9 digits is scaled to nanoseconds exactly.
    """
    text = parts.field("ts")
    civil = _civil_seconds(text)
    if civil is None:
        whole, ok = _civil_seconds_arrow(text)
    else:
        whole, ok = civil
    frac = parts.field("frac")
    digits = pc.utf8_length(frac).to_numpy(zero_copy_only=False).astype(np.int64)
    frac_ns = _ints(frac, 0) * (10 ** (9 - digits))
    return whole * 1_000_000_000 + frac_ns, ok


_TS_WIDTH = 19  # YYYY-mm-dd HH:MM:SS
_TS_DIGITS = np.array([0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18])
_DAYS_IN_MONTH = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


def _civil_seconds(text: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """Seconds since 1970 of ``YYYY-mm-dd HH:MM:SS`` texts and which ones are real times.

    Arrow's strftime, needed to catch dates that strptime rolls over, costs
    about 4 µs a line -- more than the rest of the grammar together. The
    pattern already puts a digit at each of 14 fixed places, so the fields are
    columns of a byte matrix and the calendar is integer arithmetic
    (proleptic Gregorian, days from civil). Returns ``None`` when the texts are
    not all such (then the slow path decides).
    """
    n = len(text)
    if n == 0 or text.null_count:
        return None
    text = text.cast(pa.large_string())
    _, offsets_buf, data_buf = text.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[text.offset : text.offset + n + 1]
    if not (np.diff(offsets) == _TS_WIDTH).all():
        return None
    raw = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0] : offsets[-1]].reshape(n, _TS_WIDTH)
    d = raw[:, _TS_DIGITS].astype(np.int64) - 48
    if ((d < 0) | (d > 9)).any():
        return None
    return _civil_from_digits(d)


def _civil_from_digits(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds since 1970 from the 14 digits of ``YYYYmmddHHMMSS`` (int64 rows), and validity."""
    century, yy, month, day, hour, minute, second = (d[:, 0::2] * 10 + d[:, 1::2]).T
    year = century * 100 + yy
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    good_month = (month >= 1) & (month <= 12)
    days_in_month = _DAYS_IN_MONTH[np.where(good_month, month, 0)] + (leap & (month == 2))
    ok = good_month & (day >= 1) & (day <= days_in_month) & (hour < 24)
    ok &= (minute < 60) & (second < 60)
    # Days from civil (H. Hinnant): March-based years make February the last month.
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5 + day - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    seconds = days * 86400 + hour * 3600 + minute * 60 + second
    return np.where(ok, seconds, 0), ok


def _civil_seconds_arrow(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The general path: strptime, and a strftime round trip against rolled-over dates."""
    fmt = "%Y-%m-%d %H:%M:%S"
    seconds = pc.strptime(text, format=fmt, unit="s", error_is_null=True)
    same = pc.equal(pc.strftime(seconds, format=fmt), text)
    ok = pc.fill_null(same, False).to_numpy(zero_copy_only=False)
    whole = pc.fill_null(pc.cast(seconds, pa.int64()), 0).to_numpy(zero_copy_only=False)
    return whole, ok


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
    lines: pa.LargeStringArray, first_line: int, rejects: Rejects, *, fast: bool = True
) -> BlockRecords:
    """Dissect lines numbered ``first_line``, ``first_line + 1``, ...; rejects go to ``rejects``.

    Lines written exactly as DESIGN.md §1 shows them (the canonical spelling)
    are cut by position in NumPy (``_fast_records``); all others -- prefixes,
    extra white space, odd numbers, bad records -- take the general regular
    expressions. ``fast=False`` sends every line the general way (tests compare).
    """
    numbers = np.arange(first_line, first_line + len(lines), dtype=np.int64)
    if not fast or len(lines) == 0:
        return _general_records(lines, numbers, rejects)
    fast_fetch, fast_train, rest = _fast_records(lines, numbers)
    if len(rest) == len(lines):
        return _general_records(lines, numbers, rejects)
    if len(rest) == 0:
        counts = {"lines": len(lines), "start_fetch_lines": 0, "blank_lines": 0, "other_lines": 0}
        return BlockRecords(fetch=fast_fetch, train=fast_train, counts=counts)
    general = _general_records(lines.take(pa.array(rest)), numbers[rest], rejects)
    general.counts["lines"] = len(lines)
    return BlockRecords(
        fetch=_merge_by_line(fast_fetch, general.fetch),
        train=_merge_by_line(fast_train, general.train),
        counts=general.counts,
    )


def _merge_by_line(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Records of both paths in file order, as if one path had found them all."""
    if len(b["line"]) == 0:
        return a
    if len(a["line"]) == 0:
        return b
    order = np.argsort(np.concatenate([a["line"], b["line"]]), kind="stable")
    return {k: np.concatenate([a[k], b[k].astype(a[k].dtype, copy=False)])[order] for k in a}


def _general_records(lines: pa.Array, numbers: np.ndarray, rejects: Rejects) -> BlockRecords:
    """The full grammar (RE2 over every line): any spelling, every reject reason."""
    counts = {"lines": len(lines)}

    is_fetch = pc.match_substring_regex(lines, FETCH_PATTERN)
    rest = pc.invert(is_fetch)
    is_train = pc.and_(rest, pc.match_substring_regex(lines, TRAIN_PATTERN))
    other = pc.and_not(rest, is_train)

    fetch = _fetch_records(lines.filter(is_fetch), numbers[_np(is_fetch)], rejects)
    train = _train_records(lines.filter(is_train), numbers[_np(is_train)], rejects)

    # Lines that are neither: a record that breaks the grammar, or text we ignore.
    other_np = _np(other)
    text = lines.filter(other)
    nums = numbers[other_np]
    binary = _np(pc.or_(pc.match_substring(text, "\ufffd"), pc.match_substring(text, "\x00")))
    rejects.add(nums[binary], BINARY, text.filter(binary))
    bad_fetch = ~binary & _np(pc.match_substring(text, FETCH_MARK))
    rejects.add(nums[bad_fetch], MALFORMED_FETCH, text.filter(bad_fetch))
    bad_train = ~binary & ~bad_fetch & _np(pc.match_substring(text, TRAIN_MARK))
    rejects.add(nums[bad_train], MALFORMED_TRAIN, text.filter(bad_train))
    ignored = ~binary & ~bad_fetch & ~bad_train
    starts = ignored & _np(pc.match_substring(text, START_MARK))
    blank = ignored & _np(pc.equal(pc.utf8_trim_whitespace(text), ""))
    counts["start_fetch_lines"] = int(starts.sum())
    counts["blank_lines"] = int(blank.sum())
    counts["other_lines"] = int((ignored & ~starts & ~blank).sum())
    return BlockRecords(fetch=fetch, train=train, counts=counts)


def _np(mask: pa.Array) -> np.ndarray:
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False)


def _fetch_records(lines: pa.Array, numbers: np.ndarray, rejects: Rejects) -> dict[str, np.ndarray]:
    parts = pc.extract_regex(lines, FETCH_PATTERN)
    end_ns, ts_ok = _timestamps(parts)
    fetch_s, num_ok = _numbers(parts.field("at"))
    negative = num_ok & (fetch_s < 0)
    huge = num_ok & (fetch_s > MAX_FETCH_S)
    bad, reason = _reasons(
        [(~ts_ok, BAD_TIMESTAMP), (~num_ok, NON_NUMERIC_FETCH), (negative, NEGATIVE_FETCH),
         (huge, FETCH_RANGE)]
    )  # fmt: skip
    rejects.add(numbers[bad], reason, lines.filter(pa.array(bad)))
    keep = ~bad
    return {
        "line": numbers[keep],
        "gpu": _ints(parts.field("gpu"))[keep],
        "worker": _ints(parts.field("worker"))[keep],
        "idx": _ints(parts.field("idx"))[keep],
        "end": end_ns[keep],
        "fetch_s": fetch_s[keep],
    }


def _train_records(lines: pa.Array, numbers: np.ndarray, rejects: Rejects) -> dict[str, np.ndarray]:
    parts = pc.extract_regex(lines, TRAIN_PATTERN)
    start_ns, ts_ok = _timestamps(parts)
    iteration_s, time_ok = _numbers(parts.field("time"))
    stall_s, data_ok = _numbers(parts.field("data"))
    tp_text = parts.field("throughput")
    throughput, tp_ok = _numbers(tp_text)
    tp_present = _np(pc.greater(pc.utf8_length(tp_text), 0))  # an unmatched group gives ""
    iteration = _ints(parts.field("iteration"))
    total = _ints(parts.field("total"))
    numeric = time_ok & data_ok & (tp_ok | ~tp_present)
    negative = numeric & ((iteration_s < 0) | (stall_s < 0) | (tp_present & (throughput < 0)))
    bad, reason = _reasons(
        [(~ts_ok, BAD_TIMESTAMP), (~numeric, NON_NUMERIC_TRAIN), (negative, NEGATIVE_TRAIN),
         (iteration >= total, ITERATION_RANGE)]
    )  # fmt: skip
    rejects.add(numbers[bad], reason, lines.filter(pa.array(bad)))
    keep = ~bad
    return {
        "line": numbers[keep],
        "gpu": _ints(parts.field("gpu"))[keep],
        "epoch": _ints(parts.field("epoch"))[keep],
        "iteration": iteration[keep],
        "total": total[keep],
        "start": start_ns[keep],
        "iteration_s": iteration_s[keep],
        "stall_s": stall_s[keep],
        "throughput": np.where(tp_present, throughput, np.nan)[keep],
    }


# --- The canonical fast path -------------------------------------------------------------
#
# RE2 inside Arrow costs about 150 ns a line before it reads a byte, and the
# general patterns (a lazy prefix, optional groups) about 1 µs. Nearly every
# real line is spelled exactly as DESIGN.md §1 shows it: no prefix, single
# separators. Such a line is a fixed sequence of literals and bounded runs of
# digits, so it can be checked and cut by position over the whole block at
# once: gather a small byte window per line at a computed offset, measure the
# run in it, move on. A line is taken here only if every byte is where the
# canonical spelling puts it and every value is valid; anything else (and any
# doubt) goes to the general path, so the result is the same either way.

_REACH = 448  # no window of a canonical line reaches further than this from its start
_POW10 = 10 ** np.arange(19, dtype=np.int64)
_TS_SEPS = np.array([4, 7, 10, 13, 16, 19])
_TS_SEP_BYTES = np.frombuffer(b"-- ::.", dtype=np.uint8)
_TOKEN = 40  # longest number the fast path cuts; longer ones take the general path
_FRAC_WEIGHTS = _POW10[8::-1]  # 10^8 .. 10^0: fraction digits straight to nanoseconds
_FETCH_KEYS = ("gpu", "worker", "idx", "end", "fetch_s")  # the general path's columns, in order
_TRAIN_KEYS = (
    *("gpu", "epoch", "iteration", "total", "start"),
    *("iteration_s", "stall_s", "throughput"),
)


def _gather(raw: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Row i: the ``width`` bytes of ``raw`` from ``pos[i]`` (a copy, one row per line)."""
    return np.lib.stride_tricks.sliding_window_view(raw, width)[pos]


def _lit(win: np.ndarray, col: int, text: bytes) -> np.ndarray:
    return (win[:, col : col + len(text)] == np.frombuffer(text, dtype=np.uint8)).all(axis=1)


def _run(win: np.ndarray, col: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Digits from ``col`` and the length of their run, 0 when none or longer than ``width``."""
    d = win[:, col : col + width + 1] - np.uint8(48)
    return d[:, :width], (d < 10).argmin(axis=1)


def _int_value(d: np.ndarray, length: np.ndarray) -> np.ndarray:
    width = d.shape[1]
    keep = np.arange(width) < length[:, None]
    full = np.where(keep, d, 0).astype(np.int64) @ _POW10[width - 1 :: -1]
    return full // _POW10[width - length]


def _token(win: np.ndarray, col: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A plain decimal (digits with at most one inner point) from ``col``: bytes, length, ok."""
    c = win[:, col : col + _TOKEN + 1]
    digit = (c - np.uint8(48)) < 10
    point = c == 46
    length = (digit | point).argmin(axis=1)
    points = (point & (np.arange(_TOKEN + 1) < length[:, None])).sum(axis=1)
    last = digit[np.arange(len(c)), np.maximum(length - 1, 0)]
    ok = (length >= 1) & (points <= 1) & digit[:, 0] & last
    return c, length, ok


def _avg(win: np.ndarray, col: int) -> np.ndarray:
    """Length of the ``(avg)`` text from ``col``: digits and points only, at most _TOKEN."""
    c = win[:, col : col + _TOKEN + 1]
    return (((c - np.uint8(48)) < 10) | (c == 46)).argmin(axis=1)


def _floats(c: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The tokens as float64 by Arrow's cast: the general path's rounding, to the bit."""
    if len(c) == 0:
        return np.zeros(0)
    data = c[np.arange(c.shape[1]) < length[:, None]]  # row-major: the tokens, back to back
    offsets = np.concatenate(([0], np.cumsum(length))).astype(np.int64)
    text = pa.LargeStringArray.from_buffers(
        len(c), pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))
    )
    return pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False)


def _fast_records(
    lines: pa.LargeStringArray, numbers: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Records of the canonical lines, and the indices of all other lines (for the general path).

    Lines near the end of the buffer are cut from a zero-padded copy of the
    tail so that every window stays inside memory.
    """
    n = len(lines)
    _, offsets_buf, data_buf = lines.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[lines.offset : lines.offset + n + 1]
    raw = np.frombuffer(data_buf, dtype=np.uint8)[: offsets[-1]]
    starts, ends = offsets[:-1], offsets[1:]
    split = int(np.searchsorted(starts, len(raw) - _REACH, side="right"))
    tail0 = int(starts[split]) if split < n else len(raw)
    padded = np.concatenate([raw[tail0:], np.zeros(_REACH, dtype=np.uint8)])
    fetch_parts, train_parts, taken = [], [], []
    for buf, lo, hi, shift in ((raw, 0, split, 0), (padded, split, n, tail0)):
        if hi > lo:
            f_rows, fetch, t_rows, train = _cut(buf, starts[lo:hi] - shift, ends[lo:hi] - shift)
            fetch_parts.append({"line": numbers[lo + f_rows]} | {k: fetch[k] for k in _FETCH_KEYS})
            train_parts.append({"line": numbers[lo + t_rows]} | {k: train[k] for k in _TRAIN_KEYS})
            taken += [lo + f_rows, lo + t_rows]
    keep = np.ones(n, dtype=bool)
    keep[np.concatenate(taken)] = False
    return _stack(fetch_parts), _stack(train_parts), np.flatnonzero(keep)


def _stack(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _cut(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Cut canonical lines at ``starts`` (exclusive ``ends``) of ``raw``: fetch and train rows."""
    content_end = ends - (raw[ends - 1] == 10)
    content_end = content_end - ((content_end > starts) & (raw[content_end - 1] == 13))
    head = _gather(raw, starts, 30)  # timestamp, point, fraction of up to 9 digits, one more
    ok = (head[:, _TS_SEPS] == _TS_SEP_BYTES).all(axis=1)
    ts_digits = head[:, _TS_DIGITS] - np.uint8(48)
    ok &= (ts_digits < 10).all(axis=1)
    frac, frac_len = _run(head, 20, 9)
    ok &= (frac_len >= 1) & (head[np.arange(len(head)), 20 + frac_len] == 32)
    kind_at = starts + 21 + frac_len
    kind = raw[kind_at]
    f_rows = np.flatnonzero(ok & (kind == ord("D")))
    t_rows = np.flatnonzero(ok & (kind == ord("G")))
    f_ok, fetch = _cut_fetch(raw, kind_at[f_rows], content_end[f_rows])
    t_ok, train = _cut_train(raw, kind_at[t_rows], content_end[t_rows])
    f_rows, t_rows = f_rows[f_ok], t_rows[t_ok]  # the values are of these rows only
    ns = []
    for rows in (f_rows, t_rows):
        whole, ts_ok = _civil_from_digits(ts_digits[rows].astype(np.int64))
        frac_ns = np.where(np.arange(9) < frac_len[rows, None], frac[rows], 0).astype(np.int64)
        ns.append((whole * 1_000_000_000 + frac_ns @ _FRAC_WEIGHTS, ts_ok))
    (fetch["end"], f_ts), (train["start"], t_ts) = ns
    fetch = {k: v[f_ts] for k, v in fetch.items()}
    train = {k: v[t_ts] for k, v in train.items()}
    return f_rows[f_ts], fetch, t_rows[t_ts], train


def _cut_fetch(raw: np.ndarray, at: np.ndarray, end: np.ndarray):
    """``DEBUG:\\tGPU: g worker_id: w, END FETCH at_time a data idxi`` from ``at`` to ``end``."""
    w = _gather(raw, at, 12 + 7)
    ok = _lit(w, 0, b"DEBUG:\tGPU: ")
    gpu, gpu_len = _run(w, 12, 6)
    p = at + 12 + gpu_len
    w = _gather(raw, p, 12 + 7)
    ok &= (gpu_len >= 1) & _lit(w, 0, b" worker_id: ")
    worker, worker_len = _run(w, 12, 6)
    p = p + 12 + worker_len
    w = _gather(raw, p, 20 + _TOKEN + 1)
    ok &= (worker_len >= 1) & _lit(w, 0, b", END FETCH at_time ")
    tok, tok_len, tok_ok = _token(w, 20)
    p = p + 20 + tok_len
    w = _gather(raw, p, 9 + 10)
    ok &= tok_ok & _lit(w, 0, b" data idx")
    idx, idx_len = _run(w, 9, 9)
    ok &= (idx_len >= 1) & (p + 9 + idx_len == end)
    rows = np.flatnonzero(ok)
    fetch_s = _floats(tok[rows], tok_len[rows])
    good = fetch_s <= MAX_FETCH_S  # the general path names the reason for larger ones
    rows = rows[good]
    ok = np.zeros(len(at), dtype=bool)
    ok[rows] = True
    return ok, {
        "gpu": _int_value(gpu[rows], gpu_len[rows]),
        "worker": _int_value(worker[rows], worker_len[rows]),
        "idx": _int_value(idx[rows], idx_len[rows]),
        "fetch_s": fetch_s[good],
    }


def _cut_train(raw: np.ndarray, at: np.ndarray, end: np.ndarray):
    """``GPU: g Epoch: [e][  i/n]\\tTime t (t)\\tData d (d)[\\tThroughput p (p)]`` from ``at``."""
    w = _gather(raw, at, 5 + 7)
    ok = _lit(w, 0, b"GPU: ")
    gpu, gpu_len = _run(w, 5, 6)
    p = at + 5 + gpu_len
    w = _gather(raw, p, 9 + 7)
    ok &= (gpu_len >= 1) & _lit(w, 0, b" Epoch: [")
    epoch, epoch_len = _run(w, 9, 6)
    p = p + 9 + epoch_len
    w = _gather(raw, p, 2 + 13)
    ok &= (epoch_len >= 1) & _lit(w, 0, b"][")
    p = p + 2 + (w[:, 2:] == 32).argmin(axis=1)  # the padding of the iteration index
    w = _gather(raw, p, 10)
    iteration, iteration_len = _run(w, 0, 9)
    p = p + iteration_len
    w = _gather(raw, p, 1 + 10)
    ok &= (iteration_len >= 1) & _lit(w, 0, b"/")
    total, total_len = _run(w, 1, 9)
    p = p + 1 + total_len
    values = []
    for label in (b"]\tTime ", b")\tData "):
        w = _gather(raw, p, 7 + _TOKEN + 1)
        ok &= _lit(w, 0, label)
        tok, tok_len, tok_ok = _token(w, 7)
        values.append((tok, tok_len))
        p = p + 7 + tok_len
        w = _gather(raw, p, 2 + _TOKEN + 1)
        ok &= tok_ok & _lit(w, 0, b" (")
        p = p + 2 + _avg(w, 2)
    w = _gather(raw, p, 13 + _TOKEN + 1)
    ok &= _lit(w, 0, b")")
    no_tp = p + 1 == end
    tp, tp_len, tp_ok = _token(w, 13)
    q = p + 13 + tp_len
    w = _gather(raw, q, 2 + _TOKEN + 1)
    q = q + 2 + _avg(w, 2)
    has_tp = _lit(_gather(raw, p, 13), 0, b")\tThroughput ") & tp_ok & _lit(w, 0, b" (")
    has_tp &= (raw[q] == 41) & (q + 1 == end)
    ok &= no_tp | has_tp
    rows = np.flatnonzero(ok)
    iteration_v = _int_value(iteration[rows], iteration_len[rows])
    total_v = _int_value(total[rows], total_len[rows])
    good = iteration_v < total_v  # the general path names the reason otherwise
    rows = rows[good]
    ok = np.zeros(len(at), dtype=bool)
    ok[rows] = True
    with_tp = np.flatnonzero(has_tp[rows])
    throughput = np.full(len(rows), np.nan)
    throughput[with_tp] = _floats(tp[rows[with_tp]], tp_len[rows[with_tp]])
    (time_tok, time_len), (data_tok, data_len) = values
    return ok, {
        "gpu": _int_value(gpu[rows], gpu_len[rows]),
        "epoch": _int_value(epoch[rows], epoch_len[rows]),
        "iteration": iteration_v[good],
        "total": total_v[good],
        "iteration_s": _floats(time_tok[rows], time_len[rows]),
        "stall_s": _floats(data_tok[rows], data_len[rows]),
        "throughput": throughput,
    }
