"""``dsim summarize`` as a library call: results directories → the summary table.

Shared by the command and the Python API (``dsim.api.load_results``): the
results directories are read under their shared lock (no ``dsim run``
rewrites them meanwhile), runs are selected, and only the replays each
``result.json`` lists are summarised (docs/SPEC.md §5, §7.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from dsim.analysis.sanity import check_threshold
from dsim.analysis.summary import summarize_results
from dsim.app.answer import Answer, attribution_rows, build_answer
from dsim.io import lock
from dsim.io.atomic import remove_leftovers
from dsim.model.results import (
    ResultRun,
    check_trace_versions,
    results_directories,
    scan_results,
)
from dsim.model.selection import Epochs
from dsim.options import Condition, select_runs
from dsim.render.files import write_answer_files
from dsim.replay.policies import Policy


@dataclass
class Summarized:
    """The summary of some results directories, the runs behind it and what to tell the user."""

    summary: pd.DataFrame
    runs: list[ResultRun]
    notes: list[str] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)
    attributions: dict[str, pd.DataFrame] = field(default_factory=dict)  # per run directory


def runs_with_epochs(runs: list[ResultRun], epochs: Epochs) -> tuple[list[ResultRun], list[str]]:
    """The runs whose trace has every epoch of an explicit ``--epochs`` list, and a note per
    run left out: a mixed results directory skips what does not apply (docs/SPEC.md §5).
    When no run has them all, every run is kept, so that the summary's own error says
    which epochs are missing where. Runs whose ``result.json`` does not record their
    epochs are kept (the summary checks them)."""
    if epochs is None or isinstance(epochs, str) or len(runs) < 2:
        return runs, []
    kept, notes = [], []
    for run in runs:
        have = run.info.trace.epochs_present if run.info.trace is not None else ()
        missing = [e for e in epochs if have and e not in have]
        if missing:
            listed = ", ".join(map(str, missing))
            notes.append(
                f"skipped run {run.name} ({_shown_dir(run)}): it has no epoch(s) {listed} "
                f"(it has {', '.join(map(str, have))})"
            )
        else:
            kept.append(run)
    return (kept, notes) if kept else (runs, [])


def _shown_dir(run: ResultRun) -> str:
    import os

    return os.path.normpath(run.directory)


def summarize_directories(
    results: Sequence[str | Path],
    *,
    run_globs: Sequence[str] | None = None,
    policies: Sequence[Policy] | None = None,
    epochs: Epochs = None,
    warmup: int | None = None,
    threshold_s: float | None = None,
) -> Summarized:
    """Summarise the runs of ``results`` (the caller holds their shared lock)."""
    paths = [Path(p) for p in results]
    scan = scan_results(list(paths))
    runs = select_runs(scan.runs, list(run_globs) if run_globs else None)
    runs, skipped = runs_with_epochs(runs, epochs)
    check_trace_versions(runs)  # replays of a trace re-parsed since are refused (§7.3)
    summary = summarize_results(
        runs,
        epochs=epochs,
        warmup=warmup,
        threshold_s=threshold_s,
        policies=list(policies) if policies is not None else None,
    )
    attributions = attribution_rows(r.directory for r in runs)
    return Summarized(summary, runs, [*skipped, *scan.notes(runs)], [], attributions)


def summarize_answer(
    results: Sequence[str | Path],
    *,
    run_globs: Sequence[str] | None = None,
    policies: Sequence[Policy] | None = None,
    epochs: Epochs = None,
    warmup: int | None = None,
    threshold_s: float | None = None,
    conditions: Sequence[Condition] = (),
    out: Path | None = None,
    formats: Sequence[str] = (),
    on_wait: lock.Notify | None = None,
    force: bool = False,
) -> Answer:
    """``dsim summarize``'s answer (``dsim.app.answer``): the summary of ``results``, each
    run's verdict, attribution lines and checks, computed once for every renderer; with
    ``out``, also its table as ``summary.<format>`` files there (``write_answer_files``).
    Everything is read, and written, under the results directories' shared lock.
    A ``threshold_s`` of 1 s or more is refused unless ``force`` (it is in seconds)."""
    check_threshold(threshold_s, force=force)
    paths = [Path(p) for p in results]
    with lock.shared(results_directories(list(paths)), on_wait):
        done = summarize_directories(
            paths,
            run_globs=run_globs,
            policies=policies,
            epochs=epochs,
            warmup=warmup,
            threshold_s=threshold_s,
        )
        answer = build_answer(
            done.summary,
            {str(r.directory): r.info for r in done.runs},
            attributions=done.attributions,
            conditions=conditions,
            notes=done.notes,
            result_runs=done.runs,
        )
        if out is not None:
            remove_leftovers(out)  # temporaries of a killed writer
            written = write_answer_files(answer, out, formats)
            answer = replace(answer, written=tuple(written))
    return answer
