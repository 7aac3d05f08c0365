"""The one unit rule for printed times: milliseconds below one second, seconds above.

Every output that prints a time in a table — the terminal's summary and
overview, ``dsim compare``'s table, the HTML summary table — asks this module
(docs/SPEC.md §5 "Units"), so that one number never reads ``0.0123`` in one
place and ``12.3 ms`` in another. A group of numbers read side by side (a
column, a before/after row) shares one unit, chosen by its largest value, so
the numbers compare at a glance. Resolution is 0.1 ms either way (``12.3`` ms,
``1.2345`` s). Pure and light: no pandas, no rich.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

MS, S = "ms", "s"


def missing(value: Any) -> bool:
    """None or NaN (pandas gives either for an absent value): printed as a dash."""
    if value is None:
        return True
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return True


def time_unit(values: Iterable[Any]) -> str:
    """``ms`` when every known value is below one second (in magnitude), else ``s``."""
    finite = [abs(float(v)) for v in values if not missing(v)]
    finite = [v for v in finite if math.isfinite(v)]
    return MS if finite and max(finite) < 1.0 else S


def time_number(value: Any, unit: str, *, signed: bool = False) -> str:
    """Seconds as a number in ``unit`` (no unit name): ``12.3`` (ms), ``1.2345`` (s)."""
    if missing(value):
        return "–"
    sign = "+" if signed else ""
    v = float(value)
    return f"{v * 1000:{sign}.1f}" if unit == MS else f"{v:{sign}.4f}"


def time_text(value: Any, unit: str | None = None, *, signed: bool = False) -> str:
    """Seconds with their unit: ``12.3 ms``, ``1.2345 s``; ``unit`` defaults to the value's own."""
    if missing(value):
        return "–"
    unit = unit or time_unit([value])
    return f"{time_number(value, unit, signed=signed)} {unit}"
