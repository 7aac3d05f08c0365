"""How a fetch alignment moves the node's contention: the model's against the re-runs'.

Why: the mixed regime's effective-delay share under fetch alignment is
predicted 10-15 points too low on most sweeps, and the first suspect is the
contention: aligned fetches start and run together, so more of them are
runnable at once and each CPU second waits longer for a core (held-out 10,
mixed at 2 workers: run-queue wait per CPU second q/c 2.28 unaligned, 3.20
aligned to the mean). This prints, for one regime and worker count of a
sweep, per alignment:

- q/c of run A, of the model's replay, and of the re-runs (over the selected
  iterations' batches, mean over repeats). The model's is what its kernel
  replays: the aligned work (``aligned_cpu``: each rank keeps its batch's
  q/c) with every CPU second stretched from ρ_m to the solved ρ*;
- q/c of two processor-sharing rules tried in place of ρ*: each batch's
  stretch 1 + q/c as in A, times its runnable overlap aligned ÷ in A, the
  overlap taken at A's start times, then from the model's replayed schedule;
- the runnable overlap: during a batch's fetch, how many fetches of the node
  are runnable (on a core or waiting for one) on average, each counted by
  the part of its wall time that is CPU time or run-queue wait, weighted by
  the batch's CPU time;
- mean iteration time, mean delay and effective-delay share: measured,
  predicted, and predicted at the re-runs' stretch (the replayed q/c set to
  the re-runs').

It reads the re-runs, so it is a diagnosis, not a prediction. The sweep's
ranks share one node (the harness runs them on one machine).

    python -m validation.contention --data validation/data-holdout10 --regime mixed --workers 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from dsim.errors import DsimError, InputError
from dsim.model.selection import default_epochs, selection_mask
from dsim.replay.models import cpu_share
from dsim.replay.models.pipeline import (
    PreparedPipeline,
    aligned_cpu,
    contended,
    solve_contention,
)
from dsim.replay.models.pipeline_kernel import replay_pipeline
from validation.cells import group_runs
from validation.compare import dsim, unpack_logs
from validation.manifest import MANIFEST, load_manifest
from validation.metrics import DEFAULT_WARMUP
from validation.predict import PipelineBase, prepare_pipeline, replay_metrics

POLICIES = {"mean": ("avg", "actual"), "min": ("min", "actual")}
METRICS = ("iteration_ms", "delay_ms", "effective_delay_pct")
SIDES = ("measured", "predicted", "rerun_stretch")


def selected(base: PipelineBase) -> np.ndarray:
    """The [N, G] rows dsim's summary judges: every epoch but the first, iterations > 10."""
    a = base.arrays
    rows = selection_mask(a.epoch, a.iteration, default_epochs(np.unique(a.epoch).tolist()),
                          DEFAULT_WARMUP)  # fmt: skip
    return np.repeat(rows[:, None], a.fetch.shape[1], axis=1)


def runq_share(prepared: PreparedPipeline, rows: np.ndarray) -> float:
    """Run-queue wait per CPU second of the selected batches' fetches."""
    load = prepared.cpu.load  # type: ignore[union-attr]
    return float(load.fetch_runq[rows].sum() / load.fetch_cpu[rows].sum())


def runnable_overlap(
    start: np.ndarray, fetch: np.ndarray, cpu: np.ndarray, runq: np.ndarray, rows: np.ndarray
) -> float:
    """Fetches runnable during a selected batch's fetch, on average (CPU-time weighted).

    A fetch counts for the fraction (c + q) / f of its wall time that it is on a
    core or waiting for one; the batch itself is one of them.
    """
    weights = cpu[rows]
    if not weights.sum() > 0:
        return float("nan")
    return float(np.average(overlap_per_batch(start, fetch, cpu, runq)[rows], weights=weights))


def overlap_per_batch(
    start: np.ndarray, fetch: np.ndarray, cpu: np.ndarray, runq: np.ndarray
) -> np.ndarray:
    """[N, G]: ``runnable_overlap`` of every batch on its own (1 where a fetch has no length)."""
    end = start + fetch
    weight = np.divide(cpu + runq, fetch, out=np.zeros_like(fetch), where=fetch > 0)
    n = cpu_share.overlap_rate(start, end, weight, start.ravel(), end.ravel()).reshape(start.shape)
    return np.where(np.isfinite(n), n, 1.0)


def scaled_runq(prepared: PreparedPipeline, factor: np.ndarray | float) -> PreparedPipeline:
    """``prepared`` with every batch's run-queue wait ``factor`` times as long (its fetch too;
    one factor, or one per batch).

    The batch's CPU time and the rest of its fetch (I/O, sleeps) stay, so a fetch
    alignment that follows moves the same work with the scaled share.
    """
    cpu = prepared.cpu
    assert cpu is not None
    q = cpu.load.fetch_runq
    load = replace(cpu.load, fetch_runq=q * factor)
    fetch = np.ascontiguousarray(prepared.inputs.fetch + (factor - 1.0) * q)
    return replace(
        prepared,
        inputs=replace(prepared.inputs, fetch=fetch),
        cpu=replace(cpu, load=load, demand_s=cpu_share.node_demand(load)),
    )


def overlap_of(base: PipelineBase) -> float:
    """``runnable_overlap`` of a run as measured."""
    load = base.prepared.cpu.load  # type: ignore[union-attr]
    return runnable_overlap(base.arrays.start, base.prepared.inputs.fetch, load.fetch_cpu,
                            load.fetch_runq, selected(base))  # fmt: skip


def shared_on_a_starts(base: PipelineBase, align: str, passes: int = 3) -> PreparedPipeline:
    """A tried rule, not the model: each batch's stretch 1 + q/c scaled by its runnable overlap.

    Processor sharing says a CPU second's wall time grows with the processes runnable
    beside it. Here the aligned fetches are laid at A's start times, each batch's stretch
    is A's times (overlap aligned ÷ overlap in A), and the run-queue waits follow
    (``passes`` times, as the longer fetches overlap more). Kept as a tried alternative to
    the solved ρ*, which is closer to the re-runs in 3 of held-out 10's 4 cells (at align min
    this rule predicts far less waiting than the re-runs had).
    """
    prep = base.prepared
    load = prep.cpu.load  # type: ignore[union-attr]
    start, fetch, c, q = base.arrays.start, prep.inputs.fetch, load.fetch_cpu, load.fetch_runq
    in_a = overlap_per_batch(start, fetch, c, q)
    stretch_a = 1.0 + np.divide(q, c, out=np.zeros_like(q), where=c > 0)
    aligned, scaled = aligned_cpu(prep, POLICIES[align][0]), prep
    for _ in range(passes):
        now = aligned.cpu.load  # type: ignore[union-attr]
        overlap = overlap_per_batch(start, aligned.inputs.fetch, now.fetch_cpu, now.fetch_runq)
        share = np.maximum(stretch_a * overlap / in_a - 1.0, 0.0)
        factor = np.divide(share * c, q, out=np.ones_like(q), where=q > 0)
        scaled = scaled_runq(prep, factor)
        aligned = aligned_cpu(scaled, POLICIES[align][0])
    return scaled


def shared_on_replayed_starts(
    base: PipelineBase, align: str, passes: int = 6, damping: float = 0.5
) -> PreparedPipeline:
    """The same rule with the overlap taken from the replayed schedule (damped passes).

    Each pass replays the aligned run as the model does (``contended``: the alignment,
    the node's stretch ρ*, the trainers'), takes every fetch's replayed start, and moves
    each batch's overlap factor halfway to aligned ÷ A. Also a tried rule, not the model.
    """
    prep = base.prepared
    load = prep.cpu.load  # type: ignore[union-attr]
    c, q = load.fetch_cpu, load.fetch_runq
    in_a = overlap_per_batch(base.arrays.start, prep.inputs.fetch, c, q)
    growth = np.ones_like(c)
    policy = POLICIES[align]
    scaled = prep
    for _ in range(passes):
        factor = np.divide(np.maximum((c + q) * growth - c, 0.0), q, out=np.ones_like(q),
                           where=q > 0)  # fmt: skip
        scaled = scaled_runq(prep, factor)
        cpu = scaled.cpu
        assert cpu is not None  # the rule is the whole contention: no stretch ρ* on top
        own = replace(scaled, cpu=replace(cpu, rho_given=cpu.rho_measured))
        run, replayed = contended(own, policy, None, None)
        out = replay_pipeline(run.inputs, run.calibration, replayed, None, None, starts=True)
        now = aligned_cpu(scaled, policy[0]).cpu.load  # type: ignore[union-attr]
        overlap = overlap_per_batch(out["gpu_start_s"], run.inputs.fetch, now.fetch_cpu,
                                    now.fetch_runq)  # fmt: skip
        growth = (1.0 - damping) * growth + damping * overlap / in_a
    return scaled


def diagnose(bases: list[PipelineBase], targets: list[PipelineBase], align: str) -> dict:
    """One alignment's contention terms, and the prediction replayed at the re-runs' stretch."""
    policy = POLICIES[align]
    goal = float(np.mean([runq_share(t.prepared, selected(t)) for t in targets]))
    row: dict = {
        "align": align,
        "base_runq_per_cpu_s": float(np.mean([runq_share(b.prepared, selected(b)) for b in bases])),
        "rerun_runq_per_cpu_s": goal,
        "base_overlap": float(np.mean([overlap_of(b) for b in bases])),
        "rerun_overlap": float(np.mean([overlap_of(t) for t in targets])),
    }
    predicted, swapped, shares, tried, replayed = [], [], [], [], []
    for base in bases:
        cpu = base.prepared.cpu
        assert cpu is not None
        aligned = aligned_cpu(base.prepared, policy[0])
        before = runq_share(aligned, selected(base))
        # What the kernel replays: every CPU second of a fetch stretched from ρ_m to ρ*.
        rho = solve_contention(aligned, policy, None, None).rho
        shares.append(before + rho - cpu.rho_measured)
        rule = aligned_cpu(shared_on_a_starts(base, align), policy[0])
        tried.append(runq_share(rule, selected(base)))
        rule = aligned_cpu(shared_on_replayed_starts(base, align), policy[0])
        replayed.append(runq_share(rule, selected(base)))
        predicted.append(replay_metrics(base, policy, None, None))
        given = replace(base.prepared, cpu=replace(cpu, rho_given=cpu.rho_measured + goal - before))
        swapped.append(replay_metrics(base, policy, None, None, given))
    measured = [replay_metrics(t, ("actual", "actual"), None, None) for t in targets]
    row["predicted_runq_per_cpu_s"] = float(np.mean(shares))
    row["shared_on_a_starts_runq_per_cpu_s"] = float(np.mean(tried))
    row["shared_on_replayed_starts_runq_per_cpu_s"] = float(np.mean(replayed))
    for key in METRICS:
        row[f"{key}_measured"] = float(np.mean([m[key] for m in measured]))
        row[f"{key}_predicted"] = float(np.mean([m[key] for m in predicted]))
        row[f"{key}_rerun_stretch"] = float(np.mean([m[key] for m in swapped]))
    return row


def table(rows: list[dict]) -> str:
    """The rows as Markdown."""
    out = [
        "| alignment | q/c: A → model → re-runs | q/c, the tried rules: A's starts, replayed "
        "| runnable overlap: A → re-runs "
        "| iteration ms: measured / predicted / at the re-runs' stretch "
        "| delay ms: idem | eff. delay %: idem |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            f"{r['base_runq_per_cpu_s']:.2f} → {r['predicted_runq_per_cpu_s']:.2f} → "
            f"{r['rerun_runq_per_cpu_s']:.2f}",
            f"{r['shared_on_a_starts_runq_per_cpu_s']:.2f}, "
            f"{r['shared_on_replayed_starts_runq_per_cpu_s']:.2f}",
            f"{r['base_overlap']:.2f} → {r['rerun_overlap']:.2f}",
            *(" / ".join(f"{r[f'{k}_{side}']:.1f}" for side in SIDES) for k in METRICS),
        ]
        out.append(f"| align {r['align']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except DsimError as exc:  # a failed parse, an unreadable manifest: one line
        print(f"validation.contention: error: {exc}", file=sys.stderr)
        return exc.exit_code


def _main(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="sweep directory")
    p.add_argument("--regime", required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--repeats", type=int, help="only the first N repeats of every cell")
    p.add_argument("--jobs", type=int, default=1, help="runs `dsim parse` reads at once")
    args = p.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats must be at least 1")
    if not (args.data / MANIFEST).is_file():
        raise InputError(f"{args.data}: no {MANIFEST} (not a sweep directory)")
    cells = group_runs(load_manifest(args.data)["runs"])
    wanted = {
        c.align: runs[: args.repeats]
        for c, runs in cells.items()
        if c.regime == args.regime and c.workers == args.workers
        and c.prefetch == args.prefetch and c.start is None
    }  # fmt: skip
    if "none" not in wanted or not set(wanted) & set(POLICIES):
        print(f"{args.data}: no unaligned run and fetch-aligned re-run of "
              f"{args.regime} at {args.workers} workers", file=sys.stderr)  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        logs, traces = Path(tmp) / "logs", Path(tmp) / "traces"
        names = [name for runs in wanted.values() for name in runs]
        for name in names:
            unpack_logs(args.data / name, logs / name)
        dsim("parse", str(logs), "--out", str(traces), "--quiet", "--jobs", str(args.jobs))
        for name in names:
            (traces / name / "job.json").write_bytes((args.data / name / "job.json").read_bytes())
        runs = {a: [prepare_pipeline(traces / n) for n in ns] for a, ns in wanted.items()}
    if any(r.prepared.cpu is None for group in runs.values() for r in group):
        print(f"{args.data}: the runs carry no CPU times", file=sys.stderr)
        return 2
    rows = [diagnose(runs["none"], runs[a], a) for a in ("mean", "min") if a in runs]
    print(f"{args.data}: {args.regime}, {args.workers} workers, "
          f"{len(runs['none'])} repeats of A")  # fmt: skip
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
