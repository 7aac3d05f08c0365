"""`dsim report`: the self-contained what-if HTML report of replay results.

Thin: options → ``dsim.app.report.make_report`` (read, choose, render, write)
→ what was written. plotly and pandas are imported inside the command so that
``dsim --help`` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from dsim.commands.common import Quiet, finite_at_least, require_existing
from dsim.errors import UsageError
from dsim.io.stdout import write_stdout

IMAGE_FORMATS = ("png", "svg")

HELP = """Write a self-contained HTML what-if report (opens offline; plotly.js embedded).

RESULTS are results directories written by `dsim run` (or run directories
inside one). The report holds the summary, the verdicts, the timelines, the
delay distributions and, with the parsed traces at hand (--traces), whose
loader was late. --out names the file; its directory must exist (--out -
writes the page to stdout).

\b
Examples:
  dsim report results/ --out report.html
  dsim report results/ --run 'cpuDDP*' --policy avg/min --out cpu.html
  dsim report results-a/ results-b/myrun --out both.html --timeline-run '*resnet*'
  dsim report results/ --epochs all --warmup 0 --out all-epochs.html
  dsim report results/ --out report.html --images png   # also report_images/*.png
  dsim report results/ --out - | gzip > report.html.gz
"""


def __getattr__(name: str) -> Any:
    """``timeline_runs`` and ``predicted_gain`` lived here before ``dsim.app.report``;
    imported on first use so that ``dsim --help`` does not load pandas."""
    if name in {"timeline_runs", "predicted_gain", "MAX_TIMELINE_RUNS"}:
        from dsim.app import report

        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def command(
    results: Annotated[
        list[Path],
        typer.Argument(
            help="Results directories written by `dsim run` (or single run directories).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="The HTML file to write; - writes it to stdout.")
    ] = Path("report.html"),
    run: Annotated[
        list[str] | None,
        typer.Option("--run", "-r", help="Only runs whose name matches this glob (repeatable)."),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy", "-p", help="Only this policy, FETCH/START such as avg/min (repeatable)."
        ),
    ] = None,
    timeline_run: Annotated[
        str | None,
        typer.Option(
            "--timeline-run",
            help="Runs (a glob) offered in the timeline, delay CDF and attribution figures, "
            "largest predicted gain first (default: every run, up to 6).",
        ),
    ] = None,
    epochs: Annotated[
        str | None,
        typer.Option(
            "--epochs",
            help="Epochs the statistics use: all, N, N,M or N-M (default: as `dsim run` recorded).",
        ),
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(
            "--warmup", min=0, help="Skip iterations <= N of each epoch (default: recorded)."
        ),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold",
            callback=finite_at_least(0.0),
            help="Effective-delay threshold in seconds (default: recorded, else 0.030).",
        ),
    ] = None,
    traces: Annotated[
        Path,
        typer.Option(
            "--traces",
            help="Directory of the parsed runs, for the attribution figures "
            "(default: ./traces, as `dsim run`).",
        ),
    ] = Path("traces"),
    images: Annotated[
        str | None,
        typer.Option(
            "--images",
            help="Also write each figure as png or svg next to the report (needs kaleido).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Accept a --threshold of 1 s or more (in seconds).")
    ] = False,
    mlflow: Annotated[
        bool,
        typer.Option(
            "--mlflow",
            help="Also log the summary and the report to MLflow ($MLFLOW_TRACKING_URI, else "
            "./mlruns; needs the mlflow extra of dsim).",
        ),
    ] = False,
    quiet: Quiet = False,
) -> None:
    # Here, not at the top: dsim.options loads numpy, which every other command (and
    # `dsim --help`) would then pay for at start-up.
    from dsim.options import parse_epochs_option, parse_policy_option

    if images is not None and images.lower() not in IMAGE_FORMATS:
        raise UsageError(f"--images must be one of {', '.join(IMAGE_FORMATS)}, not {images!r}")
    epoch_sel = parse_epochs_option(epochs)
    policies = [parse_policy_option(p) for p in policy or []] or None
    if mlflow:
        from dsim.app.tracking import require_mlflow
        from dsim.config import MlflowSettings

        require_mlflow(MlflowSettings())  # before any work

    require_existing(results)  # before the application's imports (pandas, plotly)
    from dsim.app.report import (
        ReportRequest,
        check_output,
        make_report,
        require_image_renderer,
        write_images,
    )

    to_stdout = str(out) == "-"
    if to_stdout and images is not None:
        raise UsageError("--images writes files next to the report: give --out FILE, not -")
    if images is not None:
        require_image_renderer(images.lower())  # before any work: nothing is written
    if not to_stdout:
        check_output(out)

    def say(text: str) -> None:
        if not quiet:
            typer.echo(f"dsim: {text}", err=True)

    outcome = make_report(
        ReportRequest(
            results=list(results),
            out=out,
            runs=run or [],
            policies=policies,
            epochs=epoch_sel,
            warmup=warmup,
            threshold_s=threshold,
            timeline_run=timeline_run,
            traces=traces,
            force=force,
        ),
        say,
        sink=write_stdout if to_stdout else None,
    )
    for note in outcome.notes:
        say(f"note: {note}")
    if to_stdout:
        sys.stdout.flush()
        return

    def images_out() -> Path:
        return write_images(outcome.figures, out, str(images).lower())

    tracked = None
    if mlflow:
        from dsim.app.tracking import track_answer
        from dsim.config import MlflowSettings

        tracked = track_answer(outcome.answer, MlflowSettings(), artifacts=[out], command="report")
    if quiet:
        if images is not None:
            images_out()
        return
    size_mb = out.stat().st_size / 1e6
    runs = outcome.runs
    typer.echo(
        f"wrote {out} ({runs} run{'s' if runs != 1 else ''}, "
        f"{len(outcome.answer.summary)} policy rows, {size_mb:.1f} MB)"
    )
    if tracked is not None:
        typer.echo(tracked.text(), err=True)
    if images is not None:
        folder = images_out()
        typer.echo(f"wrote {len(outcome.figures)} {images.lower()} images to {folder}")


command.__doc__ = HELP
