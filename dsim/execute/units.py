"""Work units of a replay: (run, policy) pairs, split into chunks of iterations.

A replay model says where a run's rows may be cut (``ReplayModel.cut_points``;
the per-iteration model: anywhere), so a run's iterations are cut into row
ranges there, replayed anywhere, and concatenated back: the result is
bit-identical to replaying all rows at once. Every executor goes through
``replay_rows`` and ``join_chunks`` so that they can only differ in *where* a
chunk runs, never in *what* it computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsim.replay.models import get_model
from dsim.replay.params import ReplayParams
from dsim.replay.policies import Policy

#: Iterations per work unit. The real 2-epoch trace has ~1,700; chunks matter
#: for runs of hundreds of thousands of iterations, where they spread one
#: policy over several CPUs and bound the memory of one task.
DEFAULT_CHUNK_ROWS = 200_000


@dataclass(frozen=True)
class Job:
    """One run to replay: its model, prepared arrays, the policies still to compute,
    and the rows before which the model allows a cut (``None``: anywhere)."""

    run: str
    prepared: Any  # the model's prepared run (``dsim.replay.models.base.PreparedRun``)
    policies: tuple[Policy, ...]
    model: str = "per-iteration"
    cuts: tuple[int, ...] | None = None
    params: ReplayParams | None = None  # this run's own parameters (else the executor's)

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


def chunk_bounds(
    rows: int, chunk_rows: int, cuts: tuple[int, ...] | None = None
) -> list[tuple[int, int]]:
    """Row ranges ``[lo, hi)`` covering ``rows``; one (possibly empty) range at least.

    Without ``cuts`` every range but the last has ``chunk_rows`` rows. With
    ``cuts`` (the rows before which the model allows a split), a range ends at
    the first allowed cut at least ``chunk_rows`` rows after its start, or at
    the end: ranges may be longer than ``chunk_rows``, never split elsewhere.
    """
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be positive")
    if rows == 0:
        return [(0, 0)]
    if cuts is None:
        return [(lo, min(lo + chunk_rows, rows)) for lo in range(0, rows, chunk_rows)]
    allowed = sorted(c for c in set(cuts) if 0 < c < rows)
    bounds: list[tuple[int, int]] = []
    lo = 0
    for cut in allowed:
        if cut - lo >= chunk_rows:
            bounds.append((lo, cut))
            lo = cut
    bounds.append((lo, rows))
    return bounds


def replay_rows(
    model: str, prep: Any, policy: Policy, params: ReplayParams, lo: int, hi: int
) -> ChunkOutput:
    """Replay rows ``[lo, hi)`` of a run with ``model``; the one function every executor runs."""
    replay_model = get_model(model)
    result = replay_model.replay(prep.take(lo, hi), policy, params)
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
