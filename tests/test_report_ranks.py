"""Per-GPU figures at many ranks: the bands across GPUs, the named stragglers, the palette,
the labels; pure functions checked against hand counts, and the figures built from them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dsim.analysis.attribution import NONE, LastOverTime
from dsim.render.figures import last_figure, timeline_figure, workers_figure
from dsim.render.figures.ranks import (
    MANY_RANKS,
    TOP_RANKS,
    bucket_label,
    largest_share,
    percent_text,
    rank_bands,
    rank_buckets,
    stall_stragglers,
    top_ranks,
)
from dsim.render.figures.style import GPU_COLORS, OTHER_GPU_COLOR, gpu_color, rank_colors
from dsim.replay.policies import BASELINE


def test_rank_bands_are_the_quantiles_across_gpus_per_iteration() -> None:
    values = np.array(
        [
            [40.0, 0.0, 30.0, 10.0, 20.0],  # order across GPUs does not matter
            [5.0, 5.0, 5.0, 5.0, 5.0],
            [np.nan, 1.0, np.nan, 3.0, np.nan],  # GPUs without a value are left out
            [np.nan] * 5,
        ]
    )
    bands = rank_bands(values)
    # linear interpolation: the 10th percentile of 0, 10, 20, 30, 40 sits 0.4 of the way
    assert bands.p10[:3] == pytest.approx([4.0, 5.0, 1.2])
    assert bands.median[:3] == pytest.approx([20.0, 5.0, 2.0])
    assert bands.p90[:3] == pytest.approx([36.0, 5.0, 2.8])
    assert bands.max[:3] == pytest.approx([40.0, 5.0, 3.0])
    assert all(np.isnan(b[3]) for b in (bands.p10, bands.median, bands.p90, bands.max))
    assert len(rank_bands(np.zeros((0, 3))).median) == 0
    with pytest.raises(ValueError, match="iterations, GPUs"):
        rank_bands(np.zeros(3))


def test_largest_share_counts_only_a_rank_alone_at_the_top() -> None:
    values = np.array(
        [
            [1.0, 3.0, 2.0],
            [1.0, 3.0, 3.0],  # a tie: no one
            [5.0, 3.0, np.nan],
            [0.0, 9.0, 1.0],
        ]
    )
    assert largest_share(values) == pytest.approx([0.25, 0.5, 0.0])


def test_top_ranks_by_score_then_tiebreak_then_position_and_never_a_zero() -> None:
    primary = np.array([0.1, 0.5, 0.1, 0.0, 0.5, 0.0, 0.1])
    secondary = np.array([1.0, 2.0, 3.0, 0.0, 2.0, 4.0, 1.0])
    assert top_ranks(primary, secondary, 5).tolist() == [1, 4, 2, 0, 6]
    assert top_ranks(primary, secondary, 7).tolist() == [1, 4, 2, 0, 6, 5]  # never rank 3
    assert top_ranks(np.zeros(4), np.zeros(4), 3).tolist() == []
    with pytest.raises(ValueError, match="different lengths"):
        top_ranks(np.zeros(2), np.zeros(3))


def test_stall_stragglers_are_the_ranks_waited_for_most_often() -> None:
    rng = np.random.default_rng(1)
    stalls = rng.uniform(0.0, 0.01, size=(400, 40))
    stalls[:200, 17] += 1.0  # the largest stall in half of the iterations
    stalls[200:300, 3] += 1.0
    stalls[300:350, 29] += 1.0
    stalls[350:, 8] += 0.5  # as often as 29, but a smaller mean
    stalls[350:, 33] += 0.5
    stalls[350:, 33] += stalls[350:, 8]  # 33 always above 8
    top = stall_stragglers(stalls, 4).tolist()
    assert top == [17, 3, 33, 29]


def test_palette_distinct_for_named_ranks_grey_for_the_rest() -> None:
    assert rank_colors(8, []) == [gpu_color(j) for j in range(8)]  # few ranks: unchanged
    colors = rank_colors(32, [15, 7, 30])
    assert (
        colors[15] == GPU_COLORS[0] and colors[7] == GPU_COLORS[1] and colors[30] == GPU_COLORS[2]
    )
    assert len({colors[j] for j in (15, 7, 30)}) == 3
    assert {c for j, c in enumerate(colors) if j not in (15, 7, 30)} == {OTHER_GPU_COLOR}
    assert OTHER_GPU_COLOR not in GPU_COLORS


def test_percent_text_keeps_a_decimal_where_whole_numbers_read_zero() -> None:
    values = (0.0, 0.000123, 0.0483, 0.44, 0.996, 3.125, 9.96, 70.0)
    assert [percent_text(v) for v in values] == [
        "0 %",
        "0.00012 %",
        "0.048 %",
        "0.44 %",
        "1.0 %",
        "3.1 %",
        "10 %",
        "70 %",
    ]
    assert percent_text(float("nan")) == "–"


def test_rank_buckets_cover_every_rank_once_in_order() -> None:
    gpus = [g for g in range(100) if g not in (4, 50)]
    buckets = rank_buckets(gpus, 16)
    assert len(buckets) == 16 and [g for b in buckets for g in b] == gpus
    assert max(map(len, buckets)) - min(map(len, buckets)) <= 1
    assert rank_buckets([1, 2], 16) == [[1], [2]]
    assert bucket_label([0, 1, 2, 3]) == "GPUs 0–3 (4 ranks)" and bucket_label([7]) == "GPU 7"


def _replays(gpus: int, n: int = 300, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for k, policy in enumerate((BASELINE, ("min", "min"), ("avg", "avg"))):
        stall = rng.exponential(0.01, size=(n, gpus))
        stall[:, gpus - 2] += 0.2 / (k + 1)  # the one everybody waits for
        frame = {"epoch": np.zeros(n, int), "iteration": np.arange(n)}
        frame["delay_s"] = stall.max(axis=1) - stall.min(axis=1)
        frame.update({f"stall_s_gpu{g}": stall[:, g] for g in range(gpus)})
        out[policy] = pd.DataFrame(frame)
    return out


def test_timeline_at_many_ranks_draws_bands_and_named_ranks_not_every_gpu() -> None:
    few = timeline_figure("r", _replays(MANY_RANKS), threshold_s=0.03)
    assert sum(t.name.startswith("GPU ") for t in few.data) == 3 * MANY_RANKS  # unchanged
    counts = set()
    for gpus in (MANY_RANKS + 1, 64, 256):
        fig = timeline_figure("r", _replays(gpus), threshold_s=0.03)
        counts.add(len(fig.data))
        named = [t for t in fig.data if t.name.startswith("GPU ")]
        assert len(named) == 3 * TOP_RANKS  # measured panel and two policies
        assert named[0].name.startswith(f"GPU {gpus - 2} (")  # and the share of iterations
        band = next(t for t in fig.data if t.name == "p10–p90 over GPUs")
        assert band.fill == "tonexty"
        measured = _replays(gpus)[BASELINE][[f"stall_s_gpu{g}" for g in range(gpus)]]
        median = next(t for t in fig.data if t.name == "median over GPUs")
        assert np.allclose(median.y, np.median(measured.to_numpy(), axis=1), atol=1e-6)
        assert f"{gpus:,} GPUs drawn as their spread" in fig.layout.title.text
    assert len(counts) == 1  # as many traces at 256 ranks as at 17
    twelve = timeline_figure("r", _replays(12), threshold_s=0.03).data[:12]  # measured panel
    colors = {t.name: t.line.color for t in twelve}
    assert colors["GPU 10"] == GPU_COLORS[0]  # the one waited for: the first colour
    assert sum(c == OTHER_GPU_COLOR for c in colors.values()) == 12 - TOP_RANKS
    assert len({c for c in colors.values() if c != OTHER_GPU_COLOR}) == TOP_RANKS
    quiet = {p: r.assign(**{c: 0.0 for c in r.columns if c.startswith("stall_s_gpu")})
             for p, r in _replays(32).items()}  # fmt: skip
    fig = timeline_figure("r", quiet, threshold_s=0.03)
    assert not [t for t in fig.data if t.name.startswith("GPU ")]
    assert "none named" in fig.layout.title.text


STRAGGLERS_64 = {63: 30.0, 4: 20.0, 9: 10.0, 11: 5.0, 20: 3.0, 30: 2.0}  # 30 % ties
STRAGGLERS_12 = {11: 30.0, 4: 20.0, 9: 10.0, 2: 5.0, 7: 3.0, 5: 2.0}


def _attribution(
    gpus: int, stragglers: dict[int, float], workers: int = 2
) -> tuple[pd.DataFrame, LastOverTime]:
    """One run's attribution rows and who was last per window, with ``stragglers``'s
    ranks last in that share of the iterations (the same in every window)."""
    rng = np.random.default_rng(3)
    last = np.zeros(gpus)
    last[list(stragglers)] = list(stragglers.values())
    rows = []
    share = rng.dirichlet(np.ones(gpus * workers)) * 100
    for g in range(gpus):
        for w in range(workers):
            rows.append(
                {
                    "gpu": g,
                    "worker": w,
                    "fetches": 10,
                    "fetch_s_mean": 1.0 + g / 100,
                    "excess_s": share[g * workers + w] / 10,
                    "excess_share_pct": share[g * workers + w],
                    "gpu_last_pct": last[g],
                    "straggler": NONE,
                    "straggler_gpu": pd.NA,
                }
            )
    windows = 4
    over = LastOverTime(
        gpus=np.arange(gpus),
        window=25,
        first=np.arange(windows) * 25,
        size=np.full(windows, 25),
        last_pct=np.tile(last, (windows, 1)),
        tie_pct=np.full(windows, 100.0 - last.sum()),
        epoch=np.zeros((windows, 2), int),
        iteration=np.column_stack([np.arange(windows) * 25, np.arange(windows) * 25 + 24]),
    )
    return pd.DataFrame(rows), over


def test_worker_heatmap_at_many_ranks_names_the_stragglers_and_sums_the_rest() -> None:
    table, _ = _attribution(64, STRAGGLERS_64)
    heat = workers_figure(table, "r").data[0]
    assert len(heat.y) == TOP_RANKS + 16
    assert list(heat.y[:TOP_RANKS]) == [
        "GPU 63 · last 30 %",
        "GPU 4 · last 20 %",
        "GPU 9 · last 10 %",
        "GPU 11 · last 5.0 %",
        "GPU 20 · last 3.0 %",
    ]
    # 59 others in 16 rows: 11 of 4 ranks, then 3 each
    assert list(heat.y[TOP_RANKS : TOP_RANKS + 2]) == [
        "GPUs 0–3 (4 ranks) · last 0 %",
        "GPUs 5–8 (4 ranks) · last 0 %",  # GPU 4 is named
    ]
    assert heat.y[-1] == "GPUs 60–62 (3 ranks) · last 0 %"
    z = np.asarray(heat.z)
    sizes = [1] * TOP_RANKS + [4] * 11 + [3] * 5
    # a range's cell is its mean rank: times the ranks, every share is counted once
    assert (z * np.array(sizes)[:, None]).sum() == pytest.approx(table["excess_share_pct"].sum())
    assert z[TOP_RANKS, 1] == pytest.approx(
        table.query("gpu in [0, 1, 2, 3] and worker == 1")["excess_share_pct"].mean()
    )
    assert z[1, 0] == pytest.approx(table.query("gpu == 4 and worker == 0")["excess_share_pct"])
    for value, text in zip(z.ravel(), np.asarray(heat.text).ravel(), strict=True):
        assert text == percent_text(value)  # one decimal below 10 %: never all "0 %"
    assert any("." in t for t in np.asarray(heat.text).ravel())  # not "0 %" / "1 %" only
    few, _ = _attribution(MANY_RANKS, STRAGGLERS_12)
    assert len(workers_figure(few, "r").data[0].y) == MANY_RANKS  # a row per GPU


def test_last_figure_at_many_ranks_stacks_named_ranks_others_and_ties() -> None:
    table, over = _attribution(64, STRAGGLERS_64)
    bars = last_figure(over, table, "r").data
    assert [b.name for b in bars] == [
        "GPU 63 (30 % overall)",
        "GPU 4 (20 % overall)",
        "GPU 9 (10 % overall)",
        "GPU 11 (5.0 % overall)",
        "GPU 20 (3.0 % overall)",
        "59 other GPUs (2.0 % overall)",
        "no single last (tie)",
    ]
    assert np.allclose(np.sum([b.y for b in bars], axis=0), 100.0)
    assert bars[5].marker.color == OTHER_GPU_COLOR
    assert len({b.marker.color for b in bars[:5]}) == 5
    table12, over12 = _attribution(12, STRAGGLERS_12)
    bars12 = last_figure(over12, table12, "r").data
    assert len(bars12) == 13  # up to MANY_RANKS: a bar per GPU, grey beyond the named five
    colored = {b.name.split(" (")[0] for b in bars12 if b.marker.color != OTHER_GPU_COLOR}
    assert colored == {"GPU 11", "GPU 4", "GPU 9", "GPU 2", "GPU 7", "no single last"}
