"""Every grammar variant and every bad-input case of docs/SPEC.md §1, with exact counts."""

from __future__ import annotations

import numpy as np
import pytest
from loglines import T0, fetch_line, one_epoch, run_of, train_line

from dsim.errors import InputError
from dsim.sources.rawlog.discover import RunSource, discover_runs, tree_run_name
from dsim.sources.rawlog.parse import (
    CLOCK_OUTLIER,
    CONFLICT_TRAIN,
    DUPLICATE_FETCH,
    DUPLICATE_TRAIN,
    NO_RANK,
    parse_run,
)


def test_canonical_interleaved_log(tmp_path):
    parsed = parse_run(run_of(tmp_path, {"output.log": one_epoch()}))
    rep = parsed.report
    assert (rep["fetch_records"], rep["train_records"], rep["rejected"]) == (6, 6, 0)
    assert parsed.tables.info.gpu_count == 2
    assert parsed.tables.info.iterations_per_epoch == {"0": 3}
    fetch = parsed.tables.fetch.to_pandas()
    row = fetch[(fetch.iteration == 1) & (fetch.gpu == 1)].iloc[0]
    assert row.end == np.datetime64("2021-09-01T19:48:11.5")
    assert row.start == np.datetime64("2021-09-01T19:48:10.25")
    assert row.worker == 1 and row.fetch_s == 1.25


@pytest.mark.parametrize("frac", ["8", "84", "841", "841234", "841234567"])
def test_fraction_of_1_to_9_digits_is_exact(tmp_path, frac):
    lines = [fetch_line(f"54.{frac}", 0, 0, "0.5", 0), train_line(f"55.{frac}", 0, 0, 0)]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    end = parsed.tables.fetch["end"][0].value
    whole = np.datetime64("2021-09-01T19:48:54", "ns").astype(np.int64)
    assert end == whole + int(frac.ljust(9, "0"))


@pytest.mark.parametrize("prefix", ["(pid=123) ", "[rank0]:", "[default0]: ", "INFO 12 "])
def test_any_prefix_before_the_timestamp(tmp_path, prefix):
    lines = [
        fetch_line("54.1", 0, 0, "0.5", 0, prefix=prefix),
        train_line("55.1", 0, 0, 0, prefix=prefix),
    ]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert (parsed.report["fetch_records"], parsed.report["train_records"]) == (1, 1)


def test_tabs_spaces_padding_and_crlf(tmp_path):
    lines = [
        f"{T0}54.1\tDEBUG:  GPU:\t0   worker_id: 3,  END FETCH  at_time\t0.5 data idx0",
        f"{T0}55.1  GPU: 0\tEpoch: [0][  0/100]  Time 0.9 ( 0.9)  Data 0.1 ( 0.1)",
    ]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}, newline="\r\n"))
    assert parsed.report["rejected"] == 0
    train = parsed.tables.train.to_pylist()[0]
    assert (train["iteration"], train["iteration_s"], train["stall_s"]) == (0, 0.9, 0.1)
    assert train["throughput"] is None  # optional field
    assert parsed.tables.fetch["worker"][0].as_py() == 3


def test_single_gpu_log_without_gpu_field_is_rank_0(tmp_path):
    lines = [fetch_line("54.1", None, 0, "0.5", 0), train_line("55.1", None, 0, 0)]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert parsed.tables.fetch["gpu"].to_pylist() == [0]
    assert parsed.tables.train["gpu"].to_pylist() == [0]


def test_per_rank_files_take_the_rank_from_the_file_name(tmp_path):
    files = {
        f"rank{r}.log": [fetch_line("54.1", None, 0, "0.5", 0), train_line("55.1", None, 0, 0)]
        for r in (0, 1, 2)
    }
    parsed = parse_run(run_of(tmp_path, files))
    assert sorted(parsed.tables.fetch["gpu"].to_pylist()) == [0, 1, 2]
    assert parsed.tables.info.gpu_count == 3


def test_per_rank_files_without_any_rank_are_rejected(tmp_path):
    files = {n: [fetch_line("54.1", None, 0, "0.5", 0)] for n in ("a.log", "b.log")}
    with pytest.raises(InputError):  # nothing usable is left
        parse_run(run_of(tmp_path, files))
    files["c.log"] = [fetch_line("54.1", 3, 0, "0.5", 0)]
    parsed = parse_run(run_of(tmp_path, files))
    assert parsed.report["skipped"] == {NO_RANK: 2}
    assert parsed.tables.fetch["gpu"].to_pylist() == [3]


def test_start_fetch_and_unknown_lines_are_counted_and_ignored(tmp_path):
    lines = [
        "some banner",
        f"{T0}54.0 DEBUG:\tGPU: 0 worker_id: 0, START FETCH data idx0",
        "",
        fetch_line("54.1", 0, 0, "0.5", 0),
        train_line("55.1", 0, 0, 0),
        "=> loss 1.0",
    ]
    rep = parse_run(run_of(tmp_path, {"output.log": lines})).report
    assert (rep["start_fetch_lines"], rep["blank_lines"], rep["other_lines"]) == (1, 1, 2)
    assert rep["lines"] == 6 and rep["rejected"] == 0


def test_training_lines_printed_after_the_epoch(tmp_path):
    fetches = [fetch_line(f"{10 + i}.0", 0, 0, "0.5", i) for i in range(3)]
    trains = [train_line(f"{10 + i}.5", 0, 0, i) for i in (2, 0, 1)]
    parsed = parse_run(run_of(tmp_path, {"output.log": fetches + trains}))
    assert parsed.report["rejected"] == 0
    assert parsed.tables.train["iteration"].to_pylist() == [0, 1, 2]


def test_epoch_of_fetch_by_time(tmp_path):
    """A fetch takes the epoch of its rank's training line before it (rawlog.epochs)."""
    lines = []
    for epoch, base in ((4, 10), (5, 30)):
        for i in range(2):
            lines.append(fetch_line(f"{base + i}.0", 0, 0, "0.5", i))
            lines.append(train_line(f"{base + i}.5", 0, epoch, i, n=2))
    # Next epoch's first batch is fetched before this epoch's training lines are printed.
    parsed = parse_run(run_of(tmp_path, {"output.log": lines[::2] + lines[1::2]}))
    fetch = parsed.tables.fetch.to_pandas()
    assert fetch.groupby("epoch").iteration.apply(list).to_dict() == {4: [0, 1], 5: [0, 1]}


def test_without_training_lines_epochs_advance_when_indices_start_over(tmp_path):
    lines = [fetch_line(f"{10 + k}.0", 0, k % 2, "0.5", i) for k, i in enumerate([0, 1, 0, 1, 0])]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert parsed.tables.fetch["epoch"].to_pylist() == [0, 0, 1, 1, 2]


def test_fetches_beyond_the_last_training_line_continue_the_epoch_count(tmp_path):
    lines = [
        fetch_line("10.0", 0, 0, "0.5", 0),
        train_line("10.5", 0, 7, 0, n=1),
        fetch_line("11.0", 0, 0, "0.5", 0),
    ]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert parsed.tables.fetch["epoch"].to_pylist() == [7, 8]
    assert parsed.report["incomplete_iterations"]["count"] == 1


def test_last_line_cut_off(tmp_path):
    lines = one_epoch(gpus=(0,), iters=2)
    lines[-1] = lines[-1][:40]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}, final_newline=False))
    rep = parsed.report
    assert rep["skipped"] == {"truncated last line (no line end)": 1}
    assert (rep["fetch_records"], rep["train_records"]) == (2, 1)
    assert rep["incomplete_iterations"]["count"] == 1


def test_bad_records_are_skipped_and_counted_by_reason(tmp_path):
    good = one_epoch(gpus=(0, 1), iters=2)
    bad = [
        fetch_line("20.0", 0, 0, "-1.5", 1),  # negative duration
        fetch_line("20.0", 0, 0, "abc", 1),  # non-numeric duration
        f"{T0}20.0 DEBUG:\tGPU: 0 worker_id: 0, END FETCH at_time",  # malformed
        train_line("20.0", 0, 0, 1, time="x"),  # non-numeric training value
        train_line("20.0", 0, 0, 1, data="-0.5"),  # negative training value
        "2021-13-01 19:48:20.0 GPU: 0 Epoch: [0][  1/3]\tTime 1 (1)\tData 1 (1)",  # bad date
        good[0],  # exact duplicate fetch
        good[1],  # exact duplicate training record
        train_line("10.75", 1, 0, 1, time="0.8"),  # conflicts with GPU 1's iteration 1
        "GPU: 0 Epoch: [0] garbage",  # malformed training line
    ]
    parsed = parse_run(run_of(tmp_path, {"output.log": good + bad}))
    assert parsed.report["skipped"] == {
        "negative fetch duration": 1,
        "non-numeric fetch duration": 1,
        "malformed fetch line": 1,
        "non-numeric training value": 1,
        "negative training value": 1,
        "invalid timestamp": 1,
        "malformed training line": 1,
        DUPLICATE_FETCH: 1,
        DUPLICATE_TRAIN: 1,
        CONFLICT_TRAIN: 2,
    }
    assert (parsed.report["fetch_records"], parsed.report["train_records"]) == (4, 3)
    rejects = parsed.rejects.to_pylist()
    assert [r["line"] for r in rejects] == sorted(r["line"] for r in rejects)
    assert all(r["file"].endswith("output.log") for r in rejects)


def test_clock_going_backwards_is_rejected(tmp_path):
    lines = [
        fetch_line("10.0", 0, 0, "0.5", 0),
        fetch_line("12.0", 0, 0, "0.5", 1),
        fetch_line("11.0", 0, 0, "0.5", 2),  # same worker, earlier than its previous line
        train_line("10.5", 0, 0, 0),
        train_line("12.5", 0, 0, 1),
        train_line("12.1", 0, 0, 2),  # iteration 2 starts before iteration 1
    ]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert parsed.report["skipped"] == {CLOCK_OUTLIER: 2}
    assert [r["line"] for r in parsed.rejects.to_pylist()] == [3, 6]


def test_ranks_missing_from_some_iterations_are_reported(tmp_path):
    lines = one_epoch(gpus=(0, 1), iters=3)
    lines = [line for line in lines if not ("GPU: 1" in line and "idx2" in line)]
    rep = parse_run(run_of(tmp_path, {"output.log": lines})).report
    assert rep["incomplete_iterations"]["count"] == 1
    assert rep["incomplete_iterations"]["examples"][0]["iteration"] == 2


@pytest.mark.parametrize(
    "content", [b"", b"\n\n", b"\x00\xff\xfe garbage \x89PNG\r\n\x1a\n" * 50, b"hello\nworld\n"]
)
def test_empty_or_garbage_input_is_a_clear_error(tmp_path, content):
    path = tmp_path / "output.log"
    path.write_bytes(content)
    with pytest.raises(InputError) as err:
        parse_run(RunSource("run", (path,)))
    assert "no fetch or training records" in str(err.value)
    assert str(path) in str(err.value)


def test_binary_garbage_amid_good_lines_is_counted(tmp_path):
    good = one_epoch(gpus=(0,), iters=2)
    path = tmp_path / "output.log"
    path.write_bytes(("\n".join(good) + "\n").encode() + b"\xff\xfe\x00junk\n" * 3)
    rep = parse_run(RunSource("run", (path,))).report
    assert rep["skipped"] == {"binary data (not UTF-8 text)": 3}
    assert (rep["fetch_records"], rep["train_records"]) == (2, 2)


def test_strict_names_file_line_and_reason(tmp_path):
    lines = [*one_epoch(gpus=(0,), iters=2), fetch_line("20.0", 0, 0, "-1", 1)]
    source = run_of(tmp_path, {"output.log": lines})
    with pytest.raises(InputError) as err:
        parse_run(source, strict=True)
    assert err.value.line == 5 and err.value.path.name == "output.log"
    assert "negative fetch duration" in str(err.value)


def test_block_boundaries_do_not_change_the_result(tmp_path, monkeypatch):
    lines = one_epoch(gpus=(0, 1, 2), iters=40)
    source = run_of(tmp_path, {"output.log": lines})
    whole = parse_run(source)
    import dsim.sources.rawlog.logfile

    monkeypatch.setattr(dsim.sources.rawlog.logfile, "BLOCK_BYTES", 97)
    monkeypatch.setattr(dsim.sources.rawlog.logfile.read_log, "__defaults__", (None, 97))
    pieces = parse_run(source)
    assert pieces.tables.fetch.equals(whole.tables.fetch)
    assert pieces.tables.train.equals(whole.tables.train)
    assert pieces.report == whole.report


def test_run_discovery_and_names(tmp_path):
    leaf = tmp_path / "log/DDP4GPU/fsNprep/imagenet/default/resnet50/epoch5/b2048/worker12/thread0"
    leaf.mkdir(parents=True)
    (leaf / "output.log").write_text("x\n")
    other = tmp_path / "log/plain_run"
    other.mkdir(parents=True)
    (other / "rank0.log").write_text("x\n")
    (other / "rank1.log").write_text("x\n")
    runs = {r.name: r for r in discover_runs([tmp_path / "log"])}
    assert set(runs) == {
        "fsNprep_imagenet_default_resnet50_epoch5_b2048_worker12_thread0",
        "plain_run",
    }
    assert len(runs["plain_run"].files) == 2
    assert tree_run_name(leaf) in runs
    assert discover_runs([other / "rank0.log"])[0].name == "plain_run"
    single = tmp_path / "myjob.log"
    single.write_text("x\n")
    assert discover_runs([single])[0].name == "myjob"
    assert discover_runs([single], name="custom")[0].name == "custom"


def test_a_corrupt_iteration_out_of_time_order_is_rejected_alone(tmp_path):
    """Its key repeats another line's, but the clock rule takes it out first: the conflict
    rule then finds no repeat among the lines kept (it must look again, not reuse what it
    found before the clock rule, when it would reject both copies)."""
    lines = [train_line(f"{10 + i}.5", 0, 0, i, n=6) for i in range(6)]
    lines.insert(5, train_line("14.9", 0, 0, 2, n=6))  # iteration 4's line with a flipped digit
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert parsed.report["skipped"] == {CLOCK_OUTLIER: 1}
    assert [r["line"] for r in parsed.rejects.to_pylist()] == [6]
    assert parsed.report["train_records"] == 6


@pytest.mark.parametrize(
    "values",
    [
        [3, 1, 2, 3, 3, 1, 1],  # a tie: the smaller
        [7],
        [0, 0, 5, 5, 2],
        [10**9, 10**9 - 1, 10**9],  # big values, a small span: counted
        [0, 10**9, 10**9, 5],  # a wide span: np.unique's way
        [*range(1000, 0, -1), 500],
    ],
)
def test_counted_distinct_and_most_common_equal_numpys(values):
    """The parser's counts (``dsim.sets.distinct``, which tests/test_sets.py checks at
    large, and the parser's own ``_most_common``) on the shapes its columns take."""
    from dsim.sets import distinct as distinct_of
    from dsim.sources.rawlog.parse import _most_common

    for dtype in (np.int32, np.int64):
        array = np.array(values, dtype)
        distinct, freq = np.unique(array, return_counts=True)
        assert len(distinct_of(array)) == len(distinct)
        assert _most_common(array) == int(distinct[np.argmax(freq)])
