"""The summary as a readable terminal table (``dsim run``, ``dsim summarize``).

One table per run and policy rows; each metric as mean ± sample std so that
the spread is never hidden behind a mean, and the what-if columns against the
measured run (``actual/actual``) last. The table takes the console's width:
the widest layout that fits is printed (one line per policy, then mean and ±
on two lines, then fewer columns), so a number is never cut. Run titles are
wrapped at the separators of the name, never inside a word. With many runs an
overview of one row per run replaces the tables unless ``full`` is asked for.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsim.render.columns import EFFECTIVE_CHANGE, EFFECTIVE_DELAY, METRICS, POLICY, SPEEDUP
from dsim.render.console import wrap_prose
from dsim.render.units import time_number, time_unit
from dsim.words import counted

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from dsim.app.answer import Answer

# (column title, metric stem) for the mean ± std columns
_METRICS = tuple((str(c.short), c.key) for c in METRICS)

OVERVIEW_RUNS = 10
WHAT_IF = "*"  # the overview's mark of a loader what-if's row
"""More runs than this print the one-row-per-run overview instead of the tables."""

BEST, SLOWER = "best", "slower"
"""Marks of the policy with the largest speed-up and of a policy slower than measured."""

_NO_CHANGE = 0.0005
"""Speed-ups within this of 1 are neither the best nor a regression: rounding noise."""


@dataclass(frozen=True)
class Layout:
    """How wide a table is drawn: which metrics, and ± on the mean's line or below it."""

    name: str
    metrics: tuple[tuple[str, str], ...]
    one_line: bool
    extra: bool  # start/fetch diff and eff. change columns


LAYOUTS = (
    Layout("wide", _METRICS, True, True),
    Layout("two-line", _METRICS, False, True),
    Layout("narrow", _METRICS[:3], False, False),
    Layout("minimal", _METRICS[:2], False, False),
)
"""From widest to narrowest; the first that fits the console is used."""


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def column_unit(values: Sequence[Any]) -> str:
    """``ms`` when every value of a column is below one second, else ``s`` (``render.units``)."""
    return time_unit(values)


def fmt_seconds(value: Any, unit: str) -> str:
    """Seconds in ``unit``: 0.1 ms resolution either way (``12.3`` ms, ``1.2345`` s)."""
    return time_number(value, unit)


def mean_std(mean: Any, std: Any, unit: str = "s", *, one_line: bool = False) -> str:
    """``mean ±std`` on one line or two; no std when undefined (fewer than two iterations)."""
    if _missing(mean):
        return "–"
    text = fmt_seconds(mean, unit)
    if _missing(std):
        return text
    return f"{text}{' ' if one_line else chr(10)}±{fmt_seconds(std, unit)}"


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "–" if _missing(value) else f"{value:{spec}}{suffix}"


def marks(summary: pd.DataFrame) -> list[str]:
    """Per row: ``best`` for the verdict's best policy of its run
    (``dsim.analysis.verdict.best_row``:
    the lowest mean iteration time, exact ties to the simpler policy; only when its speed-up
    is above 1), ``slower`` for a speed-up below 1, else empty. Rows are one run's policies.
    """
    from dsim.analysis.verdict import best_row

    speed = [None if _missing(v) else float(v) for v in summary.get("speedup", [])]
    out = ["" for _ in range(len(summary))]
    finite = [(v, i) for i, v in enumerate(speed) if v is not None]
    records = summary.to_dict("records")
    candidates = [(r, i) for i, r in enumerate(records) if speed[i] is not None]
    if candidates and {"fetch_align", "start_align", "iteration_s_mean"} <= set(summary.columns):
        try:
            chosen = best_row([r for r, _ in candidates])
        except ValueError:  # no row with a mean iteration time
            chosen = None
        at = next((i for r, i in candidates if r is chosen), None)
        if at is not None and speed[at] > 1 + _NO_CHANGE:  # type: ignore[operator]
            out[at] = BEST
    for v, i in finite:
        if v < 1 - _NO_CHANGE:
            out[i] = SLOWER
    return out


_BREAK = re.compile(r"(?<=[_@\-/.,])|(?<= )")


def wrap_words(text: str, width: int) -> list[str]:
    """Lines of at most ``width`` characters, broken only after ``_ @ - / . ,`` or a space.

    A piece longer than ``width`` with no separator stays whole on its own line
    (never cut mid-word); the terminal folds it, which is the lesser evil.
    """
    lines: list[str] = []
    current = ""
    for piece in (p for p in _BREAK.split(text) if p):
        if current and len(current) + len(piece.rstrip()) > width:
            lines.append(current.rstrip())
            current = piece.lstrip()
        else:
            current += piece
    if current.strip():
        lines.append(current.rstrip())
    return lines or [""]


def _loader_origin(row: dict[str, Any]) -> str:
    """Whether the run's own loader settings were logged or inferred (SPEC §4.2)."""
    source = row.get("loader_source")
    if source == "implied":
        return " (workers inferred from worker ids, prefetch PyTorch's default: assumed)"
    if source == "log":
        return " (as logged: LOADER lines)"
    if source == "log+ids":
        return " (workers from worker ids, more than the LOADER lines say; prefetch as logged)"
    return " (as measured)"  # results written before dsim recorded the source


def _run_title(row: dict[str, Any]) -> str:
    """Run name, GPU count and iteration count (the same for every policy of a run)."""
    facts = []
    if not _missing(row.get("gpus")):
        facts.append(counted(int(row["gpus"]), "GPU"))
    if not _missing(row.get("iterations")):
        facts.append(counted(int(row["iterations"]), "iteration"))
    model = row.get("replay_model")
    if not _missing(model) and model != "per-iteration":
        text = f"{model} model"
        if not _missing(row.get("loader_workers")):
            workers, prefetch = int(row["loader_workers"]), row.get("loader_prefetch_factor")
            text += f", {counted(workers, 'worker')}, prefetch {int(prefetch)}"
            text += " (what-if)" if row.get("loader_changed") else _loader_origin(row)
        facts.append(text)
    return f"{row.get('run')}" + (f" ({', '.join(facts)})" if facts else "")


def _head(label: str | None, at: str, layout: Layout) -> str:
    """A column header, broken after its first ``at`` when ± goes on a second line
    (``eff.`` / ``delay``): the two-line layouts are narrow."""
    text = str(label)
    return text if layout.one_line else text.replace(at, at.strip() + "\n", 1)


def summary_table(
    summary: pd.DataFrame, title: str | None = None, layout: Layout = LAYOUTS[1]
) -> Table:
    """One rich table of a summary DataFrame (``dsim.analysis.summary.SUMMARY_COLUMNS``) for
    one run."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=title,
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        collapse_padding=True,
        pad_edge=False,
    )
    units = {m: column_unit(summary.get(f"{m}_mean", [])) for _, m in layout.metrics}
    table.add_column(_head(POLICY.short, "/", layout), no_wrap=True)
    for name, metric in layout.metrics:
        head = f"{name} ({units[metric]})"
        if not layout.one_line:
            head = head.replace(" (", "\n(").replace(". time", ".\ntime", 0)
        table.add_column(head, justify="right", no_wrap=True)
    table.add_column(_head(EFFECTIVE_DELAY.short, " ", layout), justify="right")
    table.add_column(_head(SPEEDUP.short, "-", layout), justify="right")
    if layout.extra:
        table.add_column(_head(EFFECTIVE_CHANGE.short, " ", layout), justify="right")
    table.add_column("", no_wrap=True)
    for row, mark in zip(summary.to_dict("records"), marks(summary), strict=True):
        baseline = row.get("fetch_align") == "actual" and row.get("start_align") == "actual"
        cells = [
            f"{row.get('fetch_align')}/{row.get('start_align')}",
            *(
                mean_std(
                    row.get(f"{m}_mean"), row.get(f"{m}_std"), units[m], one_line=layout.one_line
                )
                for _, m in layout.metrics
            ),
            _fmt(row.get("effective_delay_pct"), ".1f", "%"),
            _fmt(row.get("speedup"), ".2f", "×"),
        ]
        if layout.extra:
            cells.append(_fmt(row.get("effective_delay_change_pts"), "+.1f"))
        style = {BEST: "bold green", SLOWER: "red"}.get(mark)
        cells.append(f"[{style}]{mark}[/]" if style else mark)
        table.add_row(*cells, style="dim" if baseline else None, end_section=not layout.one_line)
    return table


def _groups(summary: pd.DataFrame) -> list[pd.DataFrame]:
    keys = [k for k in ("run", "results") if k in summary.columns]
    if not keys:
        return [summary]
    return [g for _, g in summary.groupby(keys, sort=False, dropna=False)]


def fitting_layout(summary: pd.DataFrame, console: Console) -> Layout:
    """The widest layout whose tables all fit the console's width (the narrowest otherwise)."""
    from rich.measure import Measurement

    # measured unbounded: a measure within the console's width is clamped to it
    unbounded = console.options.update(max_width=100_000)
    for layout in LAYOUTS:
        if all(
            Measurement.get(console, unbounded, summary_table(g, layout=layout)).maximum
            <= console.width
            for g in _groups(summary)
        ):
            return layout
    return LAYOUTS[-1]


def summary_tables(summary: pd.DataFrame, layout: Layout = LAYOUTS[1]) -> list[Table]:
    """One table per run (and results directory), titled with the run name."""
    return [
        summary_table(g, title=_run_title(g.iloc[0].to_dict()), layout=layout)
        for g in _groups(summary)
    ]


#: The overview's short names of the replay models (the tables' titles spell them out).
OVERVIEW_MODELS = {"per-iteration": "per-iter.", "pipeline": "pipeline", "stall-only": "stall-only"}


def overview_model(row: dict[str, Any]) -> str:
    """The overview's model column: which replay a run's row is, and whether it is a what-if.

    Why: a run replayed by two models, or under loader settings it did not run with, is
    two rows of one name; without this column they read alike, and a loader what-if's
    ``actual/actual`` row (the replay under the new settings) read as if measured. A
    what-if is ``pipeline w8 p2*``; the caption says what ``*`` means.
    """
    model = row.get("replay_model")
    name = "per-iter." if _missing(model) else OVERVIEW_MODELS.get(str(model), str(model))
    changed = row.get("loader_changed")
    if not _missing(changed) and bool(changed) and not _missing(row.get("loader_workers")):
        prefetch = row.get("loader_prefetch_factor")
        tail = "" if _missing(prefetch) else f" p{int(prefetch)}"
        return f"{name} w{int(row['loader_workers'])}{tail}{WHAT_IF}"
    return name


def overview_table(summary: pd.DataFrame, width: int) -> Table:
    """One row per run: measured iteration time and stall, effective delay, and the best
    policy with its speed-up. Run names are wrapped at their separators to fit ``width``."""
    from rich import box
    from rich.table import Table

    groups = _groups(summary)
    measured = []
    for g in groups:
        base = g[(g["fetch_align"] == "actual") & (g["start_align"] == "actual")]
        measured.append(base.iloc[0].to_dict() if len(base) else {})
    it_unit = column_unit([m.get("iteration_s_mean") for m in measured])
    st_unit = column_unit([m.get("stall_s_mean") for m in measured])
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
    fixed = 58 + 13  # the other columns, measured on typical values
    run_width = max(16, width - fixed)
    table.add_column("run", no_wrap=True)
    table.add_column("model", no_wrap=True)
    table.add_column("GPUs", justify="right", no_wrap=True)
    table.add_column(f"iter.\n({it_unit})", justify="right", no_wrap=True)
    table.add_column(f"stall\n({st_unit})", justify="right", no_wrap=True)
    table.add_column("eff.\ndelay", justify="right", no_wrap=True)
    table.add_column("best\npolicy", no_wrap=True)
    table.add_column("speed-\nup", justify="right", no_wrap=True)
    for g, base in zip(groups, measured, strict=True):
        first = g.iloc[0].to_dict()
        mark = marks(g)
        best = [r for r, m in zip(g.to_dict("records"), mark, strict=True) if m == BEST]
        policy = f"{best[0]['fetch_align']}/{best[0]['start_align']}" if best else "none"
        speed = _fmt(best[0]["speedup"], ".2f", "×") if best else "–"
        gpus = first.get("gpus")
        table.add_row(
            "\n".join(wrap_words(str(first.get("run")), run_width)),
            overview_model(first),
            "–" if _missing(gpus) else str(int(gpus)),
            fmt_seconds(base.get("iteration_s_mean"), it_unit),
            fmt_seconds(base.get("stall_s_mean"), st_unit),
            _fmt(base.get("effective_delay_pct"), ".1f", "%"),
            policy,
            speed,
        )
    return table


def print_summary(
    summary: pd.DataFrame, console: Console | None = None, *, full: bool = False
) -> None:
    """Print the summary tables (or, for many runs, the overview) with the selection
    they were computed on as a caption."""
    from dsim.render.console import stdout_console

    console = console or stdout_console()
    runs = len(_groups(summary))
    overview = runs > OVERVIEW_RUNS and not full
    if overview:
        console.print(overview_table(summary, console.width))
    else:
        layout = fitting_layout(summary, console)
        for table in summary_tables(summary, layout):
            title, table.title = str(table.title or ""), None
            for line in wrap_words(title, console.width):
                console.print(line, style="bold", highlight=False, markup=False)
            console.print(table)
    if len(summary) and {"selected_epochs", "warmup", "threshold_s"} <= set(summary.columns):
        first = summary.iloc[0]
        what_if = ""
        changed = summary.get("loader_changed")
        if overview and changed is not None and changed.fillna(False).astype(bool).any():
            what_if = (
                f" {WHAT_IF} a loader what-if: its iter. and stall are the replay under those "
                "settings, not measured."
            )
        more = (
            f" {runs} runs: one row each (the measured run, and the policy with the largest "
            "speed-up); --full prints every table." + what_if
            if overview
            else f" {BEST}: the largest speed-up of the run; {SLOWER}: slower than measured."
        )
        caption = (
            f"Mean ± sample std over epochs {first['selected_epochs']}, iterations > "
            f"{first['warmup']}; ms or s as the column says; eff. delay: share of iterations "
            f"with delay > {first['threshold_s']:g} s; speed-up and changes (eff. in "
            "percentage points) against actual/actual, the measured run." + more
        )
        for line in wrap_prose(caption, console.width):
            console.print(line, style="dim", highlight=False, markup=False, soft_wrap=True)


def print_answer(answer: Answer, console: Console | None = None, *, full: bool = False) -> None:
    """The answer in the terminal: each run's verdict (or headline) with its caveats and
    attribution lines, then the summary tables (the overview above ``OVERVIEW_RUNS`` runs)."""
    from dsim.render.insight import print_verdicts

    print_verdicts(answer.verdicts, answer.blame, console, headlines=answer.headlines)
    print_summary(answer.summary, console, full=full)
