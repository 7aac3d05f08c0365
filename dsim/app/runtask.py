"""One run's whole ``dsim run`` pipeline: replay what is pending, write it, summarise it.

A run's work happens once and where it runs: its arrays (built once, in
``dsim.app.runplan``) feed the replay, the dataset rows and the attribution;
each replay computed is added to the tidy dataset from memory
(``DatasetWriter``), so the dataset costs no second read of the replays. Once
the dataset files are in place they are the one stored copy of the numbers,
and each computed replay's file is written, once, as a stub (``write_stub``;
replays whole from before are rewritten by ``stub_replays``; docs/SPEC.md
§7.1). Why once: writing it whole first was 13 % of a fresh run, and bought
only per-policy resume, which saves the replay kernels alone (the dataset is
rebuilt whole whenever a policy is replayed); an interrupted run redoes the
run directory it was in (§7.2). Its summary rows are made from the tables in
memory (``policy_row``), not read back.
What comes back (``RunReport``) is small: the run's summary rows before the
columns that compare rows, its attribution, counts and the paths written.

The same function runs in-process (``--executor local``) and as one Ray task
per run (``run_task``), so the files are byte for byte the same wherever a
run went. A task first moves into the driver's working directory, so that
relative ``--out`` and trace paths name the same files (on one machine, or a
cluster whose nodes mount the results at the same path).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from dsim.analysis.attribution import Attribution, attribution_table
from dsim.analysis.summary import policy_row, run_selection, summary_rows
from dsim.app.attribution import parse_selection, run_attribution, run_table_path
from dsim.app.runmemo import reuse_inputs, vouched_directories, write_memo
from dsim.app.runplan import (
    RunPlan,
    cuts_of,
    pending_policies,
    plan_runs_of,
    refusal,
    replay_params,
    result_info,
    unread,
)
from dsim.config import SimConfig
from dsim.errors import DsimError
from dsim.execute import DEFAULT_CHUNK_ROWS, Job, PolicyResult
from dsim.execute.cache import params_document
from dsim.execute.local import run_local
from dsim.execute.threads import Checkpoint, never_cancelled
from dsim.io.arrowtables import empty_table
from dsim.io.atomic import write_parquet
from dsim.io.memory import release_freed_for
from dsim.model.dataset import DatasetWriter, identity, is_current, metadata
from dsim.model.resultinfo import RESULT_FILE
from dsim.model.results import (
    ResultRun,
    check_results_directory,
    find_result_runs,
    load_replay,
    read_replay_key,
    replay_path,
    replay_table,
    stub_replays,
    unstub_stale,
    write_replay,
    write_result_info,
    write_stub,
)
from dsim.model.tables import RunTables, read_run
from dsim.replay.policies import Policy, policy_label

OnRows = Callable[[int], None]


@dataclass
class RunReport:
    """What one run's pipeline did, for the driver to gather (small: no arrays, no tables)."""

    name: str
    computed: int = 0
    cached: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)  # ``summary_rows``, plan order
    attribution: Attribution | None = None
    selection: tuple[str, int] | None = None  # the summary's (selected_epochs, warmup)
    written: list[Path] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    replayed_rows: int = 0  # iteration-policies computed (progress)
    skipped: DsimError | None = None  # the run cannot be replayed as asked (mixed selections)
    notes: list[str] = field(default_factory=list)  # for the user (``RunPlan.notes``)


@dataclass(frozen=True)
class RunTask:
    """Everything a Ray task needs to run one run's pipeline on any node."""

    name: str
    run_dir: Path
    config: SimConfig
    force: bool
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    cwd: str = ""  # the driver's working directory (relative paths are relative to it)


def run_task(task: RunTask) -> RunReport:
    """Read, plan, replay and write one run (what a Ray task runs): the checks of
    ``dsim run`` for this run's directories first, then ``finish_run``."""
    with _working_directory(task.cwd):
        inputs = reuse_inputs(task.name, task.run_dir, task.config, task.force)
        reuse = reusable(task.name, task.config, inputs)
        if reuse is not None:  # every replay cached, the trace not read (§7.2)
            return reuse_run(reuse, task.config)
        tables = read_run(task.run_dir, unread(task.config.model))
        refused = refusal(task.name, tables, task.config)
        if refused is not None:  # another run may still replay what was asked (§4.3)
            return RunReport(task.name, skipped=refused)
        plans = plan_runs_of(task.name, task.run_dir, task.config, tables)
        del tables  # the plans keep what attribution reads of them
        release_freed_for(plans[0].arrays.stall.size)
        for plan in plans:
            check_results_directory(task.config.out, plan.directory)
        for plan in plans:
            plan.todo = pending_policies(plan, task.config.out, task.force)
        return finish_run(plans, task.config, task.chunk_rows)


@contextlib.contextmanager
def _working_directory(path: str) -> Iterator[None]:
    """In ``path`` for the duration, when it is given, exists and is not already current."""
    here = os.getcwd()
    if not path or path == here or not os.path.isdir(path):
        yield
        return
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(here)


def finish_run(
    plans: list[RunPlan],
    config: SimConfig,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    on_rows: OnRows | None = None,
    checkpoint: Checkpoint = never_cancelled,
) -> RunReport:
    """Replay the pending policies of one run's plans (all over the same arrays), write
    each replay, ``result.json``, the dataset files and the summary rows; attribute the
    run. Plans must be checked (``check_results_directory``) and have ``todo`` set.

    ``checkpoint`` is called after each replay chunk, before each policy and before the
    attribution: on a worker thread (``dsim.execute.threads``) it raises ``Cancelled``
    once the run is cancelled, so that an interrupt stops the run there, unwinding it
    through the same ``finally`` blocks as a ``KeyboardInterrupt`` would."""
    report = RunReport(plans[0].name, dropped=dict(plans[0].arrays.dropped))
    report.notes.extend(note for plan in plans for note in plan.notes)
    on_chunk = _checked(on_rows, checkpoint)
    report_rows = [
        _finish_plan(plan, config, chunk_rows, on_chunk, report, checkpoint) for plan in plans
    ]
    # the replays' and the dataset's freed buffers (Arrow's pool, the C heap), before
    # attribution's matrices are made: held, they were ~60 bytes per GPU-iteration
    release_freed_for(plans[0].arrays.stall.size)
    # paired by directory: the scan sorts them, and a what-if's plan comes before its
    # baseline's though its directory (RUN@MODEL-wW-pP) sorts after (RUN@MODEL)
    made_by = {plan.directory: (plan, made) for plan, made in zip(plans, report_rows, strict=True)}
    for run in find_result_runs([config.out / plan.directory for plan in plans]):
        plan, made = made_by[run.directory.name]
        report.rows.extend(_rows(run, config, list(plan.keys), made))
    checkpoint()
    _attribute(plans, report, config.out)
    if plans[0].inputs is not None:  # last: it vouches for what was just written
        write_memo(config.out, plans[0].name, plans[0].inputs, [p.directory for p in plans])
    return report


def _checked(on_rows: OnRows | None, checkpoint: Checkpoint) -> OnRows | None:
    """``on_rows`` after ``checkpoint``: what the replay calls after each chunk."""
    if checkpoint is never_cancelled:
        return on_rows

    def on_chunk(rows: int) -> None:
        checkpoint()
        if on_rows is not None:
            on_rows(rows)

    return on_chunk


def _rows(
    run: ResultRun,
    config: SimConfig,
    policies: list[Policy],
    made: Mapping[Policy, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """A run directory's summary rows under the run's selection (``summary_rows``);
    ``made``: the rows ``finish_run`` made from the replay tables it held."""
    return summary_rows(
        [run],
        epochs=config.epochs,
        warmup=config.warmup,
        threshold_s=config.threshold_s,
        policies=policies,
        made=made,
    )


@dataclass(frozen=True)
class Reusable:
    """A fully cached run, proven (``reusable``): its directories in plan order, and their
    results as scanned."""

    name: str
    directories: list[str]
    runs: dict[str, Any]  # directory name -> ``ResultRun``


def reusable(name: str, config: SimConfig, inputs: str | None) -> Reusable | None:
    """Whether run ``name`` is fully cached without reading its trace (None: plan it): its
    memo (``dsim.app.runmemo``) vouches that its ``result.json`` and attribution tables
    are what ``inputs`` give, every replay ``result.json`` lists holds its key
    (``pending_policies``' test) and the dataset files were built from them
    (``is_current``). Then ``finish_run`` would replay nothing, rebuild no dataset and
    write the same bytes again. Reads only; called under the output directory's lock."""
    directories = vouched_directories(config.out, name, inputs)
    if directories is None:
        return None
    for directory in directories:
        check_results_directory(config.out, directory)
    runs = {
        run.directory.name: run for run in find_result_runs([config.out / d for d in directories])
    }
    for directory, run in runs.items():
        if any(read_replay_key(path) != run.keys[p] for p, path in run.replays.items()):
            return None  # a replay lost or replaced: it is recomputed
        meta = metadata(name, directory, dict(run.info.policies))
        if not is_current(config.out, directory, meta):
            return None
    return Reusable(name, directories, runs)


def reuse_run(reuse: Reusable, config: SimConfig) -> RunReport:
    """A ``reusable`` run's report, as ``finish_run`` makes it for a fully cached run: the
    stubs of replays still whole written (§7.1), the summary rows read from the dataset;
    ``result.json`` and the attribution tables are left as they are (the same bytes)."""
    out, runs = config.out, reuse.runs
    report = RunReport(reuse.name, dropped=dict(runs[reuse.directories[0]].info.dropped))
    for directory in reuse.directories:  # what finish_run lists, in its order
        report.written.append(out / directory / RESULT_FILE)
        report.written.extend(stub_replays(out, directory, dict(runs[directory].info.policies)))
    for run in runs.values():  # the scan's order, as finish_run's
        report.cached += len(run.replays)
        report.rows.extend(_rows(run, config, list(run.replays)))
    tables = [run_table_path(out, d) for d in reuse.directories]
    report.written.extend(path for path in tables if path.is_file())
    return report


def _finish_plan(
    plan: RunPlan,
    config: SimConfig,
    chunk_rows: int,
    on_rows: OnRows | None,
    report: RunReport,
    checkpoint: Checkpoint = never_cancelled,
) -> dict[Any, dict[str, Any]]:
    """One results directory: replays (label order), dataset from memory, ``result.json``,
    then the replays made stubs. The dataset is rebuilt when it does not list these keys,
    and whenever a policy is replayed (``--force``, or a replay file lost): the files
    that now hold the numbers are rewritten by what recomputes them. Returns the summary
    rows (``policy_row``) of the replays it held in memory, by policy, so that the
    summary reads none of them back."""
    model = plan.model
    assert model is not None  # set by plan_run
    info = result_info(plan, config, model)
    meta = metadata(plan.name, plan.directory, dict(info.policies))
    current = not plan.todo and is_current(config.out, plan.directory, meta)
    dataset = None if current else meta
    writer = DatasetWriter(config.out, plan.directory, dataset) if dataset is not None else None
    ident = identity(plan.name, info)
    prepared = model.prepare(plan.arrays, replay_params(config)) if plan.todo else None
    selection = run_selection(info, config.epochs, config.warmup, config.threshold_s)
    rows: dict[Any, dict[str, Any] | None] = {}
    memo: dict[str, Any] = {}  # what the policies' rows share (``policy_row``)
    stubs: list[pa.Table] = []  # the computed replays' schemas (metadata), stubs to write
    try:
        for policy in sorted(plan.keys, key=policy_label):
            table = None  # the previous policy's replay is let go of before the next one
            checkpoint()
            release_freed_for(plan.arrays.stall.size)  # what it and its rows freed, back
            if policy in plan.todo:
                table = _replay(plan, prepared, policy, chunk_rows, on_rows)
                if writer is None:  # no dataset to hold its rows (not so today): whole
                    report.written.append(write_replay(table, config.out))
                else:  # written once, as its stub, once the dataset holds its rows
                    stubs.append(empty_table(table.schema))
                    report.written.append(replay_path(config.out, plan.directory, policy))
                report.computed += 1
                report.replayed_rows += plan.arrays.n_iterations
            else:
                report.cached += 1
                if writer is None:
                    continue
                table = _read_cached(plan, config.out, policy)
            if writer is not None:
                writer.add_replay(ident, policy, table)
            rows[policy] = _row(plan, info, config.out, policy, table, selection, memo)
        report.written.append(write_result_info(info, config.out, plan.directory))
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if writer is not None:
        report.written.extend(unstub_stale(config.out, plan.directory, info.policies))
        report.written.extend(writer.commit())
    for stub in stubs:
        write_stub(stub, config.out)
    computed = {policy_label(p) for p in plan.todo} if stubs else set()
    rest = {label: key for label, key in info.policies.items() if label not in computed}
    written = stub_replays(config.out, plan.directory, rest)  # replays whole from before
    report.written.extend(path for path in written if path not in report.written)
    return {policy: row for policy, row in rows.items() if row is not None}


def _row(
    plan: RunPlan,
    info: Any,
    out: Path,
    policy: Any,
    table: pa.Table,
    selection: tuple[Any, int, float],
    memo: dict[str, Any],
) -> dict[str, Any] | None:
    """The policy's summary row from its table in memory, or None where the summary must
    make it itself (a selection it refuses: the summary says so, after the files).
    ``memo``: one per results directory, so that its policies share the selected rows
    and the run's documents (``policy_row``; without it each policy made them again:
    the nine rows of a 10,000 x 8 run took 2.7 ms, now 1.8)."""
    try:
        return policy_row(
            plan.name, info, out / plan.directory, policy, table, selection, memo=memo
        )
    except DsimError:
        return None


def _replay(
    plan: RunPlan, prepared: Any, policy: Any, chunk_rows: int, on_rows: OnRows | None
) -> Any:
    """One policy of one plan, in this process (chunked as every executor cuts it)."""
    model = plan.model
    assert model is not None
    results: list[PolicyResult] = []
    job = Job(
        plan.directory,
        prepared,
        (policy,),
        model=model.name,
        cuts=cuts_of(model, plan.arrays),
        params=plan.params,
    )
    run_local(
        [job], plan.params, chunk_rows=chunk_rows, on_result=results.append, on_progress=on_rows
    )
    result = results[0]
    return replay_table(
        plan.arrays.epoch,
        plan.arrays.iteration,
        result.metrics,
        plan.arrays.gpus,
        result.gpu_stall,
        run=plan.name,
        policy=policy,
        key=plan.keys[policy],
        provenance={
            "model": model.name,
            "input": plan.fingerprint,
            "params": params_document(model, plan.params),
        },
        directory=plan.directory,
    )


def _read_cached(plan: RunPlan, out: Path, policy: Any) -> Any:
    """A reused replay, read with its checksums (its key was checked by ``pending_policies``):
    whole, or a stub's rows from the dataset files still in place (the new ones are
    temporaries until ``commit``)."""
    table, _ = load_replay(
        replay_path(out, plan.directory, policy),
        ranks=tuple(int(g) for g in plan.arrays.gpus),
        remedy="re-run dsim run --force for this run",
    )
    return table


def _attribute(plans: list[RunPlan], report: RunReport, out: Path) -> None:
    """The run's attribution over its summary rows' selection, from the plan's arrays
    when they are the ones attribution reads (``run_attribution``)."""
    plan = plans[0]
    shown = [row for row in report.rows if row.get("__shown", True)]
    if not shown or plan.tables is None:
        return
    first = min(shown, key=lambda row: str(row["results"]))  # the summary's first row of it
    selection = (str(first["selected_epochs"]), int(first["warmup"]))
    epochs, warmup = parse_selection(selection)
    tables: RunTables = plan.tables
    has_fetch = tables.fetch.num_rows > 0
    model = plan.model
    same = model is not None and model.needs_fetch == has_fetch
    arrays = replace(plan.arrays, loader=None) if same else None
    report.attribution = run_attribution(plan.name, tables, epochs, warmup, arrays)
    report.selection = selection
    table = attribution_table([report.attribution], [selection])
    for each in plans:  # every results directory of the run (model variants) has its table
        path = run_table_path(out, each.directory)
        write_parquet(pa.Table.from_pandas(table, preserve_index=False), path)
        report.written.append(path)
