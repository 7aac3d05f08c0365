"""Where a fewer-worker what-if's error sits: the measured run's start-up rows, or the rest.

Why: a run with W_m workers and prefetch P_m builds the first m = P_m·W_m
batches of an epoch at once when its iterator is created, and the pipeline
model's calibration of those rows carries that start-up (the worker
processes' own start before their first fetch, the run-queue wait of every
rank's workers starting together). A what-if with a shorter window P·W < m
builds rows P·W … m − 1 one after another, in its body (validation/README.md,
"The measured start-up in a what-if's body"). This prints, per regime and
pair of worker counts of a sweep's unaligned runs (W_m > W, the base's
prefetch), the mean iteration time of the measured re-runs and of the
pipeline model's prediction (means over repeats and base runs) over the
rows the harness's metrics select (``validation.metrics``: iterations past
the warm-up) split at m: those before it, where the base run was starting
up, and those after; and the error of the whole selection, as FIDELITY.md
states it.

    python -m validation.startuprows --data validation/data-cpu --only '^cpu'
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from dsim.analysis.summary import DEFAULT_WARMUP
from dsim.model.selection import default_epochs, selection_mask
from dsim.replay.params import ReplayParams
from validation.cells import parse_run_name, unaligned
from validation.predict import PipelineBase, prepare_pipeline
from validation.sweepparse import parsed_runs, run_names, table_main

ACTUAL = ("actual", "actual")


def split_means(base: PipelineBase, times: np.ndarray, edge: int) -> tuple[float, float, float]:
    """(rows before ``edge``, rows from it, all) mean iteration ms over the selected rows."""
    a = base.arrays
    epochs = default_epochs(np.unique(a.epoch).tolist())
    selected = selection_mask(a.epoch, a.iteration, epochs, DEFAULT_WARMUP)
    early = selected & (a.iteration < edge)
    late = selected & (a.iteration >= edge)

    def mean(mask: np.ndarray) -> float:
        return float(times[mask].mean()) * 1e3 if mask.any() else float("nan")

    return mean(early), mean(late), mean(selected)


def table(data: Path, only: str | None = None) -> str:
    """The markdown table of every fewer-worker pair of the sweep's unaligned runs."""
    names = [n for n in run_names(data, only) if unaligned(n)]
    runs: dict[tuple[str, int, int], list[PipelineBase]] = defaultdict(list)
    with parsed_runs(data, names) as traces:
        for name in names:
            cell = parse_run_name(name).cell
            runs[(cell.regime, cell.workers, cell.prefetch)].append(prepare_pipeline(traces / name))
    lines = [
        "| regime | workers | base start-up m | measured ms: rows < m / ≥ m | predicted ms: "
        "rows < m / ≥ m | error of the mean |",
        "|---|---|---|---|---|---|",
    ]
    for (regime, w_base, prefetch), bases in sorted(runs.items()):
        edge = w_base * prefetch
        for (other, w_target, p_target), targets in sorted(runs.items()):
            if other != regime or p_target != prefetch or w_target >= w_base:
                continue
            measured = np.array([split_means(t, _replayed(t, None), edge) for t in targets]).mean(
                axis=0
            )
            predicted = np.array(
                [split_means(b, _replayed(b, w_target), edge) for b in bases]
            ).mean(axis=0)
            error = (predicted[2] / measured[2] - 1) * 100
            lines.append(
                f"| {regime} | {w_base} → {w_target} | {edge} "
                f"| {_ms(measured[0])} / {_ms(measured[1])} "
                f"| {_ms(predicted[0])} / {_ms(predicted[1])} | {error:+.1f} % |"
            )
    if len(lines) == 2:
        return "(no fewer-worker pair of unaligned runs here)"
    return "\n".join(lines)


def _ms(value: float) -> str:
    """A mean in ms, or a dash where no selected row falls on that side (m within the warm-up)."""
    return "—" if np.isnan(value) else f"{value:.1f}"


def _replayed(base: PipelineBase, workers: int | None) -> np.ndarray:
    """Iteration times (s) of the pipeline model's replay: as measured where ``workers`` is
    None (the identity), else the what-if of that many workers."""
    return base.model.replay(base.prepared, ACTUAL, ReplayParams(workers=workers)).iteration_s


def main(argv: list[str] | None = None) -> int:
    return table_main("python -m validation.startuprows", __doc__, table, argv)


if __name__ == "__main__":
    sys.exit(main())
