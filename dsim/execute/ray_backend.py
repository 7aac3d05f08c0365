"""Execution on Ray: an embedded single-node instance, or an existing cluster.

Each run's prepared arrays go to the object store once (``ray.put``) and every
task of that run (one per policy and chunk of iterations) reads them from
there, zero-copy on the node. Tasks run ``dsim.execute.units.replay_rows``,
the same function as the in-process executor, so results are bit-identical.

Starting or joining Ray, with its checks and messages, is
``dsim.execute.ray_connect``: embedded mode binds one node to loopback,
without a dashboard and without log forwarding, watched so that its processes
die with dsim, and shut down afterwards. A cluster given by
``--ray-address`` (or ``RAY_ADDRESS``) is joined and left running.
"""

from __future__ import annotations

from typing import Any

from dsim.execute.address import FROM_SETTINGS
from dsim.execute.ray_connect import connect, disconnect
from dsim.execute.units import (
    ChunkOutput,
    Job,
    OnProgress,
    OnResult,
    chunk_bounds,
    join_chunks,
    replay_rows,
)
from dsim.replay.params import ReplayParams
from dsim.replay.policies import Policy

__all__ = ["connect", "disconnect", "run_ray"]


def run_ray(
    jobs: list[Job],
    params: ReplayParams,
    *,
    chunk_rows: int,
    on_result: OnResult,
    on_progress: OnProgress | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    source: str = FROM_SETTINGS,
) -> None:
    """Replay every (run, policy) as Ray tasks, reporting each policy when its chunks are in.

    ``address``/``source``: the cluster to join and where it came from (see
    ``dsim.execute.ray_connect``); no address starts an embedded instance.
    """
    ray, started = connect(address, num_cpus, source=source)
    try:
        task = ray.remote(num_cpus=1, max_retries=2)(replay_rows)
        pending: dict[Any, tuple[str, Policy, int, int]] = {}
        parts: dict[tuple[str, Policy], list[ChunkOutput | None]] = {}
        for job in jobs:
            if not job.policies:
                continue
            ref = ray.put(job.prepared)
            bounds = chunk_bounds(job.rows, chunk_rows, job.cuts)
            for policy in job.policies:
                parts[(job.run, policy)] = [None] * len(bounds)
                for k, (lo, hi) in enumerate(bounds):
                    pending[task.remote(job.model, ref, policy, job.params or params, lo, hi)] = (
                        job.run,
                        policy,
                        k,
                        hi - lo,
                    )
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                run, policy, k, rows = pending.pop(ref)
                slots = parts[(run, policy)]
                slots[k] = ray.get(ref)
                if on_progress is not None:
                    on_progress(rows)
                if all(s is not None for s in slots):
                    del parts[(run, policy)]
                    on_result(join_chunks(run, policy, [s for s in slots if s is not None]))
    finally:
        disconnect(ray, started)
