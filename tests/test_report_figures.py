"""Pure parts of the report's figures: run labels, whiskers, colours, scales, switcher order."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dsim.commands.report import timeline_runs
from dsim.errors import UsageError
from dsim.render.figures import (
    GPU_COLORS,
    POLICY_COLORS,
    bars_figure,
    gpu_color,
    heatmap_figure,
    policy_color,
    quantile_spread,
    short_labels,
    variant_text,
    whiskers,
)
from dsim.render.figures.style import MEASURED_DELAY_COLOR, REPLAYED_DELAY_COLOR

LONG = "fsNprepNloadNtrain_imagenet_randaugment_resnet50_epoch2_b256_worker8_thread0"


def test_short_labels_drop_shared_words_and_cut_in_the_middle() -> None:
    a = "base_imagenet_resnet50_b256_thread0"
    b = "base_openimage_resnet50_b256_thread0"
    assert short_labels([a, b]) == {a: "imagenet", b: "openimage"}
    label = short_labels([LONG])[LONG]
    assert len(label) == 28 and "…" in label
    assert label.startswith("fsNprep") and label.endswith("thread0")


def test_short_labels_spell_out_variants_and_stay_unique() -> None:
    names = [LONG, f"{LONG}@pipeline", f"{LONG}@pipeline-w8-p4", f"{LONG} [res2]"]
    labels = short_labels(names)
    assert labels[f"{LONG}@pipeline"].endswith(" · pipeline")
    assert labels[f"{LONG}@pipeline-w8-p4"].endswith(" · pipeline · 8 workers · prefetch 4")
    assert labels[f"{LONG} [res2]"].endswith("[res2]")
    assert len(set(labels.values())) == len(names)
    assert variant_text("pipeline-w16-p2") == "pipeline · 16 workers · prefetch 2"


def test_short_labels_never_merge_two_runs() -> None:
    # the middle cut would make these two alike: they keep their whole words
    a = "x" * 20 + "_gpus4_" + "y" * 20
    b = "x" * 20 + "_gpus8_" + "y" * 20
    labels = short_labels([a, b, "other"])
    assert labels[a] != labels[b]


def test_quantile_spread_and_whiskers_never_below_zero() -> None:
    values = np.array([0.0] * 95 + [10.0] * 5)  # skewed: the mean is above p90
    lo, hi = quantile_spread(values)
    assert (lo, hi) == (0.0, 0.0)
    mean = float(values.mean())
    below, above = whiskers(mean, lo, hi)
    assert below == pytest.approx(0.5) and above == 0.0
    assert mean - below >= 0.0
    assert quantile_spread(np.arange(11.0)) == pytest.approx((1.0, 9.0))
    assert all(math.isnan(v) for v in quantile_spread(np.array([np.nan])))
    assert whiskers(1.0, math.nan, math.nan) == (0.0, 0.0)


def test_colours_policies_colour_blind_safe_and_gpus_never_delay_colours() -> None:
    assert POLICY_COLORS[:8] == (
        "#000000",
        "#E69F00",
        "#56B4E9",
        "#009E73",
        "#0072B2",
        "#D55E00",
        "#CC79A7",
        "#F0E442",
    )
    assert len({policy_color(i) for i in range(9)}) == 9
    gpus = {gpu_color(i) for i in range(64)}
    assert gpus == set(GPU_COLORS)
    assert MEASURED_DELAY_COLOR not in gpus and REPLAYED_DELAY_COLOR not in gpus


def _summary(runs: dict[str, float], scale: dict[str, float]) -> pd.DataFrame:
    """Rows of ``runs`` (name → best speed-up) over three policies, iteration time ``scale``."""
    rows = []
    for run, best in runs.items():
        s = scale[run]
        for (f, st), speed in (
            (("actual", "actual"), 1.0),
            (("min", "min"), best),
            (("avg", "avg"), 1.0 + (best - 1) / 2),
        ):
            rows.append(
                {
                    "run": run,
                    "fetch_align": f,
                    "start_align": st,
                    "iteration_s_mean": s / speed,
                    "iteration_s_p10": 0.5 * s / speed,
                    "iteration_s_p90": 1.5 * s / speed,
                    "stall_s_mean": 0.2 * s / speed,
                    "speedup": speed,
                    "effective_delay_pct": 50.0 / speed,
                }
            )
    return pd.DataFrame(rows)


def test_bars_are_relative_to_each_runs_measured_iteration_time() -> None:
    summary = _summary({"small": 1.5, "big": 1.2}, {"small": 0.03, "big": 3.0})
    fig = bars_figure(summary)
    iteration = [t for t in fig.data if t.yaxis == "y"]
    measured = iteration[0]  # actual / actual first
    assert list(measured.y) == pytest.approx([1.0, 1.0])  # both runs on one scale
    best = next(t for t in iteration if t.name == "fetch min / start min")
    assert list(best.y) == pytest.approx([1 / 1.5, 1 / 1.2])
    assert list(best.error_y.arrayminus) == pytest.approx([0.5 / 1.5, 0.5 / 1.2])
    stall = [t for t in fig.data if t.yaxis == "y2"]
    assert all(a == 0 for t in stall for a in t.error_y.arrayminus)  # no quantiles: none
    assert "p10–p90" in fig.layout.title.text


def test_heatmaps_share_one_colour_scale_per_metric() -> None:
    summary = _summary({"a": 1.5, "b": 1.1}, {"a": 1.0, "b": 1.0})
    ranges = set()
    for run in ("a", "b"):
        fig = heatmap_figure(summary, run, label=run)
        ranges.add(tuple((t.name, t.zmin, t.zmax) for t in fig.data))
    assert len(ranges) == 1
    (delay, speed) = next(iter(ranges))
    assert delay == ("effective_delay_pct", 0.0, 50.0)
    assert speed == ("speedup", 1.0, 1.5)


def test_timeline_runs_largest_gain_first_and_globs() -> None:
    summary = _summary(
        {"r1": 1.1, "r2": 1.9, "r2@pipeline": 1.5, "x": 1.3},
        dict.fromkeys(["r1", "r2", "r2@pipeline", "x"], 1.0),
    )
    assert timeline_runs(summary, None) == ["r2", "r2@pipeline", "x", "r1"]
    assert timeline_runs(summary, "r*") == ["r2", "r2@pipeline", "r1"]
    assert timeline_runs(summary, "r2") == ["r2", "r2@pipeline"]  # a run and its variants
    with pytest.raises(UsageError, match="matches none"):
        timeline_runs(summary, "nope*")


def test_report_tables_show_markup_in_names_as_text() -> None:
    """A run name is a legal directory name and may hold ``<b>`` or ``&``: the page's
    templates escape it (issue #22); only the ``<wbr>`` break points are markup."""
    from dsim.render.html import breakable, runs_table_html

    assert str(breakable("a<b>_c&d")) == "a&lt;b&gt;_<wbr>c&amp;d"
    summary = pd.DataFrame(
        {
            "run": ["x<b>y_z"],
            "gpus": [4],
            "batch_size_rank": [32.0],
            "selected_epochs": ["0"],
            "iterations": [10],
        }
    )
    table = runs_table_html(summary, {"x<b>y_z": "<i>label</i>"})
    assert "<b>" not in table and "<i>" not in table
    assert "x&lt;b&gt;y_<wbr>z" in table and "&lt;i&gt;label&lt;/i&gt;" in table
    assert "batch per GPU</th>" in table and ">32<" in table  # not the name's global b<B>


def test_footer_cites_the_models_shown() -> None:
    from dsim.render.html import footer_text

    def models(*names: str) -> pd.DataFrame:
        return pd.DataFrame({"replay_model": list(names)})

    assert "§4.1" in footer_text(models("per-iteration"))
    pipeline = footer_text(models("pipeline"))
    assert "§4.2" in pipeline and "§4.1" not in pipeline
    stall = footer_text(models("stall-only"))
    assert "§4.3" in stall and "§4.1" not in stall
    assert "§4.1" in footer_text(pd.DataFrame({"run": ["a"]}))  # recorded before models


def test_log_delay_axis_draws_zero_delays_at_its_floor() -> None:
    """A log axis has no zero: the measured delay must not break into fragments, nor a
    replay without delay vanish (issue #22)."""
    from dsim.render.figures import timeline_figure
    from dsim.render.figures.timeline import log_floor

    n = 50
    delay = np.where(np.arange(n) % 2 == 0, 0.0, 2.0)  # p99 ≫ 20 × threshold: log axis
    frame = pd.DataFrame(
        {
            "epoch": np.zeros(n, int),
            "iteration": np.arange(n),
            "delay_s": delay,
            "stall_s_gpu0": delay,
            "stall_s_gpu1": np.zeros(n),
        }
    )
    replayed = frame.assign(delay_s=0.0, stall_s_gpu0=0.0)
    fig = timeline_figure(
        "r", {("actual", "actual"): frame, ("min", "min"): replayed}, threshold_s=0.03
    )
    floor = log_floor(0.03)
    delays = [t for t in fig.data if str(t.name).startswith("delay")]
    assert len(delays) == 2 and fig.layout.yaxis3.type == "log"
    for trace in delays:
        assert min(trace.y) == pytest.approx(floor) and np.isfinite(trace.y).all()
    assert list(delays[1].customdata[:, 2]) == [0.0] * n  # the hover keeps the true delay
    assert fig.layout.yaxis3.range[0] < np.log10(floor)
