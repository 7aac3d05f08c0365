"""The on-disk layout of replay results, written by ``dsim run`` and read by
``dsim summarize`` and ``dsim report``.

::

    <out>/
      summary.parquet, summary.csv        one row per run x policy (DESIGN.md §4)
      <run>/
        result.json                       run metadata, replay parameters, cache keys
        <fetch>__<start>.parquet          one row per replayed iteration

A per-iteration replay table has ``epoch``, ``iteration``, ``iteration_s``,
``stall_s``, ``delay_s``, ``fetch_diff_s``, ``start_diff_s`` and one
``stall_s_gpu<rank>`` column per GPU. It holds every complete iteration of
every epoch; epoch selection and warm-up are applied by the summary, so the
same replay serves any summary. Its Parquet schema metadata (key ``dsim``)
records the format version, run, policy and cache key, so a table is
self-describing even when moved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dsim.atomic import write_json, write_parquet
from dsim.errors import InputError, UsageError
from dsim.policies import Policy, parse_policy_label, policy_label

RESULTS_FORMAT_VERSION = 1
RESULT_FILE = "result.json"
SUMMARY_STEM = "summary"
METRIC_COLUMNS = ("iteration_s", "stall_s", "delay_s", "fetch_diff_s", "start_diff_s")


def gpu_stall_column(gpu: int) -> str:
    return f"stall_s_gpu{gpu}"


def replay_path(out: str | Path, run: str, policy: Policy) -> Path:
    return Path(out) / run / f"{policy_label(policy)}.parquet"


def replay_table(
    epoch: np.ndarray,
    iteration: np.ndarray,
    metrics: dict[str, np.ndarray],
    gpus: np.ndarray,
    gpu_stall: np.ndarray,
    *,
    run: str,
    policy: Policy,
    key: str,
) -> pa.Table:
    """Assemble a per-iteration replay table with its self-describing metadata."""
    columns: dict[str, Any] = {
        "epoch": pa.array(epoch, pa.int32()),
        "iteration": pa.array(iteration, pa.int32()),
    }
    for name in METRIC_COLUMNS:
        columns[name] = pa.array(metrics[name], pa.float64())
    for j, gpu in enumerate(gpus):
        columns[gpu_stall_column(int(gpu))] = pa.array(gpu_stall[:, j], pa.float64())
    meta = {
        "format_version": RESULTS_FORMAT_VERSION,
        "run": run,
        "fetch_align": policy[0],
        "start_align": policy[1],
        "key": key,
    }
    table = pa.table(columns)
    return table.replace_schema_metadata({"dsim": json.dumps(meta)})


def write_replay(table: pa.Table, out: str | Path) -> Path:
    meta = replay_metadata(table, Path("<memory>"))
    path = replay_path(out, meta["run"], (meta["fetch_align"], meta["start_align"]))
    write_parquet(table, path)
    return path


def replay_metadata(table_or_schema: pa.Table | pa.Schema, path: Path) -> dict[str, Any]:
    schema = table_or_schema if isinstance(table_or_schema, pa.Schema) else table_or_schema.schema
    raw = (schema.metadata or {}).get(b"dsim")
    if raw is None:
        raise InputError("not a dsim replay table (no dsim metadata)", path)
    meta = json.loads(raw)
    if meta.get("format_version") != RESULTS_FORMAT_VERSION:
        raise InputError(
            f"replay written by another dsim results format ({meta.get('format_version')}, "
            f"expected {RESULTS_FORMAT_VERSION}); re-run `dsim run --force`",
            path,
        )
    return meta


def read_replay_key(path: Path) -> str | None:
    """The cache key a finished replay was computed with, or ``None`` if unusable."""
    try:
        return replay_metadata(pq.read_schema(path), path).get("key")
    except (OSError, pa.ArrowException, InputError, ValueError):
        return None


@dataclass
class ResultRun:
    """One run's results directory: its ``result.json`` and its replay files by policy."""

    directory: Path
    info: dict[str, Any]
    replays: dict[Policy, Path] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.info.get("run", self.directory.name))

    def read(self, policy: Policy) -> pa.Table:
        path = self.replays[policy]
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"unreadable replay table: {exc}", path) from exc
        replay_metadata(table, path)
        return table


def write_result_info(info: dict[str, Any], out: str | Path, run: str) -> Path:
    path = Path(out) / run / RESULT_FILE
    write_json({"format_version": RESULTS_FORMAT_VERSION, **info, "run": run}, path)
    return path


def _load_result_run(directory: Path) -> ResultRun:
    path = directory / RESULT_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"unreadable result description: {exc}", path) from exc
    if not isinstance(info, dict) or info.get("format_version") != RESULTS_FORMAT_VERSION:
        raise InputError(
            f"results written by another dsim format (expected format_version "
            f"{RESULTS_FORMAT_VERSION}); re-run `dsim run --force`",
            path,
        )
    run = ResultRun(directory=directory, info=info)
    for replay in sorted(directory.glob("*__*.parquet")):
        try:
            run.replays[parse_policy_label(replay.stem)] = replay
        except UsageError:  # a stray file whose name is not a policy label
            continue
    return run


def find_result_runs(paths: list[str | Path]) -> list[ResultRun]:
    """Every run under the given results directories (or run directories), in name order.

    Raises ``InputError`` naming the path when one holds no results at all.
    """
    runs: dict[Path, ResultRun] = {}
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise InputError("no such file or directory", path)
        if (path / RESULT_FILE).is_file():
            candidates = [path]
        else:
            candidates = sorted(p.parent for p in path.glob(f"*/{RESULT_FILE}"))
        if not candidates:
            raise InputError(
                f"no dsim results here (no */{RESULT_FILE}; produce them with `dsim run`)", path
            )
        for directory in candidates:
            runs.setdefault(directory.resolve(), _load_result_run(directory))
    return sorted(runs.values(), key=lambda r: (r.name, str(r.directory)))
