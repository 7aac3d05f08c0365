"""The raw log lines dsim's parser reads (docs/SPEC.md §1), and where they go.

Formatting is kept apart from timing so that the exact text is defined in one
place and can be tested without PyTorch. Where the lines go, and when they
are written, is ``dsim.instrument.sinks`` (its names are re-exported here).
"""

from __future__ import annotations

import os
import time

from dsim.errors import UsageError
from dsim.instrument.sinks import (  # noqa: F401 (re-exported: the sinks lived here)
    PIPE_BUF,
    FileSink,
    LineSink,
    LoggerSink,
    make_sink,
)

_second: list = [None, ""]  # (whole second, its formatted text): strftime is the costly part


def format_timestamp(wall: float) -> str:
    """Local wall-clock time with microseconds, as the original loggers printed it."""
    second = int(wall // 1)
    if second != _second[0]:
        _second[:] = [second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))]
    return f"{_second[1]}.{min(int((wall - second) * 1e6), 999_999):06d}"


def fetch_line(
    wall_end: float,
    rank: int,
    worker: int,
    seconds: float,
    batch: int,
    cpu: float | None = None,
    runq: float | None = None,
    stages: tuple[float, float, float, float] | None = None,
    stream: int | None = None,
    proc: float | None = None,
) -> str:
    """A worker finished building batch ``batch`` of this epoch at ``wall_end`` after ``seconds``.

    Fixed-point seconds: ``repr`` would print tiny durations as ``1e-05``,
    which the grammar does not accept. ``cpu`` (seconds the worker's thread
    ran on a core for this batch) and ``runq`` (seconds it waited for one)
    follow as ``cpu X runq Y`` when known (SPEC §1.1); ``runq`` only with ``cpu``.
    ``proc`` (CPU seconds of the worker's whole process, every thread, since
    its previous batch was built) follows them as ``proc P``, only with ``cpu``.
    ``stream`` (a batch of an IterableDataset: the how-many-th this worker built
    in the epoch, 0-based) comes first, as ``stream K`` (SPEC §1.2).
    ``stages`` (wall and CPU seconds of the sample reads, then of the
    collation, ``dsim.instrument.stages``) come last, as
    ``read R read_cpu C collate L collate_cpu D`` (SPEC §1.2).
    """
    tail = "" if stream is None else f" stream {stream}"
    if cpu is not None:
        tail += f" cpu {cpu:.9f}" if runq is None else f" cpu {cpu:.9f} runq {runq:.9f}"
        if proc is not None:
            tail += f" proc {proc:.9f}"
    if stages is not None:
        read, read_cpu, collate, collate_cpu = stages
        tail += (
            f" read {read:.9f} read_cpu {read_cpu:.9f}"
            f" collate {collate:.9f} collate_cpu {collate_cpu:.9f}"
        )
    return (
        f"{format_timestamp(wall_end)} DEBUG:\tGPU: {rank} worker_id: {worker}, "
        f"END FETCH at_time {seconds:.9f} data idx{batch}{tail}\n"
    )


def training_line(
    wall_start: float,
    rank: int,
    epoch: int,
    iteration: int,
    total: int,
    time_s: tuple[float, float],
    data_s: tuple[float, float],
    throughput: tuple[float, float] | None,
    cpu: tuple[float, float] | None = None,
    runq: tuple[float, float] | None = None,
) -> str:
    """One iteration in the PyTorch ImageNet example's format; pairs are (value, running mean).

    ``cpu`` (the training process's CPU seconds in the iteration, all its
    threads) and ``runq`` (its main thread's wait for a core) are appended as
    ``CPU`` and ``Runq`` fields in the example's ``Name value (mean)`` form,
    which parsers that do not know them skip (SPEC §1.2).
    """
    width = len(str(total))
    line = (
        f"{format_timestamp(wall_start)} GPU: {rank} "
        f"Epoch: [{epoch}][{iteration:>{width}d}/{total}]"
        f"\tTime {time_s[0]:.6f} ({time_s[1]:.6f})\tData {data_s[0]:.6f} ({data_s[1]:.6f})"
    )
    if throughput is not None:
        line += f"\tThroughput {throughput[0]:.3f} ({throughput[1]:.3f})"
    if cpu is not None:
        line += f"\tCPU {cpu[0]:.6f} ({cpu[1]:.6f})"
        if runq is not None:
            line += f"\tRunq {runq[0]:.6f} ({runq[1]:.6f})"
    return line + "\n"


LOADER_FIELDS = ("num_workers", "prefetch_factor", "batch_size", "persistent_workers", "pin_memory")
NODE_FIELDS = ("cores", "local_world_size")  # appended when the settings carry ``cores``


def loader_line(wall: float, rank: int, settings: dict[str, object]) -> str:
    """The loader's settings when an epoch's first batch arrives: what a pipeline replay needs.

    Integers as digits, booleans as 0/1, an unset value (``prefetch_factor``
    without workers, ``batch_size`` with a custom batch sampler) as ``none``.
    With ``cores`` in ``settings``, the node's fields follow: the cores the
    process may use and the ranks on the node (``none`` when unknown), then,
    when known, ``cpus``: the CPUs it may use, as ranges (``0-7,16-23``).
    ``batch_bytes`` (the bytes of the tensors of the epoch's first batch)
    comes last, only when known.
    """
    fields = []
    names = LOADER_FIELDS + (NODE_FIELDS if "cores" in settings else ())
    for name in names:
        value = settings.get(name)
        text = "none" if value is None else str(int(value))
        fields.append(f"{name} {text}")
    if "cores" in settings and settings.get("cpus"):
        fields.append(f"cpus {settings['cpus']}")
    if settings.get("batch_bytes") is not None:
        fields.append(f"batch_bytes {int(settings['batch_bytes'])}")  # type: ignore[call-overload]
    return f"{format_timestamp(wall)} GPU: {rank} LOADER {' '.join(fields)}\n"


def resolve_rank(rank: int | None) -> int:
    """The caller's rank, else torch.distributed's, else ``$RANK``, else 0."""
    if rank is not None:
        if rank < 0:
            raise UsageError(f"rank must be >= 0, got {rank}")
        return int(rank)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:
        pass
    env = os.environ.get("RANK", "")
    return int(env) if env.isdigit() else 0
