"""Planning one run of ``dsim run``: its arrays, model, policies, cache keys and records.

A plan is built from one snapshot of the run's trace (``read_run``) and holds
the run's ``IterationArrays``, built once (``build_iteration_arrays``) and
shared by the replay, the dataset, the attribution and ``result.json``:
a run with a loader what-if gets two plans (the what-if and its measured
baseline) over the same arrays. Planning reads, checks and hashes; it writes
nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dsim.analysis.summary import DEFAULT_THRESHOLD_S, DEFAULT_WARMUP, selected_iterations
from dsim.analysis.throughput import batch_from_throughput, trace_batch_size
from dsim.app.attribution import attribution_inputs
from dsim.app.runmemo import dataset_changed, inputs_digest
from dsim.config import SimConfig
from dsim.errors import DsimError, InputError, UsageError
from dsim.execute.cache import params_document, replay_key, snapshot_fingerprint
from dsim.io.memory import releaser
from dsim.model.datasetfiles import intact
from dsim.model.resultinfo import Selection
from dsim.model.results import ResultInfo, read_replay_key, replay_path
from dsim.model.runinfo import LOADER_SETTING_LIMIT, RUN_FILE, RunInfo
from dsim.model.tables import (
    CPU_COLUMNS,
    FETCH_FILE,
    PROC_COLUMN,
    TRAIN_FILE,
    RunTables,
    read_run,
)
from dsim.replay.arrays import (
    MISSING_BOTH,
    MISSING_FETCH,
    MISSING_TRAIN,
    IterationArrays,
    LoaderSettings,
    TableColumns,
    build_iteration_arrays,
)
from dsim.replay.models import DEFAULT_MODEL, STALL_ONLY_MODEL, ReplayModel, get_model
from dsim.replay.params import ReplayParams
from dsim.replay.policies import STALL_ONLY, Policy
from dsim.words import counted

#: The columns of a trace that ``dsim run`` never reads (``read_run``'s ``leave_out``): the
#: fetch's ``end`` is its start plus its duration, both read.
UNREAD = {FETCH_FILE: ("end",)}


def unread(model: str) -> dict[str, tuple[str, ...]]:
    """The trace columns ``dsim run`` leaves unread (``read_run``'s ``leave_out``) when it
    replays with ``model`` (a registered name): besides ``UNREAD``, the CPU times, unless
    the model reads them (``ReplayModel.reads_cpu``: the pipeline model's CPU-aware path,
    SPEC §4.2).

    Why: decoded, the five CPU columns became five [N, G] arrays that the per-iteration
    replays, the dataset and attribution never read, 40 of the 172 bytes per GPU-iteration
    of ``dsim run``'s replays on a trace with CPU times (BENCHMARKS.md, "The CPU-aware
    headline's memory"). The headline's pipeline replay reads the trace again, whole.
    """
    if get_model(model).reads_cpu:
        return UNREAD
    return {
        FETCH_FILE: (*UNREAD[FETCH_FILE], *CPU_COLUMNS, PROC_COLUMN),
        TRAIN_FILE: tuple(CPU_COLUMNS),
    }


@dataclass
class RunPlan:
    """One run: its arrays, keys per policy, and which policies still need computing.

    ``todo`` is decided under the output directory's lock (``pending_policies``).
    """

    name: str
    trace: RunInfo
    arrays: IterationArrays
    keys: dict[Policy, str]
    todo: list[Policy]
    epochs: list[int]
    fingerprint: dict[str, Any] = field(default_factory=dict)
    directory: str = ""  # under the output directory: the run's name, plus a model variant
    params: ReplayParams = field(default_factory=ReplayParams)  # as this run replays them
    loader: dict[str, Any] | None = None  # measured and assumed loader settings (result.json)
    model: ReplayModel | None = None  # this run's model (stall-only for a run without fetches)
    batch: dict[str, Any] | None = None  # per-rank batch size and its source (result.json)
    run_dir: Path | None = None  # the trace replayed (result.json's ``trace_path``)
    # the snapshot replayed, as far as attribution reads it (``attribution_inputs``)
    tables: RunTables | None = None
    # ``dsim.app.runmemo.inputs_digest`` of the snapshot and options planned (None: tables
    # built in memory, no memo)
    inputs: str | None = None
    notes: list[str] = field(default_factory=list)  # for the user, with the outcome's

    def __post_init__(self) -> None:
        self.directory = self.directory or self.name


def replay_params(config: SimConfig) -> ReplayParams:
    return ReplayParams(
        stall_floor_s=config.stall_floor_s,
        stall_grow_min_s=config.stall_grow_min_s,
        workers=config.workers,
        prefetch_factor=config.prefetch_factor,
    )


#: (key, least, most) of the loader settings ``run.json`` may hold, as parse takes them
#: from the loader lines (SPEC §1.2); None: no upper bound.
_LOADER_KEYS = (
    ("num_workers", 0, LOADER_SETTING_LIMIT),
    ("fetch_workers", 0, LOADER_SETTING_LIMIT),
    ("prefetch_factor", 1, LOADER_SETTING_LIMIT),
    ("cores", 1, None),
    ("local_world_size", 1, None),
    ("process_cores", 1, None),
    ("cpu_domain_ranks", 1, None),
)


def logged_loader(info: RunInfo, where: Path | None = None) -> LoaderSettings | None:
    """The loader settings a run's ``run.json`` recorded from its loader lines, if any.

    Checked as parse checks the loader lines: a ``run.json`` edited to hold
    ``prefetch_factor 0`` or ``num_workers -1`` gave a headline of a 300-digit speed-up
    and exit 0. ``where``: the ``run.json`` to name (exit 3)."""
    loader = info.loader
    if not isinstance(loader, dict) or loader.get("num_workers") is None:
        return None
    for key, least, most in _LOADER_KEYS:
        value = loader.get(key)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < least
            or (most is not None and value > most)
        ):
            bound = f"from {least} to {most}" if most is not None else f"of at least {least}"
            raise InputError(f"loader {key} {value!r} is not an integer {bound}", where)
    workers = int(loader["num_workers"])
    # parse records the fetch lines' count where it contradicts the loader lines' (SPEC §1.2)
    seen = loader.get("fetch_workers")
    source = "log" if seen is None or int(seen) <= workers else "log+ids"
    prefetch = loader.get("prefetch_factor")
    cores, ranks = loader.get("cores"), loader.get("local_world_size")
    own, domain = loader.get("process_cores"), loader.get("cpu_domain_ranks")
    return LoaderSettings(
        workers if source == "log" else int(seen),
        int(prefetch) if prefetch is not None else 2,
        source,
        None if cores is None else int(cores),
        None if ranks is None else int(ranks),
        None if own is None else int(own),
        None if domain is None else int(domain),
    )


def variant_directory(name: str, model: ReplayModel, loader: dict[str, Any] | None) -> str:
    """Where a run's replays under ``model`` go: ``RUN`` for the default model, else
    ``RUN@MODEL``, and ``RUN@MODEL-wW-pP`` for a loader what-if, so that every
    variant keeps its own ``result.json`` beside the others."""
    if model.name == DEFAULT_MODEL:
        return name
    directory = f"{name}@{model.name}"
    if loader is not None and loader["changed"]:
        assumed = loader["assumed"]
        directory += f"-w{assumed['workers']}-p{assumed['prefetch_factor']}"
    return directory


def _loader_plan(
    model: ReplayModel, arrays: IterationArrays, params: ReplayParams, name: str | None = None
) -> tuple[ReplayParams, dict[str, Any] | None]:
    """This run's parameters with its loader what-if made concrete, and its record."""
    if not model.uses_loader:
        return params, None
    measured = arrays.loader or LoaderSettings.implied(arrays.worker)
    if model.name == "pipeline":  # an IterableDataset's run keeps its worker count (§4.2)
        from dsim.replay.models.pipeline import check_stream_workers

        check_stream_workers(arrays, params.workers, name)
    workers = measured.workers if params.workers is None else params.workers
    prefetch = (
        measured.prefetch_factor if params.prefetch_factor is None else params.prefetch_factor
    )
    record = {
        "measured": measured.document(),
        "assumed": {"workers": workers, "prefetch_factor": prefetch},
        "changed": (workers, prefetch) != (measured.workers, measured.prefetch_factor),
    }
    if model.name == "pipeline":  # CPU contention (SPEC §4.2): only logs with CPU times
        from dsim.replay.models.pipeline import cpu_assumption

        cpu = cpu_assumption(arrays)
        if cpu is not None:
            record["cpu"] = cpu
    return replace(params, workers=workers, prefetch_factor=prefetch), record


def _fmt(policies: list[Policy] | tuple[Policy, ...]) -> str:
    return ", ".join(f"{p[0]}/{p[1]}" for p in policies)


def run_model_and_policies(
    name: str, has_fetch: bool, config: SimConfig, model: ReplayModel
) -> tuple[ReplayModel, tuple[Policy, ...]]:
    """The model and policies one run is replayed with (docs/SPEC.md §4.3).

    A run without fetch records (a profiled run) is replayed by the
    ``stall-only`` model when no other model was asked for, and gets the stall
    what-ifs unless policies were asked for; policies a model cannot replay,
    asked for explicitly, are an error naming the run, never skipped.
    """
    if not has_fetch and model.needs_fetch:
        if model.name != DEFAULT_MODEL:
            raise InputError(
                f"run {name} has no fetch records (profiler traces?): the {model.name} model "
                f"replays fetches; replay it without --model, or with --model {STALL_ONLY_MODEL}"
            )
        model = get_model(STALL_ONLY_MODEL)
    policies = tuple(config.policies)
    if not config.policies_explicit and not model.needs_fetch:
        policies = STALL_ONLY
    refused = [p for p in policies if not model.supports(p)]
    if not refused:
        return model, policies
    if not has_fetch:
        raise InputError(
            f"run {name} has no fetch records (profiler traces?), so {_fmt(refused)} "
            f"cannot be replayed: fetch and start alignments move each rank's fetch, which only "
            f"dsim.instrument's fetch lines record; without them dsim replays "
            f"{_fmt(STALL_ONLY)} (see --model stall-only in `dsim run --help`)"
        )
    if model.needs_fetch:
        raise UsageError(
            f"{_fmt(refused)}: stall alignments are replayed by the {STALL_ONLY_MODEL} "
            f"model (--model {STALL_ONLY_MODEL}), not by {model.name}"
        )
    raise UsageError(f"the {model.name} model replays only {_fmt(STALL_ONLY)}, not {_fmt(refused)}")


#: ``plan_run``'s ``batch`` when not given (``None`` is a value: no batch size known)
_UNKNOWN: Any = object()


def plan_run(
    name: str,
    run_dir: Path,
    config: SimConfig,
    model: ReplayModel,
    params: ReplayParams,
    tables: RunTables | None = None,
    arrays: IterationArrays | None = None,
    batch: Any = _UNKNOWN,
) -> RunPlan:
    """Load and check one run and compute its cache keys; reads the trace (unless given
    ``tables``, one snapshot of it from ``read_run``), writes nothing. ``arrays``: the
    run's arrays from another plan of the same ``tables`` and model (not built again), and
    ``batch`` that plan's ``batch`` (not computed again)."""
    tables = read_run(run_dir, unread(model.name)) if tables is None else tables
    has_fetch = tables.fetch.num_rows > 0
    if tables.train.num_rows == 0:
        raise InputError(_nothing_to_replay(tables.fetch, tables.train, {}, tables.info), run_dir)
    model, policies = run_model_and_policies(name, has_fetch, config, model)
    # before the arrays exist: its temporaries (~50 bytes per GPU-iteration) never meet them
    batch = _batch(tables) if batch is _UNKNOWN else batch
    if arrays is None:
        # with arrays attribution can use, the build takes the columns it reads over
        fetch, train = hand_over(tables, model.needs_fetch == has_fetch)
        arrays = build_iteration_arrays(
            fetch,
            train,
            require_fetch=model.needs_fetch,
            release=releaser(tables.train.num_rows),
        )
        del fetch, train
        if arrays.n_iterations == 0:
            raise InputError(
                _nothing_to_replay(tables.fetch, tables.train, arrays.dropped, tables.info),
                run_dir,
            )
        arrays = replace(arrays, loader=logged_loader(tables.info, run_dir / RUN_FILE))
    warmup = DEFAULT_WARMUP if config.warmup is None else config.warmup
    epochs, _ = selected_iterations(arrays.epoch, arrays.iteration, config.epochs, warmup, name)
    fingerprint = snapshot_fingerprint(tables, run_dir)  # of the very bytes replayed
    run_params, loader = _loader_plan(model, arrays, params, name)
    if loader is not None:  # the measured settings shape the replay: they enter the key
        fingerprint = {**fingerprint, "loader": loader["measured"]}
        if "cpu" in loader:  # so do the node's cores and ranks, from run.json (SPEC §7.2)
            fingerprint["cpu"] = loader["cpu"]
    keys = {policy: replay_key(fingerprint, model, run_params, policy) for policy in policies}
    directory = variant_directory(name, model, loader)
    return RunPlan(
        name,
        tables.info,
        arrays,
        keys,
        [],
        epochs,
        fingerprint,
        directory,
        run_params,
        loader,
        model,
        batch,
        run_dir,
        tables,
    )


def plan_runs_of(
    name: str, run_dir: Path, config: SimConfig, tables: RunTables | None = None
) -> list[RunPlan]:
    """Every plan of one run: its replay, and for a loader what-if also the measured
    baseline the what-if columns compare with (same model, same arrays, built once)."""
    tables = read_run(run_dir, unread(config.model)) if tables is None else tables
    model, params = get_model(config.model), replay_params(config)
    plans = [plan_run(name, run_dir, config, model, params, tables)]
    if plans[0].loader is not None and plans[0].loader["changed"]:
        measured = replace(params, workers=None, prefetch_factor=None)
        plans.append(
            plan_run(
                name, run_dir, config, model, measured, tables, plans[0].arrays, plans[0].batch
            )
        )
    # the plans keep only what attribution reads (the caller lets go of ``tables``)
    first = plans[0].model
    with_arrays = first is not None and first.needs_fetch == (tables.fetch.num_rows > 0)
    kept = attribution_inputs(tables, with_arrays)
    files = tables.files
    inputs = None if files is None else inputs_digest(name, run_dir, config, tables.info, files)
    for plan in plans:
        plan.tables = kept
        plan.inputs = inputs
    return plans


def hand_over(tables: RunTables, with_arrays: bool) -> tuple[TableColumns, TableColumns]:
    """The columns ``build_iteration_arrays`` reads of ``tables``, taken out of them, so that
    the build frees each one once it is placed: ``tables`` keeps only what the plans read
    after the build (each table's ``gpu`` column: its row count and, should no iteration
    be complete, the GPUs named in the error) and what attribution reads of them
    (``attribution_inputs``). Without arrays attribution can use (``with_arrays`` false:
    it builds its own from the whole tables) nothing is taken.

    Why: the tables whole beside the arrays being built were ``dsim run``'s peak (~84 and
    44 bytes per GPU-iteration, BENCHMARKS.md "Memory and disk").
    """
    fetch = TableColumns.of(tables.fetch, "fetch")
    train = TableColumns.of(tables.train, "training")
    if with_arrays:
        slim = attribution_inputs(tables, True)
        kept = list(dict.fromkeys(["gpu", *slim.fetch.column_names]))
        kept = [name for name in kept if name in tables.fetch.column_names]
        kept_train = [name for name in ["gpu"] if name in tables.train.column_names]
        tables.fetch = tables.fetch.select(kept)
        tables.train = tables.train.select(kept_train)
    return fetch, train


def refusal(name: str, tables: RunTables, config: SimConfig) -> DsimError | None:
    """Why ``run_model_and_policies`` refuses this run (the model or a policy asked for cannot
    replay it: a profiled run has no fetch records), or None. A mixed selection of runs skips
    such a run with a note instead of aborting (docs/SPEC.md §4.3); the error is raised only
    when no run is left to replay."""
    try:
        run_model_and_policies(name, tables.fetch.num_rows > 0, config, get_model(config.model))
    except (InputError, UsageError) as exc:
        return exc
    return None


def _batch(tables: Any) -> dict[str, Any] | None:
    """The per-rank batch size for throughput (docs/SPEC.md §5.5), recorded in result.json:
    the ``Throughput`` field is in the train table, which summaries do not read."""
    train = tables.train
    implied = None
    if "throughput" in train.column_names:
        implied = batch_from_throughput(
            train.column("throughput").to_numpy(zero_copy_only=False),
            train.column("iteration_s").to_numpy(zero_copy_only=False),
        )
    per_rank, source = trace_batch_size(tables.info.document(), implied)
    return None if per_rank is None else {"per_rank": per_rank, "source": source}


def pending_policies(plan: RunPlan, out: Path, force: bool) -> list[Policy]:
    """The policies without a finished replay of the same key (all of them with ``force``,
    or when the run directory's dataset files changed since dsim wrote them and no longer
    decode: their stubs' numbers are lost, ``dataset_damaged``)."""
    if force:
        return list(plan.keys)
    if dataset_damaged(out, plan.name, plan.directory):
        plan.notes.append(
            f"the dataset files of {plan.directory} changed since dsim wrote them and fail "
            f"their checksums: its {counted(len(plan.keys), 'replay')} were computed again"
        )
        return list(plan.keys)
    return [
        policy
        for policy, key in plan.keys.items()
        if read_replay_key(replay_path(out, plan.directory, policy)) != key
    ]


def dataset_damaged(out: Path, name: str, directory: str) -> bool:
    """Whether ``directory``'s dataset files changed since run ``name``'s memo recorded them
    and fail to decode (checked only then: decoding them whole costs a read of the data)."""
    return dataset_changed(out, name, directory) and not intact(out, directory)


def _rejected_training(info: RunInfo | None) -> str | None:
    """How many training lines the parse rejected, with every reject reason of the run
    (``run.json`` ``report``), or None when it rejected none: then the loop was not
    instrumented."""
    report = (info.report or {}) if info is not None else {}
    dropped = report.get("training_lines_rejected")
    if not isinstance(dropped, int) or isinstance(dropped, bool) or dropped <= 0:
        return None
    skipped = report.get("skipped")
    reasons = (
        "; ".join(f"{reason}: {n}" for reason, n in skipped.items())
        if isinstance(skipped, dict)
        else ""
    )
    return f"{counted(dropped, 'training line')}; all rejects by reason: {reasons}"


def _nothing_to_replay(fetch, train, dropped: dict[str, int], info: RunInfo | None = None) -> str:
    """Why no iteration of a run is complete, in words a user can act on."""
    if fetch.num_rows == 0 and train.num_rows > 0:  # replayed from stalls only (§4.3)
        lacking = dropped.get(MISSING_TRAIN, 0) + dropped.get(MISSING_BOTH, 0)
        return (
            f"no iteration to replay: {counted(lacking, 'iteration')} "
            f"{'lacks' if lacking == 1 else 'lack'} a training record for some "
            "GPU (and the run has no fetch records)"
        )
    if train.num_rows == 0 and (rejected := _rejected_training(info)) is not None:
        return (  # the lines were there: the instrumentation is not what is missing
            f"no training line of this run was kept: parse rejected them ({rejected}; "
            "listed in rejects.csv beside the tables)"
        )
    if train.num_rows == 0:
        return (
            "no training lines in this run: did you wrap your training loop with "
            "dsim.instrument.TrainingTimer.iterate?"
        )
    no_fetch = dropped.get(MISSING_FETCH, 0) + dropped.get(MISSING_BOTH, 0)
    no_train = dropped.get(MISSING_TRAIN, 0) + dropped.get(MISSING_BOTH, 0)
    text = (
        f"no complete iteration to replay: {counted(no_fetch, 'iteration')} "
        f"{'lacks' if no_fetch == 1 else 'lack'} a fetch record for "
        f"some GPU, {no_train} lack a training record"
    )
    fetch_gpus = set(fetch["gpu"].to_pylist())
    train_gpus = set(train["gpu"].to_pylist())
    absent = [f"GPU {g} has no fetch records" for g in sorted(train_gpus - fetch_gpus)]
    absent += [f"GPU {g} has no training records" for g in sorted(fetch_gpus - train_gpus)]
    return "; ".join([text, *absent])


def result_info(plan: RunPlan, config: SimConfig, model: ReplayModel) -> ResultInfo:
    model = plan.model or model
    return ResultInfo(
        run=plan.name,
        model=model.name,
        input=plan.fingerprint,
        trace=plan.trace,
        selection=Selection(
            epochs=tuple(plan.epochs),
            warmup=DEFAULT_WARMUP if config.warmup is None else config.warmup,
            threshold_s=DEFAULT_THRESHOLD_S if config.threshold_s is None else config.threshold_s,
        ),
        params=params_document(model, plan.params),
        loader=plan.loader,
        batch=plan.batch,
        dropped=dict(plan.arrays.dropped),
        iterations=plan.arrays.n_iterations,
        ranks=tuple(int(g) for g in plan.arrays.gpus),
        policies={f"{p[0]}__{p[1]}": key for p, key in plan.keys.items()},
        trace_path=None if plan.run_dir is None else trace_path(plan.run_dir, config.out, plan),
    )


def trace_path(run_dir: Path, out: Path, plan: RunPlan) -> str:
    """Where ``result.json`` finds the trace it was computed from: relative to its own
    directory (results and traces moved together keep it), POSIX separators."""
    start = os.path.abspath(out / plan.directory)
    return Path(os.path.relpath(os.path.abspath(run_dir), start)).as_posix()


def cuts_of(model: ReplayModel, arrays: IterationArrays) -> tuple[int, ...] | None:
    cuts = model.cut_points(arrays)
    return None if cuts is None else tuple(int(c) for c in cuts)
