"""A batch's CPU time against the worker count, across runs and within one run.

Why: the pipeline model takes each batch's CPU time from the run it calibrates
on as the work that batch costs under any what-if, and stretches only its wall
time by the contention it solves for. The term swaps (FIDELITY.md, "Why it
misses") find the decode regime's worker what-ifs missing by that CPU time:
the same batches cost more CPU seconds with more workers. This prints, per
regime with CPU times and per worker count (runs without alignment), the mean
CPU time per batch over the cell's repeats, its ratio to the fewest-worker
cell's, the measured stretch ρ_m, the batches' run-queue wait per CPU second
(how much a batch took turns on a core: ``timeslice.py`` measures what turns
cost a decode), and, within each run, the correlation of a
batch's CPU time with the fetches in flight beside it: were that correlation
clearly positive, one run could calibrate the growth; it is not.

    python -m validation.cpugrowth --data validation/data-holdout19
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from validation.cells import parse_run_name
from validation.nodecpu import spread
from validation.predict import prepare_pipeline
from validation.sweepparse import parsed_runs, run_names, table_main

#: Iterations <= this of each epoch are the start-up, left out as in the summaries.
WARMUP = 10


def in_flight(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each interval, the other intervals' mean number in flight during it: their
    overlap with it over its length (0 for an interval of no length)."""
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    overlap = np.minimum(end[:, None], end[None, :]) - np.maximum(start[:, None], start[None, :])
    np.fill_diagonal(overlap, 0.0)
    length = end - start
    total = np.clip(overlap, 0.0, None).sum(axis=1)
    return np.divide(total, length, out=np.zeros_like(total), where=length > 0)


def run_figures(trace_dir: Path) -> dict[str, float] | None:
    """One run's mean CPU ms per batch, its ρ_m, and the within-run correlation of a
    batch's CPU time with the fetches in flight beside it; ``None`` without CPU times."""
    fetch = pq.read_table(trace_dir / "fetch.parquet").to_pandas()
    if "cpu_s" not in fetch or fetch["cpu_s"].isna().all():
        return None
    cpu = prepare_pipeline(trace_dir).prepared.cpu
    if cpu is None:
        return None
    start = fetch["start"].astype("int64").to_numpy() / 1e9
    end = fetch["end"].astype("int64").to_numpy() / 1e9
    beside = in_flight(start, end)
    keep = (fetch["iteration"].to_numpy() > WARMUP) & fetch["cpu_s"].notna().to_numpy()
    work = fetch["cpu_s"].to_numpy()[keep] * 1e3
    flight = beside[keep]
    corr = float(np.corrcoef(flight, work)[0, 1]) if flight.std() > 0 else float("nan")
    wait = float("nan")
    if "runq_s" in fetch and fetch["runq_s"].notna().to_numpy()[keep].all() and work.sum() > 0:
        wait = float(fetch["runq_s"].to_numpy()[keep].sum() * 1e3 / work.sum())
    return {
        "cpu_ms": float(work.mean()),
        "rho": float(cpu.rho_measured),
        "wait": wait,
        "corr": corr,
    }


def table(data: Path, only: str | None = None) -> str:
    """The markdown table of every (regime, workers) cell without alignment."""
    names = [n for n in run_names(data, only) if _plain(n)]
    cells: dict[tuple[str, int], list[dict[str, float]]] = defaultdict(list)
    with parsed_runs(data, names) as traces:
        for name in names:
            found = run_figures(traces / name)
            if found is not None:
                cell = parse_run_name(name).cell
                cells[(cell.regime, cell.workers)].append(found)
    lines = [
        "| regime | workers | runs | CPU ms per batch | / fewest workers' | stretch ρ_m "
        "| batches' run-queue wait per CPU second "
        "| within a run: corr(CPU time, fetches in flight) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fewest: dict[str, float] = {}
    for (regime, workers), runs in sorted(cells.items()):
        mean = float(np.mean([r["cpu_ms"] for r in runs]))
        fewest.setdefault(regime, mean)
        lines.append(
            f"| {regime} | {workers} | {len(runs)} | {spread(runs, 'cpu_ms', digits=2)} "
            f"| {mean / fewest[regime]:.3f} | {spread(runs, 'rho', digits=2)} "
            f"| {spread(runs, 'wait', digits=2)} | {spread(runs, 'corr', digits=2)} |"
        )
    if len(lines) == 2:
        lines.append("(no run here without alignment has CPU times in its logs)")
    return "\n".join(lines)


def _plain(name: str) -> bool:
    try:
        cell = parse_run_name(name).cell
    except ValueError:
        return False
    return cell.align == "none" and cell.start is None


def main(argv: list[str] | None = None) -> int:
    return table_main("python -m validation.cpugrowth", __doc__, table, argv)


if __name__ == "__main__":
    sys.exit(main())
