"""Which rank gates the iterations under fetch alignment: measured against predicted.

Why: on the second 16-core sweep (validation/README.md, "The twenty-first
held-out sweep") the pipeline model predicted the cpu regime's fetch
alignments 18-33 % too slow. In the re-runs one rank kept the largest stall
in almost every iteration, its worker busy at the hand-over (a batch built
ahead waits for a worker that holds the GIL), the others idle; the replay
spread the busy hand-overs over every rank, and the largest of four stalls
came out longer. The replay now waits for the batch being built (SPEC §4.2)
and reproduces the gate. The ranks' CPU seconds per unit of work also
differ by up to 18 % in one run, and which rank is slowest changes from run
to run, so the gate is not a property of the rank's cost.

Per fetch-alignment cell (mean over its repeats): the *gate share*, the
share of the selected iterations in which the rank that most often had the
largest stall had it (1/G: no rank stands out; 1: one rank gates every
iteration), in the re-runs and in the pipeline model's prediction from every
repeat of the base cell A(W); for the cpu regime, the CPU seconds each unit
of the harness's cost table took (the work it asked for, calibrated on the
idle machine at the sweep's start), their mean and the slowest rank's over
the fastest's (re-runs); and the mean iteration time of both. The base cells
are listed too (their own gate).

    python -m validation.gate --data validation/data-h200cpu2 --only '^cpu_w[12]_'
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from dsim.analysis.summary import DEFAULT_WARMUP
from dsim.model.selection import default_epochs, selection_mask
from dsim.replay.params import ReplayParams
from validation.cells import Cell, parse_run_name
from validation.predict import PipelineBase, prepare_pipeline
from validation.regimes import REGIMES, align_table, cost_table
from validation.sweepparse import parsed_runs, run_names, table_main

POLICY = {"none": ("actual", "actual"), "min": ("min", "actual"), "mean": ("avg", "actual")}


def selected(epoch: np.ndarray, iteration: np.ndarray) -> np.ndarray:
    """The iterations the metrics read (validation.metrics: every epoch but the first, past
    the warm-up)."""
    return selection_mask(
        epoch, iteration, default_epochs(np.unique(epoch).tolist()), DEFAULT_WARMUP
    )


def gate_share(epoch: np.ndarray, iteration: np.ndarray, stall: np.ndarray) -> float:
    """Share of the selected iterations whose largest stall was the most frequent gate's."""
    mask = selected(epoch, iteration)
    counts = np.bincount(np.argmax(stall[mask], axis=1), minlength=stall.shape[1])
    return float(counts.max() / max(mask.sum(), 1))


def cpu_per_unit(base: PipelineBase, job: dict, align: str) -> tuple[float, float]:
    """(mean, slowest rank's over fastest's) CPU seconds per second of the cost table's work.

    The cost table is the work the harness asked for, calibrated on the idle machine at the
    sweep's start: a mean above 1 is the machine slower than then (or the work slower under
    load), the same for every what-if only where its runs were interleaved with their base's.
    """
    cpu = base.prepared.cpu
    regime = REGIMES.get(job["regime"]["name"])
    if cpu is None or regime is None or regime.kind != "cpu":
        return float("nan"), float("nan")  # no CPU times, or not the cost table's spin
    a = base.arrays
    table = align_table(
        cost_table(regime, job["epochs"], job["iterations"], job["ranks"], job["seed"]), align
    )
    epochs = a.epoch - a.epoch.min()
    cost = table[epochs, a.iteration]
    mask = selected(a.epoch, a.iteration)
    ratio = cpu.load.fetch_cpu[mask] / cost[mask]
    per_rank = np.nanmean(ratio, axis=0)
    return float(np.nanmean(ratio)), float(per_rank.max() / per_rank.min())


def measure(base: PipelineBase, policy: tuple[str, str]) -> tuple[float, float]:
    """(gate share, mean iteration ms) of the pipeline model's replay under ``policy``."""
    a = base.arrays
    out = base.model.replay(base.prepared, policy, ReplayParams())
    mask = selected(a.epoch, a.iteration)
    return gate_share(a.epoch, a.iteration, out.gpu_stall_s), float(
        out.iteration_s[mask].mean()
    ) * 1e3


def table(data: Path, only: str | None = None) -> str:
    """The markdown table of the fetch-alignment cells of ``data`` and their base cells."""
    names = [n for n in run_names(data, only) if parse_run_name(n).cell.start is None]
    cells: dict[Cell, list[str]] = defaultdict(list)
    for name in names:
        cells[parse_run_name(name).cell].append(name)
    rows = []
    with parsed_runs(data, names) as traces:
        bases = {n: prepare_pipeline(traces / n) for n in names}
        for cell, runs in sorted(cells.items(), key=lambda kv: (kv[0].regime, kv[0].workers)):
            base_cell = Cell(cell.regime, cell.workers, cell.prefetch, "none")
            measured = [measure(bases[r], POLICY["none"]) for r in runs]
            speed = [cpu_per_unit(bases[r], _job(data, r), cell.align) for r in runs]
            predicted = [measure(bases[b], POLICY[cell.align]) for b in cells.get(base_cell, [])]
            rows.append((cell, measured, predicted, speed))
    lines = [
        "| cell | repeats | gate share: re-runs | predicted from A | CPU s per unit of work "
        "| its slowest rank / fastest | iteration ms: re-runs | predicted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell, measured, predicted, speed in rows:
        lines.append(
            f"| {cell.label} | {len(measured)} | {_mean(measured, 0, '.0%')} "
            f"| {_mean(predicted, 0, '.0%') if cell.align != 'none' else '—'} "
            f"| {_mean(speed, 0, '.2f')} | {_mean(speed, 1, '.2f')} | {_mean(measured, 1, '.2f')} "
            f"| {_mean(predicted, 1, '.2f') if cell.align != 'none' else '—'} |"
        )
    return "\n".join(lines)


def _job(data: Path, run: str) -> dict:
    return json.loads((data / run / "job.json").read_text())


def _mean(values: list[tuple[float, ...]], i: int, fmt: str) -> str:
    finite = [v[i] for v in values if np.isfinite(v[i])]
    return format(float(np.mean(finite)), fmt) if finite else "—"


def main(argv: list[str] | None = None) -> int:
    return table_main("python -m validation.gate", __doc__, table, argv)


if __name__ == "__main__":
    sys.exit(main())
