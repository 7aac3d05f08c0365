"""``dsim run`` as a library call: plan, skip cached work, execute, write, summarise.

Order matters for users: the config is fully validated first (``dsim.config``),
then every run is loaded and checked, and only then does anything get written.
Each run directory's files are written atomically once its replays are
complete (the dataset, then each replay's stub), so an interrupted run keeps
every finished run directory and the next run redoes only the rest.
``result.json`` and the summary are written last: ``result.json`` lists
exactly the replays of this run (``dsim.model.results`` explains how readers
use it). From deciding what is cached to writing the summary, the runner
holds the output directory's exclusive lock (``dsim.io.lock``), so that two
``dsim run`` processes on one directory take turns instead of mixing.

A run's work is one call of ``dsim.app.runtask``: in-process, runs are all
planned (read, checked) first and then finished, a few side by side on
threads (``dsim.execute.threads``); on Ray each run
is one task (read, replay, write on the node that runs it) and this module
only resolves paths, takes the lock, and gathers the tasks' small reports
into the summary and the attribution table.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from dsim import processes
from dsim.analysis.sanity import check_threshold, recorded_selections, selection_changes
from dsim.analysis.summary import summary_rows, summary_table
from dsim.app.answer import (
    Answer,
    attribution_rows,
    build_answer,
    with_headlines,
    with_outcome,
)
from dsim.app.attribution import run_table_path, write_directory_attributions
from dsim.app.runmemo import memo_candidate, reuse_inputs
from dsim.app.runplan import (
    RunPlan,
    logged_loader,
    pending_policies,
    plan_runs_of,
    refusal,
    unread,
)
from dsim.app.runtask import (
    Reusable,
    RunReport,
    RunTask,
    finish_run,
    reusable,
    reuse_run,
    run_task,
)
from dsim.config import SimConfig
from dsim.errors import InputError
from dsim.execute import DEFAULT_CHUNK_ROWS, choose_executor, ray_address
from dsim.execute.address import FROM_SETTINGS, configured_address
from dsim.execute.threads import Checkpoint, map_in_order, thread_count
from dsim.io import lock
from dsim.io.atomic import remove_leftovers
from dsim.io.memory import release_freed
from dsim.model.results import (
    SUMMARY_STEM,
    check_results_directory,
    find_result_runs,
    scan_results,
    stale_trace,
)
from dsim.model.tables import read_run
from dsim.options import Condition
from dsim.render.files import write_answer_files

__all__ = ["RunOutcome", "logged_loader", "run_replays"]  # logged_loader: from runplan


@dataclass
class RunOutcome:
    """What ``run_replays`` did, for the command to report."""

    summary: pd.DataFrame
    executor: str | None
    computed: int
    cached: int
    seconds: float
    written: list[Path] = field(default_factory=list)
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)  # run -> reason -> count
    notes: list[str] = field(default_factory=list)  # runs skipped, and why
    changes: list[str] = field(default_factory=list)  # recorded selections this run moved
    # the results directory's answer (``directory_answer``), which ``outcome_answer`` reuses
    # when it is of the very rows this run replayed
    directory: Answer | None = None


ProgressFactory = Callable[[int], Callable[[int], None] | None]


def run_replays(
    config: SimConfig,
    *,
    force: bool = False,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    progress: ProgressFactory | None = None,
    on_wait: lock.Notify | None = None,
    threshold_source: str = "--threshold",
    threads: int | None = None,
) -> RunOutcome:
    """Replay every run and policy of a validated config; see the module docstring.

    A threshold of 1 s or more is refused unless ``force`` (it is in seconds; the message
    names ``threshold_source``). ``on_wait`` is told (once) when another ``dsim run`` holds
    the output directory and this one waits for it. ``RunOutcome.changes`` names each
    run whose recorded selection (the default of ``dsim summarize``) this run moved.
    ``threads``: in-process, how many runs are finished at once (None: as many as runs,
    cores and ``dsim.execute.threads.MAX_THREADS`` allow; tests pin it).
    """
    check_threshold(config.threshold_s, force=force, source=threshold_source)
    before = recorded_selections(config.out, config.runs)
    began = time.perf_counter()
    _, source = configured_address(config.ray_address, FROM_SETTINGS)
    address = ray_address(config.ray_address)
    executor = choose_executor(config.executor, len(config.runs), address, config.num_cpus)
    if executor == "ray":
        reports = _on_ray(config, force, chunk_rows, progress, on_wait, address, source)
    else:
        reports = _in_process(config, force, chunk_rows, progress, on_wait, threads)
    outcome = _gather(config, reports, executor)
    outcome.seconds = time.perf_counter() - began
    outcome.changes = selection_changes(before, recorded_selections(config.out, config.runs))
    return outcome


def _in_process(
    config: SimConfig,
    force: bool,
    chunk_rows: int,
    progress: ProgressFactory | None,
    on_wait: lock.Notify | None,
    threads: int | None = None,
) -> list[RunReport]:
    """Every run read and checked first (nothing written if one fails), then finished;
    both steps take runs side by side on ``threads`` threads (None: ``thread_count``'s; 1:
    one after another in this thread), with the serial loop's reports, files and first
    error (``dsim.execute.threads.map_in_order``).

    A run whose memo matches its trace and options (``dsim.app.runmemo``) is not read:
    under the lock, ``reusable`` proves every output cached (``reuse_run`` then makes its
    report), or the run is planned then, as the others were, before anything is written."""
    pairs = list(zip(config.runs, config.run_dirs, strict=True))

    def plan(k: int, checkpoint: Checkpoint) -> Entry:
        name, run_dir = pairs[k]
        inputs = reuse_inputs(name, run_dir, config, force)
        if memo_candidate(config.out, name, inputs):
            return (name, run_dir, inputs)  # decided under the lock
        return (name, run_dir, _plan(name, run_dir, config, checkpoint))

    # read and checked side by side too (pyarrow's reads and NumPy's sorts release the
    # GIL): planned one after another, the reads left one of two cores idle, ~25 % of a
    # 20-run sweep's time (BENCHMARKS.md, "Seventh run")
    entries: list[Entry] = map_in_order(plan, len(pairs), _threads(threads, len(pairs), config))
    _nothing_to_replay(entries)
    release_freed()  # the tables' memory (the plans keep little of them), before the replays
    with lock.exclusive(config.out, on_wait):
        remove_leftovers(config.out, recursive=True)  # of runs killed before us
        for k, (name, run_dir, entry) in enumerate(entries):
            if isinstance(entry, str):  # proven (nothing written yet), or planned now
                reuse = reusable(name, config, entry)
                entries[k] = (name, run_dir, reuse or _plan(name, run_dir, config))
        _nothing_to_replay(entries)
        plans = [entry for _, _, entry in entries if isinstance(entry, list)]
        for plan in (p for run in plans for p in run):  # inside --out, no link, ... (§7.4)
            check_results_directory(config.out, plan.directory)
        for plan in (p for run in plans for p in run):
            plan.todo = pending_policies(plan, config.out, force)
        total = sum(p.arrays.n_iterations * len(p.todo) for run in plans for p in run)
        on_rows = progress(total) if progress is not None and total else None
        del plans
        todo = sum(1 for _, _, entry in entries if not isinstance(entry, RunReport))
        threads = _threads(threads, todo, config)
        if threads > 1 and on_rows is not None:
            on_rows = _one_at_a_time(on_rows)

        def finish(k: int, checkpoint: Checkpoint) -> RunReport:
            name, run_dir, entry = entries[k]
            if isinstance(entry, list):
                entries[k] = (name, run_dir, None)  # its arrays are freed once it is written
                entry = finish_run(entry, config, chunk_rows, on_rows, checkpoint)
            elif isinstance(entry, Reusable):
                entry = reuse_run(entry, config)
            assert isinstance(entry, RunReport)
            return entry

        # each thread holds one run's replays: a sweep's memory grows with the threads
        # (dsim.execute.threads.MAX_THREADS caps them); one run is finished in this thread
        return map_in_order(finish, len(entries), threads)


#: One run of ``_in_process``: its plans, why it is skipped, its proof of reuse, or the
#: memo's inputs digest while reuse is undecided (None once its report is made).
Entry = tuple[str, Path, "list[RunPlan] | RunReport | Reusable | str | None"]


def _one_at_a_time(on_rows: Callable[[int], None]) -> Callable[[int], None]:
    """``on_rows`` behind a lock: runs finished on threads report progress from each
    (a progress bar, a caller's counter, need not be thread-safe)."""
    held = threading.Lock()

    def locked(rows: int) -> None:
        with held:
            on_rows(rows)

    return locked


def _nothing_to_replay(entries: list[Entry]) -> None:
    """Raise the first run's reason when every run is skipped (nothing could be replayed)."""
    reports = [entry for _, _, entry in entries if isinstance(entry, RunReport)]
    skipped = [r for r in reports if r.skipped is not None]
    if skipped and len(skipped) == len(entries):
        raise skipped[0].skipped


def _threads(threads: int | None, items: int, config: SimConfig) -> int:
    """The threads for ``items`` runs: ``threads`` where given (tests pin it), else
    ``thread_count``'s."""
    return thread_count(items, config.num_cpus) if threads is None else threads


def _plan(
    name: str, run_dir: Path, config: SimConfig, checkpoint: Checkpoint | None = None
) -> list[RunPlan] | RunReport:
    """One run read, checked and planned, or why it is skipped; its tables are let go of
    here, so that the plans hold only what they keep of them (``plan_runs_of``).
    ``checkpoint``: where a run planned on a thread stops once the sweep is cancelled
    (after the read, before the arrays are built)."""
    tables = read_run(run_dir, unread(config.model))
    if checkpoint is not None:
        checkpoint()
    refused = refusal(name, tables, config)
    if refused is not None:
        return RunReport(name, skipped=refused)
    return plan_runs_of(name, run_dir, config, tables)


def _on_ray(
    config: SimConfig,
    force: bool,
    chunk_rows: int,
    progress: ProgressFactory | None,
    on_wait: lock.Notify | None,
    address: str | None,
    source: str,
) -> list[RunReport]:
    """One Ray task per run (``run_task``): read, replay and write where it runs."""
    from dsim.execute.ray_backend import run_ray_tasks

    cwd = os.getcwd()
    tasks = [
        RunTask(name, run_dir, replace(config, run_infos={}), force, chunk_rows, cwd)
        for name, run_dir in zip(config.runs, config.run_dirs, strict=True)
    ]
    estimate = [_estimated_rows(config, name) for name in config.runs]
    reports: list[RunReport | None] = [None] * len(tasks)
    with lock.exclusive(config.out, on_wait):
        remove_leftovers(config.out, recursive=True)  # of runs killed before us
        on_rows = progress(sum(estimate)) if progress is not None and sum(estimate) else None

        def done(k: int, report: RunReport) -> None:
            reports[k] = report
            if on_rows is not None:
                on_rows(estimate[k])

        run_ray_tasks(
            run_task,
            tasks,
            on_done=done,
            address=address,
            num_cpus=config.num_cpus,
            source=source,
        )
    done_reports = [r for r in reports if r is not None]
    if done_reports and all(r.skipped is not None for r in done_reports):
        raise done_reports[0].skipped  # nothing could be replayed: the first run's reason
    return done_reports


def _estimated_rows(config: SimConfig, name: str) -> int:
    """A run's iteration-policies from its ``run.json`` (progress on Ray, where the
    driver does not read the tables)."""
    info = config.run_infos.get(name)
    if info is None:
        return 0
    return sum(int(n) for n in info.iterations_per_epoch.values()) * len(config.policies)


def _gather(config: SimConfig, reports: list[RunReport], executor: str) -> RunOutcome:
    """The runs' reports (config order) → the summary of the runs replayed, the results
    directory's summary and attribution files (every run in it), and the outcome."""
    replayed = [r for r in reports if r.skipped is None]
    written = [path for report in replayed for path in report.written]
    rows = [row for report in replayed for row in report.rows]
    summary = summary_table(rows)
    level, notes = directory_summary(
        config.out, {Path(str(r["results"])) for r in rows}, rows, summary
    )
    answer = directory_answer(level)
    # The directory's summary and attribution files are one set: an interrupt meanwhile is
    # acted on once all are written (it had left summary.parquet beside an older .csv).
    with processes.deferred_signals():
        written.extend(write_answer_files(answer, config.out, ["parquet", "csv"], SUMMARY_STEM))
        written.extend(write_directory_attributions(config.out))
    if processes.received() is not None:
        raise KeyboardInterrupt
    skipped = [f"skipped run {r.name}: {r.skipped.reason}" for r in reports if r.skipped]
    skipped += [note for report in replayed for note in report.notes]
    computed = sum(report.computed for report in replayed)
    return RunOutcome(
        summary=summary,
        executor=executor if computed else None,
        computed=computed,
        cached=sum(report.cached for report in replayed),
        seconds=0.0,
        written=written,
        dropped={report.name: report.dropped for report in replayed if report.dropped},
        notes=skipped + notes,
        directory=answer,
    )


def directory_summary(
    out: Path,
    replayed: set[Path],
    rows: list[dict[str, Any]],
    summary: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """The summary of every run in the results directory ``out`` (``results/summary.*``), each
    over its recorded selection: the ``rows`` of the run directories this ``dsim run``
    replayed (``replayed``), as their tasks made them (no second read of their replays),
    and the other runs' rows read from their files. A run whose results cannot be read any
    more (a replay missing or of another key, its trace re-parsed since) is left out with a
    note. ``summary``: ``summary_table(rows)``, where the caller has it; a copy of it is the
    answer when the directory holds no other run (a fresh sweep's case)."""
    mine = {path.resolve() for path in replayed}
    others, notes = [], []
    for run in scan_results([out]).runs:
        if run.directory.resolve() in mine:
            continue
        try:
            run.verify()
            problem = stale_trace(run)
            if problem is not None:
                raise problem
        except InputError as exc:
            notes.append(f"{run.directory.name} left out of {out / SUMMARY_STEM}.*: {exc}")
            continue
        others.append(run)
    if not others and summary is not None:
        return summary.copy(), notes
    return summary_table([*rows, *summary_rows(others)]), notes


def outcome_answer(
    outcome: RunOutcome,
    config: SimConfig,
    conditions: Sequence[Condition] = (),
    *,
    headline: bool = False,
) -> Answer:
    """``dsim run``'s answer (``dsim.app.answer``) for the runs it replayed; with
    ``headline``, the pipeline model's verdict on per-iteration runs (``dsim.app.headline``)."""
    shown = [Path(d) for d in dict.fromkeys(outcome.summary["results"])]  # with model variants
    if _same_answer(outcome.directory, outcome.summary, shown):
        assert outcome.directory is not None
        runs = list(outcome.directory.result_runs)
        infos = {str(r.directory): r.info for r in runs}
        answer = with_outcome(
            replace(outcome.directory, summary=outcome.summary),
            conditions=conditions,
            notes=outcome.notes,
            written=outcome.written,
        )
    else:
        runs = find_result_runs(shown)
        infos = {str(r.directory): r.info for r in runs}
        answer = build_answer(
            outcome.summary,
            infos,
            attributions=attribution_rows(r.directory for r in runs),
            conditions=conditions,
            notes=outcome.notes,
            written=outcome.written,
            result_runs=runs,
        )
    if headline:
        from dsim.app.headline import headlines

        answer = with_headlines(
            answer, headlines(outcome.summary, answer.verdicts, config.traces, infos)
        )
    return answer


def _same_answer(directory: Answer | None, summary: pd.DataFrame, shown: list[Path]) -> bool:
    """Whether the results directory's answer is the one ``build_answer`` would give for
    ``summary``: of the same rows (every run in the directory is one this run replayed,
    so no other run's rows are there to change a verdict), each run's attribution from
    its own file (not the directory's table, rewritten since). Why: built twice, the
    answer was 12 % of a fresh and 27 % of a cached 20-run ``dsim run`` (issue #21)."""
    if directory is None:
        return False
    level = directory.summary
    return (
        level.columns.equals(summary.columns)
        and level.index.equals(summary.index)
        and level.equals(summary)
        and all(run_table_path(d.parent, d.name).is_file() for d in shown)
    )


def directory_answer(level: pd.DataFrame) -> Answer:
    """The answer of the results directory's summary (``directory_summary``): every run's
    verdict, best policy and attribution lines, which its ``summary.*`` files carry beside
    the rows (``dsim.render.machine.answer_table``), as ``dsim summarize`` would say them."""
    shown = [Path(str(d)) for d in dict.fromkeys(level["results"])] if "results" in level else []
    runs = find_result_runs(shown)
    return build_answer(
        level,
        {str(r.directory): r.info for r in runs},
        attributions=attribution_rows(r.directory for r in runs),
        result_runs=runs,
    )
