"""Options that several commands share, declared once (Typer's ``Annotated`` style).

A flag that means the same on every command it appears on is spelled,
documented and typed here, so ``dsim run --json`` and ``dsim summarize
--json`` cannot drift apart.
"""

from __future__ import annotations

from typing import Annotated

import typer

Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]
Json = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print the summary, verdicts and checks as one JSON object on stdout, nothing else.",
    ),
]
FailIf = Annotated[
    list[str] | None,
    typer.Option(
        "--fail-if",
        metavar="CONDITION",
        help="METRIC\\[@FETCH/START] OP NUMBER, e.g. 'effective_delay_pct>10': exit with code 5 "
        "when it holds for a run's measured (or that policy's) row. Repeatable.",
    ),
]
Full = Annotated[
    bool,
    typer.Option(
        "--full", help="Every run's table, also when an overview of many runs is printed."
    ),
]
