"""CI gates: ``--fail-if "effective_delay_pct>10"`` on the summary (docs/SPEC.md §5.6).

A condition is ``METRIC[@FETCH/START] OP NUMBER``: a numeric summary column,
optionally the policy whose row it reads (default: the measured run,
``actual/actual``), a comparison (``>``, ``>=``, ``<``, ``<=``, ``==``,
``!=``) and a number. It is evaluated on every run (and results directory)
of the summary whose loader settings are the measured ones (loader what-ifs
are left out: their ``actual/actual`` is not the measured run). Conditions
that hold are the failures a command reports with its own exit code
(``errors.CheckFailed``). Pure evaluation; a condition is parsed by
``dsim.options.parse_condition``, before any work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsim.errors import CheckFailed, UsageError
from dsim.options import Condition
from dsim.replay.policies import BASELINE


@dataclass(frozen=True)
class CheckResult:
    """A condition evaluated on one run's row."""

    run: str
    results: str
    condition: str
    metric: str
    fetch_align: str
    start_align: str
    value: float
    held: bool

    def describe(self) -> str:
        policy = (
            "measured"
            if (self.fetch_align, self.start_align) == BASELINE
            else (f"{self.fetch_align}/{self.start_align}")
        )
        return f"{self.run}: {self.condition} ({policy}: {self.value:g})"


def evaluate(summary: Any, conditions: Sequence[Condition]) -> list[CheckResult]:
    """Every condition on every measured-loader run of a summary DataFrame, in row order.

    A run whose rows lack the condition's policy is a usage error (it was not
    replayed, or ``--policy`` left it out), so that a gate never passes by
    looking at nothing.
    """
    if not conditions:
        return []
    rows = summary.to_dict("records")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if bool(row.get("loader_changed") or False):
            continue
        groups.setdefault((str(row["run"]), str(row.get("results", ""))), []).append(row)
    out: list[CheckResult] = []
    for (run, results), group in groups.items():
        by_policy = {(r["fetch_align"], r["start_align"]): r for r in group}
        for cond in conditions:
            row = by_policy.get(cond.policy)
            if row is None:
                raise UsageError(
                    f"--fail-if {cond.text!r}: run {run} ({results}) has no "
                    f"{cond.policy[0]}/{cond.policy[1]} row (not replayed, or left out by --policy)"
                )
            raw = row.get(cond.metric)
            value = float(raw) if raw is not None else math.nan
            out.append(
                CheckResult(
                    run, results, cond.text, cond.metric, cond.policy[0], cond.policy[1],
                    value, cond.holds(value),
                )
            )  # fmt: skip
    return out


def raise_if_held(results: Sequence[CheckResult]) -> None:
    """``CheckFailed`` (its own exit code) naming every run and condition that held."""
    held = [r for r in results if r.held]
    if not held:
        return
    what = "; ".join(r.describe() for r in held)
    count = f"{len(held)} conditions hold" if len(held) > 1 else "condition holds"
    raise CheckFailed(f"--fail-if: {count}: {what}")
