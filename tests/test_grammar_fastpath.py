"""The canonical fast path of the grammar must agree with the general path, line for line.

``parse_lines(..., fast=False)`` runs every line through the general regular
expressions; the default cuts canonical lines by position. Both must give the
same records (same values, same order, same dtypes), the same counts and the
same rejects, for canonical lines and for lines one edit away from canonical.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsim.sources.rawlog import grammar
from dsim.sources.rawlog.fastpath import fast_records


def _parse(text: bytes, fast: bool, first_line: int = 1, max_duration=grammar.MAX_DURATION_S):
    rejects = grammar.Rejects()
    records = grammar.parse_lines(
        grammar.lines_of(text), first_line, rejects, fast=fast, max_duration=max_duration
    )
    return records, rejects.table()


def _assert_same(text: bytes, max_duration: float = grammar.MAX_DURATION_S) -> grammar.BlockRecords:
    fast, fast_rejects = _parse(text, fast=True, max_duration=max_duration)
    slow, slow_rejects = _parse(text, fast=False, max_duration=max_duration)
    for kind in ("fetch", "train"):
        a, b = getattr(fast, kind), getattr(slow, kind)
        assert list(a) == list(b)
        for key in a:
            assert a[key].dtype == b[key].dtype, (kind, key)
            nan = a[key].dtype.kind == "f"
            assert np.array_equal(a[key], b[key], equal_nan=nan), (kind, key, a[key], b[key])
    assert fast.counts == slow.counts
    assert fast_rejects.equals(slow_rejects), (fast_rejects.to_pylist(), slow_rejects.to_pylist())
    return fast


digits = st.integers(0, 10**9 - 1)
fraction = st.integers(1, 9).flatmap(lambda n: st.text("0123456789", min_size=n, max_size=n))
number = st.one_of(
    st.floats(0, 1e6, allow_nan=False).map(repr),
    # Out of range, non-finite, or at the bounds of rawlog.bounds (a day; Data <= Time + 1 ms).
    st.sampled_from(["1e999", "1e400", "1e300", "86400", "86400.0005", "86400.001", "90000"]),
    st.tuples(
        st.text("0123456789", min_size=1, max_size=25), st.text("0123456789", max_size=25)
    ).map(lambda t: f"{t[0]}.{t[1]}" if t[1] else t[0]),
)


@st.composite
def timestamps(draw: st.DrawFn) -> str:
    y, mo, d = draw(st.integers(1970, 2100)), draw(st.integers(1, 12)), draw(st.integers(1, 31))
    h, mi, s = draw(st.integers(0, 23)), draw(st.integers(0, 59)), draw(st.integers(0, 59))
    return f"{y:04d}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d}.{draw(fraction)}"


@st.composite
def fetch_lines(draw: st.DrawFn) -> str:
    gpu, worker = draw(st.integers(0, 999999)), draw(st.integers(0, 999999))
    tail = ""
    if draw(st.booleans()):  # dsim.instrument's optional CPU times and stages (SPEC §1.2)
        if draw(st.booleans()):
            tail += f" cpu {draw(number)}" + (
                f" runq {draw(number)}" if draw(st.booleans()) else ""
            )
            tail += f" proc {draw(number)}" if draw(st.booleans()) else ""
        if draw(st.booleans()):
            tail += "".join(f" {name} {draw(number)}" for name in grammar.STAGE_FIELDS)
    return (
        f"{draw(timestamps())} DEBUG:\tGPU: {gpu} worker_id: {worker}, END FETCH at_time "
        f"{draw(number)} data idx{draw(digits)}{tail}"
    )


@st.composite
def train_lines(draw: st.DrawFn) -> str:
    total = draw(st.integers(1, 10**9 - 1))
    it = draw(st.integers(0, total + 2))  # sometimes not below the total: a reject
    pad = draw(st.integers(0, 14))
    tp = draw(st.none() | number)
    tail = f"\tThroughput {tp} ({draw(number)})" if tp is not None else ""
    return (
        f"{draw(timestamps())} GPU: {draw(st.integers(0, 999999))} "
        f"Epoch: [{draw(st.integers(0, 999999))}][{it:>{pad}}/{total}]\t"
        f"Time {draw(number)} ({draw(number)})\tData {draw(number)} ({draw(number)}){tail}"
    )


canonical = st.one_of(fetch_lines(), train_lines())
EDITS = [*" \t\r.:-,()[]/0123456789xE+-", "", "  ", "\ufffd", "\x00", "GPU: ", "e-05"]


@st.composite
def near_canonical(draw: st.DrawFn) -> str:
    """A canonical line with one edit: a byte replaced, inserted or removed, or a cut."""
    line = draw(canonical)
    i = draw(st.integers(0, len(line)))
    edit = draw(st.sampled_from(["replace", "insert", "delete", "cut", "prefix", "suffix"]))
    piece = draw(st.sampled_from(EDITS))
    if edit == "replace":
        return line[:i] + piece + line[i + 1 :]
    if edit == "insert":
        return line[:i] + piece + line[i:]
    if edit == "delete":
        return line[:i] + line[i + 1 :]
    if edit == "cut":
        return line[:i]
    if edit == "prefix":
        return draw(st.sampled_from(["(pid=1) ", "[rank0]:", " ", "x"])) + line
    return line + draw(
        st.sampled_from(
            ["\r", " ", "\t", " x", "(1)", "\tLoss 6.9 (6.9)", "\tAcc@1   0.00 (  0.10)",
             "\tThroughput 5", "\tThroughput 5 (5", "\tLoss 6.9 (6."]
        )
    )  # fmt: skip


def _block(lines: list[str], newline: str) -> bytes:
    return (newline.join(lines) + newline).encode("utf-8", errors="surrogatepass")


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(lines=st.lists(canonical, min_size=1, max_size=30), crlf=st.booleans())
@example(
    lines=["2021-09-01 19:48:54.841 DEBUG:\tGPU: 0 worker_id: 2, END FETCH at_time 8.1 data idx0"],
    crlf=False,
)
def test_canonical_lines_agree(lines: list[str], crlf: bool) -> None:
    _assert_same(_block(lines, "\r\n" if crlf else "\n"))


@SETTINGS
@given(
    lines=st.lists(st.one_of(canonical, near_canonical()), min_size=1, max_size=30),
    max_duration=st.sampled_from([grammar.MAX_DURATION_S, 10.0, 0.5]),
)
def test_near_canonical_lines_agree(lines: list[str], max_duration: float) -> None:
    _assert_same(_block(lines, "\n"), max_duration)


@SETTINGS
@given(lines=st.lists(st.one_of(canonical, near_canonical()), min_size=1, max_size=10))
def test_last_line_without_line_end_agrees(lines: list[str]) -> None:
    _assert_same("\n".join(lines).encode())


def test_long_blocks_take_the_fast_path_and_agree() -> None:
    """Most lines of a long block lie far from its end, where the windows need no padding."""
    fetch = (
        "2021-09-01 19:48:{:02d}.{} DEBUG:\tGPU: {} worker_id: {}, END FETCH at_time {} data idx{}"
    )
    train = "2021-09-01 19:48:{:02d}.{} GPU: {} Epoch: [3][{:>5}/{}]\tTime {} (1.5)\tData {} (0.5)"
    lines = []
    for i in range(2000):
        lines.append(fetch.format(i % 60, "841"[: 1 + i % 3], i % 8, i % 5, f"{i}.25", i))
        tp = f"\tThroughput {i}.5 ({i}.5)" if i % 3 else ""
        lines.append(train.format(i % 60, "191641", i % 8, i, 2000, "1.9", f"0.{i}") + tp)
    records = _assert_same(_block(lines, "\n"))
    assert len(records.fetch["line"]) == len(records.train["line"]) == 2000
    assert np.isnan(records.train["throughput"][0]) and records.train["throughput"][1] == 1.5


def test_fast_path_handles_what_it_can_and_leaves_the_rest() -> None:
    """The general path sees only the lines the fast path could not vouch for."""
    good = "2021-09-01 19:48:54.841 DEBUG:\tGPU: 0 worker_id: 2, END FETCH at_time 8.1 data idx0"
    lines = [good] * 600 + ["[rank0]:" + good, good.replace("8.1", "-8.1"), "hello"]
    text = _block(lines, "\n")
    numbers = np.arange(1, len(lines) + 1, dtype=np.int64)
    fetch, train, rest = fast_records(grammar.lines_of(text), numbers, grammar.MAX_DURATION_S)
    assert len(fetch["line"]) == 600 and len(train["line"]) == 0
    assert rest.tolist() == [600, 601, 602]
    records = _assert_same(text)
    assert len(records.fetch["line"]) == 601  # the prefixed line, by the general path


def test_calendar_and_range_checks_match() -> None:
    lines = [
        "2262-01-01 00:00:00.5 DEBUG:\tGPU: 0 worker_id: 0, END FETCH at_time 1.0 data idx0",
        "1969-12-31 23:59:59.5 GPU: 0 Epoch: [0][1/5]\tTime 1.0 (1.0)\tData 0.5 (0.5)",
        "2020-02-29 23:59:59.5 GPU: 0 Epoch: [0][1/5]\tTime 1.0 (1.0)\tData 1.5 (0.5)",
        "2020-02-29 23:59:59.5 GPU: 0 Epoch: [0][1/5]\tTime 86401.0 (1.0)\tData 1.5 (0.5)",
        "2021-02-29 00:00:00.5 DEBUG:\tGPU: 0 worker_id: 0, END FETCH at_time 1.0 data idx0",
        "2020-02-29 24:00:00.5 DEBUG:\tGPU: 0 worker_id: 0, END FETCH at_time 1.0 data idx0",
        "2020-02-29 23:59:59.5 DEBUG:\tGPU: 0 worker_id: 0, END FETCH at_time 99999999.0 data idx0",
        "2020-02-29 23:59:59.5 GPU: 0 Epoch: [0][5/5]\tTime 1.0 (1.0)\tData 0.5 (0.5)",
        "2020-02-29 23:59:59.1234567890 GPU: 0 Epoch: [0][1/5]\tTime 1.0 (1.0)\tData 0.5 (0.5)",
    ]
    records = _assert_same(_block(lines * 20, "\n"))
    assert len(records.fetch["line"]) == len(records.train["line"]) == 0


def test_binary_garbage_is_rewritten_before_either_path() -> None:
    good = "2021-09-01 19:48:54.841 DEBUG:\tGPU: 0 worker_id: 2, END FETCH at_time 8.1 data idx0"
    text = (good + "\n").encode() * 10 + b"\xff\xfe\x00junk\n" + (good + "\n").encode() * 10
    records = _assert_same(text)
    assert len(records.fetch["line"]) == 20
    assert pa.array(records.fetch["line"]).to_pylist()[10] == 12


decimal = st.tuples(
    st.text("0123456789", min_size=1, max_size=15), st.text("0123456789", max_size=23)
).map(lambda t: f"{t[0]}.{t[1]}" if t[1] else t[0])
near_2_53 = st.integers(2**53 - 2000, 2**53 + 2000).flatmap(
    lambda m: st.integers(0, 15).map(lambda k: f"{str(m)[: 16 - k]}.{str(m)[16 - k :]}".rstrip("."))
)

plain_repr = st.floats(0, 1e9).map(repr).filter(lambda r: "e" not in r)  # exponents: general path


@SETTINGS
@given(tokens=st.lists(st.one_of(decimal, near_2_53, plain_repr), min_size=1))
def test_fast_decimals_are_correctly_rounded(tokens: list[str]) -> None:
    """The quick m / 10^k parse (and Arrow's, for the rest) is float(text), to the bit."""
    line = "2021-09-01 19:48:54.841 DEBUG:\tGPU: 0 worker_id: 2, END FETCH at_time {} data idx{}"
    text = _block([line.format(t, i) for i, t in enumerate(tokens)], "\n")
    numbers = np.arange(1, len(tokens) + 1, dtype=np.int64)
    fetch, _, rest = fast_records(grammar.lines_of(text), numbers, grammar.MAX_DURATION_S)
    expected = np.array([float(t) for t in tokens])
    small = expected <= grammar.MAX_DURATION_S
    assert rest.tolist() == np.flatnonzero(~small).tolist()  # all taken but the out-of-range
    assert fetch["fetch_s"].view(np.int64).tolist() == expected[small].view(np.int64).tolist()


OLD_FETCH = "2021-09-01 19:48:54.841 DEBUG:\tGPU: 0 worker_id: 2, END FETCH at_time 8.11 data idx0"
OLD_TRAIN = (
    "2021-09-01 19:48:55.191641 GPU: 0 Epoch: [1][  0/851]\tTime 9.77 (9.77)\tData 8.59 (8.59)"
)


def test_cpu_suffixes_parse_the_same_on_both_paths_and_old_lines_carry_nan() -> None:
    lines = [
        OLD_FETCH,
        OLD_FETCH.replace("idx0", "idx1 cpu 0.031000000 runq 0.002500000"),
        OLD_FETCH.replace("idx0", "idx2 cpu 0.5"),
        OLD_TRAIN,
        OLD_TRAIN.replace("[  0/", "[  1/") + "\tCPU 0.004100 (0.004000)\tRunq 0.0002 (0.0001)",
        # CPU before other fields; a field named after it is left to the generic tail
        OLD_TRAIN.replace("[  0/", "[  2/") + "\tCPU 0.25 (0.2)\tLoss 6.9 (6.9)",
        OLD_FETCH.replace("idx0", "idx3 cpu -1"),  # a bad CPU time rejects the record
        OLD_TRAIN.replace("[  0/", "[  3/") + "\tCPU x (0.2)",
        OLD_FETCH.replace("idx0", "idx4 cpu 90000"),  # over the one-day bound on durations
    ]
    records = _assert_same(_block(lines, "\n"))
    fetch, train = records.fetch, records.train
    assert np.array_equal(fetch["cpu_s"], [np.nan, 0.031, 0.5], equal_nan=True)
    assert np.array_equal(fetch["runq_s"], [np.nan, 0.0025, np.nan], equal_nan=True)
    assert np.array_equal(train["cpu_s"], [np.nan, 0.0041, 0.25], equal_nan=True)
    assert np.array_equal(train["runq_s"], [np.nan, 0.0002, np.nan], equal_nan=True)
    _, rejects = _parse(_block(lines, "\n"), fast=True)
    assert rejects.column("reason").to_pylist() == [grammar.BAD_CPU] * 3
    assert "--max-duration" in grammar.BAD_CPU
    # dsim.instrument's own spelling is canonical: the fast path takes it whole.
    canonical = _block([lines[1], lines[2], lines[4]], "\n")
    _, _, rest = fast_records(grammar.lines_of(canonical), np.arange(3), grammar.MAX_DURATION_S)
    assert len(rest) == 0


def test_a_threads_cpu_time_beyond_its_span_rejects_the_line_on_both_paths() -> None:
    """A fetch's cpu and runq (one thread, read over the fetch) and an iteration's Runq (its
    main thread) cannot exceed the span they were read over by more than ``CPU_SLACK_S``: one
    runq of 3500 s in a 53 ms fetch made the CPU-aware model's stretch 327x and `dsim tune`
    an internal error. An iteration's CPU (every thread) and a fetch's proc (another span)
    keep the duration bound only."""
    from dsim.sources.rawlog.bounds import CPU_SLACK_S

    assert CPU_SLACK_S == 1.0
    fetch = OLD_FETCH.replace("idx0", "idx{} cpu {} runq {}")  # at_time 8.11
    lines = [
        fetch.format(0, "0.5", "9.05"),  # 0.94 s beyond: measurement slack, kept
        fetch.format(1, "0.5", "3500"),  # rejected
        fetch.format(2, "9.2", "0.0"),  # rejected
        fetch.format(3, "0.5", "0.1") + " proc 50",  # proc spans more than the fetch: kept
        OLD_TRAIN + "\tCPU 500 (1)\tRunq 10.7 (1)",  # Time 9.77: CPU of every thread, kept
        OLD_TRAIN.replace("[  0/", "[  1/") + "\tCPU 0.5 (1)\tRunq 10.8 (1)",  # rejected
    ]
    records = _assert_same(_block(lines, "\n"))
    assert list(records.fetch["idx"]) == [0, 3]
    assert list(records.train["iteration"]) == [0]
    _, rejects = _parse(_block(lines, "\n"), fast=True)
    assert rejects.column("reason").to_pylist() == (
        [grammar.CPU_BEYOND_FETCH] * 2 + [grammar.WAIT_BEYOND_ITERATION]
    )
    assert grammar.CPU_BEYOND_FETCH == (
        "CPU time beyond its fetch (cpu or runq more than 1 s longer than at_time)"
    )


def test_stage_suffixes_parse_the_same_on_both_paths_and_old_lines_carry_nan() -> None:
    stages = " read 0.040000000 read_cpu 0.038000000 collate 0.002000000 collate_cpu 0.001500000"
    lines = [
        OLD_FETCH,
        OLD_FETCH.replace("idx0", "idx1 cpu 0.031000000 runq 0.002500000" + stages),
        OLD_FETCH.replace("idx0", "idx2 cpu 0.5" + stages),
        OLD_FETCH.replace("idx0", "idx3" + stages),  # stages without CPU times
        OLD_FETCH.replace("idx0", "idx4 cpu 0.5" + stages.replace("0.002000000", "-1")),
        OLD_FETCH.replace("idx0", "idx5 cpu 0.5" + stages.replace("0.038000000", "x")),
        OLD_FETCH.replace("idx0", "idx6 cpu 0.5" + stages.split(" collate ")[0]),  # cut short
        OLD_FETCH.replace("idx0", "idx7 cpu 0.5" + stages + " more"),
    ]
    records = _assert_same(_block(lines, "\n"))
    fetch = records.fetch
    assert list(fetch["idx"]) == [0, 1, 2, 3]
    assert np.array_equal(fetch["read_s"], [np.nan, 0.04, 0.04, 0.04], equal_nan=True)
    assert np.array_equal(fetch["read_cpu_s"], [np.nan, 0.038, 0.038, 0.038], equal_nan=True)
    assert np.array_equal(fetch["collate_s"], [np.nan, 0.002, 0.002, 0.002], equal_nan=True)
    assert np.array_equal(fetch["collate_cpu_s"], [np.nan, 0.0015, 0.0015, 0.0015], equal_nan=True)
    assert np.array_equal(fetch["cpu_s"], [np.nan, 0.031, 0.5, np.nan], equal_nan=True)
    _, rejects = _parse(_block(lines, "\n"), fast=True)
    assert (
        rejects.column("reason").to_pylist()
        == [grammar.BAD_STAGE] * 2 + [grammar.MALFORMED_FETCH] * 2
    )
    # dsim.instrument's own spelling is canonical: the fast path takes it whole.
    canonical = _block(lines[1:4], "\n")
    _, _, rest = fast_records(grammar.lines_of(canonical), np.arange(3), grammar.MAX_DURATION_S)
    assert len(rest) == 0


def test_loader_line_node_fields_are_optional() -> None:
    base = (
        "2021-09-01 19:48:54.841 GPU: 1 LOADER num_workers 2 prefetch_factor none batch_size 8"
        " persistent_workers 0 pin_memory 1"
    )
    records = _assert_same(
        _block([base, base + " cores 16 local_world_size none", base + " cores 4"], "\n")
    )
    old, new = records.loader
    assert "cores" not in old and (new["cores"], new["local_world_size"]) == (16, None)
    _, rejects = _parse(_block([base + " cores 4"], "\n"), fast=True)
    assert rejects.column("reason").to_pylist() == [grammar.MALFORMED_LOADER]
    for zero in (" cores 0 local_world_size 4", " cores 2 local_world_size 0"):
        _, rejects = _parse(_block([base + zero], "\n"), fast=True)
        assert rejects.column("reason").to_pylist() == [grammar.MALFORMED_LOADER], zero


def test_impossible_loader_settings_are_rejected_not_taken_as_measured() -> None:
    """`num_workers 2 prefetch_factor 0` (no DataLoader runs so) was taken as the run's
    measured settings, and the pipeline model calibrated with prefetch 0."""
    line = (
        "2021-09-01 19:48:54.841 GPU: 1 LOADER num_workers {w} prefetch_factor {p} batch_size {b}"
        " persistent_workers 0 pin_memory 1"
    )
    # and settings no node runs: 999999 workers calibrated the model with that many
    impossible = ((2, 0, 8), (1, 2, 0), (0, "none", 0), (999999, 2, 8), (2, 1025, 8))
    for (w, p, b), fast in itertools.product(impossible, (1, 0)):
        records, rejects = _parse(_block([line.format(w=w, p=p, b=b)], "\n"), fast=bool(fast))
        assert rejects.column("reason").to_pylist() == [grammar.IMPOSSIBLE_LOADER], (w, p, b)
        assert records.loader == []
    for w, p, b in ((0, "none", 8), (0, 2, 8), (2, 1, "none"), (1024, 1024, 8)):  # 0: 2
        records, rejects = _parse(_block([line.format(w=w, p=p, b=b)], "\n"), fast=True)
        assert rejects.num_rows == 0 and len(records.loader) == 1, (w, p, b)


def test_loader_line_batch_bytes_is_optional_and_the_largest_is_kept() -> None:
    from dsim.sources.rawlog.parse import loader_settings

    base = (
        "2021-09-01 19:48:54.841 GPU: 1 LOADER num_workers 2 prefetch_factor 2 batch_size 8"
        " persistent_workers 0 pin_memory 1"
    )
    node = base + " cores 16 local_world_size 4"
    records = _assert_same(
        _block([base, node + " batch_bytes 4096", base + " batch_bytes 8192", node], "\n")
    )
    old, first, second, last = records.loader
    assert "batch_bytes" not in old and "batch_bytes" not in last
    assert (first["batch_bytes"], first["cores"], second["batch_bytes"]) == (4096, 16, 8192)
    assert "cores" not in second
    for bad in (" batch_bytes -1", " batch_bytes 1.5", " batch_bytes", " batch_bytes 1 cores 2"):
        _, rejects = _parse(_block([node + bad], "\n"), fast=True)
        assert rejects.column("reason").to_pylist() == [grammar.MALFORMED_LOADER], bad
    # The size varies with the batch: it is not compared, the largest is kept.
    settings, warning = loader_settings([dict(first, file="f"), dict(last, file="f")])
    assert warning is None and settings["batch_bytes"] == 4096 and settings["lines"] == 2
    settings, _ = loader_settings([dict(last, file="f")])
    assert "batch_bytes" not in settings  # old logs: run.json's loader exactly as before


def test_proc_suffix_parses_the_same_on_both_paths_and_only_after_cpu() -> None:
    stages = " read 0.040000000 read_cpu 0.038000000 collate 0.002000000 collate_cpu 0.001500000"
    lines = [
        OLD_FETCH,
        OLD_FETCH.replace("idx0", "idx1 cpu 0.031000000 runq 0.002500000 proc 0.034000000"),
        OLD_FETCH.replace("idx0", "idx2 cpu 0.5 proc 0.75"),  # no run-queue wait (not Linux)
        OLD_FETCH.replace("idx0", "idx3 cpu 0.031 runq 0.0025 proc 0.034" + stages),
        OLD_FETCH.replace("idx0", "idx4 cpu 0.031 runq 0.0025"),
        OLD_FETCH.replace("idx0", "idx5 cpu 0.5 proc -1"),  # a bad CPU time rejects the record
        OLD_FETCH.replace("idx0", "idx6 proc 0.5"),  # proc only with cpu
        OLD_FETCH.replace("idx0", "idx7 cpu 0.5 proc 0.6 runq 0.1"),  # out of order
        OLD_FETCH.replace("idx0", "idx8 cpu 0.5 proc"),  # cut short
    ]
    records = _assert_same(_block(lines, "\n"))
    fetch = records.fetch
    assert list(fetch["idx"]) == [0, 1, 2, 3, 4]
    assert np.array_equal(fetch["proc_cpu_s"], [np.nan, 0.034, 0.75, 0.034, np.nan], equal_nan=True)
    assert np.array_equal(fetch["runq_s"], [np.nan, 0.0025, np.nan, 0.0025, 0.0025], equal_nan=True)
    assert np.array_equal(fetch["read_s"], [np.nan, np.nan, np.nan, 0.04, np.nan], equal_nan=True)
    _, rejects = _parse(_block(lines, "\n"), fast=True)
    assert rejects.column("reason").to_pylist() == [grammar.BAD_CPU] + [grammar.MALFORMED_FETCH] * 3
    # dsim.instrument's own spelling is canonical: the fast path takes it whole.
    canonical = _block(lines[1:5], "\n")
    _, _, rest = fast_records(grammar.lines_of(canonical), np.arange(4), grammar.MAX_DURATION_S)
    assert len(rest) == 0


@pytest.mark.parametrize(
    "bad",
    [b"DEBUG:\x00\t", b"DE\x00BUG:", b"DEBUG:\xff\t", b"DEBUG:\t\xc3"],
)
def test_binary_data_anywhere_in_a_record_rejects_the_line(bad: bytes) -> None:
    """A NUL or invalid UTF-8 after a record's `DEBUG:` was accepted as a record (the
    patterns' free text took it): SPEC §1.3 rejects any line with such bytes."""
    line = "2021-09-01 19:48:54.841 DEBUG:\tGPU: 0 worker_id: 0, END FETCH at_time 0.5 data idx3"
    text = line.encode().replace(b"DEBUG:\t", bad) + b"\n"
    for fast in (True, False):
        records, rejects = _parse(text, fast=fast)
        assert len(records.fetch["line"]) == 0
        assert rejects.column("reason").to_pylist() == [grammar.BINARY], (bad, fast)
    records, rejects = _parse(line.encode() + b"\n", fast=False)
    assert len(records.fetch["line"]) == 1 and rejects.num_rows == 0
