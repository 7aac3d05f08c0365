"""MLflow tracking of an answer (``--mlflow``; docs/SPEC.md §7.5): the store's side.

What is logged is the answer's, rendered by ``dsim.render.mlflow`` (one MLflow
run per dsim run, i.e. per results directory ``<out>/<run>[@variant]``, with
its settings as params, its verdict, best policy and attribution lines as
tags and its rows as artifacts; one nested run per policy with that policy's
numbers as metrics; and, with ``dsim report --mlflow``, the HTML report).
This module writes it into a store: it finds each run again by its tag
``dsim.key`` (the same thing run again updates its MLflow run instead of
adding one) and turns a store that cannot be used into one line.

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

import importlib.util
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsim.config import MlflowSettings
from dsim.errors import OutputError, UsageError
from dsim.render.files import write_summary_files
from dsim.render.mlflow import KEY_TAG, PARENT_TAG, POLICY_TAG, RUN_NAME_TAG, answer_runs
from dsim.words import counted

if TYPE_CHECKING:
    from dsim.app.answer import Answer
    from dsim.render.mlflow import MlflowRun

DEFAULT_DIRECTORY = Path("mlruns")
DEFAULT_EXPERIMENT = "dsim"
URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
#: dsim is installed from a clone, not from an index: "dsim[mlflow]" would fetch
#: nothing (or someone else's package); the extra's one requirement works anywhere.
INSTALL_HINT = "pip install 'mlflow>=3.9' (in a clone of dsim: pip install -e '.[mlflow]')"

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


def track_answer(
    answer: Answer,
    settings: MlflowSettings,
    *,
    artifacts: Sequence[Path] = (),
    command: str = "run",
) -> TrackingOutcome:
    """Log every run of ``answer`` (``dsim.render.mlflow.answer_runs``) into the store.

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
    records = answer_runs(answer, command=command)
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
            for record in records:
                outcome.runs.append(
                    _track_run(client, experiment_id, record, artifacts, (Metric, Param, RunTag))
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
    record: MlflowRun,
    artifacts: Sequence[Path],
    entities: tuple[Any, Any, Any],
) -> Tracked:
    """One dsim run into the store: created, or found by its key and updated."""
    Metric, Param, RunTag = entities
    found = _find(client, experiment_id, f"tags.`{KEY_TAG}` = '{record.key}'")
    parents = [r for r in found if PARENT_TAG not in r.data.tags]
    created = not parents
    if created:
        parent = client.create_run(experiment_id, tags={RUN_NAME_TAG: record.name, **record.tags})
        run_id = parent.info.run_id
        client.log_batch(run_id, params=[Param(k, v) for k, v in record.params.items()])
    else:
        run_id = parents[0].info.run_id
    now = _now_ms()
    client.log_batch(
        run_id,
        metrics=[Metric(k, v, now, 0) for k, v in record.metrics.items()],
        tags=[RunTag(k, v) for k, v in record.tags.items()],
    )
    children = {
        r.data.tags.get(POLICY_TAG): r.info.run_id
        for r in _find(client, experiment_id, f"tags.`{PARENT_TAG}` = '{run_id}'")
    }
    for policy in record.policies:
        child_id = children.get(policy.label)
        if child_id is None:
            child = client.create_run(
                experiment_id,
                tags={RUN_NAME_TAG: policy.label, PARENT_TAG: run_id, **policy.tags},
            )
            child_id = child.info.run_id
            client.log_batch(child_id, params=[Param(k, v) for k, v in policy.params.items()])
            client.set_terminated(child_id, "FINISHED")
        client.log_batch(
            child_id,
            metrics=[Metric(k, v, now, 0) for k, v in policy.metrics.items()],
            tags=[RunTag(k, v) for k, v in policy.tags.items()],
        )
    with tempfile.TemporaryDirectory(prefix="dsim-mlflow-") as tmp:
        for path in write_summary_files(record.rows, tmp, ["csv", "parquet"], "summary"):
            client.log_artifact(run_id, str(path))
    for path in artifacts:
        client.log_artifact(run_id, str(path))
    if created:
        client.set_terminated(run_id, "FINISHED")
    return Tracked(record.name, run_id, created, len(record.policies))


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
