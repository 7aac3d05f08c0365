"""Why a prediction misses, measured: swap one calibrated term for the re-run's value.

The pipeline model carries every term it cannot see over from run A: the
fetch durations and the calibrated latencies of
``dsim.replay.models.pipeline_kernel.Calibration`` (``lat_sent``,
``lat_free``, ``hand``, ``deliver``, ``after``, ``loop``). When a what-if
misses, one of them may have changed physically (CPU contention stretches
fetches; compute + all-reduce grow with load in ``after``; the hand-over
in ``hand``). The re-run is calibrated too, under its own loader settings,
and for each term in turn the prediction is replayed with that term's
per-rank mean moved to the re-run's (``validation.predict.swap_term``).
The share of the error a swap removes is the evidence FIDELITY.md's
"why it misses" sentences quote; nothing else is said.

Where the logs carry CPU times, one more term is the CPU-aware model's own:
``stretch``, the wall seconds per CPU second. The prediction's stretch is
the one its fixed point solved (``dsim.replay.models.pipeline``); the swap
replays at the re-run's measured stretch ρ_m (1 + run-queue wait / CPU
time, the mean over its repeats) instead. Its two values are stretches, not
milliseconds (``unit`` "x").

And ``cpu``: each batch's CPU time. The model takes A's as the work a batch
costs, but the same cost table's batches took different CPU time from one
run to the next (one rank's mean per batch 20.2 to 25.7 ms over five repeats:
validation/README.md, "The tenth held-out sweep"); the swap scales every
batch's building-thread CPU time and run-queue wait (and its fetch by as
much; the worker's CPU outside that thread is left as it was) so that the
what-if's mean CPU time per batch is the re-run's, and replays.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from dsim.replay.models import cpu_share
from dsim.replay.models.pipeline import PreparedPipeline, aligned_cpu, solve_contention
from validation.cells import stat
from validation.metrics import error
from validation.predict import TERMS, PipelineBase, replay_metrics, swap_term, term_means


def removed_pct(before: float, after: float) -> float:
    """Share of the absolute error a swap removes, in % (negative: the swap makes it worse)."""
    if not math.isfinite(before) or before == 0 or not math.isfinite(after):
        return math.nan
    return 100.0 * (1.0 - abs(after) / abs(before))


def target_means(targets: list[PipelineBase]) -> dict[str, np.ndarray]:
    """Per term, the per-rank means of the re-run's repeats, averaged over the repeats."""
    out: dict[str, np.ndarray] = {}
    per_run = [term_means(t.prepared) for t in targets]
    for term in TERMS:
        values = [m[term] for m in per_run if term in m]
        shapes = {v.shape for v in values}
        if values and len(shapes) == 1:
            with np.errstate(all="ignore"):
                out[term] = np.nanmean(np.stack(values), axis=0)
    return out


def swap_row(
    row: dict,
    term: str,
    unit: str,
    base_value: float,
    rerun_value: float,
    predicted: float,
    measured_ms: float,
) -> dict:
    """One swap's row: the term's two values, and the error before and after the swap."""
    before = row["iteration_ms_err_pipeline"]
    after = error("iteration_ms", predicted, measured_ms)
    return {
        "regime": row["regime"],
        "regime_kind": row["regime_kind"],
        "what_if": row["what_if"],
        "term": term,
        "unit": unit,
        "base_term_ms": base_value,
        "rerun_term_ms": rerun_value,
        "err_pct": before,
        "swapped_ms": predicted,
        "swapped_err_pct": after,
        "removed_pct": removed_pct(float(before), float(after)),
    }


def term_swaps(
    row: dict,
    bases: list[PipelineBase],
    targets: list[PipelineBase],
    policy: tuple[str, str],
    workers: int | None,
    prefetch: int | None,
    measured_ms: float,
) -> list[dict]:
    """One row per term: the prediction with that term swapped, and the error it removes."""
    goal = target_means(targets)
    out = []
    for term in TERMS:
        if term not in goal:
            continue
        own, preds = [], []
        for base in bases:
            means = term_means(base.prepared).get(term)
            if means is None or means.shape != goal[term].shape:
                break
            own.append(float(np.nanmean(means)))
            swapped = swap_term(base.prepared, term, goal[term])
            preds.append(replay_metrics(base, policy, workers, prefetch, swapped)["iteration_ms"])
        else:
            own_ms, goal_ms = 1e3 * stat(own).mean, 1e3 * float(np.nanmean(goal[term]))
            out.append(swap_row(row, term, "ms", own_ms, goal_ms, stat(preds).mean, measured_ms))
    extra = (
        stretch_swap(row, bases, targets, policy, workers, prefetch, measured_ms),
        cpu_swap(row, bases, targets, policy, workers, prefetch, measured_ms),
    )
    return out + [swap for swap in extra if swap]


def have_cpu_times(bases: list[PipelineBase], targets: list[PipelineBase]) -> bool:
    """Whether both sides' logs carry CPU times (the CPU-aware swaps need them)."""
    return bool(bases and targets) and all(r.prepared.cpu is not None for r in bases + targets)


def stretch_swap(
    row: dict,
    bases: list[PipelineBase],
    targets: list[PipelineBase],
    policy: tuple[str, str],
    workers: int | None,
    prefetch: int | None,
    measured_ms: float,
) -> dict | None:
    """The prediction replayed at the re-run's measured stretch; ``None`` without CPU times."""
    if not have_cpu_times(bases, targets):
        return None
    goal = float(np.mean([t.prepared.cpu.rho_measured for t in targets]))  # type: ignore[union-attr]
    solved, preds = [], []
    for base in bases:
        cpu = base.prepared.cpu
        assert cpu is not None
        aligned = aligned_cpu(base.prepared, policy[0])
        solved.append(solve_contention(aligned, policy, workers, prefetch).rho)
        given = replace(base.prepared, cpu=replace(cpu, rho_given=goal))
        preds.append(replay_metrics(base, policy, workers, prefetch, given)["iteration_ms"])
    return swap_row(row, "stretch", "x", stat(solved).mean, goal, stat(preds).mean, measured_ms)


def scaled_cpu(prepared: PreparedPipeline, factor: float) -> PreparedPipeline:
    """``prepared`` with every batch's CPU time and run-queue wait ``factor`` times as long.

    The fetch grows by as much as its CPU part did (its waiting for I/O stays), and
    the node's demand follows, so that the contention the replay solves for is the
    one the scaled work causes.
    """
    cpu = prepared.cpu
    assert cpu is not None
    load = cpu.load
    c, q = load.fetch_cpu, load.fetch_runq
    scaled = replace(load, fetch_cpu=c * factor, fetch_runq=q * factor)
    fetch = np.maximum(prepared.inputs.fetch + (factor - 1.0) * (c + q), 0.0)
    return replace(
        prepared,
        inputs=replace(prepared.inputs, fetch=np.ascontiguousarray(fetch)),
        cpu=replace(cpu, load=scaled, demand_s=cpu_share.node_demand(scaled)),
    )


def cpu_swap(
    row: dict,
    bases: list[PipelineBase],
    targets: list[PipelineBase],
    policy: tuple[str, str],
    workers: int | None,
    prefetch: int | None,
    measured_ms: float,
) -> dict | None:
    """The prediction with the re-run's CPU time per batch; ``None`` without CPU times.

    The what-if's own mean (after a fetch alignment has moved the work: align min
    gives every rank the fastest rank's) is set against the re-run's mean over its
    repeats, batches and ranks.
    """
    if not have_cpu_times(bases, targets):
        return None
    goal = float(np.mean([t.prepared.cpu.load.fetch_cpu.mean() for t in targets]))  # type: ignore[union-attr]
    own, preds = [], []
    for base in bases:
        aligned = aligned_cpu(base.prepared, policy[0]).cpu
        assert aligned is not None
        mean = float(aligned.load.fetch_cpu.mean())
        if mean <= 0 or goal <= 0:
            return None
        own.append(mean)
        swapped = scaled_cpu(base.prepared, goal / mean)
        preds.append(replay_metrics(base, policy, workers, prefetch, swapped)["iteration_ms"])
    own_ms, goal_ms = 1e3 * stat(own).mean, 1e3 * goal
    return swap_row(row, "cpu", "ms", own_ms, goal_ms, stat(preds).mean, measured_ms)
