"""Work units of a replay: (run, policy) pairs, split into chunks of iterations.

The kernel replays every iteration on its own (``dsim.replay.models.per_iteration``), so a run's
iterations can be cut into row ranges, replayed anywhere, and concatenated
back: the result is bit-identical to replaying all rows at once. Every
executor goes through ``replay_rows`` and ``join_chunks`` so that they can
only differ in *where* a chunk runs, never in *what* it computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from dsim.replay.models.per_iteration import Prepared, ReplayParams, replay_prepared
from dsim.replay.policies import Policy

#: Iterations per work unit. The real 2-epoch trace has ~1,700; chunks matter
#: for runs of hundreds of thousands of iterations, where they spread one
#: policy over several CPUs and bound the memory of one task.
DEFAULT_CHUNK_ROWS = 200_000


@dataclass(frozen=True)
class Job:
    """One run to replay: its prepared arrays and the policies still to compute."""

    run: str
    prepared: Prepared
    policies: tuple[Policy, ...]

    @property
    def rows(self) -> int:
        return int(self.prepared.shape[0])

    @property
    def gpus(self) -> int:
        return int(self.prepared.shape[1])


@dataclass(frozen=True)
class PolicyResult:
    """The finished replay of one run under one policy (all rows, in order)."""

    run: str
    policy: Policy
    metrics: dict[str, np.ndarray]
    gpu_stall: np.ndarray  # [N, G]


ChunkOutput = tuple[dict[str, np.ndarray], np.ndarray]
OnResult = Callable[[PolicyResult], None]
OnProgress = Callable[[int], None]


def chunk_bounds(rows: int, chunk_rows: int) -> list[tuple[int, int]]:
    """Row ranges ``[lo, hi)`` covering ``rows``; one (possibly empty) range at least."""
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be positive")
    if rows == 0:
        return [(0, 0)]
    return [(lo, min(lo + chunk_rows, rows)) for lo in range(0, rows, chunk_rows)]


def slice_prepared(prep: Prepared, lo: int, hi: int) -> Prepared:
    """The rows ``[lo, hi)`` of a prepared run (every field is row-major in iterations)."""
    return Prepared(**{f.name: getattr(prep, f.name)[lo:hi] for f in fields(prep)})


def replay_rows(
    prep: Prepared, policy: Policy, params: ReplayParams, lo: int, hi: int
) -> ChunkOutput:
    """Replay rows ``[lo, hi)`` of a run; the one function every executor runs."""
    result = replay_prepared(slice_prepared(prep, lo, hi), policy, params)
    return result.metrics(), np.ascontiguousarray(result.gpu_stall_s)


def join_chunks(run: str, policy: Policy, parts: list[ChunkOutput]) -> PolicyResult:
    """Concatenate chunk outputs, in row order, into one policy result."""
    if len(parts) == 1:
        metrics, gpu_stall = parts[0]
        return PolicyResult(run, policy, dict(metrics), gpu_stall)
    metrics = {name: np.concatenate([p[0][name] for p in parts]) for name in parts[0][0]}
    gpu_stall = np.concatenate([p[1] for p in parts], axis=0)
    return PolicyResult(run, policy, metrics, gpu_stall)


def total_work(jobs: list[Job]) -> int:
    """GPU-iteration-policies: the size measure that picks an executor."""
    return sum(job.rows * max(job.gpus, 1) * len(job.policies) for job in jobs)


def total_rows(jobs: list[Job]) -> int:
    """Iteration-policies: the unit of progress."""
    return sum(job.rows * len(job.policies) for job in jobs)
