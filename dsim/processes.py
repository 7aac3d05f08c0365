"""Signals and worker processes: every way of stopping dsim ends on one clean path.

Ctrl-C (SIGINT) and ``kill`` (SIGTERM) both raise ``KeyboardInterrupt`` in
the main thread, so ``finally`` blocks run and temporary files are removed;
the CLI then prints ``dsim: interrupted`` and exits with 128 + the signal
number (130, 143). The signal is also recorded, because libraries may turn
the ``KeyboardInterrupt`` into something else on its way up (Typer returns
exit code 130, Click raises ``Abort``).

Worker processes of ``dsim parse`` die with their parent, even when the
parent is killed with SIGKILL and has no chance to stop them: on Linux the
kernel sends them SIGKILL (``PR_SET_PDEATHSIG``); elsewhere a watchdog thread
notices that the parent is gone. When the parent is interrupted, it stops
them with SIGTERM, on which a worker abandons its run the clean way. A
worker killed from outside is named by the task it was running
(``task_board``). Calls that must not be cut in half run under
``deferred_signals``; a library left unable to exit cleanly asks for
``request_hard_exit``.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from types import FrameType

_received: int | None = None
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_WATCH_PERIOD_S = 0.5
_STOP_GRACE_S = 10.0
_RESEND_AFTER_S = 0.01


_deferring = 0  # depth of ``deferred_signals`` blocks


_owner_pid: int | None = None  # the process whose handlers ``install_handlers`` set


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _received
    if _owner_pid is not None and os.getpid() != _owner_pid:
        # A forked child (a ``dsim parse`` worker) that inherited this handler and was
        # stopped before ``worker_init`` set its own: it has started no work, so it leaves
        # at once, as a stopped worker does. Raising here printed a traceback ("Exception
        # in initializer") when the parent stopped its pool just as it started.
        os._exit(exit_code(signum))
    if _received is None:
        _received = signum
    if _deferring:
        return  # noted: the block's owner acts on it when the block ends
    raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_signals():
    """Note SIGINT/SIGTERM in this block instead of raising them; re-arm our handlers after.

    For calls a ``KeyboardInterrupt`` must not cut in half: ``ray.shutdown``
    interrupted midway leaves Ray's C++ core worker half torn down, and the
    interpreter then crashes at exit (SIGSEGV) instead of exiting with 143.
    The caller checks ``received()`` after the block. Outside the main thread,
    or when the handlers are not ours, the block changes nothing.
    """
    global _deferring
    if threading.current_thread() is not threading.main_thread() or not handles(signal.SIGINT):
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        for signum in (signal.SIGINT, signal.SIGTERM):  # a library may have replaced them
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, _on_signal)


def _on_unraisable(unraisable) -> None:
    """Re-deliver an interrupt that landed where Python cannot raise it.

    A handler's ``KeyboardInterrupt`` raised inside a ``__del__``, a weakref
    callback or an at-fork hook (logging's, run by every ``fork`` of the
    parse pool) is printed as "Exception ignored in ..." with a traceback,
    and lost: the command would run on to the end and only then say
    "interrupted". Sending the signal again lets it arrive at the next safe
    point instead, where it unwinds the command as usual. It is sent a moment
    later from another thread: sent now, the handler would run inside this
    hook, itself a place where exceptions are ignored (and if it lands in
    one again, it comes back here and is sent again).
    """
    if isinstance(unraisable.exc_value, _Stop):  # a busy worker's SIGTERM, the same way
        _resend(signal.SIGTERM)
        return
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received is not None:
        if handles(_received):
            _resend(_received)
        return
    _default_unraisable(unraisable)


def _resend(signum: int) -> None:
    """Send ``signum`` to this process again a moment later, from another thread."""
    resend = threading.Timer(_RESEND_AFTER_S, os.kill, args=(os.getpid(), signum))
    resend.daemon = True
    with contextlib.suppress(RuntimeError):  # no new threads at interpreter exit
        resend.start()


_default_unraisable = sys.unraisablehook


def install_handlers() -> None:
    """Turn SIGINT and SIGTERM into ``KeyboardInterrupt`` (main thread only)."""
    global _owner_pid
    if threading.current_thread() is not threading.main_thread():
        return
    _owner_pid = os.getpid()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)
    sys.unraisablehook = _on_unraisable


def handles(signum: int) -> bool:
    """Whether ``install_handlers``'s handler is (still) the one for ``signum``."""
    return signal.getsignal(signum) is _on_signal


def ignore_further() -> None:
    """Ignore SIGINT and SIGTERM from now on (the process is on its way out)."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


_hard_exit = False


def request_hard_exit() -> None:
    """Ask the CLI to leave with ``os._exit`` once its message is out.

    For a library left in a state where the interpreter's own exit can hang
    or crash (Ray's driver after its cluster died, its shutdown abandoned).
    """
    global _hard_exit
    _hard_exit = True


def hard_exit_requested() -> bool:
    return _hard_exit


def received() -> int | None:
    """The first SIGINT or SIGTERM this process received through ``install_handlers``."""
    return _received


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by a signal."""
    return 128 + signum


# -- worker processes -------------------------------------------------------------------------


class _Stop(BaseException):
    """Raised in a busy worker on SIGTERM; not an ``Exception``, so nothing swallows it."""


_busy = False


def _on_worker_term(signum: int, frame: FrameType | None) -> None:
    if _busy:
        raise _Stop
    os._exit(exit_code(signum))  # idle: nothing of ours to clean up


def _set_parent_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(_WATCH_PERIOD_S)
        if os.getppid() != parent:
            os._exit(1)


# A worker's slot on the task board: (pid, index of the task it runs, or -1).
_board = None
_slot: int | None = None


def task_board(workers: int):
    """Shared memory where each of ``workers`` pool processes notes which task it runs.

    When a worker is killed from outside (the OOM killer, ``kill -9``), the pool
    only says that *a* process died; the board says which task it was running,
    so that the error can name it (``killed_tasks``). Pass it to ``worker_init``.

    Its lock is taken only to claim a slot; a slot's task is written by its own
    worker alone and read without the lock, since a worker killed while holding
    it (``kill -9`` lands anywhere) would leave every later reader, the parent
    naming the dead worker's run included, waiting forever.
    """
    board = multiprocessing.Array("q", 2 * workers)
    board[:] = [0, -1] * workers
    return board


def worker_init(parent: int, board=None) -> None:
    """``ProcessPoolExecutor`` initializer: die with ``parent``, leave Ctrl-C to it.

    A terminal's Ctrl-C reaches the whole process group; workers ignore it
    and the parent stops them (``stop_workers``), so that one message and one
    exit code come out. With a ``board`` (``task_board``) the worker claims a
    slot on it.
    """
    global _board, _slot
    if board is not None:
        with board.get_lock():
            _slot = next((k for k in range(0, len(board), 2) if board[k] == 0), None)
            if _slot is not None:
                board[_slot] = os.getpid()
        _board = board.get_obj()  # unlocked from now on: see task_board
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_worker_term)
    # a stop raised where it cannot unwind (a weakref callback of the import machinery, a
    # __del__) is sent again rather than printed as "Exception ignored" and lost
    sys.unraisablehook = _on_unraisable
    if not _set_parent_death_signal():
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)


def in_worker(function, *args, task: int = -1):
    """Run ``function(*args)`` in a worker; SIGTERM unwinds it (cleaning up) and ends the worker.

    ``task`` (an index of the caller's) is noted on the worker's task board while it runs.
    """
    global _busy
    _busy = True
    if _board is not None and _slot is not None:
        _board[_slot + 1] = task
    try:
        return function(*args)
    except _Stop:
        if _board is not None and _slot is not None:
            _board[_slot + 1] = -1  # stopped, not killed: its task is not ``killed_tasks``'
        os._exit(exit_code(signal.SIGTERM))
    finally:
        _busy = False
        if _board is not None and _slot is not None:
            _board[_slot + 1] = -1


def killed_tasks(board) -> list[int]:
    """The tasks that workers on ``board`` were running when they died (ascending)."""
    tasks = []
    slots = board.get_obj()  # not the lock: a dead worker may hold it (task_board)
    for k in range(0, len(slots), 2):
        pid, task = slots[k], slots[k + 1]
        if pid > 0 and task >= 0 and not _alive(pid):
            tasks.append(task)
    return sorted(tasks)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def stop_workers() -> None:
    """SIGTERM every child process, wait for them to clean up, SIGKILL what is left."""
    children = multiprocessing.active_children()
    for child in children:
        with contextlib.suppress(OSError):
            child.terminate()
    deadline = time.monotonic() + _STOP_GRACE_S
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            with contextlib.suppress(OSError):
                child.kill()
            child.join(1.0)
