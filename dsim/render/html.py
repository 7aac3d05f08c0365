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
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from dsim import __version__
from dsim.render import figures
from dsim.replay.policies import BASELINE, Policy

PLOT_CONFIG = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"scale": 2}}

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
footer { color:var(--muted); text-align:center; font-size:12px; padding:8px 0 24px; }
"""


@dataclass
class ReportInput:
    """Everything the page shows, already selected and summarised."""

    summary: pd.DataFrame
    timeline_run: str
    timeline_replays: Mapping[Policy, pd.DataFrame]
    threshold_s: float
    selection: str  # e.g. "epochs 1–4, warm-up iterations ≤ 10 skipped"
    sources: Sequence[str] = ()


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
    mean, std = row.get(f"{metric}_mean"), row.get(f"{metric}_std")
    if _missing(std):
        return _num(mean)
    return f"{_num(mean)} ± {_num(std)}"


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
    head = [
        ("policy (fetch / start)", "text"),
        ("iterations", ""),
        ("iteration time (s)", ""),
        ("training stall (s)", ""),
        ("delay (s)", ""),
        ("start diff (s)", ""),
        ("fetch diff (s)", ""),
        ("effective delay (%)", ""),
        ("speedup (×)", ""),
        ("stall change (s)", ""),
        ("eff. delay change (pts)", ""),
    ]
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
        stall_txt, stall_cls = _signed(row.get("stall_change_s"), 4, lower_is_better=True)
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


def runs_table_html(summary: pd.DataFrame) -> str:
    """One line per run: what was trained, on how many GPUs, with which loader settings."""
    fields = [
        ("run", "run", "text run"),
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


def report_figures(data: ReportInput) -> list[tuple[str, go.Figure]]:
    """The page's figures with their div ids, in page order."""
    out: list[tuple[str, go.Figure]] = []
    for i, run in enumerate(dict.fromkeys(data.summary["run"])):
        out.append((f"fig-whatif-{i}", figures.heatmap_figure(data.summary, run)))
    out.append(("fig-bars", figures.bars_figure(data.summary)))
    # the timeline and the CDF show the same run, iterations and threshold
    run, replays = data.timeline_run, data.timeline_replays
    selection = f", {data.selection}" if data.selection else ""
    threshold, best = data.threshold_s, _best_policy(data.summary, run)
    timeline = figures.timeline_figure(
        run, replays, threshold_s=threshold, selection=selection, selected=best
    )
    cdf = figures.cdf_figure(run, replays, threshold_s=threshold, selection=selection)
    out += [("fig-timeline", timeline), ("fig-cdf", cdf)]
    return out


def render_report(data: ReportInput, figs: list[tuple[str, go.Figure]] | None = None) -> str:
    """The complete HTML document."""
    figs = report_figures(data) if figs is None else figs
    divs = {div_id: _figure_div(fig, div_id, first=i == 0) for i, (div_id, fig) in enumerate(figs)}
    runs = list(dict.fromkeys(data.summary["run"]))
    whatif = "".join(v for k, v in divs.items() if k.startswith("fig-whatif-"))
    threshold = f"{data.threshold_s:g} s"
    sections = [
        _section(
            "runs",
            "Runs",
            "What each run trained and which iterations the statistics use.",
            f"<div class='table-wrap'>{runs_table_html(data.summary)}</div>",
        ),
        _section(
            "whatif",
            "What if the data loaders were aligned?",
            "Each cell replays the run with every GPU's fetch duration (rows) and fetch start "
            "(columns) aligned to the minimum or the average over GPUs; <b>actual / actual</b> "
            f"is the measured run. Effective delay: share of iterations whose delay between GPUs "
            f"exceeds {html.escape(threshold)}. Speedup: measured mean iteration time ÷ replayed.",
            whatif,
        ),
        _section(
            "bars",
            "Iteration time and training stall",
            "Mean per iteration; error bars show one sample standard deviation.",
            divs["fig-bars"],
        ),
        _section(
            "timeline",
            f"Timeline of {data.timeline_run}",
            "Stall of every GPU per iteration, measured and replayed under the policy chosen "
            "in the drop-down, and the delay between GPUs with the effective-delay threshold. "
            "Drag to zoom, double-click to reset.",
            divs["fig-timeline"],
        ),
        _section(
            "cdf",
            f"Delay distribution of {data.timeline_run}",
            "Fraction of iterations whose delay between GPUs is at most x; the part right of "
            "the threshold is the effective delay.",
            divs["fig-cdf"],
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
            ("runs", "Runs"),
            ("whatif", "What-if"),
            ("bars", "Time &amp; stall"),
            ("timeline", "Timeline"),
            ("cdf", "Delay CDF"),
            ("summary", "Summary"),
        )
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>dsim what-if report — {html.escape(', '.join(runs[:3]))}"
        f"{' …' if len(runs) > 3 else ''}</title>"
        f"<style>{CSS}</style></head><body>"
        "<header><h1>dsim what-if report</h1>"
        f"<p>{len(runs)} run{'s' if len(runs) != 1 else ''}; {html.escape(data.selection)}; "
        f"effective-delay threshold {html.escape(threshold)}.</p>"
        f"<p>Results: {sources or '–'} · made by dsim {__version__}</p>"
        f"<nav>{nav}</nav></header><main>{''.join(sections)}</main>"
        "<footer>Replays follow docs/SPEC.md §4.1 of dsim: each iteration is replayed on its "
        "own from the measured fetch and training times.</footer></body></html>\n"
    )
