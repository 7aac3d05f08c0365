"""Assemble the what-if report: one self-contained HTML page.

The page comes from Jinja2 templates shipped in the package
(``dsim/render/templates``) with autoescape on: every run name, note and
verdict is text, whatever it holds (a run named ``a<b>`` or the throughput
note's ``b<B>``); only plotly's figure divs and the ``<wbr>`` break points of
names are marked as markup here. plotly.js is embedded once (with the first
figure), so the file opens offline, can be mailed or attached to an issue, and
never fetches anything.
The page is a pure function of the summary DataFrame and the timeline run's
replays; writing it (atomically) is the command's job.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import jinja2
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from markupsafe import Markup, escape

from dsim import __version__
from dsim.analysis.attribution import FIXED_STRAGGLER_SHARE
from dsim.analysis.verdict import original_line
from dsim.render import figures
from dsim.render.columns import POLICY, SUMMARY_TABLE, header
from dsim.render.figures.ranks import MANY_RANKS, TOP_RANKS, ReducedRanks
from dsim.render.units import time_number, time_text, time_unit
from dsim.replay.policies import BASELINE, Policy, is_stall_alignment
from dsim.spec import COMMAND as SPEC_COMMAND
from dsim.spec import cite
from dsim.words import counted

if TYPE_CHECKING:
    from dsim.analysis.attribution import LastOverTime
    from dsim.app.answer import Answer

PLOT_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "toImageButtonOptions": {"scale": 2},
    # a short toolbar: less to collide with at 800 px; zoom, pan, reset and download stay
    "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"],
}


@dataclass
class ReportView:
    """What the page shows beyond the answer (``dsim.app.answer.Answer``: the summary rows,
    verdicts, headlines and attribution lines, which every output shares): the figures'
    data and the page's header, already selected."""

    timelines: Mapping[str, Mapping[Policy, pd.DataFrame]]
    """Runs offered in the timeline and CDF switcher, the one shown first first."""
    threshold_s: float
    selection: str  # e.g. "epochs 1–4, warm-up iterations ≤ 10 skipped"
    sources: Sequence[str] = ()
    attributions: Mapping[str, RunAttribution] = field(default_factory=dict)
    """Run of ``timelines`` → what its attribution figures show, or why they are absent."""
    utilisation: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    """Run of ``timelines`` → GPU utilisation per iteration (``util_pct_gpu<N>``), rows in
    its replays' order, for runs whose trace has utilisation samples (SPEC §1.9)."""
    tune: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    """Run → its ``dsim tune`` table (``<results>/tune/<run>.parquet``), where one was written."""
    reduced: Mapping[str, ReducedRanks] = field(default_factory=dict)
    """Run of ``timelines`` with more than ``MANY_RANKS`` ranks → its per-GPU stalls reduced
    while reading (``ReducedRanks``); its ``timelines`` frames then hold only the named
    ranks' stall columns."""


@dataclass
class RunAttribution:
    """One run's attribution for the page: the table rows (``attribution_table``) and who
    was last over time, each None with a sentence saying why it is absent."""

    table: pd.DataFrame | None
    over_time: LastOverTime | None
    absent: str = ""  # why ``table`` is None
    absent_over_time: str = ""  # why ``over_time`` is None
    source: str = ""  # where the numbers come from (a trace, or attribution.parquet)


TEMPLATES = "templates"
"""Package data beside this module (``pyproject.toml`` ships it in the wheel)."""

MODEL_FOOTERS = {
    "per-iteration": "§4.1 (per-iteration: each iteration replayed on its own from the measured "
    "fetch and training times)",
    "pipeline": "§4.2 (pipeline: each GPU's DataLoader pipeline replayed across iterations, "
    "calibrated on the measured run)",
    "stall-only": "§4.3 (stall-only: what-ifs from the training stalls alone, for runs without "
    "fetch records)",
}
"""The spec section of each replay model, cited by the footer of a page that shows it."""


@functools.cache
def _environment() -> jinja2.Environment:
    """The report's templates with autoescape on: a run name, a note or a verdict that holds
    ``<b>`` is shown as text; only what Python marks as ``Markup`` is markup."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dsim.render", TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a name missing from the context is an error
        keep_trailing_newline=True,
    )
    return env


def breakable(name: object) -> Markup:
    """A name, escaped, that may wrap after its underscores (run names are long and have
    no spaces): ``<wbr>`` is the only markup added."""
    return Markup("_<wbr>").join(escape(str(name)).split("_"))


def _missing(value: object) -> bool:
    """None or NaN: pandas gives either for an absent value, and both print as a dash."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _num(value: object, digits: int = 4) -> str:
    if _missing(value):
        return "–"
    return f"{float(value):.{digits}f}"


def _mean_std(row: Mapping[str, object], metric: str) -> str:
    """``12.3 ± 0.4 ms`` / ``1.2345 ± 0.0100 s``: the unit rule of ``dsim.render.units``
    (ms below one second), the std in the mean's unit."""
    mean, std = row.get(f"{metric}_mean"), row.get(f"{metric}_std")
    if _missing(mean):
        return "–"
    unit = time_unit([mean])
    if _missing(std):
        return time_text(mean, unit)
    return f"{time_number(mean, unit)} ± {time_text(std, unit)}"


def _signed_time(value: object, *, lower_is_better: bool) -> tuple[str, str]:
    """A signed change of seconds in the unit rule's unit (``+12.3 ms``), and its class."""
    if _missing(value):
        return "–", ""
    unit = time_unit([value])
    text, cls = _signed(
        float(value) * (1000 if unit == "ms" else 1),
        1 if unit == "ms" else 4,
        lower_is_better=lower_is_better,
    )
    return f"{text} {unit}", cls


def _signed(value: object, digits: int, *, lower_is_better: bool) -> tuple[str, str]:
    if _missing(value):
        return "–", ""
    v = float(value)
    if abs(v) < 0.5 * 10**-digits:
        return f"{0:.{digits}f}", ""
    good = v < 0 if lower_is_better else v > 0
    return f"{v:+.{digits}f}", "better" if good else "worse"


def summary_rows(summary: pd.DataFrame) -> tuple[list[tuple[str, str]], list[dict[str, object]]]:
    """The summary table's head (name, class) and rows: mean ± std (sample std), what-if
    columns vs measured; a row opening a run carries its name (``run_start``)."""
    head = [(header(c), "text" if c is POLICY else "") for c in SUMMARY_TABLE]
    rows: list[dict[str, object]] = []
    previous = None
    for _, row in summary.iterrows():
        policy = figures.policy_of(row)
        classes = ["policy"] + (["baseline"] if policy == BASELINE else [])
        speed_txt = _num(row.get("speedup"), 3)
        speed_cls = ""
        if policy != BASELINE and speed_txt != "–":
            speed_cls = (
                "better" if row["speedup"] > 1.0005 else "worse" if row["speedup"] < 0.9995 else ""
            )
        stall_txt, stall_cls = _signed_time(row.get("stall_change_s"), lower_is_better=True)
        eff_txt, eff_cls = _signed(row.get("effective_delay_change_pts"), 1, lower_is_better=True)
        rows.append(
            {
                "run_start": row["run"] != previous,
                "run": breakable(row["run"]),
                "css": " ".join(classes),
                "cells": [
                    (f"{policy[0]} / {policy[1]}", "text"),
                    (str(int(row["iterations"])), ""),
                    (_mean_std(row, "iteration_s"), ""),
                    (_mean_std(row, "stall_s"), ""),
                    (_mean_std(row, "delay_s"), ""),
                    (_mean_std(row, "start_diff_s"), ""),
                    (_mean_std(row, "fetch_diff_s"), ""),
                    (_num(row.get("effective_delay_pct"), 1), ""),
                    (speed_txt, speed_cls),
                    (stall_txt, stall_cls),
                    (eff_txt, eff_cls),
                ],
            }
        )
        previous = row["run"]
    return head, rows


RUNS_FIELDS = (
    # label, column, class, hint (the header's title)
    ("run", "run", "text run", ""),
    ("label in figures", "__label", "text", ""),
    ("dataset", "dataset", "text", ""),
    ("augmentation", "augmentation", "text", ""),
    ("model", "model", "text", ""),
    ("GPUs", "gpus", "", ""),
    (
        "batch per GPU",
        "batch_size_rank",
        "",
        f"samples per GPU and iteration ({cite('5.5')}: the loader line, the Throughput "
        "field, or the run name's global b<B> ÷ GPUs)",
    ),
    ("workers", "workers", "", ""),
    ("threads", "threads", "", ""),
    ("epochs used", "selected_epochs", "", ""),
    ("iterations used", "iterations", "", ""),
)
"""The runs table's columns. The run name's ``b<B>`` is the job's global batch, not a
GPU's: the table shows the per-GPU batch the throughput uses (``batch_size_rank``)."""


def _cell_text(value: object) -> str:
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        return ", ".join(str(v) for v in list(value))  # type: ignore[call-overload]
    if _missing(value):
        return "–"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def runs_rows(
    summary: pd.DataFrame, labels: Mapping[str, str] | None = None
) -> tuple[list[dict[str, str]], list[list[dict[str, object]]]]:
    """One line per run: what was trained, on how many GPUs, with which loader settings.

    ``labels`` (short run labels of the figures) adds a column, so that a figure's
    label leads to the run's full name.
    """
    summary = summary.copy()
    if labels:
        summary["__label"] = [labels.get(r, r) for r in summary["run"]]
    fields = [f for f in RUNS_FIELDS if f[1] in summary.columns]
    runs = summary.drop_duplicates("run", keep="first")
    head = [{"label": label, "css": css, "hint": hint} for label, _, css, hint in fields]
    rows = []
    for _, row in runs.iterrows():
        cells: list[dict[str, object]] = []
        for _, column, css, _ in fields:
            text = _cell_text(row[column])
            shown = breakable(text) if column in ("run", "__label") else text
            cells.append({"text": shown, "css": css})
        rows.append(cells)
    return head, rows


def _render_tables(macro: str, *args: object) -> str:
    module = _environment().get_template("tables.html.j2").module
    return str(getattr(module, macro)(*args))


def summary_table_html(summary: pd.DataFrame) -> str:
    """The summary as an HTML table (the page's ``#summary`` section)."""
    return _render_tables("summary_table", *summary_rows(summary))


def runs_table_html(summary: pd.DataFrame, labels: Mapping[str, str] | None = None) -> str:
    """The runs as an HTML table (the page's ``#runs`` section)."""
    return _render_tables("runs_table", *runs_rows(summary, labels))


def _figure_div(fig: go.Figure, div_id: str, *, first: bool) -> Markup:
    """plotly's own markup for one figure (trusted: the figure's texts are escaped where
    the figures are built, ``dsim.render.figures``)."""
    return Markup(
        pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=first,
            div_id=div_id,
            config=PLOT_CONFIG,
            validate=False,
        )
    )


def _best_policy(answer: Answer, run: str) -> Policy | None:
    """The policy the timeline opens on: the run's best by the answer's tie rule (the
    verdict's), else — when no policy beats the measured run — its largest speed-up."""
    found = next((r for r in answer.runs if r.run == run), None)
    if found is not None and found.best is not None and found.best != BASELINE:
        return found.best
    summary = answer.summary
    rows = summary[(summary["run"] == run) & summary["speedup"].notna()]
    rows = rows[(rows["fetch_align"] != BASELINE[0]) | (rows["start_align"] != BASELINE[1])]
    if rows.empty:
        return None
    return figures.policy_of(rows.loc[rows["speedup"].idxmax()])


def run_labels(summary: pd.DataFrame) -> dict[str, str]:
    """Short labels of the page's runs (titles, axes); full names stay on hover and in tables."""
    return figures.short_labels(list(dict.fromkeys(summary["run"])))


def report_figures(answer: Answer, view: ReportView) -> list[tuple[str, go.Figure]]:
    """The page's figures with their div ids, in page order.

    The timeline and the CDF of the first run of ``view.timelines`` are
    ``fig-timeline`` and ``fig-cdf``; those of the others ``fig-timeline-<i>`` and
    ``fig-cdf-<i>``, shown by the page's run switcher; likewise the attribution
    figures ``fig-attr-workers`` and ``fig-attr-last`` (only where there is data).
    """
    summary = answer.summary
    labels = run_labels(summary)
    out: list[tuple[str, go.Figure]] = []
    for i, run in enumerate(dict.fromkeys(summary["run"])):
        out.append((f"fig-whatif-{i}", figures.heatmap_figure(summary, run, labels[run])))
    for i, (run, table) in enumerate(view.tune.items()):
        out.append((f"fig-tune-{i}", figures.tune_figure(table, labels.get(run, run))))
    out.append(("fig-bars", figures.bars_figure(summary)))
    out.append(("fig-scaling", figures.scaling_figure(summary)))
    selection = f", {view.selection}" if view.selection else ""
    threshold = view.threshold_s
    # the timeline and the CDF of one run show the same iterations and threshold
    for i, (run, replays) in enumerate(view.timelines.items()):
        suffix = "" if i == 0 else f"-{i}"
        label = labels.get(run, run)
        timeline = figures.timeline_figure(
            label,
            replays,
            threshold_s=threshold,
            selection=selection,
            selected=_best_policy(answer, run),
            utilisation=view.utilisation.get(run),
            reduced=view.reduced.get(run),
        )
        cdf = figures.cdf_figure(label, replays, threshold_s=threshold, selection=selection)
        out += [(f"fig-timeline{suffix}", timeline), (f"fig-cdf{suffix}", cdf)]
    for i, run in enumerate(view.timelines):
        suffix = "" if i == 0 else f"-{i}"
        attribution = view.attributions.get(run)
        if attribution is None or attribution.table is None or attribution.table.empty:
            continue
        if (attribution.table["worker"] < 0).all():  # by stalls alone: no fetches to draw
            continue
        label = labels.get(run, run)
        out.append((f"fig-attr-workers{suffix}", figures.workers_figure(attribution.table, label)))
        if attribution.over_time is not None:
            out.append(
                (
                    f"fig-attr-last{suffix}",
                    figures.last_figure(attribution.over_time, attribution.table, label),
                )
            )
    return out


def verdicts_view(answer: Answer, labels: Mapping[str, str]) -> list[dict[str, object]]:
    """Per run with a verdict: the sentence the terminal prints first (the headline where
    there is one, with the run's own verdict one line below it), its caveats and the
    run's attribution lines — all the answer's (``dsim.app.answer``), none recomputed."""
    out: list[dict[str, object]] = []
    for run in answer.runs:
        v = run.verdict
        if v is None:
            continue
        said = v if run.headline is None else run.headline
        original = [] if run.headline is None else [original_line(v)]  # dsim.analysis.verdict
        caveats = [f"caveat: {note}" for note in said.caveats]
        out.append(
            {
                "run": v.run,
                "label": labels.get(v.run, v.run),
                "text": said.text,
                "lines": [*original, *caveats, *run.attribution],
            }
        )
    return out


def verdict_html(answer: Answer, view: ReportView) -> str:
    """The ``#verdict`` section of the page, alone (tests, notebooks)."""
    page = render_report(answer, view, figs=[])
    return page.split("<section id='verdict'>", 1)[1].split("</section>", 1)[0]


def _attribution_parts(
    attribution: RunAttribution | None, divs: Mapping[str, Markup], suffix: str
) -> list[dict[str, object]]:
    """A switcher run's attribution figures, or the sentences saying why they are absent."""
    parts: list[dict[str, object]] = []
    for kind, what, why in (
        ("workers", "worker heatmap", None if attribution is None else attribution.absent),
        (
            "last",
            "“who was last” figure",
            None if attribution is None else attribution.absent_over_time,
        ),
    ):
        div = divs.get(f"fig-attr-{kind}{suffix}")
        reason = why or "no attribution was computed for this run"
        parts.append({"div": div, "what": what, "reason": reason})
    return parts


def _switch_runs(
    view: ReportView, divs: Mapping[str, Markup], labels: Mapping[str, str]
) -> list[dict[str, object]]:
    """The runs of the timeline/CDF/attribution switcher, each with its figures."""
    out: list[dict[str, object]] = []
    for i, run in enumerate(view.timelines):
        suffix = "" if i == 0 else f"-{i}"
        attribution = view.attributions.get(run)
        out.append(
            {
                "name": run,
                "label": labels.get(run, run),
                "timeline": divs.get(f"fig-timeline{suffix}", ""),
                "cdf": divs.get(f"fig-cdf{suffix}", ""),
                "source": attribution.source if attribution is not None else "",
                "attribution": _attribution_parts(attribution, divs, suffix),
            }
        )
    return out


def footer_text(summary: pd.DataFrame) -> str:
    """The footer: the spec sections of the replay models the page shows (per-iteration,
    pipeline, stall-only), not always the per-iteration one, and how to read them."""
    column = summary.get("replay_model", pd.Series(["per-iteration"] * len(summary)))
    models = [str(m) for m in dict.fromkeys(column.fillna("per-iteration"))]
    known = [MODEL_FOOTERS[m] for m in models if m in MODEL_FOOTERS]
    other = [m for m in models if m not in MODEL_FOOTERS]
    cited = "; ".join(known + [f"the {m} model" for m in other])
    return (
        f"Replays follow the specification of dsim {__version__}: {cited}. "
        f"Print a section with: {SPEC_COMMAND} SECTION (the spec ships with dsim)."
    )


def render_report(
    answer: Answer, view: ReportView, figs: list[tuple[str, go.Figure]] | None = None
) -> str:
    """The complete HTML document of an answer, from ``templates/report.html.j2``
    (autoescaped): the answer's summary, verdicts and attribution lines, with the figures
    and tables of ``view``."""
    summary = answer.summary
    figs = report_figures(answer, view) if figs is None else figs
    divs = {div_id: _figure_div(fig, div_id, first=i == 0) for i, (div_id, fig) in enumerate(figs)}
    runs = list(dict.fromkeys(summary["run"]))
    labels = run_labels(summary)
    threshold = f"{view.threshold_s:g} s"
    nav = [
        ("verdict", "Verdict"),
        ("runs", "Runs"),
        ("whatif", "What-if"),
        *([("tune", "Settings")] if view.tune else []),
        ("bars", "Time & stall"),
        ("scaling", "Throughput"),
        ("timeline", "Timeline"),
        ("cdf", "Delay CDF"),
        ("attribution", "Attribution"),
        ("summary", "Summary"),
    ]
    runs_head, runs_body = runs_rows(summary, labels)
    summary_head, summary_body = summary_rows(summary)
    context = {
        "title_runs": ", ".join(runs[:3]) + (" …" if len(runs) > 3 else ""),
        "run_count": counted(len(runs), "run"),
        "selection": view.selection,
        "threshold": threshold,
        "sources": ", ".join(view.sources),
        "version": __version__,
        "nav": nav,
        "verdicts": verdicts_view(answer, labels),
        "runs_fields": runs_head,
        "runs_rows": runs_body,
        "whatif": [v for k, v in divs.items() if k.startswith("fig-whatif-")],
        "stall_only": bool(summary["fetch_align"].map(is_stall_alignment).any()),
        "tune": [v for k, v in divs.items() if k.startswith("fig-tune-")],
        "figures": {k: divs.get(k, "") for k in ("fig-bars", "fig-scaling")},
        "switch_runs": _switch_runs(view, divs, labels),
        "many_ranks": MANY_RANKS,
        "top_ranks": TOP_RANKS,
        "fixed_share": f"{FIXED_STRAGGLER_SHARE:.0f} %",
        "summary_head": summary_head,
        "summary_rows": summary_body,
        "footer": footer_text(summary),
        "cite": cite,
    }
    return _environment().get_template("report.html.j2").render(context)
