"""CPU time and run-queue wait of the calling thread, cheaply (docs/SPEC.md §1.1).

Why both: a batch's wall time mixes waiting for I/O, CPU work and waiting
for a core. Only the last two stretch when more processes share the node's
cores, so the pipeline model needs them apart (SPEC §4.2, CPU contention).
CPU time comes from ``time.thread_time`` (the thread's CPU clock, exact
to the call); the run-queue wait from Linux's ``/proc/thread-self/schedstat``
(field 2: nanoseconds runnable on a run queue), opened once per thread and
re-read with ``pread`` (about a microsecond); without it the wait is unknown
(``None``). schedstat's field 1 (nanoseconds on a CPU) is not used: for the
thread reading it, it is only brought up to date at the scheduler's ticks
and switches, so a 2 ms batch of CPU work read as ~0 ms (measured); the
wait, which cannot grow while the thread runs, is exact when read.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

_SCHEDSTAT = "/proc/thread-self/schedstat"
_local = threading.local()


def _fd() -> int | None:
    """This thread's schedstat descriptor (re-opened after a fork); ``None`` without /proc."""
    pid = os.getpid()
    cached = getattr(_local, "fd", None)
    if cached is not None and cached[0] == pid:
        return cached[1]
    try:
        fd: int | None = os.open(_SCHEDSTAT, os.O_RDONLY)
    except OSError:
        fd = None
    _local.fd = (pid, fd)
    return fd


def parse_schedstat(text: bytes) -> tuple[float, float]:
    """``b"<on-cpu ns> <run-queue ns> <slices>"`` as (CPU seconds, run-queue seconds)."""
    on_cpu, waiting = text.split()[:2]
    return int(on_cpu) * 1e-9, int(waiting) * 1e-9


def thread_times() -> tuple[float, float | None]:
    """(CPU seconds, run-queue seconds or ``None``) this thread has used so far."""
    fd = _fd()
    waited = None
    if fd is not None:
        with contextlib.suppress(OSError, ValueError):
            waited = parse_schedstat(os.pread(fd, 128, 0))[1]
    return time.thread_time(), waited


def process_cpu() -> float:
    """CPU seconds of the whole process, all threads (the training process's own work)."""
    return time.process_time()


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask, else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_world_size() -> int | None:
    """Ranks on this node (``$LOCAL_WORLD_SIZE``, set by torchrun), else ``None``."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(text) if text.isdigit() and int(text) > 0 else None
