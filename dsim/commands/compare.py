"""`dsim compare BEFORE AFTER`: measured deltas and the share of the predicted gain realised.

Thin: ``dsim.app.compare.compare_runs`` finds one run on each side, summarises
both with their recorded selection and compares them; this prints the result
(terminal, CSV, or the ``--json`` document of ``dsim.render.machine``).
"""

from __future__ import annotations

from pathlib import Path

import typer

HELP = """Compare two runs: BEFORE (e.g. the trace before a loader fix) and AFTER.

BEFORE and AFTER are run directories inside results directories
(results/<run>), or results directories that hold one run each. Prints the
measured (actual/actual) iteration time, stall, delay and effective delay of
both and their change, and the share of BEFORE's predicted gain under a
policy (default: BEFORE's best) that AFTER realised. Each side uses the
epochs, warm-up and threshold its `dsim run` recorded.

\b
Examples:
  dsim compare results/old_run results/new_run
  dsim compare results-before/ results-after/ --policy min/min
  dsim compare results/old_run results/new_run --json
"""

FORMATS = ("text", "csv", "json")


def command(
    before: Path = typer.Argument(..., help="The run before the change (results/<run>)."),
    after: Path = typer.Argument(..., help="The run after the change (results/<run>)."),
    policy: str | None = typer.Option(
        None, "--policy", "-p", help="Policy whose predicted gain is checked (default: best)."
    ),
    fmt: str = typer.Option(
        "text", "--format", "-f", help="text, csv or json (json: the same as --json)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the comparison as one JSON object on stdout, nothing else."
    ),
) -> None:
    from dsim.app.compareside import check_side
    from dsim.errors import UsageError
    from dsim.options import parse_policy_option

    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if as_json and fmt not in {"text", "json"}:
        raise UsageError(f"--json prints JSON: drop --format {fmt}")
    chosen = parse_policy_option(policy) if policy else None
    check_side(before, "BEFORE")
    check_side(after, "AFTER")
    # the application (pandas, ~0.3 s) only once both sides are there
    from dsim.app.compare import compare_runs

    result = compare_runs(before, after, chosen)
    if as_json or fmt == "json":
        from dsim.render.machine import compare_document, dumps

        typer.echo(dumps(compare_document(result)), nl=False)
        return
    if fmt == "csv":
        import pandas as pd

        typer.echo(pd.DataFrame([result.record()]).to_csv(index=False), nl=False)
        return
    from dsim.render.insight import print_comparison

    print_comparison(result)


command.__doc__ = HELP
