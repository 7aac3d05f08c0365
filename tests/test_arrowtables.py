"""Arrow arrays from NumPy and back without pandas: the same values as pyarrow's own calls."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsim.io.arrowtables import array_of, empty_table, flags_of, numpy_of, strings_of
from tests.conftest import REPO

DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint32", "uint64", "float32", "float64"]
TARGETS = {
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    None: None,
}


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    n=st.integers(0, 40),
    target=st.sampled_from(sorted(TARGETS, key=str)),
    masked=st.booleans(),
    nan_is_null=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_array_of_equals_pa_array(dtype, n, target, masked, nan_is_null, seed):
    """Values, type, nulls and the cast's checks of ``pa.array(values, type, mask, ...)``."""
    rng = np.random.default_rng(seed)
    values = (rng.integers(-100, 100, n) if "int" in dtype else rng.normal(size=n)).astype(dtype)
    if dtype.startswith("float") and n:
        values[rng.random(n) < 0.3] = np.nan
    if dtype.startswith("uint"):
        values = np.abs(values).astype(dtype)
    mask = rng.random(n) < 0.3 if masked else None
    kind = TARGETS[target]
    try:
        expected = pa.array(values, kind, mask=mask, from_pandas=nan_is_null)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        with pytest.raises(type(exc)):
            array_of(values, kind, mask=mask, nan_is_null=nan_is_null)
        return
    got = array_of(values, kind, mask=mask, nan_is_null=nan_is_null)
    assert got.type == expected.type
    assert got.null_count == expected.null_count
    assert got.equals(expected) or _equal_with_nan(got, expected)


def _equal_with_nan(a: pa.Array, b: pa.Array) -> bool:
    """Equal, NaN matching NaN (``equals`` calls NaN unequal to itself)."""
    if a.is_null().to_pylist() != b.is_null().to_pylist():
        return False
    left, right = a.to_pylist(), b.to_pylist()
    return all(
        x == y or (isinstance(x, float) and np.isnan(x) and np.isnan(y))
        for x, y in zip(left, right, strict=True)
    )


def test_array_of_keeps_timestamps_and_raises_where_pa_array_does():
    ns = np.array([0, 1_700_000_000_123_456_789], dtype=np.int64).view("datetime64[ns]")
    assert array_of(ns).equals(pa.array(ns))
    assert array_of(ns).type == pa.timestamp("ns")
    with pytest.raises(pa.ArrowInvalid):  # an int64 out of int32's range, as pa.array
        array_of(np.array([2**40]), pa.int32())
    flags = np.array([True, False, True])
    assert array_of(flags).equals(pa.array(flags))  # booleans: pyarrow's own path


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    sizes=st.lists(st.integers(0, 12), min_size=0, max_size=4),
    offset=st.integers(0, 5),
)
def test_numpy_of_equals_to_numpy(dtype, sizes, offset):
    """Chunked or not, sliced or not: ``to_numpy()``'s values and dtype."""
    values = np.arange(sum(sizes) + offset).astype(dtype)
    whole = pa.array(values).slice(offset)
    pieces, at = [], 0
    for size in sizes:
        pieces.append(whole.slice(at, size))
        at += size
    chunked = pa.chunked_array(pieces, type=whole.type)
    for array in (whole, chunked):
        got, expected = numpy_of(array), array.to_numpy()
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    stamps = pa.array(np.arange(4).view("datetime64[us]"))
    assert numpy_of(stamps).dtype == np.dtype("datetime64[us]")
    with_null = pa.array([1, None, 3], pa.int64())  # nulls: pyarrow's own conversion
    np.testing.assert_array_equal(numpy_of(with_null), with_null.to_numpy(zero_copy_only=False))


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 40),
    offset=st.integers(0, 9),
    null_share=st.sampled_from([0.0, 0.3, 1.0]),
    null_as=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_flags_and_numbers_with_nulls_equal_pyarrows_own(n, offset, null_share, null_as, seed):
    """Booleans with nulls as ``pc.fill_null(mask, null).to_numpy()``, numbers with nulls as
    ``to_numpy(zero_copy_only=False)`` (floats, NaN where null), at any slice offset."""
    import pyarrow.compute as pc

    rng = np.random.default_rng(seed)
    size = n + offset
    nulls = rng.random(size) < null_share
    flags = pa.array(rng.random(size) < 0.5, mask=nulls).slice(offset)
    expected = pc.fill_null(flags, null_as).to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(flags_of(flags, null_as), expected)
    assert flags_of(flags, null_as).dtype == np.bool_
    for dtype in ("int32", "int64", "float64"):
        values = pa.array(rng.integers(-50, 50, size).astype(dtype), mask=nulls).slice(offset)
        got, want = numpy_of(values), values.to_numpy(zero_copy_only=False)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.text(max_size=12), max_size=20), large=st.booleans())
def test_strings_of_equals_pa_array(texts, large):
    """Any text, unicode included: the same array as ``pa.array(texts, type)``."""
    kind = pa.large_string() if large else pa.string()
    assert strings_of(texts, kind if large else None).equals(pa.array(texts, kind))
    with pytest.raises(TypeError):
        strings_of(texts, pa.binary())


def test_empty_table_is_the_schemas_empty_table():
    schema = pa.schema([("a", pa.int32()), ("b", pa.large_string())])
    assert empty_table(schema).equals(schema.empty_table())


def test_dsim_parse_does_not_import_pandas(tmp_path: Path):
    """A fresh ``dsim parse`` of the shipped sample with rejected lines appended, and of a
    validation run's compressed per-rank logs as ``dsim.instrument`` writes them (CPU
    times, LOADER lines), never imports pandas: pyarrow's ``pa.array``, ``to_numpy`` and
    compute calls with Python scalars would, at 0.25-0.5 s per process (the parse path
    builds its arrays with ``array_of``/``strings_of`` and reads them with ``numpy_of``)."""
    logs = tmp_path / "logs"
    shutil.copytree(REPO / "traces" / "raw", logs)
    sample = next(p for p in sorted(logs.rglob("*.log")))
    with sample.open("a") as out:
        out.write("this line is not in the grammar\n")
        out.write(
            "2026-11-28 19:25:14.671425 DEBUG:\tGPU: 0 worker_id: 0, END FETCH at_time "
            "0.01x562611 data idx7\n"
        )
        out.write("2026-11-28 19:25:14.6 GPU: 0 LOADER num_workers four prefetch_factor 2\n")
    instrumented = logs / "instrumented"
    instrumented.mkdir()
    for log in (REPO / "validation" / "data-h200cpu" / "cpu_w4_p2_none_r1").glob("rank*.log.gz"):
        shutil.copy(log, instrumented / log.name)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dsim", "parse", str(logs), "--out",
         str(tmp_path / "traces"), "--quiet"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()}
    assert "dsim.sources.rawlog.parse" in imported  # the parse path ran in this process
    assert "pyarrow" in imported
    assert "pandas" not in imported, "dsim parse imported pandas"
    assert (tmp_path / "traces" / "instrumented" / "fetch.parquet").is_file()
    rejects = next((tmp_path / "traces").glob("*/rejects.csv")).read_text()
    assert "malformed loader line" in rejects and "non-numeric fetch duration" in rejects


def test_the_wall_clocks_two_paths_agree_without_pandas():
    """``civil_seconds_arrow`` (strptime, for texts the digit path leaves) gives what the
    digit path gives, dates that do not exist and years out of range included."""
    from dsim.sources.rawlog.wallclock import civil_seconds, civil_seconds_arrow

    texts = [
        "2026-11-28 19:25:14", "1970-01-01 00:00:00", "2024-02-29 23:59:59",
        "2026-02-30 10:00:00", "2026-11-28 24:00:00", "1969-12-31 23:59:59",
        "2026-13-01 00:00:00",
    ]  # fmt: skip
    text = pa.array(texts, pa.string())
    whole, ok = civil_seconds(text)
    arrow_whole, arrow_ok = civil_seconds_arrow(text)
    np.testing.assert_array_equal(arrow_ok, ok)
    np.testing.assert_array_equal(arrow_whole, whole)
    assert ok.tolist() == [True, True, True, False, False, False, False]
    import calendar
    import time

    expected = calendar.timegm(time.strptime(texts[0], "%Y-%m-%d %H:%M:%S"))
    assert whole[0] == expected and arrow_whole.dtype == np.int64
