"""Runs -> cells with repeats, and the statistics of a cell: mean ± sd (n).

A physical number measured once cannot say how much of a prediction's
error is noise, so the sweep runs every setting several times (interleaved
to cancel drift) and the comparison judges means against standard
deviations. A *cell* is one setting of the job (regime, workers W, prefetch
P, fetch alignment, start alignment); its *repeats* are the runs of it.

Run names, new and legacy:

* ``<regime>_w<W>_p<P>_<align>[_s<start>]_r<k>`` — align in none/min/mean,
  start in min/max/ctl (causal start-min, barrier start-max, the control
  with the mechanism inactive), k = 1, 2, 3… the repeat;
* ``<regime>_w<W>_p<P>_<align>[_repeat]`` — the first sweep's names: the
  plain name is repeat 1 of its cell, ``_repeat`` repeat 2.

Pure functions only: no file is read here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NAME = re.compile(
    r"^(?P<regime>.+?)_w(?P<workers>\d+)_p(?P<prefetch>\d+)_(?P<align>none|min|mean)"
    r"(?:_s(?P<start>min|max|ctl))?(?:_r(?P<repeat>\d+)|_(?P<legacy>repeat))?$"
)
STARTS = ("min", "max", "ctl")


@dataclass(frozen=True, order=True)
class Cell:
    """One setting of the job; ``start`` is None for runs without start alignment."""

    regime: str
    workers: int
    prefetch: int
    align: str
    start: str | None = None

    @property
    def label(self) -> str:
        tail = f", start {self.start}" if self.start else ""
        return f"{self.regime} w{self.workers} p{self.prefetch} {self.align}{tail}"


@dataclass(frozen=True)
class RunKey:
    cell: Cell
    repeat: int  # 1-based


def parse_run_name(name: str) -> RunKey:
    """The cell and repeat number a run's directory name encodes; ValueError if none."""
    m = NAME.match(name)
    if not m:
        raise ValueError(
            f"run {name!r}: not <regime>_w<W>_p<P>_<none|min|mean>[_s<min|max|ctl>][_r<k>|_repeat]"
        )
    cell = Cell(m["regime"], int(m["workers"]), int(m["prefetch"]), m["align"], m["start"] or None)
    repeat = int(m["repeat"]) if m["repeat"] else (2 if m["legacy"] else 1)
    if repeat < 1:
        raise ValueError(f"run {name!r}: repeat numbers start at 1")
    return RunKey(cell, repeat)


def unaligned(name: str) -> bool:
    """Whether a run's name is of a cell with neither fetch nor start alignment (a base run)."""
    cell = parse_run_name(name).cell
    return cell.align == "none" and cell.start is None


def group_runs(names: Iterable[str]) -> dict[Cell, list[str]]:
    """Cell -> its runs ordered by repeat number, cells in the order first seen."""
    cells: dict[Cell, list[tuple[int, str]]] = {}
    for name in names:
        key = parse_run_name(name)
        cells.setdefault(key.cell, []).append((key.repeat, name))
    out = {}
    for cell, runs in cells.items():
        repeats = [r for r, _ in runs]
        if len(set(repeats)) != len(repeats):
            raise ValueError(f"cell {cell.label}: repeat number used twice ({sorted(repeats)})")
        out[cell] = [name for _, name in sorted(runs)]
    return out


@dataclass(frozen=True)
class Stat:
    """Mean, sample standard deviation (None below 2 values) and count of some values."""

    mean: float
    sd: float | None
    n: int

    def __str__(self) -> str:
        return format_stat(self)


def stat(values: Iterable[float]) -> Stat:
    """Mean and sample sd (n - 1) of finite values; NaN mean when there is none."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return Stat(math.nan, None, 0)
    mean = math.fsum(vals) / n
    if n < 2:
        return Stat(mean, None, n)
    var = math.fsum((v - mean) ** 2 for v in vals) / (n - 1)
    return Stat(mean, math.sqrt(var), n)


def stats_of(rows: Iterable[Mapping[str, float]], keys: Iterable[str]) -> dict[str, Stat]:
    """Per key, the ``Stat`` over rows (one row per repeat)."""
    rows = list(rows)
    return {k: stat(r.get(k, math.nan) for r in rows) for k in keys}


def format_stat(s: Stat, digits: int = 2) -> str:
    """``mean ± sd (n)``; ``mean (n = 1)`` without a spread."""
    if s.n == 0 or not math.isfinite(s.mean):
        return "n/a"
    if s.sd is None:
        return f"{s.mean:.{digits}f} (n = {s.n})"
    return f"{s.mean:.{digits}f} ± {s.sd:.{digits}f} ({s.n})"
