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
mechanism on but inactive: its overhead), ``loader`` (more workers or
another prefetch factor), ``fewer`` (fewer workers: what ``dsim tune``
predicts from a run with more), ``repeat`` (noise: no target) and ``identity`` (A
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
    "fewer": f"fewer workers (a run with more predicting fewer): mean iteration time within "
    f"max({LOADER_PCT:g} %, 2σ)",
}
# target -> (metric, threshold, kinds it applies to)
RULES: dict[str, tuple[str, float, tuple[str, ...]]] = {
    "iteration": ("iteration_ms", ITERATION_PCT, ALIGN_KINDS),
    "share": ("effective_delay_pct", SHARE_PTS, ALIGN_KINDS),
    "loader": ("iteration_ms", LOADER_PCT, ("loader",)),
    "fewer": ("iteration_ms", LOADER_PCT, ("fewer",)),
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


def mean_error_se(pred: Stat | None, meas: Stat, relative: bool = True) -> float | None:
    """Standard error of ``mean pred - mean meas``: sqrt(sd_pred²/n_base + sd_meas²/n_rerun).

    Why beside σ: the band of ``judge`` holds one run's noise (the sds), which is what a
    user comparing one run with one prediction meets; the error of a cell's *means* over
    3-5 repeats is noisy by this much less, and an error of several of these standard
    errors is the model's bias, not the repeats' noise. In % of the measured mean when
    ``relative``. None where a side has one value: its noise is unknown, and counting it
    as 0 (as ``judge`` does for its band) would call any error a bias.
    """
    if pred is None or meas.mean == 0 or pred.sd is None or meas.sd is None:
        return None
    if not (math.isfinite(pred.mean) and math.isfinite(meas.mean)):
        return None
    se = math.hypot(pred.sd / math.sqrt(pred.n), meas.sd / math.sqrt(meas.n))
    return 100.0 * se / abs(meas.mean) if relative else se


def unbiased_worst_within(ses: list[float], bound: float) -> float:
    """P(every cell's |error| <= ``bound``) for a model without bias, given the cells' SEs.

    Why: "worst cell <= 8 %" is a maximum over cells, and the maximum of noisy means grows
    with their noise and their number: a model that is right on average in every cell
    still misses it when the repeats are too few. With each cell's error normal around 0
    with its standard error (``mean_error_se``) and the cells independent, the chance is
    prod_i erf(bound / (SE_i sqrt 2)); a cell with SE 0 is within surely.
    """
    p = 1.0
    for se in ses:
        if se > 0:
            p *= math.erf(bound / (se * math.sqrt(2.0)))
    return p


def unbiased_worst_quantile(ses: list[float], q: float = 0.5) -> float:
    """The ``q``-quantile of the worst |error| of an unbiased model (``unbiased_worst_within``
    inverted by bisection); 0 when every SE is 0."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be inside (0, 1), not {q}")  # 1 has no finite quantile
    if not ses or max(ses) <= 0:
        return 0.0
    lo, hi = 0.0, 10.0 * max(ses)
    while unbiased_worst_within(ses, hi) < q:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if unbiased_worst_within(ses, mid) < q:
            lo = mid
        else:
            hi = mid
    return hi


def repeats_for(ses: list[float], ns: list[int], bound: float, p: float = 0.9) -> int | None:
    """Repeats per cell (base and re-run alike) at which an unbiased model's worst cell would
    be within ``bound`` with probability ``p``; SEs scale as sqrt(n_now / n). None above 1000."""
    for n in range(1, 1001):
        scaled = [se * math.sqrt(k / n) for se, k in zip(ses, ns, strict=True)]
        if unbiased_worst_within(scaled, bound) >= p:
            return n
    return None
