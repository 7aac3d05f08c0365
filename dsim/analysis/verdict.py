"""The verdict: one run's summary rows said in plain words, with absolute numbers.

Nine policies × eight columns leave the answer to the reader; the verdict says
it: which policy would help most, by how much (speed-up, stall, effective
delay), and what that is worth in wall time per epoch. It is a pure function
of the summary rows of one run (``dsim.analysis.summary.SUMMARY_COLUMNS``) and a few
facts about the run (GPU count, iterations per epoch, replay model), so the
terminal, the report and machine-readable outputs can share one
``Verdict`` and one sentence.

Rules (docs/SPEC.md §5.1):

* the measured run is ``actual/actual``; its numbers are taken from its own
  row or, when the rows shown leave it out, recovered from any row's what-if
  columns (they were computed against it);
* no verdict when the rows hold no policy but ``actual/actual``;
* the best policy is the one with the lowest mean iteration time among the
  rows given; ties (equal within a relative 1e-9) go to the simpler policy:
  fewer aligned sides first, then the order of ``dsim.replay.policies.POLICIES``;
* a policy *helps* when it saves at least ``HELPS_MIN_SAVING`` (1 %) of the
  measured mean iteration time; otherwise the verdict says nothing helps;
* a per-iteration verdict whose best policy aligns starts to ``min`` or
  ``avg`` names the assumption it rests on (a fetch may start before its
  worker is free), which the pipeline model does not make; a pipeline verdict
  whose best policy aligns starts to ``min`` says that this changes nothing
  there (SPEC §4.2);
* time saved per epoch = (measured − best mean iteration time) × iterations
  per epoch (the epoch length the run declared), an extrapolation of the
  selected iterations' means to a whole epoch;
* a loader what-if combined with an alignment is split into its parts: the
  loader change alone (the what-if's ``actual/actual`` row), the alignment
  alone (the same policy at the measured loader settings, when those rows are
  given) and both;
* caveats: a pipeline verdict on an IterableDataset's run (``STREAM_NOTE``);
  a loader what-if asking for more worker processes than the cores
  the run recorded (``run.json`` loader ``cores``, ``local_world_size``), and a
  selection of fewer than ``FEW_ITERATIONS`` iterations, where the speed-up is
  shown with its 95 % interval (mean ± 1.96 standard errors of both means, from
  the summary's std), never as a bare number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from dsim.analysis.model_error import (
    ALIGN_SHARE_ERROR_PTS,
    ALIGN_WHATIF_ERROR,
    LOADER_FEWER_ERROR,
    LOADER_WHATIF_ERROR,
    cores_per_rank,
    loader_errors,
    node_kind,
    share_band,
    speedup_band,
)
from dsim.model.resultinfo import ResultInfo
from dsim.replay.policies import (
    ACTUAL,
    AVG,
    BASELINE,
    MIN,
    POLICIES,
    REGISTRY,
    STALL_AVG,
    STALL_MIN,
    Policy,
)
from dsim.words import counted

DEFAULT_MODEL = "per-iteration"
# Its start-min is start actual (causal starts); its verdict says how it was calibrated
# (loader, consistency) and states the bands of its validated error.
PIPELINE_MODEL = "pipeline"
STALL_ONLY_MODEL = "stall-only"  # its verdict says that only stalls were replayed
HELPS_MIN_SAVING = 0.01  # a policy must save >= 1 % of the measured iteration time
#: Fewer selected iterations than this: the speed-up is stated with its interval.
FEW_ITERATIONS = 30
_TIE_RTOL = 1e-9


@dataclass(frozen=True)
class Verdict:
    """What would help one run, as numbers and as a sentence (``text``)."""

    run: str
    model: str
    helps: bool
    best_fetch_align: str
    best_start_align: str
    speedup: float  # measured ÷ best mean iteration time
    saving_pct: float  # 100 × (1 − best ÷ measured mean iteration time)
    iteration_s_before: float
    iteration_s_after: float
    stall_s_before: float
    stall_s_after: float
    stall_change_pct: float  # 100 × (after − before) ÷ before; NaN when before is 0
    effective_delay_pct_before: float
    effective_delay_pct_after: float
    saved_s_per_epoch: float | None  # None when the epoch length is unknown
    iterations_per_epoch: int | None
    gpus: int | None
    text: str
    results: str | None = None  # the run's results directory (summary column ``results``)
    loader_speedup: float | None = None  # a combined what-if: the loader change alone
    alignment_speedup: float | None = None  # ... the alignment alone, at the measured loader
    # The speed-up's 95 % interval when few iterations were selected; a pipeline verdict's
    # band, widened by the model's error on physical re-runs (``model_error``).
    speedup_low: float | None = None
    speedup_high: float | None = None
    model_error: float | None = None  # relative error of the predicted time the band carries
    # ... measured on which nodes (``model_error.node_kind``: few_cores, many_cores; ``None``
    # where the run does not log its cores, which takes the larger error)
    model_error_node: str | None = None
    # A pipeline verdict's effective delay after, ± the model's error of the share in points.
    effective_delay_pct_low: float | None = None
    effective_delay_pct_high: float | None = None
    share_model_error_pts: float | None = None
    caveats: tuple[str, ...] = ()  # printed under the verdict, one line each

    @property
    def best_policy(self) -> Policy:
        return (self.best_fetch_align, self.best_start_align)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Alignments in registry order: ``POLICIES``, then the stall alignments.
_ORDER = (*POLICIES, *(name for name in REGISTRY if name not in POLICIES))


def _simplicity(policy: Policy) -> tuple[int, int, int]:
    """Sort key: fewer aligned sides first, then the order of ``POLICIES`` per side."""
    aligned = sum(side != ACTUAL for side in policy)
    return (aligned, _ORDER.index(policy[0]), _ORDER.index(policy[1]))


def best_row(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The row with the lowest mean iteration time; ties to the simpler policy."""
    usable = [r for r in rows if _finite(r.get("iteration_s_mean"))]
    if not usable:
        raise ValueError("no row with a mean iteration time")
    lowest = min(float(r["iteration_s_mean"]) for r in usable)
    tied = [
        r
        for r in usable
        if math.isclose(float(r["iteration_s_mean"]), lowest, rel_tol=_TIE_RTOL, abs_tol=1e-15)
    ]
    return min(tied, key=lambda r: _simplicity((r["fetch_align"], r["start_align"])))


def _finite(value: Any) -> bool:
    return value is not None and isinstance(value, int | float) and math.isfinite(value)


def _loader_change(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """``with 8 workers and prefetch 4`` when the rows are a loader what-if (pipeline model)."""
    first = rows[0]
    if not bool(first.get("loader_changed") or False):
        return None
    workers, prefetch = first.get("loader_workers"), first.get("loader_prefetch_factor")
    return f"with {counted(int(workers), 'DataLoader worker')} and prefetch {int(prefetch)}"


def _fewer_workers(
    rows: Sequence[Mapping[str, Any]], loader_record: Mapping[str, Any] | None
) -> bool:
    """Whether a loader what-if asks for fewer DataLoader workers than the run measured: its
    error is then the one measured on such what-ifs (``model_error.loader_errors``)."""
    measured = (loader_record or {}).get("measured")
    workers = rows[0].get("loader_workers")
    if not isinstance(measured, Mapping) or not _finite(workers):
        return False
    recorded = measured.get("workers")
    return _finite(recorded) and int(workers) < int(recorded)


def _cores_per_rank(
    trace: Mapping[str, Any] | None, loader_record: Mapping[str, Any] | None
) -> float | None:
    """The recorded node's cores per rank, which chooses the model error a band carries
    (``model_error.NodeErrors``): ``run.json``'s loader block, as ``dsim tune`` reads it, else
    ``result.json``'s measured loader; ``None`` when neither logs the cores."""
    for block in ((trace or {}).get("loader"), (loader_record or {}).get("measured")):
        if isinstance(block, Mapping) and _finite(block.get("cores")):
            ranks = block.get("local_world_size")
            return cores_per_rank(int(block["cores"]), int(ranks) if _finite(ranks) else None)
    return None


def loader_calibration(loader: Mapping[str, Any] | None) -> str | None:
    """Which loader settings the pipeline model was calibrated with, and how dsim knows them:
    measured (the run's LOADER lines) or inferred (worker ids; PyTorch's prefetch default)."""
    measured = (loader or {}).get("measured")
    if not isinstance(measured, Mapping):
        return None
    workers, prefetch = int(measured["workers"]), int(measured["prefetch_factor"])
    if measured.get("source") == "log+ids":
        return (
            f"Calibrated with {counted(workers, 'DataLoader worker')} (counted from the fetch "
            "lines' worker ids: the run's LOADER lines say fewer) and prefetch "
            f"{prefetch} (measured: the LOADER lines)."
        )
    if measured.get("source") == "implied":
        return (
            f"Calibrated with {counted(workers, 'DataLoader worker')} (inferred from worker "
            "ids) and "
            f"prefetch {prefetch} (PyTorch's default, assumed)."
        )
    return (
        f"Calibrated with {counted(workers, 'DataLoader worker')} and prefetch {prefetch} "
        "(measured: the run's LOADER lines)."
    )


#: What the pipeline verdict adds when the trace cannot come from synchronous DDP (SPEC §1.7.1).
INCONSISTENT_NOTE = (
    "The trace is inconsistent with synchronous DDP (run.json 'consistency'): the calibration "
    "absorbs impossible terms, so these what-ifs are suspect."
)


def _baseline(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float, float]:
    """Measured (iteration s, stall s, effective delay %) of the run.

    A loader what-if's ``actual/actual`` row is not the measured run; its
    what-if columns are computed against the measured run, so they give it.
    """
    for r in rows:
        if (r["fetch_align"], r["start_align"]) == BASELINE and _loader_change(rows) is None:
            return (
                float(r["iteration_s_mean"]),
                float(r["stall_s_mean"]),
                float(r["effective_delay_pct"]),
            )
    for r in rows:  # recovered from the what-if columns, computed against actual/actual
        if _finite(r.get("speedup")) and _finite(r.get("iteration_s_mean")):
            return (
                float(r["iteration_s_mean"]) * float(r["speedup"]),
                float(r["stall_s_mean"]) - float(r["stall_change_s"]),
                float(r["effective_delay_pct"]) - float(r["effective_delay_change_pts"]),
            )
    raise ValueError("no actual/actual replay to compare with")


def iterations_per_epoch(trace: Mapping[str, Any] | None, epochs: Sequence[int]) -> int | None:
    """The epoch length the run declared (else had) for the selected epochs; their mean if
    they differ; ``None`` when the trace does not say."""
    trace = trace or {}
    for key in ("declared_iterations_per_epoch", "iterations_per_epoch"):
        per_epoch = trace.get(key)
        if not isinstance(per_epoch, Mapping):
            continue
        counts = [per_epoch.get(str(e), per_epoch.get(e)) for e in epochs]
        counts = [int(c) for c in counts if isinstance(c, int | float) and c > 0]
        if counts:
            return round(sum(counts) / len(counts))
    return None


def format_duration(seconds: float) -> str:
    """A duration as a person says it: ms, s, min or h, two or three significant digits."""
    s = abs(seconds)
    if s < 1:
        return f"{seconds * 1000:.0f} ms" if s >= 0.0995 else f"{seconds * 1000:.2g} ms"
    if s < 60:
        return f"{seconds:.3g} s"
    if s < 3600:
        return f"{seconds / 60:.0f} min" if s >= 600 else f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def format_pair(before: float, after: float) -> str:
    """``2.23 → 0.10 s``, or ``18.0 → 1.3 ms`` when both are below a second: one unit,
    chosen by the larger value, so that the two numbers compare at a glance."""
    if not (math.isfinite(before) and math.isfinite(after)):
        return f"{before} → {after} s"
    if max(abs(before), abs(after)) < 1:
        return f"{before * 1000:.1f} → {after * 1000:.1f} ms"
    return f"{before:.2f} → {after:.2f} s"


def _signed(value: float, digits: int = 0) -> str:
    """``+5`` / ``−95``: a typographic minus, as in running text."""
    return f"{value:+.{digits}f}".replace("-", "−")


#: What a stall alignment (docs/SPEC.md §4.3) does, in the verdict's words.
_STALL_WHAT = {
    STALL_MIN: "the least wait over ranks",
    STALL_AVG: "the mean wait over ranks",
}


def _what(policy: Policy, loader: str | None = None) -> str:
    if policy[0] in _STALL_WHAT:
        return (
            f"Replacing every rank's data wait by {_STALL_WHAT[policy[0]]} "
            f"({policy[0]}/{policy[1]})"
        )
    fetch, start = policy[0] != ACTUAL, policy[1] != ACTUAL
    if loader is not None and not (fetch or start):
        return f"Running {loader}"
    sides = "fetch and start" if fetch and start else "fetch" if fetch else "start"
    what = f"Aligning {sides} ({policy[0]}/{policy[1]})"
    return f"{what} {loader}" if loader is not None else what


#: Start alignments that move a start earlier than the rank's own: the per-iteration model
#: replays them without asking whether the rank's worker was free (SPEC §3, §5.1).
_EARLIER_STARTS = (MIN, AVG)
#: The assumption a per-iteration verdict that aligns starts rests on, in its words.
ASSUMES_EARLY_START = ", assuming a rank's fetch may start before its worker is free"
#: What a pipeline verdict whose best policy aligns starts to ``min`` says (SPEC §4.2): the
#: gain is the fetch side's, the start side replays as ``actual``.
PIPELINE_START_MIN = "; start-min cannot move a pipelined fetch earlier (it is start actual here)"


def _pct(value: float) -> str:
    return f"{value:.1f} %"


#: Said inside a pipeline verdict's band when the band's low end is ≤ 1.00×: the model's
#: error on re-runs is larger than the gain it predicts (SPEC §5.1).
BAND_REACHES_ONE = "the band reaches 1.00×, so the change may be no faster"


def verdict(
    rows: Sequence[Mapping[str, Any]],
    *,
    trace: Mapping[str, Any] | None = None,
    model: str = DEFAULT_MODEL,
    loader_record: Mapping[str, Any] | None = None,
    measured_rows: Sequence[Mapping[str, Any]] = (),
) -> Verdict:
    """The verdict of one run from its summary rows (one per policy).

    ``trace`` is the run's ``run.json`` (for the GPU count, the epoch
    length, the recorded cores and its consistency figures); ``model`` names the
    replay model the rows come from; ``loader_record`` is ``result.json``'s
    ``loader`` (pipeline model: the settings it was calibrated with, and where they
    came from; its ``cpu`` entry says how CPU contention was treated, SPEC §4.2);
    ``measured_rows``, for a loader what-if, are the same run's rows at its measured
    loader settings (they give the alignment alone).
    """
    if not rows:
        raise ValueError("no summary rows")
    if all((r["fetch_align"], r["start_align"]) == BASELINE for r in rows):
        raise ValueError("no policy but actual/actual: nothing to compare")
    run = str(rows[0]["run"])
    base_iter, base_stall, base_eff = _baseline(rows)
    best = best_row(rows)
    policy: Policy = (str(best["fetch_align"]), str(best["start_align"]))
    after_iter = float(best["iteration_s_mean"])
    after_stall = float(best["stall_s_mean"])
    after_eff = float(best["effective_delay_pct"])
    saving = 1.0 - after_iter / base_iter if base_iter > 0 else 0.0
    loader = _loader_change(rows)
    helps = (policy != BASELINE or loader is not None) and saving >= HELPS_MIN_SAVING
    epochs = [int(e) for e in str(best.get("selected_epochs") or "").split(",") if e.strip()]
    per_epoch = iterations_per_epoch(trace, epochs)
    gpus_value = best.get("gpus")
    if not _finite(gpus_value):
        gpus_value = (trace or {}).get("gpus")
    gpus = int(gpus_value) if _finite(gpus_value) else None
    saved = (base_iter - after_iter) * per_epoch if per_epoch else None
    stall_change = 100.0 * (after_stall - base_stall) / base_stall if base_stall > 0 else math.nan
    speedup = base_iter / after_iter if after_iter > 0 else math.inf
    interval = _interval(rows, best, base_iter, after_iter)
    parts = _split(rows, measured_rows, policy, base_iter) if loader is not None else (None, None)
    cpu = (loader_record or {}).get("cpu")
    cpu_aware = model == PIPELINE_MODEL and cpu_is_aware(cpu)
    notes = _caveats(rows, best, trace, cpu_aware)
    if model == PIPELINE_MODEL and isinstance(cpu, Mapping) and not cpu_aware:
        notes.append(cpu_over_cores_note(cpu))
    if model == PIPELINE_MODEL and _streamed(trace):
        notes.append(STREAM_NOTE)
    model_error = share_error = None
    share_low = share_high = None
    per_rank = _cores_per_rank(trace, loader_record)
    if model == PIPELINE_MODEL and helps:
        model_error, share_error = ALIGN_WHATIF_ERROR.on(per_rank), ALIGN_SHARE_ERROR_PTS
        error_words = ALIGN_WHATIF_ERROR.words(per_rank)
        if loader is not None:
            fewer = _fewer_workers(rows, loader_record)
            model_error, share_error = loader_errors(fewer, per_rank)
            error_words = (LOADER_FEWER_ERROR if fewer else LOADER_WHATIF_ERROR).words(per_rank)
        if math.isfinite(after_eff):  # (no band around an unknown share)
            share_low, share_high = share_band(after_eff, share_error)
        else:
            share_error = None
    if helps:
        change = "" if math.isnan(stall_change) else f" ({_signed(stall_change)} %)"
        how_much = f"{speedup:.2f}× faster"
        if model_error is not None:
            few = interval is not None
            low, high = interval if interval is not None else (speedup, speedup)
            interval = speedup_band(low, high, model_error)
            how_much += (
                f" (95 % band {interval[0]:.2f}–{interval[1]:.2f}×: the model's error on "
                f"physical re-runs, ±{100 * model_error:.1f} %{error_words}"
                + (", and the interval of few iterations" if few else "")
                + (f"; {BAND_REACHES_ONE})" if interval[0] <= 1.0 else ")")
            )
        elif interval is not None:
            how_much += f" (95 % interval {interval[0]:.2f}–{interval[1]:.2f}×)"
        text = (
            f"{_what(policy, loader)} would make iterations {how_much}: "
            f"stall {format_pair(base_stall, after_stall)}{change}, "
            f"effective delay {_pct(base_eff)} → {_pct(after_eff)} of iterations"
        )
        if share_low is not None and share_high is not None:
            text += f" (95 % band {share_low:.1f}–{_pct(share_high)})"
        where = f" on {counted(gpus, 'GPU')}" if gpus else ""
        if model == DEFAULT_MODEL and policy[1] in _EARLIER_STARTS:
            where += ASSUMES_EARLY_START
        elif model == PIPELINE_MODEL and policy[1] == MIN:
            where += PIPELINE_START_MIN
        if saved is not None:
            text += (
                f"; ≈ {format_duration(saved)} saved per epoch of "
                f"{counted(per_epoch, 'iteration')}{where}."
            )
        else:
            text += f"; {format_duration(base_iter - after_iter)} saved per iteration{where}."
    elif loader is not None and after_iter > base_iter * 1.01:  # not "saves < 1 %"
        text = (
            f"Running {loader} would make iterations slower even with the best policy "
            f"({policy[0]}/{policy[1]}: {format_pair(base_iter, after_iter)}, "
            f"{base_iter / after_iter:.2f}×); effective delay {_pct(base_eff)} of iterations."
        )
    elif loader is not None:
        text = (
            f"Running {loader} saves < 1 % of the iteration time even with the best policy "
            f"({policy[0]}/{policy[1]}: {format_pair(base_iter, after_iter)}); "
            f"effective delay {_pct(base_eff)} of iterations."
        )
    else:
        text = (
            f"Loaders are already aligned: the best policy ({policy[0]}/{policy[1]}) saves "
            f"< 1 % of the iteration time ({format_pair(base_iter, after_iter)}); "
            f"effective delay {_pct(base_eff)} of iterations."
        )
    if loader is not None and policy != BASELINE:
        text += " " + _split_text(loader, policy, parts, speedup)
    text += f" ({model} replay model{cpu_note(model, loader_record)})"
    if model == STALL_ONLY_MODEL:
        text = text[:-1] + ": from the measured stalls alone)"
    if model == PIPELINE_MODEL:
        calibration = loader_calibration(loader_record)
        if calibration is not None:
            text += f" {calibration}"
        consistency = (trace or {}).get("consistency")
        if isinstance(consistency, Mapping) and consistency.get("problems"):
            text += f" {INCONSISTENT_NOTE}"
    return Verdict(
        run=run,
        model=model,
        helps=helps,
        best_fetch_align=policy[0],
        best_start_align=policy[1],
        speedup=speedup,
        saving_pct=100.0 * saving,
        iteration_s_before=base_iter,
        iteration_s_after=after_iter,
        stall_s_before=base_stall,
        stall_s_after=after_stall,
        stall_change_pct=stall_change,
        effective_delay_pct_before=base_eff,
        effective_delay_pct_after=after_eff,
        saved_s_per_epoch=saved,
        iterations_per_epoch=per_epoch,
        gpus=gpus,
        text=text,
        loader_speedup=parts[0],
        alignment_speedup=parts[1],
        speedup_low=None if interval is None else interval[0],
        speedup_high=None if interval is None else interval[1],
        model_error=model_error,
        model_error_node=node_kind(per_rank) if model_error is not None else None,
        effective_delay_pct_low=share_low,
        effective_delay_pct_high=share_high,
        share_model_error_pts=share_error,
        caveats=tuple(notes),
    )


def cpu_note(model: str, loader: Mapping[str, Any] | None) -> str:
    """``; CPU-aware: 2 cores, 4 ranks per node`` or the independence assumption (pipeline only)."""
    if model != "pipeline":
        return ""
    cpu = (loader or {}).get("cpu")
    if not isinstance(cpu, Mapping):
        return "; fetch durations assumed independent of load: the logs carry no CPU times"
    if not cpu_is_aware(cpu):
        return (
            "; fetch durations assumed independent of load: the logged CPU times are more "
            "than the logged cores can run (see the caveat)"
        )
    if cpu.get("cpu_domains"):  # ranks bound in groups to CPUs of their own (SPEC §1.2)
        cores, ranks = counted(cpu.get("cores"), "core"), counted(cpu.get("ranks_per_node"), "rank")
        return f"; CPU-aware: {cores} per CPU domain, {ranks} bound to each"
    return f"; CPU-aware: {counted(cpu.get('cores'), 'core')}, {_ranks_per_node(cpu)}"


def _ranks_per_node(cpu: Mapping[str, Any]) -> str:
    if cpu.get("cpu_domains"):  # a "node" is a group of ranks bound to one CPU set
        return f"{counted(cpu.get('ranks_per_node'), 'rank')} per CPU domain"
    ranks = f"{counted(cpu.get('ranks_per_node'), 'rank')} per node"
    if cpu.get("ranks_per_node_assumed"):
        ranks += " (assumed: all ranks on one node, LOCAL_WORLD_SIZE not logged)"
    return ranks


def cpu_is_aware(cpu: Any) -> bool:
    """Whether ``result.json``'s ``loader.cpu`` record is of a CPU-aware replay (SPEC §4.2):
    a run whose logged CPU times exceed its cores has one too, of a load-independent one."""
    return isinstance(cpu, Mapping) and cpu.get("model", "cpu-aware") == "cpu-aware"


def cpu_over_cores_note(cpu: Mapping[str, Any]) -> str:
    """The caveat of a run whose logged CPU times exceed its logged cores (SPEC §4.2)."""
    over = cpu.get("cpu_over_cores")
    times = f"{float(over):.2f}× " if _finite(over) else "more than "
    return (
        f"the logs give each node {times}the CPU time its "
        f"{counted(cpu.get('cores'), 'logged core')} can run ({_ranks_per_node(cpu)}): the "
        "cores or ranks per node logged are not the ones the job ran on (ranks bound to "
        "cores of their own? several nodes without LOCAL_WORLD_SIZE?), so CPU contention "
        "was left out and fetch durations taken as independent of load"
    )


def _row_of(rows: Sequence[Mapping[str, Any]], policy: Policy) -> Mapping[str, Any] | None:
    for r in rows:
        if (r["fetch_align"], r["start_align"]) == policy and _finite(r.get("iteration_s_mean")):
            return r
    return None


def _split(
    rows: Sequence[Mapping[str, Any]],
    measured_rows: Sequence[Mapping[str, Any]],
    policy: Policy,
    base_iter: float,
) -> tuple[float | None, float | None]:
    """Speed-ups of a combined what-if's parts: the loader change alone, the alignment alone."""
    loader_row = _row_of(rows, BASELINE)
    align_row = _row_of(measured_rows, policy)
    return (
        None if loader_row is None else base_iter / float(loader_row["iteration_s_mean"]),
        None if align_row is None else base_iter / float(align_row["iteration_s_mean"]),
    )


def _split_text(
    loader: str, policy: Policy, parts: tuple[float | None, float | None], both: float
) -> str:
    """``Split: running with 1 … alone 0.58×, aligning (min/min) alone 1.20×, both 1.48×.``"""

    def say(value: float | None) -> str:
        return "not replayed" if value is None else f"{value:.2f}×"

    return (
        f"Split: running {loader} alone {say(parts[0])}; aligning ({policy[0]}/{policy[1]}) "
        f"alone, at the measured loader settings, {say(parts[1])}; both {both:.2f}×."
    )


def _interval(
    rows: Sequence[Mapping[str, Any]],
    best: Mapping[str, Any],
    base_iter: float,
    after_iter: float,
) -> tuple[float, float] | None:
    """The speed-up's 95 % interval when fewer than ``FEW_ITERATIONS`` iterations were selected.

    From the summary's means and std (the verdict has no per-iteration data):
    the relative standard errors of both means, added in quadrature.
    """
    n = best.get("iterations")
    if not _finite(n) or int(n) >= FEW_ITERATIONS or int(n) < 1 or after_iter <= 0:
        return None
    base = _row_of(rows, BASELINE)
    after_cv = float(best.get("iteration_s_std") or 0.0) / after_iter
    base_cv = after_cv
    if base is not None and _finite(base.get("iteration_s_std")) and base_iter > 0:
        base_cv = float(base["iteration_s_std"]) / float(base["iteration_s_mean"])
    rel = 1.96 * math.sqrt((after_cv**2 + base_cv**2) / int(n))
    speedup = base_iter / after_iter
    return speedup * max(1 - rel, 0.0), speedup * (1 + rel)


#: Caveat of a pipeline verdict on a run whose batches came from an IterableDataset (SPEC §4.2).
STREAM_NOTE = (
    "batches came from an IterableDataset: each stays on the worker that built it "
    "(no sampler maps batches to workers), so prefetch what-ifs are replayed and other "
    "worker counts are not"
)


def _streamed(trace: Mapping[str, Any] | None) -> bool:
    """Whether the run's fetch lines carried stream positions (``run.json`` report)."""
    report = (trace or {}).get("report")
    return isinstance(report, Mapping) and bool(report.get("stream_fetches"))


def _caveats(
    rows: Sequence[Mapping[str, Any]],
    best: Mapping[str, Any],
    trace: Mapping[str, Any] | None,
    cpu_aware: bool = False,
) -> list[str]:
    """What the verdict's numbers cannot promise, in words; ``cpu_aware``: the pipeline
    model shared the cores from the logged CPU times."""
    notes = []
    n = best.get("iterations")
    if _finite(n) and 0 < int(n) < FEW_ITERATIONS:
        notes.append(
            f"only {counted(int(n), 'iteration')} selected (fewer than {FEW_ITERATIONS}): "
            "read the interval, not the number"
        )
    loader = (trace or {}).get("loader")
    workers = rows[0].get("loader_workers")
    if isinstance(loader, Mapping) and bool(rows[0].get("loader_changed")) and _finite(workers):
        cores, node = loader.get("cores"), loader.get("local_world_size")
        ranks = node if _finite(node) and node > 0 else (trace or {}).get("gpus")
        if _finite(cores) and cores > 0 and _finite(ranks):
            note = cores_caveat(int(workers), int(ranks), int(cores), cpu_aware)
            if note is not None:
                notes.append(note)
    return notes


#: The cores caveat's end where the pipeline model shared the cores from the logged CPU times
#: (SPEC §4.2, §5.7): what it still does not model, measured (validation/README.md).
CPU_AWARE_CORES = (
    "; the model shares the cores between them from the logged CPU times but keeps each "
    "batch's CPU time, and a decode's grows when more processes take turns on a core "
    "(+17 % at 8 per core, validation/README.md); on re-runs whose loading decoded "
    "images or was other CPU work it still took extra workers for more than they gave "
    "(FIDELITY.md: the cpu and decode regimes' loader cells)"
)

#: Its end for a run without CPU times: the model takes fetch durations as load-free.
BLIND_CORES = ", and a model that does not know the cores predicts too much"


def cores_caveat(workers: int, ranks_on_node: int, cores: int, cpu_aware: bool) -> str | None:
    """The caveat for a loader setting whose worker processes outnumber the recorded cores
    (``None`` when they do not), the same words in ``dsim run``'s verdict and ``dsim tune``."""
    processes = workers * ranks_on_node
    if processes <= cores:
        return None
    return (
        f"{counted(workers, 'worker')} per rank are {counted(processes, 'worker process')} "
        f"on a node whose run recorded {counted(cores, 'core')}: they cannot all run at once"
        + (CPU_AWARE_CORES if cpu_aware else BLIND_CORES)
    )


def _facts(
    info: ResultInfo | Mapping[str, Any],
) -> tuple[Mapping[str, Any] | None, str, Mapping[str, Any] | None]:
    """The trace (``run.json`` document), model name and loader record a verdict needs from a
    ``result.json``."""
    if isinstance(info, ResultInfo):
        trace = info.trace.document() if info.trace else None
        return trace, info.model or DEFAULT_MODEL, info.loader
    return info.get("trace"), info.get("model") or DEFAULT_MODEL, info.get("loader")


def record_groups(summary: Any) -> list[list[dict[str, Any]]]:
    """A summary DataFrame's rows as dicts (``to_dict("records")``), grouped by run and
    results directory in order of first appearance: what
    ``[g.to_dict("records") for _, g in summary.groupby(keys, sort=False, dropna=False)]``
    gives, the same dicts in the same order.

    Why: pandas converts a frame to records column by column (~0.15 ms a column), so one
    ``to_dict`` per group cost ~10 ms a run for a summary's ~65 columns, twice per answer
    and twice per ``dsim run`` (issue #21: 14 % of a cached run over 20 runs). One
    conversion of the whole frame, grouped here, costs that once. A key that is missing
    (NaN) falls back to pandas' own grouping, whose place for it this does not reproduce.
    """
    if summary.empty:
        return []
    keys = [k for k in ("run", "results") if k in summary.columns]
    if not keys or summary[keys].isna().to_numpy().any():
        return [g.to_dict("records") for _, g in summary.groupby(keys, sort=False, dropna=False)]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in summary.to_dict("records"):
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return list(groups.values())


def run_verdicts(
    summary: Any, infos: Mapping[str, ResultInfo | Mapping[str, Any]] | None = None
) -> list[Verdict]:
    """One ``Verdict`` per run (and results directory) of a summary DataFrame.

    ``infos`` maps a results run directory (the summary's ``results`` column)
    or a run name to that run's ``result.json`` (a ``ResultInfo`` or its
    document), whose ``trace`` and ``model`` the verdict uses; runs without
    one get the defaults.
    """
    infos = infos or {}
    out = []
    groups = record_groups(summary)
    for rows in groups:
        first = rows[0]
        info = infos.get(str(first.get("results")), infos.get(str(first["run"]), {}))
        trace, model, loader = _facts(info)
        measured: list[dict[str, Any]] = []
        if bool(first.get("loader_changed") or False):
            measured = next((g for g in groups if _measured_of(g[0], first)), [])
        try:
            judged = verdict(
                rows, trace=trace, model=model, loader_record=loader, measured_rows=measured
            )
            results = first.get("results")
            out.append(replace(judged, results=results if isinstance(results, str) else None))
        except ValueError:  # no policy, or no measured run, to compare: nothing to say
            continue
    return out


def _measured_of(candidate: Mapping[str, Any], what_if: Mapping[str, Any]) -> bool:
    """Whether ``candidate`` is a row of ``what_if``'s run at its measured loader settings."""
    return (
        candidate["run"] == what_if["run"]
        and candidate.get("replay_model") == what_if.get("replay_model")
        and not bool(candidate.get("loader_changed") or False)
    )


def original_line(v: Verdict) -> str:
    """The per-iteration verdict in one line, under the more accurate model's headline."""
    policy = f"{v.best_fetch_align}/{v.best_start_align}"
    if not math.isfinite(v.speedup):  # iterations of zero length: no ratio to state
        said = f"no speed-up it can state (best {policy}: iterations of no length)"
    elif v.helps:
        said = f"{v.speedup:.2f}× ({policy})"
    else:
        said = f"no policy saves ≥ 1 % (best {policy}: {v.speedup:.2f}×)"
    return (
        f"the original analysis's per-iteration replay says {said}, as in the table below; "
        "for alignment what-ifs the pipeline model is the more accurate (FIDELITY.md)"
    )
