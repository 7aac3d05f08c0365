"""Every Parquet file dsim writes or reads goes through here, with page checksums.

dsim writes each data page with a CRC-32 (``write_page_checksum``) and
verifies it on every read (``page_checksum_verification``), so a flipped bit
in a table, a replay or a summary is a clear error naming the file instead of
a silently wrong number. Files without checksums (written by other tools or
older dsim versions) still read: the check applies to pages that carry one.
The checksums are a function of the page bytes only, so the files stay
byte-for-byte deterministic.

Every file is zstd-compressed (level 3) with an encoding chosen per column
from its type (``write_options``): integer columns (``epoch``, ``iteration``,
``gpu``, ``worker``) delta-encoded (``DELTA_BINARY_PACKED``: an iteration
counter costs bits per row, not the 4-8 bytes Snappy left of it), every
other column dictionary-encoded where that pays, except a trace's
measurements (floats, timestamps: nearly all distinct), which are written in
plain pages (``distinct``; the tidy dataset's writer also hands its constant
columns over as dictionaries and limits statistics: ``writer``). Against Snappy with default
encodings, a synthetic 8-GPU run of 10^6 GPU-iterations parsed to 1.5x
smaller tables and its replay dataset to 2.3x smaller files; readers need
nothing new (both encodings are in every Parquet reader dsim supports,
pyarrow >= 17, DuckDB, polars).
"""

from __future__ import annotations

import base64
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dsim.errors import InputError

_CRC_MISMATCH = "CRC checksum verification failed"


#: zstd's level 3 (Arrow's default is 1): ~20 % smaller traces for ~15 % more write time.
ZSTD_LEVEL = 3

#: Values the Parquet writer takes per step: Arrow's default, named so that
#: ``bench/bench_write_batch.py`` can try others. 65,536 was tried (28 Nov 2026): a
#: first, noisy measurement put it ~11 % ahead on a dataset write; side by side, three
#: runs of 15-25 interleaved repeats gave 0.88, 0.98 and 1.02x on the dataset and 1.10,
#: 0.99 and 1.04x on the trace tables (the same bytes), no gain this VM's noise can show,
#: so the default stays (bench/logs/write_batch_2026-11-28.txt).
WRITE_BATCH_SIZE = 1024


def _measurement(kind: pa.DataType) -> bool:
    return pa.types.is_floating(kind) or pa.types.is_temporal(kind)


def write_options(schema: pa.Schema, *, distinct: bool = False) -> dict[str, Any]:
    """The keyword arguments of ``pq.write_table`` / ``pq.ParquetWriter`` for ``schema``.

    Top-level integer columns are delta-encoded, the rest dictionary-encoded
    (pyarrow refuses both for one column, so the dictionary list names the
    rest). Nested columns keep the defaults. ``distinct``: the float and
    timestamp columns hold nearly distinct values (a trace's measurements) and
    are written in plain pages. Their dictionary, built until it outgrew a page
    and then dropped, took ~70 bytes a row of memory at a parse's peak (the
    fetch table's write) for a file ~8 % larger; a replay's stalls repeat (zeros,
    the same stall under several policies) and keep theirs, which pays there.
    """
    delta = [f.name for f in schema if pa.types.is_integer(f.type)]
    plain = {f.name for f in schema if distinct and _measurement(f.type)}
    options: dict[str, Any] = {
        "compression": "zstd",
        "compression_level": ZSTD_LEVEL,
        "write_page_checksum": True,
        "write_batch_size": WRITE_BATCH_SIZE,
        "use_dictionary": [f.name for f in schema if f.name not in delta and f.name not in plain],
    }
    if delta:
        options["column_encoding"] = dict.fromkeys(delta, "DELTA_BINARY_PACKED")
    return options


def write_table(table: pa.Table, path: str | Path, *, distinct: bool = False) -> None:
    """Write ``table`` to ``path`` (not atomically: see ``dsim.io.atomic.write_parquet``);
    ``distinct`` as in ``write_options``."""
    pq.write_table(table, path, **write_options(table.schema, distinct=distinct))


def writer(
    path: str | Path,
    schema: pa.Schema,
    *,
    read_as: pa.Schema | None = None,
    statistics: Collection[str] | None = None,
    distinct: bool = False,
    uncompressed: Collection[str] = (),
    batch_size: int | None = None,
) -> pq.ParquetWriter:
    """A ``ParquetWriter`` with ``write_table``'s options, for files written in parts.

    ``read_as``: the schema readers get back, where the tables written (``schema``)
    hold some of its string columns as dictionary arrays (``pa.dictionary`` of the same
    value type). Why: a column that is one value for a whole row group, given as a
    one-value dictionary and its indices, is written as just that, where the plain column
    had every value hashed into the column's dictionary (most of a tidy dataset's write,
    docs/SPEC.md §7.6). The file then records ``read_as`` (and its metadata) as its Arrow
    schema, the very ``ARROW:schema`` key pyarrow writes for ``read_as`` itself, so every
    reader gets the plain columns, as from a file written from ``read_as``'s tables.
    ``statistics``: the columns given min/max statistics (default: all); ``distinct`` as
    in ``write_options``. ``uncompressed``: columns written without zstd, for columns
    whose pages are a few bytes whatever the codec (one value repeated, as a dictionary
    or a delta run), where each page's zstd call costs more than it saves.
    ``batch_size``: values per writer step (default ``WRITE_BATCH_SIZE``).
    """
    options = write_options(schema, distinct=distinct)
    if statistics is not None:
        options["write_statistics"] = [f.name for f in schema if f.name in statistics]
    if uncompressed:
        zstd = [f.name for f in schema if f.name not in uncompressed]
        options["compression"] = {
            f.name: "none" if f.name in uncompressed else "zstd" for f in schema
        }
        options["compression_level"] = dict.fromkeys(zstd, ZSTD_LEVEL)
    if batch_size is not None:
        options["write_batch_size"] = batch_size
    if read_as is None:
        return pq.ParquetWriter(path, schema, **options)
    if [f.name for f in schema] != read_as.names:
        raise ValueError(f"columns {schema.names} are not {read_as.names}")
    out = pq.ParquetWriter(path, schema.remove_metadata(), store_schema=False, **options)
    stored = base64.b64encode(read_as.serialize().to_pybytes())
    out.add_key_value_metadata({b"ARROW:schema": stored, **(read_as.metadata or {})})
    return out


def read_table(path: str | Path, *, remedy: str, columns: list[str] | None = None) -> pa.Table:
    """Read a dsim Parquet file (``columns`` of it, default all), verifying page checksums.

    ``remedy`` says what rebuilds the file (e.g. "re-run `dsim parse`"); it
    ends the message of a corrupted or unreadable file. A missing file raises
    ``FileNotFoundError`` so that callers can say what is missing in their words.
    """
    try:
        return pq.read_table(path, columns=columns, page_checksum_verification=True)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise unreadable(exc, path, remedy) from exc


#: ``footer``'s answers, by path: the file's identity when read, and its footer.
_FOOTERS: dict[Path, tuple[tuple[int, ...], pq.FileMetaData]] = {}
_FOOTERS_MAX = 4096


def footer(path: str | Path) -> pq.FileMetaData:
    """A Parquet file's footer (schema, row groups, statistics), read once while the file
    is the same file (device, inode, size, modification and change times).

    Why: a summary looks at each run's replay files and dataset files once to verify
    them and again to read them, ~8 footer reads per policy (opening and parsing them
    took ~0.2 s of a 20-run summary's 0.84 s in a profile). dsim replaces its files
    whole by a rename, which gives the path another inode, so a rewritten file is read
    anew. Errors are those of ``pq.read_metadata`` (a missing file
    ``FileNotFoundError``) and are not remembered.
    """
    path = Path(path)
    st = path.stat()
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _FOOTERS.get(path)
    if known is not None and known[0] == identity:
        return known[1]
    meta = pq.read_metadata(path)
    if len(_FOOTERS) >= _FOOTERS_MAX:
        _FOOTERS.clear()
    _FOOTERS[path] = (identity, meta)
    return meta


def read_schema(path: str | Path) -> pa.Schema:
    """``pq.read_schema`` from ``footer``: the Arrow schema the file records."""
    return footer(path).schema.to_arrow_schema()


def read_bytes(
    data: bytes, path: str | Path, *, remedy: str, leave_out: Collection[str] = ()
) -> pa.Table:
    """Read a dsim Parquet file from its bytes, verifying page checksums; ``path`` names it
    in errors. Readers that check a file's digest parse exactly the bytes they hashed.
    ``leave_out``: columns not decoded (what the reader never uses costs no memory)."""
    try:
        columns = None
        if leave_out:
            names = pq.read_schema(pa.BufferReader(data)).names
            columns = [name for name in names if name not in leave_out]
        return pq.read_table(
            pa.BufferReader(data), columns=columns, page_checksum_verification=True
        )
    except (OSError, pa.ArrowException) as exc:
        # pyarrow names the source '<Buffer>'; the message names ``path`` already
        text = str(exc).replace(" '<Buffer>'", "")
        raise unreadable(ValueError(text), path, remedy) from exc


def unreadable(exc: BaseException, path: str | Path, remedy: str) -> InputError:
    """The user-facing error for a Parquet file pyarrow could not read."""
    if _CRC_MISMATCH in str(exc):
        return InputError(f"corrupted Parquet data (checksum mismatch): {remedy}", path)
    return InputError(f"unreadable Parquet file: {exc}; {remedy}", path)
