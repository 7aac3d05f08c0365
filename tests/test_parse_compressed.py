"""Compressed and rotated raw logs parse exactly like their plain text (through the real CLI).

The logs are the shipped sample trace, written here with gzip, bzip2, xz and
zstd; rotated sets split one rank's log into several files, written in a
shuffled order. Logs refused (one message and exit 3 each) go through the CLI's
entry point in-process (conftest's ``run_dsim_in_process``).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import json
import lzma
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard
from conftest import REPO, run_dsim, run_dsim_in_process

from dsim.sources.rawlog.discover import discover_runs, log_files

SAMPLE = REPO / "traces" / "raw" / "cpuDDP_synthetic_none_mlp_epoch2_b128_worker2_thread0"
COMPRESS = {
    ".gz": gzip.compress,
    ".bz2": bz2.compress,
    ".xz": lzma.compress,
    ".zst": lambda data: zstandard.ZstdCompressor().compress(data),
}
NAMES = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd"}


def _texts_with_bad_lines() -> dict[str, bytes]:
    """The sample's per-rank logs, with a malformed line and a repeated record in rank 1.

    The repeat is rejected by a rule across records, whose reject text is read
    from the file a second time: for a compressed file, decompressed again.
    """
    texts = {p.name: p.read_bytes() for p in sorted(SAMPLE.glob("*.log"))}
    lines = texts["rank1.log"].splitlines(keepends=True)
    lines.insert(40, b"2026-11-21 16:12:00.000001 DEBUG:\tGPU: 1 worker_id: 0, END FETCH at_\n")
    lines.insert(700, lines[650])
    texts["rank1.log"] = b"".join(lines)
    return texts


def _parse(tmp_path: Path, source: Path, name: str) -> Path:
    result = run_dsim("parse", str(source), "--name", name, "--out", "t", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return tmp_path / "t" / name


def _rejects(run: Path) -> list[tuple]:
    with open(run / "rejects.csv", newline="") as handle:
        return [
            (Path(r["file"]).name.split(".")[0], r["line"], r["reason"], r["text"])
            for r in csv.DictReader(handle)
        ]


def _same_tables(a: Path, b: Path) -> None:
    for name in ("fetch.parquet", "train.parquet"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_compressed_logs_parse_like_their_text(tmp_path, suffix):
    texts = _texts_with_bad_lines()
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    for name, data in texts.items():
        (plain / name).write_bytes(data)
        (packed / (name + suffix)).write_bytes(COMPRESS[suffix](data))
    a, b = _parse(tmp_path, plain, "a"), _parse(tmp_path, packed, "b")
    _same_tables(a, b)
    assert _rejects(a) == _rejects(b)
    assert [r[:3] for r in _rejects(b)] == [
        ("rank1", "41", "malformed fetch line"),
        ("rank1", "701", "duplicate fetch record"),
    ]
    assert all(r[3] for r in _rejects(b))  # texts, re-read from the compressed file too
    info = json.loads((b / "run.json").read_text())
    for source in info["sources"]:
        stored = (tmp_path / source["path"]).read_bytes()  # relative to where dsim ran
        assert source["compression"] == NAMES[suffix]
        assert source["size"] == len(stored)
        assert source["sha256"] == hashlib.sha256(stored).hexdigest()
    a_info = json.loads((a / "run.json").read_text())
    assert a_info["report"] == info["report"]
    assert all("compression" not in s for s in a_info["sources"])


def test_concatenated_gzip_members_and_zstd_frames_are_one_text(tmp_path):
    """``cat a.gz b.gz`` and zstd's multi-frame files hold the text of all their parts."""
    texts = _texts_with_bad_lines()
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    for k, (name, data) in enumerate(texts.items()):
        (plain / name).write_bytes(data)
        cut = data.index(b"\n", len(data) // 3) + 1 + k  # not always at a line end
        compress = COMPRESS[".gz" if k % 2 else ".zst"]
        suffix = ".gz" if k % 2 else ".zst"
        (packed / (name + suffix)).write_bytes(compress(data[:cut]) + compress(data[cut:]))
    _same_tables(_parse(tmp_path, plain, "a"), _parse(tmp_path, packed, "b"))


def _write_rotated(directory: Path, texts: dict[str, bytes], seed: int) -> list[str]:
    """rank0 rotated by number, rank1 by date, rank2 mixed plain/compressed; files shuffled.

    Returns the file names in the order they must be read.
    """
    files: dict[str, bytes] = {}
    order: list[str] = []

    def pieces(data: bytes, n: int) -> list[bytes]:
        lines = data.splitlines(keepends=True)
        step = len(lines) // n
        return [b"".join(lines[i * step : (i + 1) * step if i < n - 1 else None]) for i in range(n)]

    r0 = pieces(texts["rank0.log"], 4)  # oldest first
    names0 = ["rank0.log.3.gz", "rank0.log.2.zst", "rank0.log.1", "rank0.log"]
    r1 = pieces(texts["rank1.log"], 3)
    names1 = ["rank1.log-20261101.xz", "rank1.log.2026-11-02", "rank1.log.2026-11-10.bz2"]
    for names, parts in ((names0, r0), (names1, r1)):
        for name, part in zip(names, parts, strict=True):
            suffix = Path(name).suffix
            files[name] = COMPRESS[suffix](part) if suffix in COMPRESS else part
        order += names
    files["rank2.log.gz"] = gzip.compress(texts["rank2.log"])
    files["rank3.log"] = texts["rank3.log"]
    order += ["rank2.log.gz", "rank3.log"]
    shuffled = list(files)
    random.Random(seed).shuffle(shuffled)
    for name in shuffled:  # directory order follows creation on some file systems
        (directory / name).write_bytes(files[name])
    (directory / "notes.txt").write_text("not a log\n")
    return order


def test_rotated_logs_are_read_oldest_first_as_one_source_per_rank(tmp_path):
    texts = _texts_with_bad_lines()
    plain, rotated = tmp_path / "plain", tmp_path / "rotated"
    plain.mkdir()
    rotated.mkdir()
    for name, data in texts.items():
        (plain / name).write_bytes(data)
    order = _write_rotated(rotated, texts, seed=3)
    [run] = discover_runs([rotated])
    assert [p.name for p in run.files] == order
    a, b = _parse(tmp_path, plain, "a"), _parse(tmp_path, rotated, "b")
    _same_tables(a, b)
    info = json.loads((b / "run.json").read_text())
    assert [Path(s["path"]).name for s in info["sources"]] == order
    assert info["gpus"] == 4 and info["report"]["rejected"] == 2
    # The rejects of the split rank 1 name the piece and its own line numbers.
    with open(b / "rejects.csv", newline="") as handle:
        where = [(Path(r["file"]).name, int(r["line"])) for r in csv.DictReader(handle)]
    assert where == [("rank1.log-20261101.xz", 41), ("rank1.log.2026-11-02", 701 - 400)]


def test_log_files_order_does_not_depend_on_listing_order():
    names = [
        "rank0.log",
        "rank0.log.1",
        "rank0.log.2.gz",
        "rank0.log.10.xz",
        "rank1.log-20261101",
        "rank1.log-2026110112.gz",
        "rank1.log.2026-11-02",
        "rank1.log",
        "rank10.log.zst",
    ]
    want = [
        "rank0.log.10.xz",
        "rank0.log.2.gz",
        "rank0.log.1",
        "rank0.log",
        "rank1.log-20261101",
        "rank1.log-2026110112.gz",
        "rank1.log.2026-11-02",
        "rank1.log",
        "rank10.log.zst",
    ]
    for seed in range(20):
        shuffled = [Path("d") / n for n in names]
        random.Random(seed).shuffle(shuffled)
        assert [p.name for p in log_files(shuffled)] == want


def test_one_log_rotated_without_gpu_fields_is_rank_0(tmp_path):
    """``output.log`` + ``output.log.1.gz`` of a single-GPU job: one log, not two unranked files."""
    text = (SAMPLE / "rank0.log").read_bytes().replace(b"GPU: 0 ", b"")
    lines = text.splitlines(keepends=True)
    run = tmp_path / "single"
    run.mkdir()
    (run / "output.log.1.gz").write_bytes(gzip.compress(b"".join(lines[:500])))
    (run / "output.log").write_bytes(b"".join(lines[500:]))
    result = run_dsim("parse", str(run), "--out", "t", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    info = json.loads((tmp_path / "t" / "single" / "run.json").read_text())
    assert info["gpus"] == 1 and info["report"]["rejected"] == 0
    assert info["report"]["fetch_records"] + info["report"]["train_records"] == 1200


def test_a_tree_of_compressed_runs_is_found(tmp_path):
    for run in ("x", "y"):
        leaf = tmp_path / "logs" / run
        leaf.mkdir(parents=True)
        for path in SAMPLE.glob("*.log"):
            (leaf / (path.name + ".zst")).write_bytes(COMPRESS[".zst"](path.read_bytes()))
    result = run_dsim("parse", "logs", "--out", "t", "-j", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["x", "y"]
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    result = run_dsim("parse", "empty", "--out", "t", cwd=tmp_path)
    assert result.returncode == 3
    assert "no log files (*.log, or rotated or compressed" in result.stderr


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_a_compressed_log_cut_short_is_an_input_error_and_nothing_is_written(tmp_path, suffix):
    data = COMPRESS[suffix]((SAMPLE / "rank0.log").read_bytes())
    run = tmp_path / "cut"
    run.mkdir()
    (run / ("rank0.log" + suffix)).write_bytes(data[: len(data) - 9])
    (run / "rank1.log").write_bytes((SAMPLE / "rank1.log").read_bytes())
    result = run_dsim_in_process("parse", str(run), "--out", "t", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    name = NAMES[suffix]
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"dsim: error: {run / ('rank0.log' + suffix)}: {name} data ends")
    ), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "t" / "cut").exists()
    assert not any(p.name.startswith(".") for p in (tmp_path / "t").glob("*"))


def test_corrupt_gzip_is_an_input_error(tmp_path):
    data = bytearray(gzip.compress((SAMPLE / "rank0.log").read_bytes()))
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    log = tmp_path / "rank0.log.gz"
    log.write_bytes(bytes(data))
    result = run_dsim_in_process("parse", str(log), "--out", "t", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert f"{log}: corrupt gzip data" in result.stderr or f"{log}: gzip data" in result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8, "a binary file, not a text log nor"),
        (b"PK\x03\x04" + bytes(200), "a zip archive, not a text log (unpack it first)"),
        # mtime=0: gzip's header holds the time, and a parameter that changes between two
        # xdist workers' collections fails the run ("Different tests were collected")
        (
            gzip.compress(bytes(range(256)) * 8, mtime=0),
            "gzip-compressed, but binary inside, not a text",
        ),
    ],
    ids=["elf", "zip", "gzip"],
)
def test_binary_files_that_are_no_known_compression_say_so(tmp_path, content, message):
    log = tmp_path / "run.log"
    log.write_bytes(content)
    result = run_dsim_in_process("parse", str(log), "--out", "t", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert f"dsim: error: {log}: no fetch or training records: {message}" in result.stderr


def test_a_rotation_kept_twice_compressed_and_not_is_refused(tmp_path):
    run = tmp_path / "twice"
    run.mkdir()
    data = (SAMPLE / "rank0.log").read_bytes()
    (run / "rank0.log.1").write_bytes(data)
    (run / "rank0.log.1.gz").write_bytes(gzip.compress(data))
    result = run_dsim_in_process("parse", str(run), "--out", "t", cwd=tmp_path)
    assert result.returncode == 3
    assert "rank0.log.1 and rank0.log.1.gz are the same file of one log" in result.stderr


def test_a_compressed_file_named_like_text_and_through_a_pipe(tmp_path):
    """The format comes from the bytes, not the name, and a pipe is read once, streaming."""
    shutil.copytree(SAMPLE, tmp_path / "plain")
    data = (SAMPLE / "rank2.log").read_bytes()
    (tmp_path / "rank2.log").write_bytes(lzma.compress(data))
    a = _parse(tmp_path, tmp_path / "plain" / "rank2.log", "a")
    b = _parse(tmp_path, tmp_path / "rank2.log", "b")
    _same_tables(a, b)
    result = subprocess.run(
        [sys.executable, "-m", "dsim", "parse", "/dev/stdin", "--name", "c", "--out", "t"],
        cwd=tmp_path,
        input=gzip.compress(data),
        capture_output=True,
    )
    assert result.returncode == 0, result.stderr
    _same_tables(a, tmp_path / "t" / "c")
