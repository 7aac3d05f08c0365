"""`dsim run`'s headline: the verdict of the more accurate model for alignment what-ifs.

FIDELITY.md ("Targets, met / judged"): for alignment what-ifs against
physical re-runs the pipeline model is within its band in more cells
than the per-iteration model (the original analysis, `dsim run`'s default),
for the mean iteration time and for the effective-delay share alike, on the
contention sweep and on both held-out sweeps. So when a run was replayed with
the per-iteration model and its trace has the
fetch records the pipeline model needs, `dsim run` says first what the
pipeline model predicts for the same policies, and the original analysis's
number one line below; the report's verdict section does the same (it
reads the traces for attribution already). The summary table, ``--json``,
the files and ``dsim summarize`` (which reads results only) keep the
per-iteration verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dsim.analysis.headline import (
    CalibratedPipeline,
    calibrate_pipeline,
    pipeline_verdict_on,
    replays_policies,
)
from dsim.analysis.verdict import DEFAULT_MODEL, Verdict
from dsim.errors import DsimError
from dsim.io.memory import release_freed
from dsim.model.selection import selection_mask

#: The model FIDELITY.md shows more accurate, per kind of what-if `dsim run` verdicts make.
MORE_ACCURATE = {"alignment": "pipeline"}


def _selection(rows: Sequence[Mapping[str, Any]]) -> tuple[list[int], int, float] | None:
    first = rows[0]
    try:
        epochs = [int(e) for e in str(first["selected_epochs"]).split(",") if e.strip()]
        return epochs, int(first["warmup"]), float(first["threshold_s"])
    except (KeyError, TypeError, ValueError):
        return None


def pipeline_verdict(
    rows: Sequence[Mapping[str, Any]], trace_dir: Path, trace: Mapping[str, Any] | None
) -> Verdict | None:
    """The pipeline model's verdict on the policies of a per-iteration run's ``rows``.

    ``None`` when it cannot be had the same way (no fetch records, a policy
    the pipeline model does not replay, no selection recorded): the
    per-iteration verdict then stays the headline.
    """
    if not replays_policies(rows):
        return None
    selection = _selection(rows)
    if selection is None:
        return None
    epochs, warmup, threshold = selection
    release_freed()  # what the replays freed, before the trace is read again
    try:
        calibrated, mask = _calibrated(trace_dir, str(rows[0]["run"]), epochs, warmup)
    except DsimError:
        return None
    if calibrated is None:
        return None
    return pipeline_verdict_on(rows, calibrated, mask, threshold, trace)


def _calibrated(
    trace_dir: Path, run: str, epochs: list[int], warmup: int
) -> tuple[CalibratedPipeline | None, Any]:
    """The run's pipeline model and the selected iterations; the arrays are let go on
    return (``calibrate_pipeline``). ``None`` (no calibration) when none is selected."""
    from dsim.app.tune import fetch_arrays

    arrays = fetch_arrays(trace_dir, run)
    mask = selection_mask(arrays.epoch, arrays.iteration, epochs, warmup)
    return (calibrate_pipeline(arrays) if mask.any() else None), mask


def headlines(
    summary: Any, verdicts: Sequence[Verdict], traces: Path, infos: Mapping[str, Any]
) -> dict[str, Verdict]:
    """Results directory → the pipeline model's verdict, for per-iteration verdicts whose
    trace allows it."""
    found: dict[str, Verdict] = {}
    for v in verdicts:
        if v.model != DEFAULT_MODEL or v.results is None:
            continue
        rows = summary[summary["results"] == v.results].to_dict("records")
        info = infos.get(v.results)
        trace = info.trace.document() if info is not None and info.trace else None
        name = info.trace.name if info is not None and info.trace else v.run  # not a label
        better = pipeline_verdict(rows, traces / name, trace) if rows else None
        if better is not None:
            found[v.results] = better
    return found
