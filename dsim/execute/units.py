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
    return result.metrics(), np.asfortranarray(result.gpu_stall_s)


class ChunkJoin:
    """One policy's chunk outputs, copied in row order into its whole result as they come.

    The per-GPU stalls are column-major (each GPU's column contiguous, as the kernel
    writes them), so that the replay table takes each column without a copy. A
    policy replayed in one chunk keeps the chunk's own arrays; a chunked one holds
    the whole result plus one chunk, never every chunk beside their concatenation.
    """

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.lo = 0
        self.metrics: dict[str, np.ndarray] = {}
        self.gpu_stall: np.ndarray | None = None

    def add(self, part: ChunkOutput) -> None:
        metrics, gpu_stall = part
        n = gpu_stall.shape[0]
        if self.gpu_stall is None and n == self.rows:  # the one chunk: adopted as it is
            self.metrics, self.gpu_stall = dict(metrics), np.asfortranarray(gpu_stall)
            self.lo = n
            return
        if self.gpu_stall is None:
            shape = (self.rows, gpu_stall.shape[1])
            self.gpu_stall = np.empty(shape, dtype=gpu_stall.dtype, order="F")
            self.metrics = {k: np.empty(self.rows, dtype=v.dtype) for k, v in metrics.items()}
        hi = self.lo + n
        for name, values in metrics.items():
            self.metrics[name][self.lo : hi] = values
        self.gpu_stall[self.lo : hi] = gpu_stall
        self.lo = hi

    def result(self, run: str, policy: Policy) -> PolicyResult:
        if self.gpu_stall is None or self.lo != self.rows:
            raise ValueError(f"chunks cover {self.lo} of {self.rows} rows")
        return PolicyResult(run, policy, self.metrics, self.gpu_stall)


def join_chunks(run: str, policy: Policy, parts: list[ChunkOutput]) -> PolicyResult:
    """Concatenate chunk outputs, in row order, into one policy result (``ChunkJoin``)."""
    joined = ChunkJoin(sum(int(p[1].shape[0]) for p in parts))
    for part in parts:
        joined.add(part)
    return joined.result(run, policy)


def total_work(jobs: list[Job]) -> int:
    """GPU-iteration-policies: the size measure that picks an executor."""
    return sum(job.rows * max(job.gpus, 1) * len(job.policies) for job in jobs)


def total_rows(jobs: list[Job]) -> int:
    """Iteration-policies: the unit of progress."""
    return sum(job.rows * len(job.policies) for job in jobs)
