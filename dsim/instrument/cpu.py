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

import os
import threading
import time

from dsim.instrument.pid import current_pid

_SCHEDSTAT = "/proc/thread-self/schedstat"
_local = threading.local()


def _fd() -> int | None:
    """This thread's schedstat descriptor (re-opened after a fork); ``None`` without /proc.

    Per batch this is two attribute reads: the process id comes from
    ``dsim.instrument.pid`` (no system call), the descriptor from a thread-local.
    """
    local = _local
    try:
        if local.pid == current_pid():
            return local.fd
    except AttributeError:  # this thread's first read
        pass
    try:
        fd: int | None = os.open(_SCHEDSTAT, os.O_RDONLY)
    except OSError:
        fd = None
    local.pid, local.fd = current_pid(), fd
    return fd


def parse_schedstat(text: bytes) -> tuple[float, float]:
    """``b"<on-cpu ns> <run-queue ns> <slices>"`` as (CPU seconds, run-queue seconds)."""
    on_cpu, waiting = text.split()[:2]
    return int(on_cpu) * 1e-9, int(waiting) * 1e-9


def thread_wait() -> float | None:
    """Seconds this thread has waited on a run queue so far; ``None`` without schedstat.

    One ``pread`` and the second field's digits: the per-batch cost is the
    system call. A plain ``try`` rather than ``contextlib.suppress``, which
    builds a context manager per call (a microsecond of the ~4 the old
    ``thread_times`` cost).
    """
    fd = _fd()
    if fd is None:
        return None
    try:
        return int(os.pread(fd, 128, 0).split(None, 2)[1]) * 1e-9
    except (OSError, ValueError, IndexError):
        return None


def thread_times() -> tuple[float, float | None]:
    """(CPU seconds, run-queue seconds or ``None``) this thread has used so far."""
    return time.thread_time(), thread_wait()


def process_cpu() -> float:
    """CPU seconds of the whole process, all threads (the training process's own work)."""
    return time.process_time()


_since: list[tuple[int, float]] = []  # (pid, process CPU) at this process's last batch


def process_cpu_since_last_batch() -> float | None:
    """CPU seconds of this whole process, every thread, since its previous call; ``None`` first.

    Why: a DataLoader worker spends CPU outside the thread that builds a
    batch (its queue's feeder thread pickles each batch into the pipe, the
    worker loop waits on its index queue). That CPU contends for the node's
    cores like the building itself, but ``thread_times`` cannot see it: on a
    saturated 2-core node it was 2.3-2.7 ms per batch (validation/README.md,
    "The node's idle time"). Reading the process clock at each batch's end
    gives, batch after batch, every CPU second the worker spent, the
    previous batch's hand-off included. The first batch of a process has no
    previous end (its process start would count the worker's start-up), so
    it has no value. The pid travels with the reading: a worker forked from
    a process that had read the clock must not subtract the parent's.
    """
    now, pid = time.process_time(), current_pid()
    last = _since[0] if _since else None
    _since[:] = [(pid, now)]
    if last is None or last[0] != pid:
        return None
    return max(now - last[1], 0.0)


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask, else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cpus() -> str | None:
    """The CPUs this process may run on, as ranges (``0-7,16-23``); ``None`` where the
    platform has no affinity mask.

    Why beside ``usable_cores``: a launcher that binds each rank to cores of its own
    (``srun --cpu-bind``, ``numactl`` per rank) gives every rank a mask of its share, so
    its count alone says a node of 8 ranks has 8 cores where it has 64. The ranks' sets
    tell: dsim takes a node's cores as the union of its ranks' sets (SPEC §1.2)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return cpu_ranges(cpus) if cpus else None


def cpu_ranges(cpus: list[int]) -> str:
    """Sorted CPU ids as Linux's list format: ``[0, 1, 2, 5]`` is ``0-2,5``."""
    parts: list[str] = []
    start = prev = cpus[0]
    for cpu in [*cpus[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(parts)


def local_world_size() -> int | None:
    """Ranks on this node (``$LOCAL_WORLD_SIZE``, set by torchrun), else ``None``."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(text) if text.isdigit() and int(text) > 0 else None
