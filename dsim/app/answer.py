"""One typed answer behind every output of a results directory (docs/SPEC.md §5 "One answer").

``dsim run`` and ``dsim summarize`` (and the Python API) compute the
answer once — per run the summary rows, the verdict, the attribution lines,
the ``--fail-if`` checks, notes and provenance; across runs the overview and
the notes — and the terminal (``dsim.render.terminal.print_answer``), the
``--json`` document (``dsim.render.machine.answer_document``), the summary
files (``dsim.render.files.write_answer_files``) and the Python API render
it. No output recomputes a verdict, picks a best policy or attributes a
run by itself, so two outputs of one results directory cannot disagree.

The best policy of a run is the verdict's (``dsim.analysis.verdict.best_row``: the
lowest mean iteration time, exact ties to the simpler policy); the
overview and the table's ``best`` marker use the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from dsim.analysis.attribution import describe
from dsim.analysis.checks import CheckResult, evaluate, raise_if_held
from dsim.analysis.verdict import Verdict, best_row, record_groups, run_verdicts
from dsim.app.attribution import ATTRIBUTION_STEM, run_table_path
from dsim.io import parquetio
from dsim.model.resultinfo import ResultInfo
from dsim.model.results import ResultRun
from dsim.options import Condition
from dsim.replay.policies import BASELINE


@dataclass(frozen=True)
class RunAnswer:
    """One run (one results run directory: a model variant is its own) as every output says it."""

    run: str
    results: str  # the results run directory (the summary's ``results`` column)
    model: str
    rows: tuple[Mapping[str, Any], ...]  # its summary rows, in summary order
    best: tuple[str, str] | None  # the tie rule's best policy; None: no policy but measured
    verdict: Verdict | None
    headline: Verdict | None = None  # the more accurate model's verdict (``dsim run``)
    attribution: tuple[str, ...] = ()  # ``dsim.analysis.attribution.describe`` lines
    checks: tuple[CheckResult, ...] = ()
    notes: tuple[str, ...] = ()
    provenance: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OverviewRow:
    """One run in the overview: measured means and the best policy (the verdict's)."""

    run: str
    results: str
    model: str
    gpus: int | None
    iteration_s: float | None  # measured (actual/actual) mean
    stall_s: float | None
    effective_delay_pct: float | None
    best: str | None  # ``fetch/start``; None when no policy beats the measured run
    speedup: float | None


@dataclass(frozen=True)
class Answer:
    """Everything ``dsim run`` / ``dsim summarize`` say about some results, computed once."""

    summary: pd.DataFrame
    runs: tuple[RunAnswer, ...]
    overview: tuple[OverviewRow, ...]
    notes: tuple[str, ...] = ()
    written: tuple[Path, ...] = ()
    result_runs: tuple[ResultRun, ...] = ()  # the runs read (their replays, for the API)

    @property
    def verdicts(self) -> list[Verdict]:
        return [r.verdict for r in self.runs if r.verdict is not None]

    @property
    def checks(self) -> list[CheckResult]:
        return [c for r in self.runs for c in r.checks]

    def raise_if_held(self) -> None:
        """``CheckFailed`` (exit 5) naming every run and ``--fail-if`` condition that held."""
        raise_if_held(self.checks)

    @property
    def blame(self) -> dict[str, list[str]]:
        """Results run directory → attribution lines (``render.insight.print_verdicts``)."""
        return {r.results: list(r.attribution) for r in self.runs if r.attribution}

    @property
    def headlines(self) -> dict[str, Verdict]:
        return {r.results: r.headline for r in self.runs if r.headline is not None}


def _groups(summary: pd.DataFrame) -> list[list[dict[str, Any]]]:
    return record_groups(summary)


def _best(rows: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    try:
        row = best_row([r for r in rows if r.get("iteration_s_mean") is not None])
    except ValueError:
        return None
    return (str(row["fetch_align"]), str(row["start_align"]))


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if number != number else number


def _overview_row(rows: Sequence[Mapping[str, Any]], best: tuple[str, str] | None) -> OverviewRow:
    first = rows[0]
    base = next(((r for r in rows if (r["fetch_align"], r["start_align"]) == BASELINE)), {})
    chosen = next((r for r in rows if (r["fetch_align"], r["start_align"]) == best), None)
    speedup = _number(chosen.get("speedup")) if chosen is not None else None
    beats = best is not None and best != BASELINE and speedup is not None and speedup > 1.0005
    gpus = _number(first.get("gpus"))
    return OverviewRow(
        run=str(first["run"]),
        results=str(first.get("results")),
        model=str(first.get("replay_model") or "per-iteration"),
        gpus=None if gpus is None else int(gpus),
        iteration_s=_number(base.get("iteration_s_mean")),
        stall_s=_number(base.get("stall_s_mean")),
        effective_delay_pct=_number(base.get("effective_delay_pct")),
        best=f"{best[0]}/{best[1]}" if beats and best else None,
        speedup=speedup if beats else None,
    )


def attribution_rows(results_dirs: Iterable[Path]) -> dict[str, pd.DataFrame]:
    """Results run directory → its attribution rows: the run's own table
    (``<out>/attribution/runs/<run dir>.parquet``), else — results written before dsim
    wrote one per run — the run's rows of the results directory's ``attribution.parquet``."""
    out: dict[str, pd.DataFrame] = {}
    level: dict[Path, pd.DataFrame] = {}
    for directory in dict.fromkeys(Path(d) for d in results_dirs):
        own = run_table_path(directory.parent, directory.name)
        if own.is_file():
            out[str(directory)] = parquetio.read_table(own, remedy="re-run `dsim run`").to_pandas()
            continue
        parent = directory.parent
        if parent not in level:
            path = parent / f"{ATTRIBUTION_STEM}.parquet"
            level[parent] = (
                parquetio.read_table(path, remedy="re-run `dsim run`").to_pandas()
                if path.is_file()
                else pd.DataFrame()
            )
        table = level[parent]
        if not table.empty:
            name = directory.name.split("@", 1)[0]
            out[str(directory)] = table[table["run"] == name]
    return out


def _attribution_lines(rows: Sequence[Mapping[str, Any]], table: pd.DataFrame | None) -> list[str]:
    """The run's attribution lines, when computed over the summary's own selection
    (lines over other iterations than the table's would mislead)."""
    if table is None or table.empty:
        return []
    first = rows[0]
    same = str(first.get("selected_epochs")) == str(table["selected_epochs"].iloc[0]) and int(
        first.get("warmup") or 0
    ) == int(table["warmup"].iloc[0])
    return describe(table) if same else []


def _provenance(info: ResultInfo | None) -> dict[str, Any]:
    """What ``result.json`` records about where the numbers come from (SPEC §7.3)."""
    if info is None:
        return {}
    selection = info.selection
    return {
        "model": info.model,
        "trace_path": info.trace_path,
        "trace_version": info.trace.version if info.trace is not None else None,
        "iterations": info.iterations,
        "ranks": list(info.ranks or ()),
        "selection": None
        if selection is None
        else {
            "epochs": None if selection.epochs is None else list(selection.epochs),
            "warmup": selection.warmup,
            "threshold_s": selection.threshold_s,
        },
    }


def build_answer(
    summary: pd.DataFrame,
    infos: Mapping[str, ResultInfo],
    *,
    attributions: Mapping[str, pd.DataFrame] | None = None,
    conditions: Sequence[Condition] = (),
    headlines: Mapping[str, Verdict] | None = None,
    notes: Sequence[str] = (),
    run_notes: Mapping[str, Sequence[str]] | None = None,
    written: Sequence[Path] = (),
    result_runs: Sequence[ResultRun] = (),
) -> Answer:
    """The answer of a summary: ``infos`` maps a results run directory to its ``result.json``;
    ``attributions`` a results run directory to its attribution rows (``attribution_rows``)."""
    attributions = attributions or {}
    headlines = headlines or {}
    run_notes = run_notes or {}
    verdicts = {(v.run, v.results): v for v in run_verdicts(summary, infos)}
    checks = evaluate(summary, list(conditions)) if conditions else []
    runs, overview = [], []
    for rows in _groups(summary):
        first = rows[0]
        results = str(first.get("results"))
        best = _best(rows)
        runs.append(
            RunAnswer(
                run=str(first["run"]),
                results=results,
                model=str(first.get("replay_model") or "per-iteration"),
                rows=tuple(rows),
                best=best,
                verdict=verdicts.get((str(first["run"]), results)),
                headline=headlines.get(results),
                attribution=tuple(_attribution_lines(rows, attributions.get(results))),
                checks=tuple(c for c in checks if c.run == first["run"] and c.results == results),
                notes=tuple(run_notes.get(results, ())),
                provenance=_provenance(infos.get(results)),
            )
        )
        overview.append(_overview_row(rows, best))
    return Answer(
        summary,
        tuple(runs),
        tuple(overview),
        tuple(notes),
        tuple(written),
        tuple(result_runs),
    )


def with_outcome(
    answer: Answer,
    *,
    conditions: Sequence[Condition] = (),
    notes: Sequence[str] = (),
    written: Sequence[Path] = (),
) -> Answer:
    """``answer`` (``build_answer``'s, without conditions, notes or files) as ``build_answer``
    gives it with them: the ``--fail-if`` checks evaluated over its summary, each run's
    its own. Why: ``dsim run`` answers for the results directory (its ``summary.*``) and
    for the runs it replayed; where those are the same rows, the verdicts and attribution
    lines are computed once (``dsim.app.run.outcome_answer``)."""
    checks = evaluate(answer.summary, list(conditions)) if conditions else []
    runs = tuple(
        replace(r, checks=tuple(c for c in checks if c.run == r.run and c.results == r.results))
        for r in answer.runs
    )
    return replace(answer, runs=runs, notes=tuple(notes), written=tuple(written))


def with_headlines(answer: Answer, headlines: Mapping[str, Verdict]) -> Answer:
    """The answer with the more accurate model's verdicts (results run directory → verdict,
    ``dsim.app.headline``) as the runs' headlines."""
    runs = tuple(replace(r, headline=headlines.get(r.results, r.headline)) for r in answer.runs)
    return replace(answer, runs=runs)
