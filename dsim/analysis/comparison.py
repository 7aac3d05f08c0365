"""Before/after: how much of the predicted gain did a fix realise?

A user who fixed a loader runs dsim on the old and the new trace and asks:
did it get faster, and how much of what dsim predicted did I get? This
module answers from the two runs' summary rows (``dsim.analysis.summary``), purely:

* measured deltas: the ``actual/actual`` (measured) means of iteration time,
  stall and delay and the effective-delay share, AFTER − BEFORE, and the
  relative change against BEFORE;
* realised share: BEFORE's predicted gain under a policy P (default: BEFORE's
  best, as the verdict picks it) is ``measured − P`` mean iteration time of
  BEFORE; AFTER realised ``BEFORE measured − AFTER measured``; the share is
  realised ÷ predicted (NaN when nothing was predicted). Over 100 % means
  AFTER gained more than aligning the loaders could explain; below 0 that it
  got slower;
* what is left: AFTER's own predicted gain under P, when AFTER replayed P;
* warnings when the two are not like for like (GPU count, selection of
  epochs/warm-up, threshold), since the deltas then mix in other causes;
* each side labelled ``measured`` or ``predicted`` (a loader what-if of the
  pipeline model: its ``actual/actual`` row is the model's prediction under
  other loader settings, never a measurement), and the words follow: a
  predicted side is never called measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsim.analysis.verdict import best_row, format_duration
from dsim.replay.policies import BASELINE, Policy
from dsim.words import counted

METRICS: tuple[tuple[str, str, str], ...] = (
    ("iteration_s_mean", "iteration time", "s"),
    ("stall_s_mean", "stall", "s"),
    ("delay_s_mean", "delay", "s"),
    ("effective_delay_pct", "effective delay", "%"),
)


@dataclass(frozen=True)
class MetricDelta:
    column: str
    label: str
    unit: str  # "s" or "%" (a share of iterations; its change is in percentage points)
    before: float
    after: float

    @property
    def change(self) -> float:
        return self.after - self.before

    @property
    def change_pct(self) -> float:
        """Relative change against BEFORE (NaN when BEFORE is 0)."""
        return 100.0 * self.change / self.before if self.before else math.nan


@dataclass(frozen=True)
class Comparison:
    before_run: str
    after_run: str
    deltas: list[MetricDelta]
    policy: Policy
    predicted_gain_s: float  # BEFORE measured − BEFORE under policy (mean iteration time)
    realised_gain_s: float  # BEFORE measured − AFTER measured
    realised_pct: float  # realised ÷ predicted × 100; NaN when nothing was predicted
    remaining_gain_s: float | None  # AFTER measured − AFTER under policy, if replayed
    warnings: list[str] = field(default_factory=list)
    text: str = ""
    before_label: str = "measured"
    after_label: str = "measured"

    def __repr__(self) -> str:
        """One line, the sentence ``dsim compare`` prints (not every field)."""
        return f"Comparison({self.before_run} → {self.after_run}: {self.text})"

    def _repr_html_(self) -> str:
        """In a notebook: the sentence, the measured deltas and the warnings, escaped."""
        from html import escape

        rows = "".join(
            f"<tr><td>{escape(d.label)}</td><td>{escape(_shown(d.before, d.unit))}</td>"
            f"<td>{escape(_shown(d.after, d.unit))}</td></tr>"
            for d in self.deltas
        )
        heads = f"<th></th><th>{escape(self.before_label)}</th><th>{escape(self.after_label)}</th>"
        warnings = "".join(f"<p>warning: {escape(w)}</p>" for w in self.warnings)
        return (
            f"<div><p><b>{escape(self.before_run)} → {escape(self.after_run)}</b></p>"
            f"<p>{escape(self.text)}</p><table><thead><tr>{heads}</tr></thead>"
            f"<tbody>{rows}</tbody></table>{warnings}</div>"
        )

    def record(self) -> dict[str, Any]:
        """One flat record (CSV row, JSON object): every number, named."""
        out: dict[str, Any] = {
            "before_run": self.before_run,
            "after_run": self.after_run,
            "before_label": self.before_label,
            "after_label": self.after_label,
        }
        for d in self.deltas:
            stem = d.column.removesuffix("_mean")
            out[f"{stem}_before"] = d.before
            out[f"{stem}_after"] = d.after
            out[f"{stem}_change"] = d.change  # percentage points for the "%" share
            if d.unit != "%":
                out[f"{stem}_change_pct"] = d.change_pct
        out.update(
            policy=f"{self.policy[0]}/{self.policy[1]}",
            predicted_gain_s=self.predicted_gain_s,
            realised_gain_s=self.realised_gain_s,
            realised_pct=self.realised_pct,
            remaining_gain_s=self.remaining_gain_s,
            warnings="; ".join(self.warnings),
            text=self.text,
        )
        return out


def _shown(value: float, unit: str) -> str:
    """A delta's side as a person reads it: a duration, or a share in %."""
    if not math.isfinite(value):
        return "–"
    return f"{value:.1f} %" if unit == "%" else format_duration(value)


def _row(rows: Sequence[Mapping[str, Any]], policy: Policy) -> Mapping[str, Any] | None:
    for r in rows:
        if (r["fetch_align"], r["start_align"]) == policy:
            return r
    return None


def _measured(rows: Sequence[Mapping[str, Any]], side: str) -> Mapping[str, Any]:
    row = _row(rows, BASELINE)
    if row is None:
        raise ValueError(f"{side} has no actual/actual replay (the measured run)")
    return row


def side_label(row: Mapping[str, Any]) -> str:
    """``measured``, or ``predicted (pipeline model, 8 workers, prefetch 2)`` for a loader
    what-if, whose ``actual/actual`` row is the model's, not the run's."""
    if not bool(row.get("loader_changed") or False):
        return "measured"
    model = row.get("replay_model") or "pipeline"
    workers, prefetch = row.get("loader_workers"), row.get("loader_prefetch_factor")
    return f"predicted ({model} model, {counted(int(workers), 'worker')}, prefetch {int(prefetch)})"


def _warnings(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    out = []
    if str(before.get("run")) == str(after.get("run")) and side_label(before) != side_label(after):
        out.append("the same run on both sides: one side is a prediction, not a re-run")
    for column, what in (
        ("gpus", "GPU counts"),
        ("selected_epochs", "selected epochs"),
        ("warmup", "warm-ups"),
        ("threshold_s", "effective-delay thresholds"),
    ):
        b, a = before.get(column), after.get(column)
        if b is not None and a is not None and str(b) != str(a):
            out.append(f"different {what} ({b} before, {a} after)")
    return out


def compare(
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    policy: Policy | None = None,
) -> Comparison:
    """Compare two runs from their summary rows (one list per run, a row per policy)."""
    if not before or not after:
        raise ValueError("both runs need summary rows")
    b_meas, a_meas = _measured(before, "BEFORE"), _measured(after, "AFTER")
    candidates = [r for r in before if (r["fetch_align"], r["start_align"]) != BASELINE]
    if policy is None:
        if not candidates:
            raise ValueError("BEFORE has no replay but actual/actual to predict a gain from")
        chosen = best_row(candidates)
        policy = (str(chosen["fetch_align"]), str(chosen["start_align"]))
    b_pol = _row(before, policy)
    if b_pol is None:
        have = ", ".join(f"{r['fetch_align']}/{r['start_align']}" for r in before)
        raise ValueError(f"BEFORE has no replay of {policy[0]}/{policy[1]} (it has {have})")
    deltas = [
        MetricDelta(column, label, unit, float(b_meas[column]), float(a_meas[column]))
        for column, label, unit in METRICS
    ]
    base = float(b_meas["iteration_s_mean"])
    predicted = base - float(b_pol["iteration_s_mean"])
    realised = base - float(a_meas["iteration_s_mean"])
    share = 100.0 * realised / predicted if predicted > 0 else math.nan
    a_pol = _row(after, policy)
    remaining = (
        float(a_meas["iteration_s_mean"]) - float(a_pol["iteration_s_mean"])
        if a_pol is not None
        else None
    )
    comparison = Comparison(
        before_run=str(b_meas["run"]),
        after_run=str(a_meas["run"]),
        deltas=deltas,
        policy=policy,
        predicted_gain_s=predicted,
        realised_gain_s=realised,
        realised_pct=share,
        remaining_gain_s=remaining,
        warnings=_warnings(b_meas, a_meas),
        before_label=side_label(b_meas),
        after_label=side_label(a_meas),
    )
    return _with_text(comparison)


def _with_text(c: Comparison) -> Comparison:
    label = f"{c.policy[0]}/{c.policy[1]}"
    it = c.deltas[0]
    change = f"({it.change_pct:+.0f} %)".replace("-", "−")
    if c.before_label == c.after_label == "measured":
        measured = f"Iterations {format_duration(it.before)} → {format_duration(it.after)} measured"
    else:
        measured = (
            f"Iterations {format_duration(it.before)} {c.before_label} → "
            f"{format_duration(it.after)} {c.after_label}"
        )
    measured += f" {change}"
    realised = "realised" if c.after_label == "measured" else "would realise"
    if math.isnan(c.realised_pct):
        gain = f"BEFORE predicted no gain from {label}, so there is no share to realise."
    else:
        gain = (
            f"AFTER {realised} {c.realised_pct:.0f} % of the gain BEFORE predicted for {label} "
            f"({format_duration(c.realised_gain_s)} of {format_duration(c.predicted_gain_s)} "
            "per iteration)."
        )
    text = f"{measured}. {gain}"
    if c.remaining_gain_s is not None:
        text += f" {label} would still save {format_duration(c.remaining_gain_s)} per iteration."
    return Comparison(**{**c.__dict__, "text": text})
