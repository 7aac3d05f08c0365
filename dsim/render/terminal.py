"""The summary as a readable terminal table (``dsim run``, ``dsim summarize``).

One row per run and policy; each metric as mean ± sample std so that the
spread is never hidden behind a mean, and the what-if columns against the
measured run (``actual/actual``) last. Four decimals, as the original analysis
rounded; the stall change is left to the files, so the table fits 80 columns.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

# (column title, metric stem) for the mean ± std columns
_METRICS = (
    ("iter.\ntime", "iteration_s"),
    ("stall\n", "stall_s"),
    ("delay\n", "delay_s"),
    ("start\ndiff", "start_diff_s"),
    ("fetch\ndiff", "fetch_diff_s"),
)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def mean_std(mean: Any, std: Any, digits: int = 4) -> str:
    """``1.2345`` over ``±0.0100`` (two lines keep the table narrow); no std when undefined."""
    if _missing(mean):
        return "–"
    if _missing(std):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f}\n±{std:.{digits}f}"


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "–" if _missing(value) else f"{value:{spec}}{suffix}"


def _run_title(row: dict[str, Any]) -> str:
    """Run name, GPU count and iteration count (the same for every policy of a run)."""
    facts = []
    if not _missing(row.get("gpus")):
        facts.append(f"{int(row['gpus'])} GPUs")
    if not _missing(row.get("iterations")):
        facts.append(f"{int(row['iterations'])} iterations")
    model = row.get("replay_model")
    if not _missing(model) and model != "per-iteration":
        text = f"{model} model"
        if not _missing(row.get("loader_workers")):
            workers, prefetch = int(row["loader_workers"]), row.get("loader_prefetch_factor")
            text += f", {workers} workers, prefetch {int(prefetch)}"
            text += " (what-if)" if row.get("loader_changed") else " (as measured)"
        facts.append(text)
    return f"{row.get('run')}" + (f" ({', '.join(facts)})" if facts else "")


def summary_table(summary: pd.DataFrame, title: str | None = None) -> Table:
    """One rich table of a summary DataFrame (``dsim.summary.SUMMARY_COLUMNS``) for one run."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=title,
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=0,
        collapse_padding=True,
        pad_edge=False,
    )
    table.add_column("fetch/\nstart", no_wrap=True)
    for name, _ in _METRICS:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("eff.\ndelay", justify="right", no_wrap=True)
    table.add_column("speed-\nup", justify="right", no_wrap=True)
    table.add_column("eff.\nchange", justify="right", no_wrap=True)
    for row in summary.to_dict("records"):
        baseline = row.get("fetch_align") == "actual" and row.get("start_align") == "actual"
        table.add_row(
            f"{row.get('fetch_align')}/{row.get('start_align')}",
            *(mean_std(row.get(f"{m}_mean"), row.get(f"{m}_std")) for _, m in _METRICS),
            _fmt(row.get("effective_delay_pct"), ".2f", "%"),
            _fmt(row.get("speedup"), ".2f", "×"),
            _fmt(row.get("effective_delay_change_pts"), "+.1f"),
            style="dim" if baseline else None,
            end_section=True,
        )
    return table


def summary_tables(summary: pd.DataFrame) -> list[Table]:
    """One table per run (and results directory), titled with the run name."""
    keys = [k for k in ("run", "results") if k in summary.columns]
    tables = []
    for _, group in summary.groupby(keys, sort=False, dropna=False) if keys else [(0, summary)]:
        tables.append(summary_table(group, title=_run_title(group.iloc[0].to_dict())))
    return tables


def print_summary(summary: pd.DataFrame, console: Console | None = None) -> None:
    """Print the summary table, with the selection it was computed on as a caption."""
    from rich.console import Console

    console = console or Console()
    for table in summary_tables(summary):
        console.print(table)
    if len(summary) and {"selected_epochs", "warmup", "threshold_s"} <= set(summary.columns):
        first = summary.iloc[0]
        console.print(
            f"Seconds, mean ± sample std over epochs {first['selected_epochs']}, iterations > "
            f"{first['warmup']}; eff. delay: share of iterations with delay > "
            f"{first['threshold_s']:g} s; speed-up and changes (eff. in percentage points) "
            "against actual/actual, the measured run.",
            style="dim",
            highlight=False,
        )
