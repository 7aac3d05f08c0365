"""Execution on Ray: an embedded single-node instance, or an existing cluster.

Each run's prepared arrays go to the object store once (``ray.put``) and every
task of that run (one per policy and chunk of iterations) reads them from
there, zero-copy on the node. Tasks run ``dsim.execute.units.replay_rows``,
the same function as the in-process executor, so results are bit-identical.

Embedded mode binds one node to loopback (``address="local"`` with
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), without a dashboard and without log
forwarding, and is shut down afterwards. A cluster given by ``--ray-address``
(or ``RAY_ADDRESS``) is joined and left running; Ray's token authentication
stays on, so the client needs the cluster's token (``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from dsim.errors import UsageError
from dsim.execute.units import (
    ChunkOutput,
    Job,
    OnProgress,
    OnResult,
    chunk_bounds,
    join_chunks,
    replay_rows,
)
from dsim.policies import Policy
from dsim.replay import ReplayParams

_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _import_ray() -> Any:
    # Must be set before Ray starts: it binds the embedded node to 127.0.0.1.
    os.environ[_LOOPBACK_ENV] = "0"
    import ray

    return ray


def _restore_env(name: str, value: str | None) -> None:
    """Undo our setting so that later ``ray start`` calls from this process see the user's."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a HOST:PORT nobody listens on: Ray itself retries for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", ray:// client addresses and the like: let Ray resolve them
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UsageError(
            f"cannot connect to the Ray cluster at {address}: {exc.strerror or exc} "
            "(is `ray start --head` running there?)"
        ) from None


def connect(address: str | None, num_cpus: int | None) -> tuple[Any, bool]:
    """Start or join Ray; returns the module and whether this call started it."""
    ray = _import_ray()
    if ray.is_initialized():
        return ray, False
    common: dict[str, Any] = {
        "log_to_driver": False,
        "logging_level": logging.ERROR,
        "include_dashboard": False,
    }
    try:
        if address:
            _check_reachable(address)
            ray.init(address=address, **common)
        else:
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, **common)
    except ConnectionError as exc:
        raise UsageError(f"cannot connect to the Ray cluster at {address}: {exc}") from exc
    except Exception as exc:
        if type(exc).__name__ == "AuthenticationError":
            raise UsageError(
                f"Ray cluster at {address} refused the connection: {exc} "
                "(set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH to the cluster's token)"
            ) from exc
        raise
    return ray, True


def run_ray(
    jobs: list[Job],
    params: ReplayParams,
    *,
    chunk_rows: int,
    on_result: OnResult,
    on_progress: OnProgress | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
) -> None:
    """Replay every (run, policy) as Ray tasks, reporting each policy when its chunks are in."""
    saved = os.environ.get(_LOOPBACK_ENV)
    ray, started = connect(address, num_cpus)
    try:
        task = ray.remote(num_cpus=1, max_retries=2)(replay_rows)
        pending: dict[Any, tuple[str, Policy, int, int]] = {}
        parts: dict[tuple[str, Policy], list[ChunkOutput | None]] = {}
        for job in jobs:
            if not job.policies:
                continue
            ref = ray.put(job.prepared)
            bounds = chunk_bounds(job.rows, chunk_rows)
            for policy in job.policies:
                parts[(job.run, policy)] = [None] * len(bounds)
                for k, (lo, hi) in enumerate(bounds):
                    pending[task.remote(ref, policy, params, lo, hi)] = (
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
        if started:
            ray.shutdown()
        _restore_env(_LOOPBACK_ENV, saved)
