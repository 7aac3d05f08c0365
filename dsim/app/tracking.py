"""MLflow tracking of summaries and reports (``--mlflow``; docs/SPEC.md §7.5).

One MLflow run per dsim run (a results directory ``<out>/<run>[@variant]``)
holds the settings as params, the summary of its rows as artifacts and, with
``dsim report --mlflow``, the HTML report; one nested run per policy holds
that policy's summary numbers as metrics. Runs are found again by the tag
``dsim.key``: the replay cache's ingredients (results format, model, trace
fingerprint, model parameters; docs/SPEC.md §7.2) plus every param logged, so
running the same thing again updates its MLflow run instead of adding one,
and a change of any param (which MLflow keeps immutable) makes a new one.

The store: ``mlflow.tracking_uri`` of the config, else ``MLFLOW_TRACKING_URI``,
else a SQLite database ``./mlruns/mlflow.db`` with artifacts under
``./mlruns/artifacts`` — local, no server. (MLflow deprecated its plain file
store ``./mlruns`` in 2026 and newer releases refuse it by default; SQLite is
its documented replacement and works with every release dsim supports.)

mlflow is an optional extra (``pip install -e '.[mlflow]'`` in a clone), imported only
here and only when asked for; dsim turns MLflow's telemetry off unless
``MLFLOW_DISABLE_TELEMETRY`` is set, so logging to a local store never
touches the network.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dsim import __version__
from dsim.config import MlflowSettings
from dsim.errors import OutputError, UsageError
from dsim.model.results import RESULTS_FORMAT_VERSION, find_result_runs
from dsim.model.runname import RUN_NAME_FIELDS
from dsim.render.files import write_summary_files
from dsim.replay.policies import BASELINE
from dsim.summary import STAT_COLUMNS, WHAT_IF_COLUMNS
from dsim.words import counted

DEFAULT_DIRECTORY = Path("mlruns")
DEFAULT_EXPERIMENT = "dsim"
URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
#: dsim is installed from a clone, not from an index: "dsim[mlflow]" would fetch
#: nothing (or someone else's package); the extra's one requirement works anywhere.
INSTALL_HINT = "pip install 'mlflow>=3.9' (in a clone of dsim: pip install -e '.[mlflow]')"

#: Tags (filter in the MLflow UI with e.g. tags.`dsim.run` = 'myrun').
KEY_TAG = "dsim.key"
RUN_TAG = "dsim.run"
MODEL_TAG = "dsim.model"  # the network the run name gives, as the summary's `model`
REPLAY_MODEL_TAG = "dsim.replay_model"
POLICY_TAG = "dsim.policy"
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
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


#: MLflow's HTTP client retries 7 times with a doubling backoff by default: an unreachable
#: server took 248 s to fail. dsim's defaults (set when the variable is unset) bound one
#: request to (1 + 2 retries) × 15 s + 1 + 2 s of backoff; a refused connection fails in ~3 s.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}
#: Libraries under MLflow whose errors mean "the store cannot be used", not a bug in dsim.
_STORE_ERROR_MODULES = ("mlflow", "sqlalchemy", "alembic", "requests", "urllib3", "sqlite3")


def require_mlflow(settings: MlflowSettings | None = None) -> None:
    """Fail before any work when ``--mlflow`` is asked for and mlflow is not installed, or
    the tracking URI (``settings``, else ``MLFLOW_TRACKING_URI``) cannot be a URI."""
    if settings is not None:
        check_tracking_uri(tracking_target(settings)[0])
    if importlib.util.find_spec("mlflow") is None:
        raise UsageError(
            f"--mlflow needs the mlflow package, which is not installed: {INSTALL_HINT}"
        )


def check_tracking_uri(uri: str) -> None:
    """A ``UsageError`` for a tracking URI no store could be opened from (a malformed one was
    an internal ``ValueError`` deep in MLflow). The scheme itself is MLflow's to judge."""
    from urllib.parse import urlsplit

    problem = None
    if any(ord(c) < 32 or ord(c) == 127 for c in uri):
        problem = "it holds a control character"
    else:
        try:
            parts = urlsplit(uri)
            parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
        except ValueError as exc:
            problem = str(exc)
    if problem is not None:
        raise UsageError(f"invalid MLflow tracking URI {uri!r}: {problem}")


@dataclass
class Tracked:
    """One dsim run as logged: its results directory, MLflow run id, and whether it is new."""

    directory: str
    run_id: str
    created: bool
    policies: int


@dataclass
class TrackingOutcome:
    uri: str
    experiment: str
    runs: list[Tracked] = field(default_factory=list)

    def text(self) -> str:
        new = sum(r.created for r in self.runs)
        return (
            f"MLflow: {counted(len(self.runs), 'run')} logged ({new} new, "
            f"{len(self.runs) - new} updated) "
            f"to experiment {self.experiment!r} at {self.uri}"
        )


def tracking_target(settings: MlflowSettings) -> tuple[str, Path | None]:
    """The tracking URI and, for dsim's default store, the artifact directory of the
    experiments dsim creates there."""
    uri = settings.tracking_uri or os.environ.get(URI_ENV) or ""
    if uri:
        return uri, None
    directory = (Path.cwd() / DEFAULT_DIRECTORY).resolve()
    return f"sqlite:///{directory / 'mlflow.db'}", directory / "artifacts"


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
        "format_version": RESULTS_FORMAT_VERSION,
        "model": info.get("model", "per-iteration"),
        "trace": info.get("input"),
        "params": info.get("params"),
        "logged": dict(params),
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def policy_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """A summary row's numbers as MLflow metrics (finite ones only)."""
    out: dict[str, float] = {}
    for column in METRIC_COLUMNS:
        value = row.get(column)
        if isinstance(value, bool) or value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[str(column)] = number
    return out


def _is_baseline(row: Mapping[str, Any]) -> bool:
    return (row["fetch_align"], row["start_align"]) == BASELINE


def run_metrics(rows: pd.DataFrame) -> tuple[dict[str, float], str | None]:
    """A dsim run's own metrics: its best speed-up and the measured means; and the best policy."""
    metrics: dict[str, float] = {}
    best: str | None = None
    speedups = rows["speedup"].astype("float64")
    if speedups.notna().any():
        from dsim.verdict import best_row  # the one tie rule (docs/SPEC.md §5.1)

        top = best_row(rows[speedups.notna()].to_dict("records"))
        metrics["best_speedup"] = float(top["speedup"])
        best = f"{top['fetch_align']}/{top['start_align']}"
    base = rows[[_is_baseline(r) for _, r in rows.iterrows()]]
    if len(base):
        measured = base.iloc[0]
        for column in ("iteration_s_mean", "stall_s_mean", "delay_s_mean", "effective_delay_pct"):
            value = float(measured[column])
            if math.isfinite(value):
                metrics[f"measured_{column}"] = value
    return metrics, best


@contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """MLflow and alembic announce migrations and experiments on stderr, and log whole
    tracebacks of a store that cannot be written (92 lines for a read-only SQLite file)
    before the error dsim reports in one line: keep them quiet, unless ``--debug``."""
    if os.environ.get("DSIM_DEBUG", "") not in ("", "0"):
        yield
        return
    loggers = [logging.getLogger(n) for n in ("mlflow", "alembic", "sqlalchemy", "urllib3")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _import_mlflow() -> Any:
    require_mlflow()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # never phone home by default
    for name, value in HTTP_DEFAULTS.items():  # an unreachable server fails in bounded time
        os.environ.setdefault(name, value)
    import mlflow

    return mlflow


def _is_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from MLflow or the libraries it talks to its store through:
    its type is theirs (SQLAlchemy's ``OperationalError``), or it was raised in their code
    (a ``ValueError`` of MLflow's URI parsing). One raised in dsim's own code is a bug."""
    if type(exc).__module__.split(".")[0] in _STORE_ERROR_MODULES:
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    raised_in = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return str(raised_in).split(".")[0] in _STORE_ERROR_MODULES


def track_summary(
    summary: pd.DataFrame,
    settings: MlflowSettings,
    *,
    artifacts: Sequence[Path] = (),
    command: str = "run",
) -> TrackingOutcome:
    """Log every dsim run of ``summary`` (rows grouped by their ``results`` directory).

    ``artifacts`` (e.g. the HTML report) are attached to every dsim run logged,
    beside ``summary.csv`` and ``summary.parquet`` of that run's own rows.
    Raises ``OutputError`` when the store cannot be written.
    """
    mlflow = _import_mlflow()
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    uri, artifact_root = tracking_target(settings)
    check_tracking_uri(uri)
    experiment_name = settings.experiment or os.environ.get(EXPERIMENT_ENV) or DEFAULT_EXPERIMENT
    outcome = TrackingOutcome(uri, experiment_name)
    directories = list(dict.fromkeys(str(d) for d in summary["results"]))
    infos = {
        str(r.directory): r.info.document()
        for r in find_result_runs([Path(d) for d in directories])
    }
    try:
        with _quiet_mlflow():
            if artifact_root is not None:  # SQLite creates the file, not its directory
                artifact_root.parent.mkdir(parents=True, exist_ok=True)
            client = MlflowClient(tracking_uri=uri)
            experiment = client.get_experiment_by_name(experiment_name)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else client.create_experiment(
                    experiment_name,
                    artifact_location=None if artifact_root is None else artifact_root.as_uri(),
                )
            )
            for directory in directories:
                rows = summary[summary["results"].astype(str) == directory]
                info = infos.get(directory) or {}
                outcome.runs.append(
                    _track_run(
                        client,
                        experiment_id,
                        rows,
                        info,
                        Path(directory).name,
                        artifacts,
                        command,
                        (Metric, Param, RunTag),
                    )
                )
    except mlflow.exceptions.MlflowException as exc:
        raise OutputError(f"cannot log to MLflow at {uri}: {_first_line(exc)}") from exc
    except OSError as exc:
        raise OutputError(f"cannot log to MLflow at {uri}: {exc}") from exc
    except Exception as exc:  # SQLAlchemy's OperationalError, a URI MLflow's parser refuses
        if not _is_store_error(exc):
            raise
        raise OutputError(
            f"cannot log to MLflow at {uri}: {type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    return outcome


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _find(client: Any, experiment_id: str, filter_string: str) -> list[Any]:
    return list(client.search_runs([experiment_id], filter_string=filter_string, max_results=1000))


def _track_run(
    client: Any,
    experiment_id: str,
    rows: pd.DataFrame,
    info: Mapping[str, Any],
    directory_name: str,
    artifacts: Sequence[Path],
    command: str,
    entities: tuple[Any, Any, Any],
) -> Tracked:
    Metric, Param, RunTag = entities
    first = rows.iloc[0]
    params = run_params(info, first)
    key = tracking_key(info, params)
    network = params.get("model", "")
    tags = {
        KEY_TAG: key,
        RUN_TAG: params["run"],
        MODEL_TAG: network,
        REPLAY_MODEL_TAG: params.get("replay_model", ""),
        "dsim.directory": directory_name,
        "dsim.command": command,
        "dsim.version": __version__,
        "dsim.policies": ",".join(
            f"{r['fetch_align']}/{r['start_align']}" for _, r in rows.iterrows()
        ),
    }
    found = _find(client, experiment_id, f"tags.`{KEY_TAG}` = '{key}'")
    parents = [r for r in found if PARENT_TAG not in r.data.tags]
    created = not parents
    if created:
        parent = client.create_run(experiment_id, tags={RUN_NAME_TAG: directory_name, **tags})
        run_id = parent.info.run_id
        client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
    else:
        run_id = parents[0].info.run_id
    now = _now_ms()
    metrics, best = run_metrics(rows)
    if best is not None:
        tags["dsim.best_policy"] = best
    client.log_batch(
        run_id,
        metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
    children = {
        r.data.tags.get(POLICY_TAG): r.info.run_id
        for r in _find(client, experiment_id, f"tags.`{PARENT_TAG}` = '{run_id}'")
    }
    replay_keys = info.get("policies") or {}
    for _, row in rows.iterrows():
        label = f"{row['fetch_align']}/{row['start_align']}"
        child_tags = {
            RUN_TAG: params["run"],
            MODEL_TAG: network,
            REPLAY_MODEL_TAG: params.get("replay_model", ""),
            POLICY_TAG: label,
            "dsim.fetch_align": str(row["fetch_align"]),
            "dsim.start_align": str(row["start_align"]),
            "dsim.replay_key": str(
                replay_keys.get(f"{row['fetch_align']}__{row['start_align']}", "")
            ),
        }
        child_id = children.get(label)
        if child_id is None:
            child = client.create_run(
                experiment_id, tags={RUN_NAME_TAG: label, PARENT_TAG: run_id, **child_tags}
            )
            child_id = child.info.run_id
            client.log_batch(
                child_id,
                params=[
                    Param("policy", label),
                    Param("fetch_align", str(row["fetch_align"])),
                    Param("start_align", str(row["start_align"])),
                ],
            )
            client.set_terminated(child_id, "FINISHED")
        client.log_batch(
            child_id,
            metrics=[Metric(k, v, now, 0) for k, v in policy_metrics(row).items()],
            tags=[RunTag(k, v) for k, v in child_tags.items()],
        )
    with tempfile.TemporaryDirectory(prefix="dsim-mlflow-") as tmp:
        for path in write_summary_files(
            rows.reset_index(drop=True), tmp, ["csv", "parquet"], "summary"
        ):
            client.log_artifact(run_id, str(path))
    for path in artifacts:
        client.log_artifact(run_id, str(path))
    if created:
        client.set_terminated(run_id, "FINISHED")
    return Tracked(directory_name, run_id, created, len(rows))


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
