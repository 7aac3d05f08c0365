"""`dsim tune`: grids, the recommendation on traces with a known optimum, JSON, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import dsim
from dsim.errors import InputError, UsageError
from dsim.options import parse_counts
from dsim.render.tune import document, lines
from dsim.synth import SynthParams, synthesize
from dsim.tuning import (
    DEFAULT_WORKERS,
    MAX_SETTING,
    Point,
    bootstrap_means,
    cheapest_near_best,
    default_workers,
    flattening,
)

# One batch takes 0.2 s to build; an iteration computes for 0.05 + 0.02 s: the loader keeps
# up from ceil(0.2 / 0.07) = 3 workers on (loading-bound below). The second trace builds a
# batch in 0.02 s: one worker keeps up with 0.12 s of compute (compute-bound).
LOADING = {"fetch_mean_s": 0.2, "compute_s": 0.05, "name": "loadbound"}
COMPUTE = {"fetch_mean_s": 0.02, "compute_s": 0.1, "name": "computebound"}


def _trace(tmp: Path, **kwargs) -> Path:
    params = {"gpus": 2, "iterations": 60, "epochs": 2, "workers": 2, "seed": 1} | kwargs
    params |= {"straggler_prob": 0.0}
    logs = synthesize(SynthParams(**params), tmp / "logs")
    return dsim.parse(logs, out=tmp / "traces").directory


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("tune")
    return {"loading": _trace(tmp, **LOADING), "compute": _trace(tmp, **COMPUTE)}


def test_loading_bound_trace_gets_the_workers_that_keep_up(traces, tmp_path):
    result = dsim.tune(traces["loading"], workers="1-8", prefetch=[2], out=tmp_path)
    chosen = result.loader_only
    assert chosen.point.workers in (3, 4)  # the known optimum, not the largest setting tried
    speed = chosen.bands["speedup"]
    assert speed.value > 1.3 and speed.low < speed.value < speed.high
    assert chosen.flat.reason == "compute-bound" and chosen.flat.workers == chosen.point.workers
    files = {f.suffix for f in result.files}
    assert files == {".parquet", ".csv"}
    table = pq.read_table(tmp_path / "tune" / "loadbound.parquet").to_pandas()
    assert len(table) == 2 * 8  # the loader alone and with the best alignment
    assert table.groupby("policy")["recommended"].sum().tolist() == [1, 1]


def test_tune_result_is_short_in_a_notebook_and_says_where_it_wrote(traces, tmp_path, capsys):
    result = dsim.tune(traces["loading"], workers="1,4", prefetch=[2], out=tmp_path)
    assert f"wrote the tune table of loadbound to {(tmp_path / 'tune').absolute()}" in (
        capsys.readouterr().err
    )
    text = repr(result)  # the dataclass default printed every grid point
    assert text.startswith("TuneResult(loadbound: use num_workers=") and "\n" not in text
    assert f"in {tmp_path / 'tune'}" in text and len(text) < 300
    html = result._repr_html_()
    assert "<pre>" in html and "loader alone" in html and "<b>" in html
    dsim.tune(traces["loading"], workers="1", prefetch=[2], out=tmp_path, quiet=True)
    assert capsys.readouterr().err == ""


def test_compute_bound_trace_needs_no_more_workers(traces):
    result = dsim.tune(traces["compute"], out=None)
    chosen = result.loader_only
    assert chosen.point.workers <= 1 and chosen.point.prefetch == 1
    assert chosen.flat.reason == "compute-bound"
    assert abs(chosen.bands["speedup"].value - 1) < 0.02
    assert [p.workers for p in result.alone][::3] == list(DEFAULT_WORKERS)
    text = "\n".join(lines(result))
    assert text.startswith("computebound: use num_workers=1, prefetch_factor=1 (recorded: 2 ")
    assert (
        "costs: 1 worker process per rank (2 if all 2 ranks share one node); pinned memory: "
        "unknown (1 queued batch per rank; the logs carry no batch size in bytes)"
    ) in text


def test_recorded_cores_shape_the_grid_and_warn(traces, tmp_path):
    import shutil

    run = shutil.copytree(traces["loading"], tmp_path / "traces" / "loadbound")
    doc = json.loads((run / "run.json").read_text())
    doc["loader"] = {"num_workers": 2, "prefetch_factor": 2, "cores": 2, "local_world_size": 2}
    (run / "run.json").write_text(json.dumps(doc))
    result = dsim.tune(run, prefetch="2", out=None, alignment=False)
    assert sorted({p.workers for p in result.alone}) == [0, 1, 2, 4]
    assert result.with_alignment is None
    assert any("cannot all run at once" in c for c in result.caveats)


def test_the_band_is_the_error_measured_on_nodes_like_the_recorded_one(traces, tmp_path):
    """The same run recorded on 2 cores for 4 ranks takes the few-core sweeps' loader error,
    on 16 cores for 2 ranks the many-core sweeps', and says which, in words and in the JSON;
    unlogged cores take the larger (the test above the grid's)."""
    import shutil

    from dsim.analysis.model_error import LOADER_WHATIF_ERROR

    run = shutil.copytree(traces["loading"], tmp_path / "traces" / "loadbound")
    doc = json.loads((run / "run.json").read_text())
    said = {}
    nodes = (
        (2, 4, LOADER_WHATIF_ERROR.few_cores, "few_cores"),
        (16, 2, LOADER_WHATIF_ERROR.many_cores, "many_cores"),
    )
    for cores, ranks, error, node in nodes:
        loader = {"num_workers": 2, "prefetch_factor": 2, "cores": cores, "local_world_size": ranks}
        (run / "run.json").write_text(json.dumps({**doc, "loader": loader}))
        result = dsim.tune(run, workers="2,4", prefetch="2", out=None, alignment=False, quiet=True)
        chosen = result.loader_only
        assert (chosen.point.workers, chosen.error_kind, chosen.model_error) == (4, "loader", error)
        assert document(result)["recommendation"]["model_error_node"] == node
        said[node] = "\n".join(lines(result))
    few, many = LOADER_WHATIF_ERROR.few_cores, LOADER_WHATIF_ERROR.many_cores
    assert (
        f"(±{few:.1%}: its 95th percentile on nodes with ≤ 2 cores per rank; FIDELITY.md)"
        in (said["few_cores"])
    )
    assert (
        f"(±{many:.1%}: its 95th percentile on nodes with > 2 cores per rank; FIDELITY.md)"
        in (said["many_cores"])
    )


def test_few_iterations_get_a_caveat(traces):
    result = dsim.tune(traces["compute"], workers=[1], prefetch=[2], warmup=55, out=None)
    assert result.iterations < 30
    assert any("read the interval" in c for c in result.caveats)


def test_the_api_refuses_a_grid_value_that_is_no_whole_number(traces):
    """``dsim.tune(workers=[2.9], prefetch=[1.9])`` recommended 2 workers, prefetch 1."""
    run = traces["compute"]
    for workers, prefetch, said in (([2.9], [2], "'2.9' is not a number"),
                                    ([2], [1.9], "'1.9' is not a number"),
                                    ([True], [2], "'True' is not a number")):  # fmt: skip
        with pytest.raises(UsageError, match=said):
            dsim.tune(run, workers=workers, prefetch=prefetch, out=None, quiet=True)
    whole = dsim.tune(run, workers=[2.0], prefetch=[np.int64(2)], out=None, quiet=True)
    assert (whole.loader_only.point.workers, whole.loader_only.point.prefetch) == (2, 2)


def test_grid_parsing():
    assert parse_counts("1,2,4", "--workers", 0) == (1, 2, 4)
    assert parse_counts("4-6, 1", "--workers", 0) == (1, 4, 5, 6)
    for bad, why in [
        ("-1", "below"),
        ("0", "below"),
        (f"1-{MAX_SETTING + 1}", "above the maximum"),
        ("2,x", "not a number"),
        ("1-", "not a number"),
        ("8-2", "backwards"),
    ]:
        with pytest.raises(UsageError, match=why):
            parse_counts(bad, "--prefetch", 1)


def test_default_workers_reach_past_the_cores():
    assert default_workers(None) == DEFAULT_WORKERS
    assert default_workers(1.0) == (0, 1, 2, 4)
    assert default_workers(8.0)[-1] == 32


def _point(workers: int, prefetch: int, t: float, stall: float = 0.0, ranks=(1.0, 1.0)):
    n = 50
    return Point(
        workers, prefetch, ("actual", "actual"), np.full(n, t), np.full(n, stall), np.array(ranks)
    )


def test_cheapest_within_two_percent_of_the_best():
    points = [_point(1, 2, 2.0), _point(2, 2, 1.015), _point(2, 1, 1.019), _point(8, 2, 1.0)]
    assert (cheapest_near_best(points).workers, cheapest_near_best(points).prefetch) == (2, 1)


def test_the_cheapest_near_the_best_is_chosen_whatever_the_sign_of_the_best():
    """A best time of 0 or below (a replay of corrupt CPU times) left no point within 2 % of
    it (best * 1.02 is below best) and `dsim tune` ended in an internal error."""
    points = [_point(0, 1, -0.0245), _point(1, 2, 0.72), _point(4, 2, 0.062)]
    assert cheapest_near_best(points).workers == 0
    assert cheapest_near_best([_point(2, 2, 0.0), _point(1, 2, 0.0)]).workers == 1


def test_flattening_names_one_slow_rank_and_loading_bound():
    slow = [_point(1, 2, 2.0, 1.0), _point(2, 2, 1.5, 0.5, (0.9, 0.1)), _point(4, 2, 1.5, 0.5)]
    assert flattening(slow).reason == "slow-rank" and flattening(slow).workers == 2
    assert "rank 7's loader binds" in flattening(slow, ranks=[7, 8]).text
    even = [_point(1, 2, 2.0, 1.0), _point(2, 2, 1.5, 0.5), _point(4, 2, 1.5, 0.5)]
    assert flattening(even).reason == "stall-left"
    assert flattening(even, cpu_saturated_at=2).reason == "cpu-saturated"
    assert flattening(even, cpu_saturated_at=4).reason == "stall-left"
    still = [_point(1, 2, 2.0, 1.0), _point(2, 2, 1.5, 0.5)]
    assert flattening(still).reason == "loading-bound" and flattening(still).workers is None
    assert flattening(still).text.endswith(": more workers may still help")
    # Still gaining by the model, but with the cores saturated it says so instead of promising
    saturated = flattening(still, cpu_saturated_at=1)
    assert saturated.reason == "loading-bound" and saturated.workers is None
    assert saturated.text == (
        "loading-bound up to the largest setting tried (2 workers), but the node's CPU cores "
        "are saturated from 1 worker: each worker more competes for them, so more workers may "
        "help less than predicted"
    )
    assert flattening(still, cpu_saturated_at=4).text == flattening(still).text  # past the grid


def test_bootstrap_is_paired_and_deterministic():
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 0.1, 5000)
    means = bootstrap_means(np.vstack([x, 2 * x]))
    assert means.shape == (300, 2)
    assert np.allclose(means[:, 1] / means[:, 0], 2.0)  # same resamples on both rows
    assert np.array_equal(means, bootstrap_means(np.vstack([x, 2 * x])))
    assert abs(means[:, 0].std() - 0.1 / np.sqrt(5000)) < 0.0005


def test_run_without_fetch_records_is_refused(traces, tmp_path):
    import shutil
    from dataclasses import replace

    import pyarrow as pa

    from dsim.model.tables import read_run, write_run

    run = shutil.copytree(traces["compute"], tmp_path / "nofetch")
    tables = read_run(run)
    # rewritten as `dsim parse` writes a run (tables edited by hand are refused, SPEC §2.3)
    empty = pa.Table.from_batches([], schema=tables.fetch.schema)
    write_run(replace(tables, fetch=empty), run)
    with pytest.raises(InputError, match="no fetch records"):
        dsim.tune(run, out=None)


def test_unwritable_out_is_an_output_error(traces, tmp_path):
    from dsim.errors import OutputError

    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="cannot create"):
        dsim.tune(traces["compute"], workers=[1], prefetch=[1], out=tmp_path / "file")


def test_cli_json_and_bad_grid(traces, tmp_path, dsim_cli):
    run = traces["compute"]
    done = dsim_cli(
        "tune", run.name, "--traces", run.parent, "--out", tmp_path, "--workers", "1,2", "--json"
    )
    assert done.returncode == 0, done.stderr
    [doc] = json.loads(done.stdout)
    assert doc["run"] == "computebound" and doc["model"] == "pipeline"
    rec = doc["recommendation"]
    assert {"workers", "prefetch_factor", "speedup", "iteration_s", "stall_s"} <= set(rec)
    assert rec["speedup"]["low"] <= rec["speedup"]["value"] <= rec["speedup"]["high"]
    assert len(doc["grid"]) == 2 * 3 and doc["files"]
    bad = dsim_cli("tune", run.name, "--traces", run.parent, "--workers", "0,500")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"dsim: error: --workers '0,500': 500 is above the maximum {MAX_SETTING}"
    ]


def test_tune_without_a_run_names_the_runs_there_are(traces, tmp_path, dsim_cli):
    """A missing RUN was click's "Missing argument 'RUN...'", naming none of the runs."""
    parent = traces["compute"].parent
    done = dsim_cli("tune", "--traces", parent, "--out", tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "dsim: error: nothing to run: give run names (dsim tune RUN); "
        f"{parent} holds 2 parsed runs (computebound, loadbound): "
        f"dsim tune --traces {parent} '*' takes them all"
    )
    assert not (tmp_path / "tune").exists()


def test_tune_takes_runs_as_dsim_run_does(traces, tmp_path, dsim_cli):
    """``dsim tune '*'`` read the glob as one run's name ("no parsed run '*'") where
    ``dsim run '*'`` took every run; a name not found now gets run's message (exit 2, the
    closest names), and a run given twice (by glob and by its directory) is tuned once."""
    parent = traces["compute"].parent
    common = ("--traces", parent, "--out", tmp_path, "--workers", "1,2", "--prefetch", "2")
    done = dsim_cli("tune", "*", *common, "--json")
    assert done.returncode == 0, done.stderr
    assert [doc["run"] for doc in json.loads(done.stdout)] == ["computebound", "loadbound"]
    twice = dsim_cli("tune", traces["loading"], "load*", *common, "--json")
    assert twice.returncode == 0, twice.stderr
    assert [doc["run"] for doc in json.loads(twice.stdout)] == ["loadbound"]
    typo = dsim_cli("tune", "computebond", *common)
    assert typo.returncode == 2
    assert typo.stderr.strip() == (
        "dsim: error: runs to tune: 1 problem: run(s) not found: computebond (did you mean "
        f"computebound?); available in {parent}: computebound, loadbound"
    )


def test_the_report_shows_the_tune_heatmap(traces, tmp_path):
    from dsim.app.report import ReportRequest, read_report_input
    from dsim.render.html import render_report

    results = tmp_path / "results"
    dsim.run(traces["loading"], policies=["min/min"], out=results, executor="local")
    request = ReportRequest(
        results=[results], out=tmp_path / "r.html", traces=traces["loading"].parent
    )
    answer, view, _ = read_report_input(request)
    assert view.tune == {}  # no tune table yet: no section
    assert "id='tune'" not in render_report(answer, view)
    dsim.tune(traces["loading"], workers=[1, 2, 4], prefetch=[2], out=results)
    answer, view, _ = read_report_input(request)
    [table] = view.tune.values()
    assert len(table) == 2 * 3 and table["recommended"].sum() == 2
    page = render_report(answer, view)
    assert "id='tune'" in page and "fig-tune-0" in page and "href='#tune'" in page


def test_cost_line_prices_the_queued_batches_when_the_logs_give_their_bytes(traces):
    from dataclasses import replace

    from dsim.render.tune import cost_line

    result = dsim.tune(traces["loading"], workers="1,4", prefetch="2", alignment=False, out=None)
    point = result.loader_only.point
    assert (point.workers, point.prefetch) == (4, 2)
    sized = replace(result, batch_bytes=3 * 1024 * 1024, ranks_on_node=2)
    assert cost_line(sized, point) == (
        "  costs: 4 worker processes per rank, 8 on the node; pinned memory: 24.0 MiB per "
        "rank, 48.0 MiB on the node (8 queued batches × 3.0 MiB)"
    )
    doc = document(sized)["recommendation"]
    assert doc["queued_bytes_per_rank"] == 8 * 3 * 1024 * 1024


@pytest.mark.parametrize(
    ("constant", "kind", "least"),
    [
        ("LOADER_WHATIF_ERROR", "loader", 200),
        ("LOADER_FEWER_ERROR", "fewer workers", 150),
        ("ALIGN_WHATIF_ERROR", "alignment", 150),
    ],
)
def test_the_bands_model_error_is_the_95th_percentile_of_the_committed_re_runs(
    constant: str, kind: str, least: int
):
    """``LOADER_WHATIF_ERROR`` (more workers, another prefetch), ``LOADER_FEWER_ERROR`` (fewer
    workers) and ``ALIGN_WHATIF_ERROR`` (fetch and start alignment) are recomputed from every
    committed sweep's fidelity.csv (the pipeline model's cells of that kind, absolute error of
    the mean iteration time; ``validation.bandcheck.sweep_errors``), per kind of node the sweep
    ran on: re-running FIDELITY.md moves them, so a band cannot keep a number the re-runs no
    longer show."""
    from dsim.analysis import model_error
    from validation.bandcheck import sweep_errors

    errors = sweep_errors()
    cells = errors[errors["kind"] == kind]
    few, many = cells[cells["few_cores"]], cells[~cells["few_cores"]]
    assert errors["sweep"].nunique() >= 13 and len(few) >= least and len(many) >= 10
    both = getattr(model_error, constant)
    for side, value in ((few, both.few_cores), (many, both.many_cores)):
        expected = np.percentile(side["error"], 95) / 100
        assert abs(value - expected) < 5e-4, (kind, len(side), expected)


def test_a_band_takes_the_error_measured_on_nodes_like_the_recorded_one():
    """A run recorded with at most 2 cores per rank takes the few-core sweeps' error; more
    cores per rank the many-core sweeps'; a run that does not log its cores the larger, and
    says why (on the 16-core sweeps the pooled band covered 69 % of the loader cells)."""
    from dsim.analysis.model_error import LOADER_WHATIF_ERROR, NodeErrors, node_kind

    errors = NodeErrors(few_cores=0.1, many_cores=0.3)
    assert (errors.on(0.5), errors.on(2.0), errors.on(4.0), errors.on(None)) == (0.1, 0.1, 0.3, 0.3)
    assert errors.words(0.5) == " on nodes with ≤ 2 cores per rank"
    assert errors.words(16.0) == " on nodes with > 2 cores per rank"
    assert errors.words(None) == (
        ", as on nodes with > 2 cores per rank: the run does not log its node's cores; "
        "dsim.instrument logs them"
    )
    flipped = NodeErrors(few_cores=0.3, many_cores=0.1)
    assert flipped.on(None) == 0.3 and flipped.words(None).startswith(", as on nodes with ≤ 2")
    assert (node_kind(0.5), node_kind(4.0), node_kind(None)) == ("few_cores", "many_cores", None)
    assert LOADER_WHATIF_ERROR.few_cores < LOADER_WHATIF_ERROR.many_cores


def test_a_busy_workers_hand_over_is_said_in_words():
    """Where the calibration finds the busy worker's extra hand-over, tune says how long, how
    often and what causes it; where it finds none, nothing."""
    from dataclasses import replace

    from dsim.app.tune import busy_hand_over_note
    from dsim.replay.models.pipeline import PreparedPipeline
    from dsim.replay.models.pipeline_kernel import calibrate
    from tests.test_pipeline_model import _alternating_run

    inputs, _ = _alternating_run()
    cal = calibrate(inputs, 1, 2)
    note = busy_hand_over_note(PreparedPipeline(inputs, cal))
    assert note is not None and "11.0 ms longer" in note and "1.0 ms when it was idle" in note
    assert "holds the GIL" in note
    none = replace(cal, busy_excess=np.zeros_like(cal.busy_excess))
    assert busy_hand_over_note(PreparedPipeline(inputs, none)) is None


def test_a_hand_over_that_waits_for_the_batch_being_built_is_said_so():
    """Where the busy hand-overs follow the time left on the batch being built (SPEC §4.2),
    the note says they waited as long as that batch still took; where not, it does not."""
    from dsim.app.tune import busy_hand_over_note
    from dsim.replay.models.pipeline import PreparedPipeline
    from dsim.replay.models.pipeline_kernel import calibrate
    from tests.test_pipeline_model import _alternating_run, _waiting_run

    waiting = _waiting_run()[0]
    note = busy_hand_over_note(PreparedPipeline(waiting, calibrate(waiting, 1, 2)))
    assert note is not None and ", as long as that batch still took:" in note
    flat = _alternating_run()[0]
    note = busy_hand_over_note(PreparedPipeline(flat, calibrate(flat, 1, 2)))
    assert note is not None and "as long as" not in note


def test_a_worker_busy_at_every_hand_over_is_a_caveat():
    """When (nearly) every built batch had a busy worker, the idle hand-over is unknown and
    tune says its gain from more workers may be too small; with idle ones beside, it says
    the measured extra instead."""
    from dataclasses import replace

    from dsim.app.tune import busy_hand_over_note
    from dsim.replay.models.pipeline import PreparedPipeline
    from dsim.replay.models.pipeline_kernel import calibrate
    from tests.test_pipeline_model import _alternating_run

    inputs, _ = _alternating_run()
    cal = calibrate(inputs, 1, 2)
    every = replace(cal, busy=np.ones_like(cal.busy), busy_excess=np.zeros_like(cal.busy_excess))
    note = busy_hand_over_note(PreparedPipeline(inputs, every))
    assert note is not None and note.startswith("100% of the batches built ahead")
    assert "may be too small" in note


def test_a_stall_left_by_an_unseen_hand_over_is_not_called_a_knee():
    """With a worker busy at (nearly) every hand-over the replay cannot shorten the stall
    left, so "more than 1 worker stop helping" (said of a run where 8 workers measured 35 %
    faster, validation/data-r1) becomes "not known" and the setting to re-run with; a
    curve that binds for another reason, or still gains, says what it said."""
    flat = [_point(1, 2, 2.0, 1.0), _point(2, 2, 1.99, 0.99), _point(4, 2, 1.99, 0.99)]
    assert flattening(flat).reason == "stall-left" and flattening(flat).workers == 1
    unknown = flattening(flat, hand_over_unknown=True)
    assert unknown.reason == "hand-over-unknown" and unknown.workers is None
    assert unknown.text == (
        "whether more than 1 worker would help is not known: the stall left (1000.0 ms per "
        "iteration) is batches waiting for a busy worker to hand them over, which the replay "
        "cannot shorten (caveat below); re-run with num_workers=2 to find out"
    )
    bound = [_point(1, 2, 2.0, 0.05), _point(2, 2, 2.0, 0.05)]
    assert flattening(bound, hand_over_unknown=True).reason == "compute-bound"
    still = [_point(1, 2, 2.0, 1.0), _point(2, 2, 1.5, 0.5)]
    assert flattening(still, hand_over_unknown=True).reason == "loading-bound"


def test_the_knee_and_the_caveat_share_one_condition():
    """``unknown_hand_over``, which ``tune_run`` passes to the knee of both choices, holds
    exactly where the caveat fires: every built batch busy and no extra found."""
    from dataclasses import replace

    from dsim.app.tune import unknown_hand_over
    from dsim.replay.models.pipeline import PreparedPipeline
    from dsim.replay.models.pipeline_kernel import calibrate
    from tests.test_pipeline_model import _alternating_run

    inputs, _ = _alternating_run()
    cal = calibrate(inputs, 1, 2)
    every = replace(cal, busy=np.ones_like(cal.busy), busy_excess=np.zeros_like(cal.busy_excess))
    share, wait = unknown_hand_over(PreparedPipeline(inputs, every))
    assert share == 1.0 and wait > 0
    assert unknown_hand_over(PreparedPipeline(inputs, cal)) is None  # an extra was found
    idle = replace(every, busy=np.zeros_like(cal.busy))
    assert unknown_hand_over(PreparedPipeline(inputs, idle)) is None  # idle ones to compare


def test_each_band_is_widened_by_the_error_of_its_kind_of_what_if(traces):
    """At the recorded settings the aligned choice is an alignment what-if alone: its band
    takes the alignment cells' error, narrower than the loader's it took before; the
    recorded settings unaligned are the run itself (no model error); a loader change,
    aligned or not, keeps the loader's."""
    from dsim.analysis.model_error import (
        ALIGN_WHATIF_ERROR,
        LOADER_FEWER_ERROR,
        LOADER_WHATIF_ERROR,
    )
    from dsim.app.tune import model_error_of
    from dsim.replay.params import LoaderSettings
    from dsim.tuning import bands

    recorded = LoaderSettings(workers=2, prefetch_factor=2)
    aligned = Point(2, 2, ("min", "actual"), np.ones(5), np.zeros(5), np.ones(2))
    assert model_error_of(aligned, recorded) == (ALIGN_WHATIF_ERROR, "alignment")
    assert model_error_of(_point(2, 2, 1.0), recorded) == (None, "none")
    assert model_error_of(_point(4, 2, 1.0), recorded) == (LOADER_WHATIF_ERROR, "loader")
    fewer = (LOADER_FEWER_ERROR, "fewer-workers")  # measured on more workers predicting fewer
    assert model_error_of(_point(1, 2, 1.0), recorded) == fewer
    assert model_error_of(_point(1, 8, 1.0), recorded) == fewer
    more = Point(4, 2, ("min", "actual"), np.ones(5), np.zeros(5), np.ones(2))
    assert model_error_of(more, recorded) == (LOADER_WHATIF_ERROR, "loader")
    in_process = LoaderSettings(workers=0, prefetch_factor=2)  # prefetch means nothing there
    assert model_error_of(_point(0, 4, 1.0), in_process) == (None, "none")
    assert model_error_of(_point(2, 2, 1.0), in_process) == (LOADER_WHATIF_ERROR, "loader")

    # a grid of the recorded setting alone (2 workers, prefetch 2): the run, and it aligned
    result = dsim.tune(traces["loading"], workers="2", prefetch=[2], quiet=True)
    assert (result.loader_only.model_error, result.loader_only.error_kind) == (0.0, "none")
    combined = result.with_alignment
    assert (combined.point.workers, combined.point.prefetch) == (2, 2)
    assert combined.point.policy != ("actual", "actual")
    # the synthetic trace logs no cores: each error is the larger of its two kinds of node
    align = ALIGN_WHATIF_ERROR.on(None)
    assert combined.cores_per_rank is None and align == ALIGN_WHATIF_ERROR.many_cores
    assert (combined.model_error, combined.error_kind) == (align, "alignment")
    wider = bands(result.baseline, combined.point, 1.2 * align)["speedup"]
    speed = combined.bands["speedup"]
    assert wider.low < speed.low <= speed.value <= speed.high < wider.high
    doc = document(result)["with_alignment"]
    assert (doc["model_error"], doc["model_error_kind"]) == (align, "alignment")
    assert doc["model_error_node"] is None
    text = "\n".join(lines(result))
    assert f"its band widened by the alignment error (±{align:.1%})" in text


def test_a_costlier_setting_whose_band_reaches_one_is_said_to_be_within_the_error(traces):
    """Held-out 11's and 13's cpu regimes: tune said "use 2 workers" (1.05×, band 0.85-1.34×)
    where 2 measured 7 % slower than the recorded 1. A recommendation that costs more than
    the recorded run and whose speed-up band reaches 1.00× now says it may be no faster;
    a cheaper one at about the same speed, or a clear gain, does not."""
    from dataclasses import replace

    from dsim.app.tune import _choice, is_a_cost
    from dsim.render.tune import WITHIN_ERROR
    from dsim.replay.params import LoaderSettings

    recorded = LoaderSettings(workers=2, prefetch_factor=2)
    assert is_a_cost(_point(4, 2, 1.0), recorded)
    assert not is_a_cost(_point(1, 8, 1.0), recorded)  # fewer workers: cheaper whatever prefetch
    assert is_a_cost(_point(2, 4, 1.0), recorded)
    assert not is_a_cost(_point(2, 1, 1.0), recorded)
    assert not is_a_cost(_point(2, 2, 1.0), recorded)  # the recorded run itself
    aligned = Point(2, 2, ("min", "actual"), np.ones(5), np.zeros(5), np.ones(2))
    assert is_a_cost(aligned, recorded)  # a loader change to make, for no more processes
    assert not is_a_cost(_point(0, 4, 1.0), LoaderSettings(workers=0, prefetch_factor=2))

    # The iteration times vary so that the bootstrap has a spread; the means are as named.
    rng = np.random.default_rng(0)
    jitter = rng.normal(0.0, 0.01, 200)

    def point(workers: int, mean: float) -> Point:
        return Point(workers, 2, ("actual", "actual"), mean + jitter, np.zeros(200), np.ones(2))

    base = point(2, 1.0)
    small = _choice(base, [base, point(4, 0.95)], [0, 1], recorded, 0.5)  # 1.05×: band reaches 1
    assert small.point.workers == 4 and small.bands["speedup"].low <= 1.0 and small.within_error
    clear = _choice(base, [base, point(4, 0.5)], [0, 1], recorded, 0.5)  # 2×: band well above 1
    assert clear.point.workers == 4 and clear.bands["speedup"].low > 1.0
    assert not clear.within_error
    cheaper = _choice(base, [point(1, 1.005), base], [0, 1], recorded, 0.5)  # within 2 %, cheaper
    assert cheaper.point.workers == 1 and cheaper.bands["speedup"].low <= 1.0
    assert not cheaper.within_error

    result = dsim.tune(traces["loading"], workers="1-8", prefetch=[2], quiet=True)
    assert not result.loader_only.within_error  # a clear gain: nothing added
    text = "\n".join(lines(result))
    assert WITHIN_ERROR not in text and document(result)["recommendation"]["within_error"] is False
    flagged = replace(result, loader_only=replace(result.loader_only, within_error=True))
    text = "\n".join(lines(flagged))
    assert f"\n  {WITHIN_ERROR}\n" in text
    assert document(flagged)["recommendation"]["within_error"] is True


def test_the_cores_caveat_says_what_a_cpu_aware_model_still_misses():
    from dsim.analysis.verdict import BLIND_CORES, CPU_AWARE_CORES
    from dsim.app.tune import caveats
    from dsim.replay.params import LoaderSettings

    recorded = LoaderSettings(workers=1, prefetch_factor=2)
    blind = caveats(100, 2, 2, 4, 4, recorded)
    aware = caveats(100, 2, 2, 4, 4, recorded, cpu_aware=True)
    head = "2 workers per rank are 8 worker processes on a node whose run recorded 2 cores"
    assert blind == [f"{head}: they cannot all run at once{BLIND_CORES}"]
    assert aware == [f"{head}: they cannot all run at once{CPU_AWARE_CORES}"]
    assert "does not know the cores" not in aware[0]
    assert caveats(100, 1, 8, 4, 4, recorded, cpu_aware=True) == []  # 4 processes, 8 cores


def test_cpu_times_beyond_the_logged_cores_are_a_caveat_and_a_smooth_curve(tmp_path):
    """Logs giving 4 ranks more CPU than their 1 logged core can run: the sweep is the
    load-independent model's (clamped at the curve's pole, a second worker gained
    nothing), and a caveat says why."""
    from cpulogs import write_cpu_logs

    from dsim.app.parse import discover_runs, parse_and_write
    from dsim.app.tune import tune_run

    logs = write_cpu_logs(tmp_path / "logs" / "onecore", cores=1, iterations=60)
    fmt, (source,) = discover_runs([logs])
    run_dir, _ = parse_and_write(source, tmp_path / "traces", fmt=fmt)
    result = tune_run(run_dir, workers=[1, 2], prefetch=[2], alignment=False)
    over = [c for c in result.caveats if c.startswith("the logs give each node 1.9")]
    assert over and "CPU contention was left out" in over[0], result.caveats
    times = {p.workers: float(p.iteration_s.mean()) for p in result.alone}
    assert times[2] < 0.7 * times[1]  # load-independent: a second worker halves the wait
