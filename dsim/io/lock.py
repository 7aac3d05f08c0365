"""Advisory locks on a results directory, so that concurrent commands never mix.

``dsim run`` holds an exclusive lock on ``<out>/.dsim.lock`` from the moment
it decides what to compute until its summary is written: a second ``dsim
run`` on the same directory waits, then finds most of its work cached, and
each prints the numbers of its own replays. ``dsim summarize`` and ``dsim
report`` hold a shared lock while they read, so they never see a run half
rewritten. Locks are ``flock(2)`` locks: the kernel releases them when the
holder exits, even under ``kill -9``, so there is nothing stale to remove.
The exclusive holder writes its pid into the file so that waiters can say
whom they wait for.

The lock file is dsim's own: it is opened without following a symbolic link
(``O_NOFOLLOW``), must be a regular file with one link, and is never
truncated (the pid is written over a fixed-width field), so that a link or a
hard link planted at ``<out>/.dsim.lock`` can neither be followed nor have
its target emptied.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from dsim.errors import OutputError
from dsim.io.atomic import cannot_write

LOCK_FILE = ".dsim.lock"

Notify = Callable[[str], None]


#: The pid field: written over, never truncated, so a file's length never shrinks.
_PID_WIDTH = 20
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ForeignLockFile(OutputError):
    """``<out>/.dsim.lock`` is a link or not a plain file: not dsim's, so not touched."""


def _open_lock(path: Path, flags: int) -> int:
    """Open the lock file without following a link; refuse anything but a plain file.

    ``O_NONBLOCK`` keeps a FIFO planted there from blocking the open; for
    writing, a hard link (more than one name) is refused like a symbolic
    one, since writing the pid would change another file.
    """
    try:
        fd = os.open(path, flags | _OPEN_FLAGS, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ForeignLockFile(_foreign(path, "a symbolic link")) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ForeignLockFile(_foreign(path, "not a regular file"))
        if flags & os.O_RDWR and st.st_nlink > 1:
            raise ForeignLockFile(_foreign(path, "a hard link to another file"))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _foreign(path: Path, what: str) -> str:
    return (
        f"{path} is {what}, not dsim's lock file; dsim does not open it: "
        "remove it or choose another --out"
    )


def _write_pid(fd: int, pid: int | None) -> None:
    """The holder's pid (``None``: blank) over the fixed-width field at the start."""
    text = "" if pid is None else str(pid)
    os.pwrite(fd, f"{text:<{_PID_WIDTH}}\n".encode("ascii"), 0)


def _holder(fd: int) -> int | None:
    """The pid the current exclusive holder recorded, if any."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _acquire(fd: int, mode: int, notify: Notify | None, message: Callable[[int | None], str]):
    """Take the lock, telling the user once if that means waiting."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    if notify is not None:
        notify(message(_holder(fd)))
    fcntl.flock(fd, mode)  # blocks; Ctrl-C and SIGTERM still interrupt it


def _shown(directory: Path) -> str:
    return f"{os.path.normpath(directory)}/"


@contextlib.contextmanager
def exclusive(directory: str | Path, notify: Notify | None = None) -> Iterator[None]:
    """Hold ``<directory>/.dsim.lock`` exclusively (creating the directory); for writers."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = _open_lock(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    except ForeignLockFile:
        raise
    except OSError as exc:
        if directory.exists() and not directory.is_dir():
            raise OutputError(f"cannot write {directory}: it is a file, not a directory") from None
        raise cannot_write(directory, exc) from exc
    try:

        def waiting(pid: int | None) -> str:
            who = f"another dsim run (pid {pid})" if pid else "dsim commands reading it"
            return f"waiting for {who} on {_shown(directory)} ..."

        _acquire(fd, fcntl.LOCK_EX, notify, waiting)
        with contextlib.suppress(OSError):
            _write_pid(fd, os.getpid())
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                _write_pid(fd, None)
    finally:
        os.close(fd)  # releases the lock


def _open_for_sharing(directory: Path) -> int | None:
    """A descriptor to lock ``directory`` with, or ``None`` where no lock can be taken."""
    path = directory / LOCK_FILE
    for flags in (os.O_RDONLY, os.O_RDWR | os.O_CREAT):
        try:
            return _open_lock(path, flags)
        except FileNotFoundError:
            continue  # no lock file yet: create one if the directory is writable
        except OSError:
            return None  # read-only or foreign directory: nobody can be writing with dsim
    return None


@contextlib.contextmanager
def shared(directories: Iterable[str | Path], notify: Notify | None = None) -> Iterator[None]:
    """Hold a shared lock on each results directory while reading it.

    Directories that do not exist or cannot hold a lock file (read-only) are
    read without one. Locks are taken in a fixed order.
    """
    spelled: dict[Path, Path] = {}
    for directory in directories:
        spelled.setdefault(Path(directory).resolve(), Path(directory))
    with contextlib.ExitStack() as stack:
        for key in sorted(spelled):
            directory = spelled[key]
            if not directory.is_dir():
                continue
            fd = _open_for_sharing(directory)
            if fd is None:
                continue
            stack.callback(os.close, fd)

            def waiting(pid: int | None, directory: Path = directory) -> str:
                who = f"dsim run (pid {pid})" if pid else "a dsim run"
                return f"waiting for {who} to finish writing {_shown(directory)} ..."

            _acquire(fd, fcntl.LOCK_SH, notify, waiting)
        yield
