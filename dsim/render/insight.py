"""The verdict (and, below it, whose loader is slow) as the first lines in the terminal.

A user's first question is "what would help, and by how much"; these lines
answer it before the full table (``dsim.render.terminal``) gives the detail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dsim.render.console import wrap_prose

if TYPE_CHECKING:
    from rich.console import Console

    from dsim.analysis.verdict import Verdict


def print_verdicts(
    verdicts: Sequence[Verdict],
    blame: Mapping[str, Sequence[str]] | None = None,
    console: Console | None = None,
    headlines: Mapping[str, Verdict] | None = None,
) -> None:
    """One paragraph per run: its name (when there are several), the verdict, and the
    attribution lines of that run (``blame``: results run directory, or run name → lines)
    below it.

    ``headlines`` (results directory → the more accurate model's verdict,
    ``dsim.app.headline``)
    come first where given, with the original verdict's number one line below."""
    from dsim.render.console import stdout_console

    console = console or stdout_console()
    blame = blame or {}
    headlines = headlines or {}

    def say(text: str, indent: str = "", style: str = "") -> None:
        # Wrapped here, not by rich, so that "18.0 %" and "GPU 2 27 %" stay whole.
        for line in wrap_prose(text, console.width, indent):
            console.print(line, highlight=False, markup=False, style=style, soft_wrap=True)

    for v in verdicts:
        prefix = f"{v.run}: " if len(verdicts) > 1 else ""
        head = headlines.get(v.results) if v.results is not None else None
        lines = blame.get(v.results or "", blame.get(v.run, ()))
        for text, indent, style in verdict_block(v, head, lines, prefix):
            say(text, indent, style)
    if verdicts:
        console.print()


def verdict_block(
    v: Verdict | None,
    head: Verdict | None = None,
    blame: Sequence[str] = (),
    prefix: str = "",
) -> list[tuple[str, str, str]]:
    """One run's paragraph as (text, indent, style): the headline (the more accurate
    model's verdict, ``dsim.app.headline``) with the original verdict's number one line
    below, else the verdict; its caveats; the attribution lines. `dsim run` and `dsim
    watch` both print this, so the same iterations read the same (SPEC §5.1, §9.4)."""
    out: list[tuple[str, str, str]] = []
    said = v if head is None else head
    if said is not None:
        out.append((f"{prefix}{said.text}", "", "bold"))
        if head is not None and v is not None:
            from dsim.analysis.verdict import original_line

            out.append((original_line(v), "  ", ""))
        out.extend((f"caveat: {note}", "  ", "") for note in said.caveats)
    out.extend((line, "  ", "") for line in blame)
    return out


def attribution_lines(attributions: Any, summary: Any) -> dict[str, list[str]]:
    """Run → attribution lines, for runs whose recorded selection is the summary's own
    (lines computed over other iterations than the table below would mislead)."""
    from dsim.analysis.attribution import describe

    if attributions is None or attributions.empty:
        return {}
    out: dict[str, list[str]] = {}
    for run, rows in attributions.groupby("run", sort=False):
        shown = summary[summary["run"] == run]
        if shown.empty:
            continue
        same = str(shown["selected_epochs"].iloc[0]) == str(
            rows["selected_epochs"].iloc[0]
        ) and int(shown["warmup"].iloc[0]) == int(rows["warmup"].iloc[0])
        if same:
            out[str(run)] = describe(rows)
    return out


def print_comparison(comparison: Any, console: Console | None = None) -> None:
    """The before/after table (each side measured or predicted), the realised-gain sentence,
    and warnings."""
    from rich import box
    from rich.table import Table

    from dsim.render.console import stdout_console
    from dsim.render.units import time_text, time_unit

    console = console or stdout_console()
    c = comparison
    labels = getattr(c, "before_label", "measured"), getattr(c, "after_label", "measured")
    sides = (
        "measured, actual/actual"
        if labels == ("measured", "measured")
        else f"BEFORE {labels[0]}, AFTER {labels[1]}; actual/actual"
    )
    table = Table(
        title=f"BEFORE {c.before_run} → AFTER {c.after_run} ({sides})",
        box=box.SIMPLE_HEAD,
        header_style="bold",
    )
    table.add_column("")
    for name in ("before", "after", "change"):
        table.add_column(name, justify="right", no_wrap=True)
    for d in c.deltas:
        if d.unit == "%":
            cells = (f"{d.before:.1f} %", f"{d.after:.1f} %", f"{d.change:+.1f} pts")
        else:
            rel = "" if d.change_pct != d.change_pct else f" ({d.change_pct:+.0f} %)"
            unit = time_unit([d.before, d.after])  # one unit per row (render.units)
            cells = (
                time_text(d.before, unit),
                time_text(d.after, unit),
                time_text(d.change, unit, signed=True) + rel,
            )
        table.add_row(d.label, *(cell.replace("-", "−") for cell in cells))
    console.print(table)
    console.print(c.text, highlight=False, markup=False, style="bold")
    for warning in c.warnings:
        console.print(f"warning: {warning}", highlight=False, markup=False, style="yellow")
