"""Following the raw logs of a running job: new complete lines since the last look.

``dsim watch`` (docs/SPEC.md §9.4) reads logs while the job writes them. The
writer must never notice: files are opened read-only, never locked, read up
to the size seen by ``stat`` and closed again. A line counts only once its
``\\n`` is there; the bytes after the last line end wait for the next look,
so a line caught half-written never becomes a record (nor a reject).

Files are followed by inode, not by name, so that rotation loses nothing:

* renamed (``rank0.log`` -> ``rank0.log.1``, a new ``rank0.log``): the old
  inode is read to its end under its new name, the new file from its start
  (within one look, a log's files are read oldest first, ``log_files``);
* copied and truncated (``copytruncate``): a file shorter than what was read
  of it is read again from its start;
* compressed rotations (``rank0.log.1.gz``) hold lines already read or older
  than a live view needs, and are not read;
* files that appear later (a rank starting late) are read from their start.

At the first look the logs together are read from at most ``catch_up`` bytes
before their ends, shared evenly between the logs but at least
``MIN_CATCH_UP_BYTES`` each (a log's first, partial line skipped): a live
view needs the recent iterations, not hours of history.

I/O only; what the lines hold is the parser's business.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from dsim.errors import InputError
from dsim.sources.rawlog.discover import LOG_GLOB, is_log_name, log_base, log_files

#: At the first look, at most this many bytes of all logs together (from their ends) ...
CATCH_UP_BYTES = 256 * 1024 * 1024
#: ... but at least this many of each log.
MIN_CATCH_UP_BYTES = 4 * 1024 * 1024
#: At most this many bytes are read from one file in one look (the rest at the next).
READ_BYTES = 64 * 1024 * 1024
#: An unfinished line longer than this is dropped (SPEC §1.2's default line bound).
MAX_PENDING_BYTES = 1024 * 1024
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst")


@dataclass
class _FileState:
    """What was read of one inode: how far, and the unfinished line after its last ``\\n``."""

    offset: int
    pending: bytes = b""
    skip_to_newline: bool = False  # the first line is cut (catch-up, or an overlong line)


@dataclass
class FollowStats:
    """Counts of what the follower met, for the view's footer and the tests."""

    files: int = 0  # files followed at the last look
    rotations: int = 0  # inodes seen under a new name
    truncations: int = 0  # files read again from their start
    dropped_long_lines: int = 0  # unfinished lines over MAX_PENDING_BYTES


@dataclass
class LogFollower:
    """New complete lines of the logs of one run directory (or of one log file), per log.

    ``poll()`` returns ``{log name: [line, ...]}``, each line ``bytes`` with its
    ``\\n``; the log name is ``log_base`` of its files (``rank0.log`` for
    ``rank0.log``, ``rank0.log.1``), so a rotated log stays one stream.
    """

    path: Path
    catch_up: int = CATCH_UP_BYTES
    min_catch_up: int = MIN_CATCH_UP_BYTES
    read_bytes: int = READ_BYTES
    stats: FollowStats = field(default_factory=FollowStats)
    _files: dict[tuple[int, int], _FileState] = field(default_factory=dict)
    _names: dict[tuple[int, int], str] = field(default_factory=dict)
    _first: bool = True

    def check(self) -> None:
        """A missing path, or one with no log to follow, is an ``InputError`` (exit 3)."""
        if not self.path.exists():
            raise InputError("no such file or directory", self.path)
        if not self._paths():
            raise InputError(
                f"no log files to follow ({LOG_GLOB}, or rotated: *.log.1, *.log-20261101; "
                "compressed rotations are not followed)",
                self.path,
            )

    def _paths(self) -> tuple[Path, ...]:
        """The plain log files to read, each log's oldest first."""
        try:
            if self.path.is_dir():
                candidates = [p for p in self.path.iterdir() if _followable(p)]
            else:
                base = log_base(self.path)
                directory = self.path.parent
                candidates = [
                    p for p in directory.iterdir() if _followable(p) and log_base(p) == base
                ]
                if self.path.is_file() and self.path not in candidates:
                    candidates.append(self.path)  # a log with a name of its own (run.txt)
        except FileNotFoundError:
            return ()
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", self.path) from None
        return log_files(candidates)

    def poll(self) -> dict[str, list[bytes]]:
        """The complete lines written since the last call, per log, in file order."""
        found: dict[str, list[bytes]] = {}
        seen: set[tuple[int, int]] = set()
        paths = self._paths()
        budget = self._catch_up_budget(paths) if self._first else {}
        for path in paths:
            try:
                status = os.stat(path)
            except FileNotFoundError:  # rotated away between the listing and now
                continue
            if not stat.S_ISREG(status.st_mode):
                continue
            key = (status.st_dev, status.st_ino)
            seen.add(key)
            state = self._state(key, path, status.st_size, budget)
            lines = self._read(path, state, status.st_size)
            if lines:
                found.setdefault(log_base(path), []).extend(lines)
        for gone in set(self._files) - seen:  # deleted: its inode may be reused
            del self._files[gone]
            self._names.pop(gone, None)
        self.stats.files = len(seen)
        self._first = False
        return found

    def _catch_up_budget(self, paths: tuple[Path, ...]) -> dict[Path, int]:
        """At the first look: where each file starts so that each log gives its share of
        ``catch_up`` bytes at most, from its newest file back."""
        by_log: dict[str, list[Path]] = {}
        for path in paths:
            by_log.setdefault(log_base(path), []).append(path)
        start: dict[Path, int] = {}
        share = max(self.catch_up // max(len(by_log), 1), self.min_catch_up)
        for files in by_log.values():
            left = share
            for path in reversed(files):  # newest first
                try:
                    size = os.stat(path).st_size
                except OSError:
                    continue
                start[path] = max(size - left, 0)
                left = max(left - size, 0)
        return start

    def _state(self, key: tuple[int, int], path: Path, size: int, budget: dict) -> _FileState:
        state = self._files.get(key)
        if state is None:
            offset = budget.get(path, 0)
            state = _FileState(offset=offset, skip_to_newline=offset > 0)
            self._files[key] = state
        elif self._names.get(key) != path.name:
            self.stats.rotations += 1
        if size < state.offset:  # copied and truncated: a new text in the same inode
            self.stats.truncations += 1
            state.offset, state.pending, state.skip_to_newline = 0, b"", False
        self._names[key] = path.name
        return state

    def _read(self, path: Path, state: _FileState, size: int) -> list[bytes]:
        want = min(size - state.offset, self.read_bytes)
        if want <= 0:
            return []
        try:
            # Read-only, no lock: the writer never waits for us.
            with open(path, "rb", buffering=0) as handle:
                if state.offset:
                    handle.seek(state.offset)
                data = _read_exactly(handle, want)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
        state.offset += len(data)
        text = state.pending + data
        if state.skip_to_newline:
            cut = text.find(b"\n")
            if cut < 0:
                state.pending = b""
                return []
            text = text[cut + 1 :]
            state.skip_to_newline = False
        end = text.rfind(b"\n")
        state.pending = text[end + 1 :]
        if len(state.pending) > MAX_PENDING_BYTES:
            self.stats.dropped_long_lines += 1
            state.pending, state.skip_to_newline = b"", True
        if end < 0:
            return []
        # Only b"\n" ends a line (``bytes.splitlines`` would also cut at \r, \x0c, ...).
        return [line + b"\n" for line in text[:end].split(b"\n")]


def _followable(path: Path) -> bool:
    """A plain (not compressed) log file name: ``*.log`` or a rotation of one."""
    return is_log_name(path.name) and not path.name.endswith(_COMPRESSED)


def _read_exactly(handle, size: int) -> bytes:
    """``size`` bytes, or fewer if the file ends first (a truncation meanwhile)."""
    parts, got = [], 0
    while got < size:
        chunk = handle.read(size - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
