"""Which rank's work an aligned-to-min batch gets: the fastest fetch's, or the least work's.

Why: the cpu regime's align-min cells at 2 workers are predicted too slow on
every committed sweep, and the CPU time per aligned batch carries half of it
(validation/README.md, "Align min to the least work, not the least
contended"). Under ``min`` the pipeline model gives every rank the CPU time
of the rank whose fetch of that batch was fastest (SPEC §4.2); a fetch's wall
time holds its run-queue wait, so the fastest fetch may be the least
contended one rather than the cheapest batch. This prints, per regime and
worker count of a sweep (means over repeats), the re-runs' measured CPU time
per batch beside the two choices made from the base runs: the fastest
fetch's (the model's) and the least work's (CPU time plus other waiting, the
fetch less its run-queue wait); and, as the yardstick for both, the base
run's own CPU time of the batch its cost table made cheapest.

    python -m validation.alignedwork --data validation/data-holdout10
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from validation.cells import parse_run_name
from validation.manifest import load_manifest
from validation.predict import prepare_pipeline
from validation.regimes import Regime, cost_table
from validation.sweepparse import parsed_runs, run_names, table_main

MS = 1e3


def run_costs(entry: dict) -> np.ndarray:
    """The run's cost table as its job drew it (``[epoch, batch, rank]`` seconds, unaligned)."""
    regime = Regime(**entry["regime_numbers"])
    return cost_table(regime, entry["epochs"], entry["iterations"], entry["ranks"], entry["seed"])


def choices(trace_dir: Path, costs: np.ndarray) -> dict[str, float] | None:
    """One parsed run's mean CPU time per batch (ms), and that of each aligned choice.

    ``cheapest``: the CPU time, measured in this run, of the rank whose batch the cost
    table made cheapest, the batch the harness's align-min re-run gives every rank. It is
    what a choice made from the logs alone should find; measured in the same run, it
    leaves out how fast the machine ran from one run to the next.
    """
    base = prepare_pipeline(trace_dir)
    prepared = base.prepared
    if prepared.cpu is None:
        return None  # the sleep regimes, or logs from before the CPU fields: nothing to align
    load = prepared.cpu.load
    c, q, fetch = load.fetch_cpu, load.fetch_runq, prepared.inputs.fetch
    other = np.maximum(fetch - c - q, 0.0)
    rows = np.arange(len(c))
    batch = costs[np.asarray(base.arrays.epoch), np.asarray(base.arrays.iteration)]
    return {
        "mean": float(c.mean() * MS),
        "fastest": float(c[rows, np.argmin(fetch, axis=1)].mean() * MS),
        "least": float(c[rows, np.argmin(c + other, axis=1)].mean() * MS),
        "cheapest": float(c[rows, np.argmin(batch, axis=1)].mean() * MS),
    }


def table(data: Path, only: str | None = None) -> str:
    """The markdown table of every (regime, workers) with unaligned base runs and align-min
    re-runs in ``data`` (of the runs whose names match ``only``, a regular expression)."""
    entries = load_manifest(data)["runs"]
    wanted = {}
    for name in run_names(data, only):
        cell = parse_run_name(name).cell
        if cell.start is None and cell.align in ("none", "min"):
            wanted[name] = cell
    runs: dict[tuple[str, int, str], list[dict[str, float]]] = defaultdict(list)
    with parsed_runs(data, list(wanted)) as traces:
        for name, cell in wanted.items():
            found = choices(traces / name, run_costs(entries[name]))
            if found is not None:
                runs[(cell.regime, cell.workers, cell.align)].append(found)
    lines = [
        "| regime | workers | re-runs (align min): CPU ms per batch | base: the fastest "
        "fetch's (the model's) | base: the least work's | base: the cheapest batch's |",
        "|---|---|---|---|---|---|",
    ]
    for (regime, workers, align), base in sorted(runs.items()):
        rerun = runs.get((regime, workers, "min"))
        if align != "none" or not rerun:
            continue

        def mean(key: str, of: list[dict[str, float]]) -> str:
            return f"{np.mean([r[key] for r in of]):.2f}"

        lines.append(
            f"| {regime} | {workers} | {mean('mean', rerun)} | {mean('fastest', base)} "
            f"| {mean('least', base)} | {mean('cheapest', base)} |"
        )
    if len(lines) == 2:
        lines.append("(no regime with CPU times, unaligned runs and align-min re-runs here)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return table_main("python -m validation.alignedwork", __doc__, table, argv)


if __name__ == "__main__":
    sys.exit(main())
