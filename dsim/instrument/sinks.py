"""Where the raw log lines go: a per-rank file, or a ``logging.Logger`` (docs/SPEC.md §1.2).

Why the training process holds its lines a moment: between two training
steps the instrumentation's work runs with cold caches, and a line's
formatting and its ``write`` system call cost several times more there than
back to back (``bench/bench_instrument.py --compare``'s "between steps"
column, BENCHMARKS.md). Formatting and writing a block of lines at once pays
the cold start once per block. So a ``FileSink`` in the process that made it
keeps each record (the formatting function and its arguments: the values
are measured at once, only the text is deferred) until it holds
``HOLD_LINES`` of them, until a flusher thread finds them held for up to
``HOLD_SECONDS``, until its loop ends (``TrainingTimer.iterate``), or until
the process exits (``atexit``, also after an uncaught exception; a
multiprocessing child's exit finalizers). A process killed
by a signal loses the lines it held: at most its last ``HOLD_SECONDS`` (and
``HOLD_LINES`` lines per sink). DataLoader workers — copies of the sink in
another process, forked or spawned — write each line at once, as before:
their work is off the training loop's path, and a worker is ended by its
parent without running Python's exit handlers.

A block is written in ``os.write`` calls of whole lines of at most
``PIPE_BUF`` bytes each, on a descriptor opened with ``O_APPEND``: each call
lands whole, never torn or interleaved with a worker's line.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from dsim.errors import UsageError
from dsim.instrument.pid import current_pid

# POSIX guarantees atomic appends of at most PIPE_BUF bytes; our lines are ~150.
PIPE_BUF = getattr(select, "PIPE_BUF", 512)

#: Records a training process's sink holds before it formats and writes them (~10 KB).
HOLD_LINES = 64
#: Seconds a record waits at most for the flusher thread (checked as often).
HOLD_SECONDS = 1.0

Formatter = Callable[..., str]


class LineSink(Protocol):
    def write(self, line: str) -> None: ...

    def put(self, format_line: Formatter, *args: Any) -> None: ...

    def flush(self) -> None: ...


# Sinks that may hold records, kept alive so that a sink dropped with records held
# (a loader left mid-epoch) still has them written; one small object per sink.
_holding: set[FileSink] = set()
_flusher: list[threading.Thread] = []  # the process's flusher thread, once started
_flusher_lock = threading.Lock()


def flush_held() -> None:
    """Write every record this process's sinks hold (end of a loop, exit, the flusher)."""
    for sink in list(_holding):
        sink.flush()


def _flush_forever() -> None:
    """The flusher thread: every ``HOLD_SECONDS``, write what the sinks hold.

    A sink it cannot write (a full disk) is named once on stderr and left to the
    loop, whose next flush raises the error where the user sees it.
    """
    failed: set[Path] = set()
    while True:
        time.sleep(HOLD_SECONDS)
        for sink in list(_holding):
            if sink.path in failed:
                continue
            try:
                sink.flush()
            except (OSError, UsageError) as exc:
                failed.add(sink.path)
                reason = getattr(exc, "strerror", None) or exc
                print(f"dsim.instrument: cannot write {sink.path}: {reason}", file=sys.stderr)


def _start_flusher() -> None:
    """Once per process that holds records: the flusher thread, and a flush at exit.

    A rank started by ``multiprocessing`` (``torch.multiprocessing.start_processes``,
    ``mp.spawn``) ends with ``os._exit`` after its function returns, so Python's
    ``atexit`` never runs there: multiprocessing's own exit finalizers do.
    """
    with _flusher_lock:
        if _flusher and _flusher[0].is_alive():
            return
        thread = threading.Thread(target=_flush_forever, name="dsim-log-flusher", daemon=True)
        thread.start()
        _flusher[:] = [thread]
        from multiprocessing import util

        util.Finalize(None, flush_held, exitpriority=0)


atexit.register(flush_held)  # runs also after an uncaught exception, not after a kill


def _forked() -> None:
    """In a forked child: no flusher thread runs yet, and no lock is held by one."""
    global _flusher_lock
    _flusher.clear()
    _flusher_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class FileSink:
    """Appends lines to one file, safely from many processes at once.

    Each process opens its own descriptor with ``O_APPEND`` (re-opened after a
    fork); every ``os.write`` carries whole lines, at most ``PIPE_BUF`` bytes,
    which the kernel appends whole. ``write`` writes a line at once; ``put``
    holds a record in the process that made the sink (module docstring) and
    writes at once elsewhere. Picklable, so it travels to DataLoader workers
    started with ``spawn`` (where it never holds: it is not theirs).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = None
        self._pid: int | None = None
        self._owner: int | None = current_pid()  # the only process that holds records
        self._held: deque[tuple[Formatter, tuple[Any, ...]]] = deque()
        self._lock = threading.Lock()  # one flush at a time (the loop and the flusher)
        self._flushed_by_thread = False  # registered with the flusher thread and atexit

    def __getstate__(self) -> dict[str, object]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]
        self._owner = None  # a copy in another process writes each line at once

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            reason = exc.strerror or exc
            raise UsageError(f"cannot write the log file {self.path}: {reason}") from exc
        self._fd, self._pid = fd, current_pid()
        return fd

    def _descriptor(self) -> int:
        return self._fd if self._pid == current_pid() else self._open()  # type: ignore[return-value]

    def put(self, format_line: Formatter, *args: Any) -> None:
        """``write(format_line(*args))``, held for a while in the process that made the sink."""
        if self._owner != current_pid():  # a DataLoader worker: at once
            self.write(format_line(*args))
            return
        if not self._flushed_by_thread:
            self._descriptor()  # an unwritable path fails here, in the caller, not later
            _holding.add(self)
            _start_flusher()
            self._flushed_by_thread = True
        held = self._held
        held.append((format_line, args))
        if len(held) >= HOLD_LINES:
            self.flush()

    def flush(self) -> None:
        """Format and write the held records, oldest first, in blocks of whole lines."""
        if self._owner != current_pid():
            self._held.clear()  # a forked child's copy of its parent's records: not its own
            return
        if not self._held:
            return
        with self._lock:
            held, lines = self._held, []
            while True:
                try:
                    format_line, args = held.popleft()
                except IndexError:
                    break
                lines.append(_whole(format_line(*args).encode("utf-8")))
            fd = self._descriptor()
            for block in _blocks(lines):
                os.write(fd, block)

    def write(self, line: str) -> None:
        """Write one line at once (after what this sink holds, so that its order is kept)."""
        if self._held:
            self.flush()
        os.write(self._descriptor(), _whole(line.encode("utf-8")))

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a full disk must not hide the close
            self.flush()
        if self._fd is not None and self._pid == current_pid():
            os.close(self._fd)
        self._fd = self._pid = None


def _whole(data: bytes) -> bytes:
    """A line as written: cut to ``PIPE_BUF`` bytes (dsim's own lines never are)."""
    return data if len(data) <= PIPE_BUF else data[: PIPE_BUF - 1] + b"\n"


def _blocks(lines: list[bytes]) -> list[bytes]:
    """Consecutive lines joined into blocks of at most ``PIPE_BUF`` bytes, each one write."""
    blocks, block, size = [], [], 0
    for line in lines:
        if size + len(line) > PIPE_BUF and block:
            blocks.append(b"".join(block))
            block, size = [], 0
        block.append(line)
        size += len(line)
    if block:
        blocks.append(b"".join(block))
    return blocks


class LoggerSink:
    """Sends lines to a ``logging.Logger`` (kept by name, so it pickles to workers).

    The line carries its own timestamp: give the logger's handler a format
    with no timestamp of its own (``%(message)s``, optionally after a prefix
    such as ``[rank0]: ``), or the parser would read the logger's time.
    Lines are handed to the logger at once (its handlers decide on buffering).
    """

    def __init__(self, logger: logging.Logger | str, level: int = logging.INFO):
        self.name = logger.name if isinstance(logger, logging.Logger) else logger
        self.level = level

    def write(self, line: str) -> None:
        logging.getLogger(self.name).log(self.level, line.rstrip("\n"))

    def put(self, format_line: Formatter, *args: Any) -> None:
        self.write(format_line(*args))

    def flush(self) -> None:
        """Nothing is held here."""


def make_sink(
    log_dir: str | Path | None, rank: int, logger: logging.Logger | str | None
) -> LineSink:
    """``<log_dir>/rank<rank>.log`` or the given logger: exactly one of the two."""
    if (log_dir is None) == (logger is None):
        raise UsageError("give exactly one of log_dir= and logger=")
    if logger is not None:
        return LoggerSink(logger)
    return FileSink(Path(log_dir) / f"rank{rank}.log")
