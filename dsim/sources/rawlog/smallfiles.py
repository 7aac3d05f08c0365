"""Many small log files read together: one read per file, one grammar pass per batch.

Why: a run logged as one file per rank (``rank<N>.log``) at 1024 ranks is
1024 small files. Read one by one, each paid a fixed ~5-8 ms whatever its
size -- a fresh 4 MiB block buffer, and the grammar's vector steps
(``dsim.sources.rawlog.fastpath``) run once or twice per file, each a few
dozen NumPy calls whose cost does not depend on the number of lines. Here
small plain files are read, each in one read sized to the file, into one
buffer reused across files and batches; a batch of up to ``BATCH_BYTES`` of
text is dissected in one grammar call, and its
records, rejects and loader lines are handed back per file with each file's
own line numbers. The grammar reads each line on its own, so the records are
those of reading the files one by one (tests compare both ways).

Anything unusual -- a compressed file, a file not ending with a line end, a
line over the length bound, a binary head, a file that changed size while
read, one that cannot be opened, a large file -- goes to
``dsim.sources.rawlog.logfile.read_log`` alone, which says what is wrong
exactly as before.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsim.io import compression
from dsim.io.arrowtables import array_of
from dsim.sources.rawlog import grammar, logfile
from dsim.sources.rawlog.logfile import FileRecords, read_log

BATCH_BYTES = 1 << 20  # text of small files dissected at once: its per-line arrays stay small
_FULL = object()  # a file that does not fit in the batch being filled


@dataclass
class _Member:
    """One file of a batch: where its text sits and what the run's report needs of it."""

    path: Path
    size: int
    sha256: str
    first_line: int  # the batch's line number of its first line (1-based)
    lines: int


@dataclass
class _Batch:
    """Small files gathered into one reused buffer, parsed together when full.

    A batch holds at most ``BATCH_BYTES`` of text and, but for its last file,
    fewer than ``logfile.PIECE_LINES`` lines (one file holds at most that many).
    """

    buffer: bytearray = field(default_factory=bytearray)
    filled: int = 0
    newlines: list[np.ndarray] = field(default_factory=list)  # per member, batch offsets
    members: list[_Member] = field(default_factory=list)
    lines: int = 0  # lines of its members

    def room(self, size: int, limit: int) -> memoryview | None:
        """A view of ``size + 1`` bytes behind the filled part, or ``None`` when the batch is full.

        The buffer is allocated once, ``limit + 1`` bytes, and reused for every batch.
        """
        if self.filled + size + 1 > limit + 1:
            return None
        if len(self.buffer) < limit + 1:
            self.buffer = bytearray(limit + 1)
        return memoryview(self.buffer)[self.filled : self.filled + size + 1]


def read_logs(
    paths: Sequence[Path],
    progress: Callable[[int], None] | None = None,
    *,
    max_duration: float = grammar.MAX_DURATION_S,
    max_line: int = logfile.MAX_LINE_BYTES,
) -> Iterator[FileRecords]:
    """The records of every file of ``paths``, in order, as ``read_log`` gives them.

    Files smaller than ``BATCH_BYTES`` (and ``logfile.BLOCK_BYTES``) are read in batches (see the
    module docstring). The counts of a batch (lines, blank lines, ...) are
    given with its first file and are empty for its other files: the run
    only ever adds them up.
    """
    # Looked up per call: tests shrink BLOCK_BYTES to force batches and blocks.
    limit = min(logfile.BLOCK_BYTES, BATCH_BYTES)
    batch = _Batch()
    for path in paths:
        read = _read_small(path, batch, limit, max_line)
        if read is _FULL:
            yield from _parse(batch, max_duration)
            read = _read_small(path, batch, limit, max_line)
        if read is None:
            yield from _parse(batch, max_duration)
            yield read_log(path, progress, max_duration=max_duration, max_line=max_line)
            continue
        if progress is not None:
            progress(batch.members[-1].size)
        if batch.lines >= logfile.PIECE_LINES:
            yield from _parse(batch, max_duration)
    yield from _parse(batch, max_duration)


def _read_small(path: Path, batch: _Batch, limit: int, max_line: int) -> object:
    """Append ``path`` to ``batch`` if it is a small plain log.

    ``None`` when it is not (``read_log`` reads it alone), ``_FULL`` when it
    does not fit behind the batch's text (parse the batch, then try again).
    """
    try:
        # Looked at before opening: a FIFO opened and closed here would lose its writer.
        status = os.stat(path)
        if not stat.S_ISREG(status.st_mode) or not 0 < status.st_size < limit:
            return None
        size = status.st_size
        view = batch.room(size, limit)
        if view is None:
            return _FULL
        with open(path, "rb", buffering=0) as handle:
            got = 0
            while got <= size:  # one read for a regular file; one more sees its end
                n = handle.readinto(view[got:])
                if not n:
                    break
                got += n
    except OSError:
        return None  # read_log names the file and the reason
    if got != size:
        return None  # the file changed while read: read_log reads what is there
    data = np.frombuffer(view, dtype=np.uint8, count=size)
    head = bytes(view[: min(size, logfile.HEAD_BYTES)])
    if data[-1] != 10 or compression.detect(head) is not None or compression.looks_binary(head):
        return None
    ends = np.flatnonzero(data == 10)
    if len(ends) > logfile.PIECE_LINES:
        return None
    if np.diff(ends, prepend=-1).max() > max_line + 1:
        return None
    batch.members.append(
        _Member(path, size, hashlib.sha256(view[:size]).hexdigest(), batch.lines + 1, len(ends))
    )
    batch.newlines.append(ends + batch.filled)
    batch.filled += size
    batch.lines += len(ends)
    return True


def _parse(batch: _Batch, max_duration: float) -> Iterator[FileRecords]:
    """Dissect the batch's text in one grammar call; its records per file; empty the batch."""
    if not batch.members:
        return
    block = memoryview(batch.buffer)[: batch.filled]
    rejects = grammar.Rejects()
    lines = grammar.lines_of(block, np.concatenate(batch.newlines))
    records = grammar.parse_lines(lines, 1, rejects, max_duration=max_duration)
    del lines
    fetch, train = (
        logfile.absent_as_views(
            {k: v.astype(logfile.narrow_dtype(k, v), copy=False) for k, v in part.items()}
        )
        for part in (records.fetch, records.train)
    )
    firsts = np.array([m.first_line for m in batch.members], dtype=np.int64)
    fetch_cut = _own_lines(fetch, firsts)
    train_cut = _own_lines(train, firsts)
    loader = _by_member(records.loader, firsts)
    for i, member in enumerate(batch.members):
        yield FileRecords(
            path=member.path,
            fetch={k: v[fetch_cut[i] : fetch_cut[i + 1]] for k, v in fetch.items()},
            train={k: v[train_cut[i] : train_cut[i + 1]] for k, v in train.items()},
            counts=records.counts if i == 0 else {},
            rejects=_member_rejects(rejects, member),
            size=member.size,
            sha256=member.sha256,
            loader=loader[i],
        )
    # Nothing yielded refers to the buffer (records are computed arrays, reject texts
    # are filtered copies), so the next batch may overwrite it.
    batch.filled = 0
    batch.newlines = []
    batch.members = []
    batch.lines = 0


def _own_lines(columns: dict[str, np.ndarray], firsts: np.ndarray) -> list[int]:
    """Renumber ``columns["line"]`` from batch lines to each file's own; where each file starts.

    One subtraction over the batch: the files' rows are then plain slices, no array per file.
    """
    line = columns["line"]
    cut = np.searchsorted(line, firsts)
    counts = np.diff(np.append(cut, len(line)))
    columns["line"] = line - np.repeat(firsts - 1, counts).astype(line.dtype)
    return [*cut.tolist(), len(line)]


def _by_member(loader: list[dict[str, int | None]], firsts: np.ndarray) -> list[list[dict]]:
    out: list[list[dict]] = [[] for _ in firsts]
    for record in loader:
        i = int(np.searchsorted(firsts, record["line"], side="right")) - 1
        out[i].append({**record, "line": int(record["line"]) - int(firsts[i]) + 1})
    return out


def _member_rejects(rejects: grammar.Rejects, member: _Member) -> grammar.Rejects:
    """The rejects of one file of a batch, line numbers its own, texts copied out of the buffer."""
    out = grammar.Rejects()
    lo, hi = member.first_line, member.first_line + member.lines
    for line, reason, text in zip(rejects.line, rejects.reason, rejects.text, strict=True):
        mine = (line >= lo) & (line < hi)
        if mine.any():
            out.add(line[mine] - (lo - 1), np.asarray(reason)[mine], text.filter(array_of(mine)))
    return out


__all__ = ["read_logs"]
