"""Read one raw log file in blocks and collect its records.

Memory follows the records, not the text: the file is read in blocks of a
few megabytes, each block is dissected by ``dsim.grammar`` and only the
typed columns of its records are kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsim import grammar
from dsim.errors import InputError

BLOCK_BYTES = 4 << 20  # the per-block windows and masks stay small next to the records

# Counters and indices fit 32 bits (the grammar allows at most 9 digits); halving
# them keeps the records of a long run close to the size of its tables.
_NARROW = ("gpu", "worker", "idx", "epoch", "iteration", "total")


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
    extra: dict[str, int] = field(default_factory=dict)


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    keys = list(parts[0])
    out = {}
    for k in keys:  # column by column, freeing the pieces as they are joined
        out[k] = np.concatenate([p.pop(k) for p in parts])
    return out


def _narrow(records: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.int32) if k in _NARROW else v for k, v in records.items()}


def read_log(
    path: Path,
    progress: Callable[[int], None] | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> FileRecords:
    """Parse one file; ``progress`` is called with the number of bytes consumed per block."""
    digest = hashlib.sha256()
    rejects = grammar.Rejects()
    fetch_parts: list[dict[str, np.ndarray]] = []
    train_parts: list[dict[str, np.ndarray]] = []
    counts: dict[str, int] = {}
    size = 0
    next_line = 1
    carry = b""
    last_byte = b"\n"

    def consume(block: bytes | memoryview) -> None:
        nonlocal next_line
        lines = grammar.lines_of(block)
        records = grammar.parse_lines(lines, next_line, rejects)
        fetch_parts.append(_narrow(records.fetch))
        train_parts.append(_narrow(records.train))
        for key, value in records.counts.items():
            counts[key] = counts.get(key, 0) + value
        next_line += len(lines)

    try:
        with open(path, "rb", buffering=0) as handle:
            while True:
                # Each block gets its own buffer, the carried partial line copied to its
                # front, and the file read straight behind it: no copy of the block itself.
                buf = bytearray(len(carry) + block_bytes)
                buf[: len(carry)] = carry
                view = memoryview(buf)
                got = handle.readinto(view[len(carry) :])
                if not got:
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
        _consume_tail(carry, next_line, rejects, consume, counts)
    if not fetch_parts:
        empty = grammar.parse_lines(grammar.lines_of(b""), 1, grammar.Rejects())
        fetch_parts, train_parts = [_narrow(empty.fetch)], [_narrow(empty.train)]
    counts.setdefault("lines", 0)
    return FileRecords(
        path=path,
        fetch=_concat(fetch_parts),
        train=_concat(train_parts),
        counts=counts,
        rejects=rejects,
        size=size,
        sha256=digest.hexdigest(),
        ends_with_newline=ends_with_newline,
    )


def _consume_tail(tail: bytes, line_no: int, rejects: grammar.Rejects, consume, counts) -> None:
    """The last line has no line end: a logger always ends its lines, so this one was cut off.

    It is rejected when it looks like a record (it may be missing digits we
    cannot see); otherwise it is counted like any other ignored line.
    """
    probe = grammar.Rejects()
    lines = grammar.lines_of(tail)
    records = grammar.parse_lines(lines, line_no, probe)
    looks_like_record = len(records.fetch["line"]) or len(records.train["line"]) or probe.line
    if looks_like_record:
        rejects.add(np.array([line_no]), grammar.TRUNCATED, lines)
        counts["lines"] = counts.get("lines", 0) + 1
    else:
        consume(tail)
