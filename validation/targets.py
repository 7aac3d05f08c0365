"""The issue's accuracy targets, as code: FIDELITY.md prints these rules and their verdicts.

The rule (issue #18): a target is met when

    |mean prediction - mean measured| <= max(threshold, 2 sigma),
    sigma = sqrt(sd_pred^2 + sd_meas^2)

with the prediction's mean and sd taken over the base cell's repeats (each
repeat predicts the re-run on its own, so the base's noise enters the band)
and the measured mean and sd over the re-run cell's repeats. An sd of a
single value is unknown and counts as 0. For relative metrics the error and
sigma are % of the measured mean; for the effective-delay share, points.
``flips`` says whether the verdict would differ with sigma dropped, so a
reader sees how many verdicts noise decides.

Kinds of what-if: ``align`` (a fetch alignment physically applied),
``start`` (a start alignment physically applied), ``control`` (the start
mechanism on but inactive: its overhead), ``loader`` (another worker count
or prefetch factor), ``repeat`` (noise: no target) and ``identity`` (A
predicting itself: no target).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from validation.cells import Stat

ITERATION_PCT = 2.0  # alignment what-ifs (fetch, start, control): mean iteration time
SHARE_PTS = 2.0  # alignment what-ifs: effective-delay share, percentage points
LOADER_PCT = 5.0  # loader what-ifs (workers, prefetch): mean iteration time
ALIGN_KINDS = ("align", "start", "control")
OVERALL_SHARE = 90.0  # % of cells that must meet their target
OVERALL_WORST_PCT = 8.0  # alignment what-ifs: worst cell's iteration error

TARGETS: dict[str, str] = {
    "iteration": (
        f"alignment what-ifs (fetch, start, control): mean iteration time within "
        f"max({ITERATION_PCT:g} %, 2σ)"
    ),
    "share": f"alignment what-ifs: effective-delay share within max({SHARE_PTS:g} points, 2σ)",
    "loader": f"loader what-ifs (workers, prefetch): mean iteration time within "
    f"max({LOADER_PCT:g} %, 2σ)",
}
# target -> (metric, threshold, kinds it applies to)
RULES: dict[str, tuple[str, float, tuple[str, ...]]] = {
    "iteration": ("iteration_ms", ITERATION_PCT, ALIGN_KINDS),
    "share": ("effective_delay_pct", SHARE_PTS, ALIGN_KINDS),
    "loader": ("iteration_ms", LOADER_PCT, ("loader",)),
}


@dataclass(frozen=True)
class Verdict:
    """One target judged: the error, 2σ in the error's unit, the band, met, and met without σ."""

    error: float | None
    two_sigma: float | None
    bound: float | None
    met: bool | None
    met_without_sigma: bool | None

    @property
    def flips(self) -> bool:
        return self.met is not None and self.met != self.met_without_sigma

    @property
    def word(self) -> str:
        return {True: "met", False: "missed"}.get(self.met, "n/a")  # type: ignore[arg-type]


NO_VERDICT = Verdict(None, None, None, None, None)


def judge(pred: Stat | None, meas: Stat, threshold: float, relative: bool) -> Verdict:
    """|mean pred - mean meas| <= max(threshold, 2σ); relative: in % of the measured mean."""
    if pred is None or pred.n == 0 or meas.n == 0:
        return NO_VERDICT
    if not (math.isfinite(pred.mean) and math.isfinite(meas.mean)):
        return NO_VERDICT
    sigma = math.hypot(pred.sd or 0.0, meas.sd or 0.0)
    diff = pred.mean - meas.mean
    if relative:
        if meas.mean == 0:
            return NO_VERDICT
        diff, sigma = 100.0 * diff / meas.mean, 100.0 * sigma / abs(meas.mean)
    bound = max(threshold, 2.0 * sigma)
    eps = 1e-12
    return Verdict(diff, 2.0 * sigma, bound, abs(diff) <= bound + eps, abs(diff) <= threshold + eps)


def verdicts(kind: str, pred: dict[str, Stat] | None, meas: dict[str, Stat]) -> dict[str, Verdict]:
    """Target name -> ``Verdict`` for one what-if of ``kind``; targets that do not apply absent."""
    out = {}
    for target, (metric, threshold, kinds) in RULES.items():
        if kind in kinds:
            relative = metric != "effective_delay_pct"
            p = pred.get(metric) if pred else None
            out[target] = judge(p, meas[metric], threshold, relative)
    return out
