"""Read one raw log file in blocks and collect its records.

Memory follows the records, not the text: the file is read in blocks of a
few megabytes, each block is dissected by ``dsim.sources.rawlog.grammar`` and only the
typed columns of its records are kept.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dsim.errors import InputError
from dsim.sources.rawlog import grammar

BLOCK_BYTES = 4 << 20  # the per-block windows and masks stay small next to the records

# Magic numbers at the start of compressed files: (magic, format, decompress, stream through).
_COMPRESSED = (
    (b"\x1f\x8b", "gzip", "gunzip -k", "zcat"),
    (b"BZh", "bzip2", "bunzip2 -k", "bzcat"),
    (b"\xfd7zXZ\x00", "xz", "unxz -k", "xzcat"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd -k", "zstdcat"),
)
_MAGIC_BYTES = max(len(m) for m, *_ in _COMPRESSED)

# Counters and indices fit 32 bits (the grammar allows at most 9 digits); halving
# them keeps the records of a long run close to the size of its tables.
_NARROW = ("gpu", "worker", "idx", "epoch", "iteration", "total")
_SPARE = 1.05  # columns are sized for the whole file from the records per byte so far, plus this


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


class _Columns:
    """Record columns that grow block by block in place, with room to spare at the end.

    Appending every block's records to arrays sized for the whole file (from
    the first block's records per byte) replaces lists of small per-block
    arrays joined at the end: no second copy at the join, and no small
    long-lived arrays left between the blocks' freed temporaries, which would
    keep the allocator from reusing or returning that memory. Spare room that
    is never written is never touched, so it costs address space, not memory.
    """

    def __init__(self) -> None:
        self.columns: dict[str, np.ndarray] = {}
        self.rows = 0

    def append(self, records: dict[str, np.ndarray], expected: int) -> None:
        count = len(records["line"])
        if not self.columns:
            self.columns = {
                k: np.empty(max(count, expected), _dtype(k, v)) for k, v in records.items()
            }
        capacity = len(self.columns["line"])
        if self.rows + count > capacity:
            self._resize(max(self.rows + count, capacity * 2))
        end = self.rows + count
        lines = self.columns["line"]
        if count and records["line"][-1] > _LINE_MAX and lines.dtype != np.int64:
            self.columns["line"] = lines.astype(np.int64)  # a file of over 4 G lines
        for key, values in records.items():
            self.columns[key][self.rows : end] = values
        self.rows = end

    def _resize(self, capacity: int) -> None:
        for key, old in self.columns.items():
            new = np.empty(capacity, old.dtype)
            new[: self.rows] = old[: self.rows]
            self.columns[key] = new

    def result(self) -> dict[str, np.ndarray]:
        return {k: v[: self.rows] for k, v in self.columns.items()}


_LINE_MAX = np.iinfo(np.uint32).max  # line numbers are uint32 up to here, then int64


def _dtype(key: str, values: np.ndarray) -> np.dtype:
    if key in _NARROW:
        return np.dtype(np.int32)
    if key == "line":
        return np.dtype(np.uint32)
    return values.dtype


def compressed_format(head: bytes, path: Path) -> str | None:
    """Why ``head`` (a file's first bytes) cannot be read as text, if it is a compressed stream.

    Compressed logs are not decompressed (yet): one clear message beats
    thousands of lines rejected as binary. Returns the message, or ``None``
    for anything else. The one place a later change would pick a decompressor.
    """
    for magic, name, decompress, cat in _COMPRESSED:
        if head.startswith(magic):
            return (
                f"{name}-compressed log: decompress it first (e.g. `{decompress} {path}`) "
                f"or pass it through `<({cat} {path})`"
            )
    return None


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
) -> FileRecords:
    """Parse one file; ``progress`` is called with the number of bytes consumed per block.

    Durations above ``max_duration`` seconds are rejected (``dsim.sources.rawlog.bounds``).
    """
    digest = hashlib.sha256()
    rejects = grammar.Rejects()
    fetch, train = _Columns(), _Columns()
    counts: dict[str, int] = {}
    size = 0
    consumed = 0
    expected_size = 0
    next_line = 1
    carry = b""
    last_byte = b"\n"

    def consume(block: bytes | memoryview) -> None:
        nonlocal next_line, consumed
        lines = grammar.lines_of(block)
        records = grammar.parse_lines(lines, next_line, rejects, max_duration=max_duration)
        consumed += len(block)
        scale = max(expected_size, consumed) / max(consumed, 1) * _SPARE
        for part, columns in ((records.fetch, fetch), (records.train, train)):
            columns.append(part, int((columns.rows + len(part["line"])) * scale) + 1)
        for key, value in records.counts.items():
            counts[key] = counts.get(key, 0) + value
        next_line += len(lines)

    try:
        with open(path, "rb", buffering=0) as handle:
            expected_size = os.fstat(handle.fileno()).st_size  # 0 for pipes: columns then double
            carry = _read_head(handle, _MAGIC_BYTES)
            compressed = compressed_format(carry, path)
            if compressed is not None:
                raise InputError(compressed, path)
            digest.update(carry)
            size += len(carry)
            if carry:
                last_byte = carry[-1:]
                if progress is not None:
                    progress(len(carry))
            while True:
                # Each block gets its own buffer, the carried partial line copied to its
                # front, and the file read straight behind it: no copy of the block itself.
                buf = bytearray(len(carry) + block_bytes)
                buf[: len(carry)] = carry
                view = memoryview(buf)
                got = handle.readinto(view[len(carry) :])
                if not got:
                    cut = carry.rfind(b"\n")  # only a file of a few bytes ends with lines here
                    if cut >= 0:
                        consume(carry[: cut + 1])
                        carry = carry[cut + 1 :]
                    break
                filled = len(carry) + got
                digest.update(view[len(carry) : filled])
                size += got
                last_byte = bytes(view[filled - 1 : filled])
                cut = buf.rfind(b"\n", len(carry), filled)
                if cut < 0:
                    carry = bytes(view[:filled])
                    continue
                carry = bytes(view[cut + 1 : filled])
                consume(view[: cut + 1])
                if progress is not None:
                    progress(got)
    except IsADirectoryError:
        raise InputError("is a directory, expected a log file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc

    ends_with_newline = last_byte == b"\n"
    if carry:
        _consume_tail(carry, next_line, rejects, consume, counts, max_duration)
    if not fetch.columns:
        empty = grammar.parse_lines(grammar.lines_of(b""), 1, grammar.Rejects())
        fetch.append(empty.fetch, 0)
        train.append(empty.train, 0)
    counts.setdefault("lines", 0)
    return FileRecords(
        path=path,
        fetch=fetch.result(),
        train=train.result(),
        counts=counts,
        rejects=rejects,
        size=size,
        sha256=digest.hexdigest(),
        ends_with_newline=ends_with_newline,
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
    looks_like_record = len(records.fetch["line"]) or len(records.train["line"]) or probe.line
    if looks_like_record:
        rejects.add(np.array([line_no]), grammar.TRUNCATED, lines)
        counts["lines"] = counts.get("lines", 0) + 1
    else:
        consume(tail)
