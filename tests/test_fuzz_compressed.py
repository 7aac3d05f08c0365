"""A seeded fuzzer over compressed logs: dsim's streaming decompression against the codec's own.

Each case damages the *compressed bytes* of a log (bytes flipped, the file
cut short, garbage appended or inserted, a range dropped or repeated) and
parses it in process. The oracle is the codec's reference decoder over the
whole file, stream by stream with the codec's own decompressor objects
(every stream complete, nothing after the last):

* where the reference decodes the file, dsim's parse equals the parse of
  that decoded text written as a plain file: same tables, same rejects
  (reason and line) -- "compressed parses exactly like its plain text";
* where the reference refuses the file, dsim refuses it too, with an
  ``InputError`` naming the file (exit 3), never a table;
* nothing else escapes (no internal error).

``DSIM_FUZZ_COMPRESSED_CASES`` sets the number of cases (default 160);
``DSIM_FUZZ_SEED`` the first case's seed, to reproduce a failure alone.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import random
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard
from conftest import REPO

from dsim.errors import InputError
from dsim.sources.rawlog.discover import RunSource
from dsim.sources.rawlog.parse import parse_run

CASES = int(os.environ.get("DSIM_FUZZ_COMPRESSED_CASES", "160"))
FIRST = int(os.environ.get("DSIM_FUZZ_SEED", "0"))
SAMPLE = REPO / "traces" / "raw" / "cpuDDP_synthetic_none_mlp_epoch2_b128_worker2_thread0"


def _streams(new: Callable[[], Any], padded: bool = False) -> Callable[[bytes], bytes]:
    """A codec's strict reference: complete streams one after another, and nothing else.

    (Python's ``bz2.decompress`` and ``lzma.decompress`` drop whatever follows
    the first good stream when it does not decode: a damaged second stream
    would lose its records silently, which dsim refuses to do.)
    """

    def decode(data: bytes) -> bytes:
        if not data:
            raise EOFError("empty")
        out = []
        while data:
            if padded and out:  # NUL padding between and after gzip members / xz streams
                data = data.lstrip(b"\x00")
                if not data:
                    break
            decoder = new()
            out.append(decoder.decompress(data))
            if not decoder.eof:
                raise EOFError("stream cut short")
            data = decoder.unused_data
        return b"".join(out)

    return decode


CODECS: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {
    ".gz": (gzip.compress, _streams(lambda: zlib.decompressobj(wbits=31), padded=True)),
    ".bz2": (bz2.compress, _streams(bz2.BZ2Decompressor)),
    ".xz": (lzma.compress, _streams(lzma.LZMADecompressor, padded=True)),
    ".zst": (
        zstandard.ZstdCompressor(write_checksum=True).compress,
        _streams(lambda: zstandard.ZstdDecompressor().decompressobj()),
    ),
}
REFUSED = (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error, zstandard.ZstdError)


def _damage(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One to three edits of the stored bytes, and what they were."""
    edits = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["flip", "cut", "append", "insert", "drop", "repeat"])
        at = rng.randrange(len(data))
        if kind == "flip":
            data = data[:at] + bytes([data[at] ^ rng.randint(1, 255)]) + data[at + 1 :]
        elif kind == "cut":
            data = data[: max(1, at)]
        elif kind == "append":
            data += rng.randbytes(rng.randint(1, 64))
        elif kind == "insert":
            data = data[:at] + rng.randbytes(rng.randint(1, 16)) + data[at:]
        elif kind == "drop":
            data = data[:at] + data[at + rng.randint(1, 256) :]
        else:
            end = min(len(data), at + rng.randint(1, 256))
            data = data[:end] + data[at:end] + data[end:]
        edits.append(f"{kind}@{at}")
    return data, ", ".join(edits)


def _parse(path: Path):
    """Tables and (reason, line) rejects of one file, or the error a user would see."""
    try:
        parsed = parse_run(RunSource("run", (path,)))
    except InputError as exc:
        assert exc.path is not None and exc.path.name == path.name, exc
        return None
    rejects = list(
        zip(parsed.rejects["reason"].to_pylist(), parsed.rejects["line"].to_pylist(), strict=True)
    )
    return parsed.tables.fetch, parsed.tables.train, rejects


@pytest.fixture(scope="module")
def texts() -> list[bytes]:
    """Two of the sample's rank logs, cut to 600 lines so that a case takes milliseconds."""
    out = []
    for rank in (0, 3):
        lines = (SAMPLE / f"rank{rank}.log").read_bytes().splitlines(keepends=True)
        out.append(b"".join(lines[:600]))
    return out


def test_damaged_compressed_logs_parse_like_their_reference_decoding(texts, tmp_path):
    outcomes = {"same tables": 0, "refused": 0}
    suffixes = sorted(CODECS)
    for case in range(FIRST, FIRST + CASES):
        rng = random.Random(case)
        suffix = suffixes[case % len(suffixes)]
        compress, reference = CODECS[suffix]
        text = texts[case // len(suffixes) % len(texts)]
        # Sometimes two members/streams/frames in one file, as `cat a.gz b.gz` makes.
        stored = (
            compress(text) if rng.random() < 0.7 else compress(text[:999]) + compress(text[999:])
        )
        damaged, how = _damage(stored, rng)
        where = f"case {case} (DSIM_FUZZ_SEED={case}), {suffix}: {how}"
        path = tmp_path / f"rank0.log{suffix}"
        path.write_bytes(damaged)
        try:
            decoded = reference(damaged)
        except REFUSED:
            decoded = None
        try:
            got = _parse(path)
        except InputError:
            raise
        except Exception as exc:  # an internal error: the one thing that must never happen
            raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from exc
        if decoded is None:
            assert got is None, f"{where}: the codec refuses this file but dsim parsed it"
            outcomes["refused"] += 1
            continue
        plain = tmp_path / "plain" / "rank0.log"
        plain.parent.mkdir(exist_ok=True)
        plain.write_bytes(decoded)
        want = _parse(plain)
        if want is None:
            assert got is None, f"{where}: its plain text is refused but the compressed file parsed"
            continue
        assert got is not None, f"{where}: the codec decodes it but dsim refused it"
        assert got[0].equals(want[0]) and got[1].equals(want[1]), f"{where}: other tables"
        assert got[2] == want[2], f"{where}: other rejects"
        outcomes["same tables"] += 1
    # The damage reaches both outcomes: some files decode (a flip in a header field, garbage
    # after a complete zstd frame...), most are refused.
    assert outcomes["refused"] > CASES // 4, outcomes
