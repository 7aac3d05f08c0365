"""`dsim compare BEFORE AFTER`: measured deltas and the share of the predicted gain realised.

Thin: finds one run on each side (``dsim.model.results``), summarises both with
their recorded selection (``dsim.summary``), compares (``dsim.compare``) and
prints or writes the result.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

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
  dsim compare results/old_run results/new_run --format json
"""

FORMATS = ("text", "csv", "json")


def _one_run(path: Path, side: str, scan_results: Any) -> Any:
    from dsim.errors import UsageError

    runs = scan_results([path]).runs
    if len(runs) != 1:
        names = ", ".join(r.name for r in runs[:5]) + (" …" if len(runs) > 5 else "")
        raise UsageError(
            f"{side} {path} holds {len(runs)} runs ({names}); name one run directory, "
            f"e.g. {Path(path) / runs[0].name}"
        )
    return runs[0]


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def command(
    before: Path = typer.Argument(..., help="The run before the change (results/<run>)."),
    after: Path = typer.Argument(..., help="The run after the change (results/<run>)."),
    policy: str | None = typer.Option(
        None, "--policy", "-p", help="Policy whose predicted gain is checked (default: best)."
    ),
    fmt: str = typer.Option("text", "--format", "-f", help="text, csv or json (on stdout)."),
) -> None:
    from dsim.compare import compare
    from dsim.errors import UsageError
    from dsim.io import lock
    from dsim.model.results import results_directories, scan_results
    from dsim.options import parse_policy_option
    from dsim.summary import summarize_results

    if fmt.lower() not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    chosen = parse_policy_option(policy) if policy else None
    with lock.shared(results_directories([before, after])):
        sides = [_one_run(p, s, scan_results) for p, s in ((before, "BEFORE"), (after, "AFTER"))]
        rows = [summarize_results([run]).to_dict("records") for run in sides]
    try:
        result = compare(rows[0], rows[1], chosen)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    fmt = fmt.lower()
    if fmt == "json":
        record = {k: _plain(v) for k, v in result.record().items()}
        record["warnings"] = result.warnings
        typer.echo(json.dumps(record, indent=2, allow_nan=False))
        return
    if fmt == "csv":
        import pandas as pd

        typer.echo(pd.DataFrame([result.record()]).to_csv(index=False), nl=False)
        return
    from dsim.render.insight import print_comparison

    print_comparison(result)


command.__doc__ = HELP
