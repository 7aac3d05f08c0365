"""Compute after the last arrival: when the ranks' batches arrive together, and when not.

Why: the pipeline model carries each iteration's time after the last rank's
batch arrived (``after``: compute, all-reduce, optimizer step) over from the
measured run into its what-ifs. In a loader-bound run one rank's batch comes
last by many milliseconds, so ``after`` is that rank's own compute; in a
what-if whose loaders keep up, every rank's batch is there at once and the
iteration ends with the slowest rank's compute. On the 16-core sweep's
decode regime the swaps of FIDELITY.md put most of the more-worker cells'
error (-17 to -26 %) in ``after``, which grew from 10.8 to 12.0-13.5 ms in the
re-runs (validation/README.md, "Compute after the last arrival").

Per run without alignment (base runs): the selected iterations (every epoch
but the first, past the warm-up) split by how far apart the ranks' batches
arrived (the spread of the arrivals over ranks), and per group the mean of
the iteration's end less its last arrival; the mean over every selected
iteration of the training processes' CPU time and run-queue wait per
iteration (where logged); and, from the iterations whose arrivals were
spread by 10 ms or more (one rank's own compute each), what the slowest of
G ranks would take if each drew its compute from them independently (a
bootstrap of the max of G draws, seed 0): how much of a simultaneous
arrival's longer ``after`` order statistics alone explain.

    python -m validation.aftersync --data validation/data-h200cpu --only '^decode_w[148]_p2_none'
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from validation.cells import parse_run_name
from validation.gate import selected
from validation.predict import prepare_pipeline
from validation.sweepparse import parsed_runs, run_names, table_main

#: Arrival spreads (seconds) the iterations are grouped by: together, a few ms, apart.
BINS = ((0.0, 0.002, "< 2 ms"), (0.002, 0.010, "2-10 ms"), (0.010, np.inf, ">= 10 ms"))
DRAWS = 20_000


def after_by_spread(trace: Path) -> dict[str, object]:
    """The figures of one parsed run (see the module docstring)."""
    base = prepare_pipeline(trace)
    a, inputs = base.arrays, base.prepared.inputs
    mask = selected(a.epoch, a.iteration)
    arrival, stall = inputs.arrival[mask], inputs.stall[mask]
    end = (arrival - stall + inputs.iteration_time[mask]).max(axis=1)
    after = end - arrival.max(axis=1)
    spread = arrival.max(axis=1) - arrival.min(axis=1)
    out: dict[str, object] = {"ranks": arrival.shape[1], "groups": {}}
    for lo, hi, label in BINS:
        rows = (spread >= lo) & (spread < hi)
        out["groups"][label] = (int(rows.sum()), float(after[rows].mean()) if rows.any() else None)
    apart = after[spread >= 0.010]
    out["max_of_ranks"] = None
    if len(apart) >= 10:
        draws = np.random.default_rng(0).choice(apart, size=(DRAWS, arrival.shape[1]))
        out["max_of_ranks"] = float(draws.max(axis=1).mean())
    load = base.prepared.cpu.load if base.prepared.cpu is not None else None
    out["trainer_cpu"] = out["trainer_runq"] = None
    if load is not None:
        out["trainer_cpu"] = float(np.nanmean(load.train_cpu[mask]))
        runq = getattr(load, "train_runq", None)
        out["trainer_runq"] = None if runq is None else float(np.nanmean(runq[mask]))
    return out


def table(data: Path, only: str | None = None) -> str:
    """The markdown table of the base runs of ``data`` (no fetch or start alignment)."""
    names = [
        n
        for n in run_names(data, only)
        if parse_run_name(n).cell.align == "none" and parse_run_name(n).cell.start is None
    ]
    lines = [
        "| run | after, arrivals < 2 ms apart (n) | 2-10 ms (n) | >= 10 ms (n) "
        "| max of G draws from the >= 10 ms ones | trainer CPU ms per iteration "
        "| its run-queue ms |",
        "|---|---|---|---|---|---|---|",
    ]
    with parsed_runs(data, names) as traces:
        for name in names:
            f = after_by_spread(traces / name)
            cells = [
                "—" if mean is None else f"{mean * 1e3:.2f} ({n})"
                for n, mean in f["groups"].values()
            ]
            lines.append(
                f"| {name} | {' | '.join(cells)} | {_ms(f['max_of_ranks'])} "
                f"| {_ms(f['trainer_cpu'])} | {_ms(f['trainer_runq'])} |"
            )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "—" if value is None or not np.isfinite(value) else f"{value * 1e3:.2f}"


def main(argv: list[str] | None = None) -> int:
    return table_main("python -m validation.aftersync", __doc__, table, argv)


if __name__ == "__main__":
    sys.exit(main())
