"""`dsim parse`: raw DDP logs -> one table directory per run."""

from __future__ import annotations

import contextlib
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import typer

from dsim.errors import DsimError, InputError

HELP = """Parse raw PyTorch DDP logs into per-run Parquet tables (fetch.parquet,
train.parquet, run.json) under --out.

PATH is a log file, a directory holding one run's logs (one interleaved file
or one *.log file per rank), or a tree of runs. Bad lines are skipped, counted
by reason and listed in <out>/<run>/rejects.csv; --strict stops at the first.

\b
Examples:
  dsim parse logs/output.log
  dsim parse logs/myrun/ --name myrun --out traces
  dsim parse log/ --quiet          # a whole tree of runs, in parallel
"""


def command(
    paths: list[Path] = typer.Argument(..., help="Log files, run directories or trees of runs."),
    out: Path = typer.Option(Path("traces"), "--out", "-o", help="Where run directories go."),
    strict: bool = typer.Option(False, "--strict", help="Stop at the first bad record."),
    name: str | None = typer.Option(None, "--name", help="Name of the run (one run only)."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Runs parsed at once (0: one per core)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing but errors."),
) -> None:
    from dsim.discover import discover_runs

    runs = discover_runs(paths, name=name)
    show_progress = not quiet and sys.stderr.isatty()
    failures: list[DsimError] = []
    workers = min(len(runs), jobs or os.cpu_count() or 1)
    if workers <= 1:
        for run in runs:
            try:
                _report(_parse_and_write(run, out, strict, show_progress), quiet)
            except InputError as exc:
                failures.append(exc)
                if strict:
                    break
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool, _runs_bar(show_progress) as bar:
            futures = [pool.submit(_parse_and_write, run, out, strict, False) for run in runs]
            task = bar.add_task("parsing runs", total=len(futures)) if bar else None
            for future in as_completed(futures):
                try:
                    _report(future.result(), quiet, _echo_above(bar))
                except InputError as exc:
                    failures.append(exc)
                if bar:
                    bar.advance(task)
    if failures:
        for failure in failures[:-1]:
            typer.echo(f"dsim: error: {failure}", err=True)
        raise failures[-1]


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


def _parse_and_write(run, out: Path, strict: bool, show_progress: bool) -> dict:
    from dsim.parse import parse_run
    from dsim.tables import write_run

    if show_progress:
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        total = sum(p.stat().st_size for p in run.files)
        columns = (
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, transient=True) as bar:
            task = bar.add_task(f"parsing {run.name}", total=total)
            parsed = parse_run(run, strict=strict, progress=lambda n: bar.advance(task, n))
    else:
        parsed = parse_run(run, strict=strict)
    directory = write_run(parsed.tables, out / run.name, parsed.rejects)
    return {"name": run.name, "directory": str(directory), "info": parsed.tables.info}


def _report(result: dict, quiet: bool, echo=typer.echo) -> None:
    if quiet:
        return
    info, rep = result["info"], result["info"]["report"]
    per_epoch = sorted(set(info["iterations_per_epoch"].values()))
    iters = "/".join(str(v) for v in per_epoch) or "0"
    echo(
        f"{result['name']}: {info['gpus']} GPUs, epochs {_span(info['epochs'])}, "
        f"{iters} iterations per epoch; {rep['fetch_records']} fetch and "
        f"{rep['train_records']} training records from {rep['lines']} lines "
        f"-> {result['directory']}"
    )
    if rep["rejected"]:
        echo(
            f"  skipped {rep['rejected']} bad lines (listed in {result['directory']}/rejects.csv):"
        )
        for reason, count in rep["skipped"].items():
            echo(f"    {count:>8}  {reason}")
    incomplete = rep["incomplete_iterations"]["count"]
    if incomplete:
        echo(f"  {incomplete} iterations lack a record for some GPU; replays drop them")
    for warning in rep.get("warnings", []):
        echo(f"  warning: {warning}")


def _span(epochs: list[int]) -> str:
    if not epochs:
        return "none"
    if epochs == list(range(epochs[0], epochs[-1] + 1)) and len(epochs) > 2:
        return f"{epochs[0]}-{epochs[-1]}"
    return ",".join(str(e) for e in epochs)


command.__doc__ = HELP
