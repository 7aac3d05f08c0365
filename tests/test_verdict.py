"""The verdict (dsim.analysis.verdict) against hand-computed numbers, and at the top of the CLI
output."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_dsim

from dsim.analysis.model_error import (
    ALIGN_SHARE_ERROR_PTS,
    ALIGN_WHATIF_ERROR,
    LOADER_SHARE_ERROR_PTS,
    LOADER_WHATIF_ERROR,
)
from dsim.analysis.summary import add_what_if
from dsim.analysis.verdict import (
    BLIND_CORES,
    CPU_AWARE_CORES,
    cores_caveat,
    format_duration,
    format_pair,
    original_line,
    run_verdicts,
    verdict,
)

TRACE = {"gpus": 4, "declared_iterations_per_epoch": {"0": 900, "1": 851}}


def row(fetch: str, start: str, it: float, stall: float, eff: float) -> dict:
    return {
        "run": "r",
        "fetch_align": fetch,
        "start_align": start,
        "iteration_s_mean": it,
        "stall_s_mean": stall,
        "effective_delay_pct": eff,
        "selected_epochs": "1",
        "gpus": 4,
    }


def rows(*specs: tuple) -> list[dict]:
    """Rows with their what-if columns, as ``dsim.analysis.summary`` computes them."""
    df = add_what_if(pd.DataFrame([row(*s) for s in specs]))
    return df.to_dict("records")


MEASURED = ("actual", "actual", 3.0, 2.23, 43.9)


def test_best_policy_in_plain_words_with_absolute_numbers() -> None:
    v = verdict(
        rows(MEASURED, ("min", "min", 0.95, 0.10, 2.9), ("min", "actual", 1.5, 0.9, 10.0)),
        trace=TRACE,
    )
    assert v.helps and v.best_policy == ("min", "min")
    assert v.speedup == pytest.approx(3.0 / 0.95)  # 3.157...
    assert v.stall_change_pct == pytest.approx(100 * (0.10 - 2.23) / 2.23)  # -95.5
    assert v.iterations_per_epoch == 851  # the selected epoch 1, as declared
    assert v.saved_s_per_epoch == pytest.approx((3.0 - 0.95) * 851)  # 1744.55 s = 29.1 min
    assert v.text == (
        "Aligning fetch and start (min/min) would make iterations 3.16× faster: "
        "stall 2.23 → 0.10 s (−96 %), effective delay 43.9 % → 2.9 % of iterations; "
        "≈ 29 min saved per epoch of 851 iterations on 4 GPUs, assuming a rank's fetch may "
        "start before its worker is free. (per-iteration replay model)"
    )


def test_one_side_and_sub_second_values_in_ms() -> None:
    v = verdict(rows((*MEASURED[:2], 0.03, 0.016, 18.0), ("actual", "min", 0.02, 0.0057, 2.8)))
    assert v.best_policy == ("actual", "min")
    assert v.text.startswith(
        "Aligning start (actual/min) would make iterations 1.50× faster: "
        "stall 16.0 → 5.7 ms (−64 %), effective delay 18.0 % → 2.8 % of iterations; "
    )
    # no trace: the epoch length is unknown, the saving is per iteration
    assert v.saved_s_per_epoch is None
    assert "10 ms saved per iteration on 4 GPUs, assuming a rank's fetch may start" in v.text


def test_only_a_per_iteration_start_alignment_names_the_early_start_assumption() -> None:
    """The pipeline model never starts a fetch before its worker is free; nor do fetch
    alignments or the max start (a barrier only delays) in the per-iteration model."""
    clause = "assuming a rank's fetch may start before its worker is free"
    start_min = rows(MEASURED, ("min", "min", 0.95, 0.10, 2.9))
    assert clause in verdict(start_min, trace=TRACE).text
    pipeline = verdict(start_min, trace=TRACE, model="pipeline").text
    assert clause not in pipeline
    assert "; start-min cannot move a pipelined fetch earlier (it is start actual here)." in (
        pipeline
    )
    assert clause not in verdict(rows(MEASURED, ("min", "actual", 0.95, 0.1, 2.9))).text
    assert clause not in verdict(rows(MEASURED, ("min", "max", 0.95, 0.1, 2.9))).text


def test_ties_go_to_the_simpler_policy() -> None:
    v = verdict(
        rows(MEASURED, ("min", "min", 1.0, 0.1, 0.0), ("min", "actual", 1.0, 0.1, 0.0)),
        trace=TRACE,
    )
    assert v.best_policy == ("min", "actual")  # one aligned side beats two
    v = verdict(
        rows(MEASURED, ("min", "actual", 1.0, 0.1, 0.0), ("avg", "actual", 1.0, 0.1, 0.0)),
        trace=TRACE,
    )
    assert v.best_policy == ("avg", "actual")  # then the order actual, avg, min


def test_nothing_helps_below_one_percent() -> None:
    # the best saves 0.9 % of 1.000 s: below the 1 % bar
    v = verdict(rows(("actual", "actual", 1.0, 0.05, 1.0), ("min", "min", 0.991, 0.04, 0.5)))
    assert not v.helps
    assert v.saving_pct == pytest.approx(0.9)
    assert v.text.startswith(
        "Loaders are already aligned: the best policy (min/min) saves < 1 % of the "
        "iteration time (1.00 → 0.99 s); effective delay 1.0 % of iterations."
    )
    # exactly 1 % helps
    exactly = rows(("actual", "actual", 1.0, 0.05, 1.0), ("min", "min", 0.99, 0.04, 0.5))
    assert verdict(exactly).helps


def test_all_policies_slower_means_nothing_helps() -> None:
    v = verdict(rows(("actual", "actual", 1.0, 0.0, 0.0), ("avg", "avg", 1.2, 0.1, 3.0)))
    assert not v.helps and v.best_policy == ("actual", "actual")
    assert v.speedup == 1.0


def test_measured_numbers_recovered_when_actual_actual_is_filtered_out() -> None:
    full = rows(MEASURED, ("min", "min", 0.95, 0.10, 2.9))
    v = verdict([r for r in full if r["fetch_align"] == "min"], trace=TRACE)
    assert v.iteration_s_before == pytest.approx(3.0)
    assert v.stall_s_before == pytest.approx(2.23)
    assert v.effective_delay_pct_before == pytest.approx(43.9)


def test_only_the_measured_run_gives_no_verdict() -> None:
    with pytest.raises(ValueError):
        verdict(rows(MEASURED))
    assert run_verdicts(pd.DataFrame(rows(MEASURED))) == []


def test_pipeline_verdict_names_its_cpu_assumption() -> None:
    cpu = {"cores": 2, "ranks_per_node": 4, "ranks_per_node_assumed": False}
    row = ("min", "min", 0.95, 0.10, 2.9)
    v = verdict(rows(MEASURED, row), model="pipeline", loader_record={"cpu": cpu})
    assert v.text.endswith("(pipeline replay model; CPU-aware: 2 cores, 4 ranks per node)")
    cpu["ranks_per_node_assumed"] = True
    v = verdict(rows(MEASURED, row), model="pipeline", loader_record={"cpu": cpu})
    assert "4 ranks per node (assumed: all ranks on one node" in v.text
    per_iteration = verdict(rows(MEASURED, row), loader_record={"cpu": cpu})
    assert per_iteration.text.endswith("(per-iteration replay model)")
    # CPU times beyond the logged cores: replayed independent of load, and said why
    over = {"model": "load-independent", "cores": 8, "ranks_per_node": 8, "cpu_over_cores": 2.18}
    v = verdict(rows(MEASURED, row), model="pipeline", loader_record={"cpu": over})
    assert v.text.endswith(
        "(pipeline replay model; fetch durations assumed independent of load: the logged "
        "CPU times are more than the logged cores can run (see the caveat))"
    )
    assert any(n.startswith("the logs give each node 2.18× the CPU time its 8 logged cores")
               for n in v.caveats)  # fmt: skip
    assert not verdict(rows(MEASURED, row), loader_record={"cpu": over}).caveats


def test_model_is_named_and_data_is_plain() -> None:
    v = verdict(rows(MEASURED, ("min", "min", 0.95, 0.10, 2.9)), model="pipeline")
    assert v.text.endswith(
        "(pipeline replay model; fetch durations assumed independent of load: "
        "the logs carry no CPU times)"
    )
    data = v.as_dict()
    assert data["best_fetch_align"] == "min" and data["text"] == v.text
    assert not math.isnan(data["speedup"])


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0042, "4.2 ms"), (0.25, "250 ms"), (4.41, "4.41 s"), (95, "1.6 min"), (1800, "30 min")],
)
def test_durations(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert format_pair(2.234, 0.1) == "2.23 → 0.10 s"


def test_verdict_is_the_first_thing_run_and_summarize_print(tmp_path: Path) -> None:
    from tracegen import write_synthetic

    write_synthetic(tmp_path / "traces", "synth_run", iterations=30)
    env = {"COLUMNS": "1000"}
    proc = run_dsim("run", "synth_run", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.lstrip().splitlines()[:2]
    # The headline is the pipeline model's, the more accurate for alignment what-ifs
    # (FIDELITY.md); the original analysis's number follows on the next line.
    assert re.match(r"(Aligning .* would make iterations [\d.]+× faster|Loaders are)", first)
    assert first.endswith(
        "(pipeline replay model; fetch durations assumed independent of load: the logs carry "
        "no CPU times) Calibrated with 3 DataLoader workers (inferred from worker ids) and "
        "prefetch 2 (PyTorch's default, assumed)."
    )
    # the numbers of the second line are the summary's
    summary = pd.read_csv(tmp_path / "results" / "summary.csv")
    info = json.loads((tmp_path / "results" / "synth_run" / "result.json").read_text())
    original = run_verdicts(summary, {"synth_run": info})[0]
    expected = original.text
    assert "saved per epoch of 30 iterations on 4 GPUs" in expected
    policy = f"{original.best_fetch_align}/{original.best_start_align}"
    assert second.strip().startswith(
        f"the original analysis's per-iteration replay says {original.speedup:.2f}× ({policy}), "
        "as in the table below"
    )
    proc = run_dsim("summarize", "results", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.lstrip().splitlines()[0] == expected


def _what_if_rows(workers: int, prefetch: int, specs: tuple) -> list[dict]:
    """The pipeline what-if rows of a run measured at 2 workers, prefetch 2 (``MEASURED``)
    replayed with ``workers`` and ``prefetch``, with their what-if columns."""
    pipeline = {"replay_model": "pipeline", "loader_prefetch_factor": 2}
    measured = {**row(*MEASURED), **pipeline, "loader_changed": False, "loader_workers": 2,
                "results": "out/r@pipeline"}  # fmt: skip
    changed = {**pipeline, "loader_changed": True, "loader_workers": workers,
               "loader_prefetch_factor": prefetch,
               "results": f"out/r@pipeline-w{workers}-p{prefetch}"}  # fmt: skip
    table = add_what_if(pd.DataFrame([measured, *({**row(*x), **changed} for x in specs)]))
    return table[table["loader_changed"]].to_dict("records")


def test_a_loader_what_if_is_judged_against_the_measured_run() -> None:
    """Its actual/actual row is the loader change alone, not the measured run."""
    specs = (("actual", "actual", 2.0, 1.2, 20.0), ("min", "min", 1.5, 0.2, 1.0))
    rows_wi = _what_if_rows(8, 4, specs)
    v = verdict(rows_wi, trace=TRACE, model="pipeline")
    assert v.iteration_s_before == pytest.approx(3.0)  # the measured run, from the what-if columns
    assert v.best_policy == ("min", "min") and v.speedup == pytest.approx(2.0)
    assert v.text.startswith(
        "Aligning fetch and start (min/min) with 8 DataLoader workers and prefetch 4 would make "
        "iterations 2.00× faster"
    )
    only_loader = verdict([*rows_wi[:1], {**rows_wi[0], "fetch_align": "avg"}], model="pipeline")
    assert only_loader.text.startswith(
        "Running with 8 DataLoader workers and prefetch 4 would make iterations 1.50× faster"
    )


def test_a_loader_what_if_that_is_slower_says_so() -> None:
    """0 workers doubling the iteration time read "saves < 1 % ... (0.55 → 1.08 s)"."""
    specs = (("actual", "actual", 6.0, 5.0, 20.0), ("min", "actual", 5.5, 4.5, 1.0))
    v = verdict(_what_if_rows(0, 2, specs), model="pipeline")
    assert v.text.startswith(
        "Running with 0 DataLoader workers and prefetch 2 would make iterations slower even "
        "with the best policy (min/actual: 3.00 → 5.50 s, 0.55×)"
    ), v.text
    assert "saves < 1 %" not in v.text


def test_the_original_line_states_no_ratio_of_iterations_of_no_length() -> None:
    """Iterations of zero length printed "best actual/actual: inf×"."""
    v = verdict(rows(("actual", "actual", 0.0, 0.0, 0.0), ("min", "min", 0.0, 0.0, 0.0)))
    line = original_line(replace(v, speedup=math.inf, helps=False))
    assert "inf" not in line and "no speed-up it can state" in line


IMPLIED = {"measured": {"workers": 4, "prefetch_factor": 2, "source": "implied"}}
LOGGED = {"measured": {"workers": 3, "prefetch_factor": 4, "source": "log"}}
INCONSISTENT = {**TRACE, "consistency": {"problems": ["iteration ends differ across ranks"]}}


def test_pipeline_verdict_says_which_loader_settings_were_measured_and_which_inferred() -> None:
    specs = rows(MEASURED, ("min", "min", 0.95, 0.10, 2.9))
    implied = verdict(specs, trace=TRACE, model="pipeline", loader_record=IMPLIED).text
    assert implied.endswith(
        "(pipeline replay model; fetch durations assumed independent of load: the logs carry "
        "no CPU times) Calibrated with 4 DataLoader workers (inferred from worker ids) "
        "and prefetch 2 (PyTorch's default, assumed)."
    )
    logged = verdict(specs, trace=TRACE, model="pipeline", loader_record=LOGGED).text
    assert logged.endswith(
        "Calibrated with 3 DataLoader workers and prefetch 4 (measured: the run's LOADER lines)."
    )
    assert "inconsistent" not in implied + logged


def test_pipeline_verdict_notes_a_trace_inconsistent_with_synchronous_ddp() -> None:
    specs = rows(MEASURED, ("min", "min", 0.95, 0.10, 2.9))
    text = verdict(specs, trace=INCONSISTENT, model="pipeline", loader_record=IMPLIED).text
    assert text.endswith(
        "The trace is inconsistent with synchronous DDP (run.json 'consistency'): the "
        "calibration absorbs impossible terms, so these what-ifs are suspect."
    )
    # through result.json, as summarize and report build verdicts
    info = {"trace": INCONSISTENT, "model": "pipeline", "loader": IMPLIED}
    (judged,) = run_verdicts(pd.DataFrame(specs), {"r": info})
    assert judged.text == text
    # the per-iteration model calibrates nothing: no note, no loader sentence
    plain = verdict(specs, trace=INCONSISTENT, loader_record=IMPLIED).text
    assert plain.endswith("(per-iteration replay model)")


def _loader_tables(workers: int = 1) -> pd.DataFrame:
    """A pipeline run at its measured loader settings and one loader what-if, 9 + 9 rows."""
    pipeline = {"replay_model": "pipeline", "loader_prefetch_factor": 2}
    measured = {**pipeline, "loader_changed": False, "loader_workers": 2, "results": "o/r@p"}
    changed = {**pipeline, "loader_changed": True, "loader_workers": workers, "results": "o/r@w"}
    base = [(*MEASURED[:2], 3.0, 2.2, 40.0), ("min", "min", 2.0, 1.2, 5.0)]
    what_if = [("actual", "actual", 5.0, 4.0, 40.0), ("min", "min", 2.4, 1.5, 5.0)]
    frame = [{**row(*s), **measured} for s in base] + [{**row(*s), **changed} for s in what_if]
    return add_what_if(pd.DataFrame(frame))


def test_a_combined_what_if_is_split_into_its_parts() -> None:
    """Issue #19: 1 worker alone is slower; the combined verdict must not hide it."""
    [measured, combined] = run_verdicts(_loader_tables())
    assert measured.loader_speedup is None and "Split" not in measured.text
    assert combined.best_policy == ("min", "min")
    assert combined.speedup == pytest.approx(3.0 / 2.4)
    assert combined.loader_speedup == pytest.approx(3.0 / 5.0)  # 0.60×: slower
    assert combined.alignment_speedup == pytest.approx(3.0 / 2.0)
    assert (
        "Split: running with 1 DataLoader worker and prefetch 2 alone 0.60×; aligning "
        "(min/min) alone, at the measured loader settings, 1.50×; both 1.25×."
    ) in combined.text


def test_fewer_workers_than_measured_take_the_fewer_workers_error() -> None:
    """A loader what-if below the measured worker count states the error measured on such
    what-ifs (a run with more workers predicting fewer), more workers the loader cells';
    without the measured settings it stays the loader cells' (validation/README.md, "Fewer
    workers")."""
    from dsim.analysis.model_error import LOADER_FEWER_ERROR, LOADER_FEWER_SHARE_ERROR_PTS

    node = {"cores": 2, "local_world_size": 4}  # 0.5 cores per rank: the few-core sweeps'
    measured = {"measured": {"workers": 2, "prefetch_factor": 2, "source": "log", **node}}
    for workers, error, share in (
        (1, LOADER_FEWER_ERROR.few_cores, LOADER_FEWER_SHARE_ERROR_PTS),
        (8, LOADER_WHATIF_ERROR.few_cores, LOADER_SHARE_ERROR_PTS),
    ):
        table = _loader_tables(workers=workers)
        rows_wi = table[table["loader_changed"]].to_dict("records")
        v = verdict(rows_wi, trace=TRACE, model="pipeline", loader_record=measured)
        assert v.helps and v.model_error == error and v.model_error_node == "few_cores"
        assert f"physical re-runs, ±{100 * error:.1f} % on nodes with ≤ 2 cores per rank" in v.text
        assert v.share_model_error_pts == share
        after = v.effective_delay_pct_after
        assert v.effective_delay_pct_low == pytest.approx(max(after - share, 0.0))
        assert v.effective_delay_pct_high == pytest.approx(min(after + share, 100.0))
    table = _loader_tables(workers=1)
    rows_wi = table[table["loader_changed"]].to_dict("records")
    unknown = verdict(rows_wi, trace=TRACE, model="pipeline")  # no measured workers, no cores
    assert unknown.model_error == LOADER_WHATIF_ERROR.on(None) and unknown.model_error_node is None
    assert "the run does not log its node's cores" in unknown.text
    assert LOADER_FEWER_ERROR.few_cores != LOADER_WHATIF_ERROR.few_cores  # tells which it took


def test_a_verdicts_band_takes_the_error_of_nodes_like_the_recorded_one() -> None:
    """The same alignment verdict recorded on 2 cores for 4 ranks (run.json's loader block)
    states the few-core sweeps' error, on 16 cores for 4 ranks the many-core sweeps' (whose
    alignment cells missed by up to 27 %), and without the cores the larger, saying why."""
    aligned = rows(MEASURED, ("min", "min", 0.95, 0.10, 2.9))
    said = {}
    nodes = (
        (2, ALIGN_WHATIF_ERROR.few_cores, "few_cores"),
        (16, ALIGN_WHATIF_ERROR.many_cores, "many_cores"),
        (None, ALIGN_WHATIF_ERROR.on(None), None),
    )
    for cores, error, node in nodes:
        loader = {} if cores is None else {"cores": cores, "local_world_size": 4}
        v = verdict(aligned, trace={**TRACE, "loader": loader}, model="pipeline")
        assert v.helps and (v.model_error, v.model_error_node) == (error, node)
        said[node] = v.text
    few, many = 100 * ALIGN_WHATIF_ERROR.few_cores, 100 * ALIGN_WHATIF_ERROR.many_cores
    assert f"±{few:.1f} % on nodes with ≤ 2 cores per rank)" in said["few_cores"]
    assert f"±{many:.1f} % on nodes with > 2 cores per rank)" in said["many_cores"]
    assert (
        f"±{many:.1f} %, as on nodes with > 2 cores per rank: the run does not log its node's "
        "cores; dsim.instrument logs them)"
    ) in said[None]


def test_caveats_for_too_many_workers_and_too_few_iterations() -> None:
    table = _loader_tables(workers=8)
    table["iterations"] = 12
    # spread enough that the band's low end (0.97 at a 10.2 % error) stays below 1.00 when the
    # committed sweeps move the error by a few tenths (0.45 left it at 1.0008 once it was 10.2 %)
    table["iteration_s_std"] = 0.55
    trace = {"gpus": 4, "loader": {"cores": 2, "local_world_size": 4}}
    rows_wi = table[table["loader_changed"]].to_dict("records")
    v = verdict(rows_wi, trace=trace, model="pipeline")
    assert v.speedup_low is not None and v.speedup_low < v.speedup < v.speedup_high
    # a loader what-if on 0.5 cores per rank: the few-core sweeps' loader cells' error
    assert v.model_error == LOADER_WHATIF_ERROR.few_cores
    assert v.speedup_low <= 1.0  # 1.25× predicted, within the error and the few iterations
    assert (
        f"faster (95 % band {v.speedup_low:.2f}–{v.speedup_high:.2f}×: the model's error on "
        f"physical re-runs, ±{100 * LOADER_WHATIF_ERROR.few_cores:.1f} % on nodes with ≤ 2 "
        "cores per rank, and the interval of few "
        "iterations; the band reaches 1.00×, so the change may be no faster)"
    ) in v.text
    # The interval alone (the per-iteration model states no validated error) is narrower.
    alone = verdict(rows_wi, trace=trace)
    assert alone.model_error is None
    assert f"faster (95 % interval {alone.speedup_low:.2f}–{alone.speedup_high:.2f}×)" in alone.text
    assert alone.speedup_low > 1.0 and "reaches 1.00×" not in alone.text
    assert v.speedup_low < alone.speedup_low < alone.speedup_high < v.speedup_high
    assert v.caveats == (
        "only 12 iterations selected (fewer than 30): read the interval, not the number",
        "8 workers per rank are 32 worker processes on a node whose run recorded 2 cores: "
        f"they cannot all run at once{BLIND_CORES}",
    )
    # The same words as dsim tune's; where the model shared the cores from CPU times, its end
    # says what that sharing still misses.
    cpu = {"cpu": {"cores": 2, "ranks_per_node": 4}}
    aware = verdict(rows_wi, trace=trace, model="pipeline", loader_record=cpu)
    assert aware.caveats[1] == cores_caveat(8, 4, 2, cpu_aware=True)
    assert aware.caveats[1].endswith(CPU_AWARE_CORES)
    assert verdict(rows_wi, trace=trace, loader_record=cpu).caveats[1].endswith(BLIND_CORES)
    table["iterations"] = 30
    many = verdict(table[table["loader_changed"]].to_dict("records"), trace={"gpus": 4})
    assert many.speedup_low is None and many.caveats == ()


def test_a_pipeline_alignment_verdict_states_the_models_error_on_re_runs() -> None:
    """Issue #19: a speed-up without the model's error overstates. The pipeline verdict's
    band is the predicted time ± ``ALIGN_WHATIF_ERROR``: speed-up ÷ (1 ± e), e that of the
    node's kind (here not logged: the larger)."""
    v = verdict(rows(MEASURED, ("min", "min", 0.95, 0.10, 2.9)), model="pipeline")
    e = ALIGN_WHATIF_ERROR.on(None)
    assert v.model_error == e
    assert v.speedup_low == pytest.approx(v.speedup / (1 + e))
    assert v.speedup_high == pytest.approx(v.speedup / (1 - e))
    assert v.speedup_low > 1.0  # a gain beyond the error: the band closes without a warning
    assert (
        f"faster (95 % band {v.speedup_low:.2f}–{v.speedup_high:.2f}×: the model's error on "
        f"physical re-runs, ±{100 * e:.1f} %, as on nodes with > 2 cores per rank: the run does "
        "not log its node's cores; dsim.instrument logs them)"
    ) in v.text
    per_iteration = verdict(rows(MEASURED, ("min", "min", 0.95, 0.10, 2.9)))
    assert per_iteration.model_error is None and per_iteration.speedup_low is None
    assert "band" not in per_iteration.text
    assert per_iteration.share_model_error_pts is None
    assert per_iteration.effective_delay_pct_low is None


def test_a_pipeline_verdict_states_the_band_of_the_effective_delay_after() -> None:
    """The share after the change ± the model's error of the share in points, within 0-100 %:
    the mixed regime's aligned shares were 10-15 points too low on re-runs (FIDELITY.md)."""
    v = verdict(rows(MEASURED, ("min", "min", 0.95, 0.10, 20.0)), model="pipeline")
    e = ALIGN_SHARE_ERROR_PTS
    assert v.share_model_error_pts == e
    assert v.effective_delay_pct_low == pytest.approx(20.0 - e)
    assert v.effective_delay_pct_high == pytest.approx(20.0 + e)
    assert (
        f"effective delay 43.9 % → 20.0 % of iterations (95 % band {20.0 - e:.1f}–{20.0 + e:.1f} %)"
    ) in v.text
    # near the edges the band stops at 0 and 100 %
    low = verdict(rows(MEASURED, ("min", "min", 0.95, 0.10, 2.9)), model="pipeline")
    assert low.effective_delay_pct_low == 0.0
    assert f"2.9 % of iterations (95 % band 0.0–{2.9 + e:.1f} %)" in low.text
    # a loader what-if carries the loader cells' error of the share
    table = _loader_tables(workers=8)
    wi = verdict(table[table["loader_changed"]].to_dict("records"), model="pipeline")
    assert wi.share_model_error_pts == LOADER_SHARE_ERROR_PTS
    assert wi.effective_delay_pct_high == min(
        wi.effective_delay_pct_after + LOADER_SHARE_ERROR_PTS, 100.0
    )


@pytest.mark.parametrize(
    ("constant", "loader"),
    [
        ("ALIGN_SHARE_ERROR_PTS", False),
        ("LOADER_SHARE_ERROR_PTS", "loader"),
        ("LOADER_FEWER_SHARE_ERROR_PTS", "fewer"),
    ],
)
def test_the_share_errors_are_the_95th_percentile_of_the_committed_re_runs(
    constant: str, loader: str | bool
) -> None:
    """Both share bands are recomputed from every committed sweep's fidelity.csv (the pipeline
    model's alignment cells, or its loader cells, absolute error of the effective-delay share
    in points), like the time bands: re-running FIDELITY.md moves them."""
    import numpy as np

    from dsim.analysis import model_error

    root = Path(__file__).resolve().parents[1] / "validation"
    errors = []
    for path in [root / "fidelity.csv", *sorted(root.glob("*/fidelity.csv"))]:
        table = pd.read_csv(path)
        if "effective_delay_pct_err_pipeline" not in table or "kind" not in table:
            continue
        if loader:
            if f"target_{loader}_pipeline" not in table:
                continue
            cells = table[table[f"target_{loader}_pipeline"].notna()]
        else:
            cells = table[table["kind"].isin(["align", "start"])]
        errors.extend(cells["effective_delay_pct_err_pipeline"].dropna().abs())
    assert len(errors) >= 150
    expected = float(np.percentile(errors, 95))
    assert abs(getattr(model_error, constant) - expected) < 0.05, expected
