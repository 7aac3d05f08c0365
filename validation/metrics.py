"""The five numbers the harness compares, with dsim's summary selection.

Measured and predicted numbers must be computed by the same rule, or the
comparison measures the bookkeeping instead of the model. So every number
here — from a re-run's ``actual/actual`` replay, a per-iteration prediction
or a pipeline prediction — comes from per-iteration rows through
``run_metrics``, which selects iterations exactly as ``dsim summarize`` does
(``dsim.analysis.summary``: every epoch but the first when there are several, skip
iterations <= 10 of each epoch, delay strictly above 30 ms is effective).
The comparison checks that it reproduces dsim's own summary of every run.
"""

from __future__ import annotations

import math

import numpy as np

from dsim.analysis.summary import DEFAULT_THRESHOLD_S, DEFAULT_WARMUP
from dsim.model.selection import default_epochs, selection_mask

#: fidelity.csv's column of each alignment cell's pipeline error with the re-run's CPU time
#: per batch (``validation.swaps.cpu_swap``; ``validation.compare`` writes it, the report
#: sets it beside the prediction's error).
MATCHED = "iteration_ms_err_pipeline_cpu_matched"

METRICS = ("iteration_ms", "stall_ms", "delay_ms", "effective_delay_pct", "epoch_s")
LABELS = {
    "iteration_ms": "mean iteration time (ms)",
    "stall_ms": "mean stall (ms)",
    "delay_ms": "mean delay (ms)",
    "effective_delay_pct": "effective-delay share (%)",
    "epoch_s": "epoch wall time (s)",
}
# How a prediction's error is expressed: relative % for times, absolute for the rest.
ERROR_KIND = {
    "iteration_ms": "rel_pct",
    "stall_ms": "rel_pct",
    "delay_ms": "abs_ms",
    "effective_delay_pct": "abs_pts",
    "epoch_s": "rel_pct",
}


def run_metrics(
    epoch: np.ndarray,
    iteration: np.ndarray,
    iteration_s: np.ndarray,
    stall_s: np.ndarray,
    delay_s: np.ndarray,
    *,
    warmup: int = DEFAULT_WARMUP,
    threshold_s: float = DEFAULT_THRESHOLD_S,
) -> dict[str, float]:
    """Per-iteration rows of one replay -> the five metrics.

    ``epoch_s`` is the wall time of an epoch — the sum of *all* its iteration
    times, warm-up included, since an epoch's wall time is what a user
    waits — averaged over the selected epochs.
    """
    epoch = np.asarray(epoch)
    iteration = np.asarray(iteration)
    iteration_s = np.asarray(iteration_s, dtype=np.float64)
    stall_s = np.asarray(stall_s, dtype=np.float64)
    delay_s = np.asarray(delay_s, dtype=np.float64)
    epochs = default_epochs(np.unique(epoch).tolist())
    mask = selection_mask(epoch, iteration, epochs, warmup)
    if not mask.any():
        raise ValueError(f"no iteration selected (epochs {epochs}, iterations > {warmup})")
    delay = delay_s[mask]
    walls = [float(iteration_s[epoch == e].sum()) for e in epochs]
    return {
        "iteration_ms": float(iteration_s[mask].mean()) * 1e3,
        "stall_ms": float(stall_s[mask].mean()) * 1e3,
        "delay_ms": float(delay.mean()) * 1e3,
        "effective_delay_pct": 100.0 * float((delay > threshold_s).sum()) / len(delay),
        "epoch_s": float(np.mean(walls)),
    }


def drain_split(
    epoch: np.ndarray,
    iteration: np.ndarray,
    iteration_s: np.ndarray,
    drain: int,
    *,
    warmup: int = DEFAULT_WARMUP,
) -> tuple[float, float]:
    """(body, drain) mean iteration time in ms over the selected iterations of every epoch.

    Why: the last ``drain`` (P·W) iterations of an epoch consume batches whose
    indices were all sent before; no new fetch starts, so on a busy node they
    run at another pace than the body. The drain is each selected epoch's
    last ``drain`` iterations (by iteration number), the body the selected
    ones before them (``run_metrics``' selection). NaN where either is empty.
    """
    epoch = np.asarray(epoch)
    iteration = np.asarray(iteration)
    iteration_s = np.asarray(iteration_s, dtype=np.float64)
    epochs = default_epochs(np.unique(epoch).tolist())
    mask = selection_mask(epoch, iteration, epochs, warmup)
    tail = np.zeros(len(epoch), dtype=bool)
    for e in epochs:
        mine = epoch == e
        if mine.any():
            tail |= mine & (iteration > iteration[mine].max() - max(int(drain), 0))
    body, last = mask & ~tail, mask & tail
    mean = lambda m: float(iteration_s[m].mean()) * 1e3 if m.any() else math.nan  # noqa: E731
    return mean(body), mean(last)


def error(metric: str, predicted: float | None, measured: float | None) -> float | None:
    """Signed error of a prediction: % of the measured value for times, else absolute."""
    if predicted is None or measured is None:
        return None
    if ERROR_KIND[metric] == "rel_pct":
        return 100.0 * (predicted - measured) / measured if measured else math.nan
    return predicted - measured
