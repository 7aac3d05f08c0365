"""`dsim parse`: raw DDP logs -> one table directory per run."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import typer

from dsim.commands.common import Quiet
from dsim.errors import DsimError, InputError, UsageError, WorkerDied
from dsim.words import counted

# The library's defaults (dsim.sources.rawlog.bounds, .parse), not imported: `--help` stays fast.
MAX_DURATION_S = 86_400.0
STRAY_RANK_SHARE = 0.01
MAX_LINE_BYTES = 1 << 20

HELP = """Parse raw PyTorch DDP logs into per-run Parquet tables (fetch.parquet,
train.parquet, run.json) under --out.

PATH is a log file (or a pipe), a directory holding one run's logs (one
interleaved file or one *.log file per rank, rotated files like rank0.log.1
read oldest first), or a tree of runs. Logs compressed with gzip, bzip2, xz
or zstd (*.log.gz, .bz2, .xz, .zst) are read as they are. Bad lines --
malformed, impossible values, repeated or conflicting records, timestamps
out of order, stray GPU ranks -- are skipped, counted by reason and listed in
<out>/<run>/rejects.csv; --strict stops at the first.

\b
Examples:
  dsim parse logs/output.log
  dsim parse logs/output.log.gz
  dsim parse logs/myrun/ --name myrun --out traces
  dsim parse log/ --quiet          # a whole tree of runs, in parallel
"""


def command(
    paths: list[Path] = typer.Argument(
        ...,
        help="Log files, run directories or trees of runs.",
        readable=False,  # dsim says why it cannot read a file (exit 3), not click (exit 2)
    ),
    out: Path = typer.Option(Path("traces"), "--out", "-o", help="Where run directories go."),
    strict: bool = typer.Option(False, "--strict", help="Stop at the first bad record."),
    name: str | None = typer.Option(None, "--name", help="Name of the run (one run only)."),
    jobs: int = typer.Option(
        0, "--jobs", "-j", min=0, help="Runs parsed at once (0: one per core)."
    ),
    quiet: Quiet = False,
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print one JSON object on stdout (per run: tables written, counts, warnings), "
        "nothing else.",
    ),
    input_format: str = typer.Option(
        "auto",
        "--format",
        help="Input format: rawlog (dsim's fetch and training lines), kineto (PyTorch "
        "profiler traces, *.pt.trace.json[.gz]) or auto (kineto when every path holds traces).",
    ),
    max_duration: float = typer.Option(
        MAX_DURATION_S,
        "--max-duration",
        metavar="SECONDS",
        help="Longest plausible fetch, iteration or stall; longer ones are rejected.",
    ),
    stray_rank_share: float = typer.Option(
        STRAY_RANK_SHARE,
        "--stray-rank-share",
        metavar="F",
        help="Leave out GPU ranks with at most F times the median rank's records (0: keep all).",
    ),
    max_line: int = typer.Option(
        MAX_LINE_BYTES,
        "--max-line-bytes",
        metavar="BYTES",
        help="Longest log line; a longer one stops the parse with an error naming its line "
        "(bounds memory and time whatever the input).",
    ),
) -> None:
    from dsim.app.parse import discover_runs
    from dsim.io.atomic import remove_leftovers

    if not math.isfinite(max_duration) or max_duration <= 0:
        raise UsageError(f"--max-duration must be a number of seconds > 0, got {max_duration}")
    if not 0 <= stray_rank_share <= 1:
        raise UsageError(f"--stray-rank-share must be between 0 and 1, got {stray_rank_share}")
    if max_line < 1:
        raise UsageError(f"--max-line-bytes must be at least 1, got {max_line}")
    limits = {
        "max_duration": max_duration,
        "stray_rank_share": stray_rank_share,
        "max_line": max_line,
    }
    fmt, runs = discover_runs(paths, name=name, input_format=input_format)
    remove_leftovers(out)  # what a killed parse left behind
    show_progress = not quiet and not as_json and sys.stderr.isatty()
    failures: list[DsimError] = []
    records: list[dict] = []
    report = _collect(records) if as_json else _printer(quiet)
    workers = min(len(runs), jobs or os.cpu_count() or 1)
    if workers <= 1:
        for run in runs:
            try:
                report(_parse_and_write(run, out, strict, show_progress, limits, fmt))
            except InputError as exc:
                failures.append(exc)
                if strict:
                    break
    else:
        _parse_in_parallel(runs, out, strict, limits, workers, report, show_progress, failures, fmt)
    if as_json:
        from dsim.render.machine import dumps, parse_document

        typer.echo(dumps(parse_document(records, [str(f) for f in failures])), nl=False)
    if failures:
        for failure in failures[:-1]:
            typer.echo(f"dsim: error: {failure}", err=True)
        raise failures[-1]


def _printer(quiet: bool):
    """The terminal's report of each run (``echo``: above a live progress bar)."""

    def show(result: dict, echo=typer.echo) -> None:
        _report(result, quiet, echo)

    return show


def _collect(records: list[dict]):
    """``--json``: each run's record kept for the one document; the warnings that stderr
    carries even under ``--quiet`` still go there."""
    from dsim.render.machine import parse_record

    def keep(result: dict, echo=None) -> None:
        _report(result, quiet=True)
        records.append(parse_record(result["directory"], result["info"]))

    return keep


def _parse_in_parallel(
    runs, out: Path, strict: bool, limits: dict, workers: int, report, show, failures, fmt: str
) -> None:
    """One run per worker process; workers die with this process, however it ends.

    On Ctrl-C, SIGTERM or an unexpected error the workers are stopped with
    SIGTERM (each removes its half-written run directory), and runs not yet
    started are cancelled; under SIGKILL the kernel kills them
    (``dsim.processes.worker_init``) and the next parse removes their leftovers.
    A worker killed from outside (the out-of-memory killer) breaks the pool: the
    other workers are stopped, the dead one's leftovers removed, and the error
    names the run it was parsing (``processes.task_board``).
    """
    from dsim import processes

    board = processes.task_board(workers)
    pool = ProcessPoolExecutor(
        max_workers=workers, initializer=processes.worker_init, initargs=(os.getpid(), board)
    )
    try:
        _run_pool(pool, runs, out, strict, limits, report, show, failures, fmt)
    except BrokenProcessPool:
        from dsim.io.atomic import remove_leftovers

        remove_leftovers(out)  # the dead worker's half-written run directory
        raise _worker_died(runs, processes.killed_tasks(board)) from None


def _worker_died(runs, killed: list[int]) -> WorkerDied:
    """The one-line error for a worker killed from outside, naming the runs it was parsing."""
    names = ", ".join(runs[k].name for k in killed)
    lost = f"run {names}" if len(killed) == 1 else f"runs {names}" if killed else "a run"
    return WorkerDied(
        f"a parse worker process was killed (by the out-of-memory killer, or a signal from "
        f"outside) while parsing {lost}; nothing of it was written, runs finished before are "
        f"kept and the rest were not parsed: parse again (--jobs 1 needs less memory)"
    )


def _run_pool(pool, runs, out: Path, strict: bool, limits: dict, report, show, failures, fmt):
    """Parse ``runs`` on ``pool``, reporting each as it finishes; the pool is closed after."""
    from dsim import processes

    try:
        with _runs_bar(show) as bar:
            futures = [
                pool.submit(
                    processes.in_worker,
                    _parse_and_write,
                    *(run, out, strict, False, limits, fmt),
                    task=index,
                )
                for index, run in enumerate(runs)
            ]
            task = bar.add_task("parsing runs", total=len(futures)) if bar else None
            for future in as_completed(futures):
                try:
                    report(future.result(), _echo_above(bar))
                except InputError as exc:
                    failures.append(exc)
                if bar:
                    bar.advance(task)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        processes.stop_workers()
        raise
    finally:
        _close(pool)


def _close(pool: ProcessPoolExecutor) -> None:
    """Shut the pool down completely, even when a signal interrupts the shutdown.

    The pool's manager thread must be joined before the interpreter exits,
    or its exit hook races with the thread's own cleanup.
    """
    from dsim import processes

    try:
        pool.shutdown(wait=True, cancel_futures=True)
    except KeyboardInterrupt:
        processes.stop_workers()
        pool.shutdown(wait=True, cancel_futures=True)
        raise


def _echo_above(bar):
    """Print through the live bar's console, so that lines go above the bar, not through it."""
    if bar is None:
        return typer.echo
    return lambda text: bar.console.print(text, markup=False, highlight=False)


def _runs_bar(show: bool):
    """A bar over runs finished, when several parse in parallel (a null context otherwise)."""
    if not show:
        return contextlib.nullcontext(None)
    from rich import progress as rp

    columns = (rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn())
    return rp.Progress(*columns, rp.TimeRemainingColumn(), transient=True)


def _parse_and_write(
    run, out: Path, strict: bool, show_progress: bool, limits: dict, fmt: str = "rawlog"
) -> dict:
    from dsim.app.parse import parse_and_write

    if show_progress:
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        total = sum(_size(p) for p in run.files)
        columns = (
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, transient=True) as bar:
            task = bar.add_task(f"parsing {run.name}", total=total)
            directory, info = parse_and_write(
                run,
                out,
                fmt=fmt,
                strict=strict,
                limits=limits,
                progress=lambda n: bar.advance(task, n),
            )
    else:
        directory, info = parse_and_write(run, out, fmt=fmt, strict=strict, limits=limits)
    return {"name": run.name, "directory": str(directory), "info": info}


def _size(path: Path) -> int:
    """Bytes to parse, for the progress bar: 0 for what cannot be measured (a pipe)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0  # reading it will say what is wrong


def _report(result: dict, quiet: bool, echo=typer.echo) -> None:
    from dsim.app.parse import clock_offset_lines, little_usable_warning

    info, rep = result["info"], result["info"].report
    little = little_usable_warning(result["name"], info)
    if little is not None:  # even with --quiet: the input is probably not a training log
        typer.echo(f"warning: {little}", err=True)
    for line in clock_offset_lines(result["name"], rep.get("clock_offsets")):
        typer.echo(f"warning: {line}", err=True)  # even with --quiet: the times were changed
    if info.inconsistent:  # on stderr even with --quiet: the run's replays are suspect
        typer.echo(inconsistency_warning(result["name"], info.inconsistent), err=True)
    if quiet:
        return
    kineto = info.input_format == "kineto"
    unit = "trace event" if kineto else "line"
    read = rep.get("events", 0) if kineto else rep["lines"]
    echo(
        f"{result['name']}: {counted(info.gpu_count, 'GPU')}, "
        f"epochs {_span(list(info.epochs_present))}, "
        f"{_iterations(info)}; {rep['fetch_records']} fetch and "
        f"{counted(rep['train_records'], 'training record')} from {counted(read, unit)} "
        f"-> {result['directory']}"
    )
    if rep["rejected"]:
        echo(
            f"  skipped {counted(rep['rejected'], 'bad ' + unit)} "
            f"(listed in {result['directory']}/rejects.csv):"
        )
        for reason, count in rep["skipped"].items():
            echo(f"    {count:>8}  {reason}")
    incomplete = rep["incomplete_iterations"]["count"]
    if incomplete:
        lack = "lacks" if incomplete == 1 else "lack"
        echo(
            f"  {counted(incomplete, 'iteration')} {lack} a record for some GPU; replays drop them"
        )
    if info.gpu_util:
        echo(f"  {_utilisation(info.gpu_util)}")
    for warning in rep.get("warnings", []):
        echo(f"  warning: {warning}")
    if rep.get("stream_fetches"):
        echo(
            f"  note: {counted(rep['stream_fetches'], 'fetch record')} from an IterableDataset "
            "(stream positions): replays align fetches and change the prefetch factor, but "
            "cannot change the worker count (no sampler maps batches to workers; "
            "see --workers in `dsim run --help`)"
        )
    bound = (info.loader or {}).get("process_cores")
    domain = (info.loader or {}).get("cpu_domain_ranks")
    if bound and domain:
        who = (
            "each rank was bound to a CPU set of its own"
            if domain == 1
            else f"the ranks were bound in groups of {domain} to CPU sets of their own"
        )
        echo(
            f"  note: {who}, {counted(bound, 'CPU')} each ({info.loader['cores']} on a node "
            "together): the CPU-aware replay takes each as a node of its own, a CPU domain "
            "(run.json loader.cpu_domain_ranks; SPEC §1.2)"
        )
    elif bound:
        echo(
            f"  note: each rank's process could run on {counted(bound, 'CPU')} only, the "
            f"ranks of a node on {info.loader['cores']} together (their CPU sets differ: "
            "bound to cores of their own); the node's cores are taken as "
            f"{info.loader['cores']} (run.json loader.cores; SPEC §1.2)"
        )
    if kineto:
        echo(
            "  note: profiler traces have no fetch records: the tables hold every rank's "
            "iterations and stalls; `dsim run` replays their stall what-ifs (stall-min, "
            "stall-avg); alignment replays need dsim.instrument's fetch lines"
        )


def inconsistency_warning(name: str, problems: list[str]) -> str:
    """Two lines on stderr: the run, and why its timelines cannot come from synchronous DDP."""
    return (
        f"warning: run {name}: per-rank timelines inconsistent with synchronous DDP: "
        f"{'; '.join(problems)}\n  (ranks of one DDP job end each iteration together in the "
        "all-reduce; replays of this trace are suspect, see run.json 'consistency')"
    )


def _utilisation(util: dict) -> str:
    """``GPU utilisation: 2400 samples of GPUs 0-3 from 1 file; mean per epoch: 0: 41.2 %``."""
    by_epoch: dict[int, list[tuple[int, float]]] = {}
    for row in util["per_epoch"]:
        if row["samples"]:
            by_epoch.setdefault(row["epoch"], []).append((row["samples"], row["mean_util_pct"]))
    means = ", ".join(
        f"{e}: {sum(n * m for n, m in rows) / sum(n for n, _ in rows):.1f} %"
        for e, rows in sorted(by_epoch.items())
    )
    files = len(util["files"])
    return (
        f"GPU utilisation: {counted(util['samples'], 'sample')} of "
        f"{'GPU' if len(util['gpus']) == 1 else 'GPUs'} {_span(util['gpus'])} from "
        f"{counted(files, 'file')}; mean per epoch: {means or 'no sample in any'}"
    )


def _iterations(info) -> str:
    """``851 iterations per epoch``, or what is missing: ``epoch 1: 149 of 851 iterations``."""
    present = info.iterations_per_epoch
    declared = info.declared_iterations_per_epoch or {}
    short = [e for e, n in present.items() if e in declared and n < declared[e]]
    full = sorted({n for e, n in present.items() if e not in short})
    word = "iteration" if full == [1] else "iterations"
    parts = [f"{'/'.join(str(n) for n in full)} {word} per epoch"] if full else []
    parts += [f"epoch {e}: {present[e]} of {counted(declared[e], 'iteration')}" for e in short[:3]]
    if len(short) > 3:
        parts.append(f"{counted(len(short) - 3, 'more epoch')} incomplete")
    return ", ".join(parts) or "0 iterations per epoch"


def _span(epochs: list[int]) -> str:
    if not epochs:
        return "none"
    if epochs == list(range(epochs[0], epochs[-1] + 1)) and len(epochs) > 2:
        return f"{epochs[0]}-{epochs[-1]}"
    return ",".join(str(e) for e in epochs)


command.__doc__ = HELP
