"""How long a built batch waited to be handed over, by whether its worker was busy.

Why: on 16 cores the cpu regime's worker what-ifs missed by up to +136 %
because a batch that was ready before the loop asked still took 13-15 ms to
reach it when its worker was building the next batch in Python code that
holds the GIL (SPEC §4.2, "The busy worker's hand-over"). This prints, per
cell of a sweep without start alignment (mean over its repeats), the pipeline
model's own calibration of that, for a fetch-aligned re-run as measured: the
share of ready batches whose worker was busy when the loop asked, their mean
stall, the idle ones' mean stall, the busy extra the model keeps (0 where
it does not stand out of the noise), and for the busy ones the time their
worker still needed for the batch it was building, the correlation of their
stall with it and the median of the stall beyond it (SPEC §4.2, "Waiting for
the batch being built": where the worker holds the GIL for its whole batch,
r ≈ 1 and the stall is that time plus about 1.5 ms).

    python -m validation.handover --data validation/data-h200cpu
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from dsim.replay.models.pipeline import busy_time_left, ready_batches
from validation.cells import parse_run_name
from validation.predict import prepare_pipeline
from validation.sweepparse import parsed_runs, run_names, table_main


def split(trace_dir: Path) -> dict[str, float]:
    """One parsed run's ready batches (start-up rows left out), split by the busy flag."""
    prepared = prepare_pipeline(trace_dir).prepared
    i, c = prepared.inputs, prepared.calibration
    assert c.busy is not None and c.busy_excess is not None
    ready = ready_batches(prepared)
    busy = ready & (c.busy > 0)
    idle = ready & (c.busy == 0)
    ms = 1e3
    left, stall = busy_time_left(prepared)[busy], i.stall[busy]
    spread = busy.sum() > 2 and np.ptp(left) > 0 and np.ptp(stall) > 0
    return {
        "busy_share": float(busy.sum() / max(ready.sum(), 1)),
        "busy_ms": float(stall.mean() * ms) if busy.any() else float("nan"),
        "idle_ms": float(i.stall[idle].mean() * ms) if idle.any() else float("nan"),
        "extra_ms": float(np.mean(c.busy_excess) * ms),
        "left_ms": float(left.mean() * ms) if busy.any() else float("nan"),
        "r": float(np.corrcoef(stall, left)[0, 1]) if spread else float("nan"),
        "beyond_ms": float(np.median(stall - left) * ms) if busy.any() else float("nan"),
    }


def table(data: Path, only: str | None = None) -> str:
    """The markdown table of every cell without start alignment of the sweep in ``data``
    (of the runs whose names match ``only``, a regular expression, where given): the base
    cells (fetch alignment none), and the fetch-aligned re-runs, calibrated as measured."""
    names = [n for n in run_names(data, only) if parse_run_name(n).cell.start is None]
    cells: dict[tuple[str, int, str], list[dict[str, float]]] = defaultdict(list)
    with parsed_runs(data, names) as traces:
        for name in names:
            cell = parse_run_name(name).cell
            cells[(cell.regime, cell.workers, cell.align)].append(split(traces / name))
    lines = [
        "| regime | workers | fetch alignment | ready batches whose worker was busy "
        "| busy: mean stall ms | idle: mean stall ms | busy extra the model keeps, ms "
        "| busy: time left on the batch being built, ms | r (stall, time left) "
        "| stall beyond the time left, median ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {"none": 0, "min": 1, "mean": 2}
    for (regime, workers, align), runs in sorted(
        cells.items(), key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][2], 3))
    ):

        def mean(key: str, runs: list[dict[str, float]] = runs) -> str:
            values = [r[key] for r in runs if np.isfinite(r[key])]
            if not values:
                return "—"  # no ready batch of that kind in any repeat
            return f"{np.mean(values):.0%}" if key == "busy_share" else f"{np.mean(values):.2f}"

        lines.append(
            f"| {regime} | {workers} | {align} | {mean('busy_share')} | {mean('busy_ms')} "
            f"| {mean('idle_ms')} | {mean('extra_ms')} | {mean('left_ms')} | {mean('r')} "
            f"| {mean('beyond_ms')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return table_main("python -m validation.handover", __doc__, table, argv)


if __name__ == "__main__":
    sys.exit(main())
