"""How the Python API's answers look in a notebook: a short ``repr`` and a small HTML view.

A notebook prints an object's ``repr`` when it is a cell's last value; the
dataclass default printed whole summary tables and every ``result.json``
(kilobytes). These functions give one or two lines instead (what, how many,
where on disk), and for Jupyter's rich display (``_repr_html_``) the verdict
and the summary table, every text escaped (run names and verdicts come from
files a user does not control), capped at ``MAX_ROWS`` rows. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from dsim.render.columns import EFFECTIVE_DELAY, METRICS, SPEEDUP, header

if TYPE_CHECKING:
    import pandas as pd

    from dsim.analysis.verdict import Verdict

#: Rows of the HTML summary table; the rest is counted, not shown (``results.summary`` has all).
MAX_ROWS = 20
#: Names listed in a ``repr`` before "… and N more".
MAX_NAMES = 3

_TABLE_METRICS = (METRICS[0], METRICS[1], METRICS[2])  # iteration time, stall, delay


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES])
    return shown + (f" … and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else "")


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _unique(values: Iterable[Any]) -> list[Any]:
    return [v for v in dict.fromkeys(values) if v is not None and v == v]


def results_repr(summary: pd.DataFrame, directories: Sequence[str]) -> str:
    """``Results(2 runs: a, b; 9 policies; 4 GPUs; in results)``: what a notebook echoes."""
    if summary.empty:
        return "Results(no runs)"
    runs = _unique(summary["run"])
    policies = _unique(zip(summary["fetch_align"], summary["start_align"], strict=True))
    gpus = sorted(int(g) for g in _unique(summary["gpus"])) if "gpus" in summary else []
    gpu_text = "/".join(str(g) for g in gpus) + " GPUs" if gpus else "GPUs unknown"
    return (
        f"Results({_count(len(runs), 'run', 'runs')}: {_names(runs)}; "
        f"{_count(len(policies), 'policy', 'policies')}; {gpu_text}; "
        f"in {', '.join(directories) or 'no directory'})"
    )


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _cell(value: Any, unit: str, scale: float) -> str:
    """One number: times scaled to the column's unit (ms or s), shares and ratios as shown."""
    number = _number(value)
    if number is None:
        return "–"
    if unit == "s":
        return f"{number * scale:.1f}" if scale == 1000 else f"{number:.3f}"
    return f"{number:.1f}" if unit in {"%", "pts"} else f"{number:.2f}"


def summary_html(summary: pd.DataFrame, verdicts: Sequence[Verdict], where: Sequence[str]) -> str:
    """The verdicts as paragraphs, then the summary's main columns (at most ``MAX_ROWS`` rows).

    Times are in ms when every value of their column is below a second (the
    terminal's unit), else in s; the column header says which.
    """
    parts = [f"<div class='dsim-results'><p><b>{escape(results_repr(summary, where))}</b></p>"]
    parts += [f"<p>{escape(v.text)}</p>" for v in verdicts]
    if summary.empty:
        return "".join(parts) + "</div>"
    heads = ["run", "policy (fetch / start)"]
    columns: list[tuple[str, str, float]] = []
    for column in _TABLE_METRICS:
        key = f"{column.key}_mean"
        values = [abs(n) for n in map(_number, summary[key]) if n is not None]
        scale = 1000.0 if all(v < 1 for v in values) else 1.0
        heads.append(f"{column.long} ({'ms' if scale == 1000 else 's'})")
        columns.append((key, "s", scale))
    for column in (EFFECTIVE_DELAY, SPEEDUP):
        heads.append(header(column))
        columns.append((column.key, column.unit, 1.0))
    parts.append("<table><thead><tr>")
    parts += [f"<th>{escape(h)}</th>" for h in heads]
    parts.append("</tr></thead><tbody>")
    for row in summary.head(MAX_ROWS).to_dict(orient="records"):
        cells = [str(row["run"]), f"{row['fetch_align']}/{row['start_align']}"]
        cells += [_cell(row.get(key), unit, scale) for key, unit, scale in columns]
        parts.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    parts.append("</tbody></table>")
    if len(summary) > MAX_ROWS:
        more = _count(len(summary) - MAX_ROWS, "more row", "more rows")
        parts.append(f"<p>… {more} in <code>.summary</code></p>")
    return "".join(parts) + "</div>"


def trace_repr(name: str, directory: str, info: Any) -> str:
    """``Trace(raw: 4 GPUs, epochs 0-1, rawlog; in traces/raw)``."""
    epochs = list(getattr(info, "epochs_present", []) or [])
    span = f"{epochs[0]}-{epochs[-1]}" if len(epochs) > 1 else ",".join(map(str, epochs))
    return (
        f"Trace({name}: {_count(int(info.gpu_count or 0), 'GPU', 'GPUs')}, "
        f"epochs {span or 'none'}, "
        f"{info.input_format or 'rawlog'}; in {directory})"
    )


def text_html(title: str, lines: Sequence[str]) -> str:
    """A title and preformatted lines, escaped: the terminal's answer in a notebook."""
    return f"<div><p><b>{escape(title)}</b></p><pre>{escape(chr(10).join(lines))}</pre></div>"
