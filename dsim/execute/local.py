"""In-process execution: no start-up cost, the right choice for small jobs."""

from __future__ import annotations

from dsim.execute.units import (
    ChunkJoin,
    Job,
    OnProgress,
    OnResult,
    chunk_bounds,
    replay_rows,
)
from dsim.replay.params import ReplayParams


def run_local(
    jobs: list[Job],
    params: ReplayParams,
    *,
    chunk_rows: int,
    on_result: OnResult,
    on_progress: OnProgress | None = None,
) -> None:
    """Replay every (run, policy) in this process, reporting each policy as soon as it is done."""
    for job in jobs:
        for policy in job.policies:
            joined = ChunkJoin(job.rows)  # each chunk copied in as it is done (memory)
            for lo, hi in chunk_bounds(job.rows, chunk_rows, job.cuts):
                joined.add(
                    replay_rows(job.model, job.prepared, policy, job.params or params, lo, hi)
                )
                if on_progress is not None:
                    on_progress(hi - lo)
            result = joined.result(job.run, policy)
            del joined
            on_result(result)
