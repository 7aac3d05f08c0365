"""The pipeline model's verdict on given iterations: the headline of `dsim run` and `dsim watch`.

Pure (arrays in, a ``Verdict`` out), so that `dsim run`'s headline
(``dsim.app.headline``, which reads the trace) and `dsim watch`'s
(``dsim.live``, on the lines it holds) are one computation: the same
iterations get the same words (docs/SPEC.md §5.1 "Headline", §9.4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsim.analysis.summary import add_what_if, summarize_metrics
from dsim.analysis.verdict import Verdict, verdict
from dsim.replay.models import get_model
from dsim.replay.models.pipeline import SUPPORTED
from dsim.replay.params import ReplayParams


def replays_policies(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the pipeline model replays every policy of ``rows``."""
    return all(str(r[side]) in SUPPORTED for r in rows for side in ("fetch_align", "start_align"))


@dataclass(frozen=True)
class CalibratedPipeline:
    """The pipeline model calibrated on a run's arrays, and the loader record its verdict
    names: all a verdict needs of the arrays, so that callers can let them go first."""

    prepared: Any  # ``PreparedPipeline``
    loader_record: dict[str, Any]


def calibrate_pipeline(arrays: Any) -> CalibratedPipeline:
    """The pipeline model calibrated on all of ``arrays`` (an ``IterationArrays`` with its
    ``loader`` set, as ``dsim run --model pipeline`` has it).

    Why not keep the arrays: the calibration holds views of the columns it replays, and
    the rest (the worker ids, the worker processes' CPU, CPU columns with gaps the
    model fills) is ~20 bytes per GPU-iteration of the CPU-aware headline's peak. The
    record is taken first: its CPU assumption re-reads the CPU columns once.
    """
    record = _record(arrays)
    return CalibratedPipeline(get_model("pipeline").prepare(arrays, ReplayParams()), record)


def pipeline_verdict_on(
    rows: Sequence[Mapping[str, Any]],
    calibrated: CalibratedPipeline,
    mask: Any,
    threshold_s: float,
    trace: Mapping[str, Any] | None,
) -> Verdict | None:
    """The ``calibrated`` pipeline model replaying the policies of ``rows``, judged over the
    iterations ``mask`` selects; ``None`` when none is selected or nothing can be compared.
    Shared by ``dsim run``'s headline and ``dsim watch`` (``dsim.live``), so that the same
    iterations get the same words."""
    import pandas as pd

    mask = np.asarray(mask, dtype=bool)
    if not mask.any():
        return None
    model = get_model("pipeline")
    prepared = calibrated.prepared
    out = []
    for row in rows:
        policy = (str(row["fetch_align"]), str(row["start_align"]))
        stats = summarize_metrics(
            model.replay(prepared, policy, ReplayParams(), per_gpu=False).metrics(),
            mask,
            threshold_s,
        )
        keep = {
            k: row.get(k) for k in ("run", "fetch_align", "start_align", "selected_epochs", "gpus")
        }
        out.append({**keep, **stats})
    table = add_what_if(pd.DataFrame(out)).to_dict("records")
    try:
        return verdict(table, trace=trace, model="pipeline", loader_record=calibrated.loader_record)
    except ValueError:
        return None


def _record(arrays: Any) -> dict[str, Any]:
    """The loader record ``dsim run --model pipeline`` keeps in result.json, for the verdict."""
    from dsim.replay.models.pipeline import cpu_assumption, measured_loader

    record: dict[str, Any] = {"measured": measured_loader(arrays).document()}
    cpu = cpu_assumption(arrays)
    if cpu is not None:
        record["cpu"] = cpu
    return record
