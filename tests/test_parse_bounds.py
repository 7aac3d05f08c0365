"""Inputs that once cost unbounded memory or time fail fast, in bounded memory, with one line.

Each hostile input is read in a fresh interpreter under an address-space limit
(``RLIMIT_AS``) and a wall-clock timeout: a long line (read from a FIFO that
never ends, so no test file needs to be large), decompression bombs of NULs
and newlines in each format, a profiler trace nesting 20,000 arrays and a
gzipped trace holding one 10 GB string. Before the bounds these took GBs and
minutes (or never finished); the limits here are far below that.
"""

from __future__ import annotations

import bz2
import gzip
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_dsim, run_dsim_in_process

from dsim.app.parse import parse_and_write
from dsim.commands import parse as parse_cmd
from dsim.errors import EXIT_INPUT, InputError
from dsim.sources.base import RunSource
from dsim.sources.jsonbounds import MAX_DEPTH, MAX_STRING_BYTES
from dsim.sources.rawlog import logfile
from dsim.sources.rawlog.logfile import MAX_LINE_BYTES, read_log

MEMORY = 1 << 30  # address space of the interpreter that reads the hostile input
SECONDS = 60  # generous for a loaded CI machine; each case takes about a second
SAMPLE = REPO / "traces" / "raw" / "cpuDDP_synthetic_none_mlp_epoch2_b128_worker2_thread0"
GOOD = (SAMPLE / "rank0.log").read_bytes().splitlines(keepends=True)[:50]


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _bounded(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` under the memory and time limits; it prints what it got."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        preexec_fn=_limited,
        capture_output=True,
        text=True,
        timeout=SECONDS,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


_READ_LOG = """
import sys
from pathlib import Path
from dsim.errors import InputError
from dsim.sources.rawlog.logfile import read_log
try:
    read_log(Path(sys.argv[1]) if len(sys.argv) > 1 else Path({path!r}))
except InputError as exc:
    print(exc)
else:
    print("parsed")
"""


def _read_log_bounded(path: Path) -> str:
    result = _bounded(_READ_LOG.format(path=str(path)))
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


# -- long lines ----------------------------------------------------------------------------


def test_an_endless_line_fails_at_once_naming_its_line_in_bounded_memory(tmp_path):
    """A FIFO fed one line that never ends (as a 512 MB or 2 GB line begins): exit 3 in
    seconds, memory far below the line's size (it once grew with the square of the line)."""
    fifo = tmp_path / "endless.log"
    os.mkfifo(fifo)
    writer = tmp_path / "writer.py"  # good lines, then "x" for ever, no line end
    writer.write_text(
        textwrap.dedent(f"""
            import sys
            try:
                with open({str(fifo)!r}, "wb") as out:
                    out.write({b"".join(GOOD)!r})
                    while True:
                        out.write(b"x" * (1 << 20))
            except OSError:  # the reader is gone
                pass
        """)
    )
    result = subprocess.run(
        ["sh", "-c", '"$0" "$1" & exec "$0" -m dsim parse "$2" --out out -q',
         sys.executable, writer, fifo],
        preexec_fn=_limited,
        capture_output=True,
        text=True,
        timeout=SECONDS,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == EXIT_INPUT, result.stderr
    assert result.stderr.strip() == (
        f"dsim: error: {fifo}:{len(GOOD) + 1}: line longer than {MAX_LINE_BYTES} bytes"
    )
    assert not (tmp_path / "out" / "endless").exists()


def test_long_lines_are_found_in_every_position_and_the_limit_is_exact(tmp_path):
    """Inside a block, across blocks (carried), at the end without a line end, compressed."""
    head = b"".join(GOOD)
    limit = 3000
    cases = {
        "inside.log": (head + b"y" * (limit + 1) + b"\n" + head, len(GOOD) + 1),
        "carried.log": (head + b"y" * 10 * limit + b"\n" + head, len(GOOD) + 1),
        "tail.log": (head + b"y" * (limit + 1), len(GOOD) + 1),
        "later.log": (head + b"z" * limit + b"\n" + b"y" * (limit + 1) + b"\n", len(GOOD) + 2),
    }
    for name, (text, line) in cases.items():
        for suffix, store in (("", bytes), (".gz", gzip.compress)):
            path = tmp_path / (name + suffix)
            path.write_bytes(store(text))
            for block in (1000, 4096, 1 << 20):
                with pytest.raises(InputError) as caught:
                    read_log(path, block_bytes=block, max_line=limit)
                assert str(caught.value) == f"{path}:{line}: line longer than {limit} bytes"
    # exactly the limit (the \n not counted) is a line like any other
    path = tmp_path / "exact.log"
    path.write_bytes(head + b"z" * limit + b"\n" + head)
    for block in (1000, 1 << 20):
        records = read_log(path, block_bytes=block, max_line=limit)
        assert records.counts["lines"] == 2 * len(GOOD) + 1
        assert len(records.fetch["line"]) + len(records.train["line"]) == 2 * len(GOOD)


def test_the_line_limit_is_an_option_of_parse(tmp_path):
    log = tmp_path / "run.log"
    log.write_bytes(b"".join(GOOD) + b"w" * 5000 + b"\n")
    result = run_dsim("parse", log, "--max-line-bytes", "4096", "--out", "t", cwd=tmp_path)
    assert result.returncode == EXIT_INPUT
    assert f"{log}:{len(GOOD) + 1}: line longer than 4096 bytes" in result.stderr
    assert run_dsim("parse", log, "--out", "t", "-q", cwd=tmp_path).returncode == 0
    bad = run_dsim_in_process("parse", log, "--max-line-bytes", "0", cwd=tmp_path)  # one line
    assert bad.returncode == 2 and "--max-line-bytes" in bad.stderr
    assert parse_cmd.MAX_LINE_BYTES == logfile.MAX_LINE_BYTES


# -- decompression bombs ----------------------------------------------------------------------


def _bomb(compress, byte: bytes, total: int, member: int = 4 << 20) -> bytes:
    """``total`` bytes of ``byte`` as many concatenated members (valid: ``cat a.gz b.gz``)."""
    one = compress(byte * member)
    return one * (total // member)


def test_a_gzip_of_nuls_fails_on_its_line_length_in_bounded_memory(tmp_path):
    path = tmp_path / "rank0.log.gz"
    path.write_bytes(_bomb(lambda d: gzip.compress(d, 9), b"\0", 10 << 30))  # 10 MB -> 10 GB
    assert path.stat().st_size < 11e6
    message = _read_log_bounded(path)
    assert message.startswith(f"{path}:1: line longer than {MAX_LINE_BYTES} bytes"), message


@pytest.mark.parametrize("codec", ["gzip", "bzip2", "zstd"])
def test_a_bomb_of_newlines_is_refused_by_its_ratio_in_bounded_memory(tmp_path, codec):
    """Every line is short, so only the ratio bound stops it (bzip2 and zstd also bound
    each decompression step: one 32 KiB read of these once gave GBs of text at once)."""
    import zstandard

    compress = {
        "gzip": lambda d: gzip.compress(d, 9),
        "bzip2": bz2.compress,
        "zstd": zstandard.ZstdCompressor(level=19).compress,
    }[codec]
    path = tmp_path / "rank0.log"
    path.write_bytes(_bomb(compress, b"\n", 10 << 30))
    message = _read_log_bounded(path)
    assert message.startswith(f"{path}: {codec} data expands over 1000 times"), message
    assert "decompression bomb" in message


def test_the_ratio_bound_spares_ordinary_logs_and_stops_bombs(tmp_path, monkeypatch):
    """With the floor lowered to 1 MiB: the sample, repeated (which compresses far better than
    a real log), reads whole in every format; newlines compressed the same way are refused."""
    import lzma

    import zstandard

    from dsim.io import compression

    monkeypatch.setattr(compression, "RATIO_FLOOR", 1 << 20)
    text = (SAMPLE / "rank0.log").read_bytes() * 12
    codecs = {
        ".gz": gzip.compress,
        ".bz2": bz2.compress,
        ".xz": lzma.compress,
        ".zst": zstandard.ZstdCompressor(level=19).compress,
    }
    for suffix, compress in codecs.items():
        path = tmp_path / f"rank0.log{suffix}"
        path.write_bytes(compress(text))
        assert read_log(path).counts["lines"] == text.count(b"\n"), suffix
        path.write_bytes(compress(b"\n" * (4 << 20)))
        with pytest.raises(InputError, match="expands over 1000 times"):
            read_log(path)


# -- profiler traces --------------------------------------------------------------------------

_READ_TRACE = """
from pathlib import Path
from dsim.errors import InputError
from dsim.sources.kineto import read_trace
try:
    read_trace(Path({path!r}))
except InputError as exc:
    print(exc)
else:
    print("parsed")
"""


def _trace_head(rank: int = 0) -> bytes:
    return b'{"distributedInfo": {"rank": %d}, "traceEvents": [' % rank


def test_a_trace_nesting_20000_arrays_fails_fast_in_bounded_memory(tmp_path):
    """40 KB that once took 1.06 GB (ijson's memory grows with the square of the depth)."""
    path = tmp_path / "rank0.pt.trace.json"
    event = b'{"ph": "X", "name": "ProfilerStep#1", "ts": 1, "dur": 2, "args": '
    path.write_bytes(_trace_head() + event + b"[" * 20_000 + b"]" * 20_000 + b"}]}")
    result = _bounded(_READ_TRACE.format(path=str(path)))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().startswith(
        f"{path}: JSON nested deeper than {MAX_DEPTH} levels (at byte "
    ), result.stdout


def test_a_gzipped_trace_holding_a_10_gb_string_fails_fast_in_bounded_memory(tmp_path):
    path = tmp_path / "rank0.pt.trace.json.gz"
    head = gzip.compress(_trace_head() + b'{"ph": "X", "name": "')
    path.write_bytes(head + _bomb(lambda d: gzip.compress(d, 9), b"a", 10 << 30) + head)
    result = _bounded(_READ_TRACE.format(path=str(path)))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().startswith(
        f"{path}: JSON string longer than {MAX_STRING_BYTES} bytes (at byte "
    ), result.stdout


def test_traces_within_the_bounds_read_as_before(tmp_path):
    """Depth MAX_DEPTH and a string of MAX_STRING_BYTES (escapes included) are fine."""
    from dsim.sources.kineto import read_trace

    path = tmp_path / "rank0.pt.trace.json"
    deep = MAX_DEPTH - 4  # document, traceEvents, event, args
    long_name = b'\\"' * (MAX_STRING_BYTES // 2)
    steps = b", ".join(
        b'{"ph": "X", "name": "%s", "ts": %d, "dur": 10}' % (name, ts)
        for name, ts in ((b"ProfilerStep#1", 0), (b"enumerate(DataLoader)#_x.__next__", 1))
    )
    path.write_bytes(
        _trace_head()
        + b'{"ph": "i", "name": "%s", "args": %s%s}, ' % (long_name, b"[" * deep, b"]" * deep)
        + steps
        + b"]}"
    )
    trace = read_trace(path)
    assert trace.events == 3 and list(trace.steps["step"]) == [1]


# -- out of memory ----------------------------------------------------------------------------


def test_out_of_memory_is_a_clean_input_error_naming_the_file_or_run(tmp_path, monkeypatch):
    log = tmp_path / "rank0.log"
    log.write_bytes(b"".join(GOOD))

    def exhausted(*args, **kwargs):
        raise MemoryError

    with monkeypatch.context() as m:
        m.setattr("dsim.sources.rawlog.grammar.parse_lines", exhausted)
        with pytest.raises(InputError) as caught:
            read_log(log)
    assert caught.value.path == log and "out of memory" in str(caught.value)

    with monkeypatch.context() as m:
        m.setattr("dsim.sources.rawlog.parse._apply_rules", exhausted)
        with pytest.raises(InputError) as caught:
            parse_and_write(RunSource("run", (log,)), tmp_path / "out", fmt="rawlog")
    assert caught.value.exit_code == EXIT_INPUT and caught.value.path == log
    assert str(caught.value).startswith(f"{log}: out of memory parsing this run")
    assert not (tmp_path / "out" / "run").exists()

    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_bytes(_trace_head() + b"]}")
    with monkeypatch.context() as m:
        m.setattr("dsim.sources.kineto._events", exhausted)
        from dsim.sources.kineto import read_trace

        with pytest.raises(InputError) as caught:
            read_trace(trace)
    assert caught.value.path == trace and "out of memory" in str(caught.value)


def test_the_line_check_costs_one_pass_over_the_newlines():
    """The bound adds no per-byte Python work: the block's newlines are found once and
    handed to the grammar (``lines_of(block, newlines)`` splits as ``lines_of(block)``)."""
    from dsim.sources.rawlog import grammar

    block = b"".join(GOOD) + b"\r\n\n" + b"".join(GOOD)
    newlines = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
    assert grammar.lines_of(block, newlines).equals(grammar.lines_of(block))


def test_gpu_utilisation_logs_have_the_same_line_bound(tmp_path):
    """nvidia-smi CSVs beside a run were read whole; now a line at a time, bounded alike."""
    from dsim.sources.gpuutil import read_util_log

    path = tmp_path / "gpu_util.csv"
    header = b"timestamp, index, utilization.gpu [%], memory.used [MiB]\n"
    row = b"2026/11/21 16:12:00.000, 0, 40 %, 1000 MiB\n"
    path.write_bytes(header + row + b"9" * 5000 + b"\n" + row)
    with pytest.raises(InputError) as caught:
        read_util_log(path, max_line=4096)
    assert str(caught.value) == f"{path}:3: line longer than 4096 bytes"
    log = read_util_log(path)  # within the default bound: a malformed row like any other
    assert log.samples.num_rows == 2 and log.rejects.num_rows == 1


def test_blocks_of_many_tiny_lines_parse_in_pieces_to_the_same_records(tmp_path, monkeypatch):
    """A block of millions of short lines is parsed a few hundred thousand lines at a time
    (bounded per-line arrays); pieces of any size give the same records, counts, rejects
    and line numbers, and the first line too long is still found."""
    rng = np.random.default_rng(0)
    lines = [*GOOD, b"\n", b"\r\n", b"junk\n", b"2021-09-01 GPU: 0 END FETCH broken\n"]
    text = b"".join(lines[i] for i in rng.integers(0, len(lines), 600)) + b"tail"
    path = tmp_path / "rank0.log"
    path.write_bytes(text)
    whole = read_log(path)
    for piece, block in ((7, 1 << 20), (100, 4096)):
        monkeypatch.setattr(logfile, "PIECE_LINES", piece)
        got = read_log(path, block_bytes=block)
        for part in ("fetch", "train"):
            for key, want in getattr(whole, part).items():
                np.testing.assert_array_equal(getattr(got, part)[key], want, err_msg=key)
        assert got.counts == whole.counts
        assert got.rejects.table().equals(whole.rejects.table())
    assert whole.rejects.table().num_rows > 0 and whole.counts["blank_lines"] > 0
    path.write_bytes(b"\n" * 5000 + b"y" * 3000 + b"\n" + b"\n" * 10)
    for piece in (1000, 7):
        monkeypatch.setattr(logfile, "PIECE_LINES", piece)
        with pytest.raises(InputError, match=rf"{path.name}:5001: line longer than 2999"):
            read_log(path, max_line=2999)
