"""The parser's fast path on NumPy 1.x, which has no ``np.bitwise_count`` (added in NumPy 2.0).

pyproject promises ``numpy>=1.26``; the fast path then counts bits with an
exact SWAR fallback. CI tests the declared floor for real; these tests force
the fallback on whatever NumPy is installed so that the latest run checks it
too: bit for bit against Python's ``int.bit_count``, and end to end by
``dsim parse`` in an interpreter whose NumPy lacks ``bitwise_count``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_dsim

from dsim import bounds, fastpath, grammar

EDGES = [0, 1, 2, 3, 0x80, 0xFF, 2**63, 2**64 - 1, 2**63 - 1, 0x8080808080808080]
EDGES += [1 << k for k in range(64)] + [(1 << k) - 1 for k in range(65)]


def test_bit_count_fallback_is_exact() -> None:
    rng = np.random.default_rng(7)
    words = np.concatenate(
        [np.array(EDGES, dtype=np.uint64), rng.integers(0, 2**64, 20_000, dtype=np.uint64)]
    )
    # sparse and dense words too, not only ~32 bits set
    words = np.concatenate(
        [words, words & (words >> np.uint64(3)), words | (words << np.uint64(5))]
    )
    got = fastpath._bit_count(words)
    assert got.dtype == np.uint8
    assert got.tolist() == [int(w).bit_count() for w in words.tolist()]


def test_first_with_fallback_finds_the_first_flagged_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "_popcount", fastpath._bit_count)
    masks, expected = [0], [8]
    for first in range(8):
        for later in (0, 0x80 << (8 * 7), 0x8080808080808080):
            masks.append(((0x80 << (8 * first)) | later) & ~((1 << (8 * first)) - 1))
            expected.append(first)
    got = fastpath._first(np.array(masks, dtype=np.uint64))
    assert got.dtype == np.uint8
    assert got.tolist() == expected


def test_fast_path_with_fallback_agrees_with_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "_popcount", fastpath._bit_count)
    text = b"".join(p.read_bytes() for p in sorted((REPO / "traces" / "raw").rglob("*.log")))

    def parse(fast: bool) -> grammar.BlockRecords:
        rejects = grammar.Rejects()
        return grammar.parse_lines(grammar.lines_of(text), 1, rejects, fast=fast)

    lines = grammar.lines_of(text)
    _, _, rest = fastpath.fast_records(lines, np.arange(1, len(lines) + 1), bounds.MAX_DURATION_S)
    assert len(rest) < len(lines) / 10  # the fast path, not the general one, took the lines
    fast, slow = parse(True), parse(False)
    for kind in ("fetch", "train"):
        a, b = getattr(fast, kind), getattr(slow, kind)
        assert list(a) == list(b) and len(a["line"]) > 1000
        for key in a:
            assert a[key].dtype == b[key].dtype, (kind, key)
            assert np.array_equal(a[key], b[key], equal_nan=a[key].dtype.kind == "f"), (kind, key)


HIDE_BITWISE_COUNT = (
    "import sys, numpy; del numpy.bitwise_count; "
    "sys.argv = ['dsim', *sys.argv[1:]]; from dsim.cli import main; main()"
)


def test_parse_without_numpy_bitwise_count_writes_the_same_files(tmp_path: Path) -> None:
    """`dsim parse` as on NumPy 1.x: it used to end in "internal error: AttributeError"."""
    if not hasattr(np, "bitwise_count"):
        pytest.skip("NumPy < 2.0: every test here already runs without bitwise_count")
    raw = REPO / "traces" / "raw"
    hidden = subprocess.run(
        [sys.executable, "-c", HIDE_BITWISE_COUNT, "parse", str(raw), "--out", "numpy1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert hidden.returncode == 0, hidden.stderr
    normal = run_dsim("parse", str(raw), "--out", "numpy2", cwd=tmp_path)
    assert normal.returncode == 0, normal.stderr
    new, old = tmp_path / "numpy2", tmp_path / "numpy1"
    files = sorted(p.relative_to(new) for p in new.rglob("*.*"))
    assert {p.name for p in files} == {"fetch.parquet", "train.parquet", "run.json"}
    for name in files:  # byte for byte
        assert (old / name).read_bytes() == (new / name).read_bytes(), name
