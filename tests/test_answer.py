"""One answer behind every output (docs/SPEC.md §5 "One answer"), end to end in subprocesses
(the inputs written through the CLI's entry point in-process, where that is allowed).

One results directory holds several runs and both replay models (two synthetic runs, one of
them also under the pipeline model, and a profiled run replayed by the stall-only model),
written by four separate `dsim run`s. The directory-level files describe all of them; the
terminal, `--json` and the CSV of `dsim summarize` agree on every number, verdict and
attribution line; a mixed selection skips what does not apply with a note.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, run_dsim, run_dsim_in_process

A = "synth_queue_seed5_gpus3_epoch2_b96_worker2_thread0"
B = "synth_queue_seed6_gpus2_epoch2_b64_worker2_thread0"
PROFILED = REPO / "traces" / "profiler" / "cpuDDP_synthetic_none_mlp_epoch1_b128_worker2_thread0"
P = PROFILED.name
WIDE = {"COLUMNS": "400"}


def dsim(*args: str | Path, cwd: Path, code: int = 0) -> subprocess.CompletedProcess:
    proc = run_dsim(*args, cwd=cwd, env=WIDE, timeout=180)
    assert proc.returncode == code, (args, proc.stderr)
    return proc


def build(*args: str | Path, cwd: Path) -> None:
    """A step that writes the inputs, through the CLI's entry point in this process (a fresh
    interpreter costs ~1 s): the outputs compared below are read by subprocesses (``dsim``)."""
    proc = run_dsim_in_process(*args, cwd=cwd, env=WIDE)
    assert proc.returncode == 0, (args, proc.stderr)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("answer")
    common = ("--iterations", "20", "--epochs", "2", "--workers", "2", "--out", "raw", "-q")
    build("synth", "--gpus", "3", "--seed", "5", "--skew", "0.5", "--batch-size", "32", *common,
          cwd=work)  # fmt: skip
    build("synth", "--gpus", "2", "--seed", "6", "--fetch-mean", "0.2", "--compute", "0.05",
          "--batch-size", "32", *common, cwd=work)  # fmt: skip
    dsim("parse", "raw", "--out", "traces", "-q", cwd=work)  # two runs: parsed in processes
    build("parse", PROFILED, "--out", "traces", "-q", cwd=work)
    for args in ((A,), (B,), (A, "--model", "pipeline"), (P,)):  # four `dsim run`s, one dir
        build("run", *args, "--warmup", "2", "--executor", "local", "-q", cwd=work)
    return work


def test_directory_files_describe_every_run_not_only_the_last_dsim_run(work: Path) -> None:
    summary = pd.read_csv(work / "results" / "summary.csv")
    assert sorted(set(summary["results"])) == sorted(
        [f"results/{A}", f"results/{A}@pipeline", f"results/{B}", f"results/{P}@stall-only"]
    )
    assert set(summary["replay_model"]) == {"per-iteration", "pipeline", "stall-only"}
    parquet = pd.read_parquet(work / "results" / "summary.parquet")
    assert len(parquet) == len(summary) == 9 + 9 + 9 + 3
    attribution = pd.read_csv(work / "results" / "attribution.csv")
    assert sorted(set(attribution["run"])) == sorted({A, B, P})
    # each run's own attribution file, from which the directory's is rebuilt
    assert (work / "results" / "attribution" / "runs" / f"{B}.parquet").is_file()


def _numbers_equal(a: object, b: object) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=1e-15)
    return str(a) == str(b)


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def outputs(work: Path) -> tuple[dict, pd.DataFrame, str]:
    """`dsim summarize results` as JSON, CSV and terminal text, each from its own subprocess:
    once for the module (no test changes ``work/results``; the three tests comparing them ran
    the same three commands each)."""
    doc = json.loads(dsim("summarize", "results", "--json", cwd=work).stdout)
    csv = pd.read_csv(io.StringIO(dsim("summarize", "results", "--out", "-", "--format", "csv",
                                       cwd=work).stdout))  # fmt: skip
    return doc, csv, dsim("summarize", "results", cwd=work).stdout


def test_terminal_json_and_csv_agree_on_every_number_verdict_and_attribution(
    outputs: tuple[dict, pd.DataFrame, str],
) -> None:
    doc, csv, terminal = outputs
    said = _words(terminal)

    # numbers: every cell of every row, CSV against JSON (the same rows, in the same order)
    rows = doc["summary"]
    assert len(rows) == len(csv) == 30
    for record, (_, row) in zip(rows, csv.iterrows(), strict=True):
        for key, value in record.items():
            cell = row[key]
            cell = None if isinstance(cell, float) and math.isnan(cell) else cell
            assert _numbers_equal(value, cell.item() if hasattr(cell, "item") else cell), key

    # verdicts, caveats and attribution lines: the terminal says what the JSON says
    assert len(doc["verdicts"]) == len(doc["runs"]) == 4
    for verdict, run in zip(doc["verdicts"], doc["runs"], strict=True):
        assert (verdict["run"], verdict["results"]) == (run["run"], run["results"])
        assert _words(verdict["text"]) in said
        for caveat in verdict["caveats"]:
            assert _words(f"caveat: {caveat}") in said
        if run["model"] != "stall-only":  # a profiled run is judged by its stalls (one line)
            assert run["attribution"], run["run"]
        for line in run["attribution"]:
            assert _words(line) in said
        # one best policy: the verdict's, the run's, the table's marker (the tie rule)
        assert (run["best_fetch_align"], run["best_start_align"]) == (
            verdict["best_fetch_align"],
            verdict["best_start_align"],
        )
    marked = [line.split()[0] for line in terminal.splitlines() if line.rstrip().endswith("best")]
    expected = [
        f"{r['best_fetch_align']}/{r['best_start_align']}"
        for r, o in zip(doc["runs"], doc["overview"], strict=True)
        if o["best"] is not None
    ]
    assert marked == expected and len(expected) >= 3
    # the terminal's rounded numbers are the JSON's: every speed-up and measured mean
    for record in rows:
        assert f"{record['speedup']:.2f}×" in terminal
    for o in doc["overview"]:
        unit_ms = o["iteration_s"] < 1
        shown = f"{o['iteration_s'] * 1000:.1f}" if unit_ms else f"{o['iteration_s']:.4f}"
        assert shown in terminal, (o["run"], shown)


def test_a_mixed_selection_skips_the_run_that_cannot_replay_the_policy(work: Path) -> None:
    proc = dsim("run", "-r", "*", "-p", "avg/min", "--warmup", "2", "--out", "mixed",
                "--executor", "local", "--json", cwd=work)  # fmt: skip
    doc = json.loads(proc.stdout)
    assert {r["run"] for r in doc["runs"]} == {A, B}
    assert f"skipped run {P}: run {P} has no fetch records" in _words(proc.stderr)
    assert any(note.startswith(f"skipped run {P}") for note in doc["notes"])
    assert not list((work / "mixed").glob(f"{P}*"))
    # nothing could be replayed: the refusal, as before (exit 3)
    alone = dsim("run", P, "-p", "avg/min", "--out", "alone", cwd=work, code=3)
    assert f"run {P} has no fetch records" in alone.stderr


def test_report_and_summarize_epochs_skip_a_run_without_that_epoch(work: Path) -> None:
    proc = dsim("report", "results", "--epochs", "1", "--out", "r.html", cwd=work)
    assert f"skipped run {P}" in proc.stderr and "no epoch(s) 1 (it has 0)" in proc.stderr
    page = (work / "r.html").read_text()
    assert A in page and P not in page
    doc = json.loads(dsim("summarize", "results", "--epochs", "1", "--json", cwd=work).stdout)
    assert {r["run"] for r in doc["runs"]} == {A, B}
    assert any("no epoch(s) 1" in note for note in doc["notes"])
    dsim("summarize", f"results/{P}@stall-only", "--epochs", "1", cwd=work, code=2)  # alone


class _Page(HTMLParser):
    """The report's summary table (per row: the run it belongs to and its cells) and the
    verdict section's texts (sentences and the lines below them), read from the HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, list[str]]] = []
        self.verdict: list[str] = []
        self._stack: list[tuple[str, dict[str, str]]] = []
        self._run = ""
        self._cells: list[str] | None = None
        self._text: list[str] | None = None
        self._in_verdict = False
        self._in_summary = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attr = {k: v or "" for k, v in attrs}
        if tag == "section":
            self._in_verdict = attr.get("id") == "verdict"
        if tag == "table":
            self._in_summary = attr.get("id") == "summary-table"
        if self._in_summary and tag == "tr":
            self._cells = [] if "policy" in attr.get("class", "") else None
        if (self._in_summary and tag == "td") or (self._in_verdict and tag in ("p", "li")):
            self._text = []
        self._stack.append((tag, attr))

    def handle_startendtag(self, tag: str, attrs: list) -> None:  # <wbr>: no text
        pass

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        while self._stack and self._stack[-1][0] != tag:
            self._stack.pop()  # void elements (<wbr>, <meta>) have no end tag
        _, attr = self._stack.pop() if self._stack else ("", {})
        text = "".join(self._text or [])
        if tag == "td" and self._in_summary and self._text is not None:
            if "run" in attr.get("class", "").split():
                self._run = text
            elif self._cells is not None:
                self._cells.append(text)
            self._text = None
        elif tag == "tr" and self._cells is not None:
            self.rows.append((self._run, self._cells))
            self._cells = None
        elif tag in ("p", "li") and self._in_verdict and self._text is not None:
            self.verdict.append(_words(text))
            self._text = None
        elif tag == "table":
            self._in_summary = False
        elif tag == "section":
            self._in_verdict = False


def _original_line(v: dict) -> str:
    """The per-iteration verdict's line under a headline (``dsim.analysis.verdict.original_line``),
    from the JSON's numbers: the report says the pipeline model's verdict first."""
    policy = f"{v['best_fetch_align']}/{v['best_start_align']}"
    if v["helps"]:
        said = f"{v['speedup']:.2f}× ({policy})"
    else:
        said = f"no policy saves ≥ 1 % (best {policy}: {v['speedup']:.2f}×)"
    return f"the original analysis's per-iteration replay says {said}"


def _check_html_agrees(doc: dict, html: str) -> None:
    """The report of the results directory says the JSON's numbers, verdicts and lines."""
    from dsim.render.html import _mean_std

    page = _Page()
    page.feed(html)
    by_row = {(run, cells[0]): cells for run, cells in page.rows}
    assert len(by_row) == len(doc["summary"]) == 30
    for record in doc["summary"]:
        name = Path(record["results"]).name  # the report names a run by its directory
        cells = by_row[(name, f"{record['fetch_align']} / {record['start_align']}")]
        assert int(cells[1]) == record["iterations"]
        metrics = ("iteration_s", "stall_s", "delay_s", "start_diff_s", "fetch_diff_s")
        for cell, metric in zip(cells[2:7], metrics, strict=True):
            assert cell == _mean_std(record, metric), (name, metric, cell)
        pct = record["effective_delay_pct"]
        assert cells[7] == ("–" if pct is None else f"{pct:.1f}")
        assert cells[8] == ("–" if record["speedup"] is None else f"{record['speedup']:.3f}")
    said = " ".join(page.verdict)
    for verdict, run in zip(doc["verdicts"], doc["runs"], strict=True):
        assert _words(verdict["text"]) in said or _words(_original_line(verdict)) in said, verdict
        for line in run["attribution"]:
            assert _words(line) in page.verdict, (run["run"], line)


def _check_csv_agrees(doc: dict, csv: pd.DataFrame) -> None:
    """Every cell of the CSV is the JSON's, and its answer columns are the answer's."""
    rows = doc["summary"]
    assert len(rows) == len(csv) == 30
    for record, (_, row) in zip(rows, csv.iterrows(), strict=True):
        for key, value in record.items():
            cell = row[key]
            cell = None if isinstance(cell, float) and math.isnan(cell) else cell
            assert _numbers_equal(value, cell.item() if hasattr(cell, "item") else cell), key
    runs = {r["results"]: r for r in doc["runs"]}
    overview = {o["results"]: o for o in doc["overview"]}
    verdicts = {v["results"]: v for v in doc["verdicts"]}
    for _, row in csv.iterrows():
        policy = f"{row['fetch_align']}/{row['start_align']}"
        assert bool(row["best"]) == (overview[row["results"]]["best"] == policy)
        verdict = verdicts.get(row["results"])
        assert _numbers_equal(row["verdict"], None if verdict is None else verdict["text"])
        lines = runs[row["results"]]["attribution"]
        assert _numbers_equal(row["attribution"], " | ".join(lines) or None)
    assert csv["best"].sum() == sum(o["best"] is not None for o in doc["overview"]) >= 3


def _check_terminal_agrees(doc: dict, terminal: str) -> None:
    said = _words(terminal)
    for verdict, run in zip(doc["verdicts"], doc["runs"], strict=True):
        assert _words(verdict["text"]) in said
        for line in run["attribution"]:
            assert _words(line) in said
    for record in doc["summary"]:
        assert f"{record['speedup']:.2f}×" in terminal
    marked = [line.split()[0] for line in terminal.splitlines() if line.rstrip().endswith("best")]
    assert marked == [o["best"] for o in doc["overview"] if o["best"] is not None]


def _check_mlflow_agrees(doc: dict, uri: str) -> None:
    """Each MLflow run (one per results run directory) logs the JSON's numbers per policy,
    and the answer's best policy, verdict and attribution lines as tags."""
    from mlflow.tracking import MlflowClient

    from dsim.render.mlflow import METRIC_COLUMNS

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dsim")
    found = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = {r.data.tags["dsim.directory"]: r for r in found
               if "mlflow.parentRunId" not in r.data.tags}  # fmt: skip
    children = {(r.data.tags["mlflow.parentRunId"], r.data.tags["dsim.policy"]): r
                for r in found if "mlflow.parentRunId" in r.data.tags}  # fmt: skip
    verdicts = {v["results"]: v for v in doc["verdicts"]}
    assert len(parents) == len(doc["runs"]) == 4 and len(children) == 30
    for run, overview in zip(doc["runs"], doc["overview"], strict=True):
        parent = parents[Path(run["results"]).name]
        tags, metrics = parent.data.tags, parent.data.metrics
        assert tags["dsim.best_policy"] == f"{run['best_fetch_align']}/{run['best_start_align']}"
        verdict = verdicts.get(run["results"])
        assert tags.get("dsim.verdict_text") == (None if verdict is None else verdict["text"])
        assert tags.get("dsim.attribution_lines") == ("\n".join(run["attribution"]) or None)
        assert _numbers_equal(metrics.get("measured_iteration_s_mean"), overview["iteration_s"])
        for record in (r for r in doc["summary"] if r["results"] == run["results"]):
            policy = f"{record['fetch_align']}/{record['start_align']}"
            logged = children[(parent.info.run_id, policy)].data.metrics
            for column in METRIC_COLUMNS:
                assert _numbers_equal(logged.get(column), record.get(column)), (policy, column)
            best = (run["best_fetch_align"], run["best_start_align"])
            if (record["fetch_align"], record["start_align"]) == best:
                assert _numbers_equal(metrics.get("best_speedup"), record["speedup"])


def test_the_report_agrees_with_json_csv_and_terminal(
    work: Path, outputs: tuple[dict, pd.DataFrame, str]
) -> None:
    """Four of the five outputs, without MLflow (the next test adds it where installed)."""
    doc, csv, terminal = outputs
    dsim("report", "results", "--out", "four.html", "-q", cwd=work)
    _check_csv_agrees(doc, csv)
    _check_terminal_agrees(doc, terminal)
    _check_html_agrees(doc, (work / "four.html").read_text(encoding="utf-8"))


def test_terminal_json_csv_html_and_mlflow_agree(
    work: Path,
    outputs: tuple[dict, pd.DataFrame, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #22's "done when": the five outputs of one results directory — terminal, JSON,
    CSV, HTML and MLflow (a local file store) — agree on every number, verdict and
    attribution line, each rendered from one answer."""
    if importlib.util.find_spec("mlflow") is None:
        pytest.skip("needs the mlflow extra (pip install -e '.[mlflow]'; CI installs it)")
    uri = (tmp_path / "mlruns").as_uri()  # file:///…: MLflow's local file store
    # newer MLflow refuses its file store unless asked for it (older ones ignore the variable)
    env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "",
           "MLFLOW_ALLOW_FILE_STORE": "true",
           "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}  # fmt: skip
    proc = run_dsim("report", "results", "--out", tmp_path / "five.html", "--mlflow", "-q",
                    cwd=work, env={**WIDE, **env}, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc, csv, terminal = outputs
    _check_terminal_agrees(doc, terminal)
    _check_csv_agrees(doc, csv)
    _check_html_agrees(doc, (tmp_path / "five.html").read_text(encoding="utf-8"))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this process reads the store too
    _check_mlflow_agrees(doc, uri)


def test_mlflow_logs_the_answer_without_computing_its_own(work: Path) -> None:
    """What MLflow gets (``dsim.render.mlflow.answer_runs``, pure: no mlflow needed) is the
    answer's: its best policy, verdict and attribution lines as tags, its rows' numbers."""
    from dsim.app.summarize import summarize_answer
    from dsim.render.mlflow import answer_runs, policy_metrics

    answer = summarize_answer([work / "results"])
    records = answer_runs(answer, command="report")
    assert [r.directory for r in records] == [r.results for r in answer.runs]
    for record, run in zip(records, answer.runs, strict=True):
        assert record.tags["dsim.best_policy"] == "/".join(run.best)
        assert record.tags["dsim.command"] == "report"
        assert record.tags.get("dsim.verdict_text") == (run.verdict.text if run.verdict else None)
        assert record.tags.get("dsim.attribution_lines") == ("\n".join(run.attribution) or None)
        best = next(r for r in run.rows if (r["fetch_align"], r["start_align"]) == run.best)
        assert record.metrics["best_speedup"] == best["speedup"]
        assert [p.label for p in record.policies] == [
            f"{r['fetch_align']}/{r['start_align']}" for r in run.rows
        ]
        assert [p.metrics for p in record.policies] == [policy_metrics(r) for r in run.rows]
        assert list(record.rows["best"]) == [
            f"{r['fetch_align']}/{r['start_align']}" == o.best
            for r in run.rows
            for o in [next(o for o in answer.overview if o.results == run.results)]
        ]
        assert record.params["run"] == run.run.split("@")[0]
