"""The fidelity harness's pure parts: cost tables, index layout, plan, metrics, adapter.

Pairs, cells, statistics and verdicts: tests/test_fidelity_compare.py.

The physical runs themselves are covered by tests/test_fidelity_smoke.py
(needs PyTorch); these need neither torch nor a DDP job.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, run_dsim_in_process

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dsim.analysis.summary import summarize_metrics
from validation.indexing import Layout, TableSampler
from validation.metrics import error, run_metrics
from validation.predict import predict_per_iteration, predict_pipeline
from validation.regimes import REGIMES, SLEEP_REGIMES, align_table, cost_table
from validation.report import BEGIN, END, replace_block
from validation.sweep import VARIANTS, plan


def test_layout_round_trip_and_bounds() -> None:
    lay = Layout(epochs=2, iterations=5, ranks=3, batch_size=4)
    seen = set()
    for e in range(2):
        for i in range(5):
            for r in range(3):
                for j in range(4):
                    index = lay.encode(e, i, r, j)
                    assert lay.decode(index) == (e, i, r, j)
                    seen.add(index)
    assert seen == set(range(len(lay)))
    with pytest.raises(ValueError):
        lay.decode(len(lay))


def test_sampler_gives_each_rank_its_batches_in_order() -> None:
    lay = Layout(epochs=2, iterations=3, ranks=2, batch_size=2)
    per_rank = []
    for rank in range(2):
        sampler = TableSampler(lay, rank)
        sampler.set_epoch(1)
        indices = list(sampler)
        assert len(indices) == len(sampler) == 6
        cells = [lay.decode(i)[:3] for i in indices]
        assert cells == [(1, b, rank) for b in range(3) for _ in range(2)]
        per_rank.append(set(indices))
    assert not per_rank[0] & per_rank[1]
    with pytest.raises(ValueError):
        TableSampler(lay, 0).set_epoch(2)


def test_cost_table_is_seeded_skewed_and_aligned() -> None:
    regime = REGIMES["balanced"]
    table = cost_table(regime, 2, 400, 4, seed=3)
    assert table.shape == (2, 400, 4) and (table > 0).all()
    assert np.array_equal(table, cost_table(regime, 2, 400, 4, seed=3))
    assert not np.array_equal(table, cost_table(regime, 2, 400, 4, seed=4))
    means = table.mean(axis=(0, 1))
    assert means[-1] > means[0] * (1 + regime.skew / 2)  # the last rank is the slow one
    lo, mid = align_table(table, "min"), align_table(table, "mean")
    assert (lo == table.min(axis=2, keepdims=True)).all()
    assert np.allclose(mid, table.mean(axis=2, keepdims=True))
    assert align_table(table, "none") is table
    with pytest.raises(ValueError):
        align_table(table, "max")


def test_plan_has_every_run_once_a_first_and_its_repeat_last() -> None:
    runs = plan(list(SLEEP_REGIMES), [1, 2, 4], set(VARIANTS))  # the legacy plan
    names = [r.name for r in runs]
    assert len(names) == len(set(names)) == len(SLEEP_REGIMES) * (3 * 4 + 2)
    block = names[:4]
    assert block == ["heavy_w1_p2_none", "heavy_w1_p2_min", "heavy_w1_p2_mean",
                     "heavy_w1_p2_none_repeat"]  # fmt: skip
    assert "heavy_w2_p1_none" in names and "heavy_w1_p1_none" not in names
    assert [r.name for r in plan(["balanced"], [2], set())] == ["balanced_w2_p2_none"]


def test_errors_are_relative_for_times_absolute_otherwise() -> None:
    assert error("iteration_ms", 110.0, 100.0) == pytest.approx(10.0)
    assert error("epoch_s", 9.0, 10.0) == pytest.approx(-10.0)
    assert error("delay_ms", 5.0, 3.0) == pytest.approx(2.0)
    assert error("effective_delay_pct", 10.0, 40.0) == pytest.approx(-30.0)
    assert error("stall_ms", None, 3.0) is None


def test_run_metrics_select_like_dsims_summary() -> None:
    rng = np.random.default_rng(0)
    epoch = np.repeat([0, 1, 2], 30)
    iteration = np.tile(np.arange(30), 3)
    it, stall, delay = rng.random((3, 90)) * 0.06
    ours = run_metrics(epoch, iteration, it, stall, delay)
    mask = np.isin(epoch, [1, 2]) & (iteration > 10)
    metrics = {"iteration_s": it, "stall_s": stall, "delay_s": delay}
    metrics |= {"fetch_diff_s": it, "start_diff_s": it}
    theirs = summarize_metrics(metrics, mask, 0.030)
    assert ours["iteration_ms"] == pytest.approx(theirs["iteration_s_mean"] * 1e3)
    assert ours["stall_ms"] == pytest.approx(theirs["stall_s_mean"] * 1e3)
    assert ours["delay_ms"] == pytest.approx(theirs["delay_s_mean"] * 1e3)
    assert ours["effective_delay_pct"] == pytest.approx(theirs["effective_delay_pct"])
    assert ours["epoch_s"] == pytest.approx((it[epoch == 1].sum() + it[epoch == 2].sum()) / 2)


def test_pipeline_adapter_reproduces_the_shipped_trace(tmp_path) -> None:
    """Identity on a real 4-rank trace without job.json (loader settings implied by the trace)."""
    traces, results = tmp_path / "traces", tmp_path / "results"
    # the inputs through the CLI's entry point in-process (conftest): the subject is the
    # harness's predictions from what they wrote, not the commands' start-up
    parsed = run_dsim_in_process("parse", str(REPO / "traces" / "raw"), "--out", str(traces))
    assert parsed.returncode == 0, parsed.stderr
    (run,) = [p.name for p in traces.iterdir()]
    replay = run_dsim_in_process("run", run, "--traces", str(traces), "--out", str(results),
                                 "--quiet", "--executor", "local")  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    measured = predict_per_iteration(results, run, ("actual", "actual"))
    predicted = predict_pipeline(traces / run, ("actual", "actual"), None, None)
    assert predicted == pytest.approx(measured, rel=1e-9, abs=1e-9)
    faster = predict_pipeline(traces / run, ("min", "actual"), None, None)
    assert faster["iteration_ms"] <= measured["iteration_ms"]
    more = predict_pipeline(traces / run, ("actual", "actual"), 4, None)
    assert more["iteration_ms"] <= measured["iteration_ms"] + 1e-9


def test_fidelity_block_is_replaced_and_the_rest_kept() -> None:
    text = f"# Title\n\nintro\n\n{BEGIN}\nold table\n{END}\n\n## Discussion\nkept\n"
    new = replace_block(text, "new table\n")
    assert new == f"# Title\n\nintro\n\n{BEGIN}\nnew table\n{END}\n\n## Discussion\nkept\n"
    assert replace_block("# Only a title\n", "t\n") == f"# Only a title\n\n{BEGIN}\nt\n{END}\n"


def test_start_latencies_split_by_the_binding_constraint() -> None:
    from validation.timing import start_latencies

    t0 = pd.Timestamp("2026-01-01")
    ms = lambda x: t0 + pd.to_timedelta(x, unit="ms")  # noqa: E731
    fetch = [(0.0, 8.0), (8.2, 15.0), (15.3, 19.0), (20.6, 30.0)]  # (start, end) per batch
    both = pd.DataFrame(
        {
            "epoch": 0,
            "gpu": 0,
            "worker": 0,
            "iteration": range(4),
            "start_f": [ms(s) for s, _ in fetch],
            "end": [ms(e) for _, e in fetch],
            "start_t": [ms(x) for x in (10.0, 20.0, 30.0, 40.0)],  # batch arrivals
        }
    )
    # window 2: batch 2's index was sent at batch 0's arrival (10 ms), its worker was free at
    # 15 ms (restart 0.3 ms); batch 3's at 20 ms, its worker free at 19 ms (dispatch 0.6 ms).
    dispatch, restart = start_latencies(both, {"prefetch_factor": 2, "workers": 1})
    assert dispatch == pytest.approx([0.0006]) and restart == pytest.approx([0.0003])


def test_the_readers_of_a_sweep_do_not_import_the_sweep() -> None:
    """validation.compare imported validation.sweep for the data layout while the sweep runs
    the comparison: a circle. Both now take the layout from validation.manifest."""
    import subprocess

    code = (
        "import sys, validation.compare, validation.timing; "
        "print('validation.sweep' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
