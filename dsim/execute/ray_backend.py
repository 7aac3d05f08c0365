"""Execution on Ray: an embedded single-node instance, or an existing cluster.

``dsim run`` sends each run as one task (``run_ray_tasks``): the task reads
the run's trace, replays and writes on the node that runs it, and returns a
small report; the driver only plans and gathers. ``run_ray`` (the Python
``execute`` of prepared jobs) puts each run's prepared arrays in the object
store once (``ray.put``) and runs one task per policy and chunk of
iterations, reading them zero-copy on the node. Either way tasks run the
same functions as the in-process executor, so results are bit-identical.

Starting or joining Ray, with its checks and messages, is
``dsim.execute.ray_connect``: embedded mode binds one node to loopback,
without a dashboard and without log forwarding, watched so that its processes
die with dsim, and shut down afterwards. A cluster given by
``--ray-address`` (or ``RAY_ADDRESS``) is joined and left running.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from dsim.errors import DsimError
from dsim.execute.address import FROM_SETTINGS
from dsim.execute.ray_connect import connect, debugging, disconnect, joined_head
from dsim.execute.ray_watch import POLL_S, ClusterLost, HeadWatch, native_stderr_captured
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

__all__ = ["connect", "disconnect", "run_ray", "run_ray_tasks"]

T = TypeVar("T")
R = TypeVar("R")


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
    total = sum(len(job.policies) for job in jobs)

    def body(ray: Any, watch: HeadWatch | None, finished: Callable[[], None]) -> None:
        def done(result: Any) -> None:
            finished()
            on_result(result)

        _submit_and_collect(ray, jobs, params, chunk_rows, done, on_progress, watch)

    _on_ray(address, num_cpus, source, total, body)


def run_ray_tasks(
    function: Callable[[T], R],
    tasks: Sequence[T],
    *,
    on_done: Callable[[int, R], None],
    address: str | None = None,
    num_cpus: int | None = None,
    source: str = FROM_SETTINGS,
) -> None:
    """``function(task)`` for every task, each as one Ray task of 1 CPU on whichever node
    has one free; ``on_done(index, value)`` in the order they finish. A ``DsimError``
    raised in a task is raised here as itself (one line, its exit code); the tasks still
    running are then cancelled. ``function`` must be importable on every node."""

    def body(ray: Any, watch: HeadWatch | None, finished: Callable[[], None]) -> None:
        remote = ray.remote(num_cpus=1, max_retries=2)(function)
        pending = {remote.remote(task): k for k, task in enumerate(tasks)}
        total = len(tasks)
        try:
            while pending:
                timeout = None if watch is None else POLL_S
                done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
                if not done and watch is not None:
                    watch.check(total - len(pending), total, "run")
                for ref in done:
                    k = pending.pop(ref)
                    value = _task_value(ray, ref, watch, total - len(pending) - 1, total)
                    finished()
                    on_done(k, value)
        finally:
            for ref in pending:  # after an error: no task goes on writing
                with contextlib.suppress(Exception):
                    ray.cancel(ref)

    _on_ray(address, num_cpus, source, len(tasks), body, unit="run")


def _task_value(
    ray: Any, ref: Any, watch: HeadWatch | None, finished: int, total: int, unit: str = "run"
) -> Any:
    """A finished task's value; its ``DsimError`` raised as itself, not wrapped by Ray."""
    try:
        return _get(ray, ref, watch, finished, total, unit)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, DsimError):
            raise cause from None
        raise


def _on_ray(
    address: str | None,
    num_cpus: int | None,
    source: str,
    total: int,
    body: Callable[[Any, HeadWatch | None, Callable[[], None]], None],
    unit: str = "replay",
) -> None:
    """Start or join Ray, run ``body(ray, watch, finished)``, and leave Ray as found; a
    joined cluster's head is watched (``finished()`` counts the units done for its message)."""
    ray, started = connect(address, num_cpus, source=source)
    head = joined_head() if started else None
    watch = HeadWatch(*head) if head is not None else None
    lost = False
    count = 0

    def finished() -> None:
        nonlocal count
        count += 1

    captured = io.StringIO()  # (bound even if a signal cuts the capture's own set-up short)
    try:
        with native_stderr_captured(watch is not None and not debugging()) as captured:
            try:
                body(ray, watch, finished)
            except ClusterLost:
                lost = True
                raise
            except Exception as exc:  # a Ray error because the head is gone: say that instead
                if watch is None or watch.alive():
                    raise
                lost = True
                raise watch.lost(count, total, unit) from exc
            finally:
                disconnect(ray, started, lost=lost)
    except BaseException as exc:
        if not lost and not isinstance(exc, KeyboardInterrupt) and captured.getvalue().strip():
            sys.stderr.write(captured.getvalue())  # Ray's own words, for what dsim cannot explain
        raise


def _submit_and_collect(
    ray: Any,
    jobs: list[Job],
    params: ReplayParams,
    chunk_rows: int,
    on_result: OnResult,
    on_progress: OnProgress | None,
    watch: HeadWatch | None,
) -> None:
    """Submit every chunk as a task; report each policy when its chunks are in.

    With a ``watch`` (a joined cluster), a wait lasts at most ``POLL_S`` between checks
    that the head is still there.
    """
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
    total = len(parts)
    while pending:
        if watch is None:
            done, _ = ray.wait(list(pending), num_returns=1)
        else:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            if not done:
                watch.check(total - len(parts), total)
                continue
        for ref in done:
            run, policy, k, rows = pending.pop(ref)
            slots = parts[(run, policy)]
            slots[k] = _get(ray, ref, watch, total - len(parts), total)
            if on_progress is not None:
                on_progress(rows)
            if all(s is not None for s in slots):
                del parts[(run, policy)]
                on_result(join_chunks(run, policy, [s for s in slots if s is not None]))


def _get(
    ray: Any,
    ref: Any,
    watch: HeadWatch | None,
    finished: int,
    total: int,
    unit: str = "replay",
) -> Any:
    """``ray.get`` of a finished task; on a joined cluster, in waits of ``POLL_S`` between
    checks of the head (a result held by a node that died may never come)."""
    if watch is None:
        return ray.get(ref)
    while True:
        try:
            return ray.get(ref, timeout=POLL_S)
        except ray.exceptions.GetTimeoutError:
            watch.check(finished, total, unit)
