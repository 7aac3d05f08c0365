"""The epoch of a fetch comes from its rank's training timeline, so a defect stays local.

Logs come from ``dsim.synth`` (the queueing model: bounded prefetch, the next
epoch's loader starting after the last iteration), whose parse is known to be
exact; ``fuzzlog`` edits them and judges the parse of every edited log
against the parse of the original.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
from fuzzlog import PROPERTY_EDITS, Mutant, Original, check, mutate, parse_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loglines import fetch_line, run_of, train_line

from dsim.errors import InputError
from dsim.sources.rawlog.epochs import TOL_NS, assign_fetch_epochs, tolerance
from dsim.sources.rawlog.parse import (
    CONFLICT_FETCH,
    CONFLICT_TRAIN,
    DUPLICATE_FETCH,
    DUPLICATE_TRAIN,
    parse_run,
)
from dsim.synth import SynthParams, synthesize


def _synth(tmp_path: Path, **kwargs) -> Path:
    params = {"gpus": 4, "iterations": 40, "epochs": 2, "workers": 2, "seed": 3} | kwargs
    return synthesize(SynthParams(**params), tmp_path / "logs")


def _find(mutant: Mutant, needle: str, nth: int = 0) -> tuple[str, int]:
    """(file, piece index) of the nth line containing ``needle``."""
    hits = [
        (name, k)
        for name, pieces in mutant.pieces.items()
        for k, p in enumerate(pieces)
        if needle.encode() in p.text
    ]
    return hits[nth]


def _records(parsed) -> set[tuple]:
    fetch, train = parsed.tables.fetch, parsed.tables.train
    f = zip(*(fetch[c].to_pylist() for c in ("epoch", "iteration", "gpu", "fetch_s")), strict=True)
    t = zip(*(train[c].to_pylist() for c in ("epoch", "iteration", "gpu", "stall_s")), strict=True)
    return {("fetch", *r) for r in f} | {("train", *r) for r in t}


def test_a_lost_training_line_makes_no_phantom_epoch(tmp_path):
    """GPU 1 loses its training line of epoch 0, iteration 30: only that record is missing."""
    run = _synth(tmp_path)
    original = Original(run)
    mutant = Mutant.of(run)
    name, k = _find(mutant, "GPU: 1 Epoch: [0][30/40]")
    mutant.pieces[name].pop(k)
    mutant.dropped.add((name, k))
    check(original, mutant, tmp_path / "m")
    parsed, _ = parse_dir(tmp_path / "m")
    assert list(parsed.tables.info.epochs_present) == [0, 1]
    assert parsed.report["incomplete_iterations"]["count"] == 1
    before, _ = parse_dir(run)
    lost = {r for r in _records(before) if r[:4] == ("train", 0, 30, 1)}
    assert _records(parsed) == _records(before) - lost


def test_a_lost_fetch_line_leaves_the_other_epoch_alone(tmp_path):
    run = _synth(tmp_path)
    mutant = Mutant.of(run)
    name, k = _find(mutant, "GPU: 2 worker_id: 0, END FETCH", nth=5)  # an epoch-0 fetch
    mutant.pieces[name].pop(k)
    mutant.dropped.add((name, k))
    check(Original(run), mutant, tmp_path / "m")
    parsed, _ = parse_dir(tmp_path / "m")
    before, _ = parse_dir(run)
    assert len(_records(before) - _records(parsed)) == 1
    assert _records(parsed) <= _records(before)


def test_many_lines_cut_short_move_no_other_record(tmp_path):
    run = _synth(tmp_path, iterations=60)
    original = Original(run)
    rng = random.Random(7)
    mutant = mutate(run, rng, 50, kinds=("cut",))
    result = check(original, mutant, tmp_path / "m")
    assert result["rejected"] >= 20  # many cuts leave a line that is a record no more


def test_repeated_and_conflicting_records(tmp_path):
    run = _synth(tmp_path, gpus=2)
    mutant = Mutant.of(run)
    fetch = _find(mutant, "GPU: 0 worker_id: 1, END FETCH", nth=3)
    train = _find(mutant, "GPU: 1 Epoch: [1][ 5/40]")
    other_fetch = _find(mutant, "GPU: 1 worker_id: 0, END FETCH", nth=7)
    other_train = _find(mutant, "GPU: 0 Epoch: [0][12/40]")
    edits = []
    for (name, k), kind in ((fetch, "copy"), (train, "copy"), (other_fetch, "edit"),
                            (other_train, "edit")):  # fmt: skip
        text = mutant.pieces[name][k].text
        if kind == "edit":  # one more digit in the last value: same keys, other values
            old, new = (b" data idx", b"1 data idx") if b"FETCH" in text else (b"Time ", b"Time 1")
            text = text.replace(old, new)
        edits.append((name, k, text))
    for name, k, text in sorted(edits, key=lambda e: -e[1]):
        mutant.pieces[name].insert(k + 1, type(mutant.pieces[name][k])(text, None, changed=True))
    parsed, _ = parse_dir(Path(mutant.write(tmp_path / "m") and tmp_path / "m"))
    assert parsed.report["skipped"] == {
        DUPLICATE_FETCH: 1,
        DUPLICATE_TRAIN: 1,
        CONFLICT_FETCH: 2,
        CONFLICT_TRAIN: 2,
    }
    assert parsed.report["incomplete_iterations"]["count"] == 2
    assert "two runs" not in " ".join(parsed.report.get("warnings", []))


def test_two_runs_appended_to_one_log_are_refused_naming_the_lines(tmp_path):
    """Two jobs of the same ranks in one file used to parse, their overlap rejected (#20)."""
    first = _synth(tmp_path, gpus=2, seed=1, name="a")
    second = _synth(tmp_path, gpus=2, seed=2, name="b")
    both = tmp_path / "both"
    both.mkdir()
    one = (first / "output.log").read_bytes()
    (both / "output.log").write_bytes(one + (second / "output.log").read_bytes())
    split = one.count(b"\n")
    with pytest.raises(InputError) as err:
        parse_dir(both)
    message = str(err.value)
    assert message.startswith(
        f"{both}/output.log: GPU 0 logs 80 of its 80 iterations more than once"
    )
    assert "(first copies at output.log:" in message
    assert f"later ones at output.log:{split + 1}" not in message  # the first line is a fetch
    later = int(message.split("later ones at output.log:")[1].split("-")[0])
    assert split < later < split + 20
    assert "GPU 1 likewise): two jobs, or one started again, in one run" in message


def test_a_few_conflicting_lines_are_no_second_job(tmp_path):
    lines = []
    for i in range(20):
        for g in (0, 1):
            lines.append(fetch_line(f"{10 + i:02d}.5", g, 0, "0.25", i))
            lines.append(train_line(f"{10 + i:02d}.75", g, 0, i, n=20))
    lines.insert(9, train_line("11.75", 0, 0, 1, n=20, time="0.8"))  # 1 of 20 keys twice
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert parsed.report["skipped"] == {CONFLICT_TRAIN: 2}


# -- the rule itself, on arrays -----------------------------------------------------------------

S = 1_000_000_000


def _epochs(fetch, train):
    """fetch: (gpu, idx, end s); train: (gpu, epoch, iteration, total, start s)."""
    f = np.array(fetch, dtype=np.float64).reshape(-1, 3)
    t = np.array(train, dtype=np.float64).reshape(-1, 5)
    ns = lambda x: (x * S).round().astype(np.int64)  # noqa: E731
    out = assign_fetch_epochs(
        f[:, 0].astype(np.int32), f[:, 1].astype(np.int32), ns(f[:, 2]),
        t[:, 0].astype(np.int32), t[:, 1].astype(np.int32), t[:, 2].astype(np.int32),
        t[:, 3].astype(np.int32), ns(t[:, 4]),
    )  # fmt: skip
    return out.tolist()


def test_rule_prefetch_across_an_epoch_boundary():
    train = [(0, 5, i, 3, 10 + i) for i in range(3)] + [(0, 6, i, 3, 20 + i) for i in range(3)]
    fetch = [
        (0, 0, 9.5), (0, 1, 9.9), (0, 2, 11.5),  # epoch 5
        (0, 0, 12.2), (0, 1, 12.5),  # batches of epoch 6, fetched while epoch 5 ends
        (0, 2, 21.5),  # epoch 6
        (0, 0, 23.0),  # after the last line: a batch of epoch 7
    ]  # fmt: skip
    assert _epochs(fetch, train) == [5, 5, 5, 6, 6, 6, 7]


def test_rule_before_the_first_line_and_ranks_without_lines():
    train = [(0, 3, 0, 2, 10), (0, 3, 1, 2, 11)]
    fetch = [(0, 1, 5.0), (1, 0, 1.0), (1, 0, 2.0), (1, 1, 3.0), (1, 0, 4.0)]
    # Rank 1 has no training line: the k-th fetch of a batch index is in epoch 3 + k.
    assert _epochs(fetch, train) == [3, 3, 4, 3, 5]


def test_rule_tolerates_fetch_ends_rounded_up_by_a_millisecond():
    train = [(0, 0, i, 3, 10 + i) for i in range(3)]
    half = TOL_NS / S / 2
    fetch = [(0, 0, 10 + half), (0, 1, 11 + half), (0, 2, 12 + 2.5 * half)]
    assert _epochs(fetch, train) == [0, 0, 1]  # the last one ended well after its line


def test_tolerance_is_the_resolution_of_the_printed_fetch_end(tmp_path):
    """Iterations shorter than a millisecond (an in-process loader): microsecond stamps decide."""
    lines = [
        fetch_line("10.000030", 0, 0, "0.00001", 0),
        train_line("10.000050", 0, 0, 0, n=1),
        fetch_line("10.000400", 0, 0, "0.00001", 0),  # the next epoch's batch, 350 µs later
        train_line("10.000420", 0, 1, 0, n=1),
    ]
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert parsed.report["rejected"] == 0
    assert parsed.tables.fetch["epoch"].to_pylist() == [0, 1]
    resolution = [TOL_NS] * 3 + [10**k for k in (5, 4, 3, 2, 1, 0)]  # 1..9 digits, at most 1 ms
    assert tolerance(np.arange(1, 10)).tolist() == resolution


def test_rule_epochs_of_different_lengths_and_one_corrupt_n():
    train = [(0, 0, i, 3, 10 + i) for i in range(3)] + [(0, 1, i, 8, 20 + i) for i in range(8)]
    fetch = [(0, 5, 12.5)]  # batch 5 of epoch 1, fetched before epoch 1's first line
    assert _epochs(fetch, train) == [1]
    train[4] = (0, 1, 1, 2, 21)  # one line of epoch 1 says N = 2: batch 3 is still epoch 1's
    assert _epochs([(0, 3, 21.5)], train) == [1]


def test_rule_same_result_when_rank_and_time_do_not_fit_one_key():
    rng = np.random.default_rng(0)
    train = [(g, e, i, 20, 100 + e * 50 + i * 2) for g in (0, 5) for e in (0, 1) for i in range(20)]
    fetch = [(g, i, 99 + e * 50 + i * 2 + rng.random()) for g in (0, 5) for e in (0, 1)
             for i in range(20)]  # fmt: skip
    small = _epochs(fetch, train)
    huge = [(g * 100_000, *rest) for g, *rest in train]  # 10^5 ranks x 100 s > 2^62 ns
    assert _epochs([(g * 100_000, *rest) for g, *rest in fetch], huge) == small
    assert small == [e for g in (0, 5) for e in (0, 1) for _ in range(20)]


# -- the property ------------------------------------------------------------------------------


@st.composite
def synth_params(draw: st.DrawFn) -> SynthParams:
    workers, prefetch = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    return SynthParams(
        gpus=draw(st.integers(1, 4)),
        iterations=draw(st.integers(workers * prefetch + 2, 30)),
        epochs=draw(st.integers(1, 3)),
        workers=workers,
        prefetch=prefetch,
        seed=draw(st.integers(0, 1000)),
        skew=draw(st.sampled_from([0.0, 0.5])),
        straggler_prob=draw(st.sampled_from([0.0, 0.1])),
        per_rank=draw(st.booleans()),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=synth_params(), seed=st.integers(0, 2**32 - 1), edits=st.integers(1, 5))
def test_deleted_duplicated_or_corrupted_records_move_no_other_record(params, seed, edits):
    """Every iteration no edit touched keeps exactly its records: same epoch, same values."""
    with tempfile.TemporaryDirectory() as tmp:
        run = synthesize(params, Path(tmp) / "logs")
        mutant = mutate(run, random.Random(seed), edits, kinds=PROPERTY_EDITS)
        check(Original(run), mutant, Path(tmp) / "mutant")


@pytest.mark.parametrize("edit", PROPERTY_EDITS)
def test_each_kind_of_edit_on_a_bigger_log(tmp_path, edit):
    run = _synth(tmp_path, gpus=4, iterations=80, workers=3)
    original = Original(run)
    for seed in range(3):
        mutant = mutate(run, random.Random(seed), 8, kinds=(edit,))
        check(original, mutant, tmp_path / f"m{seed}")


def test_batches_prefetched_before_a_resumed_epoch_go_to_that_epoch(tmp_path):
    """Epochs 0, then 2 (resumed from a checkpoint): epoch 2's first batches, fetched before its
    first training line, used to land in epoch 1, which this run never trained (#20)."""
    lines = []
    for epoch, t0 in ((0, 10), (2, 30)):
        for i in range(3):
            for g in (0, 1):
                # batch i ends before iteration i starts, batch 0 and 1 before iteration 0
                lines.append(
                    fetch_line(f"{t0 + max(i - 1, 0) * 2 + 0.2 * i:05.2f}", g, i, "0.5", i)
                )
                lines.append(train_line(f"{t0 + i * 2 + 0.5:05.2f}", g, epoch, i))
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    fetch = parsed.tables.fetch.to_pandas()
    assert sorted(set(fetch["epoch"])) == [0, 2]
    assert parsed.tables.info.epochs_present == (0, 2)
    assert parsed.report["incomplete_iterations"]["count"] == 0
    assert parsed.report["skipped"] == {}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=3).flatmap(
        lambda spans: st.tuples(
            st.just(spans),
            st.integers(0, 400),
            st.integers(-5, 5),
            st.integers(0, 2**32 - 1),
        )
    )
)
def test_lexsort_order_is_numpys_lexsort_on_every_path(case):
    """Keys spanning up to 16 bits (the radix path), more (the packed argsort) or past 2^62
    (np.lexsort itself): one order, ties by row."""
    spans, n, offset, seed = case
    from dsim.sources.rawlog.epochs import lexsort_order

    rng = np.random.default_rng(seed)
    keys = [rng.integers(0, span, n).astype(np.int64) + offset for span in spans]
    assert np.array_equal(lexsort_order(keys), np.lexsort(keys[::-1]))
    wide = [*keys, rng.integers(0, 2**40, n)]  # too wide to pack with the row number
    assert np.array_equal(lexsort_order(wide), np.lexsort(wide[::-1]))
