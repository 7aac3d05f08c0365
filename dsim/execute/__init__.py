"""Execution of replays: in-process (``local``) or on Ray (``ray_backend``).

``choose_executor`` resolves ``auto`` (docs/SPEC.md §8); ``execute`` replays
jobs on the chosen executor and reports each finished (run, policy) through
``on_result`` as soon as it is complete, so the caller can write it at once and
an interrupted run loses only unfinished policies. ``dsim run`` itself sends
whole runs to Ray (``ray_backend.run_ray_tasks``), not chunks.
"""

from __future__ import annotations

import os

from dsim.execute.address import FROM_SETTINGS, configured_address
from dsim.execute.units import (
    DEFAULT_CHUNK_ROWS,
    Job,
    OnProgress,
    OnResult,
    PolicyResult,
    total_rows,
    total_work,
)
from dsim.replay.params import ReplayParams

#: ``auto`` without a cluster: Ray only for at least this many runs on at least this
#: many cores. A run is one task (its read, replay and writes), so Ray can only win by
#: running runs side by side, and must win back its start-up (~3-9 s for an embedded
#: instance): a 10,000 x 8 run with 9 policies takes ~0.2-0.4 s in-process, so a few
#: dozen runs on 4 cores at least. One big run is never faster on Ray.
AUTO_RAY_MIN_RUNS = 32
AUTO_RAY_MIN_CPUS = 4

__all__ = [
    "AUTO_RAY_MIN_CPUS",
    "AUTO_RAY_MIN_RUNS",
    "DEFAULT_CHUNK_ROWS",
    "Job",
    "PolicyResult",
    "choose_executor",
    "execute",
    "ray_address",
    "total_rows",
    "total_work",
]


def ray_address(configured: str | None) -> str | None:
    """The cluster to join: ``--ray-address``/config, else ``RAY_ADDRESS``, else none.

    ``local`` (Ray's word for "start a new instance") means no cluster, like
    an unset or empty address, so ``auto`` may still stay in-process.
    """
    text, _ = configured_address(configured)
    return None if text in (None, "", "local") else text


def choose_executor(name: str, runs: int, address: str | None, cpus: int | None = None) -> str:
    """Resolve ``auto`` to ``local`` or ``ray`` (docs/SPEC.md §8): Ray on a named cluster,
    or for at least ``AUTO_RAY_MIN_RUNS`` runs on at least ``AUTO_RAY_MIN_CPUS`` cores
    (``cpus``: the CPUs Ray would be given, default this machine's); else in-process."""
    if name != "auto":
        return name
    if address is not None:
        return "ray"
    cpus = cpus or os.cpu_count() or 1
    if runs >= AUTO_RAY_MIN_RUNS and cpus >= AUTO_RAY_MIN_CPUS:
        return "ray"
    return "local"


def execute(
    jobs: list[Job],
    params: ReplayParams,
    *,
    executor: str = "auto",
    num_cpus: int | None = None,
    address: str | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    on_result: OnResult,
    on_progress: OnProgress | None = None,
) -> str:
    """Replay all jobs; returns the executor that ran them (``local`` or ``ray``)."""
    _, source = configured_address(address, FROM_SETTINGS)
    address = ray_address(address)
    chosen = choose_executor(executor, len(jobs), address, num_cpus)
    if not any(job.policies for job in jobs):
        return chosen
    if chosen == "local":
        from dsim.execute.local import run_local

        run_local(jobs, params, chunk_rows=chunk_rows, on_result=on_result, on_progress=on_progress)
    else:
        from dsim.execute.ray_backend import run_ray

        run_ray(
            jobs,
            params,
            chunk_rows=chunk_rows,
            on_result=on_result,
            on_progress=on_progress,
            address=address,
            num_cpus=num_cpus,
            source=source,
        )
    return chosen
