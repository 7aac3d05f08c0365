"""A watchdog that stops the embedded Ray's processes when the dsim process that started them dies.

Why: when the driver that started a local Ray instance is killed (SIGKILL,
or SIGTERM, which Python does not turn into cleanup), Ray's kernel
fate-sharing (``PR_SET_PDEATHSIG``) takes down only its direct children --
``gcs_server``, ``raylet`` and the Python helpers. The raylet's own children,
the worker processes and the dashboard/runtime-env agents, are orphaned:
measured with Ray 2.60, workers linger for about 45 s and the agents never
exit. ``PR_SET_PDEATHSIG`` cannot be set on grandchildren, and Ray's
setproctitle overwrites part of the agents' environment, so neither a signal
nor an environment marker alone reaches everything.

So dsim starts this script (``start`` below) just before ``ray.init``, as
its own session so that terminal signals meant for dsim do not stop it. It
holds the read end of a pipe whose write end only dsim has, and:

* every ``POLL_S`` records the parent's descendants (pid and start time, so a
  reused pid is never mistaken for one of them) -- the agents and workers are
  descendants while the raylet lives;
* when the pipe reaches end-of-file -- dsim closed it after ``ray.shutdown``,
  or dsim died and the kernel closed it -- it terminates every recorded
  process still alive, and every process that carries the session's
  environment marker (workers started in the last poll interval carry it),
  then kills what is left after ``GRACE_S``.

It imports only the standard library and psutil, and is run as a script
(not ``-m``), so it starts without importing dsim.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from typing import IO

POLL_S = 0.1
GRACE_S = 3.0


def start(marker: str, *, debug: bool = False) -> subprocess.Popen[bytes]:
    """Start the watchdog for this process; close its ``stdin`` (``stop``) to end it.

    ``marker`` is ``NAME=VALUE``, an environment variable that this process
    puts into the environment of the Ray processes it starts.
    """
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), str(os.getpid()), marker],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=None if debug else subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 2 * GRACE_S + 5) -> None:
    """Tell the watchdog that dsim is done: it sweeps leftovers and exits."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:  # pragma: no cover - the sweep is bounded
        proc.kill()
        proc.wait()


def _wait_for_eof(stream: IO[bytes], done: threading.Event) -> None:
    with contextlib.suppress(OSError):
        while stream.read(4096):
            pass
    done.set()


def _marked(marker: str, exclude: set[int]) -> list:
    """Processes whose environment holds ``marker`` (readable ones only)."""
    import psutil

    name, _, value = marker.partition("=")
    found = []
    for proc in psutil.process_iter():
        if proc.pid in exclude:
            continue
        try:
            if proc.environ().get(name) == value:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def watch(parent_pid: int, marker: str) -> int:
    """Record the parent's descendants until EOF on stdin, then stop them all."""
    import psutil

    me = os.getpid()
    done = threading.Event()
    threading.Thread(target=_wait_for_eof, args=(sys.stdin.buffer, done), daemon=True).start()
    tracked: dict[tuple[int, float], psutil.Process] = {}
    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:
        parent = None
    while True:
        if parent is not None:
            with contextlib.suppress(psutil.Error):
                for child in parent.children(recursive=True):
                    if child.pid == me:
                        continue
                    with contextlib.suppress(psutil.Error):
                        tracked.setdefault((child.pid, child.create_time()), child)
        if done.wait(POLL_S):
            break
    exclude = {me, parent_pid}
    victims = {p.pid: p for p in tracked.values() if p.pid not in exclude}
    for proc in _marked(marker, exclude):
        victims.setdefault(proc.pid, proc)
    alive = []
    for proc in victims.values():
        # is_running() compares the start time, so a reused pid is left alone.
        with contextlib.suppress(psutil.Error):
            if proc.is_running():
                proc.terminate()
                alive.append(proc)
    _, left = psutil.wait_procs(alive, timeout=GRACE_S)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            if proc.is_running():
                proc.kill()
    psutil.wait_procs(left, timeout=GRACE_S)
    return 0


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1]), sys.argv[2]))
