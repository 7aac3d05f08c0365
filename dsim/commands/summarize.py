"""`dsim summarize`: summary tables of existing replay results, without replaying.

Thin: parses options, asks the application for the answer
(``dsim.app.summarize.summarize_answer``) and picks its renderer (terminal,
``--json``, ``--out -``); it imports no analysis module.
"""

from __future__ import annotations

from pathlib import Path

import typer

from dsim.commands.common import FailIf, Full, Json, Quiet, finite_at_least, require_existing
from dsim.io.stdout import write_stdout

HELP = """Summarise replay results written by `dsim run`, without replaying anything.

RESULTS are results directories (or run directories inside one); several are
summarised together. Prints one row per run and policy:
mean ± sample std of iteration time, training stall, inter-GPU delay and the
start/fetch spreads, the share of iterations with an effective delay, and the
what-if columns against the measured run (actual/actual). Epoch selection,
warm-up and threshold default to what `dsim run` recorded; options override them.
With --out the table is also written (atomically) as OUT/summary.<format>;
--out - writes the one --format to stdout instead of the table. --json prints
the summary, verdicts and checks as one JSON object on stdout, nothing else.
--fail-if METRIC\\[@FETCH/START] OP NUMBER (repeatable) exits with code 5 when
the condition holds for a run's measured row (or that policy's row).
Only the replays each run's result.json lists are read, and only if they
match it; stale replays of policies no longer configured are ignored.

\b
Examples:
  dsim summarize results/
  dsim summarize results/ --epochs all --warmup 0 --threshold 0.05
  dsim summarize results/ --policy avg/min --policy actual__actual --run 'fsN*resnet50*'
  dsim summarize results-a/ results-b/ --out summaries/ --format csv,parquet,json
  dsim summarize results/ --json | jq '.verdicts[].text'
  dsim summarize results/ --out - --format csv > summary.csv
  dsim summarize results/ --fail-if 'effective_delay_pct>10' --fail-if 'speedup@min/min>1.5'
"""


def command(
    results: list[Path] = typer.Argument(
        ..., help="Results directories written by `dsim run` (or run directories inside them)."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Also write the summary to OUT/summary.<format>; - writes one format to stdout.",
    ),
    formats: str | None = typer.Option(
        None,
        "--format",
        "-f",
        help="Formats written with --out: csv, parquet, json (default csv,parquet).",
    ),
    as_json: Json = False,
    fail_if: FailIf = None,
    run_globs: list[str] = typer.Option(
        None, "--run", "-r", help="Only runs whose name matches this glob (repeatable)."
    ),
    policy_specs: list[str] = typer.Option(
        None, "--policy", "-p", help="Only this policy, FETCH/START or FETCH__START (repeatable)."
    ),
    epochs: str | None = typer.Option(
        None, "--epochs", help="Epochs to summarise: 1,2 or all (default: as `dsim run` recorded)."
    ),
    warmup: int | None = typer.Option(
        None,
        "--warmup",
        min=0,
        help="Skip iterations <= N of each epoch (default: as recorded, else 10).",
    ),
    threshold: float | None = typer.Option(
        None,
        "--threshold",
        callback=finite_at_least(0.0),
        help="Effective-delay threshold in seconds (default: as recorded).",
    ),
    force: bool = typer.Option(
        False, "--force", help="Accept a --threshold of 1 s or more (it is in seconds)."
    ),
    quiet: Quiet = False,
    full: Full = False,
) -> None:
    from dsim.errors import UsageError
    from dsim.options import (
        parse_conditions,
        parse_epochs_option,
        parse_formats,
        parse_policy_option,
    )

    # Validate before any work.
    format_names = parse_formats(formats or "csv,parquet")
    to_stdout = out is not None and str(out) == "-"
    if formats is not None and out is None:
        raise UsageError(
            "--format chooses the files --out writes: give --out DIR (or --out - for stdout), "
            "or use --json to print the summary as JSON"
        )
    if to_stdout and (len(format_names) != 1 or as_json):
        raise UsageError(
            "--out - writes one file to stdout: choose one --format (csv, parquet or json), "
            "without --json"
        )
    conditions = parse_conditions(fail_if)
    policies = [parse_policy_option(p) for p in policy_specs] if policy_specs else None
    epoch_option = parse_epochs_option(epochs)

    def say(text: str) -> None:
        if not quiet:
            typer.echo(f"dsim: {text}", err=True)

    # after the options and paths are checked: such an error costs no pandas import
    require_existing(results)
    from dsim.app.summarize import summarize_answer

    answer = summarize_answer(
        results,
        run_globs=run_globs,
        policies=policies,
        epochs=epoch_option,
        warmup=warmup,
        threshold_s=threshold,
        conditions=conditions,
        out=None if to_stdout else out,
        formats=format_names,
        on_wait=say,
        force=force,
    )
    for note in answer.notes:
        say(f"note: {note}")
    if to_stdout:
        from dsim.render.files import answer_bytes

        write_stdout(answer_bytes(answer, format_names[0]))
    elif as_json:
        from dsim.render.machine import answer_document, dumps

        write_stdout(dumps(answer_document(answer)))
    elif not quiet:
        from dsim.render.terminal import print_answer

        print_answer(answer, full=full)
    if not quiet:
        for path in answer.written:
            typer.echo(f"wrote {path}", err=True)
    answer.raise_if_held()


command.__doc__ = HELP
