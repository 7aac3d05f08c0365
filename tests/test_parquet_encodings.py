"""Parquet encodings chosen per column type (dsim.io.parquetio.write_options)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dsim.io import parquetio


def test_a_trace_s_measurements_are_plain_names_dictionary_counters_delta(tmp_path) -> None:
    """A trace's float or timestamp column in a dictionary was built to a page and dropped:
    ~70 bytes a row of memory while a trace was written, for a larger file (BENCHMARKS.md).
    Results keep dictionaries for their floats: a replay's stalls repeat."""
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
    dictionary = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}

    def encodings(distinct: bool) -> dict[str, set[str]]:
        parquetio.write_table(table, path, distinct=distinct)
        assert parquetio.read_table(path, remedy="x").equals(table)
        chunks = pq.ParquetFile(path).metadata.row_group(0)
        return {chunks.column(i).path_in_schema: set(chunks.column(i).encodings) for i in range(4)}

    trace = encodings(distinct=True)
    assert "DELTA_BINARY_PACKED" in trace["iteration"]
    for measured in ("start", "fetch_s"):
        assert "PLAIN" in trace[measured] and not dictionary & trace[measured]
    assert dictionary & trace["policy"]
    results = encodings(distinct=False)
    assert dictionary & results["fetch_s"] and "DELTA_BINARY_PACKED" in results["iteration"]
