"""Guards against unit slips and silent changes of what a results directory records.

The effective-delay threshold is in seconds. ``--threshold 30`` meant as
30 ms is 30 s — longer than any iteration — and makes every effective delay 0 %
without a word; a value of a second or more is refused unless ``--force`` says
it is meant (``THRESHOLD_MAX_S``).

``dsim run`` records its summary selection (epochs, warm-up, threshold) in
each run's ``result.json``; ``dsim summarize`` and ``dsim report`` default to
it. Those options change only the view, not the replays, so a later
``dsim run`` with other values (all replays reused) would quietly move the
defaults of the whole results directory. ``selection_changes`` names every
such change so that ``dsim run`` says it out loud.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dsim.errors import InputError, UsageError
from dsim.model.resultinfo import ResultInfo

THRESHOLD_MAX_S = 1.0


def _seconds_of_ms(value: float) -> str:
    """``value`` ms in seconds as a user would type it: 0.030, and 1e+305 rather than a
    306-digit number for an absurd one."""
    return f"{value / 1000:.3f}" if value < 1e12 else f"{value / 1000:g}"


def check_threshold(value: float | None, *, force: bool, source: str = "--threshold") -> None:
    """Refuse a threshold that is not a number of seconds ≥ 0, or of ``THRESHOLD_MAX_S``
    or more (a value in ms typed as s)."""
    if value is None:
        return
    if not math.isfinite(value) or value < 0:
        what = "not a finite number" if not math.isfinite(value) else "negative"
        raise UsageError(f"{source} {value:g}: {what}; give the threshold in seconds, ≥ 0")
    if force or value < THRESHOLD_MAX_S:
        return
    raise UsageError(
        f"{source} {value:g}: the threshold is in seconds; {value:g} s is longer than any "
        f"iteration is likely to be, so no delay would count as effective — use "
        f"{_seconds_of_ms(value)} for {value:g} ms (or add --force to keep {value:g} s)"
    )


def recorded_selections(out: Path, runs: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The selection each run's ``result.json`` under ``out`` records now (absent runs left out)."""
    found: dict[str, dict[str, Any]] = {}
    for run in runs:
        try:
            info = ResultInfo.load(Path(out) / run)
        except InputError:
            continue
        if info.selection is not None:
            found[run] = info.selection.document()
    return found


_LABELS = {"epochs": "epochs", "warmup": "warm-up", "threshold_s": "threshold"}


def _shown(key: str, value: Any) -> str:
    if key == "epochs" and isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    if key == "threshold_s" and isinstance(value, int | float):
        return f"{value:g} s"
    return str(value)


def selection_changes(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """One line per run whose recorded selection changed (runs recorded for the first
    time are not a change)."""
    lines = []
    for run, old in before.items():
        new = after.get(run)
        if new is None:
            continue
        diffs = [
            f"{_LABELS[k]} {_shown(k, old.get(k))} → {_shown(k, new.get(k))}"
            for k in _LABELS
            if old.get(k) != new.get(k)
        ]
        if diffs:
            lines.append(
                f"note: {run}: `dsim summarize` and `dsim report` now default to "
                f"{', '.join(diffs)} (recorded by this run)"
            )
    return lines
