"""Predictions of a re-run from run A's parsed trace, one function per replay model.

``predict_per_iteration`` reads what ``dsim run`` wrote (the model that
exists today). ``predict_pipeline`` is the ONE adapter through which the
harness calls the pipeline model.

It calls dsim's own pipeline model (``dsim.replay.models.pipeline``), the
code behind ``dsim run --model pipeline``; the loader settings of a traced
run come from its ``run.json`` (the instrumentation's loader lines), else
from the harness's ``job.json``, else from what the trace implies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from dsim.model.results import find_result_runs
from dsim.model.tables import read_run
from dsim.replay.arrays import IterationArrays, build_iteration_arrays
from dsim.replay.models.pipeline import PipelineModel, PreparedPipeline, cpu_assumption
from dsim.replay.params import TORCH_DEFAULT_PREFETCH, LoaderSettings, ReplayParams
from dsim.replay.policies import Policy
from validation.metrics import drain_split, run_metrics


def predict_per_iteration(results: Path, run: str, policy: Policy) -> dict[str, float]:
    """Metrics of ``dsim run``'s replay of ``run`` under ``policy``; actual/actual: measured."""
    # through the reader: a replay file is a stub once the run's dataset holds its rows
    table = find_result_runs([results / run])[0].read(policy, gpus=False).to_pandas()
    return run_metrics(
        table["epoch"].to_numpy(),
        table["iteration"].to_numpy(),
        table["iteration_s"].to_numpy(),
        table["stall_s"].to_numpy(),
        table["delay_s"].to_numpy(),
    )


def loader_settings(trace_dir: Path, fetch: pd.DataFrame) -> tuple[int, int, str]:
    """(num_workers, prefetch_factor, where they came from) of the traced run.

    In order: ``run.json``'s ``loader`` entry (once dsim.instrument logs the
    loader's settings), the harness's ``job.json`` copied beside the trace,
    else what the trace implies (workers = highest worker id + 1) with
    PyTorch's default prefetch factor.
    """
    info = json.loads((trace_dir / "run.json").read_text())
    loader = info.get("loader")
    if isinstance(loader, dict) and loader.get("num_workers") is not None:
        prefetch = loader.get("prefetch_factor") or TORCH_DEFAULT_PREFETCH
        return int(loader["num_workers"]), int(prefetch), "run.json"
    job = trace_dir / "job.json"
    if job.is_file():
        settings = json.loads(job.read_text())
        prefetch = settings.get("prefetch_factor") or TORCH_DEFAULT_PREFETCH
        return int(settings["workers"]), int(prefetch), "job.json"
    return int(fetch["worker"].max()) + 1, TORCH_DEFAULT_PREFETCH, "implied by the trace"


TERMS = ("fetch", "lat_sent", "lat_free", "hand", "deliver", "after", "loop")


@dataclass(frozen=True)
class PipelineBase:
    """A parsed run prepared once for the pipeline model: arrays, model and calibration."""

    arrays: IterationArrays
    model: PipelineModel
    prepared: PreparedPipeline


def prepare_pipeline(trace_dir: Path) -> PipelineBase:
    """Read and calibrate a parsed run under its traced loader settings (``loader_settings``)."""
    trace_dir = Path(trace_dir)
    tables = read_run(trace_dir)
    arrays = build_iteration_arrays(tables.fetch, tables.train)
    traced_workers, traced_prefetch, source = loader_settings(trace_dir, tables.fetch.to_pandas())
    node = json.loads((trace_dir / "run.json").read_text()).get("loader") or {}
    settings = LoaderSettings(
        traced_workers,
        traced_prefetch,
        source,
        node.get("cores"),
        node.get("local_world_size"),
        node.get("process_cores"),
        node.get("cpu_domain_ranks"),
    )  # the node's fields switch on the CPU-aware replay when the trace has CPU times
    arrays = replace(arrays, loader=settings)
    model = PipelineModel()
    return PipelineBase(arrays, model, model.prepare(arrays, ReplayParams()))


def supports(policy: tuple[str, str]) -> bool:
    """Whether dsim's pipeline model (as installed now) replays ``policy``: checked, not assumed."""
    return bool(PipelineModel().supports(tuple(policy)))


def assumption_of(*objects: object) -> str:
    """The loader assumption the model says it made (e.g. CPU-aware or not), where it says one.

    Looked up at run time, by name, on the replay result and the prepared
    run (and their parts): any attribute whose name contains "assumption".
    So the harness picks the CPU-aware model's label up without depending
    on it; "n/a" where the installed model exposes none.
    """
    seen: list[object] = []
    queue = list(objects)
    while queue:
        obj = queue.pop(0)
        if obj is None or any(obj is s for s in seen):
            continue
        seen.append(obj)
        names = [n for n in dir(obj) if "assumption" in n.lower() and not n.startswith("__")]
        for name in sorted(names):
            value = getattr(obj, name, None)
            if value and not callable(value):
                return str(value)
        queue += [getattr(obj, part, None) for part in ("inputs", "calibration")]
    return "n/a"


def replay_metrics(
    base: PipelineBase,
    policy: tuple[str, str],
    workers: int | None,
    prefetch: int | None,
    prepared: PreparedPipeline | None = None,
) -> dict[str, object]:
    """The metrics of one pipeline replay of ``base`` (or of ``prepared``, a swapped copy)."""
    params = ReplayParams(workers=workers, prefetch_factor=prefetch)
    prep = base.prepared if prepared is None else prepared
    result = base.model.replay(prep, tuple(policy), params)
    metrics: dict[str, object] = dict(
        run_metrics(
            base.arrays.epoch,
            base.arrays.iteration,
            result.iteration_s,
            result.stall_s,
            result.delay_s,
        )
    )
    cpu = cpu_assumption(base.arrays)
    if not cpu:
        metrics["assumption"] = "no CPU times: fetch durations independent of load"
    elif cpu.get("cpu_domains"):  # ranks bound in groups to CPU sets of their own
        metrics["assumption"] = (
            f"CPU-aware: {cpu['cores']} cores per CPU domain, "
            f"{cpu['ranks_per_node']} ranks bound to each"
        )
    else:
        metrics["assumption"] = (
            f"CPU-aware: {cpu['cores']} cores, {cpu['ranks_per_node']} ranks per node"
        )
    return metrics


def drain_metrics(
    base: PipelineBase, policy: tuple[str, str], workers: int | None, prefetch: int | None
) -> tuple[float, float]:
    """(body, drain) mean iteration ms of one pipeline replay (``metrics.drain_split``).

    The drain is the last P·W iterations of each epoch under the replay's loader
    settings; ``actual/actual`` at the traced settings is the run as measured.
    """
    result = base.model.replay(
        base.prepared, tuple(policy), ReplayParams(workers=workers, prefetch_factor=prefetch)
    )
    c = base.prepared.calibration
    w = c.workers if workers is None else int(workers)
    p = c.prefetch if prefetch is None else int(prefetch)
    return drain_split(base.arrays.epoch, base.arrays.iteration, result.iteration_s, w * p)


def predict_pipeline(
    trace_dir: Path, policy: tuple[str, str], workers: int | None, prefetch: int | None
) -> dict[str, float]:
    """Metrics of the pipeline model's replay of a parsed run.

    ``policy`` is (fetch-align, start-align) in dsim's names; ``workers`` and
    ``prefetch`` are the loader what-ifs (``None``: as traced). It runs the
    same library calls as ``dsim run --model pipeline --workers N
    --prefetch-factor P`` (arrays, ``PipelineModel.prepare`` and ``replay``),
    with the traced loader settings taken as ``loader_settings`` says.
    """
    out = replay_metrics(prepare_pipeline(trace_dir), policy, workers, prefetch)
    out.pop("assumption")
    return out  # type: ignore[return-value]


def term_means(prepared: PreparedPipeline) -> dict[str, np.ndarray]:
    """Per calibrated term (and the fetch durations), its mean per rank over finite values."""
    out = {}
    for term in TERMS:
        values = _term(prepared, term)
        if values is None:
            continue
        finite = np.where(np.isfinite(values), values, np.nan)
        with np.errstate(all="ignore"):
            out[term] = (
                np.nanmean(finite, axis=0) if len(finite) else np.full(values.shape[1:], np.nan)
            )
    return out


def _term(prepared: PreparedPipeline, term: str) -> np.ndarray | None:
    holder = prepared.inputs if term == "fetch" else prepared.calibration
    value = getattr(holder, term, None)
    return None if value is None else np.asarray(value, dtype=np.float64)


def swap_term(prepared: PreparedPipeline, term: str, means: np.ndarray) -> PreparedPipeline:
    """``prepared`` with ``term`` shifted per rank so that its per-rank mean is ``means``.

    The per-batch variation of the base run is kept; only the level moves,
    to what the re-run measured. Non-finite entries (constraints that never
    bind) stay as they are; a rank without a finite mean on either side is
    left unchanged.
    """
    values = _term(prepared, term)
    if values is None:
        raise ValueError(f"the pipeline model has no term {term!r}")
    own = term_means(prepared)[term]
    shift = np.where(np.isfinite(own) & np.isfinite(means), means - own, 0.0)
    shifted = np.where(np.isfinite(values), values + shift, values)
    if term == "fetch":
        shifted = np.maximum(shifted, 0.0)  # a fetch never lasts less than nothing
        return replace(
            prepared, inputs=replace(prepared.inputs, fetch=np.ascontiguousarray(shifted))
        )
    calibration = replace(prepared.calibration, **{term: np.ascontiguousarray(shifted)})
    return replace(prepared, calibration=calibration)
