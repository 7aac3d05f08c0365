"""`dsim tune`: which DataLoader settings to use, predicted by the pipeline model.

Thin: options become ``dsim.app.tune.tune_run`` calls; output goes through
``dsim.render.tune``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dsim.commands.common import Quiet

HELP = """Sweep num_workers x prefetch_factor with the pipeline model and recommend one.

Prints first the cheapest setting (fewest workers, then smallest prefetch)
within 2 % of the best predicted, its predicted iteration time, stall and
speed-up with a 95 % band (bootstrap over iterations, widened by the 95th
percentile of the model's error on re-runs for that kind of what-if,
FIDELITY.md), what it
costs, and where more workers stop helping and why; then the curve as a
workers x prefetch table, alone and with the best alignment. Writes
RESULTS/tune/<run>.{parquet,csv}.

\b
Examples:
  dsim tune myrun                         # traces/myrun, the default grid
  dsim tune myrun --workers 1-8 --prefetch 1,2,4
  dsim tune myrun --json | jq '.[0].recommendation'
"""


def command(
    runs: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="RUN",
            help="Run names, globs ('*': every run) or run directories.",
            show_default=False,
        ),
    ] = None,
    traces: Annotated[
        Path, typer.Option("--traces", help="Directory of parsed runs (dsim parse --out).")
    ] = Path("traces"),
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Results directory; the table goes to OUT/tune/.")
    ] = Path("results"),
    workers: Annotated[
        list[str] | None,
        typer.Option(
            "--workers",
            metavar="LIST",
            help="num_workers to try: 1,2,4,8 or 1-8, or repeated (default: 0,1,2,4,... past "
            "the cores).",
        ),
    ] = None,
    prefetch: Annotated[
        list[str] | None,
        typer.Option(
            "--prefetch",
            metavar="LIST",
            help="prefetch_factor to try: 1,2,4 (default) or 1-4, or repeated.",
        ),
    ] = None,
    epochs: Annotated[
        str | None, typer.Option("--epochs", help="Epochs: 1,2 or 'all' (default: all but 0).")
    ] = None,
    warmup: Annotated[
        int | None, typer.Option("--warmup", min=0, help="Skip iterations <= N (default 10).")
    ] = None,
    no_alignment: Annotated[
        bool, typer.Option("--no-alignment", help="Sweep the loader alone, no alignment.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list (one object per run), nothing else.")
    ] = False,
    quiet: Quiet = False,
) -> None:
    from dsim.config import nothing_to_run, resolve_run_directories
    from dsim.errors import UsageError
    from dsim.options import loader_grids, parse_epochs_option

    if not runs:  # optional for click, so that the message can name the runs there are
        raise UsageError(nothing_to_run(traces, "tune"))
    # a repeated option adds its values to the grid (issue #19: never last-wins)
    grid_w, grid_p = loader_grids(_joined(workers), _joined(prefetch))
    chosen = parse_epochs_option(epochs)
    dirs = resolve_run_directories(runs, traces, "runs to tune")
    # the application (pandas, ~0.3 s) only once the options and runs are known good
    from dsim.app.tune import tune_run
    from dsim.render import tune as render

    results = [
        tune_run(
            d,
            workers=grid_w,
            prefetch=grid_p,
            epochs=chosen,
            warmup=warmup,
            alignment=not no_alignment,
            out=out,
        )
        for d in dirs
    ]
    if as_json:
        from dsim.render.machine import dumps

        typer.echo(dumps([render.document(r) for r in results]), nl=False)
        return
    if quiet:
        return
    for i, result in enumerate(results):
        if i:
            typer.echo("")
        typer.echo("\n".join(render.lines(result)))
        typer.echo(f"wrote {', '.join(str(f) for f in result.files)}")


def _joined(values: list[str] | None) -> str | None:
    return ",".join(values) if values else None


command.__doc__ = HELP
