"""Read one raw log file in blocks and collect its records.

Memory follows the records, not the text: the file is read in blocks of a
few megabytes, each block is dissected by ``dsim.sources.rawlog.grammar`` and only the
typed columns of its records are kept.

A line longer than ``max_line`` bytes ends the read with an error naming its
file and line (docs/SPEC.md §1.2): without that bound the unfinished line
carried from block to block is copied whole into every next block, so one
line of N bytes costs N²/block bytes of copying and N of memory (a 512 MB
line took 107 s and 2.7 GB; a gzip of NULs, 10 GB of one "line", ran out of
memory). With it, the carried text never exceeds ``max_line`` and the read
stays linear in time and bounded in memory whatever the file holds.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsim.errors import InputError
from dsim.io import compression
from dsim.sources.rawlog import bounds, grammar

BLOCK_BYTES = 4 << 20  # the per-block windows and masks stay small next to the records
OUT_OF_MEMORY = "out of memory reading this file (its records do not fit in memory)"
MAX_LINE_BYTES = 1 << 20  # the longest line read (bytes before its \n); real lines are < 1 KB

# Counters and indices fit 32 bits (the grammar allows at most 9 digits); halving
# them keeps the records of a long run close to the size of its tables.
_NARROW = ("gpu", "worker", "idx", "epoch", "iteration", "total")
SPARE = 1.05  # columns are sized for the whole file from the records per byte so far, plus this


@dataclass
class FileRecords:
    """Everything one file contributed: record columns, line counts, rejects, identity."""

    path: Path
    fetch: dict[str, np.ndarray]
    train: dict[str, np.ndarray]
    counts: dict[str, int]
    rejects: grammar.Rejects
    size: int
    sha256: str
    ends_with_newline: bool = True
    compression: str | None = None  # the format the file was stored in, if compressed
    loader: list[dict[str, int | None]] = field(default_factory=list)


class Columns:
    """Record columns that grow block by block in place, with room to spare at the end.

    Appending every block's records to arrays sized for the whole file (from
    the first block's records per byte) replaces lists of small per-block
    arrays joined at the end: no second copy at the join, and no small
    long-lived arrays left between the blocks' freed temporaries, which would
    keep the allocator from reusing or returning that memory. Spare room that
    is never written is never touched, so it costs address space, not memory.
    The run's records are gathered from its files the same way
    (``dsim.sources.rawlog.parse``). An optional column appended only as
    ``absent_as_views``'s view of one NaN stays such a view (no memory).
    """

    def __init__(self) -> None:
        self.columns: dict[str, np.ndarray] = {}
        self.absent: set[str] = set()  # optional columns no record carried so far
        self.rows = 0

    def append(self, records: dict[str, np.ndarray], expected: int) -> None:
        count = len(records["line"])
        if not self.columns:
            self.absent = {k for k in OPTIONAL if k in records and _all_nan(records[k])}
            self.columns = {
                k: np.empty(0 if k in self.absent else max(count, expected), narrow_dtype(k, v))
                for k, v in records.items()
            }
        capacity = len(self.columns["line"])
        if self.rows + count > capacity:
            self._resize(max(self.rows + count, capacity * 2))
        end = self.rows + count
        lines = self.columns["line"]
        if count and records["line"][-1] > _LINE_MAX and lines.dtype != np.int64:
            self.columns["line"] = lines.astype(np.int64)  # a file of over 4 G lines
        for key, values in records.items():
            if key in self.absent:
                if _all_nan(values):
                    continue
                self._materialize(key)
            self.columns[key][self.rows : end] = values
        self.rows = end

    def adopt(self, records: dict[str, np.ndarray]) -> None:
        """Hold ``records`` as they are, when nothing else will be appended (no copy)."""
        assert not self.columns, "adopt replaces nothing"
        self.columns, self.rows = dict(records), len(records["line"])

    def _materialize(self, key: str) -> None:
        """An optional column met with values: NaN for the rows before, room as the others."""
        column = np.empty(len(self.columns["line"]), np.float64)
        column[: self.rows] = np.nan
        self.columns[key] = column
        self.absent.discard(key)

    def _resize(self, capacity: int) -> None:
        for key, old in self.columns.items():
            if key in self.absent:
                continue
            new = np.empty(capacity, old.dtype)
            new[: self.rows] = old[: self.rows]
            self.columns[key] = new

    def result(self) -> dict[str, np.ndarray]:
        nan = np.broadcast_to(np.float64(np.nan), self.rows)
        return {k: nan if k in self.absent else v[: self.rows] for k, v in self.columns.items()}


def _all_nan(values: np.ndarray) -> bool:
    """Whether an optional column holds no value: nothing to keep (most logs carry none)."""
    return bounds.absent(values) or bool(np.isnan(values).all())


PIECE_LINES = 1 << 18  # lines parsed at once (a block of ordinary lines holds ~40,000)
HEAD_BYTES = 4096  # text bytes looked at to tell a binary file from a log
_LINE_MAX = np.iinfo(np.uint32).max  # line numbers are uint32 up to here, then int64


def narrow_dtype(key: str, values: np.ndarray) -> np.dtype:
    """The dtype a record column is kept in (counters int32, line numbers uint32)."""
    if key in _NARROW:
        return np.dtype(np.int32)
    if key == "line":
        return np.dtype(np.uint32)
    return values.dtype


# NaN on a line that does not carry them; most logs never do (SPEC §1.2: CPU times, stages,
# an IterableDataset's stream position)
OPTIONAL = (
    *("cpu_s", "runq_s", "proc_cpu_s", "read_s", "read_cpu_s", "collate_s", "collate_cpu_s"),
    "stream",
)


def absent_as_views(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``columns`` with each optional column that no record carries as a view of one NaN.

    Why: two float columns of NaN are 16 bytes a record, a third of a
    fetch record's size, kept until the tables are built, which leave them
    out anyway (SPEC §2.1). A zero-stride view costs no memory; the records
    read the same.
    """
    for key in OPTIONAL:
        values = columns.get(key)
        if values is not None and len(values) and np.isnan(values).all():
            columns[key] = np.broadcast_to(np.float64(np.nan), len(values))
    return columns


def _read_head(handle, size: int) -> bytes:
    """Up to ``size`` bytes from the start (pipes may deliver fewer per read)."""
    head = b""
    while len(head) < size:
        chunk = handle.read(size - len(head))
        if not chunk:
            break
        head += chunk
    return head


def read_log(
    path: Path,
    progress: Callable[[int], None] | None = None,
    block_bytes: int = BLOCK_BYTES,
    *,
    max_duration: float = grammar.MAX_DURATION_S,
    max_line: int = MAX_LINE_BYTES,
) -> FileRecords:
    """Parse one file; ``progress`` is called with the number of bytes consumed per block.

    Durations above ``max_duration`` seconds are rejected (``dsim.sources.rawlog.bounds``).
    A line longer than ``max_line`` bytes (its ``\n`` not counted) is an ``InputError``
    naming the file and the line, raised as soon as the line is seen to be too long.
    """
    digest = hashlib.sha256()
    rejects = grammar.Rejects()
    fetch, train = Columns(), Columns()
    counts: dict[str, int] = {}
    loader: list[dict[str, int | None]] = []
    size = 0
    consumed = 0
    expected_size = 0
    next_line = 1
    carry = b""
    last_byte = b"\n"

    def too_long(line: int) -> InputError:
        reason = f"line longer than {max_line} bytes"
        if not (fetch.rows or train.rows) and compression.looks_binary(text_head):
            reason += f" ({compression.describe_binary(text_head, fmt)})"
        return InputError(reason, path, line)

    def consume(block: bytes | memoryview) -> None:
        ends = np.frombuffer(block, dtype=np.uint8) == 10
        count = int(np.count_nonzero(ends))
        if count <= PIECE_LINES:
            consume_piece(block, np.flatnonzero(ends))
            return
        # Millions of tiny lines in one block (a text of newlines): the per-line arrays
        # would take ~100 bytes a line, 400 MB a block; pieces of about PIECE_LINES lines,
        # cut after a line end, keep them small.
        step = max(len(block) * PIECE_LINES // count, 1)
        start = 0
        while start < len(block):
            stop = min(start + step, len(block))
            if stop < len(block) and not ends[stop - 1]:
                after = ends[stop:]
                stop = stop + int(np.argmax(after)) + 1 if after.any() else len(block)
            consume_piece(block[start:stop], np.flatnonzero(ends[start:stop]))
            start = stop

    def consume_piece(block: bytes | memoryview, newlines: np.ndarray) -> None:
        """Lines that start at the start of ``block``; ``newlines``: where their ``\\n`` are."""
        if len(newlines):
            spans = np.diff(newlines, prepend=-1)  # bytes of each line with its \n
            if spans.max() > max_line + 1:
                raise too_long(next_line + int(np.argmax(spans > max_line + 1)))
            del spans
        consume_lines(block, newlines)

    def consume_lines(block: bytes | memoryview, newlines: np.ndarray) -> None:
        nonlocal next_line, consumed
        lines = grammar.lines_of(block, newlines)
        records = grammar.parse_lines(lines, next_line, rejects, max_duration=max_duration)
        consumed += len(block)
        at = size if fmt is not None else consumed  # how far into the file as stored
        scale = max(expected_size, at) / max(at, 1) * SPARE
        for part, columns in ((records.fetch, fetch), (records.train, train)):
            columns.append(part, int((columns.rows + len(part["line"])) * scale) + 1)
        for key, value in records.counts.items():
            counts[key] = counts.get(key, 0) + value
        loader.extend(records.loader)
        next_line += len(lines)

    def stored(data: memoryview) -> None:
        """Bytes of a compressed file as stored: hashed, counted, shown as progress."""
        nonlocal size
        digest.update(data)
        size += len(data)
        if progress is not None:
            progress(len(data))

    fmt: compression.Format | None = None
    text_head = b""
    try:
        with open(path, "rb", buffering=0) as handle:
            expected_size = os.fstat(handle.fileno()).st_size  # 0 for pipes: columns then double
            carry = _read_head(handle, compression.MAGIC_BYTES)
            fmt = compression.detect(carry)
            reader = handle
            if fmt is not None:
                # The same block loop reads the text; hash, size and progress follow the file.
                reader = compression.open_stored(handle, carry, fmt, stored)
                carry = b""
            text_head = carry
            digest.update(carry)
            size += len(carry)
            if carry:
                last_byte = carry[-1:]
                if progress is not None:
                    progress(len(carry))
            while True:
                # Each block gets its own buffer, the carried partial line copied to its
                # front, and the file read straight behind it: no copy of the block itself.
                # A plain file's buffer is no larger than what is left of it (+1 to see its
                # end): zero-filling 4 MiB for a 20 kB file cost more than parsing it.
                room = block_bytes
                if fmt is None and expected_size:
                    room = min(block_bytes, max(expected_size - size, 0) + 1)
                buf = bytearray(len(carry) + room)
                buf[: len(carry)] = carry
                view = memoryview(buf)
                got = reader.readinto(view[len(carry) :])
                if not got:
                    cut = carry.rfind(b"\n")  # only a file of a few bytes ends with lines here
                    if cut >= 0:
                        consume(carry[: cut + 1])
                        carry = carry[cut + 1 :]
                    break
                filled = len(carry) + got
                if len(text_head) < HEAD_BYTES:
                    text_head += bytes(view[len(carry) : filled][: HEAD_BYTES - len(text_head)])
                if fmt is None:
                    digest.update(view[len(carry) : filled])
                    size += got
                last_byte = bytes(view[filled - 1 : filled])
                cut = buf.rfind(b"\n", len(carry), filled)
                if cut < 0:
                    if filled > max_line:  # before copying it: the carry stays <= max_line
                        raise too_long(next_line)
                    carry = bytes(view[:filled])
                    continue
                carry = bytes(view[cut + 1 : filled])
                consume(view[: cut + 1])
                if len(carry) > max_line:
                    raise too_long(next_line)
                if progress is not None and fmt is None:
                    progress(got)
    except compression.StreamError as exc:
        raise InputError(str(exc), path) from None
    except MemoryError:  # the records of this file do not fit: say which file, not a traceback
        raise InputError(OUT_OF_MEMORY, path) from None
    except IsADirectoryError:
        raise InputError("is a directory, expected a log file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc

    ends_with_newline = last_byte == b"\n"
    if carry:
        _consume_tail(carry, next_line, rejects, consume, counts, max_duration)
    if not (fetch.rows or train.rows) and compression.looks_binary(text_head):
        # One clear line instead of every line rejected as binary data.
        what = compression.describe_binary(text_head, fmt)
        raise InputError(f"no fetch or training records: {what}", path)
    if not fetch.columns:
        empty = grammar.parse_lines(grammar.lines_of(b""), 1, grammar.Rejects())
        fetch.append(empty.fetch, 0)
        train.append(empty.train, 0)
    counts.setdefault("lines", 0)
    return FileRecords(
        path=path,
        fetch=absent_as_views(fetch.result()),
        train=absent_as_views(train.result()),
        counts=counts,
        rejects=rejects,
        size=size,
        sha256=digest.hexdigest(),
        ends_with_newline=ends_with_newline,
        loader=loader,
        compression=fmt.name if fmt is not None else None,
    )


def _consume_tail(
    tail: bytes, line_no: int, rejects: grammar.Rejects, consume, counts, max_duration: float
) -> None:
    """The last line has no line end: a logger always ends its lines, so this one was cut off.

    It is rejected when it looks like a record (it may be missing digits we
    cannot see); otherwise it is counted like any other ignored line.
    """
    probe = grammar.Rejects()
    lines = grammar.lines_of(tail)
    records = grammar.parse_lines(lines, line_no, probe, max_duration=max_duration)
    looks_like_record = (
        len(records.fetch["line"]) or len(records.train["line"]) or records.loader or probe.line
    )
    if looks_like_record:
        rejects.add(np.array([line_no]), grammar.TRUNCATED, lines)
        counts["lines"] = counts.get("lines", 0) + 1
    else:
        consume(tail)
