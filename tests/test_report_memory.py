"""`dsim report` at many ranks reads per-GPU stalls policy by policy (issue 21).

Above ``MANY_RANKS`` ranks the timeline draws only bands across GPUs and the named
stragglers, so the report must not hold every policy's [iterations, GPUs] table at
once (at 1024 ranks × 10,000 iterations that took 4.7 GB): a memory bound measured
with tracemalloc (NumPy and pandas allocate through it), and the figure drawn from
the reduced data checked equal to the one drawn from the full tables.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from test_report import write_synthetic_run

from dsim.app.report import _timeline_replays
from dsim.model.results import scan_results
from dsim.render.figures import timeline_figure
from dsim.render.figures.ranks import TOP_RANKS

GPUS, ITERATIONS = 256, 500


@pytest.fixture(scope="module")
def many_ranks(tmp_path_factory: pytest.TempPathFactory):
    """A results directory of one 256-rank run with all nine policies."""
    out = tmp_path_factory.mktemp("many") / "results"
    write_synthetic_run(out, "many", gpus=GPUS, epochs=1, iterations=ITERATIONS, seed=5)
    return scan_results([out]).runs[0]


ROW = {"selected_epochs": "0", "warmup": 2}


def test_timeline_replays_hold_one_policys_gpu_table_at_a_time(many_ranks) -> None:
    policies = list(many_ranks.replays)
    assert len(policies) == 9
    one_table = GPUS * ITERATIONS * 8  # one policy's stalls as float64
    tracemalloc.start()
    try:
        frames, reduced = _timeline_replays(many_ranks, policies, ROW)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # all nine tables at once were ~9.7 tables' worth; one at a time with its reduction ~3.6
    assert peak < 5 * one_table, f"peak {peak:,} bytes: more than one policy's table held"
    assert reduced is not None and set(reduced.bands) == set(policies)
    assert len(reduced.columns) == GPUS and len(reduced.share) == GPUS
    for frame in frames.values():
        gpu_cols = [c for c in frame.columns if c.startswith("stall_s_gpu")]
        assert len(gpu_cols) <= TOP_RANKS  # only the named ranks' stalls are kept
        assert len(frame) == ITERATIONS - 3  # warm-up iterations 0–2 skipped


def test_reduced_timeline_is_the_figure_of_the_full_tables(many_ranks) -> None:
    from dsim.model.selection import selection_mask

    policies = list(many_ranks.replays)
    frames, reduced = _timeline_replays(many_ranks, policies, ROW)
    full = {}
    for policy in policies:
        table = many_ranks.read(policy)
        mask = selection_mask(
            table.column("epoch").to_numpy(), table.column("iteration").to_numpy(), [0], 2
        )
        full[policy] = table.to_pandas()[mask].reset_index(drop=True)
    drawn = timeline_figure("r", frames, threshold_s=0.03, reduced=reduced)
    expected = timeline_figure("r", full, threshold_s=0.03)
    assert drawn.to_json() == expected.to_json()


def test_few_ranks_keep_every_gpu_column(tmp_path: Path) -> None:
    out = tmp_path / "results"
    write_synthetic_run(out, "few", gpus=4, epochs=1, iterations=40)
    run = scan_results([out]).runs[0]
    frames, reduced = _timeline_replays(run, list(run.replays), ROW)
    assert reduced is None
    for frame in frames.values():
        assert sum(c.startswith("stall_s_gpu") for c in frame.columns) == 4
