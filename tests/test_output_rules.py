"""The rules every output shares (docs/SPEC.md §5 "One answer"): exact ties between policies
go to the simpler policy everywhere, and times print in ms below one second, s above."""

from __future__ import annotations

import os

import pandas as pd
from rich.console import Console
from test_terminal import one_run

from dsim.analysis.comparison import MetricDelta
from dsim.analysis.verdict import run_verdicts
from dsim.render.columns import METRICS, header
from dsim.render.html import summary_table_html
from dsim.render.insight import print_comparison
from dsim.render.terminal import BEST, marks, overview_table
from dsim.render.units import time_text, time_unit


def tied() -> pd.DataFrame:
    """One run whose avg/avg and min/min replays take exactly the same mean time, the best."""
    run = one_run()
    for policy in (("avg", "avg"), ("min", "min")):
        at = (run["fetch_align"] == policy[0]) & (run["start_align"] == policy[1])
        run.loc[at, "speedup"] = 4.0
        run.loc[at, "iteration_s_mean"] = 3.1123 / 4.0
    return run


def _text(renderable: object, width: int = 200) -> str:
    with open(os.devnull, "w") as sink:
        console = Console(file=sink, width=width, record=True, color_system=None)
        console.print(renderable)
        return console.export_text()


def test_an_exact_tie_goes_to_the_same_policy_in_verdict_table_and_overview() -> None:
    summary = tied()
    (verdict,) = run_verdicts(summary)
    assert verdict.best_policy == ("avg", "avg")  # as many aligned sides: POLICIES order
    best = [
        (r["fetch_align"], r["start_align"])
        for r, m in zip(summary.to_dict("records"), marks(summary), strict=True)
        if m == BEST
    ]
    assert best == [("avg", "avg")]  # the table's marker (was min/min: the last maximum)
    many = pd.concat([summary.assign(run=f"r{i}", results=f"/r/r{i}") for i in range(11)])
    rows = [line for line in _text(overview_table(many, 200)).splitlines() if "r3 " in line]
    assert rows and "avg/avg" in rows[0] and "min/min" not in rows[0]


def test_unit_rule_in_one_place() -> None:
    assert time_unit([0.2, 0.999]) == "ms" and time_unit([0.2, 1.0]) == "s"
    assert time_text(0.01234) == "12.3 ms" and time_text(1.23456) == "1.2346 s"
    assert time_text(-0.002, signed=True) == "-2.0 ms"


def test_compare_table_prints_sub_second_times_in_ms() -> None:
    class Comparison:  # the fields print_comparison reads
        before_run, after_run = "a", "b"
        deltas = (MetricDelta("iteration_s_mean", "iteration time", "s", 0.0123, 0.0100),)
        text, warnings = "said", ()

    with open(os.devnull, "w") as sink:
        console = Console(file=sink, width=200, record=True, color_system=None)
        print_comparison(Comparison(), console)
        out = console.export_text()
    assert "12.3 ms" in out and "10.0 ms" in out and "−2.3 ms (−19 %)" in out
    assert "0.0123" not in out


def test_html_summary_table_prints_sub_second_times_in_ms() -> None:
    page = summary_table_html(one_run())
    assert "512.3 ± 101.2 ms" in page  # delay, below a second
    assert "3.1123 ± 1.2345 s" in page  # the measured iteration time, above
    assert "0.5123 ±" not in page  # the delay mean as seconds
    assert all(header(c) == c.long for c in METRICS)  # cells carry the unit, not the header
