"""Attribution at the edges: read a run's trace, attribute it, write or read the table.

``dsim run`` attributes each run where it replays it (``run_attribution``,
``dsim.app.runtask``: the summary's selection of epochs and warm-up, the
run's arrays as the replay built them) into
``<out>/attribution/runs/<run dir>.parquet``, and rebuilds
``<out>/attribution.{parquet,csv}`` from every run's file
(``write_directory_attributions``);
``dsim summarize`` reads it back to print the lines again. ``dsim report``
finds each run's trace (``find_trace``, checked against the tables the
replays were computed from) to attribute it over the report's selection and
to show who was last over time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pandas as pd

from dsim.analysis.attribution import (
    Attribution,
    LastOverTime,
    attribute,
    attribution_table,
    last_over_time,
    worker_matrix,
)
from dsim.errors import InputError
from dsim.execute.cache import trace_fingerprint
from dsim.fetchstages import stage_shares
from dsim.io import parquetio
from dsim.io.arrowtables import empty_table
from dsim.model.resultinfo import RESULT_FILE, ResultInfo
from dsim.model.runinfo import RUN_FILE, RunInfo
from dsim.model.selection import selection_mask
from dsim.model.tables import FETCH_FILE, STAGE_COLUMNS, TRAIN_FILE, RunTables, read_run
from dsim.render.files import write_summary_files
from dsim.replay.arrays import IterationArrays, build_iteration_arrays

ATTRIBUTION_STEM = "attribution"
#: Each run's own attribution table: ``<out>/attribution/runs/<run dir>.parquet`` (outside the
#: run directories, whose ``*.parquet`` are replays; two levels down, so that no results scan
#: takes it for a run directory).
RUN_TABLES = ("attribution", "runs")


def run_table_path(out: Path, directory: str) -> Path:
    """Where ``dsim run`` writes one run directory's attribution table."""
    return Path(out).joinpath(*RUN_TABLES, f"{directory}.parquet")


NO_FETCH_RECORDS = (
    "its trace has no fetch records (a profiler trace has none), so nothing tells "
    "whose loader finished last"
)


def run_attribution(
    run: str,
    tables: RunTables,
    epochs: list[int],
    warmup: int,
    arrays: IterationArrays | None = None,
) -> Attribution:
    """Attribution of one parsed run over the summary's selection (what ``dsim run`` writes),
    from the snapshot of the trace the replays were computed from.

    ``arrays``: the run's arrays as the replay built them from ``tables``, used when
    they are the ones attribution needs (every iteration with all fetch and training
    records, or all training records for a run without fetches), else built here.
    A run without fetch records (a profiled run) is attributed by its stalls
    alone (docs/SPEC.md §5.2): the rank with the largest data wait.
    """
    if tables.fetch.num_rows == 0:
        if arrays is None:
            arrays = build_iteration_arrays(tables.fetch, tables.train, require_fetch=False)
        mask = selection_mask(arrays.epoch, arrays.iteration, epochs, warmup)
        return attribute(run, arrays, arrays.worker, mask)
    return _attribution(run, tables, epochs, warmup, arrays, over_time=False)[0]


#: The fetch columns attribution reads when it is given the run's arrays: for logs with
#: fetch stages, what ``stage_shares`` reads; else only the row count (one column keeps it).
_STAGE_FETCH = ("epoch", "iteration", "gpu", "fetch_s", *STAGE_COLUMNS)


def attribution_inputs(tables: RunTables, with_arrays: bool) -> RunTables:
    """What ``run_attribution`` reads of a run's tables, when it is given the run's arrays
    (``with_arrays``): the fetch table's key, worker and stage columns, no train table.

    Why: ``dsim run`` holds a run's tables from its plan until it attributes the run,
    after every replay; whole they are ~84 bytes per GPU-iteration, more than the
    arrays the replay works on, and with the arrays attribution reads only the fetch
    stages (when the logs have them) and the row count. Without usable arrays
    (``run_attribution`` builds its own) the tables are kept whole.
    """
    if not with_arrays:
        return tables
    fetch = tables.fetch
    stages = "read_s" in fetch.column_names
    names = [c for c in _STAGE_FETCH if c in fetch.column_names] if stages else ["gpu"]
    return replace(tables, fetch=fetch.select(names), train=empty_table(tables.train.schema))


def trace_attribution(
    run: str, run_dir: Path, epochs: list[int], warmup: int, info: ResultInfo
) -> tuple[Attribution, LastOverTime]:
    """Attribution of one parsed run (the trace ``info`` replayed) over a selection, and
    who was last over time.

    Raises ``InputError`` (``NO_FETCH_RECORDS``) for a trace without fetch records.
    """
    tables = read_replayed(run_dir, info)
    if tables.fetch.num_rows == 0:
        raise InputError(NO_FETCH_RECORDS, run_dir)
    attribution, over_time = _attribution(run, tables, epochs, warmup)
    assert over_time is not None
    return attribution, over_time


def _attribution(
    run: str,
    tables: RunTables,
    epochs: list[int],
    warmup: int,
    arrays: IterationArrays | None = None,
    *,
    over_time: bool = True,
) -> tuple[Attribution, LastOverTime | None]:
    """The attribution and, where ``over_time``, who was last per window (the report's
    alone: ``dsim run`` writes no such table, and made it for nothing, a quarter of its
    attribution of a 10,000 x 8 run: 8.2 ms, now 6.2)."""
    if arrays is None:
        arrays = build_iteration_arrays(tables.fetch, tables.train)
        workers = worker_matrix(tables.fetch, arrays)
    else:  # built from these tables with every fetch: the worker of each cell as it is
        workers = arrays.worker
    mask = selection_mask(arrays.epoch, arrays.iteration, epochs, warmup)
    attribution = attribute(run, arrays, workers, mask)
    del workers
    fetch = tables.fetch
    if "read_s" in fetch.column_names:  # the logs carry fetch stages
        selected = selection_mask(
            fetch["epoch"].to_numpy(), fetch["iteration"].to_numpy(), epochs, warmup
        )
        attribution = replace(attribution, stages=tuple(stage_shares(fetch, selected)))
    return attribution, last_over_time(arrays, mask) if over_time else None


def find_trace(run: str, info: ResultInfo, traces: Path) -> tuple[Path | None, str]:
    """The parsed trace ``traces/<run>`` that a run's replays were computed from, or None
    and why not: absent, or its tables differ from those ``result.json`` records
    (``input``), so that a report never attributes another trace than the one replayed.
    The tables' digests come from the trace's ``run.json`` (hashed only for runs parsed
    before dsim recorded them); ``read_replayed`` checks the bytes it then reads."""
    run_dir = traces / run
    if not (run_dir / RUN_FILE).is_file():
        return None, f"its trace is not in {traces} (give its directory with --traces)"
    recorded = dict(info.input)
    if not isinstance(recorded, dict) or not all(
        isinstance(recorded.get(name), dict) for name in (FETCH_FILE, TRAIN_FILE)
    ):
        return None, "its result.json does not record which trace was replayed"
    try:
        current = RunInfo.load(run_dir).files or trace_fingerprint(run_dir)
    except InputError as exc:
        return None, str(exc)
    for name in (FETCH_FILE, TRAIN_FILE):
        if (current.get(name) or {}).get("sha256") != recorded[name].get("sha256"):
            return None, f"{run_dir / name} changed since `dsim run` replayed it"
    return run_dir, ""


def read_replayed(run_dir: Path, info: ResultInfo) -> RunTables:
    """One snapshot of the trace ``find_trace`` found, refused (``InputError``) when a
    ``dsim parse`` replaced it since: its tables are then not the ones replayed."""
    tables = read_run(run_dir)
    for name in (FETCH_FILE, TRAIN_FILE):
        if (tables.files or {}).get(name, {}).get("sha256") != info.input[name].get("sha256"):
            raise InputError("changed since `dsim run` replayed it", run_dir / name)
    return tables


def parse_selection(selection: tuple[str, int]) -> tuple[list[int], int]:
    """A summary row's (``selected_epochs``, ``warmup``) → (epochs, warm-up)."""
    return [int(e) for e in selection[0].split(",") if e.strip()], selection[1]


def write_directory_attributions(out: Path) -> list[Path]:
    """``<out>/attribution.{parquet,csv}``: every run of the results directory, recomputed
    from the runs' own files (one set of rows per run name and selection; model variants of
    a run share its trace). A run replayed before dsim wrote a file per run keeps its rows of
    the previous directory-level table, as long as its run directory is still there."""
    frames, seen, names = [], set(), set()
    for result in sorted(out.glob(f"*/{RESULT_FILE}")):
        path = run_table_path(out, result.parent.name)
        if not path.is_file():
            continue  # replayed before dsim wrote a table per run
        frame = parquetio.read_table(path, remedy="re-run `dsim run`").to_pandas()
        names.add(result.parent.name.split("@", 1)[0])
        if frame.empty:
            continue
        key = (str(frame["run"].iloc[0]), str(frame["selected_epochs"].iloc[0]))
        key += (str(frame["warmup"].iloc[0]),)
        if key not in seen:
            seen.add(key)
            frames.append(frame)
    previous = out / f"{ATTRIBUTION_STEM}.parquet"
    if previous.is_file():
        old = parquetio.read_table(previous, remedy="re-run `dsim run`").to_pandas()
        present = {p.parent.name.split("@", 1)[0] for p in out.glob(f"*/{RESULT_FILE}")} - names
        kept = old[old["run"].astype(str).isin(present)]
        if not kept.empty:
            frames.append(kept)
    if frames:
        table = pd.concat(frames, ignore_index=True)
        table["straggler_gpu"] = table["straggler_gpu"].astype("Int64")
    else:
        table = attribution_table([])
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
