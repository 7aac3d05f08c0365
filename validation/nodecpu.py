"""The node's busy CPU against what the job's logs account for, per regime, workers and alignment.

Why: the pipeline model's contention curve puts its pole where the CPU the
logs account for (each batch's builder, each worker's other threads, each
training process) fills the cores, u = C / (K T) = 1. On the 2-core VM the
saturated runs never got there: their accounted demand stays at 0.80-0.89
from 1 to 8 workers while their stretch grows 2.5 -> 4.6 (validation/README.md,
"The node's CPU and the demand's period"). This reads what the harness's rank 0
sampled (``validation.machine.NodeSamples``: the node's busy and idle CPU
seconds at each batch's arrival) and prints, over each run's steady
iterations (its first P·W and last P·W left out, as the model's T), the
accounted demand, the node's, and the part of the node's busy CPU no log
line holds: means over repeats.

    python -m validation.nodecpu --data validation/data-nodecpu
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from dsim.errors import InputError
from dsim.replay.models import cpu_share
from validation.cells import parse_run_name
from validation.machine import NODE_CPU_FILE
from validation.predict import prepare_pipeline
from validation.sweepparse import parsed_runs, run_names, table_main


def steady_rows(n: int, window: int) -> tuple[int, int]:
    """Rows [lo, hi) of a one-segment run without its start-up and drain (``window`` = P·W)."""
    lo, hi = min(window, n), max(n - window, 0)
    return (lo, hi) if hi > lo else (0, n)


def node_figures(trace_dir: Path, node: dict) -> dict[str, float] | None:
    """One run's accounted and node demand (fractions of its cores), unaccounted share, ρ_m."""
    base = prepare_pipeline(trace_dir)
    prepared = base.prepared
    cpu = prepared.cpu
    rows = np.asarray(node["rows"], dtype=np.float64)
    if cpu is None or len(rows) < 3:
        return None  # the sleep regimes log no CPU times the model reads; a run too short
    n = prepared.inputs.fetch.shape[0]
    if len(rows) != n + 1:  # one sample per iteration and one at the end, or not usable
        return None
    if len(prepared.inputs.segments) != 1:  # the steady window below is one segment's
        return None
    c = prepared.calibration
    lo, hi = steady_rows(n, max(c.workers * c.prefetch, 1))
    wall = rows[hi, 1] - rows[lo, 1]
    busy = rows[hi, 2] - rows[lo, 2]
    accounted = cpu_share.node_demand(cpu.load.take(lo, hi)) * (hi - lo)
    cores = cpu.load.cores
    return {
        "u_logs": accounted / (cores * wall),
        "u_node": busy / (cores * wall),
        "unseen": 1.0 - accounted / busy if busy > 0 else float("nan"),
        "rho": cpu.rho_measured,
        "t_ms": wall / (hi - lo) * 1e3,
        "t_model_ms": cpu.measured_iteration_s * 1e3,
        "u_model": cpu.demand_s / (cores * cpu.measured_iteration_s),
    }


def read_samples(path: Path) -> dict:
    """A run's node_cpu.json, or one line saying why it cannot be read (exit 3)."""
    try:
        node = json.loads(path.read_text())
        rows = node["rows"]
        np.asarray(rows, dtype=np.float64).reshape(-1, 4)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not the harness's node samples ({exc})") from None
    return node


def spread(runs: list[dict[str, float]], key: str, scale: float = 1.0, digits: int = 3) -> str:
    """``mean ± sd`` of one figure over a cell's repeats (sd 0 for a single run)."""
    values = np.array([r[key] for r in runs]) * scale
    sd = values.std(ddof=1) if len(values) > 1 else 0.0
    return f"{values.mean():.{digits}f} ± {sd:.{digits}f}"


def table(data: Path, only: str | None = None) -> str:
    """The markdown table of every (regime, workers, alignment) cell whose runs sampled the node."""
    names = run_names(data, only)
    sampled = [n for n in names if (data / n / NODE_CPU_FILE).is_file()]
    cells: dict[tuple[str, int, str], list[dict[str, float]]] = defaultdict(list)
    if sampled or not names:  # no name at all: parsed_runs says so in one line
        with parsed_runs(data, sampled) as traces:
            for name in sampled:
                cell = parse_run_name(name).cell
                node = read_samples(data / name / NODE_CPU_FILE)
                found = node_figures(traces / name, node)
                if found is not None:
                    key = cell.align if cell.start is None else f"start {cell.start}"
                    cells[(cell.regime, cell.workers, key)].append(found)
    lines = [
        "| regime | workers | alignment | runs | wall ms per iteration | the model's T_m, ms "
        "| the model's u_m | accounted demand u | node's busy share | busy CPU no log holds "
        "| stretch ρ_m |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (regime, workers, align), runs in sorted(cells.items()):
        columns = [spread(runs, "t_ms", digits=1), spread(runs, "t_model_ms", digits=1)]
        columns += [spread(runs, key) for key in ("u_model", "u_logs", "u_node")]
        columns += [spread(runs, "unseen", 100, 1) + " %", spread(runs, "rho", digits=2)]
        lines.append(
            f"| {regime} | {workers} | {align} | {len(runs)} | " + " | ".join(columns) + " |"
        )
    if len(lines) == 2:
        lines.append("(no run here sampled the node's CPU with CPU times in its logs)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return table_main("python -m validation.nodecpu", __doc__, table, argv)


if __name__ == "__main__":
    sys.exit(main())
