"""Predictions of a re-run from run A's parsed trace, one function per replay model.

``predict_per_iteration`` reads what ``dsim run`` wrote (the model that
exists today). ``predict_pipeline`` is the ONE adapter through which the
harness calls the pipeline model.

PROVISIONAL: until the pipeline model lands in dsim, ``predict_pipeline``
runs ``tests/reference_pipeline.py`` (the lead's slow but exact row-by-row
reference of the model) on arrays built here from the parsed tables. When
``dsim run --model pipeline --workers N --prefetch-factor P`` exists, this
function's body is replaced by a call to it; its signature and return value
stay, so nothing else in the harness changes.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from dsim.policies import Policy
from dsim.results import replay_path
from validation.metrics import run_metrics

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "tests" / "reference_pipeline.py"
TORCH_DEFAULT_PREFETCH = 2


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


@cache
def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_pipeline", REFERENCE)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load the pipeline reference {REFERENCE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


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


def pipeline_arrays(fetch: pd.DataFrame, train: pd.DataFrame) -> dict[str, object]:
    """The reference's inputs: [iterations x GPUs] lists of complete iterations.

    Times are seconds since the earliest fetch start, taken from integer
    nanoseconds so that wall-clock timestamps keep sub-microsecond precision.
    ``start`` is the fetch start (end - duration), ``arrival`` the training
    line's timestamp (when the batch reached the loop).
    """
    f = fetch.copy()
    t = train.copy()
    origin = f["start"].min()
    f["start_s"] = (f["start"] - origin).dt.total_seconds()
    t["arrival_s"] = (t["start"] - origin).dt.total_seconds()
    keys = ["epoch", "iteration", "gpu"]
    both = f[[*keys, "start_s", "fetch_s", "worker"]].merge(
        t[[*keys, "arrival_s", "stall_s", "iteration_s"]], on=keys, how="inner"
    )
    gpus = int(both["gpu"].nunique())
    complete = both.groupby(["epoch", "iteration"])["gpu"].transform("size") == gpus
    both = both[complete].sort_values(keys)

    def grid(column: str, dtype: type = float) -> list[list]:
        wide = both.pivot(index=["epoch", "iteration"], columns="gpu", values=column)
        return wide.to_numpy(dtype=dtype).tolist()

    index = both[["epoch", "iteration"]].drop_duplicates()
    return {
        "epoch": index["epoch"].astype(int).tolist(),
        "iteration": index["iteration"].astype(int).tolist(),
        "start": grid("start_s"),
        "fetch": grid("fetch_s"),
        "arrival": grid("arrival_s"),
        "stall": grid("stall_s"),
        "iteration_time": grid("iteration_s"),
        "worker": grid("worker", int),
    }


def predict_pipeline(
    trace_dir: Path, policy: tuple[str, str], workers: int | None, prefetch: int | None
) -> dict[str, float]:
    """Metrics of the pipeline model's replay of a parsed run (PROVISIONAL, see module doc).

    ``policy`` is (fetch-align, start-align) in dsim's names; ``workers`` and
    ``prefetch`` are the loader what-ifs (``None``: as traced).
    """
    trace_dir = Path(trace_dir)
    fetch = pd.read_parquet(trace_dir / "fetch.parquet")
    train = pd.read_parquet(trace_dir / "train.parquet")
    traced_workers, traced_prefetch, _ = loader_settings(trace_dir, fetch)
    arrays = pipeline_arrays(fetch, train)
    result = _reference().reference_pipeline(
        **arrays,
        policy=tuple(policy),
        workers=traced_workers,
        prefetch=traced_prefetch,
        new_workers=workers,
        new_prefetch=prefetch,
    )
    return run_metrics(
        np.asarray(arrays["epoch"]),
        np.asarray(arrays["iteration"]),
        np.asarray(result.iteration_s),
        np.asarray(result.stall_s),
        np.asarray(result.delay_s),
    )
