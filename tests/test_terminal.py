"""The terminal table at fixed console widths: fits, never cuts a number or a run name."""

from __future__ import annotations

import os
import re

import pandas as pd
import pytest
from rich.console import Console

from dsim.render.terminal import (
    BEST,
    SLOWER,
    column_unit,
    fmt_seconds,
    marks,
    print_summary,
    wrap_words,
)
from dsim.replay.policies import KNOWN

NAME = "fsNprepNloadNtrain_imagenet_randaugment_resnet50_epoch2_b256_worker8_thread0"
SPEEDUPS = [1.0, 2.38, 1.56, 1.04, 0.99, 2.78, 3.00, 2.31, 2.59]  # avg/avg slower, min/actual best


def one_run(name: str = NAME, results: str = "/r") -> pd.DataFrame:
    rows = []
    for (f, s), sp in zip([(f, s) for f in KNOWN for s in KNOWN], SPEEDUPS, strict=True):
        rows.append(
            {
                "run": name,
                "results": f"{results}/{name}",
                "gpus": 4,
                "iterations": 851,
                "fetch_align": f,
                "start_align": s,
                "iteration_s_mean": 3.1123 / sp,
                "iteration_s_std": 1.2345,
                "stall_s_mean": 2.2311 / sp,
                "stall_s_std": 0.5123,
                "delay_s_mean": 0.5123,
                "delay_s_std": 0.1012,
                "start_diff_s_mean": 0.0101,
                "start_diff_s_std": 0.0021,
                "fetch_diff_s_mean": 0.3012,
                "fetch_diff_s_std": 0.1012,
                "effective_delay_pct": 43.9 / sp,
                "speedup": sp,
                "effective_delay_change_pts": 43.9 / sp - 43.9,
                "selected_epochs": "1",
                "warmup": 10,
                "threshold_s": 0.03,
            }
        )
    return pd.DataFrame(rows)


def printed(summary: pd.DataFrame, width: int, **kw: object) -> str:
    with open(os.devnull, "w") as sink:
        console = Console(width=width, record=True, color_system=None, file=sink)
        print_summary(summary, console, **kw)
    return console.export_text()


@pytest.mark.parametrize("width", [60, 100, 200])
def test_table_fits_and_cuts_nothing(width: int) -> None:
    text = printed(one_run(), width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), max(map(len, lines))
    assert "…" not in text  # no number, header or name cut
    # the run name is broken only after a separator, and whole when joined
    title = []
    for line in lines:
        if title and not line.strip():
            break
        if line.startswith("fsNprep") or title:
            title.append(line)
    full = f"{NAME} (4 GPUs, 851 iterations)"
    at = 0
    for line in title:  # each line is the next piece of the title, cut at a separator
        piece = line.strip()
        assert full.startswith(piece, at), (piece, full[at:])
        at += len(piece)
        assert at == len(full) or full[at - 1] in "_@-/.," or full[at] == " ", line
        at += full[at : at + 1] == " "
    assert at == len(full)
    # every policy, its speed-up and the mean iteration time in full
    assert "3.1123" in text and "2.38×" in text
    assert re.search(r"min/actual .*3\.00×.*best", text)
    assert re.search(r"avg/avg .*0\.99×.*slower", text)


def test_layouts_by_width() -> None:
    wide, medium, narrow = printed(one_run(), 200), printed(one_run(), 100), printed(one_run(), 60)
    # one line per policy at 200 columns; mean and ± on two lines below
    assert re.search(r"actual/actual +3\.1123 ±1\.2345", wide)
    assert re.search(r"actual/actual +3\.1123 +2\.2311 ", medium)
    assert re.search(r"\n +±1\.2345 +±0\.5123", medium)
    assert "fetch diff" in medium and "fetch diff" not in narrow  # fewer columns at 60


def test_sub_second_columns_in_ms() -> None:
    text = printed(one_run(), 200)
    assert "delay (ms)" in text and "512.3 ±101.2" in text
    assert "iter. time (s)" in text
    assert column_unit([0.2, 0.999]) == "ms" and column_unit([0.2, 1.0]) == "s"
    assert fmt_seconds(0.01234, "ms") == "12.3" and fmt_seconds(1.23456, "s") == "1.2346"


def test_marks() -> None:
    assert marks(one_run()) == ["", "", "", "", SLOWER, "", BEST, "", ""]
    flat = one_run().assign(speedup=1.0)
    assert marks(flat) == [""] * 9  # nothing helps: no best


def test_many_runs_print_an_overview() -> None:
    many = pd.concat([one_run(f"{NAME}_{i:03d}", f"/r{i}") for i in range(100)], ignore_index=True)
    text = printed(many, 100)
    lines = text.splitlines()
    assert len(lines) < 400  # the tables would be ~3,000 lines
    assert all(len(line) <= 100 for line in lines)
    joined = text.replace("\n", "")
    assert all(f"thread0_{i:03d}" in joined for i in range(100))
    assert "min/actual" in text and "3.00×" in text and "--full" in text
    full = printed(many.head(9 * 12), 100, full=True)
    assert full.count("actual/actual") == 12 + 1  # and the caption
    assert "--full" not in printed(many.head(9 * 10), 100)  # ten runs: tables


def test_the_overview_names_each_rows_model_and_marks_a_loader_what_if() -> None:
    """Issue #22: above ten runs the overview had no model column, so a run's per-iteration
    and pipeline rows looked alike and a loader what-if's replayed time read as measured."""
    runs = [one_run(f"{NAME}_{i:03d}", f"/r{i}") for i in range(10)]
    pipe = one_run(f"{NAME}_000", "/p").assign(
        replay_model="pipeline", loader_workers=2, loader_prefetch_factor=2, loader_changed=False
    )
    what_if = one_run(f"{NAME}_000", "/w").assign(
        replay_model="pipeline", loader_workers=8, loader_prefetch_factor=2, loader_changed=True
    )
    many = pd.concat([*runs, pipe, what_if], ignore_index=True)
    text = printed(many, 120)
    header = next(line for line in text.splitlines() if line.lstrip().startswith("run"))
    assert "model" in header.split()
    models = [line.split()[1] for line in text.splitlines() if "_resnet50_" in line]
    assert models == ["per-iter."] * 10 + ["pipeline"] * 2  # the what-if's: "pipeline w8 p2*"
    assert text.count("pipeline w8 p2*") == 1 and text.count("pipeline  ") == 1
    caption = " ".join(text.split())
    assert "* a loader what-if: its iter. and stall are the replay under those settings" in caption
    assert "* a loader what-if" not in " ".join(printed(pd.concat([*runs, pipe]), 120).split())
    assert all(len(line) <= 100 for line in printed(many, 100).splitlines())


def test_wrap_words_never_inside_a_word() -> None:
    assert wrap_words("aaa_bbb_ccc", 8) == ["aaa_bbb_", "ccc"]
    assert wrap_words("x (4 GPUs, 2 iterations)", 12) == ["x (4 GPUs, 2", "iterations)"]
    assert wrap_words("abcdefghij", 4) == ["abcdefghij"]  # no separator: left whole


def test_run_title_says_where_the_loader_settings_came_from() -> None:
    from dsim.render.terminal import _run_title

    row = {"run": "r", "gpus": 4, "replay_model": "pipeline", "loader_workers": 4,
           "loader_prefetch_factor": 2, "loader_changed": False}  # fmt: skip
    implied = _run_title({**row, "loader_source": "implied"})
    assert implied.endswith(
        "4 workers, prefetch 2 (workers inferred from worker ids, prefetch PyTorch's default: "
        "assumed))"
    )
    assert _run_title({**row, "loader_source": "log"}).endswith("(as logged: LOADER lines))")
    assert _run_title({**row, "loader_changed": True}).endswith("prefetch 2 (what-if))")
