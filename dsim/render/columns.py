"""The summary's columns as readers see them: one list for the terminal and the HTML table.

A column added to the summary, or renamed, changes here once, and both renderers
follow: the terminal uses the ``short`` label (its width is scarce), the HTML
table the ``long`` one with its unit. No I/O and no plotly, so the terminal can
import it without slowing ``dsim --help``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SummaryColumn:
    """One column of the summary table."""

    key: str  # metric stem (``<key>_mean``, ``<key>_std``) or summary column
    long: str  # HTML header, before the unit
    short: str | None  # terminal header; None: not shown in the terminal
    unit: str  # "s", "%", "×", "pts" or "" (a count)


POLICY = SummaryColumn("policy", "policy (fetch / start)", "fetch/start", "")
ITERATIONS = SummaryColumn("iterations", "iterations", None, "")

METRICS = (
    SummaryColumn("iteration_s", "iteration time", "iter. time", "s"),
    SummaryColumn("stall_s", "training stall", "stall", "s"),
    SummaryColumn("delay_s", "delay", "delay", "s"),
    SummaryColumn("start_diff_s", "start diff", "start diff", "s"),
    SummaryColumn("fetch_diff_s", "fetch diff", "fetch diff", "s"),
)
"""Mean ± sample std columns, in table order."""

EFFECTIVE_DELAY = SummaryColumn("effective_delay_pct", "effective delay", "eff. delay", "%")
SPEEDUP = SummaryColumn("speedup", "speedup", "speed-up", "×")
STALL_CHANGE = SummaryColumn("stall_change_s", "stall change", None, "s")
EFFECTIVE_CHANGE = SummaryColumn(
    "effective_delay_change_pts", "eff. delay change", "eff. change", "pts"
)

SUMMARY_TABLE = (
    POLICY,
    ITERATIONS,
    *METRICS,
    EFFECTIVE_DELAY,
    SPEEDUP,
    STALL_CHANGE,
    EFFECTIVE_CHANGE,
)
"""Every column of the summary table in order; the terminal shows those with a
``short`` label (fewer in its narrow layouts)."""


def header(column: SummaryColumn) -> str:
    """The HTML header: the long label and its unit, ``effective delay (%)``; a time column's
    cells carry their own unit (ms below one second, ``dsim.render.units``), so its header
    names none."""
    return f"{column.long} ({column.unit})" if column.unit and column.unit != "s" else column.long
