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
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from dsim.model.results import replay_path
from dsim.model.tables import read_run
from dsim.replay.arrays import build_iteration_arrays
from dsim.replay.models.pipeline import PipelineModel
from dsim.replay.params import TORCH_DEFAULT_PREFETCH, LoaderSettings, ReplayParams
from dsim.replay.policies import Policy
from validation.metrics import run_metrics


def predict_per_iteration(results: Path, run: str, policy: Policy) -> dict[str, float]:
    """Metrics of ``dsim run``'s replay of ``run`` under ``policy``; actual/actual: measured."""
    table = pq.read_table(replay_path(results, run, policy)).to_pandas()
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
    trace_dir = Path(trace_dir)
    tables = read_run(trace_dir)
    arrays = build_iteration_arrays(tables.fetch, tables.train)
    traced_workers, traced_prefetch, source = loader_settings(trace_dir, tables.fetch.to_pandas())
    node = json.loads((trace_dir / "run.json").read_text()).get("loader") or {}
    settings = LoaderSettings(
        traced_workers, traced_prefetch, source, node.get("cores"), node.get("local_world_size")
    )  # the node's fields switch on the CPU-aware replay when the trace has CPU times
    arrays = replace(arrays, loader=settings)
    model = PipelineModel()
    params = ReplayParams(workers=workers, prefetch_factor=prefetch)
    result = model.replay(model.prepare(arrays, params), tuple(policy), params)
    return run_metrics(
        arrays.epoch, arrays.iteration, result.iteration_s, result.stall_s, result.delay_s
    )
