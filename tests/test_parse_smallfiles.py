"""Small per-rank files read in batches parse exactly as files read one by one.

Why: ``dsim.sources.rawlog.smallfiles`` dissects many files' text in one
grammar call and splits the records back per file; a line number shifted by
one, a reject given to the neighbouring file or a reject text left pointing
into the reused buffer would change the tables, ``rejects.csv`` or the
report. Mutated runs (byte flips, cut lines, binary garbage, lines over the
length bound, a file cut inside its last line, loader lines, lines without
``GPU:``) are parsed both ways, with batches forced to split often.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from fuzzlog import LINE_LIMIT, LONG_EDITS, mutate

import dsim.sources.rawlog.logfile as logfile
from dsim.errors import InputError
from dsim.sources.base import RunSource
from dsim.sources.rawlog import smallfiles
from dsim.sources.rawlog.parse import parse_run
from dsim.synth import SynthParams, synthesize

LOADER = (
    b"2021-09-01 00:00:00.5 GPU: {g} LOADER num_workers 2 prefetch_factor 2 batch_size 128 "
    b"persistent_workers 0 pin_memory 1\n"
)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    params = SynthParams(gpus=12, iterations=6, epochs=1, workers=2, per_rank=True, name="small")
    root = tmp_path_factory.mktemp("synth")
    synthesize(params, root)
    directory = root / params.run_name
    for g in (3, 7):  # loader lines, one of them without its GPU: field (the file's rank)
        path = directory / f"rank{g}.log"
        line = LOADER.replace(b"GPU: {g} ", b"") if g == 7 else LOADER.replace(b"{g}", b"3")
        path.write_bytes(line + path.read_bytes())
    return directory


def _parse(directory: Path, monkeypatch, limit: int):
    """Parse with files below ``limit`` bytes batched (1: none is); the result or the error."""
    monkeypatch.setattr(logfile, "BLOCK_BYTES", limit)
    files = tuple(sorted(directory.glob("*.log")))
    try:
        parsed = parse_run(RunSource("run", files), keep_lines=True, max_line=LINE_LIMIT)
    except InputError as exc:
        return str(exc)
    lines = {k: [a.tolist() for a in v] for k, v in parsed.lines.items()}
    return parsed.tables.fetch, parsed.tables.train, parsed.rejects, parsed.report, lines


@pytest.mark.parametrize("seed", range(12))
def test_batched_files_parse_as_files_one_by_one(run, tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    where = tmp_path / "mutant"
    mutate(run, rng, rng.randint(1, 8), kinds=LONG_EDITS).write(where)
    alone = _parse(where, monkeypatch, 1)
    for limit in (3000, 1 << 22):  # batches of a few files, and of all of them
        batched = _parse(where, monkeypatch, limit)
        if isinstance(alone, str):
            assert batched == alone
            continue
        fetch, train, rejected, report, lines = batched
        assert fetch.equals(alone[0]) and train.equals(alone[1])
        assert rejected.equals(alone[2]), (rejected.to_pylist(), alone[2].to_pylist())
        assert report == alone[3]
        assert lines == alone[4]


def test_a_batch_holds_the_small_plain_files_only(run, tmp_path, monkeypatch):
    """Compressed, unterminated and large files are read alone, in their place in the order."""
    import gzip

    files = sorted(run.glob("*.log"))
    (tmp_path / "a.log").write_bytes(files[0].read_bytes())
    (tmp_path / "b.log.gz").write_bytes(gzip.compress(files[1].read_bytes()))
    (tmp_path / "c.log").write_bytes(files[2].read_bytes()[:-1])  # no line end at the end
    (tmp_path / "d.log").write_bytes(files[3].read_bytes())
    paths = sorted(tmp_path.iterdir())
    calls = []
    real = smallfiles.read_log
    monkeypatch.setattr(smallfiles, "read_log", lambda p, *a, **k: calls.append(p.name) or real(p))
    got = list(smallfiles.read_logs(paths))
    assert [r.path for r in got] == paths
    assert calls == ["b.log.gz", "c.log"]
    assert sum(r.counts.get("lines", 0) for r in got) == sum(
        logfile.read_log(p).counts["lines"] for p in paths
    )
    for records, path in zip(got, paths, strict=True):
        alone = logfile.read_log(path)
        assert (records.size, records.sha256) == (alone.size, alone.sha256)
        for kind in ("fetch", "train"):
            mine, theirs = getattr(records, kind), getattr(alone, kind)
            assert list(mine) == list(theirs)
            for key, values in mine.items():
                assert values.dtype == theirs[key].dtype, key
                np.testing.assert_array_equal(values, theirs[key])


def test_cpu_times_in_some_files_only(run, tmp_path, monkeypatch):
    """CPU times on one rank's fetch lines: kept, NaN elsewhere, whichever way files are read."""
    where = tmp_path / "cpu"
    where.mkdir()
    for path in sorted(run.glob("*.log")):
        text = path.read_bytes()
        if path.name == "rank5.log":
            lines = [
                line + b" cpu 0.25 runq 0.01" if b"END FETCH" in line else line
                for line in text.split(b"\n")
            ]
            text = b"\n".join(lines)
        (where / path.name).write_bytes(text)
    alone = _parse(where, monkeypatch, 1)
    assert "cpu_s" in alone[0].column_names
    cpu = alone[0]["cpu_s"].to_numpy()
    assert (cpu == 0.25).sum() > 0 and np.isnan(cpu).sum() > 0
    for limit in (3000, 1 << 22):
        batched = _parse(where, monkeypatch, limit)
        for got, want in zip(batched[:2], alone[:2], strict=True):
            assert got.schema == want.schema
            for name in want.column_names:  # NaN equal to NaN, unlike Table.equals
                np.testing.assert_array_equal(got[name].to_numpy(), want[name].to_numpy())
        assert batched[3] == alone[3]
