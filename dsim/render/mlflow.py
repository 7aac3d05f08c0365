"""What an ``Answer`` logs to MLflow (``--mlflow``; docs/SPEC.md §7.5), computed without MLflow.

The MLflow output is a renderer of the answer like the terminal, ``--json``,
the summary files and the HTML report: ``answer_runs(answer)`` turns each run
of the answer into the params, tags and metrics of one MLflow run and its
nested policy runs, taking the best policy, verdict and attribution lines from
the answer (the tie rule of docs/SPEC.md §5.1, not a best of its own). Writing
them into a store is ``dsim.app.tracking``'s job, the only module that
imports mlflow; this one is pure, so it is tested without MLflow installed.

A run is found again in the store by its tag ``dsim.key``: the replay cache's
ingredients (results format, model, trace fingerprint, model parameters;
docs/SPEC.md §7.2) plus every param logged, so running the same thing again
updates its MLflow run, and a change of any param (which MLflow keeps
immutable) makes a new one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsim import __version__
from dsim.analysis.summary import STAT_COLUMNS, WHAT_IF_COLUMNS
from dsim.model.resultinfo import KEY_FORMAT_VERSION
from dsim.model.runname import RUN_NAME_FIELDS
from dsim.render.machine import answer_table

if TYPE_CHECKING:
    import pandas as pd

    from dsim.app.answer import Answer, RunAnswer

#: Tags (filter in the MLflow UI with e.g. tags.`dsim.run` = 'myrun').
KEY_TAG = "dsim.key"
RUN_TAG = "dsim.run"
MODEL_TAG = "dsim.model"  # the network the run name gives, as the summary's `model`
REPLAY_MODEL_TAG = "dsim.replay_model"
POLICY_TAG = "dsim.policy"
BEST_TAG = "dsim.best_policy"
VERDICT_TAG = "dsim.verdict_text"
HEADLINE_TAG = "dsim.headline_text"
ATTRIBUTION_TAG = "dsim.attribution_lines"
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
#: MLflow keeps tag values up to 5000 characters in every release dsim supports.
TAG_MAX_CHARS = 5000
#: Columns logged as metrics per policy (numbers only; NaN ones are left out).
METRIC_COLUMNS = [
    *STAT_COLUMNS,
    *WHAT_IF_COLUMNS,
    "batch_size_rank",
    "throughput_rank_samples_s",
    "throughput_job_samples_s",
    "throughput_gain_samples_s",
    "scaling_efficiency",
]
#: Summary columns logged as params of a dsim run (None ones are left out).
PARAM_COLUMNS = [
    "run",
    *RUN_NAME_FIELDS,
    "gpus",
    "replay_model",
    "loader_workers",
    "loader_prefetch_factor",
    "loader_changed",
    "selected_epochs",
    "warmup",
    "threshold_s",
]
#: Measured means of the run logged as metrics of the dsim run (``measured_<column>``).
MEASURED_COLUMNS = ("iteration_s_mean", "stall_s_mean", "delay_s_mean", "effective_delay_pct")


@dataclass(frozen=True)
class PolicyRun:
    """One nested MLflow run: a policy of a dsim run."""

    label: str  # ``fetch/start``
    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]


@dataclass(frozen=True)
class MlflowRun:
    """One MLflow run: a dsim run (a results run directory), its policies nested in it."""

    directory: str  # the results run directory (the summary's ``results``)
    name: str  # ``mlflow.runName``: the directory's name
    key: str  # ``dsim.key``
    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]
    policies: tuple[PolicyRun, ...]
    rows: pd.DataFrame  # its rows of the answer's summary table (artifacts summary.csv/.parquet)


def _param_value(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value)
    return text if text not in ("", "nan", "None", "<NA>") else None


def run_params(info: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, str]:
    """The params of one dsim run: its summary row's settings, the model's parameters
    and the measured loader settings (``result.json``)."""
    params: dict[str, str] = {}
    for column in PARAM_COLUMNS:
        value = _param_value(row.get(column))
        if value is not None:
            params[column] = value
    params["run"] = str(info.get("run", params.get("run", "")))
    for name, value in sorted((info.get("params") or {}).items()):
        text = _param_value(value)
        if text is not None:
            params[f"replay.{name}"] = text
    measured = ((info.get("loader") or {}).get("measured")) or {}
    for name, value in sorted(measured.items()):
        text = _param_value(value)
        if text is not None:
            params[f"loader_measured.{name}"] = text
    logged = ((info.get("trace") or {}).get("loader")) or {}
    for name in (
        "num_workers",
        "prefetch_factor",
        "batch_size",
        "persistent_workers",
        "pin_memory",
    ):
        text = _param_value(logged.get(name))
        if text is not None:
            params[f"loader_log.{name}"] = text
    return params


def tracking_key(info: Mapping[str, Any], params: Mapping[str, str]) -> str:
    """sha256 of the replay cache's ingredients (docs/SPEC.md §7.2, less the policy) and the
    params: equal for a re-run of the same thing, different when MLflow would refuse a param."""
    document = {
        "format_version": KEY_FORMAT_VERSION,
        "model": info.get("model", "per-iteration"),
        "trace": info.get("input"),
        "params": info.get("params"),
        "logged": dict(params),
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def policy_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """A summary row's numbers as MLflow metrics (finite ones only)."""
    out: dict[str, float] = {}
    for column in METRIC_COLUMNS:
        number = _number(row.get(column))
        if number is not None:
            out[str(column)] = number
    return out


def _policy(row: Mapping[str, Any]) -> tuple[str, str]:
    return (str(row["fetch_align"]), str(row["start_align"]))


def run_metrics(run: RunAnswer) -> dict[str, float]:
    """A dsim run's own metrics: the speed-up of the answer's best policy (``best_speedup``)
    and the measured means (``measured_<column>``)."""
    from dsim.replay.policies import BASELINE

    metrics: dict[str, float] = {}
    best = next((r for r in run.rows if _policy(r) == run.best), None)
    speedup = None if best is None else _number(best.get("speedup"))
    if speedup is not None:
        metrics["best_speedup"] = speedup
    measured = next((r for r in run.rows if _policy(r) == BASELINE), None)
    for column in MEASURED_COLUMNS if measured is not None else ():
        number = _number(measured.get(column))  # type: ignore[union-attr]
        if number is not None:
            metrics[f"measured_{column}"] = number
    return metrics


def _tag_text(lines: list[str]) -> str:
    text = "\n".join(lines)
    return text if len(text) <= TAG_MAX_CHARS else text[: TAG_MAX_CHARS - 1] + "…"


def answer_runs(answer: Answer, *, command: str = "run") -> list[MlflowRun]:
    """Each run of ``answer`` as the MLflow run that logs it (see the module docstring).

    ``command`` (``run`` or ``report``) is tagged as ``dsim.command``: the last to log.
    The params come from the summary rows and each run's ``result.json`` (the answer's
    ``result_runs``)."""
    infos = {str(r.directory): r.info.document() for r in answer.result_runs}
    table = answer_table(answer)
    out: list[MlflowRun] = []
    for run in answer.runs:
        info = infos.get(run.results) or {}
        first = run.rows[0]
        params = run_params(info, first)
        key = tracking_key(info, params)
        name = Path(run.results).name
        common = {
            RUN_TAG: params["run"],
            MODEL_TAG: params.get("model", ""),
            REPLAY_MODEL_TAG: params.get("replay_model", ""),
        }
        tags = {
            KEY_TAG: key,
            **common,
            "dsim.directory": name,
            "dsim.command": command,
            "dsim.version": __version__,
            "dsim.policies": ",".join("/".join(_policy(r)) for r in run.rows),
        }
        if run.best is not None:
            tags[BEST_TAG] = "/".join(run.best)
        if run.verdict is not None:
            tags[VERDICT_TAG] = _tag_text([run.verdict.text])
        if run.headline is not None:
            tags[HEADLINE_TAG] = _tag_text([run.headline.text])
        if run.attribution:
            tags[ATTRIBUTION_TAG] = _tag_text(list(run.attribution))
        replay_keys = info.get("policies") or {}
        policies = tuple(
            PolicyRun(
                label="/".join(_policy(row)),
                params={
                    "policy": "/".join(_policy(row)),
                    "fetch_align": _policy(row)[0],
                    "start_align": _policy(row)[1],
                },
                tags={
                    **common,
                    POLICY_TAG: "/".join(_policy(row)),
                    "dsim.fetch_align": _policy(row)[0],
                    "dsim.start_align": _policy(row)[1],
                    "dsim.replay_key": str(replay_keys.get("__".join(_policy(row)), "")),
                },
                metrics=policy_metrics(row),
            )
            for row in run.rows
        )
        rows = table[
            (table["run"].astype(str) == run.run) & (table["results"].astype(str) == run.results)
        ].reset_index(drop=True)
        out.append(
            MlflowRun(run.results, name, key, params, tags, run_metrics(run), policies, rows)
        )
    return out
