"""`dsim summarize`: summary tables of existing replay results, without replaying.

Thin: finds result runs (``dsim.model.results``), filters them, summarises
(``dsim.summary``) and renders (``dsim.render``).
"""

from __future__ import annotations

from pathlib import Path

import typer

HELP = """Summarise replay results written by `dsim run`, without replaying anything.

RESULTS are results directories (or run directories inside one); several are
summarised together. Prints one row per run and policy:
mean ± sample std of iteration time, training stall, inter-GPU delay and the
start/fetch spreads, the share of iterations with an effective delay, and the
what-if columns against the measured run (actual/actual). Epoch selection,
warm-up and threshold default to what `dsim run` recorded; options override them.
With --out the table is also written (atomically) as OUT/summary.<format>.
Only the replays each run's result.json lists are read, and only if they
match it; stale replays of policies no longer configured are ignored.

\b
Examples:
  dsim summarize results/
  dsim summarize results/ --epochs all --warmup 0 --threshold 0.05
  dsim summarize results/ --policy avg/min --policy actual__actual --run 'fsN*resnet50*'
  dsim summarize results-a/ results-b/ --out summaries/ --format csv,parquet,json
"""


def command(
    results: list[Path] = typer.Argument(
        ..., help="Results directories written by `dsim run` (or run directories inside them)."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Also write the summary to OUT/summary.<format>."
    ),
    formats: str = typer.Option(
        "csv,parquet", "--format", "-f", help="Formats written with --out: csv, parquet, json."
    ),
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
        min=0.0,
        help="Effective-delay threshold in seconds (default: as recorded).",
    ),
    force: bool = typer.Option(
        False, "--force", help="Accept a --threshold of 1 s or more (it is in seconds)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing but errors."),
    full: bool = typer.Option(
        False, "--full", help="Every run's table, also when an overview of many runs is printed."
    ),
) -> None:
    from dsim.io import lock
    from dsim.io.atomic import remove_leftovers
    from dsim.model.results import results_directories, scan_results
    from dsim.options import parse_epochs_option, parse_policy_option, select_runs
    from dsim.render.files import parse_formats, write_summary_files
    from dsim.sanity import check_threshold
    from dsim.summary import summarize_results

    format_names = parse_formats(formats)  # validate before any work
    check_threshold(threshold, force=force)
    policies = [parse_policy_option(p) for p in policy_specs] if policy_specs else None
    epoch_option = parse_epochs_option(epochs)

    def say(text: str) -> None:
        if not quiet:
            typer.echo(f"dsim: {text}", err=True)

    written = []
    with lock.shared(results_directories(list(results)), say):  # no `dsim run` rewrites them now
        scan = scan_results(list(results))
        runs = select_runs(scan.runs, run_globs)
        summary = summarize_results(
            runs, epochs=epoch_option, warmup=warmup, threshold_s=threshold, policies=policies
        )
        if out is not None:
            remove_leftovers(out)  # temporaries of a killed writer
            written = write_summary_files(summary, out, format_names)
    for note in scan.notes(runs):
        say(f"note: {note}")
    if quiet:
        return
    from rich.console import Console

    from dsim.app.attribution import read_attributions
    from dsim.render.insight import attribution_lines, print_verdicts
    from dsim.render.terminal import print_summary
    from dsim.verdict import run_verdicts

    blame = attribution_lines(read_attributions(results_directories(list(results))), summary)
    print_verdicts(run_verdicts(summary, {str(r.directory): r.info for r in runs}), blame)
    print_summary(summary, full=full)
    for path in written:
        Console(stderr=True).print(f"wrote {path}", highlight=False)


command.__doc__ = HELP
