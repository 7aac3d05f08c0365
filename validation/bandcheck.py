"""The bands' coverage on sweeps they were not taken from: leave one sweep out.

Why: each band dsim states (``dsim.analysis.model_error``) is the 95th
percentile of the pipeline model's absolute error over the committed sweeps'
cells of its kind, so every sweep's cells are covered by a band their own
errors helped set. How often would the band cover a sweep it had not seen?
For each committed comparison (``sweepnode.committed_comparisons``) and each
kind of what-if, the percentile is taken again without that sweep and its
cells are judged against it: pooled over every other sweep (the bands until
2026-12-07), and over the other sweeps run on the same kind of node (at most
``FEW_CORES_PER_RANK`` cores per rank, or more: the bands since). The cells
are those the tests recompute the constants from: fetch and start alignment
(``kind`` align or start), more workers or another prefetch (``target_loader_pipeline``
set) and fewer workers (``target_fewer_pipeline`` set); the error is
``iteration_ms_err_pipeline``, in %.

    python -m validation.bandcheck
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from dsim.analysis.model_error import FEW_CORES_PER_RANK
from validation.sweepnode import committed_comparisons, cores_per_rank, sweep_directory

KINDS = ("alignment", "loader", "fewer workers")
PERCENTILE = 95.0


def _cells(table: pd.DataFrame, kind: str) -> pd.Series:
    """The absolute errors (%) of one kind of what-if in one comparison."""
    if "iteration_ms_err_pipeline" not in table:
        return pd.Series(dtype=float)
    if kind == "alignment":
        chosen = table["kind"].isin(["align", "start"]) if "kind" in table else None
    else:
        column = "target_loader_pipeline" if kind == "loader" else "target_fewer_pipeline"
        chosen = table[column].notna() if column in table else None
    if chosen is None:
        return pd.Series(dtype=float)
    return table.loc[chosen, "iteration_ms_err_pipeline"].dropna().abs()


def sweep_errors(root: Path | None = None) -> pd.DataFrame:
    """One row per cell: ``sweep``, ``few_cores`` (its node), ``kind``, ``error`` (%)."""
    csvs = committed_comparisons() if root is None else committed_comparisons(root)
    rows = []
    for csv in csvs:
        table = pd.read_csv(csv)
        sweep = sweep_directory(csv)
        few = cores_per_rank(sweep) <= FEW_CORES_PER_RANK
        for kind in KINDS:
            for error in _cells(table, kind):
                rows.append((sweep.name, few, kind, float(error)))
    return pd.DataFrame(rows, columns=["sweep", "few_cores", "kind", "error"])


def held_out(errors: pd.DataFrame) -> Iterator[dict[str, object]]:
    """Per sweep and kind: its cells against the bands taken without it."""
    for (sweep, kind), cells in errors.groupby(["sweep", "kind"], sort=True):
        others = errors[(errors["kind"] == kind) & (errors["sweep"] != sweep)]
        few = bool(cells["few_cores"].iloc[0])
        alike = others[others["few_cores"] == few]
        pooled = float(np.percentile(others["error"], PERCENTILE))
        by_node = float(np.percentile(alike["error"], PERCENTILE)) if len(alike) else np.nan
        yield {
            "sweep": sweep,
            "few_cores": few,
            "kind": kind,
            "cells": len(cells),
            "pooled_band": pooled,
            "pooled_within": int((cells["error"] <= pooled).sum()),
            "node_band": by_node,
            "node_within": int((cells["error"] <= by_node).sum()),
        }


def coverage(errors: pd.DataFrame) -> pd.DataFrame:
    """Held-out coverage per kind of what-if and of node: cells, and the share within the
    pooled and the by-node band (each sweep judged against the bands taken without it)."""
    per_sweep = pd.DataFrame(list(held_out(errors)))
    grouped = per_sweep.groupby(["kind", "few_cores"], sort=True)
    out = grouped[["cells", "pooled_within", "node_within"]].sum().reset_index()
    out["sweeps"] = grouped.size().to_numpy()
    out["pooled_pct"] = 100.0 * out["pooled_within"] / out["cells"]
    out["node_pct"] = 100.0 * out["node_within"] / out["cells"]
    return out


def report(errors: pd.DataFrame) -> str:
    """The coverage table in Markdown."""
    lines = [
        "| what-if | node | sweeps | cells | within the pooled band | within the node's band |",
        "|---|---|---|---|---|---|",
    ]
    for row in coverage(errors).itertuples():
        node = f"≤ {FEW_CORES_PER_RANK:g} cores per rank" if row.few_cores else "more"
        lines.append(
            f"| {row.kind} | {node} | {row.sweeps} | {row.cells} | "
            f"{row.pooled_within} ({row.pooled_pct:.1f} %) | "
            f"{row.node_within} ({row.node_pct:.1f} %) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the held-out coverage of every committed comparison (no options but --help)."""
    parser = argparse.ArgumentParser(
        prog="python -m validation.bandcheck", description=__doc__.splitlines()[0]
    )
    parser.parse_args(argv)
    print(report(sweep_errors()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
