"""Attribution at the edges: read a run's trace, attribute it, write or read the table.

``dsim run`` calls ``write_run_attributions`` after the summary (same
selection of epochs and warm-up, same lock), writing
``<out>/attribution.{parquet,csv}`` with the summary's writers;
``dsim summarize`` reads it back to print the lines again.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from dsim.attribution import Attribution, attribute, attribution_table, worker_matrix
from dsim.io import parquetio
from dsim.model.tables import read_run
from dsim.render.files import write_summary_files
from dsim.replay.arrays import build_iteration_arrays
from dsim.summary import selection_mask

ATTRIBUTION_STEM = "attribution"


def run_attribution(run: str, run_dir: Path, epochs: list[int], warmup: int) -> Attribution:
    """Attribution of one parsed run over the summary's selection."""
    tables = read_run(run_dir)
    arrays = build_iteration_arrays(tables.fetch, tables.train)
    mask = selection_mask(arrays.epoch, arrays.iteration, epochs, warmup)
    return attribute(run, arrays, worker_matrix(tables.fetch, arrays), mask)


def _selection(summary: pd.DataFrame, run: str) -> tuple[str, int] | None:
    rows = summary[summary["run"] == run]
    if rows.empty:
        return None
    return str(rows["selected_epochs"].iloc[0]), int(rows["warmup"].iloc[0])


def write_run_attributions(
    summary: pd.DataFrame, runs: Iterable[tuple[str, Path]], out: Path
) -> list[Path]:
    """Attribute every run of the summary and write the table next to it."""
    attributions, selections = [], []
    for run, run_dir in runs:
        selection = _selection(summary, run)
        if selection is None:
            continue
        epochs = [int(e) for e in selection[0].split(",") if e.strip()]
        attributions.append(run_attribution(run, Path(run_dir), epochs, selection[1]))
        selections.append(selection)
    table = attribution_table(attributions, selections)
    return write_summary_files(table, out, ["parquet", "csv"], ATTRIBUTION_STEM)


def read_attributions(results_dirs: Iterable[Path]) -> pd.DataFrame:
    """The attribution tables of results directories (empty when none was written)."""
    frames = []
    for directory in dict.fromkeys(Path(d) for d in results_dirs):
        path = directory / f"{ATTRIBUTION_STEM}.parquet"
        if path.is_file():
            frame = parquetio.read_table(path, remedy="re-run `dsim run`").to_pandas()
            frame["results_dir"] = str(directory)
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
