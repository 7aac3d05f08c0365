"""`dsim watch LOGDIR`: a running job's stall, delay, straggler and what-ifs, refreshed live.

Thin: ``dsim.app.watch.Watch`` follows and computes; ``dsim.render.live``
draws. Ctrl-C ends the loop through the project's interrupt handling
(``dsim: interrupted``, exit 130), the temporary directory removed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from dsim.commands.common import finite_at_least, require_existing

#: A day: ``time.sleep`` of ~1e10 s overflowed (an internal error), and no one waits longer.
WATCH_MAX_INTERVAL_S = 86_400.0

HELP = """Follow a running job's raw logs and show its last window of iterations, live.

Reads LOGDIR's logs as the job writes them (read-only, no locks: the job
never waits; a line counts only once its line end is written; rotated files
and ranks that start late are followed) and, every --interval seconds,
shows per GPU the iterations seen, and over the last --window complete
iterations (every rank logged them; warm-up iterations skipped as in `dsim
run`): the measured iteration time, stall and delay, the alignment what-ifs
of `dsim run`'s default policies (its per-iteration replay), the straggler
(whose fetch finished last most often) and the verdict. Ctrl-C stops it.
--once prints one snapshot and exits (for scripts and CI); --json with it
prints the snapshot as one JSON object.

\b
Examples:
  dsim watch logs/myrun                   # refresh every 2 s
  dsim watch logs/myrun --window 200 --interval 5
  dsim watch logs/myrun --once --json | jq '.window.straggler'
"""


def command(
    logdir: Annotated[
        Path,
        typer.Argument(metavar="LOGDIR", help="The job's log directory (or its single log file)."),
    ],
    window: Annotated[
        int,
        typer.Option("--window", min=1, help="Complete iterations in the window."),
    ] = 100,
    interval: Annotated[
        float,
        typer.Option(
            "--interval",
            callback=finite_at_least(0.1, WATCH_MAX_INTERVAL_S),
            help="Seconds between refreshes.",
        ),
    ] = 2.0,
    warmup: Annotated[
        int, typer.Option("--warmup", min=0, help="Skip iterations <= N of each epoch.")
    ] = 10,
    threshold: Annotated[
        float,
        typer.Option(
            "--threshold",
            callback=finite_at_least(0.0),
            help="Effective-delay threshold in seconds.",
        ),
    ] = 0.030,
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --once: the snapshot as one JSON object.")
    ] = False,
) -> None:
    from dsim.errors import UsageError

    if as_json and not once:
        raise UsageError("--json prints one snapshot: use it with --once")
    require_existing((logdir,))  # before the application's imports (pandas)
    from dsim.app.watch import Watch
    from dsim.render import live as render
    from dsim.render.console import stdout_console

    with Watch(logdir, window=window, warmup=warmup, threshold_s=threshold) as watch:
        if once:
            snapshot = watch.look()
            if watch.parse_error is not None:
                raise watch.parse_error
            if as_json:
                from dsim.render.machine import dumps

                typer.echo(dumps(render.document(snapshot)), nl=False)
                return
            console = stdout_console()
            console.print(render.renderable(snapshot, console.width))
            return
        console = stdout_console()
        if not console.is_terminal:  # piped or redirected: each new snapshot in turn
            _print_changes(watch, console, interval)
        from rich.live import Live

        first = render.renderable(watch.look(), console.width, interval_s=interval)
        with Live(first, console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                snapshot = watch.look()
                live.update(
                    render.renderable(snapshot, console.width, interval_s=interval),
                    refresh=True,
                )


def _print_changes(watch, console, interval: float) -> None:
    """Without a terminal to redraw (``dsim watch LOGDIR | tee``): print a snapshot when
    it changes, one after another, until interrupted."""
    from dsim.render import live as render

    last = None
    while True:
        snapshot = watch.look()
        if snapshot is not last:  # a look with nothing new gives back the same snapshot
            if last is not None:
                console.print()
            console.print(render.renderable(snapshot, console.width, interval_s=interval))
            console.file.flush()
            last = snapshot
        time.sleep(interval)


command.__doc__ = HELP
