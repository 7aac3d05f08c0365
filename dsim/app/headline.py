"""`dsim run`'s headline: the verdict of the more accurate model for alignment what-ifs.

FIDELITY.md ("Absolute errors in short"): for alignment what-ifs the
pipeline model's mean iteration-time error against physical re-runs is
2.7 %, the per-iteration model's (the original analysis, `dsim run`'s
default) 3.6 %, and the effective-delay share 0.5 against 7.6 points. So
when a run was replayed with the per-iteration model and its trace has the
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

from dsim.analysis.summary import add_what_if, summarize_metrics
from dsim.analysis.verdict import DEFAULT_MODEL, Verdict, verdict
from dsim.errors import DsimError
from dsim.model.selection import selection_mask
from dsim.replay.models import get_model
from dsim.replay.models.pipeline import SUPPORTED
from dsim.replay.params import ReplayParams

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
    import pandas as pd

    from dsim.app.tune import fetch_arrays

    policies = [(str(r["fetch_align"]), str(r["start_align"])) for r in rows]
    if any(side not in SUPPORTED for policy in policies for side in policy):
        return None
    selection = _selection(rows)
    if selection is None:
        return None
    epochs, warmup, threshold = selection
    try:
        arrays = fetch_arrays(trace_dir, str(rows[0]["run"]))
    except DsimError:
        return None
    mask = selection_mask(arrays.epoch, arrays.iteration, epochs, warmup)
    if not mask.any():
        return None
    model = get_model("pipeline")
    prepared = model.prepare(arrays, ReplayParams())
    out = []
    for row, policy in zip(rows, policies, strict=True):
        stats = summarize_metrics(
            model.replay(prepared, policy, ReplayParams()).metrics(), mask, threshold
        )
        keep = {
            k: row.get(k) for k in ("run", "fetch_align", "start_align", "selected_epochs", "gpus")
        }
        out.append({**keep, **stats})
    table = add_what_if(pd.DataFrame(out)).to_dict("records")
    try:
        return verdict(table, trace=trace, model="pipeline", loader_record=_record(arrays))
    except ValueError:
        return None


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


def _record(arrays: Any) -> dict[str, Any]:
    """The loader record ``dsim run --model pipeline`` keeps in result.json, for the verdict."""
    from dsim.replay.models.pipeline import cpu_assumption, measured_loader

    record: dict[str, Any] = {"measured": measured_loader(arrays).document()}
    cpu = cpu_assumption(arrays)
    if cpu is not None:
        record["cpu"] = cpu
    return record
