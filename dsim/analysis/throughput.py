"""Throughput and weak-scaling efficiency of summary rows (docs/SPEC.md §5.5). Pure.

Throughput needs the per-rank batch size, which a trace holds in one of three
places, most direct first: the loader line of ``dsim.instrument`` (``run.json``
``loader.batch_size``, per rank), the training lines' ``Throughput`` field
(per rank: batch ÷ iteration time, so batch = throughput × ``Time``), or the
run name's ``b<B>`` (the job's global batch, as the ImageNet example, the
original analysis, ``dsim synth`` and ``examples/ddp_cpu.py`` name runs:
per rank = B ÷ GPUs). Without any (profiler traces, say) the columns stay
empty and ``throughput_note`` says why.

Each rank consumes one batch per iteration and DDP keeps the ranks in step,
so a rank's throughput is batch ÷ mean iteration time and the job's is that
times the GPU count — measured, or replayed under a policy.

Weak scaling keeps the per-rank batch and adds GPUs: rows of the same job
(the run name's fields but the global batch, the per-rank batch, the replay
model and loader settings, the policy) at different GPU counts give
efficiency = job throughput ÷ (GPUs × per-rank throughput of the job's
smallest run), 1.0 for ideal scaling; with a one-GPU run that is the usual
global ÷ (ranks × single-rank) throughput.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from dsim.model.runname import RUN_NAME_FIELDS
from dsim.words import counted

#: Where the per-rank batch size came from.
FROM_LOADER = "loader"
FROM_THROUGHPUT = "throughput"
FROM_RUN_NAME = "run_name"

THROUGHPUT_COLUMNS = [
    "batch_size_rank",
    "batch_size_source",
    "throughput_rank_samples_s",
    "throughput_job_samples_s",
    "throughput_gain_samples_s",
    "scaling_efficiency",
    "scaling_base_gpus",
    "throughput_note",
]

NO_BATCH = (
    "throughput unknown: no batch size (no loader line, Throughput field or b<B> in the run name)"
)
NO_JOB = "no scaling efficiency: the run name carries no job fields"
ONE_SIZE = "no scaling efficiency: no run of the same job at another GPU count"
#: Fields that name a job: the run name's, less the global batch (it grows with the GPUs).
JOB_FIELDS = [f for f in RUN_NAME_FIELDS if f != "batch_size"]
VARIANT_FIELDS = [
    "replay_model",
    "loader_workers",
    "loader_prefetch_factor",
    "loader_changed",
    "fetch_align",
    "start_align",
    "batch_size_rank",
]


def batch_from_throughput(throughput: np.ndarray, iteration_s: np.ndarray) -> float | None:
    """The per-rank batch the ``Throughput`` field implies: median of throughput × time.

    Rounded to an integer when it is one to within 0.5 % (the field is printed
    with a few decimals); ``None`` without a positive finite pair.
    """
    t = np.asarray(throughput, dtype=np.float64)
    s = np.asarray(iteration_s, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(s) & (t > 0) & (s > 0)
    if not ok.any():
        return None
    # the products of the pairs kept, one array (not both columns copied first), whose
    # order the median may change: it is ours
    product = np.multiply(t, s, where=ok, out=np.zeros_like(t))[ok]
    batch = float(np.median(product, overwrite_input=True))
    nearest = round(batch)
    return float(nearest) if nearest > 0 and abs(batch - nearest) <= 0.005 * batch else batch


def batch_size(info: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """Per-rank batch size and its source, from a ``result.json`` (``batch`` recorded by
    ``dsim run``, else its ``trace``'s loader line or run-name batch and GPU count)."""
    recorded = info.get("batch")
    if isinstance(recorded, Mapping) and _positive(recorded.get("per_rank")):
        return float(recorded["per_rank"]), str(recorded.get("source"))
    return trace_batch_size(info.get("trace") or {}, None)


def trace_batch_size(
    trace: Mapping[str, Any], from_throughput: float | None
) -> tuple[float | None, str | None]:
    """The per-rank batch of a run: loader line > ``Throughput`` field > run name ÷ GPUs."""
    loader = trace.get("loader") or {}
    if _positive(loader.get("batch_size")):
        return float(loader["batch_size"]), FROM_LOADER
    if _positive(from_throughput):
        return float(from_throughput), FROM_THROUGHPUT  # type: ignore[arg-type]
    declared = (trace.get("metadata") or {}).get("batch_size")
    gpus = trace.get("gpus")
    if _positive(declared) and _positive(gpus):
        return float(declared) / float(gpus), FROM_RUN_NAME
    return None, None


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def add_throughput(df: pd.DataFrame) -> pd.DataFrame:
    """Throughput columns of summary rows that carry ``batch_size_rank`` (NaN: unknown)."""
    df = df.copy()
    batch = pd.to_numeric(df.get("batch_size_rank"), errors="coerce").astype("float64")
    gpus = pd.to_numeric(df["gpus"], errors="coerce").astype("float64")
    rank = batch / df["iteration_s_mean"].astype("float64")
    df["batch_size_rank"] = batch
    df["throughput_rank_samples_s"] = rank
    df["throughput_job_samples_s"] = rank * gpus
    # Same batch and GPUs as the measured run: its throughput is this one ÷ speed-up.
    speedup = df["speedup"].astype("float64")
    df["throughput_gain_samples_s"] = df["throughput_job_samples_s"] * (1.0 - 1.0 / speedup)
    df["throughput_note"] = [None if b == b else NO_BATCH for b in batch]
    return add_scaling(df)


def _job_key(row: pd.Series) -> tuple[Any, ...] | None:
    fields = [row.get(f) for f in JOB_FIELDS]
    if all(_missing(v) for v in fields):
        return None
    values = [*fields, *(row.get(f) for f in VARIANT_FIELDS)]
    return tuple(None if _missing(v) else v for v in values)


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def add_scaling(df: pd.DataFrame) -> pd.DataFrame:
    """Weak-scaling efficiency per row against the same job's smallest GPU count (module doc)."""
    df = df.copy()
    efficiency = np.full(len(df), np.nan)
    base_gpus = np.full(len(df), np.nan)
    notes = list(df["throughput_note"])
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (_, row) in enumerate(df.iterrows()):
        if notes[i] is not None:
            continue  # no throughput: already says why
        key = _job_key(row)
        if key is None:
            notes[i] = NO_JOB
            continue
        groups.setdefault(key, []).append(i)
    gpus = pd.to_numeric(df["gpus"], errors="coerce").to_numpy(dtype=np.float64)
    job = df["throughput_job_samples_s"].to_numpy(dtype=np.float64)
    for members in groups.values():
        counts = sorted({gpus[i] for i in members if gpus[i] == gpus[i]})
        if len(counts) < 2:
            for i in members:
                notes[i] = ONE_SIZE
            continue
        base = [i for i in members if gpus[i] == counts[0]]
        if len(base) > 1:
            for i in members:
                notes[i] = (
                    f"no scaling efficiency: {len(base)} runs of this job with "
                    f"{counted(int(counts[0]), 'GPU')}, the baseline is ambiguous"
                )
            continue
        per_rank_base = job[base[0]] / counts[0]
        for i in members:
            efficiency[i] = job[i] / (gpus[i] * per_rank_base)
            base_gpus[i] = counts[0]
    df["scaling_efficiency"] = efficiency
    df["scaling_base_gpus"] = base_gpus
    df["throughput_note"] = notes
    return df
