"""The rejected lines of a run, as users read them in ``rejects.csv``.

Lines rejected by the grammar carry their text from the first read. Lines
rejected by rules across records (repeats, conflicts, clocks, stray ranks)
are only known once every file was read, when their text is gone; rejects
are rare, so those few lines are read again at the end, streaming, by line
number. A source that cannot be read twice (a pipe) keeps an empty text.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsim.io import compression
from dsim.io.arrowtables import array_of, empty_table, numpy_of, strings_of

SCHEMA = pa.schema(
    [
        ("file", pa.string()),
        ("line", pa.int64()),
        ("reason", pa.string()),
        ("text", pa.large_string()),
    ]
)
TEXT_CHARS = 300  # a reject's text is cut to this many characters
_BLOCK = 4 << 20


def rows_table(lines: np.ndarray, reason: str, files: list[str]) -> pa.Table:
    """Rejects with one reason and no text yet (``files``: the file of each row)."""
    return pa.table(
        {
            "file": strings_of(files),
            "line": array_of(np.asarray(lines), pa.int64()),
            "reason": strings_of([reason] * len(lines)),
            "text": strings_of([""] * len(lines), pa.large_string()),
        }
    )


def combine(parts: list[pa.Table], files: tuple[Path, ...]) -> pa.Table:
    """All rejects of a run, in file order (files as the run lists them) and line order."""
    tables = [t.select(SCHEMA.names).cast(SCHEMA) for t in parts if t.num_rows]
    if not tables:
        return empty_table(SCHEMA)
    order = {str(p): i for i, p in enumerate(files)}
    table = pa.concat_tables(tables)
    file_rank = np.array([order.get(f, len(order)) for f in table["file"].to_pylist()])
    sort = np.lexsort((numpy_of(table["line"]), file_rank))
    return table.take(array_of(sort))


def fill_texts(rejects: pa.Table) -> pa.Table:
    """Rejects whose text is empty get their line's text, read again from the file."""
    if rejects.num_rows == 0:
        return rejects
    text = rejects["text"].to_pylist()
    missing = [i for i, t in enumerate(text) if not t]
    if not missing:
        return rejects
    files = rejects["file"].to_pylist()
    lines = rejects["line"].to_pylist()
    wanted: dict[str, set[int]] = {}
    for i in missing:
        wanted.setdefault(files[i], set()).add(lines[i])
    found = {f: _read_lines(Path(f), numbers) for f, numbers in wanted.items()}
    for i in missing:
        text[i] = found[files[i]].get(lines[i], "")
    column = strings_of(text, pa.large_string())
    column = pc.utf8_slice_codeunits(pc.utf8_rtrim(column, characters="\r\n"), 0, TEXT_CHARS)
    return rejects.set_column(rejects.schema.get_field_index("text"), "text", column)


def _read_lines(path: Path, numbers: set[int]) -> dict[int, str]:
    """The text of the lines ``numbers`` (1-based) of a regular file; {} when it cannot be read.

    Blocks are counted through with ``bytes.count``; only the blocks that hold
    a wanted line are split.
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return {}
        handle = compression.open_text(path)  # decompressed, if it is compressed
    except OSError:
        return {}
    out: dict[int, str] = {}
    wanted = sorted(numbers)
    k = 0
    first = 1  # number of the line that starts at the head of ``pending``
    pending = b""
    with handle:
        while k < len(wanted):
            try:
                block = handle.read(_BLOCK)
            except (OSError, compression.StreamError):  # changed since the first read
                break
            data = pending + block
            cut = data.rfind(b"\n") + 1 if block else len(data)
            whole, pending = data[:cut], data[cut:]
            count = whole.count(b"\n") + (0 if block or not whole or whole.endswith(b"\n") else 1)
            if wanted[k] < first + count:
                split = whole.split(b"\n")
                while k < len(wanted) and wanted[k] < first + count:
                    out[wanted[k]] = split[wanted[k] - first].decode("utf-8", errors="replace")
                    k += 1
            first += count
            if not block:
                break
    return out
