"""Assemble the what-if report: one self-contained HTML page.

plotly.js is embedded once (with the first figure), so the file opens
offline, can be mailed or attached to an issue, and never fetches anything.
The page is a pure function of the summary DataFrame and the timeline run's
replays; writing it (atomically) is the command's job.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from dsim import __version__
from dsim.render import figures
from dsim.render.columns import POLICY, SUMMARY_TABLE, header
from dsim.render.figures.ranks import MANY_RANKS, TOP_RANKS
from dsim.render.units import time_number, time_text, time_unit
from dsim.replay.policies import BASELINE, Policy, is_stall_alignment
from dsim.verdict import original_line

if TYPE_CHECKING:
    from dsim.attribution import LastOverTime
    from dsim.verdict import Verdict

PLOT_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "toImageButtonOptions": {"scale": 2},
    # a short toolbar: less to collide with at 800 px; zoom, pan, reset and download stay
    "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"],
}

CSS = """
:root { --fg:#1d2433; --muted:#5b6475; --line:#e3e6ec; --accent:#1f77b4; --bg:#f6f7f9; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font:14px/1.5 system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif; }
header { background:#1d2433; color:#fff; padding:22px 32px 18px; }
header h1 { margin:0 0 4px; font-size:24px; font-weight:600; }
header p { margin:2px 0; color:#c9d0dc; }
main { max-width:1280px; margin:0 auto; padding:8px 24px 40px; }
section { background:#fff; border:1px solid var(--line); border-radius:8px;
  margin:18px 0; padding:14px 18px; }
section h2 { margin:4px 0 2px; font-size:18px; font-weight:600; }
section p.note { margin:0 0 8px; color:var(--muted); }
table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
th, td { padding:4px 7px; border-bottom:1px solid var(--line); text-align:right;
  white-space:nowrap; }
th { background:#f0f2f6; font-weight:600; white-space:normal; vertical-align:bottom; }
#summary-table { font-size:13px; }
td.run { white-space:normal; }
#runs-table td.run { max-width:420px; }
th:first-child, td:first-child, th.text, td.text { text-align:left; }
tr.baseline td { background:#fafbfc; color:var(--muted); }
tr.run-start td { border-top:2px solid #c7ccd6; background:#eef3fa; font-weight:600;
  padding-top:7px; }
td.better { color:#1a7f37; font-weight:600; }
td.worse { color:#b42318; }
.table-wrap { overflow-x:auto; }
nav a { color:#9cc7ff; margin-right:14px; text-decoration:none; }
p.switch { margin:4px 0 8px; }
p.switch select { font:inherit; max-width:100%; }
#verdict .verdict { margin:8px 0 12px; }
#verdict p { margin:2px 0; }
#verdict p.run { color:var(--muted); font-size:13px; overflow-wrap:anywhere; }
#verdict p.say { font-weight:600; font-size:15px; }
#verdict ul.blame { margin:2px 0 0; padding-left:22px; }
p.absent { color:var(--muted); background:#fafbfc; border:1px dashed var(--line);
  padding:10px 14px; }
p.source { color:var(--muted); font-size:12px; margin:0 0 4px; overflow-wrap:anywhere; }
footer { color:var(--muted); text-align:center; font-size:12px; padding:8px 0 24px; }
"""


@dataclass
class ReportInput:
    """Everything the page shows, already selected and summarised."""

    summary: pd.DataFrame
    timelines: Mapping[str, Mapping[Policy, pd.DataFrame]]
    """Runs offered in the timeline and CDF switcher, the one shown first first."""
    threshold_s: float
    selection: str  # e.g. "epochs 1–4, warm-up iterations ≤ 10 skipped"
    sources: Sequence[str] = ()
    verdicts: Sequence[Verdict] = ()
    """One per run with a verdict (``dsim.verdict.run_verdicts``), in summary order."""
    blame: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Run → attribution lines (``dsim.attribution.describe``), shown under its verdict."""
    attributions: Mapping[str, RunAttribution] = field(default_factory=dict)
    """Run of ``timelines`` → what its attribution figures show, or why they are absent."""
    utilisation: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    """Run of ``timelines`` → GPU utilisation per iteration (``util_pct_gpu<N>``), rows in
    its replays' order, for runs whose trace has utilisation samples (SPEC §1.9)."""
    headlines: Mapping[str, Verdict] = field(default_factory=dict)
    """Results directory → the more accurate model's verdict, shown first (``dsim run``'s
    headline, ``dsim.app.headline``), with the original verdict's number below it."""
    tune: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    """Run → its ``dsim tune`` table (``<results>/tune/<run>.parquet``), where one was written."""


@dataclass
class RunAttribution:
    """One run's attribution for the page: the table rows (``attribution_table``) and who
    was last over time, each None with a sentence saying why it is absent."""

    table: pd.DataFrame | None
    over_time: LastOverTime | None
    absent: str = ""  # why ``table`` is None
    absent_over_time: str = ""  # why ``over_time`` is None
    source: str = ""  # where the numbers come from (a trace, or attribution.parquet)


def _run_cell(name: object) -> str:
    """A run name that may wrap after its underscores (names are long and have no spaces)."""
    return html.escape(str(name)).replace("_", "_<wbr>")


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


def summary_table_html(summary: pd.DataFrame) -> str:
    """The summary as an HTML table: mean ± std (sample std), what-if columns vs measured."""
    head = [(header(c), "text" if c is POLICY else "") for c in SUMMARY_TABLE]
    out = ["<table id='summary-table'><thead><tr>"]
    out += [f"<th class='{cls}'>{html.escape(name)}</th>" for name, cls in head]
    out.append("</tr></thead><tbody>")
    previous = None
    for _, row in summary.iterrows():
        policy = figures.policy_of(row)
        classes = ["policy"]
        if policy == BASELINE:
            classes.append("baseline")
        if row["run"] != previous:
            out.append(
                f"<tr class='run-start'><td class='text run' colspan='{len(head)}'>"
                f"{_run_cell(row['run'])}</td></tr>"
            )
        previous = row["run"]
        speed_txt = _num(row.get("speedup"), 3)
        speed_cls = ""
        if policy != BASELINE and speed_txt != "–":
            speed_cls = (
                "better" if row["speedup"] > 1.0005 else "worse" if row["speedup"] < 0.9995 else ""
            )
        stall_txt, stall_cls = _signed_time(row.get("stall_change_s"), lower_is_better=True)
        eff_txt, eff_cls = _signed(row.get("effective_delay_change_pts"), 1, lower_is_better=True)
        cells = [
            (html.escape(f"{policy[0]} / {policy[1]}"), "text"),
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
        ]
        out.append(f"<tr class='{' '.join(classes)}'>")
        out += [f"<td class='{cls}'>{text}</td>" for text, cls in cells]
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def runs_table_html(summary: pd.DataFrame, labels: Mapping[str, str] | None = None) -> str:
    """One line per run: what was trained, on how many GPUs, with which loader settings.

    ``labels`` (short run labels of the figures) adds a column, so that a figure's
    label leads to the run's full name.
    """
    summary = summary.copy()
    if labels:
        summary["__label"] = [labels.get(r, r) for r in summary["run"]]
    fields = [
        ("run", "run", "text run"),
        ("label in figures", "__label", "text"),
        ("dataset", "dataset", "text"),
        ("augmentation", "augmentation", "text"),
        ("model", "model", "text"),
        ("GPUs", "gpus", ""),
        ("batch size", "batch_size", ""),
        ("workers", "workers", ""),
        ("threads", "threads", ""),
        ("epochs used", "selected_epochs", ""),
        ("iterations used", "iterations", ""),
    ]
    fields = [f for f in fields if f[1] in summary.columns]
    runs = summary.drop_duplicates("run", keep="first")
    out = ["<table id='runs-table'><thead><tr>"]
    out += [f"<th class='{cls}'>{html.escape(label)}</th>" for label, _, cls in fields]
    out.append("</tr></thead><tbody>")
    for _, row in runs.iterrows():
        out.append("<tr>")
        for _, column, cls in fields:
            value = row[column]
            if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
                value = ", ".join(str(v) for v in list(value))
            elif _missing(value):
                value = "–"
            elif isinstance(value, float) and value.is_integer():
                value = int(value)
            text = _run_cell(value) if column == "run" else html.escape(str(value))
            out.append(f"<td class='{cls}'>{text}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _figure_div(fig: go.Figure, div_id: str, *, first: bool) -> str:
    return pio.to_html(
        fig,
        full_html=False,
        include_plotlyjs=first,
        div_id=div_id,
        config=PLOT_CONFIG,
        validate=False,
    )


def _section(anchor: str, title: str, note: str, body: str) -> str:
    return (
        f"<section id='{anchor}'><h2>{html.escape(title)}</h2>"
        f"<p class='note'>{note}</p>{body}</section>"
    )


def _best_policy(summary: pd.DataFrame, run: str) -> Policy | None:
    """The policy the timeline opens on: the run's largest predicted speedup."""
    rows = summary[(summary["run"] == run) & summary["speedup"].notna()]
    rows = rows[(rows["fetch_align"] != BASELINE[0]) | (rows["start_align"] != BASELINE[1])]
    if rows.empty:
        return None
    return figures.policy_of(rows.loc[rows["speedup"].idxmax()])


def run_labels(data: ReportInput) -> dict[str, str]:
    """Short labels of the page's runs (titles, axes); full names stay on hover and in tables."""
    return figures.short_labels(list(dict.fromkeys(data.summary["run"])))


def report_figures(data: ReportInput) -> list[tuple[str, go.Figure]]:
    """The page's figures with their div ids, in page order.

    The timeline and the CDF of the first run of ``data.timelines`` are
    ``fig-timeline`` and ``fig-cdf``; those of the others ``fig-timeline-<i>`` and
    ``fig-cdf-<i>``, shown by the page's run switcher; likewise the attribution
    figures ``fig-attr-workers`` and ``fig-attr-last`` (only where there is data).
    """
    labels = run_labels(data)
    out: list[tuple[str, go.Figure]] = []
    for i, run in enumerate(dict.fromkeys(data.summary["run"])):
        out.append((f"fig-whatif-{i}", figures.heatmap_figure(data.summary, run, labels[run])))
    for i, (run, table) in enumerate(data.tune.items()):
        out.append((f"fig-tune-{i}", figures.tune_figure(table, labels.get(run, run))))
    out.append(("fig-bars", figures.bars_figure(data.summary)))
    out.append(("fig-scaling", figures.scaling_figure(data.summary)))
    selection = f", {data.selection}" if data.selection else ""
    threshold = data.threshold_s
    # the timeline and the CDF of one run show the same iterations and threshold
    for i, (run, replays) in enumerate(data.timelines.items()):
        suffix = "" if i == 0 else f"-{i}"
        best = _best_policy(data.summary, run)
        label = labels.get(run, run)
        timeline = figures.timeline_figure(
            label,
            replays,
            threshold_s=threshold,
            selection=selection,
            selected=best,
            utilisation=data.utilisation.get(run),
        )
        cdf = figures.cdf_figure(label, replays, threshold_s=threshold, selection=selection)
        out += [(f"fig-timeline{suffix}", timeline), (f"fig-cdf{suffix}", cdf)]
    for i, run in enumerate(data.timelines):
        suffix = "" if i == 0 else f"-{i}"
        attribution = data.attributions.get(run)
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


SWITCH_SCRIPT = """
<script>
function dsimShowRun(index) {
  document.querySelectorAll('.run-view').forEach(function (view) {
    var shown = view.dataset.run === String(index);
    view.style.display = shown ? '' : 'none';
    if (shown) {
      view.querySelectorAll('.js-plotly-plot').forEach(function (d) {
        if (window.Plotly) { Plotly.Plots.resize(d); }
      });
    }
  });
  document.querySelectorAll('select.run-switch').forEach(function (s) { s.value = index; });
}
</script>
"""
"""Shows one run's timeline and CDF and hides the others' (both sections at once);
a figure drawn while hidden is resized when it is shown."""


def _switcher(data: ReportInput, labels: Mapping[str, str]) -> str:
    """A select over the runs of ``data.timelines``; none when there is only one."""
    if len(data.timelines) < 2:
        return ""
    options = "".join(
        f"<option value='{i}' title='{html.escape(run)}'>{html.escape(labels.get(run, run))}"
        "</option>"
        for i, run in enumerate(data.timelines)
    )
    return (
        "<p class='switch'><label>run: <select class='run-switch' "
        f"onchange='dsimShowRun(this.value)'>{options}</select></label> "
        "(ordered by predicted gain; the first has the largest)</p>"
    )


def _run_views(data: ReportInput, divs: Mapping[str, str], kind: str) -> str:
    """Each timeline run's figure of ``kind`` in its own view; only the first is shown."""
    views = []
    for i, run in enumerate(data.timelines):
        div_id = f"fig-{kind}" + ("" if i == 0 else f"-{i}")
        hidden = "" if i == 0 else " style='display:none'"
        views.append(
            f"<div class='run-view' data-run='{i}' title='{html.escape(run)}'{hidden}>"
            f"{divs[div_id]}</div>"
        )
    return "".join(views)


def verdict_html(data: ReportInput, labels: Mapping[str, str]) -> str:
    """Per run: its verdict sentence and, below it, its attribution lines: the terminal's
    text (``dsim run``, ``dsim summarize``), from the same functions."""
    if not data.verdicts:
        return (
            "<p class='absent'>No verdict: the rows shown hold no policy but actual / actual "
            "(or no measured run) to compare.</p>"
        )
    several = len(data.verdicts) > 1
    out = []
    for v in data.verdicts:
        run = (
            f"<p class='run' title='{html.escape(v.run)}'>{html.escape(labels.get(v.run, v.run))}"
            "</p>"
            if several
            else ""
        )
        head = data.headlines.get(v.results) if v.results is not None else None
        said = v if head is None else head
        original = [] if head is None else [original_line(v)]  # dsim.verdict
        caveats = [f"caveat: {note}" for note in said.caveats]
        lines = "".join(
            f"<li>{html.escape(line)}</li>"
            for line in (*original, *caveats, *data.blame.get(v.run, ()))
        )
        blame = f"<ul class='blame'>{lines}</ul>" if lines else ""
        out.append(
            f"<div class='verdict'>{run}<p class='say'>{html.escape(said.text)}</p>{blame}</div>"
        )
    return "".join(out)


def _attribution_views(data: ReportInput, divs: Mapping[str, str]) -> str:
    """Each switcher run's attribution figures, or the sentences saying why they are absent."""
    views = []
    for i, run in enumerate(data.timelines):
        suffix = "" if i == 0 else f"-{i}"
        a = data.attributions.get(run)
        parts = []
        if a is not None and a.source:
            parts.append(f"<p class='source'>from {html.escape(a.source)}</p>")
        for kind, why in (
            ("workers", "No worker heatmap" if a is None else a.absent),
            ("last", "No “who was last” figure" if a is None else a.absent_over_time),
        ):
            div = divs.get(f"fig-attr-{kind}{suffix}")
            if div is not None:
                parts.append(div)
                continue
            what = "worker heatmap" if kind == "workers" else "“who was last” figure"
            reason = why or "no attribution was computed for this run"
            parts.append(f"<p class='absent'>No {what} for this run: {html.escape(reason)}.</p>")
        hidden = "" if i == 0 else " style='display:none'"
        views.append(
            f"<div class='run-view' data-run='{i}' title='{html.escape(run)}'{hidden}>"
            f"{''.join(parts)}</div>"
        )
    return "".join(views)


def _stall_only_note(summary: pd.DataFrame) -> str:
    """What the stall what-ifs are, when the report shows any (runs without fetch records)."""
    if not summary["fetch_align"].map(is_stall_alignment).any():
        return ""
    return (
        " Rows <b>stall-min</b> and <b>stall-avg</b> (the stall-only model, for runs without "
        "fetch records such as profiler traces) replace every GPU's stall by the minimum or "
        "the mean over GPUs; alignments of fetches and starts, and the start and fetch diffs "
        "(–), need the fetch records such runs lack."
    )


def render_report(data: ReportInput, figs: list[tuple[str, go.Figure]] | None = None) -> str:
    """The complete HTML document."""
    figs = report_figures(data) if figs is None else figs
    divs = {div_id: _figure_div(fig, div_id, first=i == 0) for i, (div_id, fig) in enumerate(figs)}
    runs = list(dict.fromkeys(data.summary["run"]))
    labels = run_labels(data)
    switch = _switcher(data, labels)
    whatif = "".join(v for k, v in divs.items() if k.startswith("fig-whatif-"))
    threshold = f"{data.threshold_s:g} s"
    sections = [
        _section(
            "verdict",
            "Verdict",
            "What would help each run most, by how much, and whose loader is late "
            "(the lines <code>dsim run</code> and <code>dsim summarize</code> print first); "
            "the replay model named is the one the verdict uses.",
            verdict_html(data, labels),
        ),
        _section(
            "runs",
            "Runs",
            "What each run trained and which iterations the statistics use.",
            f"<div class='table-wrap'>{runs_table_html(data.summary, labels)}</div>",
        ),
        _section(
            "whatif",
            "What if the data loaders were aligned?",
            "Each cell replays the run with every GPU's fetch duration (rows) and fetch start "
            "(columns) aligned to the minimum or the average over GPUs; <b>actual / actual</b> "
            f"is the measured run. Effective delay: share of iterations whose delay between GPUs "
            f"exceeds {html.escape(threshold)}. Speedup: measured mean iteration time ÷ replayed."
            + _stall_only_note(data.summary),
            whatif,
        ),
        *(
            [
                _section(
                    "tune",
                    "Which loader settings?",
                    "<code>dsim tune</code>'s sweep of <code>num_workers</code> × "
                    "<code>prefetch_factor</code> with the pipeline model: predicted speed-up "
                    "over the recorded run, the loader alone and with the best alignment; "
                    "★ the cheapest setting within 2 % of the best (docs/SPEC.md §5.7).",
                    "".join(v for k, v in divs.items() if k.startswith("fig-tune-")),
                )
            ]
            if data.tune
            else []
        ),
        _section(
            "bars",
            "Iteration time and training stall",
            "Mean per iteration of each policy, divided by the run's measured mean iteration "
            "time (so runs of any scale compare: 1 is the measured run, the stall bar is the "
            "share of it spent waiting). Whiskers span the 10th to the 90th percentile of the "
            "iterations (never below zero); the seconds are in the hover.",
            divs["fig-bars"],
        ),
        _section(
            "scaling",
            "Throughput and scaling",
            "Samples per second of the whole job under each policy (per-rank batch size ÷ mean "
            "iteration time × GPUs), and, for runs of the same job at several GPU counts, "
            "weak-scaling efficiency against the job's smallest run (1 is perfect). Where the "
            "data cannot tell, the panel says why (docs/SPEC.md §5.5).",
            divs["fig-scaling"],
        ),
        _section(
            "timeline",
            "Timeline",
            "Stall of every GPU per iteration, measured and replayed "
            "under the policy chosen in the drop-down, and the delay between GPUs with the "
            f"effective-delay threshold; above {MANY_RANKS} GPUs, their spread (median, "
            f"10th–90th percentile, max) and by name the {TOP_RANKS} most often waited for. "
            "Drag to zoom, double-click to reset.",
            switch + _run_views(data, divs, "timeline"),
        ),
        _section(
            "cdf",
            "Delay distribution",
            "Fraction of iterations whose delay between GPUs is at most x; the part right of "
            "the threshold is the effective delay. The run is the one picked above.",
            switch + _run_views(data, divs, "cdf"),
        ),
        _section(
            "attribution",
            "Whose loader is late",
            "Per GPU and DataLoader worker, the share of all fetch time above each "
            "iteration's median fetch (which workers produce the slowest fetches); below, "
            "per window of iterations, the share in which each GPU's "
            "fetch finished last (one colour throughout: a fixed straggler; changing colours: "
            f"it wanders). Above {MANY_RANKS} GPUs the {TOP_RANKS} most often last are named "
            "and the others grouped. The run is the one picked above.",
            switch + _attribution_views(data, divs),
        ),
        _section(
            "summary",
            "Summary",
            "Mean ± sample standard deviation per iteration; changes are relative to the "
            "measured run (actual / actual).",
            f"<div class='table-wrap'>{summary_table_html(data.summary)}</div>",
        ),
    ]
    sources = ", ".join(html.escape(s) for s in data.sources)
    nav = "".join(
        f"<a href='#{a}'>{t}</a>"
        for a, t in (
            ("verdict", "Verdict"),
            ("runs", "Runs"),
            ("whatif", "What-if"),
            *([("tune", "Settings")] if data.tune else []),
            ("bars", "Time &amp; stall"),
            ("scaling", "Throughput"),
            ("timeline", "Timeline"),
            ("cdf", "Delay CDF"),
            ("attribution", "Attribution"),
            ("summary", "Summary"),
        )
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>dsim what-if report — {html.escape(', '.join(runs[:3]))}"
        f"{' …' if len(runs) > 3 else ''}</title>"
        f"<style>{CSS}</style>{SWITCH_SCRIPT}</head><body>"
        "<header><h1>dsim what-if report</h1>"
        f"<p>{len(runs)} run{'s' if len(runs) != 1 else ''}; {html.escape(data.selection)}; "
        f"effective-delay threshold {html.escape(threshold)}.</p>"
        f"<p>Results: {sources or '–'} · made by dsim {__version__}</p>"
        f"<nav>{nav}</nav></header><main>{''.join(sections)}</main>"
        "<footer>Replays follow docs/SPEC.md §4.1 of dsim: each iteration is replayed on its "
        "own from the measured fetch and training times.</footer></body></html>\n"
    )
