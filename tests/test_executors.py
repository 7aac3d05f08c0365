"""Executors: in-process and Ray give bit-identical replays, chunked or not."""

from __future__ import annotations

import numpy as np
import pytest
from tracegen import synthetic_run

from dsim.errors import UsageError
from dsim.execute import (
    AUTO_RAY_MIN_CPUS,
    AUTO_RAY_MIN_RUNS,
    Job,
    PolicyResult,
    choose_executor,
    execute,
)
from dsim.execute.units import chunk_bounds
from dsim.replay.arrays import build_iteration_arrays
from dsim.replay.models.per_iteration import ReplayParams, prepare, replay
from dsim.replay.policies import KNOWN

ALL_KNOWN = tuple((f, s) for f in KNOWN for s in KNOWN)


def _jobs(seed: int = 0, iterations: int = 40) -> tuple[list[Job], dict]:
    runs = [synthetic_run(f"r{k}", iterations=iterations, seed=seed + k) for k in range(2)]
    arrays = {r.name: build_iteration_arrays(r.fetch, r.train) for r in runs}
    jobs = [Job(name, prepare(a), ALL_KNOWN) for name, a in arrays.items()]
    return jobs, arrays


def _collect(jobs: list[Job], **kwargs) -> dict:
    results: dict = {}

    def on_result(result: PolicyResult) -> None:
        assert (result.run, result.policy) not in results
        results[(result.run, result.policy)] = result

    execute(jobs, ReplayParams(), on_result=on_result, **kwargs)
    return results


def _assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        ra, rb = a[key], b[key]
        assert ra.metrics.keys() == rb.metrics.keys()
        for name in ra.metrics:
            assert ra.metrics[name].tobytes() == rb.metrics[name].tobytes(), (key, name)
        assert ra.gpu_stall.shape == rb.gpu_stall.shape
        assert ra.gpu_stall.tobytes() == rb.gpu_stall.tobytes(), key


def test_chunk_bounds_cover_all_rows() -> None:
    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_bounds(8, 4) == [(0, 4), (4, 8)]
    assert chunk_bounds(0, 4) == [(0, 0)]
    with pytest.raises(ValueError):
        chunk_bounds(5, 0)


def test_local_matches_kernel_on_whole_run() -> None:
    jobs, arrays = _jobs()
    results = _collect(jobs, executor="local")
    assert len(results) == 2 * len(ALL_KNOWN)
    for (run, policy), result in results.items():
        direct = replay(arrays[run], policy, ReplayParams())
        for name, values in direct.metrics().items():
            assert np.array_equal(values, result.metrics[name]), (run, policy, name)
        assert np.array_equal(direct.gpu_stall_s, result.gpu_stall)


@pytest.mark.parametrize("chunk_rows", [1, 7, 33])
def test_chunked_equals_unchunked(chunk_rows: int) -> None:
    jobs, _ = _jobs(seed=3)
    whole = _collect(jobs, executor="local", chunk_rows=10**6)
    chunked = _collect(jobs, executor="local", chunk_rows=chunk_rows)
    _assert_identical(whole, chunked)


def test_progress_counts_every_row() -> None:
    jobs, _ = _jobs()
    seen: list[int] = []
    _collect(jobs, executor="local", chunk_rows=11, on_progress=seen.append)
    assert sum(seen) == sum(job.rows * len(job.policies) for job in jobs)
    assert max(seen) <= 11


def test_auto_rule_ray_only_for_a_cluster_or_many_runs_on_many_cores() -> None:
    """SPEC §8: a run is one task, so Ray can only win by running runs side by side."""
    many, cores = AUTO_RAY_MIN_RUNS, AUTO_RAY_MIN_CPUS
    assert choose_executor("auto", 2, None, 64) == "local"
    assert choose_executor("auto", 1, None, 1024) == "local"  # one big run: never Ray
    assert choose_executor("auto", many - 1, None, 64) == "local"
    assert choose_executor("auto", many, None, cores - 1) == "local"
    assert choose_executor("auto", many, None, cores) == "ray"
    assert choose_executor("auto", 1, "127.0.0.1:6379") == "ray"  # a cluster was named
    assert choose_executor("local", many, "127.0.0.1:6379", 64) == "local"
    assert choose_executor("ray", 1, None, 1) == "ray"


@pytest.mark.ray
def test_ray_matches_local_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real embedded Ray; chunked on Ray vs unchunked in-process."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    import ray

    jobs, _ = _jobs(seed=5, iterations=60)
    local = _collect(jobs, executor="local")
    on_ray = _collect(jobs, executor="ray", num_cpus=2, chunk_rows=25)
    _assert_identical(local, on_ray)
    assert not ray.is_initialized()  # the embedded instance it started is shut down


@pytest.mark.ray
def test_unreachable_cluster_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    jobs, _ = _jobs()
    with pytest.raises(UsageError, match="cannot connect"):
        _collect(jobs[:1], executor="auto")
