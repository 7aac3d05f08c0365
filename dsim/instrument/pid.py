"""This process's id, known without a system call per logged line.

Why: a DataLoader worker inherits its parent's objects, open descriptors
included, and must notice that it is a new process before it writes a line
or reads its thread's schedstat through them (``lines.FileSink``,
``cpu.thread_times``). Asking the kernel each time (``os.getpid`` is a real
system call: glibc stopped caching it in 2.25) cost five system calls per
batch in the training process, more than a third of the instrumentation's
(``strace -c``, bench/bench_instrument.py). The id is read once at import
and again in every child that ``os.fork`` creates (``os.register_at_fork``;
multiprocessing's ``fork`` and ``forkserver`` start methods fork through it),
while ``spawn`` imports this module afresh. A child forked by C code behind
Python's back runs no Python before it ``exec``s, so it needs no hook.
"""

from __future__ import annotations

import os

_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forked)


def current_pid() -> int:
    """This process's id, as ``os.getpid()`` would say, without asking the kernel."""
    return _pid
