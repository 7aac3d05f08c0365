"""`dsim run`: replay parsed runs under alignment policies and summarise them.

Thin: options become an ``Overrides`` for ``dsim.config``; the work is
``dsim.app.run.run_replays``; output goes through ``dsim.render``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from dsim.commands.common import FailIf, Full, Json, Quiet, finite_at_least
from dsim.io.stdout import write_stdout
from dsim.words import counted

HELP = """Replay parsed runs under every FETCH_ALIGN x START_ALIGN policy.

Writes one replay per policy (one row per iteration, stored once in
RESULTS/dataset/; RESULTS/<run>/<fetch>__<start>.parquet keeps its key),
RESULTS/<run>/result.json and RESULTS/summary.{parquet,csv}, and prints the
summary. actual/actual (the measured run) is always replayed, since the
what-if columns compare against it. Finished replays are reused when the
trace and replay parameters are unchanged (--force recomputes), so an
interrupted run resumes where it stopped. A second `dsim run` on the same
RESULTS directory waits for the first to finish. --json prints the summary,
verdicts and checks as one JSON object on stdout instead of the tables;
--fail-if METRIC\\[@FETCH/START] OP NUMBER (repeatable) exits with code 5 when
the condition holds for a run's measured row (or that policy's row).

\b
Examples:
  dsim run --conf configs/sim_conf.json
  dsim run myrun            # all 9 policies of traces/myrun
  dsim run --conf configs/sim_conf.json --epochs all --warmup 0 --threshold 0.05
  dsim run --conf configs/sim_conf.json --executor ray --ray-address 10.0.0.5:6379
  dsim run -r 'cpuDDP*' -p avg/min -p min/min    # these policies (and actual/actual)
  dsim run myrun --model pipeline --workers 8     # as if the loader had 8 workers
  dsim run --conf configs/sim_conf.json --mlflow          # also log to MLflow (./mlruns)
  dsim run myrun --json | jq '.verdicts[0].speedup'
  dsim run myrun --fail-if 'effective_delay_pct>10'   # a CI gate: exit 5 when it holds
"""


def one_loader_value(values: list[str] | None, option: str, lowest: int) -> int | None:
    """The one value of a loader what-if option; a sweep (repeated, ``4,8``, ``1-8``) is refused.

    Last-wins would replay a setting the user did not mean to be the only one
    (issue #19): ``dsim tune`` is the command that replays several.
    """
    from dsim.errors import UsageError

    if not values:
        return None
    tune = "--workers" if option == "--workers" else "--prefetch"
    sweep = (
        f"dsim run replays one loader setting; sweep several with "
        f"`dsim tune RUN {tune} {','.join(v.strip() for v in values)}`"
    )
    if len(values) > 1:
        raise UsageError(f"{option} given {len(values)} times ({', '.join(values)}): {sweep}")
    text = values[0].strip()
    if "," in text or (text.lstrip("-").count("-") > 0):
        raise UsageError(f"{option} {text!r} is a list or range: {sweep}")
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{option} {text!r}: not an integer") from None
    if value < lowest:
        raise UsageError(f"{option} {text!r}: must be an integer >= {lowest}")
    return value


# A progress bar is worth drawing only when the replay takes noticeable time.
PROGRESS_MIN_ROWS = 200_000


def _progress_factory(console: Any, stack: Any) -> Callable[[int], Callable[[int], None] | None]:
    def factory(total: int) -> Callable[[int], None] | None:
        if total < PROGRESS_MIN_ROWS:
            return None
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        progress = stack.enter_context(
            Progress(
                TextColumn("replaying"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )
        )
        task = progress.add_task("replay", total=total)
        return lambda rows: progress.advance(task, rows)

    return factory


def _headline_status(console: Any, summary: Any) -> Any:
    """A transient line on the terminal while the headline is worked out, where the runs'
    selected GPU-iterations reach ``PROGRESS_MIN_ROWS``; otherwise nothing.

    Why: the pipeline model replays every policy again for the headline after the replay's
    bar is gone, and on a trace with CPU times its contention solver takes ~7 s per 10^6
    GPU-iterations (BENCHMARKS.md, "The CPU-aware headline's time"): a minute of a silent
    terminal at 10^7. Off a terminal (a pipe, a file, the tests) rich draws nothing.
    """
    import contextlib

    try:
        rows = summary.drop_duplicates("results")
        size = int((rows["iterations"] * rows["gpus"]).sum())
    except (KeyError, TypeError, ValueError):
        size = 0
    if size < PROGRESS_MIN_ROWS:
        return contextlib.nullcontext()
    return console.status(
        "working out the headline: the pipeline model replays every policy again",
        spinner="dots",
    )


def _say(console: Any, text: str) -> None:
    console.print(text, highlight=False, soft_wrap=True, markup=False)


def command(
    runs: list[str] = typer.Argument(
        None, help="Run names (or globs) under the traces directory; replaces the config's FILE."
    ),
    conf: Path | None = typer.Option(
        None, "--conf", "-c", help="sim_conf.json (FILE, FETCH_ALIGN, START_ALIGN, ...)."
    ),
    traces: Path | None = typer.Option(
        None, "--traces", help="Directory of parsed runs (default: config 'traces', else ./traces)."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Results directory (default: config 'out', else ./results)."
    ),
    epochs: str | None = typer.Option(
        None, "--epochs", help="Epochs to summarise: 1,2 or all (default: all but the first)."
    ),
    warmup: int | None = typer.Option(
        None, "--warmup", min=0, help="Skip iterations <= N of each epoch (default 10)."
    ),
    threshold: float | None = typer.Option(
        None,
        "--threshold",
        callback=finite_at_least(0.0),
        help="Effective-delay threshold in seconds (default 0.030).",
    ),
    executor: str | None = typer.Option(
        None,
        "--executor",
        help="auto (in-process for small jobs, else Ray), local or ray (default auto).",
    ),
    num_cpus: int | None = typer.Option(
        None,
        "--num-cpus",
        min=1,
        help="CPUs of the embedded Ray instance; in-process, the most runs finished at once "
        "(at most 4) (default: all).",
    ),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="Join this Ray cluster (HOST:PORT; default: $RAY_ADDRESS)."
    ),
    run_globs: list[str] = typer.Option(
        None,
        "--run",
        "-r",
        help="Run name or glob under the traces directory (repeatable); like RUN arguments.",
    ),
    policy_specs: list[str] = typer.Option(
        None,
        "--policy",
        "-p",
        help="Replay this policy, FETCH/START such as avg/min, or stall-min / stall-avg "
        "(stall-only model) (repeatable); replaces the "
        "config's FETCH_ALIGN x START_ALIGN (actual/actual is always added).",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Replay model: per-iteration (the original analysis; default), pipeline "
        "(DataLoader pipelines across iterations) or stall-only (stall what-ifs from the train "
        "table; runs without fetch records get it). Default: config 'model'.",
    ),
    workers: list[str] | None = typer.Option(
        None,
        "--workers",
        metavar="N",
        help="Pipeline model: replay as if each rank's DataLoader had N workers "
        "(default: as measured). One value; `dsim tune` sweeps several. Not for a run "
        "that read an IterableDataset: its workers streamed their own shards, and no "
        "sampler says which batches N workers would build.",
    ),
    prefetch_factor: list[str] | None = typer.Option(
        None,
        "--prefetch-factor",
        metavar="N",
        help="Pipeline model: replay with this DataLoader prefetch_factor (default: as "
        "measured). One value; `dsim tune` sweeps several.",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Recompute replays even when cached; also accept a --threshold of 1 s or more.",
    ),
    mlflow: bool | None = typer.Option(
        None,
        "--mlflow/--no-mlflow",
        help="Log the summary to MLflow ($MLFLOW_TRACKING_URI, else ./mlruns; needs the "
        "mlflow extra of dsim). Default: config 'mlflow'.",
    ),
    as_json: Json = False,
    fail_if: FailIf = None,
    quiet: Quiet = False,
    full: Full = False,
) -> None:
    import contextlib

    from rich.console import Console

    from dsim.config import Overrides, load_config
    from dsim.options import parse_conditions, parse_epochs_option, parse_policy_option

    conditions = parse_conditions(fail_if)
    policies = tuple(parse_policy_option(p) for p in policy_specs or ())
    overrides = Overrides(
        runs=tuple(dict.fromkeys([*(runs or ()), *(run_globs or ())])),
        policies=policies,
        model=model,
        workers=one_loader_value(workers, "--workers", 0),
        prefetch_factor=one_loader_value(prefetch_factor, "--prefetch-factor", 1),
        traces=traces,
        out=out,
        epochs=parse_epochs_option(epochs),
        warmup=warmup,
        threshold_s=threshold,
        executor=executor,
        num_cpus=num_cpus,
        ray_address=ray_address,
        mlflow=mlflow,
    )
    config = load_config(conf, overrides)
    if config.mlflow is not None:
        from dsim.app.tracking import require_mlflow

        require_mlflow(config.mlflow)  # before any work
    # after the arguments and the config are checked: a usage error costs no pandas import
    from dsim.app.run import outcome_answer, run_replays

    source = "--threshold" if threshold is not None else f"effective_delay_threshold_s in {conf}"
    err = Console(stderr=True)
    with contextlib.ExitStack() as stack:
        outcome = run_replays(
            config,
            force=force,
            progress=None if quiet else _progress_factory(err, stack),
            on_wait=None if quiet else lambda text: _say(err, f"dsim: {text}"),
            threshold_source=source,
        )
    # The headline (the pipeline model's verdict) is what the terminal says first;
    # --json and --quiet print no verdict, and MLflow logs each run's own.
    headline = not (as_json or quiet)
    from dsim.replay.models import DEFAULT_MODEL

    # only a per-iteration run's verdict is replayed again by the pipeline model
    replays_again = headline and config.model == DEFAULT_MODEL
    with _headline_status(err, outcome.summary) if replays_again else contextlib.nullcontext():
        answer = outcome_answer(outcome, config, conditions, headline=headline)
    tracked = None
    if config.mlflow is not None:
        from dsim.app.tracking import track_answer

        tracked = track_answer(answer, config.mlflow, command="run")
    if quiet and not as_json:
        answer.raise_if_held()
        return
    if as_json:
        from dsim.render.machine import answer_document, dumps

        write_stdout(dumps(answer_document(answer)))
        if quiet:
            answer.raise_if_held()
            return
    for note in outcome.changes:
        _say(err, f"dsim: {note}")
    for note in answer.notes:
        _say(err, f"dsim: note: {note}")
    if not as_json:
        from dsim.render.terminal import print_answer

        print_answer(answer, full=full)
    for run, reasons in outcome.dropped.items():
        detail = ", ".join(f"{reason}: {count}" for reason, count in reasons.items())
        err.print(
            f"{run}: {counted(sum(reasons.values()), 'incomplete iteration')} not replayed "
            f"({detail})",
            highlight=False,
        )
    how = f" on {outcome.executor}" if outcome.executor else ""
    err.print(
        f"{counted(outcome.computed, 'replay')} computed{how}, {outcome.cached} reused, "
        f"in {outcome.seconds:.1f} s; results in {os.path.normpath(config.out)}",
        highlight=False,
    )
    if tracked is not None:
        err.print(tracked.text(), highlight=False)
    sys.stdout.flush()
    answer.raise_if_held()


command.__doc__ = HELP
