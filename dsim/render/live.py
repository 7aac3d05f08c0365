"""``dsim watch``'s view: a rich renderable for the terminal, and its ``--json`` document.

One renderable serves both the live refresh (rich ``Live``) and ``--once``,
so a snapshot printed by a script reads exactly as the live screen does.
Prose (the straggler and verdict lines) is wrapped by ``wrap_prose``, never
between a number and its unit (SPEC §9.1).
"""

from __future__ import annotations

import math
from typing import Any

from dsim.live import LiveWindow, Snapshot
from dsim.render.console import wrap_prose
from dsim.render.insight import verdict_block
from dsim.render.machine import MACHINE_FORMAT_VERSION, plain
from dsim.words import counted

_ROW_KEYS = (
    "fetch_align",
    "start_align",
    "iterations",
    "iteration_s_mean",
    "iteration_s_std",
    "stall_s_mean",
    "stall_s_std",
    "delay_s_mean",
    "delay_s_std",
    "effective_delay_pct",
    "speedup",
    "stall_change_s",
    "effective_delay_change_pts",
)


def _where(at: tuple[int, int] | None) -> str:
    if at is None or at[0] < 0:  # a rank whose records are no longer held
        return "-"
    return f"epoch {at[0]} iteration {at[1]}"


def _ms(seconds: float) -> str:
    return "-" if not math.isfinite(seconds) else f"{seconds * 1000:.1f}"


def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.1f}"


def renderable(snapshot: Snapshot, width: int, *, interval_s: float | None = None) -> Any:
    """The view as a rich ``Group``: header, ranks, the window's numbers, what-ifs, verdict.

    ``interval_s``: the refresh period, named in the header (``None`` for ``--once``).
    """
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    every = f", every {interval_s:g} s" if interval_s is not None else ""
    head = f"{snapshot.run}: {counted(snapshot.files, 'log file')} followed{every}"
    parts.extend(Text(line, style="bold") for line in wrap_prose(head, width))
    view = snapshot.view
    if view is not None and view.ranks:
        ranks = Table(box=None, pad_edge=False, show_edge=False)
        for name in ("GPU", "iterations seen", "last logged"):
            ranks.add_column(name, justify="right" if name != "last logged" else "left")
        for r in view.ranks:
            ranks.add_row(str(r.gpu), str(r.iterations), _where((r.epoch, r.iteration)))
        parts.extend([Text(""), ranks])
    if snapshot.waiting is not None:
        parts.append(Text(""))
        parts.extend(
            Text(line, style="yellow") for line in wrap_prose(f"waiting: {snapshot.waiting}", width)
        )
    if view is not None and view.rows:
        parts.extend(_window(view, width))
    return Group(*parts)


def _window(view: LiveWindow, width: int) -> list[Any]:
    from rich.table import Table
    from rich.text import Text

    out: list[Any] = [Text("")]
    title = (
        f"Last {counted(view.iterations, 'complete iteration')} "
        f"({_where(view.first)} to {_where(view.last)}; window {view.window}, "
        f"warm-up iterations <= {view.warmup} skipped):"
    )
    out.extend(Text(line) for line in wrap_prose(title, width))
    # First, as `dsim run` prints it first, word for word: the headline, the original
    # analysis's line (which points at the table below), caveats, straggler lines.
    for text, indent, style in verdict_block(view.verdict, view.headline, view.straggler_lines):
        out.extend(Text(line, style=style) for line in wrap_prose(text, width, indent))
    out.append(Text(""))
    out.extend(Text(line) for line in wrap_prose(f"Policies, {view.model} replay:", width))
    table = Table(box=None, pad_edge=False, show_edge=False)
    table.add_column("fetch/start")
    for name in ("iteration ms", "stall ms", "delay ms", "eff. delay %", "speed-up"):
        table.add_column(name, justify="right")
    for row in view.rows:
        speedup = row.get("speedup", math.nan)
        table.add_row(
            f"{row['fetch_align']}/{row['start_align']}",
            _ms(row["iteration_s_mean"]),
            _ms(row["stall_s_mean"]),
            _ms(row["delay_s_mean"]),
            _pct(row["effective_delay_pct"]),
            "-" if not math.isfinite(speedup) else f"{speedup:.2f}×",
        )
    out.append(table)
    return out


def document(snapshot: Snapshot) -> dict[str, Any]:
    """``dsim watch --once --json``: the snapshot as one JSON object (NaN → null)."""
    from dsim import __version__

    view = snapshot.view
    doc: dict[str, Any] = {
        "format_version": MACHINE_FORMAT_VERSION,
        "dsim_version": __version__,
        "run": snapshot.run,
        "path": snapshot.path,
        "files": snapshot.files,
        "waiting": snapshot.waiting,
        "ranks": [],
        "window": None,
    }
    if view is None:
        return doc
    doc["ranks"] = [
        {"gpu": r.gpu, "iterations": r.iterations, "epoch": r.epoch, "iteration": r.iteration}
        for r in view.ranks
    ]
    if not view.rows:
        return doc
    a = view.attribution
    doc["window"] = {
        "size": view.window,
        "iterations": view.iterations,
        "first": {"epoch": view.first[0], "iteration": view.first[1]} if view.first else None,
        "last": {"epoch": view.last[0], "iteration": view.last[1]} if view.last else None,
        "warmup": view.warmup,
        "threshold_s": view.threshold_s,
        "replay_model": view.model,
        "policies": [{k: plain(row.get(k)) for k in _ROW_KEYS} for row in view.rows],
        "straggler": None
        if a is None
        else {
            "kind": a.straggler,
            "gpu": a.straggler_gpu,
            "last_pct": {str(r.gpu): plain(r.last_pct) for r in a.ranks},
        },
        "straggler_lines": list(view.straggler_lines),
        "verdict": None
        if view.verdict is None
        else {k: plain(v) for k, v in view.verdict.as_dict().items()},
        "headline": None
        if view.headline is None
        else {k: plain(v) for k, v in view.headline.as_dict().items()},
    }
    return doc
