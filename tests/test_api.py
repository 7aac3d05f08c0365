"""The Python API (``dsim.api``, re-exported by ``import dsim``): the README's
notebook example run verbatim, and the API agreeing with the CLI."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, run_dsim

import dsim
from dsim.errors import UsageError


def readme_example() -> str:
    """The ```python block of the README's "Python API" paragraph."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("**Python API.**") :]
    return re.search(r"```python\n(.*?)\n```", section, re.DOTALL).group(1)


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "traces" / "raw", tmp_path / "traces" / "raw")
    return tmp_path


def test_the_readme_example_runs_verbatim(sample: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", readme_example()],
        cwd=sample,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Aligning ") or proc.stdout.startswith("Loaders are")
    assert (sample / "results" / "summary.csv").is_file()


def test_api_and_cli_write_and_read_the_same_results(sample: Path) -> None:
    trace = dsim.parse(sample / "traces" / "raw", out=sample / "traces")
    assert trace.info.gpu_count == 4 and len(trace.fetch) > 0
    assert dsim.load_trace(trace.directory) == trace
    assert importlib.import_module("dsim.replay.policies")  # the package: no clash with dsim.run

    api = dsim.run(trace, policies=["avg/min"], out=sample / "api")
    proc = run_dsim("run", trace.name, "-p", "avg/min", "--out", "cli", "--json", cwd=sample)
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(proc.stdout)
    doc = api.to_json()
    for a, c in zip(doc["summary"], cli["summary"], strict=True):
        assert {k: v for k, v in a.items() if k != "results"} == {
            k: v for k, v in c.items() if k != "results"
        }
    assert doc["verdicts"][0]["text"] == cli["verdicts"][0]["text"]
    loaded = dsim.load_results(sample / "api")
    pd.testing.assert_frame_equal(loaded.summary, api.summary)
    on_disk = pd.read_parquet(sample / "api" / "dataset" / "gpus")
    pd.testing.assert_frame_equal(loaded.gpus(), on_disk)
    [check] = loaded.check("speedup@avg/min>1")
    assert check.run == trace.name and check.held == (check.value > 1)

    # dsim.compare and dsim.report are the commands' answers (compare: the --json record)
    compared = dsim.compare(sample / "api" / trace.name, sample / "cli" / trace.name)
    proc = run_dsim("compare", f"api/{trace.name}", f"cli/{trace.name}", "--json", cwd=sample)
    assert proc.returncode == 0, proc.stderr
    cli_record = json.loads(proc.stdout)
    assert {k: cli_record[k] for k in compared.record() if k != "warnings"} == {
        k: v for k, v in compared.record().items() if k != "warnings"
    }
    assert repr(compared).startswith(f"Comparison({trace.name} → {trace.name}: Iterations ")
    (sample / "page").mkdir()  # like the CLI, the API does not create a missing directory
    page = dsim.report(sample / "api", out=sample / "page" / "r.html", traces=sample / "traces")
    assert page == sample / "page" / "r.html" and page.read_text().startswith("<!DOCTYPE html>")


def test_calls_that_write_say_where_once(sample: Path, capsys) -> None:
    trace = dsim.parse(sample / "traces" / "raw", out=sample / "traces")
    results = dsim.run(trace, policies=["min/min"], out=sample / "res")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"dsim: wrote the parsed run {trace.name} to {(sample / 'traces' / trace.name).absolute()}",
        f"dsim: wrote the results of 1 run to {(sample / 'res').absolute()}",
    ]
    assert results.directories == [sample / "res"]
    dsim.run(trace, policies=["min/min"], out=sample / "res", quiet=True)
    assert capsys.readouterr().err == ""


def _summary(runs: int, policies: int) -> pd.DataFrame:
    rows = [
        {
            "run": f"run<{i}>",
            "fetch_align": f"p{j}",
            "start_align": "min",
            "gpus": 4,
            "iteration_s_mean": 0.5 + j / 100,
            "stall_s_mean": 0.1,
            "delay_s_mean": float("nan"),
            "effective_delay_pct": 12.5,
            "speedup": 1.25,
            "results": f"res/run<{i}>",
        }
        for i in range(runs)
        for j in range(policies)
    ]
    return pd.DataFrame(rows)


def test_results_repr_is_one_line_and_html_small_and_escaped() -> None:
    from types import SimpleNamespace

    summary = _summary(runs=5, policies=9)
    verdict = SimpleNamespace(text="Aligning <script>alert(1)</script> helps")
    results = dsim.Results(summary, [verdict], [])
    text = repr(results)  # the dataclass default printed the whole table and every run
    assert text == (
        "Results(5 runs: run<0>, run<1>, run<2> … and 2 more; 9 policies; 4 GPUs; in no directory)"
    )
    html = results._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html and "run&lt;0&gt;" in html
    assert html.count("<tr>") == 1 + 20 and "25 more rows" in html  # header + capped rows
    assert "iteration time (ms)" in html and "<td>500.0</td>" in html and "<td>–</td>" in html
    assert len(html) < 10_000
    assert repr(dsim.Results(pd.DataFrame(), [], [])) == "Results(no runs)"


def test_api_errors_are_dsim_errors(sample: Path) -> None:
    with pytest.raises(UsageError, match=r"dsim\.run: the runs must lie in one traces directory"):
        dsim.run([sample / "a" / "x", sample / "b" / "y"])
    with pytest.raises(UsageError, match="unknown metric"):
        dsim.Results(pd.DataFrame(), []).check("nope>1")


def test_arguments_of_the_wrong_type_are_named_and_one_string_is_one_value(
    tmp_path: Path,
) -> None:
    """Wrong types raised bare TypeErrors ("argument of type 'int' is not iterable"), and a
    string where a list was expected was split into letters (runs="r1" read "--run r 1")."""
    from tracegen import write_synthetic

    run = write_synthetic(tmp_path / "traces", "r1", iterations=30)
    out = tmp_path / "results"
    for call, said in (
        (lambda: dsim.parse(5, out=tmp_path / "x", quiet=True), "paths: expected a path"),
        (lambda: dsim.parse(run, name=3, quiet=True), "name: expected a string, got 3"),
        (lambda: dsim.run(run, threshold_s="0.1", out=out, quiet=True), "threshold_s: expected"),
        (lambda: dsim.run(run, epochs=[1.5], out=out, quiet=True), "epochs: expected 'all'"),
        (lambda: dsim.load_results(5), "paths: expected a path or a list of paths, got 5"),
        (lambda: dsim.compare(1, 2), "before: expected a path, got 1"),
        (lambda: dsim.load_results(out, runs=3), "runs: expected a string or a list"),
    ):
        with pytest.raises(UsageError, match=re.escape(said)):
            call()
    result = dsim.run(run, policies="min/min", epochs=0, warmup=0, out=out, quiet=True)
    assert set(zip(result.summary["fetch_align"], result.summary["start_align"], strict=True)) == {
        ("actual", "actual"),
        ("min", "min"),
    }
    assert list(dsim.load_results(out, runs="r1").summary["run"].unique()) == ["r1"]


def test_api_names_are_not_shadowed_by_submodules() -> None:
    # importing a submodule binds its name on the package: dsim.compare was the analysis module
    importlib.import_module("dsim.app.compare")
    package = Path(dsim.__file__).parent
    for name in dsim._API:
        assert not (package / f"{name}.py").exists() and not (package / name).is_dir(), name
    assert callable(dsim.compare) and callable(dsim.report)


def test_import_dsim_stays_light() -> None:
    code = "import sys, dsim; print('pandas' in sys.modules, 'dsim.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    assert set(dsim.__all__) >= {
        "parse",
        "run",
        "load_results",
        "Results",
        "Trace",
        "report",
        "compare",
    }
