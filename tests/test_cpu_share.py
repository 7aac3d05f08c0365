"""The CPU-aware pipeline model (docs/SPEC.md §4.2, CPU contention): curve, solver, replays."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, run_dsim
from cpulogs import write_cpu_logs

from dsim.analysis.verdict import cpu_note
from dsim.app.run import logged_loader
from dsim.replay.arrays import build_iteration_arrays
from dsim.replay.models import cpu_share
from dsim.replay.models.pipeline import (
    PipelineModel,
    cpu_assumption,
    measured_period,
    solve_contention,
    worker_outside_cpu,
)
from dsim.replay.params import ReplayParams
from dsim.sources.rawlog.discover import discover_runs
from dsim.sources.rawlog.parse import parse_run

BASE = ("actual", "actual")


def test_curve_rises_to_infinity_and_passes_through_the_measured_point() -> None:
    a = cpu_share.coefficient(0.6, 1.3)
    assert cpu_share.stretch(0.6, a) == pytest.approx(1.3)
    values = [cpu_share.stretch(u, a) for u in np.linspace(0, 0.999, 50)]
    assert values[0] == 1.0 and all(np.diff(values) > 0)
    assert cpu_share.stretch(1.0, a) == math.inf and cpu_share.stretch(1.5, a) == math.inf
    assert cpu_share.coefficient(0.5, None) == cpu_share.PS_COEFFICIENT  # no run-queue waits
    assert cpu_share.coefficient(0.0, 1.2) == 0.0


@pytest.mark.parametrize("t0", [0.001, 0.02, 0.05, 0.2])
def test_solver_finds_the_fixed_point_and_respects_the_core_bound(t0: float) -> None:
    """T(ρ) = t0 + c ρ: an iteration of fixed waiting plus CPU work stretched by ρ."""
    demand, cores, a = 0.08, 2, 0.5

    def t_of(rho: float) -> float:
        return t0 + 0.03 * rho

    sol = cpu_share.solve(t_of, demand, cores, a)
    assert sol.steps <= 2 * cpu_share.MAX_STEPS
    u = demand / (cores * t_of(sol.rho))
    assert sol.rho == pytest.approx(cpu_share.stretch(u, a), rel=1e-4)
    assert sol.iteration_s > demand / cores  # never faster than the cores allow
    assert sol.demand < 1.0


@pytest.mark.parametrize("t0", [0.0, 0.001, 0.02, 0.2])
@pytest.mark.parametrize("cap", [0.7, 1.0])
def test_solver_returns_the_root_within_its_tolerance_in_few_replays(t0: float, cap: float) -> None:
    """Each step is a replay of the whole run: the interpolating search reaches the root
    bisection would (h ≥ 0 at the ρ returned, within ``rel_tol`` above the root) in a
    third of bisection's steps or fewer (21 here before). T has a kink, as a replay's
    max over ranks gives one."""
    demand, cores, a = 0.08, 2, 0.5

    def t_of(rho: float) -> float:
        return t0 + 0.03 * rho + 0.01 * max(rho - 1.5, 0.0)

    def h(rho: float) -> float:
        u = demand / (cores * t_of(rho))
        return rho - (math.inf if u >= cap else cpu_share.stretch(u, a))

    sol = cpu_share.solve(t_of, demand, cores, a, u_cap=cap)
    lo, hi = 1.0, 64.0  # the reference: bisection to the last bit
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if h(mid) >= 0.0 else (mid, hi)
    assert h(sol.rho) >= 0.0
    assert hi <= sol.rho <= hi * (1 + 1e-6)
    assert sol.steps <= 12, sol.steps


def test_solver_is_monotone_in_the_what_if() -> None:
    """A faster what-if (smaller T at every ρ) never gets a smaller stretch."""
    rhos = [
        cpu_share.solve(lambda r, t0=t0: t0 + 0.01 * r, 0.05, 2, 0.3).rho
        for t0 in (0.2, 0.1, 0.05, 0.02, 0.0)
    ]
    assert all(np.diff(rhos) >= -1e-9)


def test_wall_cap_maps_the_iteration_time_to_the_wall_clock() -> None:
    """u_cap = P_m / T_m, never at or below the measured demand, never above 1."""
    assert cpu_share.wall_cap(0.045, 0.052, 0.80) == pytest.approx(0.045 / 0.052)
    assert cpu_share.wall_cap(0.040, 0.052, 0.85) == pytest.approx(0.85 + cpu_share.CAP_MARGIN)
    assert cpu_share.wall_cap(0.060, 0.052, 0.50) == 1.0  # a period longer than T
    assert cpu_share.wall_cap(0.0, 0.052, 0.50) == 1.0  # no period measured
    assert cpu_share.wall_cap(0.045, 0.0, 0.50) == 1.0


@pytest.mark.parametrize("cap", [0.5, 0.6, 0.8, 0.95, 1.0])
def test_the_solver_stops_where_the_cores_are_busy_on_the_wall_clock(cap: float) -> None:
    """Below the pole u_cap the fixed point is the curve's; past it, T = C / (K u_cap)."""
    demand, cores, a = 0.08, 2, 0.5

    def t_of(rho: float) -> float:
        return 0.001 + 0.03 * rho

    free = cpu_share.solve(t_of, demand, cores, a)
    capped = cpu_share.solve(t_of, demand, cores, a, u_cap=cap)
    assert capped.busy == pytest.approx(capped.demand / cap)
    if free.demand < cap:  # the same root, each search within its tolerance of it
        assert capped.rho == pytest.approx(free.rho, rel=2e-6)
        assert capped.iteration_s == pytest.approx(free.iteration_s, rel=2e-6)
    else:  # the curve alone went past the cores' wall-clock bound
        assert capped.rho > free.rho
        assert capped.iteration_s >= demand / (cores * cap)
        assert capped.iteration_s == pytest.approx(demand / (cores * cap), rel=1e-5)
        assert capped.busy == pytest.approx(1.0, rel=1e-5)
    assert 0.5 < free.demand < 0.8  # both branches are taken over the parameters


def _prepared(tmp_path: Path, **kwargs):
    logs = write_cpu_logs(tmp_path / "logs", **kwargs)
    (source,) = discover_runs([logs], name="run")
    tables = parse_run(source, strict=True).tables
    arrays = build_iteration_arrays(tables.fetch, tables.train)
    arrays = replace(arrays, loader=logged_loader(tables.info))
    model = PipelineModel()
    return model, arrays, model.prepare(arrays, ReplayParams())


def _mean(model, prepared, workers: int, policy=BASE, skip: int = 8, tail: int = 0) -> float:
    """Mean replayed iteration time, the first ``skip`` and last ``tail`` iterations left out."""
    params = ReplayParams(workers=workers, prefetch_factor=2)
    times = model.replay(prepared, policy, params).iteration_s
    return float(np.mean(times[skip : len(times) - tail]))


def test_cpu_bound_loader_gains_almost_nothing_from_more_workers(tmp_path: Path) -> None:
    """4 ranks on 2 cores, fetches CPU work under contention: the cores are the limit.

    Judged on the body: the last P·W iterations drain batches built ahead,
    faster than the cores' bound (``test_the_drain_at_a_segment_end_runs_faster``).
    """
    model, _, prepared = _prepared(tmp_path / "cpu")
    assert prepared.cpu is not None
    measured = _mean(model, prepared, 1, tail=2)
    bound = prepared.cpu.demand_s / prepared.cpu.load.cores
    for workers in (2, 4):
        predicted = _mean(model, prepared, workers, tail=2 * workers)
        assert predicted > 0.95 * measured  # (almost) no gain
        assert predicted > 0.97 * bound
    # The same job without CPU times: fetch durations independent of load, a large gain.
    free_model, free_arrays, free = _prepared(tmp_path / "free", cpu_s=None, cores=None)
    assert free.cpu is None and cpu_assumption(free_arrays) is None
    assert _mean(free_model, free, 2) < 0.6 * _mean(free_model, free, 1)


def test_identity_and_a_cpu_free_loader_are_unchanged(tmp_path: Path) -> None:
    model, arrays, prepared = _prepared(tmp_path / "cpu")
    measured = ReplayParams(workers=1, prefetch_factor=2)
    got = model.replay(prepared, BASE, measured).iteration_s
    assert (
        got.tobytes()
        == model.replay(replace(prepared, cpu=None), BASE, measured).iteration_s.tobytes()
    )
    assert np.allclose(got, arrays.iteration_time.max(axis=1))  # the measured run
    # At the measured settings the solver lands on the measured stretch.
    sol = solve_contention(prepared, ("min", "actual"), None, None)
    assert sol.rho == pytest.approx(prepared.cpu.rho_measured, rel=1e-3)
    # Loading that costs (almost) no CPU: more workers help as without the model.
    model, _, light = _prepared(tmp_path / "light", cpu_s=0.0005, runq_s=0.0, train_cpu_s=0.0)
    assert light.cpu is not None
    assert _mean(model, light, 2) < 0.6 * _mean(model, light, 1)


def test_the_wall_period_caps_a_what_if_that_adds_workers(tmp_path: Path) -> None:
    """The measured run's wall period sets the pole; a 4-worker what-if stops at it."""
    model, _, prepared = _prepared(tmp_path / "cpu")
    cpu = prepared.cpu
    assert cpu is not None
    # one worker building 50 ms batches back to back: the iterations follow each other
    # at 50 ms plus the ranks' skew (cpulogs)
    period = measured_period(prepared)
    assert period == pytest.approx(0.050, rel=0.01)
    u_m = cpu.demand_s / (cpu.load.cores * cpu.measured_iteration_s)
    assert cpu.u_cap == cpu_share.wall_cap(period, cpu.measured_iteration_s, u_m)
    free = solve_contention(replace(prepared, cpu=replace(cpu, u_cap=1.0)), BASE, 4, 2)
    cap = 0.98 * free.demand  # a pole below where the curve alone lands
    capped = replace(prepared, cpu=replace(cpu, u_cap=cap))
    solved = solve_contention(capped, BASE, 4, 2)
    bound = cpu.demand_s / (cpu.load.cores * cap)
    assert solved.iteration_s == pytest.approx(bound, rel=1e-4) and solved.rho > free.rho
    # and the replay is the one at that stretch: slower than the curve alone gives
    assert _mean(model, capped, 4, tail=8) > _mean(
        model, replace(prepared, cpu=replace(cpu, u_cap=1.0)), 4, tail=8
    )


def test_each_batch_keeps_its_own_share_of_the_wait_for_a_core() -> None:
    """f + (c + q) Δ_w / ρ_w,m: over the run the fetches gain what f + c Δ_w gives them, but
    a batch built at a quieter moment (smaller q / c) gains less (SPEC §4.2)."""
    from dsim.replay.models.pipeline import CpuState, PreparedPipeline, _stretched

    n, g = 4, 2
    fetch_cpu = np.full((n, g), 0.025)
    fetch_runq = np.array([[0.100, 0.050], [0.050, 0.100], [0.075, 0.075], [0.010, 0.140]])
    train_cpu, train_runq = np.full((n, g), 0.005), np.full((n, g), 0.026)
    load = cpu_share.CpuLoad(fetch_cpu, fetch_runq, train_cpu, train_runq, 2, 2, False, True)
    w, _ = cpu_share.class_stretches(load)
    assert w == pytest.approx(4.0)  # 1 + 0.075 / 0.025
    inputs, calibration = _eight_worker_run(n, g)
    rho_m = cpu_share.measured_stretch(load)
    state = CpuState(load, rho_m, 1.0, 0.5, 1.0, fetch_rho=w)
    for rho in (1.5, rho_m, 6.0):
        delta = cpu_share.class_delta(rho, rho_m, w)
        got = _stretched(PreparedPipeline(inputs, calibration, state), rho).inputs.fetch
        added = got - inputs.fetch
        np.testing.assert_allclose(added, (fetch_cpu + fetch_runq) * delta / w)
        assert added.sum() == pytest.approx((fetch_cpu * delta).sum())  # the run's total
        if delta > 0:  # the batch that waited least gains least
            assert added[3, 0] == added.min() and added[3, 1] == added.max()
    # without the class stretch, or without run-queue waits: f + c Δ_w as before
    pooled = _stretched(PreparedPipeline(inputs, calibration, replace(state, fetch_rho=None)), 6.0)
    np.testing.assert_allclose(pooled.inputs.fetch, inputs.fetch + fetch_cpu * (6.0 - rho_m))


def test_unknown_ranks_per_node_are_assumed_on_one_node(tmp_path: Path) -> None:
    _, arrays, _ = _prepared(tmp_path, local_world_size=None)
    cpu = cpu_assumption(arrays)
    assert cpu is not None and cpu["ranks_per_node"] == 4 and cpu["ranks_per_node_assumed"]
    assert cpu["nodes"] == 1


def test_cpu_times_beyond_the_logged_cores_replay_independent_of_load(tmp_path: Path) -> None:
    """4 ranks logging 96 ms of CPU per 50 ms iteration on 1 logged core: no node can run
    that, so the cores or ranks logged are wrong, the curve cannot be calibrated (clamped
    at its pole it made every what-if ~2x slower) and the replay is the load-independent
    one, saying why (SPEC §4.2, "Logged CPU beyond the cores")."""
    from dsim.replay.models.pipeline import CPU_OVERCOMMITTED, logged_busy, logged_cpu_load

    model, arrays, prepared = _prepared(tmp_path / "one", cores=1)
    busy = logged_busy(arrays, logged_cpu_load(arrays))
    assert busy == pytest.approx(0.096 / 0.0505, rel=0.03) and busy > CPU_OVERCOMMITTED
    assert prepared.cpu is None
    cpu = cpu_assumption(arrays)
    assert cpu["model"] == "load-independent" and cpu["cpu_over_cores"] == round(busy, 3)
    assert cpu["cores"] == 1 and cpu["ranks_per_node"] == 4
    free_model, _, free = _prepared(tmp_path / "free", cpu_s=None, cores=None)
    for workers in (1, 2, 4):
        assert _mean(model, prepared, workers) == _mean(free_model, free, workers)
    # 2 cores: the same logs are what the cores ran (busy ~0.95), and CPU-aware
    _, arrays, prepared = _prepared(tmp_path / "two", cores=2)
    assert prepared.cpu is not None and cpu_assumption(arrays)["model"] == "cpu-aware"
    assert logged_busy(arrays, logged_cpu_load(arrays)) < 1.0


def test_parse_and_run_a_cpu_bound_log_end_to_end(tmp_path: Path) -> None:
    write_cpu_logs(tmp_path / "logs" / "cpurun")
    parsed = run_dsim("parse", "logs/cpurun", "--strict", "-q", cwd=tmp_path)
    assert parsed.returncode == 0, parsed.stderr
    proc = run_dsim(
        "run", "cpurun", "--model", "pipeline", "--workers", "2", "-p", "actual/actual",
        "-p", "min/actual", "--executor", "local", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "CPU-aware: 2 cores, 4 ranks per node" in said, said
    info = json.loads((tmp_path / "results" / "cpurun@pipeline-w2-p2" / "result.json").read_text())
    assert info["loader"]["cpu"]["cores"] == 2 and info["loader"]["measured"]["cores"] == 2
    table = pd.read_csv(tmp_path / "results" / "summary.csv")
    what_if = table[table["loader_changed"]]
    assert (what_if["speedup"] < 1.1).all()  # the CPU-free model would say ~2x
    # The same logs on 1 logged core: more CPU than it can run; said, and in the key.
    write_cpu_logs(tmp_path / "logs" / "onecore", cores=1)
    assert run_dsim("parse", "logs/onecore", "-q", cwd=tmp_path).returncode == 0
    proc = run_dsim(
        "run", "onecore", "--model", "pipeline", "--workers", "2", "--executor", "local",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "the logged CPU times are more than the logged cores can run" in said, said
    assert "the logs give each node 1.9" in said and "1 logged core can run" in said, said
    info = json.loads((tmp_path / "results" / "onecore@pipeline-w2-p2" / "result.json").read_text())
    assert info["loader"]["cpu"]["model"] == "load-independent"
    assert info["input"]["cpu"] == info["loader"]["cpu"]  # a re-parse's cores: new keys


def test_validation_predictions_use_the_cpu_model(tmp_path: Path) -> None:
    from dsim.model.tables import write_run
    from validation.predict import predict_pipeline

    logs = write_cpu_logs(tmp_path / "logs")
    (source,) = discover_runs([logs], name="run")
    write_run(parse_run(source, strict=True).tables, tmp_path / "run")
    measured = predict_pipeline(tmp_path / "run", BASE, None, None)
    two = predict_pipeline(tmp_path / "run", BASE, 2, None)
    assert two["iteration_ms"] > 0.9 * measured["iteration_ms"]  # CPU-bound: no large gain


def test_fetch_alignment_moves_the_cpu_work_and_the_demand_with_it(tmp_path: Path) -> None:
    """Aligned loaders that do less CPU work contend less (mixed regime: +41.7 % before).

    And each rank keeps its own run-queue share of the batch (SPEC §4.2): the
    mixed regime's aligned re-runs had 26-89 % effective delay, which a copy of
    the fastest rank's wall time to every rank predicted as ~0.
    """
    from dsim.replay.models.pipeline import aligned_cpu, kernel_policy

    model, _, prepared = _prepared(tmp_path / "cpu")
    assert prepared.cpu is not None
    fetch, work = prepared.inputs.fetch, prepared.cpu.load.fetch_cpu
    lean = prepared.cpu.load.fetch_cpu.copy()
    lean[:, 0] *= 0.25  # rank 0's batches need a quarter of the CPU work ...
    fast = fetch.copy()
    fast[:, 0] *= 0.5  # ... and are its fastest fetches
    skewed = replace(
        prepared,
        inputs=replace(prepared.inputs, fetch=fast),
        cpu=replace(
            prepared.cpu,
            load=replace(prepared.cpu.load, fetch_cpu=lean),
            demand_s=cpu_share.node_demand(replace(prepared.cpu.load, fetch_cpu=lean)),
        ),
    )
    aligned = aligned_cpu(skewed, "min")
    assert aligned.cpu is not None
    np.testing.assert_array_equal(aligned.cpu.load.fetch_cpu, np.repeat(lean[:, :1], 4, axis=1))
    assert aligned.cpu.demand_s < skewed.cpu.demand_s
    mean = aligned_cpu(prepared, "avg").cpu
    np.testing.assert_allclose(mean.load.fetch_cpu, np.repeat(work.mean(1)[:, None], 4, axis=1))
    assert aligned_cpu(prepared, "actual") is prepared
    # Each rank keeps its own contention: the fastest rank's work, the rank's own q/c.
    load = skewed.cpu.load
    rows = np.arange(fast.shape[0])
    rank = np.argmin(fast, axis=1)
    c, q = load.fetch_cpu, load.fetch_runq
    rest = np.maximum(fast - c - q, 0.0)[rows, rank]
    share = np.divide(q, c, out=np.zeros_like(q), where=c > 0)
    want = rest[:, None] + c[rows, rank][:, None] * (1.0 + share)
    np.testing.assert_allclose(aligned.inputs.fetch, want, rtol=1e-12)
    # The fastest rank's own fetch is unchanged where its wall time covers its c + q.
    own = aligned_cpu(prepared, "min")
    f0, l0 = prepared.inputs.fetch, prepared.cpu.load
    r0 = np.argmin(f0, axis=1)
    whole = f0[rows, r0] >= l0.fetch_cpu[rows, r0] + l0.fetch_runq[rows, r0]
    assert whole.any()
    np.testing.assert_allclose(own.inputs.fetch[rows, r0][whole], f0[rows, r0][whole], rtol=1e-9)
    assert kernel_policy(aligned, ("min", "max")) == ("actual", "max")
    assert kernel_policy(skewed, ("min", "max")) == ("min", "max")
    # Less contention: the aligned replay is faster with the moved demand than without it.
    assert _mean(model, skewed, 1, ("min", "actual")) <= _mean(model, skewed, 1)


def test_overlap_rate_integrates_the_intervals_over_each_span() -> None:
    starts, ends = np.array([0.0, 1.0]), np.array([2.0, 4.0])
    rates = np.array([0.5, 1.0])
    # [0, 1): 0.5; [1, 2): 1.5; [2, 4): 1.0; after 4: 0
    got = cpu_share.overlap_rate(
        starts,
        ends,
        rates,
        np.array([0.0, 1.0, 0.0, 4.0, 3.0]),
        np.array([1.0, 2.0, 4.0, 5.0, 3.0]),
    )
    np.testing.assert_allclose(got[:4], [0.5, 1.5, (0.5 + 1.5 + 2.0) / 4, 0.0])
    assert np.isnan(got[4])  # a span of no length
    # No interval at all: no demand, not NaN.
    empty = cpu_share.overlap_rate(
        np.array([]), np.array([]), np.array([]), np.zeros(1), np.ones(1)
    )
    np.testing.assert_array_equal(empty, [0.0])


def _overlap_reference(starts, ends, rates, span_lo, span_hi) -> np.ndarray:
    """Each span's mean demand by its definition: Σ_j rate_j |[s_j, e_j) ∩ [lo, hi)| / (hi − lo)
    over the intervals that are finite, not empty and of a finite rate."""
    out = []
    for lo, hi in zip(span_lo, span_hi, strict=True):
        if not hi > lo:
            out.append(np.nan)
            continue
        total = 0.0
        for s, e, r in zip(starts, ends, rates, strict=True):
            if np.isfinite(s) and np.isfinite(e) and e > s and np.isfinite(r):
                total += r * max(0.0, min(e, hi) - max(s, lo))
        out.append(total / (hi - lo))
    return np.array(out)


def test_overlap_rate_equals_its_definition_on_random_intervals() -> None:
    """The sweep (a sort, two cumulative sums, in place) against the per-span sum, with
    ties, empty and reversed intervals, NaN times and infinite rates, flat or [N, G] input."""
    rng = np.random.default_rng(7)
    for trial in range(300):
        n, m = int(rng.integers(0, 40)), int(rng.integers(1, 12))
        starts = rng.uniform(0.0, 10.0, n)
        ends = starts + rng.exponential(1.0, n) * (rng.random(n) > 0.1)
        rates = rng.exponential(1.0, n)
        if trial % 3 == 0 and n >= 3:
            starts[0], rates[1], ends[2] = np.nan, np.inf, starts[2] - 1.0
        if trial % 4 == 0:
            starts, ends = np.round(starts, 1), np.round(ends, 1)  # shared end points
        span_lo = rng.uniform(-1.0, 11.0, m)
        span_hi = span_lo + rng.uniform(-0.5, 3.0, m)
        shape = (-1, 2) if n % 2 == 0 and n else (-1,)
        got = cpu_share.overlap_rate(
            starts.reshape(shape), ends.reshape(shape), rates.reshape(shape), span_lo, span_hi
        )
        want = _overlap_reference(starts, ends, rates, span_lo, span_hi)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=f"trial {trial}")


def _rows_of_fetches(rng, n: int, g: int, window: int, gaps: bool) -> tuple[np.ndarray, ...]:
    """[n, g] fetch intervals as a replay lays them out: row k's fetches start at most
    ``window`` rows before k's span and end within it; spans of consecutive rows."""
    edges = np.cumsum(rng.exponential(0.02, n + 1))
    span_lo, span_hi = edges[:-1].copy(), edges[1:].copy()
    back = rng.integers(0, window + 1, (n, g))
    starts = edges[np.maximum(np.arange(n)[:, None] - back, 0)] + rng.uniform(0, 0.01, (n, g))
    ends = np.minimum(starts + rng.exponential(0.03, (n, g)), span_hi[:, None])
    rates = rng.uniform(0.0, 1.0, (n, g))
    if gaps:
        starts[rng.random((n, g)) < 0.05] = np.nan
        rates[rng.random((n, g)) < 0.02] = np.inf
        ends[rng.random((n, g)) < 0.05] -= 1.0  # reversed
        span_hi[rng.random(n) < 0.05] = span_lo[0] - 1.0  # a span of negative length
        starts = np.round(starts, 2)  # shared end points
    return starts, ends, rates, span_lo, span_hi


@pytest.mark.parametrize("path", ["banded", "swept"])
def test_the_banded_and_the_swept_demand_are_the_definitions_sum(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row-structured fetches, as a replay gives them, summed over each span's band of rows
    (``overlap_kernel``) or swept: both the per-span definition, with NaN, infinite rates,
    reversed intervals and spans of no length; the bands stay short on such input."""
    from dsim.replay.models import overlap_kernel

    monkeypatch.setattr(cpu_share, "BANDED_MAX_WORK", 10**9 if path == "banded" else -1)
    rng = np.random.default_rng(11)
    for trial in range(60):
        n, g = int(rng.integers(1, 60)), int(rng.integers(1, 5))
        args = _rows_of_fetches(rng, n, g, window=int(rng.integers(0, 6)), gaps=trial % 2 == 1)
        got = cpu_share.overlap_rate(*args)
        want = _overlap_reference(*(a.ravel() for a in args[:3]), *args[3:])
        if path == "banded":  # the definition's terms in its order: the same bits
            np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}")
        else:  # two integrals over the whole run subtracted
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=f"trial {trial}")
    starts, ends, rates, lo, hi = _rows_of_fetches(rng, 2000, 4, window=4, gaps=False)
    first, stop = overlap_kernel.row_bands(starts, ends, rates, lo, hi)
    assert (stop - first).max() <= 8  # a prefetch window and the rows the span reaches


def test_each_iteration_span_is_the_nodes_earliest_and_latest_end() -> None:
    """``node_spans`` is the NumPy min/max over the node's ranks, NaN ends included."""
    from dsim.replay.models import overlap_kernel

    rng = np.random.default_rng(5)
    end = np.cumsum(rng.uniform(0.0, 0.1, (50, 3)), axis=0)
    end[7, 1] = np.nan
    first = np.zeros(50, dtype=bool)
    first[[0, 20]] = True
    iteration_s = rng.uniform(0.01, 0.05, 50)
    lo, hi = overlap_kernel.node_spans(end, first, iteration_s)
    want_hi = end.max(axis=1)
    want_lo = np.r_[np.nan, end[:-1].min(axis=1)]
    want_lo[first] = want_hi[first] - iteration_s[first]
    np.testing.assert_array_equal(hi, want_hi)
    np.testing.assert_array_equal(lo, want_lo)


def test_each_segment_s_demand_counts_only_its_own_fetches() -> None:
    """Segments replay from their own measured starts, so their replayed timelines may
    overlap; each iteration's demand counts the fetches of its own segment only (two
    copies of one segment, both from time 0, get the one segment's stretches)."""
    from dataclasses import fields

    from dsim.replay.models.pipeline import trainer_stretches

    n = 64
    one = _fast_drain_base(n)

    def twice(obj):
        doubled = {
            f.name: np.concatenate([value, value])
            for f in fields(obj)
            if isinstance(value := getattr(obj, f.name), np.ndarray) and len(value) == n
        }
        return replace(obj, **doubled)

    inputs = replace(twice(one.inputs), segments=np.array([[0, n], [n, 2 * n]]))
    two = replace(one, inputs=inputs, calibration=twice(one.calibration))
    two = replace(two, cpu=replace(one.cpu, load=twice(one.cpu.load), rho_measured=1.0))
    one = replace(one, cpu=replace(one.cpu, rho_measured=1.0))
    alone = trainer_stretches(one, BASE, None, None, 3.0)
    both = trainer_stretches(two, BASE, None, None, 3.0)
    assert alone.min() < 2.9  # the drain's stretch falls: the demand decides it
    np.testing.assert_allclose(both[:n], alone, rtol=1e-12)
    np.testing.assert_allclose(both[n:], alone, rtol=1e-12)


def test_trainer_stretch_keeps_the_body_and_falls_with_the_demand() -> None:
    demand = np.array([3.0, 2.0, 2.0, 2.0, 1.0, 0.5])
    body = np.array([False, True, True, True, False, False])
    rho = cpu_share.trainer_stretch(4.0, demand, body)
    np.testing.assert_allclose(rho[1:4], 4.0)  # the body's demand: the solved stretch
    np.testing.assert_allclose(rho[[0, 4, 5]], [5.5, 2.5, 1.75])  # 1 + 3 d / 2
    # Nothing to scale by: the solved stretch everywhere.
    np.testing.assert_array_equal(
        cpu_share.trainer_stretch(4.0, np.zeros(3), np.ones(3, bool)), 4.0
    )
    np.testing.assert_allclose(
        cpu_share.trainer_stretch(2.0, np.array([1.0, np.nan]), np.ones(2, bool)), [2.0, 2.0]
    )


def test_trainer_stretch_follows_the_curve_outside_the_body() -> None:
    """Start-up and drain rows: the calibrated curve at their own demand, never above ρ."""
    demand = np.array([3.0, 2.0, 2.0, 2.0, 1.0, 0.5])
    body = np.array([False, True, True, True, False, False])
    rho = cpu_share.trainer_stretch(4.0, demand, body, (2, 0.5))
    np.testing.assert_allclose(rho[1:4], 4.0)  # the body keeps its proportional share
    # 1 + a u / (1 - u) at u = d / K: u = 0.5 -> 1.5; u = 0.25 -> 1 + 0.5/3; u >= 1 -> capped at ρ.
    np.testing.assert_allclose(rho[[0, 4, 5]], [4.0, 1.5, 1.0 + 0.5 / 3.0])
    # Without the curve the edge rows take the proportional share, as before.
    np.testing.assert_allclose(cpu_share.trainer_stretch(4.0, demand, body)[[4, 5]], [2.5, 1.75])


def test_the_drain_at_a_segment_end_runs_faster(tmp_path: Path) -> None:
    """The last P·W iterations: workers idle, the trainers get the cores (SPEC §4.2 "The drain").

    With one stretch for the whole run they replayed as slowly as the body;
    the 8-worker re-runs' last 16 iterations ran 2-3x faster (FIDELITY.md).
    """
    model, _, prepared = _prepared(tmp_path)
    times = model.replay(prepared, BASE, ReplayParams(workers=4, prefetch_factor=2)).iteration_s
    n, drain = len(times), 8
    body = float(np.mean(times[drain : n - drain]))
    assert float(np.mean(times[n - drain :])) < 0.95 * body
    # The body itself keeps the solved stretch: still bound by the cores.
    assert body > 0.97 * prepared.cpu.demand_s / prepared.cpu.load.cores


def test_a_given_stretch_replaces_the_solved_one(tmp_path: Path) -> None:
    """``rho_given`` (the swap of the re-run's measured stretch) bypasses the fixed point."""
    from dsim.replay.models.pipeline import aligned_cpu

    model, _, prepared = _prepared(tmp_path)
    params = ReplayParams(workers=2, prefetch_factor=2)
    solved = solve_contention(aligned_cpu(prepared, "actual"), BASE, 2, 2).rho
    at = {
        rho: model.replay(replace(prepared, cpu=replace(prepared.cpu, rho_given=rho)), BASE, params)
        for rho in (solved, 1.0)
    }
    np.testing.assert_allclose(
        at[solved].iteration_s, model.replay(prepared, BASE, params).iteration_s, rtol=1e-12
    )
    assert np.mean(at[1.0].iteration_s) < np.mean(at[solved].iteration_s)


def test_fewer_workers_from_a_many_worker_run_respect_the_cores(tmp_path: Path) -> None:
    """An 8-worker run's start-up must not make a 2-worker what-if beat the cores' bound.

    The committed contention sweep's cpu run at 8 workers (validation/data-cpu):
    with only the what-if's own P·W start-up rows left out of T, the 16-batch
    start-up of the measured run inflated T, lowered ρ*, and the 2-worker
    prediction's body ran at ~42 ms against the cores' bound C / K = 41.9 ms
    (the 2-worker re-runs measured 50.7 ms). SPEC §4.2, "The stretched replay".
    """
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from validation.compare import unpack_logs
    from validation.predict import prepare_pipeline

    run = "cpu_w8_p2_none_r1"
    unpack_logs(REPO / "validation" / "data-cpu" / run, tmp_path / "raw" / run)
    parsed = run_dsim("parse", tmp_path / "raw", "--out", tmp_path / "traces", "--quiet")
    assert parsed.returncode == 0, parsed.stderr
    base = prepare_pipeline(tmp_path / "traces" / run)
    cpu = base.prepared.cpu
    assert cpu is not None and base.prepared.calibration.workers == 8
    replay = base.model.replay(base.prepared, BASE, ReplayParams(workers=2, prefetch_factor=2))
    bound = cpu.demand_s / cpu.load.cores
    body = replay.iteration_s[16:-4]  # past the measured 16-batch start-up, before the drain
    assert body.mean() > 1.1 * bound


def test_the_drain_hands_batches_over_faster_and_only_there() -> None:
    """In the last P·W rows the hand-over shrinks with the trainers' stretch, never grows."""
    from dsim.replay.models.pipeline import CpuState, PreparedPipeline, _stretched, drain_rows
    from dsim.replay.models.pipeline_kernel import Calibration, PipelineInputs

    n, g = 6, 2
    ones = np.ones((n, g))
    inputs = PipelineInputs(
        np.array([[0, n]]), np.arange(n), ones, ones, ones, ones, ones, np.zeros((n, g), int)
    )
    hand = np.full((n, g), 0.010)
    calibration = Calibration(2, 1, *(np.zeros((n, g)),) * 2, hand, *(np.zeros((n, g)),) * 3)
    load = cpu_share.CpuLoad(ones, ones, ones, ones, 2, 2, False, True)
    prepared = PreparedPipeline(inputs, calibration, CpuState(load, 4.0, 1.0, 0.5, 1.0))
    drain = drain_rows(inputs.segments, n, 2)
    np.testing.assert_array_equal(drain, [False] * 4 + [True] * 2)
    rho_t = np.array([[4.0], [4.0], [5.0], [3.0], [2.0], [6.0]]).repeat(g, axis=1)
    got = _stretched(prepared, 4.0, rho_t, drain).calibration.hand[:, 0]
    # Body rows keep the calibrated hand-over (even where ρ_t < ρ*); the drain's
    # shrinks by ρ_t / ρ* and never grows above it.
    np.testing.assert_allclose(got, [0.010, 0.010, 0.010, 0.010, 0.005, 0.010])
    np.testing.assert_array_equal(_stretched(prepared, 4.0, rho_t).calibration.hand, hand)


def _fast_drain_base(n: int = 64, g: int = 2, workers: int = 8, drain_after: float = 0.005):
    """A calibrated 8-worker (P = 2) run whose last 16 rows (its drain) have a fast trainer.

    The body's step after the last arrival is 20 ms and its hand-over 1 ms; the
    drain's, measured with idle workers, 5 ms and 0.2 ms (an 8-worker cpu run
    of the contention sweep: 19 and 14 ms in the body, 11 and 4 ms in the
    drain). Fetches last 40 ms, 10 ms of it CPU, on 64 cores: barely contended.
    """
    from dsim.replay.models.pipeline import CpuState, PreparedPipeline
    from dsim.replay.models.pipeline_kernel import Calibration, PipelineInputs

    window = 2 * workers
    rows = np.arange(n)
    zeros = np.zeros((n, g))
    fetch = np.full((n, g), 0.040)
    inputs = PipelineInputs(
        np.array([[0, n]]), rows, zeros, fetch, fetch + 0.001, zeros + 0.001,
        zeros + 0.021, (rows % workers)[:, None].repeat(g, axis=1),
    )  # fmt: skip
    drain = (rows >= n - window)[:, None]
    after = np.where(drain, drain_after, 0.020) + zeros
    hand = np.where(drain, 0.0002, 0.001) + zeros
    calibration = Calibration(workers, 2, zeros, zeros, hand, zeros, after, zeros)
    load = cpu_share.CpuLoad(zeros + 0.010, zeros, zeros + 0.002, zeros, 64, g, False, True)
    state = CpuState(load, 1.0, float(g * (0.010 + 0.002)), 0.5, 0.021)
    return PreparedPipeline(inputs, calibration, state)


def test_a_shorter_window_does_not_inherit_the_base_drain_as_body() -> None:
    """Base drain rows that are body rows of the what-if take the base's body calibration.

    An 8-worker run drains in its last P·W = 16 rows; a 4-worker what-if only in
    its last 8, so rows n − 16 .. n − 9 are body rows of the what-if, where
    every worker still builds batches. Carried over with the drain's fast
    trainer they made 4 workers look as fast as 8 (issue #19; SPEC §4.2, "The
    drain"): here ~5 ms per iteration there against a 21 ms body.
    """
    from dsim.replay.models.pipeline import rebodied

    n = 64
    prepared = _fast_drain_base(n)
    model = PipelineModel()
    times = model.replay(prepared, BASE, ReplayParams(workers=4, prefetch_factor=2)).iteration_s
    body = float(np.mean(times[16 : n - 16]))
    moved = times[n - 16 : n - 8]
    assert body == pytest.approx(0.021, rel=0.05)
    assert moved.min() > 0.95 * body  # without the fix: ~0.005 s
    # The same or a longer window (the drain's own stretch handles the longer) changes nothing.
    for workers, prefetch in ((8, 2), (4, 4), (16, 2)):
        assert rebodied(prepared, workers, prefetch) is prepared


def test_the_moved_rows_copy_body_rows_with_their_rank_spread() -> None:
    """Row k takes row k − P_m·W_m's terms, every rank from that row: the spread stays.

    An iteration ends when its slowest rank's step does; each rank's body mean
    flattened the spread and left those rows 30 % fast on the contention sweep.
    """
    from dsim.replay.models.pipeline import rebodied

    n, g = 64, 2
    prepared = _fast_drain_base(n, g)
    rng = np.random.default_rng(0)
    varied = {t: rng.uniform(0.001, 0.03, (n, g)) for t in ("after", "hand")}
    prepared = replace(prepared, calibration=replace(prepared.calibration, **varied))
    cal = rebodied(prepared, 4, 2).calibration
    for term, values in varied.items():
        got = getattr(cal, term)
        np.testing.assert_array_equal(got[n - 16 : n - 8], values[n - 32 : n - 24])
        keep = np.r_[0 : n - 16, n - 8 : n]
        np.testing.assert_array_equal(got[keep], values[keep])
    # A segment too short to hold a body row P_m·W_m earlier: each rank's body mean.
    short = replace(prepared, inputs=replace(prepared.inputs, segments=np.array([[0, 40]])))
    got = rebodied(short, 4, 2).calibration.after
    np.testing.assert_allclose(got[24:32], np.repeat(varied["after"][16:24].mean(0)[None], 8, 0))


def test_the_fixed_point_leaves_the_measured_drain_out_of_t() -> None:
    """T (and T_m) are means over the measured run's body: its fast drain rows left out.

    With them, an 8-worker run's 16 fast rows lowered T_m, and a 4-worker
    what-if (8 drain rows) got a lower u, a lower ρ* and a body faster than
    the 8-worker run's own (issue #19).
    """
    from dsim.replay.models.pipeline import _mean_iteration
    from dsim.replay.models.pipeline_kernel import replay_pipeline

    n = 64
    prepared = _fast_drain_base(n)
    times = replay_pipeline(prepared.inputs, prepared.calibration, BASE, 4, 2)["iteration_s"]
    got = _mean_iteration(prepared, BASE, 4, 2)
    assert got == pytest.approx(float(np.mean(times[16 : n - 16])), rel=1e-12)


def test_the_body_of_a_short_first_segment_is_empty() -> None:
    """A segment shorter than the window has no body rows (a negative stop wrapped around)."""
    from dsim.replay.models.pipeline import body_rows

    got = body_rows(np.array([[0, 10], [10, 60]]), 60, 16)
    assert not got[:10].any()
    np.testing.assert_array_equal(np.flatnonzero(got), np.arange(26, 44))


def test_less_contention_narrows_the_ranks_hand_over_spread_and_more_never_widens_it() -> None:
    """Each row's hand-overs move towards the row's mean by (ρ − 1) / (ρ_m − 1) when
    ρ < ρ_m (the waiting part of the spread), keep that mean, and stay as measured
    when the what-if contends as much or more (SPEC §4.2, "The hand-over's spread")."""
    from dsim.replay.models.pipeline import hand_spread

    hand = np.array([[0.010, 0.020, 0.030], [0.004, 0.004, 0.004]])
    got = hand_spread(hand, rho=2.0, rho_measured=3.0)  # half the waiting
    np.testing.assert_allclose(got, [[0.015, 0.020, 0.025], [0.004, 0.004, 0.004]])
    np.testing.assert_allclose(got.mean(axis=1), hand.mean(axis=1))
    np.testing.assert_allclose(hand_spread(hand, 1.0, 3.0), [[0.02] * 3, [0.004] * 3])
    np.testing.assert_allclose(hand_spread(hand, 0.5, 3.0), [[0.02] * 3, [0.004] * 3])
    for rho in (3.0, 4.5):  # as contended or more: as measured, never widened
        assert hand_spread(hand, rho, 3.0) is hand
    assert hand_spread(hand, 2.0, 1.0) is hand  # nothing waited in the measured run
    gap = np.array([[0.010, np.nan, 0.030], [np.nan, np.nan, np.nan]])
    np.testing.assert_allclose(
        hand_spread(gap, 2.0, 3.0), [[0.015, np.nan, 0.025], [np.nan] * 3]
    )  # a missing value stays missing and is not in its row's mean


def test_the_stretched_replay_narrows_the_spread_only_below_the_measured_stretch() -> None:
    from dsim.replay.models.pipeline import CpuState, PreparedPipeline, _stretched
    from dsim.replay.models.pipeline_kernel import Calibration, PipelineInputs

    n, g = 4, 2
    ones = np.ones((n, g))
    inputs = PipelineInputs(
        np.array([[0, n]]), np.arange(n), ones, ones, ones, ones, ones, np.zeros((n, g), int)
    )
    hand = np.tile([0.004, 0.012], (n, 1))
    calibration = Calibration(2, 1, *(np.zeros((n, g)),) * 2, hand, *(np.zeros((n, g)),) * 3)
    load = cpu_share.CpuLoad(ones, ones, ones, ones, 2, 2, False, True)
    prepared = PreparedPipeline(inputs, calibration, CpuState(load, 3.0, 1.0, 0.5, 1.0))
    np.testing.assert_array_equal(_stretched(prepared, 3.0).calibration.hand, hand)
    np.testing.assert_array_equal(_stretched(prepared, 5.0).calibration.hand, hand)
    narrowed = _stretched(prepared, 1.5).calibration.hand  # a quarter of the waiting left
    np.testing.assert_allclose(narrowed, np.tile([0.007, 0.009], (n, 1)))


def test_worker_cpu_outside_the_building_thread_fills_gaps_by_rank_then_run() -> None:
    nan = np.nan
    proc = np.array([[nan, nan, nan], [0.030, nan, 0.010], [0.034, nan, nan]])
    cpu = np.array([[0.020, 0.020, 0.020], [0.020, 0.020, 0.020], [0.020, 0.020, 0.020]])
    got = worker_outside_cpu(proc, cpu)
    # rank 0: 10 and 14 ms logged (mean 12); rank 1 none: the run's mean of the logged
    # values (10, 14 and 0: a process clock below the thread's is clipped to 0); rank 2: 0.
    expected = np.array([[0.012, 0.008, 0.0], [0.010, 0.008, 0.0], [0.014, 0.008, 0.0]])
    assert np.allclose(got, expected)
    assert worker_outside_cpu(None, cpu) is None
    assert worker_outside_cpu(np.full((2, 3), nan), cpu[:2]) is None


def test_the_worker_process_cpu_joins_the_node_demand_and_the_core_bound(tmp_path: Path) -> None:
    """``proc`` logged: the node's demand gains each batch's CPU outside the building thread,
    so a what-if to more workers is bounded by (C + X) / K, not C / K. (3 cores: on 2,
    128 ms of CPU per 50 ms iteration is more than the cores can run, §4.2.)"""
    model, arrays, threads = _prepared(tmp_path / "threads", cores=3)
    _, proc_arrays, whole = _prepared(tmp_path / "whole", proc_s=0.030, cores=3)
    assert threads.cpu is not None and whole.cpu is not None
    assert cpu_assumption(arrays)["worker_process_cpu_logged"] is False
    assert cpu_assumption(proc_arrays)["worker_process_cpu_logged"] is True
    extra = 4 * (0.030 - 0.022)  # 4 ranks on the node, 8 ms each per iteration
    assert whole.cpu.demand_s == pytest.approx(threads.cpu.demand_s + extra)
    # The identity is the measured run either way.
    measured = ReplayParams(workers=1, prefetch_factor=2)
    assert np.array_equal(
        model.replay(whole, BASE, measured).iteration_s,
        model.replay(threads, BASE, measured).iteration_s,
    )
    for workers in (2, 4):
        # the cores' bound, on the steady mean the fixed point solves for (a window of
        # other rows cuts the start-up's 4-row bursts unevenly)
        solved = solve_contention(whole, BASE, workers, 2)
        assert solved.iteration_s > whole.cpu.demand_s / whole.cpu.load.cores
        more = _mean(model, whole, workers, tail=2 * workers)
        assert more >= _mean(model, threads, workers, tail=2 * workers)  # more demand: slower


def test_the_cpu_swap_scales_each_batchs_work_and_the_contention_with_it(tmp_path: Path) -> None:
    """``validation.swaps.scaled_cpu``: factor 1 replays the run unchanged; 1.5 makes every
    batch's CPU time and run-queue wait 1.5 times as long, its fetch longer by as much,
    the node's demand higher, and the CPU-bound replay slower."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from validation.swaps import scaled_cpu

    model, _, prepared = _prepared(tmp_path)
    same = scaled_cpu(prepared, 1.0)
    np.testing.assert_array_equal(same.inputs.fetch, prepared.inputs.fetch)
    assert same.cpu.demand_s == pytest.approx(prepared.cpu.demand_s, rel=1e-12)
    more = scaled_cpu(prepared, 1.5)
    c, q = prepared.cpu.load.fetch_cpu, prepared.cpu.load.fetch_runq
    np.testing.assert_allclose(more.cpu.load.fetch_cpu, 1.5 * c)
    np.testing.assert_allclose(more.cpu.load.fetch_runq, 1.5 * q)
    np.testing.assert_allclose(more.inputs.fetch - prepared.inputs.fetch, 0.5 * (c + q))
    assert more.cpu.demand_s > 1.2 * prepared.cpu.demand_s
    assert _mean(model, more, 1, tail=2) > 1.1 * _mean(model, prepared, 1, tail=2)


def test_the_fetches_keep_the_workers_own_stretch_scaled_with_the_pooled_one() -> None:
    """The fifteenth held-out sweep's mixed 8-worker run: workers 8.80, training processes
    6.17, pooled 8.39. Solved at 2.13 for 1 worker, the pooled subtraction left a fetch of
    85.9 ms (measured 63.3); each class's own excess, scaled alike, leaves 77.2 ms."""
    from dsim.replay.models.pipeline import CpuState, PreparedPipeline, _stretched

    assert cpu_share.class_delta(2.13, 8.39, None) == pytest.approx(2.13 - 8.39)
    assert cpu_share.class_delta(8.39, 8.39, 8.80) == pytest.approx(0.0)  # identity
    assert cpu_share.class_delta(2.0, 1.0, 3.0) == pytest.approx(1.0)  # no contention measured
    got = 241.1 + 24.8 * cpu_share.class_delta(2.13, 8.39, 8.80)
    assert got == pytest.approx(241.1 + 24.8 * (1 + 7.80 * 1.13 / 7.39 - 8.80))
    assert round(got, 1) == 77.2 and round(241.1 + 24.8 * (2.13 - 8.39), 1) == 85.9
    deltas = cpu_share.class_delta(np.array([1.0, 8.39, 12.0]), 8.39, 6.17)
    np.testing.assert_allclose(deltas, [-5.17, 0.0, 5.17 * 3.61 / 7.39])

    # the classes from the logs: 1 + wait / CPU each; none where a class has no CPU time
    n, g = 4, 2
    fetch_cpu, fetch_runq = np.full((n, g), 0.025), np.full((n, g), 0.195)
    train_cpu, train_runq = np.full((n, g), 0.005), np.full((n, g), 0.026)
    load = cpu_share.CpuLoad(fetch_cpu, fetch_runq, train_cpu, train_runq, 2, 2, False, True)
    assert cpu_share.class_stretches(load) == pytest.approx((8.8, 6.2))
    assert cpu_share.class_stretches(replace(load, runq_known=False)) is None
    assert cpu_share.class_stretches(replace(load, train_cpu=np.zeros((n, g)))) is None

    # the replay: a fetch moves by the workers' own delta, the training process's by ρ − ρ_m
    inputs, calibration = _eight_worker_run(n, g)
    rho_m = cpu_share.measured_stretch(load)
    pooled = CpuState(load, rho_m, 1.0, 0.5, 1.0)
    w, t = cpu_share.class_stretches(load)
    own = replace(pooled, fetch_rho=w)
    same = _stretched(PreparedPipeline(inputs, calibration, own), rho_m)
    np.testing.assert_allclose(same.inputs.fetch, inputs.fetch)  # the run replays as itself
    np.testing.assert_allclose(same.calibration.after, calibration.after)
    low = _stretched(PreparedPipeline(inputs, calibration, own), 2.0)
    low_pooled = _stretched(PreparedPipeline(inputs, calibration, pooled), 2.0)
    scale = (2.0 - 1.0) / (rho_m - 1.0)
    np.testing.assert_allclose(low.inputs.fetch, 0.241 + 0.025 * (w - 1) * (scale - 1))
    # the training processes keep the pooled stretch (their own moved aligned shares)
    np.testing.assert_allclose(low.calibration.after, 0.005 * (2.0 - rho_m))
    assert t < rho_m < w
    np.testing.assert_allclose(low_pooled.inputs.fetch, 0.241 + 0.025 * (2.0 - rho_m))
    assert (low.inputs.fetch < low_pooled.inputs.fetch).all()  # the workers waited more


def test_a_worker_what_if_scales_the_workers_excess_by_their_population() -> None:
    """From 8 workers to 1, the workers' own excess stretch shrinks by (1 + 1) / (8 + 1)
    beside the pooled one's scaling; at the measured workers nothing moves (alignment and
    prefetch what-ifs, the identity); the training processes keep the pooled stretch."""
    from dsim.replay.models.pipeline import CpuState, PreparedPipeline, _stretched, populated

    assert cpu_share.population_factor(8, 8) == 1.0
    assert cpu_share.population_factor(1, 8) == pytest.approx(2 / 9)
    assert cpu_share.population_factor(8, 1) == pytest.approx(9 / 2)
    assert cpu_share.population_factor(0, 1) == pytest.approx(0.5)  # loading in the loop
    factors = [cpu_share.population_factor(w, 2) for w in (0, 1, 2, 4, 8, 16)]
    assert factors == sorted(factors)
    # the excess: (ρ_w,m − 1)(ρ − 1)/(ρ_m − 1) · factor; without a class stretch, ρ − ρ_m
    f = cpu_share.population_factor(1, 8)
    assert cpu_share.class_delta(2.13, 8.39, 8.80, f) == pytest.approx(
        7.80 * 1.13 / 7.39 * f - 7.80
    )
    assert cpu_share.class_delta(8.39, 8.39, 8.80, 1.0) == 0.0
    assert cpu_share.class_delta(2.13, 8.39, None, f) == pytest.approx(2.13 - 8.39)

    n, g = 4, 2
    ones = np.ones((n, g))
    load = cpu_share.CpuLoad(
        ones * 0.025, ones * 0.195, ones * 0.005, ones * 0.026, 2, 2, False, True
    )
    inputs, calibration = _eight_worker_run(n, g)
    rho_m = cpu_share.measured_stretch(load)
    w, _ = cpu_share.class_stretches(load)
    run = PreparedPipeline(inputs, calibration, CpuState(load, rho_m, 1.0, 0.5, 1.0, fetch_rho=w))
    assert populated(run, None) is run and populated(run, 8) is run
    assert populated(run, 16) is run  # more workers: as measured (the cores' bound)
    fewer = populated(run, 1)
    assert fewer.cpu is not None and fewer.cpu.fetch_population == pytest.approx(f)
    again = populated(fewer, 1).cpu
    assert again is not None and again.fetch_population == pytest.approx(f)  # set, not compounded
    low = _stretched(fewer, 2.0)
    scale = (2.0 - 1.0) / (rho_m - 1.0)
    np.testing.assert_allclose(low.inputs.fetch, 0.241 + 0.025 * (w - 1) * (scale * f - 1))
    np.testing.assert_allclose(low.calibration.after, 0.005 * (2.0 - rho_m))
    assert (low.inputs.fetch < _stretched(run, 2.0).inputs.fetch).all()
    same = _stretched(populated(run, 8), rho_m)
    np.testing.assert_allclose(same.inputs.fetch, inputs.fetch)  # the run replays as itself


def _eight_worker_run(n: int, g: int):
    """A segment of ``n`` rows of a run measured at 8 workers, prefetch 2: each fetch 241 ms,
    4 ms after its last arrival; the inputs and calibration the stretched replay moves."""
    from dsim.replay.models.pipeline_kernel import Calibration, PipelineInputs

    ones = np.ones((n, g))
    inputs = PipelineInputs(
        np.array([[0, n]]), np.arange(n), ones, ones * 0.241, ones, ones, ones,
        np.zeros((n, g), int),
    )  # fmt: skip
    calibration = Calibration(
        8, 2, *(np.zeros((n, g)),) * 2, ones * 0.004, *(np.zeros((n, g)),) * 3
    )
    return inputs, calibration


def test_tune_calls_the_cores_saturated_where_the_model_has_them_busy(tmp_path: Path) -> None:
    """``dsim tune``'s saturation check reads the solver's busy share of the wall clock.

    4 ranks on 2 cores whose fetches are CPU work: already at 1 worker the solved
    contention has the cores (almost) busy, so the check names 1 worker; the same job
    loading at almost no CPU saturates nothing; without CPU times the model cannot say."""
    from dsim.app.tune import SATURATED_DEMAND, cpu_saturated_at

    _, _, busy = _prepared(tmp_path / "cpu")
    levels = {w: solve_contention(busy, BASE, w, 2).busy for w in (1, 2, 4, 8)}
    assert all(b <= 1.0 + 1e-9 for b in levels.values())
    assert levels[1] >= SATURATED_DEMAND and levels[8] >= levels[1] - 1e-9
    assert cpu_saturated_at(busy, [8, 4, 2, 1, 0], 2) == 1  # the fewest, whatever the order
    _, _, light = _prepared(tmp_path / "light", cpu_s=0.0005, runq_s=0.0, train_cpu_s=0.0)
    assert solve_contention(light, BASE, 8, 2).busy < SATURATED_DEMAND
    assert cpu_saturated_at(light, [1, 2, 4, 8], 2) is None
    _, _, blind = _prepared(tmp_path / "free", cpu_s=None, cores=None)
    assert cpu_saturated_at(blind, [1, 2, 4, 8], 2) is None
    # Busy is the demand over the pole the wall period sets, not the demand alone: the same
    # half-CPU job saturates at 8 workers under a pole at 1 and at 2 under a pole at 0.6,
    # where its demand never reaches 0.9.
    _, _, mid = _prepared(tmp_path / "mid", cpu_s=0.008, runq_s=0.004, train_cpu_s=0.001)
    assert mid.cpu.u_cap == 1.0 and cpu_saturated_at(mid, [1, 2, 4, 8], 2) == 8
    low = replace(mid, cpu=replace(mid.cpu, u_cap=0.6))
    assert cpu_saturated_at(low, [1, 2, 4, 8], 2) == 2
    assert all(solve_contention(low, BASE, w, 2).demand < SATURATED_DEMAND for w in (1, 2, 4, 8))


def test_a_cpu_aware_replay_holds_few_arrays_beside_the_run(tmp_path: Path) -> None:
    """``dsim run``'s headline on a trace with CPU times peaked at ~500 bytes per
    GPU-iteration (BENCHMARKS.md, "The CPU-aware headline's memory"), most of it the
    contention's temporaries: the demand's sweep (~15 arrays of the node's fetches), the
    stretched terms (~6 each step), the node's columns copied out every trainer pass. The
    NumPy allocations of one aligned what-if (traced; the kernels' own are numba's) were
    261 bytes per GPU-iteration here before, 200 since (140 measured at 1db8f29); 120
    since the aligned fetches' CPU work is one column seen by every rank and
    the trainer passes make each fetch's rate and end in place, without per-GPU stalls.
    The values are unchanged (the committed sweeps' predictions byte for byte)."""
    import tracemalloc

    from dsim.replay.models.pipeline import contended

    _model, arrays, prepared = _prepared(tmp_path, iterations=3000, proc_s=0.024)
    cells = arrays.fetch.size
    contended(prepared, ("min", "actual"), None, None)  # compiles the kernels
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        contended(prepared, ("min", "actual"), None, None)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak / cells < 130, peak / cells


def test_only_the_pipeline_model_reads_the_cpu_times(tmp_path: Path) -> None:
    """``dsim run`` with the per-iteration model leaves a trace's CPU columns unread (five
    [N, G] arrays nothing of it reads: 40 bytes per GPU-iteration); the pipeline model, whose
    CPU-aware path needs them, reads them. Everything else of the plan, its cache keys
    among it, is what the whole trace gives."""
    from dataclasses import fields

    import dsim
    from dsim.app.runplan import plan_runs_of, unread
    from dsim.config import Overrides, load_config
    from dsim.model.tables import read_run
    from dsim.replay.arrays import CPU_FIELDS, IterationArrays

    write_cpu_logs(tmp_path / "logs" / "cpurun", proc_s=0.024)
    dsim.parse(tmp_path / "logs" / "cpurun", out=tmp_path / "traces", quiet=True)
    run_dir = tmp_path / "traces" / "cpurun"
    whole = read_run(run_dir)
    assert "cpu_s" in whole.fetch.column_names and "cpu_s" in whole.train.column_names
    slim = read_run(run_dir, unread("per-iteration"))
    assert "cpu_s" not in slim.fetch.column_names + slim.train.column_names
    assert unread("pipeline") == {"fetch.parquet": ("end",)}
    from dsim.replay.models import MODELS

    assert [name for name, m in MODELS.items() if m.reads_cpu] == ["pipeline"]

    def plan(model: str, tables=None):
        config = load_config(
            None, Overrides(runs=("cpurun",), traces=tmp_path / "traces", model=model)
        )
        (only,) = plan_runs_of("cpurun", run_dir, config, tables)
        return only

    per_iteration, pipeline = plan("per-iteration"), plan("pipeline")
    assert all(getattr(per_iteration.arrays, f) is None for f in CPU_FIELDS)
    held = [f for f in CPU_FIELDS if getattr(pipeline.arrays, f) is not None]
    assert held == ["fetch_cpu", "fetch_runq", "train_cpu", "fetch_proc"]  # no Runq logged
    read_whole = plan("per-iteration", read_run(run_dir))
    assert per_iteration.keys == read_whole.keys
    for field in fields(IterationArrays):
        if field.name not in CPU_FIELDS:
            a, b = getattr(per_iteration.arrays, field.name), getattr(read_whole.arrays, field.name)
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b, err_msg=field.name)
            else:
                assert a == b, field.name


def test_a_nodes_cores_are_the_union_of_its_ranks_cpu_sets() -> None:
    from dsim.sources.rawlog.cpusets import node_cores, union_size

    assert union_size(["0-7", "8-15", "4-11"]) == 16 and union_size(["3", "3"]) == 1
    assert union_size(["0-999999"]) == 1_000_000  # as intervals, not sets
    bound = [{"gpu": r, "cpus": f"{8 * r}-{8 * r + 7}"} for r in range(8)]
    assert node_cores(bound, 8) == 64  # 8 ranks bound to 8 CPUs each
    assert node_cores(bound, 4) == 32  # two nodes of 4 ranks (CPU ids are per node)
    assert node_cores(bound, None) == 64  # ranks per node unknown: one node
    shared = [{"gpu": r, "cpus": "0-7"} for r in range(8)]
    assert node_cores(shared, 8) == 8
    assert node_cores([{"gpu": 0}], 8) is None  # older lines: no sets


def test_ranks_bound_in_groups_are_cpu_domains_and_other_sets_one_pool() -> None:
    """Consecutive ranks sharing one set, disjoint from the others', sets of one size and
    groups of one length: CPU domains of that many ranks (SPEC §1.2); anything else (sets
    that overlap, groups of two lengths, a rank without a set or with two, one set for
    all) leaves the node one pool of the union (``None``)."""
    from dsim.sources.rawlog.cpusets import cpu_domain_ranks

    def lines(*sets: str) -> list[dict]:
        return [{"gpu": r, "cpus": c} for r, c in enumerate(sets)]

    assert cpu_domain_ranks(lines("0", "0", "1", "1"), 4) == 2  # the bound sweeps' layout
    assert cpu_domain_ranks(lines("0-7", "8-15", "16-23", "24-31"), 4) == 1  # a rank each
    assert cpu_domain_ranks(lines("0-3", "0-3", "0-3", "0-3"), 4) == 4  # one set: one domain
    eight = lines(*(f"{4 * (r // 2)}-{4 * (r // 2) + 3}" for r in range(8)))
    assert cpu_domain_ranks(eight, 4) == 2  # two nodes of two domains (CPU ids per node)
    assert cpu_domain_ranks(eight, None) == 2  # ranks per node unknown: one node
    assert cpu_domain_ranks(lines("0-1", "1-2", "2-3", "3"), 4) is None  # overlapping sets
    assert cpu_domain_ranks(lines("0", "0", "0", "1"), 4) is None  # groups of 3 and 1
    assert cpu_domain_ranks(lines("0", "1", "0", "1"), 4) is None  # a set on two groups
    assert cpu_domain_ranks(lines("0-1", "2", "3", "4"), 4) is None  # sets of two sizes
    assert cpu_domain_ranks([{"gpu": 0, "cpus": "0"}, {"gpu": 1}], 2) is None  # no set
    two = [{"gpu": 0, "cpus": "0"}, {"gpu": 0, "cpus": "1"}, {"gpu": 1, "cpus": "2"}]
    assert cpu_domain_ranks(two, 2) is None  # a rank that logged two sets
    assert cpu_domain_ranks([{"gpu": 0}], 1) is None  # older lines


def test_ranks_bound_to_cpus_of_their_own_get_the_nodes_cores(tmp_path: Path) -> None:
    """4 ranks, each bound to one CPU of its own: each process sees 1 core, the node has 4.
    Read as 1 core for all 4 ranks, the logs were more CPU than it can run
    (load-independent, §4.2); the sets give the node its 4, each rank a CPU domain of its
    1, and the replay is CPU-aware on them (SPEC §1.2, §4.2). Sets that overlap keep the
    node one pool of their union."""
    cpus = ["0", "1", "2", "3"]
    _, arrays, prepared = _prepared(tmp_path / "bound", cores=1, cpus=cpus)
    assert (arrays.loader.cores, arrays.loader.cpu_domain_ranks) == (4, 1)
    assert prepared.cpu is not None
    assert (prepared.cpu.load.cores, prepared.cpu.load.ranks_per_node) == (1, 1)
    said = cpu_assumption(arrays)
    assert said["model"] == "cpu-aware" and said["cpu_domains"] is True
    assert (said["cores"], said["ranks_per_node"], said["nodes"]) == (1, 1, 4)
    note = cpu_note("pipeline", {"cpu": said})
    assert note == "; CPU-aware: 1 core per CPU domain, 1 rank bound to each", note
    _, arrays, prepared = _prepared(tmp_path / "pooled", cores=2, cpus=["0-1", "1-2", "2-3", "3,0"])
    assert (arrays.loader.cores, arrays.loader.cpu_domain_ranks) == (4, None)
    assert prepared.cpu is not None and prepared.cpu.load.cores == 4
    assert "cpu_domains" not in cpu_assumption(arrays)
    logs = write_cpu_logs(tmp_path / "logs" / "bound", cores=1, cpus=cpus)
    parsed = run_dsim("parse", str(logs), "--out", "traces", cwd=tmp_path)
    assert parsed.returncode == 0, parsed.stderr
    said = " ".join(parsed.stdout.split())
    assert (
        "each rank was bound to a CPU set of its own, 1 CPU each (4 on a node together): "
        "the CPU-aware replay takes each as a node of its own, a CPU domain"
    ) in said, said
    loader = json.loads((tmp_path / "traces" / "bound" / "run.json").read_text())["loader"]
    assert (loader["cores"], loader["process_cores"], loader["cpu_domain_ranks"]) == (4, 1, 1)
    overlapping = ["0-1", "1-2", "2-3", "3,0"]  # no domains: one pool of the union
    logs = write_cpu_logs(tmp_path / "logs" / "pooled", cores=2, cpus=overlapping)
    parsed = run_dsim("parse", str(logs), "--out", "traces", cwd=tmp_path)
    assert parsed.returncode == 0, parsed.stderr
    said = " ".join(parsed.stdout.split())
    assert "each rank's process could run on 2 CPUs only, the ranks of a node on 4" in said
    # the same CPU for every rank: the count as logged, no note
    _, arrays, prepared = _prepared(tmp_path / "shared", cores=1, cpus=["0"] * 4)
    assert arrays.loader.cores == 1 and prepared.cpu is None  # and 1.9x its one core


def _slow_startup_base(n: int = 64, g: int = 2, workers: int = 8):
    """A calibrated 8-worker (P = 2) run whose first 16 rows (its start-up) are slow to start.

    The body's fetches last 50 ms, 10 ms of CPU and 30 ms of run-queue wait
    (ρ_w = 4); its index-to-start latency is 1 ms. The start-up's, as measured
    when 8 worker processes start at once on every rank: 250 ms from index to
    fetch start in the first 8 rows, fetches of 10 ms of CPU waiting 200 ms for
    a core in all 16 (the contention sweep's 8-worker cpu runs: 220-290 ms,
    125-320 ms).
    """
    from dsim.replay.models.pipeline import CpuState, PreparedPipeline
    from dsim.replay.models.pipeline_kernel import Calibration, PipelineInputs

    window = 2 * workers
    rows = np.arange(n)
    zeros = np.zeros((n, g))
    startup = (rows < window)[:, None]
    runq = np.where(startup, 0.200, 0.030) + zeros
    fetch = 0.010 + runq + 0.010  # CPU, the wait for a core, 10 ms of other waiting
    inputs = PipelineInputs(
        np.array([[0, n]]), rows, zeros, fetch, fetch + 0.001, zeros + 0.001,
        zeros + 0.021, (rows % workers)[:, None].repeat(g, axis=1),
    )  # fmt: skip
    lat_sent = np.where((rows < workers)[:, None], 0.250, 0.001) + zeros
    calibration = Calibration(
        workers, 2, lat_sent, zeros + 0.0002, zeros + 0.001, zeros, zeros + 0.020, zeros
    )
    load = cpu_share.CpuLoad(zeros + 0.010, runq, zeros + 0.002, zeros, 2, g, False, True)
    state = CpuState(load, 4.0, float(g * 0.012), 0.5, 0.05)
    return PreparedPipeline(inputs, calibration, state)


def test_a_shorter_window_does_not_inherit_the_base_start_up_as_body() -> None:
    """Base start-up rows that are body rows of the what-if take the base's body terms.

    An 8-worker run builds its first P·W = 16 batches at once: their latencies
    hold the worker processes' start and their fetches the burst's run-queue
    wait. A 1-worker what-if starts up in 2 rows and builds rows 2-15 in its
    body; carried over, each index sent there waited the start-up's 250 ms and
    each fetch its 200 ms queue (the contention sweep's 8 -> 1 worker what-ifs:
    rows 11-15 at 63-168 ms against ~50 measured; SPEC §4.2, "The start-up").
    """
    from dsim.replay.models.pipeline import rebodied, startup_as_body

    n, g = 64, 2
    prepared = _slow_startup_base(n, g)
    rng = np.random.default_rng(1)
    varied = rng.uniform(0.0005, 0.002, (n, g))  # the rows' own body latencies, by rank
    varied[:8] = 0.250
    prepared = replace(prepared, calibration=replace(prepared.calibration, lat_sent=varied))
    moved = startup_as_body(prepared, 2, 16)
    # rows 2..15 take row k + 16's latencies, every rank from that row; rows 0-1 (the
    # what-if's own start-up) and the body keep theirs
    np.testing.assert_array_equal(moved.calibration.lat_sent[2:16], varied[18:32])
    np.testing.assert_array_equal(moved.calibration.lat_sent[:2], varied[:2])
    np.testing.assert_array_equal(moved.calibration.lat_sent[16:], varied[16:])
    # their fetches keep their CPU and other waiting, and wait for a core as the body's do
    cpu = moved.cpu
    assert cpu is not None
    np.testing.assert_allclose(cpu.load.fetch_runq[2:16], 0.030)
    np.testing.assert_allclose(moved.inputs.fetch[2:16], 0.050)
    np.testing.assert_array_equal(moved.inputs.fetch[:2], prepared.inputs.fetch[:2])
    np.testing.assert_array_equal(cpu.load.fetch_cpu, prepared.cpu.load.fetch_cpu)
    # the measured run's arrays are not written to
    assert prepared.cpu.load.fetch_runq[5, 0] == 0.200
    assert prepared.inputs.fetch[5, 0] == pytest.approx(0.220)
    # a segment too short for row k + 16 to be a body row: each rank's body mean
    short = replace(prepared, inputs=replace(prepared.inputs, segments=np.array([[0, 40]])))
    got = startup_as_body(short, 2, 16).calibration.lat_sent
    np.testing.assert_allclose(got[8:16], np.repeat(varied[16:24].mean(0)[None], 8, 0))
    # the same or a longer window changes nothing (alignments, more workers, the identity)
    for workers, prefetch in ((8, 2), (4, 4), (16, 2)):
        assert rebodied(prepared, workers, prefetch) is prepared
    # replayed: the what-if's rows after its own start-up run at its body's pace
    model = PipelineModel()
    times = model.replay(prepared, BASE, ReplayParams(workers=1, prefetch_factor=2)).iteration_s
    body = float(np.median(times[24 : n - 4]))
    assert times[4:16].max() < 1.5 * body  # carried over: ~5x


def test_a_shorter_window_without_run_queue_waits_moves_only_the_latencies() -> None:
    """Where the logs give no run-queue waits (not Linux), a fetch's wait for a core is not
    known: the start-up rows take the body's latencies and keep their fetch durations."""
    from dsim.replay.models.pipeline import startup_as_body

    prepared = _slow_startup_base()
    cpu = prepared.cpu
    assert cpu is not None
    blind = replace(prepared, cpu=replace(cpu, load=replace(cpu.load, runq_known=False)))
    moved = startup_as_body(blind, 2, 16)
    np.testing.assert_array_equal(moved.inputs.fetch, prepared.inputs.fetch)
    np.testing.assert_allclose(moved.calibration.lat_sent[2:16], 0.001)
