"""Property: any valid log, however it is spelled and interleaved, parses back to its records.

The logs come from ``tests/logsynth.py``, which writes random but valid
multi-rank, multi-epoch logs and keeps the records it wrote. Parsing goes
through the same entry points as ``dsim parse`` (``discover_runs`` then
``parse_run``), so file discovery, ranks from file names, epoch matching and
the parse report are all checked at once.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsim.sources.rawlog.discover import discover_runs
from dsim.sources.rawlog.parse import parse_run

try:
    from logsynth import LogSpec, WrittenLog, timestamp, write_log
except ImportError:  # tests collected as a package
    from tests.logsynth import LogSpec, WrittenLog, timestamp, write_log


@st.composite
def log_specs(draw: st.DrawFn) -> LogSpec:
    gpus = draw(st.integers(1, 8))
    epochs = draw(st.integers(1, 3))
    return LogSpec(
        gpus=gpus,
        iterations=tuple(draw(st.lists(st.integers(1, 12), min_size=epochs, max_size=epochs))),
        workers=draw(st.integers(1, 6)),
        first_epoch=draw(st.sampled_from([0, 1, 7])),
        per_rank_files=draw(st.booleans()),
        omit_gpu=draw(st.sampled_from(["never", "always", "sometimes"])),
        crlf=draw(st.booleans()),
        start_lines=draw(st.booleans()),
        other_lines=draw(st.booleans()),
        blank_lines=draw(st.booleans()),
        late_training=draw(st.sampled_from([0.0, 0.5, 1.0])),
        jitter_s=draw(st.sampled_from([0.0, 0.01, 1.0, 1e6])),
        throughput=draw(st.sampled_from(["always", "never", "sometimes"])),
        prefixes=draw(st.booleans()),
    )


def _ns(column: pa.ChunkedArray) -> list[int]:
    return column.cast(pa.int64()).to_pylist()


def _check_round_trip(written: WrittenLog) -> None:
    [source] = discover_runs([written.path])
    parsed = parse_run(source)
    assert parsed.rejects.num_rows == 0, parsed.rejects.slice(0, 5).to_pylist()

    fetch = parsed.tables.fetch
    got_fetch = sorted(
        zip(
            fetch["epoch"].to_pylist(),
            fetch["iteration"].to_pylist(),
            fetch["gpu"].to_pylist(),
            fetch["worker"].to_pylist(),
            _ns(fetch["end"]),
            fetch["fetch_s"].to_pylist(),
            _ns(fetch["start"]),
            strict=True,
        )
    )
    # docs/SPEC.md §2.1: fetch start = end - at_time, at nanosecond resolution.
    want_fetch = sorted((*r, r[4] - round(r[5] * 1e9)) for r in written.fetch)
    assert got_fetch == want_fetch

    train = parsed.tables.train
    got_train = sorted(
        zip(
            train["epoch"].to_pylist(),
            train["iteration"].to_pylist(),
            train["gpu"].to_pylist(),
            _ns(train["start"]),
            train["iteration_s"].to_pylist(),
            train["stall_s"].to_pylist(),
            train["throughput"].to_pylist(),
            strict=True,
        ),
        key=repr,
    )
    assert got_train == sorted(written.train, key=repr)

    report = parsed.report
    assert report["lines"] == written.lines
    assert report["fetch_records"] == len(written.fetch)
    assert report["train_records"] == len(written.train)
    assert report["start_fetch_lines"] == written.start_fetch_lines
    assert report["other_lines"] == written.other_lines
    assert report["blank_lines"] == written.blank_lines
    assert report["incomplete_iterations"]["count"] == 0
    gpus = len({record[2] for record in written.train})
    assert parsed.tables.info.gpu_count == gpus
    assert list(parsed.tables.info.epochs_present) == sorted(
        {record[0] for record in written.train}
    )


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=log_specs(), seed=st.integers(0, 2**32 - 1))
@example(spec=LogSpec(gpus=1, iterations=(1,), workers=1), seed=0)
@example(
    spec=LogSpec(
        gpus=4, iterations=(5, 5, 3), workers=3, per_rank_files=True, omit_gpu="always",
        crlf=True, start_lines=True, other_lines=True, blank_lines=True, late_training=1.0,
        jitter_s=1e6, throughput="sometimes", prefixes=True,
    ),
    seed=1,
)  # fmt: skip
def test_valid_logs_parse_back_to_their_records(spec: LogSpec, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _check_round_trip(write_log(spec, seed, Path(tmp) / "run"))


def test_timestamps_print_exactly_the_digits_asked_for() -> None:
    # The generator's own spelling, which the property relies on to know the truth.
    assert timestamp(1_630_525_734_841_000_000, 3) == "2021-09-01 19:48:54.841"
    assert timestamp(1_630_525_734_000_000_001, 9) == "2021-09-01 19:48:54.000000001"
    assert timestamp(1_630_525_734_500_000_000, 1) == "2021-09-01 19:48:54.5"


def test_generator_keeps_each_worker_stream_in_time_order() -> None:
    # Interleaving must never reorder one process's lines: the parser rejects
    # a worker whose clock goes backwards, so a wrong generator would look
    # like a parser bug.
    spec = LogSpec(gpus=3, iterations=(8, 8), workers=2, jitter_s=1e6, prefixes=True)
    with tempfile.TemporaryDirectory() as tmp:
        written = write_log(spec, 5, Path(tmp) / "run")
        [source] = discover_runs([written.path])
        parsed = parse_run(source, strict=True)
    assert parsed.report["fetch_records"] == 3 * 16
