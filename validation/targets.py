"""The issue's accuracy targets, as code: FIDELITY.md prints these rules and their verdicts.

Kinds of what-if: ``align`` (a fetch alignment physically applied), ``loader``
(another worker count or prefetch factor), ``repeat`` (A run again: it
defines the noise floor and has no target).
"""

from __future__ import annotations

import math

ITERATION_PCT = 2.0  # alignment what-ifs: mean iteration time, or the noise where larger
SHARE_PTS = 2.0  # alignment what-ifs: effective-delay share, percentage points
STALL_PCT = 10.0  # alignment what-ifs: mean stall
LOADER_PCT = 5.0  # loader what-ifs: mean iteration time

TARGETS: dict[str, str] = {
    "iteration": (
        f"alignment what-ifs: mean iteration time within {ITERATION_PCT:g} % of the re-run, or "
        "within the measured noise (A against its repeat at the re-run's worker count) where larger"
    ),
    "share": f"alignment what-ifs: effective-delay share within {SHARE_PTS:g} points",
    "stall": f"alignment what-ifs: mean stall within {STALL_PCT:g} %",
    "loader": f"loader what-ifs (workers, prefetch): mean iteration time within {LOADER_PCT:g} %",
}


def _within(err: float | None, bound: float) -> bool | None:
    if err is None or math.isnan(err):
        return None
    return abs(err) <= bound + 1e-12


def verdicts(kind: str, errors: dict[str, float | None], noise_pct: float | None) -> dict:
    """Target name -> True (met) / False (missed) / None (no prediction) for one what-if.

    ``errors`` are a model's signed errors keyed by metric (see
    ``validation.metrics.error``). Targets that do not apply are absent.
    """
    if kind == "align":
        bound = max(ITERATION_PCT, noise_pct if noise_pct is not None else 0.0)
        return {
            "iteration": _within(errors.get("iteration_ms"), bound),
            "share": _within(errors.get("effective_delay_pct"), SHARE_PTS),
            "stall": _within(errors.get("stall_ms"), STALL_PCT),
        }
    if kind == "loader":
        return {"loader": _within(errors.get("iteration_ms"), LOADER_PCT)}
    return {}
