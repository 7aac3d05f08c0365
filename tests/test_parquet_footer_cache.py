"""``parquetio.footer`` remembers a Parquet file's footer while it is the same file.

Real files on disk: replaced by a rename (as dsim writes), rewritten in place,
damaged, removed; each is read anew, and a failed read is not remembered.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsim.io import parquetio


def _write(path: Path, value: str, *, rename: bool = True) -> None:
    table = pa.table({"x": [1, 2]}).replace_schema_metadata({"v": value})
    if not rename:
        pq.write_table(table, path)
        return
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    reads: list[object] = []
    real = pq.read_metadata
    monkeypatch.setattr(parquetio.pq, "read_metadata", lambda p: reads.append(p) or real(p))
    return reads


def test_a_footer_is_read_once_while_the_file_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _counting(monkeypatch)
    path = tmp_path / "r.parquet"
    _write(path, "one")
    for _ in range(3):
        assert parquetio.read_schema(path).metadata == {b"v": b"one"}
    assert len(reads) == 1
    assert parquetio.read_schema(path) == pq.read_schema(path)  # what pyarrow says

    _write(path, "two")  # replaced whole: another inode, the same size
    assert parquetio.read_schema(path).metadata == {b"v": b"two"}
    os.utime(path, ns=(1, 1))  # and the times of the first file's hour cannot hide that
    _write(path, "333", rename=False)  # rewritten in place: the same inode
    assert parquetio.read_schema(path).metadata == {b"v": b"333"}
    assert len(reads) == 3


def test_a_damaged_or_missing_file_is_an_error_every_time(tmp_path: Path) -> None:
    path = tmp_path / "r.parquet"
    _write(path, "one")
    assert parquetio.footer(path).num_rows == 2
    path.write_bytes(b"not parquet")
    for _ in range(2):
        with pytest.raises(pa.ArrowInvalid):
            parquetio.footer(path)
    _write(path, "back")
    assert parquetio.read_schema(path).metadata == {b"v": b"back"}
    path.unlink()
    with pytest.raises(FileNotFoundError):
        parquetio.footer(path)
