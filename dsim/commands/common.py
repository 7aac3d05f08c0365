"""Options that several commands share, declared once (Typer's ``Annotated`` style).

A flag that means the same on every command it appears on is spelled,
documented and typed here, so ``dsim run --json`` and ``dsim summarize
--json`` cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
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


def finite_at_least(
    bound: float, most: float | None = None
) -> Callable[[float | None], float | None]:
    """A callback that takes a finite number ≥ ``bound`` (and ≤ ``most``), or no value.

    Why not the option's ``min=``: that range check says "should be ≥ 0" of
    ``nan`` (it compares false with every bound), and lets ``inf`` through to
    a message about units (``--threshold inf``); neither says what is wrong.
    """

    def check(value: float | None) -> float | None:
        if value is None:
            return None
        if value != value:
            raise typer.BadParameter(f"{value} is not a number")
        if value in (float("inf"), float("-inf")):
            raise typer.BadParameter(f"{value} is not a finite number")
        if value < bound:
            raise typer.BadParameter(f"{value:g} is below {bound:g}")
        if most is not None and value > most:
            raise typer.BadParameter(f"{value:g} is above {most:g}")
        return value

    return check


def require_existing(paths: Iterable[Path]) -> None:
    """An ``InputError`` for the first of ``paths`` that does not exist, worded as the
    application words it (exit 3), before the command imports the application.

    Why: a mistyped directory is the most common input error, and the application's
    modules load pandas (~0.3 s) before they would look.
    """
    from dsim.errors import InputError

    for path in paths:
        if not path.exists():
            raise InputError("no such file or directory", path)
