"""``datasetfiles.built_from`` remembers a dataset file's footer while it is the same file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsim.model import datasetfiles


def _write(path: Path, policies: dict[str, str]) -> None:
    table = pa.table({"x": [1, 2]}).replace_schema_metadata(
        {"dsim": json.dumps({"policies": policies})}
    )
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)  # as dsim replaces its files: a rename


def test_a_footer_is_read_once_and_again_when_the_file_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "d.parquet"
    _write(path, {"min__min": "k1"})
    reads = []
    real = pq.read_schema
    monkeypatch.setattr(datasetfiles.pq, "read_schema", lambda p: reads.append(p) or real(p))
    assert datasetfiles.built_from(path) == {"policies": {"min__min": "k1"}}
    assert datasetfiles.built_from(path) == {"policies": {"min__min": "k1"}}
    assert len(reads) == 1
    _write(path, {"min__min": "k2"})  # the same size: only the identity tells
    assert datasetfiles.built_from(path) == {"policies": {"min__min": "k2"}}
    assert len(reads) == 2
    path.unlink()
    assert datasetfiles.built_from(path) is None
