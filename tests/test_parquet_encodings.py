"""Parquet encodings chosen per column type (dsim.io.parquetio.write_options)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dsim.io import parquetio


def test_measurements_are_plain_names_are_dictionary_counters_are_delta(tmp_path) -> None:
    """A float or timestamp column in a dictionary was built to a page and dropped: ~70
    bytes a row of memory while a trace was written, for a larger file (BENCHMARKS.md)."""
    n = 50_000
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "iteration": pa.array(np.arange(n, dtype=np.int32)),
            "start": pa.array(np.cumsum(rng.integers(1, 10**6, n)), pa.timestamp("ns")),
            "fetch_s": pa.array(rng.exponential(0.01, n)),
            "policy": pa.array(["min/actual", "avg/actual"] * (n // 2)),
        }
    )
    path = tmp_path / "t.parquet"
    parquetio.write_table(table, path)
    chunks = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {chunks.column(i).path_in_schema: chunks.column(i).encodings for i in range(4)}
    assert "DELTA_BINARY_PACKED" in encodings["iteration"]
    for measured in ("start", "fetch_s"):
        assert "PLAIN" in encodings[measured]
        assert not {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(encodings[measured])
    assert "RLE_DICTIONARY" in encodings["policy"] or "PLAIN_DICTIONARY" in encodings["policy"]
    assert parquetio.read_table(path, remedy="x").equals(table)
