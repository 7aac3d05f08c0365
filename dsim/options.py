"""Values of command-line options that several commands share.

``dsim run``, ``dsim summarize`` and ``dsim report`` accept the same
``--epochs``, ``--policy``, ``--run``, ``--format`` and ``--fail-if``
spellings (and ``dsim tune`` its ``--workers`` / ``--prefetch`` grids);
parsing them in one place keeps the commands consistent and their error
messages identical, and light: a mistyped option is said before the
summary's I/O (and pandas) is imported.
"""

from __future__ import annotations

import fnmatch
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsim.errors import UsageError
from dsim.model.columns import STAT_COLUMNS, WHAT_IF_COLUMNS
from dsim.replay.params import MAX_LOADER_SETTING
from dsim.replay.policies import (
    ACTUAL,
    BASELINE,
    Policy,
    check_pair,
    is_stall_alignment,
    normalize_policy,
)

if TYPE_CHECKING:
    from dsim.model.results import ResultRun


def parse_epochs_option(text: str | None) -> list[int] | str | None:
    """``all``, ``2``, ``1,3`` or ``1-3`` (ranges inclusive); ``None`` when not given."""
    if text is None:
        return None
    text = text.strip()
    if text.lower() == "all":
        return "all"
    epochs: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise UsageError(f"--epochs: expected 'all', N, N,M or N-M, not {text!r}")
        lo = int(match.group(1))
        hi = int(match.group(2) or lo)
        if hi < lo:
            raise UsageError(f"--epochs: empty range {part.strip()!r}")
        epochs.extend(range(lo, hi + 1))
    return sorted(set(epochs))


def parse_policy_option(text: str) -> Policy:
    """``avg/min``, ``avg__min`` or ``avg,min`` (fetch first) -> a canonical policy pair.

    A stall alignment alone (``stall-min``) means ``stall-min/actual``.
    """
    parts = re.split(r"__|/|,|:", text.strip())
    if len(parts) == 1 and is_stall_alignment(parts[0].strip().lower()):
        parts.append(ACTUAL)
    if len(parts) != 2:
        raise UsageError(f"--policy: expected FETCH/START such as avg/min, not {text!r}")
    policy = normalize_policy(parts[0]), normalize_policy(parts[1])
    try:
        check_pair(policy)
    except UsageError as exc:
        raise UsageError(f"--policy: {exc}") from None
    return policy


def select_runs(runs: list[ResultRun], globs: list[str] | None) -> list[ResultRun]:
    """Runs whose name matches any ``--run`` glob (all runs without one)."""
    if not globs:
        return runs
    known = {r.name for r in runs}
    # a glob naming a run exactly is that run (a run named a[1] or a*b), else a glob
    exact = [g for g in globs if g in known]
    patterns = [g for g in globs if g not in known]
    chosen = [
        r for r in runs if r.name in exact or any(fnmatch.fnmatchcase(r.name, g) for g in patterns)
    ]
    if not chosen:
        names = ", ".join(r.name for r in runs[:10]) + (" …" if len(runs) > 10 else "")
        raise UsageError(f"--run {' '.join(globs)} matches no run; runs found: {names}")
    return chosen


#: The summary's file formats (``--format``), in the order they are offered; the writers are
#: ``dsim.render.files.FORMATS``, which import pandas: the names are checked without it.
FORMAT_NAMES = ("csv", "parquet", "json")


def parse_formats(spec: str | Sequence[str]) -> list[str]:
    """``"csv,parquet"`` or ``["csv", "json"]`` → validated format names, in order, no repeats."""
    items = spec.split(",") if isinstance(spec, str) else [p for s in spec for p in s.split(",")]
    names = [item.strip().lower() for item in items if item.strip()]
    unknown = [n for n in names if n not in FORMAT_NAMES]
    if unknown or not names:
        raise UsageError(
            f"unknown output format {', '.join(unknown) or repr(spec)}; "
            f"choose from {', '.join(FORMAT_NAMES)}"
        )
    return list(dict.fromkeys(names))


# --- --fail-if (docs/SPEC.md §5.6): parsed here, before any work; evaluated by
# dsim.analysis.checks ------------------------------------------------------------------

#: Columns a condition may name: the numbers of a summary row.
METRICS: tuple[str, ...] = (*STAT_COLUMNS, *WHAT_IF_COLUMNS)

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_CONDITION = re.compile(
    r"^\s*(?P<metric>[A-Za-z_][A-Za-z0-9_]*)(?:@(?P<policy>[^<>=!\s]+))?\s*"
    r"(?P<op>>=|<=|==|!=|>|<)\s*(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)


@dataclass(frozen=True)
class Condition:
    """One ``--fail-if`` condition, as typed (``text``) and parsed."""

    text: str
    metric: str
    policy: Policy
    op: str
    number: float

    def holds(self, value: float) -> bool:
        """Whether the condition holds for ``value``; a NaN (undefined statistic) never holds."""
        return not math.isnan(value) and _OPERATORS[self.op](value, self.number)


def parse_condition(text: str) -> Condition:
    """``effective_delay_pct>10`` or ``speedup@min/min>=1.5`` → a ``Condition``
    (a usage error otherwise)."""
    match = _CONDITION.match(text)
    if match is None:
        raise UsageError(
            f"--fail-if {text!r}: expected METRIC[@FETCH/START] OP NUMBER, e.g. "
            "'effective_delay_pct>10' or 'speedup@min/min>=1.5' (OP: > >= < <= == !=)"
        )
    metric = match["metric"]
    if metric not in METRICS:
        raise UsageError(
            f"--fail-if {text!r}: unknown metric {metric!r}; one of {', '.join(METRICS)}"
        )
    policy = BASELINE if match["policy"] is None else parse_policy_option(match["policy"])
    return Condition(text.strip(), metric, policy, match["op"], float(match["number"]))


def parse_conditions(texts: Sequence[str] | None) -> list[Condition]:
    """``--fail-if`` texts → conditions (a usage error names the bad one), before any work."""
    return [parse_condition(text) for text in texts or ()]


_ITEM = re.compile(r"^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?$")


def parse_counts(text: str, option: str, lowest: int) -> tuple[int, ...]:
    """``"1,2,4"``, ``"1-8"`` or a mix (``"0,2-4"``) → sorted distinct values.

    ``UsageError`` (exit 2) for anything malformed, below ``lowest`` or above
    ``MAX_LOADER_SETTING``, naming the option and the offending item.
    """
    values: set[int] = set()
    for item in text.split(","):
        match = _ITEM.match(item)
        if match is None:
            raise UsageError(
                f"{option} {text!r}: {item.strip()!r} is not a number or a range like 1-8"
            )
        lo = int(match.group(1))
        hi = lo if match.group(2) is None else int(match.group(2))
        if hi < lo:
            raise UsageError(f"{option} {text!r}: range {lo}-{hi} runs backwards")
        if lo < lowest:
            raise UsageError(f"{option} {text!r}: {lo} is below the smallest meaningful {lowest}")
        if hi > MAX_LOADER_SETTING:
            raise UsageError(f"{option} {text!r}: {hi} is above the maximum {MAX_LOADER_SETTING}")
        values.update(range(lo, hi + 1))
    return tuple(sorted(values))


def loader_grids(
    workers: str | None, prefetch: str | None
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """``--workers`` and ``--prefetch`` (``1,2,4``, ``1-8``) as the grids to sweep, checked
    before any work (None: the default grid)."""
    grid_w = parse_counts(workers, "--workers", 0) if workers is not None else None
    grid_p = parse_counts(prefetch, "--prefetch", 1) if prefetch is not None else None
    return grid_w, grid_p
