"""The verdict (and, below it, whose loader is slow) as the first lines in the terminal.

A user's first question is "what would help, and by how much"; these lines
answer it before the full table (``dsim.render.terminal``) gives the detail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from dsim.verdict import Verdict


def print_verdicts(verdicts: Sequence[Verdict], console: Console | None = None) -> None:
    """One paragraph per run: its name (when there are several) and the verdict."""
    from rich.console import Console

    console = console or Console()
    for v in verdicts:
        prefix = f"{v.run}: " if len(verdicts) > 1 else ""
        console.print(f"{prefix}{v.text}", highlight=False, markup=False, style="bold")
    if verdicts:
        console.print()
