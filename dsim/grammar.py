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


def lines_of(block: bytes | memoryview) -> pa.LargeStringArray:
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
        return lines_of(bytes(block).decode("utf-8", errors="replace").encode("utf-8"))
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
    return _civil(century * 100 + yy, month, day, hour, minute, second)


def _civil(year, month, day, hour, minute, second) -> tuple[np.ndarray, np.ndarray]:
    """Seconds since 1970 of civil times given field by field (int64 arrays), and validity.

    Lines in a block nearly all share a date, so the calendar (the costly
    part) runs once per run of equal dates, not once per line.
    """
    n = len(year)
    date = (year * 100 + month) * 100 + day
    change = np.ones(n, dtype=bool)
    change[1:] = date[1:] != date[:-1]
    first = np.flatnonzero(change)
    if len(first) * 4 < n:
        days, ok = _days(year[first], month[first], day[first])
        which = np.cumsum(change) - 1
        days, ok = days[which], ok[which]
    else:
        days, ok = _days(year, month, day)
    ok &= (hour < 24) & (minute < 60) & (second < 60)
    seconds = days * 86400 + hour * 3600 + minute * 60 + second
    return np.where(ok, seconds, 0), ok


def _days(year, month, day) -> tuple[np.ndarray, np.ndarray]:
    """Days since 1970 of real dates (proleptic Gregorian), and which dates are real."""
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    good_month = (month >= 1) & (month <= 12)
    days_in_month = _DAYS_IN_MONTH[np.where(good_month, month, 0)] + (leap & (month == 2))
    ok = good_month & (day >= 1) & (day <= days_in_month)
    # Days from civil (H. Hinnant): March-based years make February the last month.
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468, ok


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
# once, one field after the other, each step one vector operation over all
# lines. A line is taken here only if every byte is where the canonical
# spelling puts it and every value is valid; anything else (and any doubt)
# goes to the general path, so the result is the same either way.
#
# The work is column-wise: every step gathers one 8-byte word per line at that
# line's current offset (an unaligned little-endian view of the buffer) and
# answers its question for all 8 bytes at once with bit arithmetic (SWAR): is
# this the literal, how long is the run of digits, what is its value.
# Row-wise windows ([lines, width] bytes reduced along the short axis) cost
# several times more.

_REACH = 512  # no word of a canonical line is read further than this from its start
_U = np.uint64
_LOW7 = _U(0x7F7F7F7F7F7F7F7F)
_HIGH = _U(0x8080808080808080)
_NIBBLES = _U(0x0F0F0F0F0F0F0F0F)
_POW10 = 10 ** np.arange(19, dtype=np.int64)
_POW10_U = _POW10.astype(np.uint64)
_POW10_F = 10.0 ** np.arange(23)  # exact doubles up to 10^22
_EXACT = 1 << 53  # integers below this are exact doubles
_FETCH_KEYS = ("gpu", "worker", "idx", "end", "fetch_s")  # the general path's columns, in order
_TRAIN_KEYS = (
    *("gpu", "epoch", "iteration", "total", "start"),
    *("iteration_s", "stall_s", "throughput"),
)


def _words(buf: np.ndarray) -> np.ndarray:
    """Every byte offset of ``buf`` as the start of an 8-byte record (indexing copies the bytes).

    ``V8`` has alignment 1, so NumPy gathers it with plain 8-byte copies; the
    unaligned ``<u8`` view would take a slow element-by-element path.
    """
    return np.ndarray((len(buf) - 7,), dtype="V8", buffer=buf, strides=(1,))


def _word(words: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The 8 bytes at each ``pos`` as little-endian integers: byte ``pos`` is the lowest."""
    return words[pos].view("<u8")


def _not_digit(x: np.ndarray) -> np.ndarray:
    """High bit of each byte that is not an ASCII digit (exact: no carry crosses a byte)."""
    t = x ^ _U(0x3030303030303030)
    return (((t & _LOW7) + _U(0x7676767676767676)) | t) & _HIGH


def _not_byte(x: np.ndarray, byte: int) -> np.ndarray:
    """High bit of each byte that differs from ``byte``."""
    t = x ^ _U(byte * 0x0101010101010101)
    return (((t & _LOW7) + _LOW7) | t) & _HIGH


def _not_number(x: np.ndarray) -> np.ndarray:
    """High bit of each byte that is neither a digit nor a point."""
    return _not_digit(x) & _not_byte(x, 46)


def _not_space(x: np.ndarray) -> np.ndarray:
    return _not_byte(x, 32)


def _first(mask: np.ndarray) -> np.ndarray:
    """Index of the first byte whose high bit is set; 8 when none is (count trailing zeros / 8)."""
    return np.bitwise_count((mask - _U(1)) & ~mask) >> np.uint8(3)  # uint8: fewer bytes to move


def _swar(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Value of the ``n`` (0..8) digits at the low end of each word (the classic SWAR reduction).

    Shifting left by the bytes after the run drops them and puts leading zeros
    in front: the first digit, the lowest byte, is the most significant.
    """
    x = (x << ((8 - n) << np.uint8(3))) & _NIBBLES
    x = (x * _U(10 * 256 + 1)) >> _U(8)
    x = ((x & _U(0x00FF00FF00FF00FF)) * _U(100 * 65536 + 1)) >> _U(16)
    return ((x & _U(0x0000FFFF0000FFFF)) * _U(10000 * (1 << 32) + 1)) >> _U(32)


def _span(words: np.ndarray, pos: np.ndarray, outside, count: int) -> np.ndarray:
    """Length of the run of bytes from ``pos`` that ``outside`` does not flag, at most 8 * count.

    A run that fills all ``count`` words reads as exactly 8 * count: callers treat it as too long.
    """
    n = _first(outside(_word(words, pos)))
    rows = np.flatnonzero(n == 8)
    for k in range(1, count):
        if len(rows) == 0:
            break
        m = _first(outside(_word(words, pos[rows] + 8 * k)))
        n[rows] += m
        rows = rows[m == 8]
    return n


def _digits(words: np.ndarray, pos: np.ndarray, count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Value (uint64) and length of the run of digits at ``pos``, reading at most ``count`` words.

    The length is exact below 8 * count (8 * count means "at least"); the value
    is exact for runs of at most 16 digits.
    """
    x = _word(words, pos)
    n = _first(_not_digit(x))
    value = _swar(x, n)
    rows = np.flatnonzero(n == 8)
    if count > 1 and len(rows):
        y = _word(words, pos[rows] + 8)
        m = _first(_not_digit(y))
        value[rows] = value[rows] * _POW10_U[m] + _swar(y, m)
        n[rows] += m
        rows = rows[m == 8]
        if count > 2 and len(rows):
            n[rows] += _span(words, pos[rows] + 16, _not_digit, count - 2)
    return value, n


def _lit(words: np.ndarray, pos: np.ndarray, text: bytes) -> np.ndarray:
    """Whether ``text`` is at each ``pos``: whole words compared with constants."""
    ok = None
    for k in range(0, len(text), 8):
        chunk = text[k : k + 8]
        x = _word(words, pos + k if k else pos)
        if len(chunk) < 8:
            x = x & _U((1 << (8 * len(chunk))) - 1)
        same = x == _U(int.from_bytes(chunk, "little"))
        ok = same if ok is None else ok & same
    return ok


def _number(
    words: np.ndarray, raw: np.ndarray, pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A plain decimal ``digits[.digits]`` at ``pos``: value, length, ok, and value exact.

    ``m`` digits in all with ``k`` after the point are the integer ``m``
    divided by 10^k; while both are exact doubles (``m`` < 2^53, k <= 22) one
    IEEE division rounds the true quotient correctly, which is what any
    correct decimal parser (Arrow's cast included) returns. Longer numbers are
    left to Arrow (``exact`` False).
    """
    whole, a = _digits(words, pos, 2)
    point = raw[pos + a] == 46
    frac, b = _digits(words, pos + a + 1, 3)
    b = np.where(point, b, 0)
    length = a + point + b
    ok = (a >= 1) & (a < 16) & ~(point & ((b < 1) | (b >= 24)))
    mantissa = whole * _POW10_U[np.minimum(b, 18)] + np.where(point, frac, _U(0))
    exact = (a + b <= 16) & (mantissa < _U(_EXACT))
    value = mantissa.view(np.int64).astype(np.float64) / _POW10_F[np.minimum(b, 22)]
    return value, length, ok, exact


def _arrow_floats(raw: np.ndarray, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Tokens at ``pos`` as float64 by Arrow's cast (the general path's parser), to the bit."""
    if len(pos) == 0:
        return np.zeros(0)
    offsets = np.concatenate(([0], np.cumsum(length))).astype(np.int64)
    flat = np.repeat(pos - offsets[:-1], length) + np.arange(offsets[-1])
    text = pa.LargeStringArray.from_buffers(
        len(pos), pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(raw[flat]))
    )
    return pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False)


def _float_values(raw, pos, length, value, exact, rows) -> np.ndarray:
    """``value`` at ``rows``, with Arrow's parse where the quick one is not exact."""
    out = value[rows]
    slow = np.flatnonzero(~exact[rows])
    if len(slow):
        out[slow] = _arrow_floats(raw, pos[rows[slow]], length[rows[slow]])
    return out


def _fast_records(
    lines: pa.LargeStringArray, numbers: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Records of the canonical lines, and the indices of all other lines (for the general path).

    Lines near the end of the buffer are cut from a zero-padded copy of the
    tail so that every word read stays inside memory.
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


def _byte(word: np.ndarray, k: int) -> np.ndarray:
    return ((word >> _U(8 * k)) & _U(0xFF)).view(np.int64)


# The timestamp ``YYYY-mm-dd HH:MM:SS.f``: three words from the line start; per word the
# bytes that must be digits and the separators (mask, value) at their places.
_TS_WORDS = ((b"dddd-dd-", 0), (b"dd dd:dd", 8), (b":dd.", 16))


def _ts_checks():
    out = []
    for pattern, at in _TS_WORDS:
        digit = sum(0x80 << (8 * i) for i, c in enumerate(pattern) if c == ord("d"))
        sep = sum(0xFF << (8 * i) for i, c in enumerate(pattern) if c != ord("d"))
        value = sum(c << (8 * i) for i, c in enumerate(pattern) if c != ord("d"))
        out.append((at, _U(digit), _U(sep), _U(value)))
    return out


_TS_CHECKS = _ts_checks()


def _pairs(word: np.ndarray) -> np.ndarray:
    """Byte k becomes 10 * digit k + digit k+1: two-digit fields read off single bytes."""
    return ((word & _NIBBLES) * _U(10 * 256 + 1)) >> _U(8)


def _cut(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Cut canonical lines at ``starts`` (exclusive ``ends``) of ``raw``: fetch and train rows."""
    words = _words(raw)
    content_end = ends - (raw[ends - 1] == 10)
    content_end = content_end - ((content_end > starts) & (raw[content_end - 1] == 13))
    ok = None
    ts = []
    for at, digit, sep, value in _TS_CHECKS:
        w = _word(words, starts + at)
        good = ((_not_digit(w) & digit) == 0) & ((w & sep) == value)
        ok = good if ok is None else ok & good
        ts.append(_pairs(w))
    frac, frac_len = _digits(words, starts + 20, 2)
    ok &= (frac_len >= 1) & (frac_len <= 9) & (raw[starts + 20 + frac_len] == 32)
    kind_at = starts + 21 + frac_len
    kind = raw[kind_at]
    f_rows = np.flatnonzero(ok & (kind == ord("D")))
    t_rows = np.flatnonzero(ok & (kind == ord("G")))
    f_ok, fetch = _cut_fetch(words, raw, kind_at[f_rows], content_end[f_rows])
    t_ok, train = _cut_train(words, raw, kind_at[t_rows], content_end[t_rows])
    f_rows, t_rows = f_rows[f_ok], t_rows[t_ok]  # the values are of these rows only
    w0, w1, w2 = ts
    frac_ns = frac.view(np.int64) * _POW10[9 - np.minimum(frac_len, 9)]
    ns = []
    for rows in (f_rows, t_rows):
        a, b = w0[rows], w1[rows]
        year = _byte(a, 0) * 100 + _byte(a, 2)
        fields = (_byte(a, 5), _byte(b, 0), _byte(b, 3), _byte(b, 6), _byte(w2[rows], 1))
        whole, ts_ok = _civil(year, *fields)
        ns.append((whole * 1_000_000_000 + frac_ns[rows], ts_ok))
    (fetch["end"], f_ts), (train["start"], t_ts) = ns
    if not f_ts.all():
        fetch = {k: v[f_ts] for k, v in fetch.items()}
        f_rows = f_rows[f_ts]
    if not t_ts.all():
        train = {k: v[t_ts] for k, v in train.items()}
        t_rows = t_rows[t_ts]
    return f_rows, fetch, t_rows, train


def _taken(value: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return value[rows].view(np.int64)


def _cut_fetch(words: np.ndarray, raw: np.ndarray, at: np.ndarray, end: np.ndarray):
    """``DEBUG:\\tGPU: g worker_id: w, END FETCH at_time a data idxi`` from ``at`` to ``end``."""
    ok = _lit(words, at, b"DEBUG:\tGPU: ")
    gpu, gpu_len = _digits(words, at + 12)
    p = at + 12 + gpu_len
    ok &= (gpu_len >= 1) & (gpu_len <= 6) & _lit(words, p, b" worker_id: ")
    worker, worker_len = _digits(words, p + 12)
    p = p + 12 + worker_len
    ok &= (worker_len >= 1) & (worker_len <= 6) & _lit(words, p, b", END FETCH at_time ")
    tok_at = p + 20
    value, tok_len, tok_ok, exact = _number(words, raw, tok_at)
    p = tok_at + tok_len
    ok &= tok_ok & _lit(words, p, b" data idx")
    idx, idx_len = _digits(words, p + 9, 2)
    ok &= (idx_len >= 1) & (idx_len <= 9) & (p + 9 + idx_len == end)
    rows = np.flatnonzero(ok)
    fetch_s = _float_values(raw, tok_at, tok_len, value, exact, rows)
    good = fetch_s <= MAX_FETCH_S  # the general path names the reason for larger ones
    if not good.all():
        rows, fetch_s = rows[good], fetch_s[good]
    ok = np.zeros(len(at), dtype=bool)
    ok[rows] = True
    return ok, {
        "gpu": _taken(gpu, rows),
        "worker": _taken(worker, rows),
        "idx": _taken(idx, rows),
        "fetch_s": fetch_s,
    }


def _value_then_avg(words: np.ndarray, raw: np.ndarray, p: np.ndarray, label: bytes):
    """``<label><number> (<avg>)`` from ``p``: the number's parts and the offset of ``)``."""
    ok = _lit(words, p, label)
    tok_at = p + len(label)
    value, tok_len, tok_ok, exact = _number(words, raw, tok_at)
    p = tok_at + tok_len
    ok &= tok_ok & _lit(words, p, b" (")
    avg = _span(words, p + 2, _not_number, 4)
    ok &= avg < 32
    return ok, (tok_at, tok_len, value, exact), p + 2 + avg


def _cut_train(words: np.ndarray, raw: np.ndarray, at: np.ndarray, end: np.ndarray):
    """``GPU: g Epoch: [e][  i/n]\\tTime t (t)\\tData d (d)[\\tThroughput p (p)]`` from ``at``."""
    ok = _lit(words, at, b"GPU: ")
    gpu, gpu_len = _digits(words, at + 5)
    p = at + 5 + gpu_len
    ok &= (gpu_len >= 1) & (gpu_len <= 6) & _lit(words, p, b" Epoch: [")
    epoch, epoch_len = _digits(words, p + 9)
    p = p + 9 + epoch_len
    ok &= (epoch_len >= 1) & (epoch_len <= 6) & _lit(words, p, b"][")
    pad = _span(words, p + 2, _not_space, 2)  # the padding of the iteration index
    iteration, iteration_len = _digits(words, p + 2 + pad, 2)
    p = p + 2 + pad + iteration_len
    ok &= (pad < 16) & (iteration_len >= 1) & (iteration_len <= 9) & (raw[p] == 47)
    total, total_len = _digits(words, p + 1, 2)
    p = p + 1 + total_len
    ok &= (total_len >= 1) & (total_len <= 9)
    time_ok, time_tok, p = _value_then_avg(words, raw, p, b"]\tTime ")
    data_ok, data_tok, p = _value_then_avg(words, raw, p, b")\tData ")
    ok &= time_ok & data_ok & (raw[p] == 41)
    no_tp = p + 1 == end
    tp_ok, tp_tok, q = _value_then_avg(words, raw, p, b")\tThroughput ")
    has_tp = tp_ok & (raw[q] == 41) & (q + 1 == end)
    ok &= no_tp | has_tp
    rows = np.flatnonzero(ok)
    iteration_v, total_v = _taken(iteration, rows), _taken(total, rows)
    good = iteration_v < total_v  # the general path names the reason otherwise
    if not good.all():
        rows, iteration_v, total_v = rows[good], iteration_v[good], total_v[good]
    ok = np.zeros(len(at), dtype=bool)
    ok[rows] = True
    with_tp = rows[has_tp[rows]]
    throughput = np.full(len(rows), np.nan)
    throughput[has_tp[rows]] = _float_values(raw, *tp_tok, with_tp)
    return ok, {
        "gpu": _taken(gpu, rows),
        "epoch": _taken(epoch, rows),
        "iteration": iteration_v,
        "total": total_v,
        "iteration_s": _float_values(raw, *time_tok, rows),
        "stall_s": _float_values(raw, *data_tok, rows),
        "throughput": throughput,
    }
