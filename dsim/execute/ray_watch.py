"""A joined Ray cluster whose head node dies: one line in seconds, not Ray's 60 s and its logs.

When the head node of a cluster dsim joined dies mid-run, Ray's driver keeps
waiting: its C++ core retries the GCS for 60 s, writes error lines on file
descriptor 2 meanwhile, then ends the process (exit 1) without a word from
dsim. So while a joined cluster runs dsim's tasks:

* ``HeadWatch`` checks every second or so, between waits, that the head's GCS
  port still accepts connections; refused (or silent) for ``LOST_AFTER_S`` in
  a row, the cluster is lost (``ClusterLost``, exit 1, one line);
* ``native_stderr_captured`` sends fd 2 (where Ray's C++ core writes) to a
  temporary file, while Python's ``sys.stderr`` (dsim's own messages, the
  progress bar) keeps writing to the terminal; the captured text is shown
  only with ``--debug`` (not captured then) or for a failure dsim cannot
  explain;
* after a loss, ``ray.shutdown`` is given ``SHUTDOWN_TIMEOUT_S`` (it can wait
  on the dead GCS), and if it does not return, the process leaves with
  ``os._exit`` once dsim's message is out (``dsim.processes.request_hard_exit``).
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dsim.errors import DsimError

POLL_S = 1.0  # how long one ray.wait may block before the head is checked
LOST_AFTER_S = 5.0  # the head's GCS port refused (or silent) this long in a row: lost
CONNECT_TIMEOUT_S = 1.0
SHUTDOWN_TIMEOUT_S = 5.0


class ClusterLost(DsimError):
    """The head node of the Ray cluster dsim joined stopped answering during the run."""


@dataclass
class HeadWatch:
    """Whether the GCS at ``host:port`` still accepts connections (checked at most every
    ``POLL_S``); ``check`` raises ``ClusterLost`` after ``LOST_AFTER_S`` without one."""

    host: str
    port: int
    clock: Callable[[], float] = time.monotonic
    down_since: float | None = None
    last_check: float = float("-inf")

    def alive(self) -> bool:
        try:
            socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError:
            return False
        return True

    def check(self, finished: int, total: int, unit: str = "replay") -> None:
        now = self.clock()
        if now - self.last_check < POLL_S:
            return
        self.last_check = now
        if self.alive():
            self.down_since = None
            return
        if self.down_since is None:
            self.down_since = now
        if now - self.down_since >= LOST_AFTER_S:
            raise self.lost(finished, total, unit)

    def lost(self, finished: int, total: int, unit: str = "replay") -> ClusterLost:
        """``unit``: what ``finished`` and ``total`` count (replays; runs for ``dsim run``,
        whose tasks are whole runs)."""
        return ClusterLost(
            f"the Ray cluster at {self.host}:{self.port} stopped answering during the run "
            f"(its head node died?): {finished} of {total} {unit}(s) were finished and "
            "written; run again when the cluster is back (they are reused), or use "
            "--executor local"
        )


@contextlib.contextmanager
def native_stderr_captured(enabled: bool = True) -> Iterator[io.StringIO]:
    """fd 2 to a temporary file, ``sys.stderr`` still to the terminal (see module doc).

    The yielded buffer holds the captured text once the block has ended.
    """
    captured = io.StringIO()
    if not enabled:
        yield captured
        return
    sys.stderr.flush()
    terminal = os.dup(2)
    python_stderr = sys.stderr
    replacement = open(  # noqa: SIM115 - closed in the finally below
        terminal,
        "w",
        encoding=getattr(python_stderr, "encoding", None) or "utf-8",
        errors="backslashreplace",
        buffering=1,
        closefd=False,
    )
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        sys.stderr = replacement
        try:
            yield captured
        finally:
            with contextlib.suppress(Exception):
                replacement.flush()
            sys.stderr = python_stderr
            os.dup2(terminal, 2)
            os.close(terminal)
            replacement.close()
            tmp.seek(0)
            captured.write(tmp.read().decode("utf-8", errors="replace"))


def bounded(call: Callable[[], object], timeout_s: float = SHUTDOWN_TIMEOUT_S) -> bool:
    """Run ``call`` in a daemon thread; whether it returned within ``timeout_s``."""
    worker = threading.Thread(target=call, daemon=True, name="dsim-ray-shutdown")
    worker.start()
    worker.join(timeout_s)
    return not worker.is_alive()
