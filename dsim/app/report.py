"""`dsim report` as a library call: read the results, choose what the page shows, write it.

The command (``dsim.commands.report``) turns options into a ``ReportRequest``
and prints what ``make_report`` did; everything between lives here:

* which runs and policies are shown, and the names the page gives them;
* the summary over the selection (``dsim.analysis.summary``) with the bars' p10/p90;
* the runs of the timeline/CDF/attribution switcher, largest predicted gain first;
* the answer (``dsim.app.answer.build_answer``): per run the verdict, best policy and
  attribution lines, the terminal's and every other output's, computed once;
* per switcher run, the attribution figures' data: from the run's parsed trace
  when ``find_trace`` finds the one that was replayed (over the report's own
  selection, with "who was last" per window of iterations), else from the
  ``attribution.parquet`` that ``dsim run`` wrote (when its selection is the
  report's), else a sentence saying why they are absent.

Reading happens under the results directories' shared lock; rendering and
the atomic write after it (docs/SPEC.md §9.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dsim.analysis.attribution import attribution_table
from dsim.analysis.sanity import check_threshold
from dsim.analysis.summary import summarize_results
from dsim.app.answer import Answer, build_answer, with_headlines
from dsim.app.attribution import (
    find_trace,
    read_attributions,
    read_replayed,
    trace_attribution,
)
from dsim.app.summarize import runs_with_epochs
from dsim.config import DEFAULT_TRACES
from dsim.errors import DsimError, InputError, OutputError, UsageError
from dsim.io import lock
from dsim.io.atomic import atomic_path, remove_leftovers, write_text
from dsim.model.results import (
    ResultRun,
    check_trace_versions,
    results_directories,
    scan_results,
)
from dsim.model.selection import selection_mask
from dsim.options import select_runs
from dsim.replay.policies import BASELINE, Policy
from dsim.words import counted

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd

    from dsim.render.figures.ranks import ReducedRanks
    from dsim.render.html import ReportView, RunAttribution

MAX_TIMELINE_RUNS = 6
"""Runs whose timeline and CDF the page carries: each adds up to a few MB."""


@dataclass
class ReportRequest:
    """What to show: the command's options, parsed and checked."""

    results: list[Path]
    out: Path
    runs: list[str] = field(default_factory=list)  # --run globs
    policies: list[Policy] | None = None
    epochs: Any = None  # an ``EpochSelection`` of dsim.options, or None: as recorded
    warmup: int | None = None
    threshold_s: float | None = None
    timeline_run: str | None = None
    traces: Path = DEFAULT_TRACES
    force: bool = False  # accept a threshold of 1 s or more


@dataclass
class ReportOutcome:
    """What ``make_report`` wrote, for the command to tell (and MLflow to log: ``answer``)."""

    answer: Answer
    view: ReportView
    figures: list[tuple[str, Any]]
    notes: list[str]
    out: Path

    @property
    def runs(self) -> int:
        return len(dict.fromkeys(self.answer.summary["run"]))


def check_output(out: Path) -> None:
    """Fail before any work when the report could not be written there.

    A missing directory is refused, not created: a mistyped ``--out`` would
    otherwise plant directories anywhere the user may write (docs/SPEC.md §9).
    """
    if out.is_dir():
        raise OutputError(f"cannot write {out}: it is a directory")
    parent = out.parent
    for ancestor in (parent, *parent.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                raise OutputError(f"cannot write {out}: {ancestor} is not a directory")
            break
    if not parent.is_dir():
        raise OutputError(
            f"cannot write {out}: directory {parent} does not exist (create it, or choose "
            "another --out)"
        )


def make_report(
    request: ReportRequest,
    on_wait: Callable[[str], None] | None = None,
    *,
    sink: Callable[[str], Any] | None = None,
) -> ReportOutcome:
    """Read the results (under their shared lock), render the page, write it atomically;
    or hand the page to ``sink`` instead of writing ``request.out`` (``--out -``: stdout)."""
    from dsim.render.html import render_report, report_figures

    check_threshold(request.threshold_s, force=request.force)
    if sink is None:
        check_output(request.out)
    with lock.shared(results_directories(list(request.results)), on_wait):
        answer, view, notes = read_report_input(request)
    figs = report_figures(answer, view)
    page = render_report(answer, view, figs)
    if sink is not None:
        sink(page)
    else:
        remove_leftovers(request.out.parent)  # temporaries of a killed report
        write_text(page, request.out)
    return ReportOutcome(answer, view, figs, notes, request.out)


def require_image_renderer(fmt: str) -> None:
    """Refuse ``--images`` where plotly's static export has no renderer (kaleido).

    Why before any work: the images were asked for, so a report without them is not
    what the user ran the command for; a note after a minute's work and exit 0 let
    scripts go on without them (the HTML report itself needs no renderer).
    """
    try:
        import kaleido  # noqa: F401
    except ImportError:
        raise UsageError(
            f"--images {fmt}: static export needs the kaleido package, which is not installed "
            "here (pip install kaleido); the HTML report does not need it: leave --images out"
        ) from None


def write_images(figs: list[tuple[str, Any]], out: Path, fmt: str) -> Path:
    """Static copies of every figure next to ``out``; call ``require_image_renderer`` before
    the report's work (without a renderer plotly's export fails: "cannot render")."""
    import plotly.io as pio

    folder = out.with_name(f"{out.stem}_images")
    remove_leftovers(folder)
    for div_id, fig in figs:
        target = folder / f"{div_id.removeprefix('fig-')}.{fmt}"
        with atomic_path(target) as tmp:
            try:
                pio.write_image(fig, tmp, format=fmt, width=1200, scale=2 if fmt == "png" else 1)
            except (RuntimeError, ValueError) as exc:
                raise OutputError(f"cannot render {target}: {exc}") from exc
    return folder


def display_names(runs: list[ResultRun]) -> dict[str, str]:
    """Run name per results directory, made unique when two directories hold the same run.

    A model variant is named by its directory (``RUN@pipeline``); the same name in
    two results directories gets the directory in brackets.
    """
    label = {
        str(r.directory): r.directory.name if r.directory.name != r.name else r.name for r in runs
    }
    counts: dict[str, int] = {}
    for name in label.values():
        counts[name] = counts.get(name, 0) + 1
    return {
        str(r.directory): name if counts[name] == 1 else f"{name} [{r.directory.parent}]"
        for r, name in ((r, label[str(r.directory)]) for r in runs)
    }


def _epochs_of(row: Any) -> list[int]:
    return [int(e) for e in str(row["selected_epochs"]).split(",") if e.strip()]


GPU_PREFIX = "stall_s_gpu"


def _gpu_columns(names: list[str]) -> list[str]:
    cols = [c for c in names if c.startswith(GPU_PREFIX)]
    return sorted(cols, key=lambda c: int(c.removeprefix(GPU_PREFIX) or 0))


def _timeline_replays(
    run: ResultRun, policies: list[Policy], summary_row: Any
) -> tuple[dict[Policy, pd.DataFrame], ReducedRanks | None]:
    """The timeline run's replays, restricted to the iterations the summary used.

    Above ``MANY_RANKS`` ranks the timeline draws per-GPU stalls only as bands across
    GPUs and the named stragglers, so each policy's stall table is reduced as soon as it
    is read (``ReducedRanks``) and only the named ranks' columns are kept: memory holds
    one policy's [iterations, GPUs] table at a time, not every policy's (issue 21).
    The reference replay (measured, else the first in canonical order) is read first:
    it decides which ranks are named.
    """
    from dsim.render.figures.labels import ordered_policies
    from dsim.render.figures.ranks import (
        MANY_RANKS,
        TOP_RANKS,
        ReducedRanks,
        largest_share,
        rank_bands,
        stall_stragglers,
    )
    from dsim.render.figures.style import GPU_COLORS

    epochs, warmup = _epochs_of(summary_row), int(summary_row["warmup"])
    reference = BASELINE if BASELINE in policies else ordered_policies(policies)[0]
    order = [reference, *(p for p in policies if p != reference)]
    frames: dict[Policy, pd.DataFrame] = {}
    reduced: ReducedRanks | None = None
    for policy in order:
        table = run.read(policy)
        mask = selection_mask(
            table.column("epoch").to_numpy(), table.column("iteration").to_numpy(), epochs, warmup
        )
        gpu_cols = _gpu_columns(table.column_names)
        if len(gpu_cols) <= MANY_RANKS:
            frames[policy] = table.to_pandas()[mask].reset_index(drop=True)
            continue
        stalls = np.column_stack(
            [table.column(c).to_numpy(zero_copy_only=False)[mask] for c in gpu_cols]
        ).astype(float, copy=False)
        if reduced is None:  # the reference: it names the ranks of every panel
            named = (
                stall_stragglers(stalls, TOP_RANKS)
                if len(gpu_cols) > len(GPU_COLORS)
                else np.arange(len(gpu_cols))
            )
            reduced = ReducedRanks(gpu_cols, named, largest_share(stalls), {})
        reduced.bands[policy] = rank_bands(stalls)
        del stalls
        drop = set(gpu_cols) - {gpu_cols[j] for j in reduced.named}
        kept = table.select([c for c in table.column_names if c not in drop])
        del table
        frames[policy] = kept.to_pandas()[mask].reset_index(drop=True)
    return {p: frames[p] for p in policies}, reduced


def selection_text(row: Any) -> str:
    """``epochs 1, 2, warm-up iterations ≤ 10 skipped``: the selection a summary row used."""
    epochs = str(row["selected_epochs"])
    label = "epoch" if "," not in epochs else "epochs"
    return f"{label} {epochs.replace(',', ', ')}, warm-up iterations ≤ {int(row['warmup'])} skipped"


def read_report_input(request: ReportRequest) -> tuple[Answer, ReportView, list[str]]:
    """Everything the report shows, read from the results directories: the answer (the
    summary over the report's selection, with its verdicts, headlines and attribution lines),
    the figures' data, and notes for the user."""
    from dsim.app.headline import headlines
    from dsim.render.html import ReportView

    scan = scan_results(list(request.results))
    runs = select_runs(scan.runs, request.runs)
    runs, skipped = runs_with_epochs(runs, request.epochs)  # a mixed directory: notes
    check_trace_versions(runs)  # replays of a trace re-parsed since are refused (§7.3)
    for r in runs:
        if not r.replays:
            raise InputError(
                "no replay tables listed in its result.json (re-run `dsim run` for this run)",
                r.directory,
            )
    if request.policies is not None:
        present = {p for r in runs for p in r.replays}
        missing = [p for p in request.policies if p not in present]
        if missing:
            listed = ", ".join(f"{f}/{s}" for f, s in missing)
            raise UsageError(f"--policy {listed}: no such replay in the selected runs")
    summary = summarize_results(
        runs,
        epochs=request.epochs,
        warmup=request.warmup,
        threshold_s=request.threshold_s,
        policies=request.policies,
    )
    names = display_names(runs)
    summary["run"] = [
        names.get(d, r) for d, r in zip(summary["results"], summary["run"], strict=True)
    ]

    by_name = {names[str(r.directory)]: r for r in runs}
    add_spread(summary, by_name)
    chosen = timeline_runs(summary, request.timeline_run)
    timelines = {}
    reduced = {}
    for name in chosen:
        rows = summary[summary["run"] == name]
        t_run = by_name[name]
        t_policies = [
            (str(f), str(s)) for f, s in zip(rows["fetch_align"], rows["start_align"], strict=True)
        ]
        if BASELINE in t_run.replays and BASELINE not in t_policies:
            t_policies.insert(0, BASELINE)
        timelines[name], ranks = _timeline_replays(t_run, t_policies, rows.iloc[0])
        if ranks is not None:
            reduced[name] = ranks
    attributions = run_attributions(summary, by_name, request.traces, over_time=chosen)
    utilisation = {}
    for name in chosen:
        frame = next(iter(timelines[name].values()))
        per_iteration = run_utilisation(by_name[name], request.traces, frame)
        if per_iteration is not None:
            utilisation[name] = per_iteration
    first_row = summary[summary["run"] == chosen[0]].iloc[0]
    infos = {str(r.directory): r.info for r in runs}
    notes = [*skipped, *scan.notes(runs)]
    answer = build_answer(
        summary,
        infos,
        attributions={
            str(by_name[name].directory): a.table
            for name, a in attributions.items()
            if a.table is not None
        },
        notes=notes,
        result_runs=runs,
    )
    answer = with_headlines(answer, headlines(summary, answer.verdicts, request.traces, infos))
    view = ReportView(
        timelines=timelines,
        threshold_s=float(first_row["threshold_s"]),
        selection=selection_text(first_row),
        sources=[str(p) for p in request.results],
        attributions={name: attributions[name] for name in chosen},
        utilisation=utilisation,
        tune=tune_tables(runs, names),
        reduced=reduced,
    )
    matching = len(_matching(summary, request.timeline_run))
    if matching > len(chosen):
        notes.append(
            f"timeline, CDF and attribution of {len(chosen)} of {counted(matching, 'run')} (the "
            "largest "
            "predicted gains); choose others with --timeline-run GLOB"
        )
    return answer, view, notes


def tune_tables(runs: list[ResultRun], names: dict[str, str]) -> dict[str, pd.DataFrame]:
    """Display name → the run's ``dsim tune`` table beside its results, where one exists.

    A table that cannot be read is left out (the report's other sections do not
    depend on it); ``dsim tune`` rewrites it.
    """
    from dsim.app.tune import TUNE_DIR
    from dsim.io.parquetio import read_table

    tables: dict[str, pd.DataFrame] = {}
    seen: set[Path] = set()
    for r in runs:  # model variants of a run share its table: shown once, under the first
        run = r.info.trace.name if r.info.trace is not None else r.name
        path = r.directory.parent / TUNE_DIR / f"{run}.parquet"
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        label = names.get(str(r.directory), run)
        try:
            tables[label] = read_table(path, remedy="re-run `dsim tune`").to_pandas()
        except InputError:
            continue
    return tables


def run_utilisation(run: ResultRun, traces: Path, frame: pd.DataFrame) -> pd.DataFrame | None:
    """GPU utilisation per iteration of ``frame`` (a replay's selected rows), from the
    replayed trace's ``gpu_util.parquet``; None without one (or with another trace)."""
    import pandas as pd

    from dsim.sources.gpuutil import iteration_means

    trace_dir, _ = find_trace(run.name, run.info, traces)
    if trace_dir is None:
        return None
    try:
        tables = read_replayed(trace_dir, run.info)
    except InputError:  # re-parsed meanwhile: not the trace replayed
        return None
    if tables.gpu_util is None or tables.gpu_util.num_rows == 0:
        return None
    train = tables.train
    long = pd.DataFrame(
        {
            "epoch": train["epoch"].to_numpy(),
            "iteration": train["iteration"].to_numpy(),
            "gpu": train["gpu"].to_numpy(),
            "util": iteration_means(tables.gpu_util, train),
        }
    )
    wide = long.pivot(index=["epoch", "iteration"], columns="gpu", values="util")
    wide.columns = [f"util_pct_gpu{g}" for g in wide.columns]
    keys = pd.MultiIndex.from_arrays([frame["epoch"], frame["iteration"]])
    return wide.reindex(keys).reset_index(drop=True)


def run_attributions(
    summary: pd.DataFrame,
    by_name: dict[str, ResultRun],
    traces: Path,
    over_time: list[str],
) -> dict[str, RunAttribution]:
    """Per shown run, the attribution the page shows, over the summary's selection.

    From the run's trace when ``find_trace`` finds the one replayed (with "who was
    last" over time for the runs of ``over_time``); else from the recorded
    ``attribution.parquet`` when its selection is the summary's; else absent, saying
    why. Model variants of one run share one trace, which is read once.
    """
    from dsim.render.html import RunAttribution

    recorded = read_attributions(dict.fromkeys(r.directory.parent for r in by_name.values()))
    computed: dict[tuple[str, tuple[int, ...], int], tuple[Any, Any] | str] = {}
    out: dict[str, RunAttribution] = {}
    for name, run in by_name.items():
        rows = summary[summary["run"] == name]
        if rows.empty:
            continue
        epochs, warmup = _epochs_of(rows.iloc[0]), int(rows.iloc[0]["warmup"])
        selection = (",".join(str(e) for e in epochs), warmup)
        trace_dir, why = find_trace(run.name, run.info, traces)
        if trace_dir is not None:
            key = (str(trace_dir), tuple(epochs), warmup)
            if key not in computed:
                try:
                    computed[key] = trace_attribution(run.name, trace_dir, epochs, warmup, run.info)
                except DsimError as exc:
                    computed[key] = str(exc)
            result = computed[key]
            if isinstance(result, str):
                # A run without fetch records: `dsim run` attributed it by its stalls (no
                # figures: they need fetches), which gives the verdict's lines.
                table, _ = _recorded(recorded, run, selection)
                out[name] = RunAttribution(table, None, absent=result, absent_over_time=result)
                continue
            attribution, last = result
            out[name] = RunAttribution(
                attribution_table([attribution], [selection]),
                last if name in over_time else None,
                source=f"trace {trace_dir}",
            )
            continue
        no_time = f"who was last over time needs the run's trace, and {why}"
        table, absent = _recorded(recorded, run, selection)
        if table is None:
            absent = f"{absent}, and {why}"
        out[name] = RunAttribution(table, None, absent=absent, absent_over_time=no_time)
        if table is not None:
            out[name].source = str(run.directory.parent / "attribution.parquet")
    return out


def _recorded(
    recorded: pd.DataFrame, run: ResultRun, selection: tuple[str, int]
) -> tuple[pd.DataFrame | None, str]:
    """The run's rows of the ``attribution.parquet`` beside its results, when they cover
    the report's selection; else None and why not."""
    where = run.directory.parent / "attribution.parquet"
    if recorded.empty:
        return None, f"{where} does not exist"
    rows = recorded[
        (recorded["run"] == run.name) & (recorded["results_dir"] == str(run.directory.parent))
    ]
    if rows.empty:
        return None, f"{where} has no rows of this run"
    epochs, warmup = str(rows["selected_epochs"].iloc[0]), int(rows["warmup"].iloc[0])
    if (epochs, warmup) != (selection[0], selection[1]):
        return None, (
            f"{where} covers epochs {epochs}, warm-up {warmup}, not this report's selection"
        )
    return rows.drop(columns=["results_dir"]).reset_index(drop=True), ""


def predicted_gain(summary: pd.DataFrame) -> dict[str, float]:
    """Each run's largest predicted speed-up over its non-measured policies (NaN: none)."""
    out: dict[str, float] = {}
    for name, rows in summary.groupby("run", sort=False):
        other = rows[(rows["fetch_align"] != BASELINE[0]) | (rows["start_align"] != BASELINE[1])]
        values = other["speedup"].dropna()
        out[str(name)] = float(values.max()) if len(values) else float("nan")
    return out


def _matching(summary: pd.DataFrame, pattern: str | None) -> list[str]:
    shown = [str(n) for n in dict.fromkeys(summary["run"])]
    if pattern is None:
        return shown
    # a display name (RUN@pipeline, RUN [dir]) or the bare run name before the variant
    return [n for n in shown if fnmatchcase(n, pattern) or fnmatchcase(n.split("@")[0], pattern)]


def timeline_runs(summary: pd.DataFrame, pattern: str | None) -> list[str]:
    """Runs of the timeline and CDF switcher: those ``pattern`` (a glob) matches, largest
    predicted gain first (runs without one last, by name), at most ``MAX_TIMELINE_RUNS``."""
    matches = _matching(summary, pattern)
    if not matches:
        shown = ", ".join(str(n) for n in dict.fromkeys(summary["run"]))
        raise UsageError(f"--timeline-run {pattern}: matches none of the runs shown: {shown}")
    gain = predicted_gain(summary)

    def key(name: str) -> tuple[bool, float]:
        g = gain.get(name, float("nan"))
        return (g != g, -g if g == g else 0.0)

    return sorted(matches, key=key)[:MAX_TIMELINE_RUNS]


def add_spread(summary: pd.DataFrame, by_name: dict[str, ResultRun]) -> None:
    """``<metric>_p10`` / ``_p90`` of iteration time and stall per row, from the replay
    tables over the iterations the summary used (the bars' whiskers)."""
    from dsim.render.figures.spread import quantile_spread

    lows: dict[str, list[float]] = {"iteration_s": [], "stall_s": []}
    highs: dict[str, list[float]] = {"iteration_s": [], "stall_s": []}
    for _, row in summary.iterrows():
        policy = (str(row["fetch_align"]), str(row["start_align"]))
        table = by_name[str(row["run"])].read(policy, gpus=False)  # no per-GPU column
        mask = selection_mask(
            table.column("epoch").to_numpy(),
            table.column("iteration").to_numpy(),
            _epochs_of(row),
            int(row["warmup"]),
        )
        for metric in lows:
            lo, hi = quantile_spread(table.column(metric).to_numpy()[mask])
            lows[metric].append(lo)
            highs[metric].append(hi)
    for metric in lows:
        summary[f"{metric}_p10"] = lows[metric]
        summary[f"{metric}_p90"] = highs[metric]
