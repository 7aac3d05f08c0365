"""``--mlflow`` (docs/SPEC.md §7.5): the real CLI logs into a real local MLflow store, read
back with the MLflow client. MLflow's telemetry is off in every test (no network)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, run_dsim

from dsim.config import MlflowSettings, Overrides, _mlflow, _Problems
from dsim.errors import UsageError


def require_mlflow():
    """mlflow, or a skip when it is not installed. Installed but broken (an import error
    inside it, as with mlflow 3.9 beside polars < 0.20.31) fails: never a silent skip."""
    if importlib.util.find_spec("mlflow") is None:
        pytest.skip("needs the mlflow extra (pip install .[mlflow])")
    return importlib.import_module("mlflow")


SAMPLE = "cpuDDP_synthetic_none_mlp_epoch2_b128_worker2_thread0"
NO_NETWORK = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
POLICIES = sorted(f"{f}/{s}" for f in ("actual", "avg", "min") for s in ("actual", "avg", "min"))


def _clean_env(**extra: str) -> dict[str, str]:
    """Telemetry off; no tracking URI or experiment inherited from the developer's shell."""
    return {**NO_NETWORK, "MLFLOW_TRACKING_URI": "", "MLFLOW_EXPERIMENT_NAME": "", **extra}


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped sample, parsed once: a clean clone after README's `dsim parse` step."""
    root = tmp_path_factory.mktemp("sample")
    shutil.copytree(REPO / "traces" / "raw", root / "traces" / "raw")
    proc = run_dsim("parse", "traces/raw", "--out", "traces", "-q", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture
def clone(parsed: Path, tmp_path: Path) -> Path:
    shutil.copytree(parsed / "traces", tmp_path / "traces")
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return tmp_path


def _client(uri: str):
    mlflow = require_mlflow()
    return mlflow.tracking.MlflowClient(tracking_uri=uri)


def _runs(uri: str) -> tuple[list, list, object]:
    client = _client(uri)
    experiment = client.get_experiment_by_name("dsim")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children, client


def test_run_and_report_log_metrics_params_and_artifacts(clone: Path) -> None:
    require_mlflow()
    proc = run_dsim(
        "run", "--conf", "configs/sim_conf.json", "--mlflow", cwd=clone, env=_clean_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert "MLflow: 1 run logged (1 new, 0 updated)" in proc.stderr
    uri = f"sqlite:///{clone / 'mlruns' / 'mlflow.db'}"
    assert (clone / "mlruns" / "mlflow.db").is_file()

    parents, children, client = _runs(uri)
    assert len(parents) == 1 and len(children) == 9
    parent = parents[0]
    assert parent.data.tags["dsim.run"] == SAMPLE
    assert parent.data.tags["dsim.model"] == "mlp"
    assert parent.data.tags["dsim.replay_model"] == "per-iteration"
    assert parent.info.status == "FINISHED"
    params = parent.data.params
    assert params["run"] == SAMPLE
    assert params["warmup"] == "10" and params["threshold_s"] == "0.03"
    assert params["selected_epochs"] == "1" and params["replay_model"] == "per-iteration"
    assert params["gpus"] == "4" and params["batch_size"] == "128"
    assert params["replay.stall_grow_min_s"] == "0.01"

    summary = pd.read_csv(clone / "results" / "summary.csv")
    by_policy = {f"{r.fetch_align}/{r.start_align}": r for r in summary.itertuples()}
    assert sorted(c.data.tags["dsim.policy"] for c in children) == POLICIES
    for child in children:
        row = by_policy[child.data.tags["dsim.policy"]]
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["dsim.run"] == SAMPLE
        assert child.data.params["fetch_align"] == row.fetch_align
        for column in (
            "iteration_s_mean",
            "stall_s_mean",
            "effective_delay_pct",
            "speedup",
            "throughput_job_samples_s",
        ):
            assert child.data.metrics[column] == pytest.approx(getattr(row, column), rel=1e-12)
    best = summary.loc[summary["speedup"].idxmax()]
    assert parent.data.metrics["best_speedup"] == pytest.approx(best["speedup"], rel=1e-12)
    assert parent.data.tags["dsim.best_policy"] == f"{best['fetch_align']}/{best['start_align']}"

    names = sorted(a.path for a in client.list_artifacts(parent.info.run_id))
    assert names == ["summary.csv", "summary.parquet"]
    local = Path(client.download_artifacts(parent.info.run_id, "summary.csv", str(clone)))
    logged = pd.read_csv(local)
    pd.testing.assert_frame_equal(
        logged[["fetch_align", "start_align", "iteration_s_mean"]],
        summary[["fetch_align", "start_align", "iteration_s_mean"]],
    )

    # The same run again updates the MLflow run; the report joins it with its HTML.
    again = run_dsim(
        "run", "--conf", "configs/sim_conf.json", "--mlflow", cwd=clone, env=_clean_env()
    )
    assert again.returncode == 0, again.stderr
    assert "(0 new, 1 updated)" in again.stderr
    report = run_dsim(
        "report", "results", "--out", "report.html", "--mlflow", cwd=clone, env=_clean_env()
    )
    assert report.returncode == 0, report.stderr
    parents2, children2, client = _runs(uri)
    assert [p.info.run_id for p in parents2] == [parent.info.run_id]
    assert len(children2) == 9
    names = sorted(a.path for a in client.list_artifacts(parent.info.run_id))
    assert names == ["report.html", "summary.csv", "summary.parquet"]

    # Another threshold is another param value: a new MLflow run, not a changed one.
    other = run_dsim(
        "run", "--conf", "configs/sim_conf.json", "--mlflow", "--threshold", "0.05",
        cwd=clone, env=_clean_env(),
    )  # fmt: skip
    assert other.returncode == 0, other.stderr
    parents3, children3, _ = _runs(uri)
    assert len(parents3) == 2 and len(children3) == 18
    assert sorted(p.data.params["threshold_s"] for p in parents3) == ["0.03", "0.05"]


def test_tracking_uri_from_the_environment_and_the_config(clone: Path) -> None:
    require_mlflow()
    elsewhere = clone / "elsewhere.db"
    proc = run_dsim(
        "run", "--conf", "configs/sim_conf.json", "--mlflow", "-q",
        cwd=clone, env=_clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{elsewhere}"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # -q: nothing, not even MLflow's migration chatter
    assert elsewhere.is_file() and not (clone / "mlruns" / "mlflow.db").exists()
    assert len(_runs(f"sqlite:///{elsewhere}")[0]) == 1

    conf = json.loads((clone / "configs" / "sim_conf.json").read_text("utf-8"))
    configured = clone / "configured.db"
    conf["mlflow"] = {"tracking_uri": f"sqlite:///{configured}", "experiment": "stalls"}
    (clone / "configs" / "tracked.json").write_text(json.dumps(conf), "utf-8")
    proc = run_dsim("run", "--conf", "configs/tracked.json", cwd=clone, env=_clean_env())
    assert proc.returncode == 0, proc.stderr
    assert "experiment 'stalls'" in proc.stderr
    client = _client(f"sqlite:///{configured}")
    assert client.get_experiment_by_name("stalls") is not None
    off = run_dsim(
        "run", "--conf", "configs/tracked.json", "--no-mlflow", "-q", "--force",
        cwd=clone, env=_clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{clone / 'never.db'}"),
    )  # fmt: skip
    assert off.returncode == 0, off.stderr
    assert not (clone / "never.db").exists()


def test_missing_mlflow_is_a_clear_usage_error_before_any_work(clone: Path) -> None:
    """With mlflow not importable, `--mlflow` exits 2 naming the extra and writes nothing."""
    code = (
        "import sys, runpy; sys.modules['mlflow'] = None; "
        "sys.argv = ['dsim', 'run', '--conf', 'configs/sim_conf.json', '--mlflow']; "
        "runpy.run_module('dsim', run_name='__main__')"
    )
    import os
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=clone,
        env={**os.environ, **_clean_env()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        "pip install 'mlflow>=3.9' (in a clone of dsim: pip install -e '.[mlflow]')" in proc.stderr
    )
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (clone / "results").exists() and not (clone / "mlruns").exists()


def test_unreachable_store_is_an_output_error(clone: Path) -> None:
    require_mlflow()
    (clone / "blocker").write_text("a file where a directory should be", "utf-8")
    proc = run_dsim(
        "run", "--conf", "configs/sim_conf.json", "--mlflow", "-q",
        cwd=clone, env=_clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{clone / 'blocker' / 'x.db'}"),
    )  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.startswith("dsim: error: cannot log to MLflow at sqlite:///")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("raw", "override", "expected"),
    [
        ({}, None, None),
        ({"mlflow": True}, None, MlflowSettings()),
        ({"mlflow": True}, False, None),
        ({}, True, MlflowSettings()),
        ({"mlflow": {"experiment": "x"}}, None, MlflowSettings(experiment="x")),
        ({"mlflow": {"tracking_uri": "sqlite:///a.db"}}, True, MlflowSettings("sqlite:///a.db")),
    ],
)
def test_mlflow_setting(raw: dict, override: bool | None, expected: MlflowSettings | None) -> None:
    problems = _Problems()
    assert _mlflow(Overrides(mlflow=override), raw, problems) == expected
    assert problems.items == []


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("yes", "mlflow must be true, false or an object"),
        ({"uri": "x"}, "mlflow: unknown key 'uri'"),
        ({"experiment": ""}, "mlflow.experiment must be a non-empty string"),
    ],
)
def test_bad_mlflow_setting_is_reported(value: object, says: str) -> None:
    problems = _Problems()
    _mlflow(Overrides(), {"mlflow": value}, problems)
    with pytest.raises(UsageError, match="1 problem"):
        problems.raise_if_any("invalid config")
    assert says in problems.items[0]


def test_default_store_is_a_sqlite_database_under_mlruns(tmp_path: Path, monkeypatch) -> None:
    from dsim.app.tracking import tracking_target

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri, artifacts = tracking_target(MlflowSettings())
    assert uri == f"sqlite:///{tmp_path.resolve() / 'mlruns' / 'mlflow.db'}"
    assert artifacts == tmp_path.resolve() / "mlruns" / "artifacts"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    assert tracking_target(MlflowSettings()) == ("sqlite:///env.db", None)
    assert tracking_target(MlflowSettings("sqlite:///conf.db")) == ("sqlite:///conf.db", None)


def test_telemetry_is_off_unless_the_user_says_otherwise(monkeypatch) -> None:
    require_mlflow()
    from dsim.app import tracking

    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    tracking._import_mlflow()
    assert tracking.os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "false")
    tracking._import_mlflow()
    assert tracking.os.environ["MLFLOW_DISABLE_TELEMETRY"] == "false"


# -- issue #20: every MLflow failure is one line (these run without mlflow: a fake module) ---


def test_a_malformed_tracking_uri_is_a_usage_error_before_any_work(clone: Path) -> None:
    """A URI no store can come from was an internal ValueError deep in MLflow; now exit 2
    before any replay, whether or not mlflow is installed."""
    proc = run_dsim(
        "run", "--conf", "configs/sim_conf.json", "--mlflow", "-q",
        cwd=clone, env=_clean_env(MLFLOW_TRACKING_URI="http://[::1:5000/"),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("dsim: error: invalid MLflow tracking URI 'http://[::1:5000/'")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (clone / "results").exists()


@pytest.mark.parametrize("uri", ["http://host:port/", "http://h:99999", "sqlite:///a\nb.db"])
def test_tracking_uri_check(uri: str) -> None:
    from dsim.app.tracking import check_tracking_uri

    with pytest.raises(UsageError, match="invalid MLflow tracking URI"):
        check_tracking_uri(uri)
    for good in ("sqlite:///mlruns/mlflow.db", "http://127.0.0.1:5000", "databricks", "./runs"):
        check_tracking_uri(good)


def _fake_mlflow(monkeypatch, error: Exception) -> None:
    """An ``mlflow`` whose client fails as a store does: it logs a traceback (as MLflow's
    SQLAlchemy store does for a read-only database), then raises ``error``."""
    import importlib.machinery
    import logging
    import types

    fake = types.ModuleType("mlflow")
    fake.__spec__ = importlib.machinery.ModuleSpec("mlflow", None)
    fake.exceptions = types.SimpleNamespace(
        MlflowException=type("MlflowException", (Exception,), {})
    )
    fake.entities = types.SimpleNamespace(Metric=object, Param=object, RunTag=object)

    class MlflowClient:
        def __init__(self, tracking_uri: str) -> None:
            self.uri = tracking_uri

        def get_experiment_by_name(self, name: str) -> None:
            try:
                raise error
            except Exception:
                logging.getLogger("mlflow.store.db.utils").exception("store failed")
                raise

    fake.tracking = types.SimpleNamespace(MlflowClient=MlflowClient)
    for name, module in {"mlflow": fake, "mlflow.entities": fake.entities}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", fake.tracking)


def test_a_store_error_is_one_output_error_without_mlflows_traceback(
    monkeypatch, capsys, tmp_path: Path
) -> None:
    """A read-only SQLite store: SQLAlchemy's OperationalError (not an MlflowException) and a
    traceback logged by MLflow (92 lines on stderr). Now: OutputError (exit 4), stderr quiet."""
    from dsim.app import tracking
    from dsim.errors import OutputError

    readonly = type("OperationalError", (Exception,), {"__module__": "sqlalchemy.exc"})
    _fake_mlflow(monkeypatch, readonly("attempt to write a readonly database"))
    monkeypatch.delenv("DSIM_DEBUG", raising=False)
    from dsim.app.answer import build_answer

    answer = build_answer(pd.DataFrame({"results": pd.Series([], dtype=str)}), {})
    settings = MlflowSettings(f"sqlite:///{tmp_path / 'ro.db'}")
    with pytest.raises(OutputError, match="OperationalError: attempt to write a readonly"):
        tracking.track_answer(answer, settings)
    assert capsys.readouterr().err == ""

    _fake_mlflow(monkeypatch, KeyError("a bug of dsim's own is not a store error"))
    with pytest.raises(KeyError):
        tracking.track_answer(answer, settings)


def test_http_requests_are_bounded_unless_the_user_says_otherwise(monkeypatch) -> None:
    """An unreachable server took 248 s (7 retries, doubling backoff): dsim's defaults bound
    it; a value the user set is kept."""
    from dsim.app import tracking

    _fake_mlflow(monkeypatch, RuntimeError("unused"))
    for name in tracking.HTTP_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
    tracking._import_mlflow()
    assert tracking.os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    assert tracking.os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "1"
    assert tracking.os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "60"


def test_an_unreachable_server_fails_in_bounded_time(clone: Path) -> None:
    """With the real mlflow: nothing listens on the port; one line, exit 4, in seconds."""
    import time

    require_mlflow()
    began = time.monotonic()
    proc = run_dsim(
        "run", "--conf", "configs/sim_conf.json", "--mlflow", "-q",
        cwd=clone, env=_clean_env(MLFLOW_TRACKING_URI="http://127.0.0.1:9"),
    )  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.startswith("dsim: error: cannot log to MLflow at http://127.0.0.1:9")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert time.monotonic() - began < 60


def test_a_read_only_store_is_exit_4_without_a_traceback(clone: Path) -> None:
    """With the real mlflow: a SQLite store whose file and directory are read-only."""
    import os

    require_mlflow()
    if os.geteuid() == 0:
        pytest.skip("root writes read-only files")
    store = clone / "store"
    store.mkdir()
    first = run_dsim(
        "run", "--conf", "configs/sim_conf.json", "--mlflow", "-q",
        cwd=clone, env=_clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{store / 'm.db'}"),
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    (store / "m.db").chmod(0o444)
    store.chmod(0o555)
    try:
        proc = run_dsim(
            "run", "--conf", "configs/sim_conf.json", "--mlflow", "-q", "--force",
            cwd=clone, env=_clean_env(MLFLOW_TRACKING_URI=f"sqlite:///{store / 'm.db'}"),
        )  # fmt: skip
    finally:
        store.chmod(0o755)
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
