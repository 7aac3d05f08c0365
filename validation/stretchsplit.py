"""Who waits for a core: the workers' stretch and the training processes', and what each costs.

Why: the pipeline model gives every CPU second on a node one stretch ρ (wall
seconds per CPU second, SPEC §4.2). Split by class, the unaligned runs of the
sweeps with 1-8 workers show the training processes' stretch flattening from
4 workers while the workers' keeps growing (validation/README.md, "The node's
CPU and the demand's period"). This prints, per regime and worker count of a
sweep (means over repeats), both stretches and the contention curve's
coefficient a as each run calibrates it (SPEC §4.2); and for every pair of worker
counts, a base run of the first replayed with the second's workers at the
second's measured stretch, one for all against each class its own (the
workers' to the fetches, the training processes' to the time after the last
arrival; no drain passes), as the error against the second's measured mean
iteration time.

    python -m validation.stretchsplit --data validation/data-holdout
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from dsim.replay.models import cpu_share
from dsim.replay.models.pipeline import PreparedPipeline, _mean_iteration, _stretched, rebodied
from validation.cells import parse_run_name, unaligned
from validation.predict import PipelineBase, prepare_pipeline
from validation.sweepparse import parsed_runs, run_names, table_main

ACTUAL = ("actual", "actual")


def class_stretches(base: PipelineBase) -> tuple[float, float] | None:
    """(workers', training processes') stretch of one run: 1 + run-queue wait / CPU time."""
    cpu = base.prepared.cpu
    return None if cpu is None else cpu_share.class_stretches(cpu.load)


def replayed_at(base: PipelineBase, workers: int, fetch_rho: float, train_rho: float) -> float:
    """The base run's steady mean iteration time (s) with ``workers`` at the given stretches.

    The stretches given are measured ones, each its class's, so the fetches take
    ``fetch_rho`` as it is: the model's mapping of a pooled stretch onto the
    workers' class (``CpuState.fetch_rho``) is left out.
    """
    prepared = rebodied(base.prepared, workers, None)
    cpu = prepared.cpu
    if cpu is not None:
        prepared = PreparedPipeline(
            prepared.inputs, prepared.calibration, replace(cpu, fetch_rho=None)
        )
    n, g = prepared.inputs.fetch.shape
    trainer = np.full((n, g), float(train_rho))
    return _mean_iteration(_stretched(prepared, fetch_rho, trainer), ACTUAL, workers, None)


def table(data: Path, only: str | None = None) -> str:
    """Two markdown tables: the stretches per (regime, workers), the replays per pair."""
    names = [n for n in run_names(data, only) if unaligned(n)]
    runs: dict[tuple[str, int], list[PipelineBase]] = defaultdict(list)
    with parsed_runs(data, names) as traces:
        for name in names:
            cell = parse_run_name(name).cell
            base = prepare_pipeline(traces / name)
            if class_stretches(base) is not None:
                runs[(cell.regime, cell.workers)].append(base)
    lines = [
        "| regime | workers | runs | stretch of the workers' fetches | of the training processes "
        "| one stretch (ρ_m) | the curve's coefficient a |",
        "|---|---|---|---|---|---|---|",
    ]
    measured = {}
    for (regime, workers), bases in sorted(runs.items()):
        split = np.array([class_stretches(b) for b in bases])
        rho = float(np.mean([b.prepared.cpu.rho_measured for b in bases]))
        t = float(np.mean([b.prepared.cpu.measured_iteration_s for b in bases]))
        a = float(np.mean([b.prepared.cpu.a for b in bases]))
        measured[(regime, workers)] = (split[:, 0].mean(), split[:, 1].mean(), rho, t)
        lines.append(
            f"| {regime} | {workers} | {len(bases)} | {split[:, 0].mean():.2f} "
            f"| {split[:, 1].mean():.2f} | {rho:.2f} | {a:.3f} |"
        )
    if len(lines) == 2:
        return "(no unaligned run here logs CPU times and run-queue waits)"
    lines += [
        "",
        "| regime | workers | measured ms | replayed at one stretch | each class its own |",
        "|---|---|---|---|---|",
    ]
    for (regime, w_base), bases in sorted(runs.items()):
        for (other, w_target), (fetch_rho, train_rho, rho, t) in sorted(measured.items()):
            if other != regime or w_target == w_base:
                continue
            one = np.mean([replayed_at(b, w_target, rho, rho) for b in bases])
            own = np.mean([replayed_at(b, w_target, fetch_rho, train_rho) for b in bases])
            lines.append(
                f"| {regime} | {w_base} → {w_target} | {t * 1e3:.1f} "
                f"| {(one / t - 1) * 100:+.1f} % | {(own / t - 1) * 100:+.1f} % |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return table_main("python -m validation.stretchsplit", __doc__, table, argv)


if __name__ == "__main__":
    sys.exit(main())
