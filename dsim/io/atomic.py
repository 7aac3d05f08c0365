"""Atomic writes: an output either exists complete or not at all.

A crash, a full disk or Ctrl-C in the middle of a write must never leave a
truncated Parquet file that a later step would read as complete. Everything
is written to a temporary sibling first and moved into place with
``os.replace``, which is atomic on POSIX within one file system.

A temporary name carries its writer's pid (``.<name>.<pid>.<random>.tmp``;
a directory being swapped out is ``.<name>.old-<pid>``), so that what a
killed process left behind can be told from what a live one is writing:
``remove_leftovers`` removes the former at the start of the next write into
that directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from dsim.errors import OutputError
from dsim.io import parquetio

# ``_make_temp`` puts 8 hex digits between our prefix and suffix (``tempfile``'s 8
# characters of [a-z0-9_] before: a leftover of an older dsim is recognised too).
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>[0-9]+)\.[a-z0-9_]{8}\.tmp$")
_OLD = re.compile(r"^\.(?P<name>.+)\.old-(?P<pid>[0-9]+)$")


def _temp_prefix(target: Path) -> str:
    return f".{target.name}.{os.getpid()}."


def _make_temp(target: Path, *, directory: bool = False) -> Path:
    """A new temporary sibling of ``target`` (a file, or an empty directory), named as
    ``_TEMP`` reads, with the permissions a plain ``open``/``mkdir`` would give it: the
    kernel applies the umask. Why not ``mkstemp`` and a ``chmod`` to the umask: reading
    the umask means setting it (``os.umask``), for the whole process, and runs finished
    on threads (``dsim.execute.threads``) made files and directories meanwhile, or read
    the 0 another thread had set and kept it."""
    for _ in range(100):
        name = target.parent / f"{_temp_prefix(target)}{secrets.token_hex(4)}.tmp"
        try:
            if directory:
                os.mkdir(name, 0o777)
            else:
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return name
    raise FileExistsError(errno.EEXIST, "no unused temporary name", str(target))


def cannot_write(target: Path, exc: OSError) -> OutputError:
    """``cannot write TARGET: why`` for an ``OSError`` met making ``target`` or its parents;
    a file where a directory must be is named (mkdir says only "File exists")."""
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        for parent in (target, *target.parents):
            if parent.exists() and not parent.is_dir():
                if parent != target:
                    return OutputError(
                        f"cannot write {target}: {parent} is a file, not a directory"
                    )
                break
    return OutputError(f"cannot write {target}: {exc.strerror or exc}")


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; move it onto ``target`` on success."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = _make_temp(target)
    except OSError as exc:
        raise cannot_write(target, exc) from exc
    try:
        yield tmp
        os.replace(tmp, target)
    except OSError as exc:
        raise cannot_write(target, exc) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_parquet(table: pa.Table, target: str | Path) -> None:
    with atomic_path(target) as tmp:
        parquetio.write_table(table, tmp)


def write_text(text: str, target: str | Path) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(obj: Any, target: str | Path) -> None:
    write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n", target)


#: Called with an existing target before ``atomic_dir`` replaces it; raises unless the
#: directory is one the caller's command wrote (``OutputError``, ``UsageError``).
CheckExisting = Callable[[Path], None]


def check_replaceable(target: Path, check_existing: CheckExisting) -> None:
    """Refuse to replace ``target`` unless it is absent, an empty directory, or the caller's.

    A symbolic link or a file at ``target`` is never replaced (its target, or
    the file, is the user's); an empty directory holds nothing to lose;
    anything else must pass ``check_existing``.
    """
    if target.is_symlink():
        raise OutputError(
            f"{target} is a symbolic link, not a run directory dsim wrote; dsim does not "
            "replace it: remove it or choose another --name or --out"
        )
    if not target.exists():
        return
    if not target.is_dir():
        raise OutputError(
            f"{target} exists and is not a directory; dsim does not replace it: "
            "remove it or choose another --name or --out"
        )
    try:
        empty = not any(os.scandir(target))
    except OSError as exc:
        raise cannot_write(target, exc) from exc
    if not empty:
        check_existing(target)


@contextlib.contextmanager
def atomic_dir(target: str | Path, *, check_existing: CheckExisting) -> Iterator[Path]:
    """Build a whole directory in a temporary sibling and swap it into place.

    Readers see either the old directory or the new one, never a mix: on Linux
    the two are exchanged in one step (``renameat2``), so the target is never
    missing; elsewhere the old one is moved aside, the new one renamed in, and
    only then the old removed (readers that find the target missing while
    ``.<name>.old-<pid>`` exists know a swap is under way).
    An existing ``target`` is replaced only if ``check_replaceable`` allows
    it, checked before the work starts (to fail fast) and again just before
    the swap (someone may have put a directory there meanwhile).
    """
    target = Path(target)
    check_replaceable(target, check_existing)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = _make_temp(target, directory=True)
    except OSError as exc:
        raise cannot_write(target, exc) from exc
    try:
        yield tmp
        check_replaceable(target, check_existing)
        if target.exists() and _exchange(tmp, target):
            return  # ``tmp`` now holds the old directory: ``finally`` removes it
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise cannot_write(target, exc) from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries atomically (Linux ``renameat2(RENAME_EXCHANGE)``);
    ``False`` where the system or file system cannot, so the caller renames twice."""
    rename = getattr(_libc(), "renameat2", None)
    if rename is None:
        return False
    if rename(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (a zombie does not count)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    except (OverflowError, ValueError):
        return False
    try:  # Linux: a killed child nobody reaped yet is a zombie, and it writes nothing
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return True
    fields = stat.rpartition(")")[2].split()
    return not fields or fields[0] != "Z"


def leftover_of_dead_writer(name: str) -> re.Match[str] | None:
    """The match of a dsim temporary name whose writer is no longer running, else ``None``."""
    match = _TEMP.match(name) or _OLD.match(name)
    if match is None or int(match["pid"]) <= 0 or pid_alive(int(match["pid"])):
        return None
    return match


def remove_leftovers(directory: str | Path, *, recursive: bool = False) -> list[Path]:
    """Remove what killed dsim writers left in ``directory``; returns what was removed.

    Temporary files and directories of processes that are no longer alive are
    deleted (those of live writers are left alone: another dsim may be
    writing there right now). A ``.<name>.old-<pid>`` directory is the
    previous ``<name>`` that ``atomic_dir`` had moved aside: it is renamed
    back when ``<name>`` is missing (the writer died between its two
    renames), else deleted. Best effort: what cannot be removed stays.
    With ``recursive``, sub-directories are cleaned too (not the temporary
    ones, which go whole).
    """
    directory = Path(directory)
    removed: list[Path] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return removed
    for entry in entries:
        path = Path(entry.path)
        match = leftover_of_dead_writer(entry.name)
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            if match is None:
                if recursive and is_dir:
                    removed.extend(remove_leftovers(path, recursive=True))
                continue
            if match.re is _OLD and is_dir and not (directory / match["name"]).exists():
                os.replace(path, directory / match["name"])
            elif is_dir:
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
        except OSError:
            continue
    return removed
