"""Every Parquet file dsim writes or reads goes through here, with page checksums.

dsim writes each data page with a CRC-32 (``write_page_checksum``) and
verifies it on every read (``page_checksum_verification``), so a flipped bit
in a table, a replay or a summary is a clear error naming the file instead of
a silently wrong number. Files without checksums (written by other tools or
older dsim versions) still read: the check applies to pages that carry one.
The checksums are a function of the page bytes only, so the files stay
byte-for-byte deterministic.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dsim.errors import InputError

_CRC_MISMATCH = "CRC checksum verification failed"


def write_table(table: pa.Table, path: str | Path) -> None:
    """Write ``table`` to ``path`` (not atomically: see ``dsim.io.atomic.write_parquet``)."""
    pq.write_table(table, path, write_page_checksum=True)


def read_table(path: str | Path, *, remedy: str) -> pa.Table:
    """Read a dsim Parquet file, verifying page checksums.

    ``remedy`` says what rebuilds the file (e.g. "re-run `dsim parse`"); it
    ends the message of a corrupted or unreadable file. A missing file raises
    ``FileNotFoundError`` so that callers can say what is missing in their words.
    """
    try:
        return pq.read_table(path, page_checksum_verification=True)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise unreadable(exc, path, remedy) from exc


def read_bytes(data: bytes, path: str | Path, *, remedy: str) -> pa.Table:
    """Read a dsim Parquet file from its bytes, verifying page checksums; ``path`` names it
    in errors. Readers that check a file's digest parse exactly the bytes they hashed."""
    try:
        return pq.read_table(pa.BufferReader(data), page_checksum_verification=True)
    except (OSError, pa.ArrowException) as exc:
        # pyarrow names the source '<Buffer>'; the message names ``path`` already
        text = str(exc).replace(" '<Buffer>'", "")
        raise unreadable(ValueError(text), path, remedy) from exc


def unreadable(exc: BaseException, path: str | Path, remedy: str) -> InputError:
    """The user-facing error for a Parquet file pyarrow could not read."""
    if _CRC_MISMATCH in str(exc):
        return InputError(f"corrupted Parquet data (checksum mismatch): {remedy}", path)
    return InputError(f"unreadable Parquet file: {exc}; {remedy}", path)
