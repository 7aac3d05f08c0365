"""`dsim help spec [SECTION]`: the specification that help texts and the report cite.

Thin: the spec ships with the package (``dsim.spec``); this prints the table
of contents or one section as plain text on stdout.
"""

from __future__ import annotations

from typing import Annotated

import typer

HELP = """Print dsim's specification, or one section of it (the spec ships with dsim).

Help texts, notes and the HTML report cite sections as §N.M; this prints
them as plain text. Without SECTION, the numbered sections are listed.

\b
Examples:
  dsim help spec              # the sections
  dsim help spec 5.6          # the --json document and its schema
  dsim help spec "One answer" # a named part of a section
  dsim help spec 4 | less     # a whole chapter, subsections included
"""


def spec(
    section: Annotated[
        str | None,
        typer.Argument(
            help="A section number (5.6, §5.6) or words of its title; none lists them.",
            show_default=False,
        ),
    ] = None,
) -> None:
    from dsim import spec as specification

    text = specification.text()
    if section is None:
        typer.echo(specification.contents(text), nl=False)
    else:
        typer.echo(specification.find(text, section), nl=False)


spec.__doc__ = HELP
