"""dsim as a library, for notebooks and scripts (re-exported by ``import dsim``).

The calls follow the command line's data flow and go through the same
application functions as the CLI (``dsim.app``), so they write and read the
same files::

    import dsim

    trace = dsim.parse("logs/myrun", out="traces")        # dsim parse
    results = dsim.run(trace, policies=["min/min"])       # dsim run
    results.summary                                       # the summary table (DataFrame)
    results.verdicts[0].text                              # the verdict, as dsim run prints it
    results.iterations()                                  # long format: run, policy, iteration
    later = dsim.load_results("results")                  # dsim summarize
    advice = dsim.tune(trace, workers=[1, 2, 4, 8])       # dsim tune
    advice.loader_only.point.workers                      # the recommended num_workers
    dsim.report("results", out="report.html")             # dsim report
    dsim.compare("results/old_run", "results/new_run")    # dsim compare

Every call that writes files says where, in one line on stderr (``quiet=True``
silences it); ``Results.directories`` names them. In a notebook, ``Results``,
``Trace``, the ``TuneResult`` and the ``Comparison`` show a one-line ``repr``
and, as a cell's value, the verdict and a small summary table
(``_repr_html_``).

Errors are ``dsim.errors.DsimError`` subclasses with the CLI's messages.
The replay call is ``dsim.run``, after the command: ``dsim.replay`` is the
package of policies and replay models.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsim.errors import UsageError

if TYPE_CHECKING:
    import pandas as pd

    from dsim.analysis.checks import CheckResult
    from dsim.analysis.comparison import Comparison
    from dsim.analysis.verdict import Verdict
    from dsim.app.answer import Answer
    from dsim.app.tune import TuneResult
    from dsim.model.results import ResultRun
    from dsim.model.runinfo import RunInfo

PathLike = str | Path


@dataclass(frozen=True)
class Trace:
    """A parsed run: ``<traces>/<name>/`` with its ``run.json`` (``info``) and two tables."""

    name: str
    directory: Path
    info: RunInfo

    @property
    def fetch(self) -> pd.DataFrame:
        """``fetch.parquet`` (docs/SPEC.md §2.1), read and checked."""
        return self._tables().fetch.to_pandas()

    @property
    def train(self) -> pd.DataFrame:
        """``train.parquet`` (docs/SPEC.md §2.2), read and checked."""
        return self._tables().train.to_pandas()

    def __repr__(self) -> str:
        from dsim.render.notebook import trace_repr

        return trace_repr(self.name, str(self.directory), self.info)

    def _repr_html_(self) -> str:
        from html import escape

        return f"<p><b>{escape(repr(self))}</b></p>"

    def _tables(self) -> Any:
        """One snapshot of the run (§2.3), refused when it is no longer the version ``info``
        describes: a ``dsim parse`` since would pair this ``info`` with other tables."""
        from dsim.errors import InputError
        from dsim.model.tables import read_run

        tables = read_run(self.directory)
        if tables.info.version != self.info.version:
            raise InputError(
                "trace changed since dsim.load_trace read it (re-parsed?); load it again",
                self.directory,
            )
        return tables


@dataclass
class Results:
    """Replay results of some runs: the summary (§5), verdicts (§5.1) and the replays.

    ``runs`` holds each run directory's ``result.json`` (``run.info``, a
    ``ResultInfo``) and its listed replays.
    """

    summary: pd.DataFrame
    verdicts: list[Verdict]
    runs: list[ResultRun] = field(default_factory=list)
    answer: Answer | None = field(default=None, repr=False)
    """The answer every output renders (``dsim.app.answer``): per run the verdict, best
    policy, attribution lines and provenance; the overview."""

    @classmethod
    def of(cls, answer: Answer) -> Results:
        return cls(answer.summary, answer.verdicts, list(answer.result_runs), answer)

    @property
    def directories(self) -> list[Path]:
        """The results directories these runs live in (``dsim run --out``), in order."""
        return list(dict.fromkeys(run.directory.parent for run in self.runs))

    def __repr__(self) -> str:
        """One line: the runs, policies, GPU counts and where they live (not the table)."""
        from dsim.render.notebook import results_repr

        return results_repr(self.summary, [str(d) for d in self.directories])

    def _repr_html_(self) -> str:
        """In a notebook: the verdicts, then the summary's main columns (escaped, capped)."""
        from dsim.render.notebook import summary_html

        return summary_html(self.summary, self.verdicts, [str(d) for d in self.directories])

    def iterations(self) -> pd.DataFrame:
        """Every replayed iteration in long format (the tidy dataset's ``iterations``, §7.6)."""
        return self._dataset("iterations")

    def gpus(self) -> pd.DataFrame:
        """Every replayed iteration and rank in long format (the dataset's ``gpus``, §7.6)."""
        return self._dataset("gpus")

    def _dataset(self, table: str) -> pd.DataFrame:
        import pyarrow as pa

        from dsim.model.dataset import ITERATIONS, run_frames

        parts = [run_frames(run)[0 if table == ITERATIONS else 1] for run in self.runs]
        if not parts:
            raise UsageError("no runs in these results")
        return pa.concat_tables(parts).to_pandas()

    def check(self, *conditions: str) -> list[CheckResult]:
        """``--fail-if`` conditions (``"effective_delay_pct>10"``) evaluated per run (§5.6)."""
        from dsim.analysis.checks import evaluate
        from dsim.options import parse_condition

        return evaluate(self.summary, [parse_condition(c) for c in conditions])

    def to_json(self, *conditions: str) -> dict[str, Any]:
        """The ``--json`` document (§5.6), with the given conditions' checks."""
        from dsim.render.machine import answer_document, document

        checks = self.check(*conditions)
        if self.answer is None:
            return document(self.summary, self.verdicts, checks)
        from dataclasses import replace

        runs = tuple(
            replace(r, checks=tuple(c for c in checks if (c.run, c.results) == (r.run, r.results)))
            for r in self.answer.runs
        )
        return answer_document(replace(self.answer, runs=runs))


def _path(value: object, what: str) -> Path:
    """One path argument; a UsageError naming ``what`` for anything else (``Path(5)`` was
    a bare TypeError)."""
    if isinstance(value, str | os.PathLike):
        return Path(value)
    raise UsageError(f"{what}: expected a path, got {value!r}")


def _paths(paths: PathLike | Sequence[PathLike], what: str = "paths") -> list[Path]:
    if isinstance(paths, str | os.PathLike):
        return [Path(paths)]
    if not isinstance(paths, Sequence):
        raise UsageError(f"{what}: expected a path or a list of paths, got {paths!r}")
    return [_path(p, what) for p in paths]


def _texts(value: str | Sequence[str] | None, what: str) -> list[str] | None:
    """A list of strings from one string or a list: ``runs="r"`` was split into its
    letters ("--run r matches no run"; a long name read "s y n t h _ ...")."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return list(value)
    raise UsageError(f"{what}: expected a string or a list of strings, got {value!r}")


def _seconds(value: object, what: str) -> float | None:
    """A number of seconds, or None; ``"0.1"`` or ``True`` is a UsageError, not a TypeError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{what}: expected a number of seconds, got {value!r}")
    return float(value)


def _wrote(what: str, where: Path, quiet: bool) -> None:
    """The one line that says where a call wrote (a notebook's working directory is not
    obvious): on stderr, like the commands' notes, the path absolute."""
    if not quiet:
        print(f"dsim: wrote {what} to {where.absolute()}", file=sys.stderr)


def _epochs(epochs: Sequence[int] | str | None) -> list[int] | str | None:
    """Epochs as a list, or the CLI's text (``"all"``, ``"1,3"``, ``"1-3"``)."""
    from dsim.options import parse_epochs_option

    if epochs is None:
        return None
    if isinstance(epochs, str):
        return parse_epochs_option(epochs)
    if isinstance(epochs, int) and not isinstance(epochs, bool):
        return [epochs]  # one epoch: epochs=1 was a TypeError
    if isinstance(epochs, Sequence) and all(
        isinstance(e, int) and not isinstance(e, bool) for e in epochs
    ):
        return [int(e) for e in epochs]
    raise UsageError(f"epochs: expected 'all', an epoch number or a list of them, got {epochs!r}")


def load_trace(directory: PathLike) -> Trace:
    """A run directory written by ``dsim parse`` (``run.json`` version-checked)."""
    from dsim.model.tables import read_info

    info = read_info(directory)
    return Trace(info.name or Path(directory).name, Path(directory), info)


def parse(
    paths: PathLike | Sequence[PathLike],
    *,
    out: PathLike = "traces",
    name: str | None = None,
    input_format: str = "auto",
    strict: bool = False,
    quiet: bool = False,
) -> Trace:
    """``dsim parse PATHS --out OUT``: one run's logs (or profiler traces) → ``<out>/<run>/``.

    The paths must hold one run (use the CLI for a tree of runs); ``name``
    names it, ``input_format`` is ``auto``, ``rawlog`` or ``kineto``. Says on
    stderr where it wrote (``quiet=True``: not).
    """
    from dsim.app.parse import discover_runs, parse_and_write

    if name is not None and not isinstance(name, str):
        raise UsageError(f"name: expected a string, got {name!r}")
    fmt, runs = discover_runs(_paths(paths), name=name, input_format=input_format)
    if len(runs) != 1:
        names = ", ".join(r.name for r in runs[:5])
        raise UsageError(f"dsim.parse reads one run; these paths hold {len(runs)}: {names}")
    directory, info = parse_and_write(runs[0], _path(out, "out"), fmt=fmt, strict=strict)
    _wrote(f"the parsed run {info.name}", directory, quiet)
    return Trace(info.name, directory, info)


def run(
    traces: Trace | PathLike | Sequence[Trace | PathLike],
    *,
    policies: Sequence[str] | None = None,
    model: str | None = None,
    workers: int | None = None,
    prefetch_factor: int | None = None,
    out: PathLike = "results",
    epochs: Sequence[int] | str | None = None,
    warmup: int | None = None,
    threshold_s: float | None = None,
    executor: str = "local",
    force: bool = False,
    quiet: bool = False,
) -> Results:
    """``dsim run``: replay parsed runs under policies (``"min/min"``; default: all nine).

    ``traces`` are ``Trace`` objects or run directories, all under one traces
    directory. Writes ``out`` as ``dsim run`` does (cached replays are
    reused unless ``force``) and returns its results. ``executor`` is
    ``local`` (in-process, the default here), ``ray`` or ``auto``.
    """
    from dsim.analysis.sanity import check_threshold
    from dsim.app.run import outcome_answer, run_replays
    from dsim.config import Overrides, load_config
    from dsim.options import parse_policy_option

    items = [traces] if isinstance(traces, Trace | str | os.PathLike) else traces
    if not isinstance(items, Sequence):
        raise UsageError(f"traces: expected run directories or Traces, got {traces!r}")
    dirs = [t.directory if isinstance(t, Trace) else _path(t, "traces") for t in items]
    threshold_s = _seconds(threshold_s, "threshold_s")
    epochs = _epochs(epochs)
    parents = {d.parent.resolve() for d in dirs}
    if len(parents) != 1:
        raise UsageError("dsim.run: the runs must lie in one traces directory")
    check_threshold(threshold_s, force=force)
    overrides = Overrides(
        runs=tuple(d.name for d in dirs),
        traces=dirs[0].parent,
        out=_path(out, "out"),
        epochs=epochs,
        warmup=warmup,
        threshold_s=threshold_s,
        executor=executor,
        model=model,
        workers=workers,
        prefetch_factor=prefetch_factor,
        policies=tuple(parse_policy_option(p) for p in _texts(policies, "policies") or ()),
    )
    config = load_config(None, overrides)
    outcome = run_replays(config, force=force)
    answer = outcome_answer(outcome, config)
    done = len(dict.fromkeys(outcome.summary["run"]))
    _wrote(f"the results of {done} run{'s' if done != 1 else ''}", Path(out), quiet)
    return Results.of(answer)


def load_results(
    paths: PathLike | Sequence[PathLike] = "results",
    *,
    runs: Sequence[str] | None = None,
    policies: Sequence[str] | None = None,
    epochs: Sequence[int] | str | None = None,
    warmup: int | None = None,
    threshold_s: float | None = None,
) -> Results:
    """``dsim summarize``: results directories written by ``dsim run`` → ``Results``.

    ``runs`` are name globs; ``policies`` ``"fetch/start"`` labels; the
    selection defaults to what ``dsim run`` recorded (§5).
    """
    from dsim.app.summarize import summarize_answer
    from dsim.options import parse_policy_option

    chosen = _texts(policies, "policies")
    answer = summarize_answer(
        _paths(paths),
        run_globs=_texts(runs, "runs"),
        policies=[parse_policy_option(p) for p in chosen] if chosen else None,
        epochs=_epochs(epochs),
        warmup=warmup,
        threshold_s=_seconds(threshold_s, "threshold_s"),
        force=True,  # the API takes the threshold in seconds as given
    )
    return Results.of(answer)


def _count_text(value: object) -> str:
    """A grid value as the CLI's text: an integer (``4``, ``np.int64(4)``, ``4.0``) as
    itself, anything else as given, for ``parse_counts`` to refuse by name."""
    if isinstance(value, bool):
        return repr(value)
    try:
        whole = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return str(value)
    return str(whole) if whole == value else str(value)


def tune(
    trace: Trace | PathLike,
    *,
    workers: Sequence[int] | str | None = None,
    prefetch: Sequence[int] | str | None = None,
    out: PathLike | None = "results",
    epochs: Sequence[int] | str | None = None,
    warmup: int | None = None,
    alignment: bool = True,
    quiet: bool = False,
) -> TuneResult:
    """``dsim tune``: sweep a parsed run's ``num_workers`` × ``prefetch_factor`` (§5.7).

    ``workers``/``prefetch`` are lists or the CLI's text (``"1-8"``,
    ``"1,2,4"``); ``None`` takes the default grid. Writes
    ``<out>/tune/<run>.{parquet,csv}`` unless ``out`` is ``None`` (and says so on
    stderr unless ``quiet``); returns the
    ``TuneResult`` (``loader_only``: the recommendation; ``document()`` of
    ``dsim.render.tune`` gives the ``--json`` object).
    """
    from dsim.app.tune import tune_run
    from dsim.options import parse_counts
    from dsim.tuning import MAX_SETTING

    def grid(values: Sequence[int] | str | None, option: str, lowest: int) -> tuple[int, ...]:
        if values is None:
            return ()
        # each value as it was given: int() made workers=[2.9] num_workers=2 silently
        text = values if isinstance(values, str) else ",".join(_count_text(v) for v in values)
        if not text.strip():
            raise UsageError(f"{option}: an empty grid (give values, 1 to {MAX_SETTING})")
        return parse_counts(text, option, lowest)

    directory = trace.directory if isinstance(trace, Trace) else Path(trace)
    result = tune_run(
        directory,
        workers=grid(workers, "workers", 0),
        prefetch=grid(prefetch, "prefetch", 1),
        epochs=list(epochs) if epochs is not None and not isinstance(epochs, str) else epochs,
        warmup=warmup,
        alignment=alignment,
        out=None if out is None else Path(out),
    )
    if result.files:
        _wrote(f"the tune table of {result.run}", result.files[0].parent, quiet)
    return result


def report(
    results: PathLike | Sequence[PathLike] = "results",
    *,
    out: PathLike = "report.html",
    runs: Sequence[str] | None = None,
    policies: Sequence[str] | None = None,
    epochs: Sequence[int] | str | None = None,
    warmup: int | None = None,
    threshold_s: float | None = None,
    timeline_run: str | None = None,
    traces: PathLike = "traces",
    force: bool = False,
    quiet: bool = False,
) -> Path:
    """``dsim report``: the self-contained HTML report of results directories → ``out``.

    ``runs`` are name globs, ``policies`` ``"fetch/start"`` labels; the
    selection defaults to what ``dsim run`` recorded (§9.2). Says on stderr
    where it wrote, and the report's notes (``quiet=True``: neither); returns
    the file's path (``IPython.display.IFrame(path, 1000, 600)`` shows it).
    """
    from dsim.analysis.sanity import check_threshold
    from dsim.app.report import ReportRequest, make_report
    from dsim.options import parse_policy_option

    threshold_s = _seconds(threshold_s, "threshold_s")
    check_threshold(threshold_s, force=force)
    target = _path(out, "out")
    chosen = _texts(policies, "policies")
    outcome = make_report(
        ReportRequest(
            results=_paths(results),
            out=target,
            runs=_texts(runs, "runs") or [],
            policies=[parse_policy_option(p) for p in chosen] if chosen else None,
            epochs=_epochs(epochs),
            warmup=warmup,
            threshold_s=threshold_s,
            timeline_run=timeline_run,
            traces=_path(traces, "traces"),
            force=force,
        ),
    )
    if not quiet:
        for note in outcome.notes:
            print(f"dsim: note: {note}", file=sys.stderr)
    _wrote(f"the report of {outcome.runs} run{'s' if outcome.runs != 1 else ''}", target, quiet)
    return target


def compare(before: PathLike, after: PathLike, *, policy: str | None = None) -> Comparison:
    """``dsim compare BEFORE AFTER``: measured deltas and the share of BEFORE's predicted
    gain under ``policy`` (default: BEFORE's best) that AFTER realised (§5.3).

    Each side is a run directory (``results/<run>``) or a results directory
    holding one run. Returns the ``Comparison`` (``text``: the sentence;
    ``record()``: every number, as ``dsim compare --json``). Writes nothing.
    """
    from dsim.app.compare import compare_runs
    from dsim.options import parse_policy_option

    chosen = parse_policy_option(policy) if policy else None
    return compare_runs(_path(before, "before"), _path(after, "after"), chosen)
