"""The summary as files: one writer per format behind one small interface.

Every writer takes ``(summary, path)`` and writes atomically (``dsim.io.atomic``),
so an interrupted write never leaves a half file that looks complete. Adding
a format means adding one function to ``FORMATS``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa

from dsim.io.atomic import write_parquet, write_text
from dsim.options import FORMAT_NAMES
from dsim.render.machine import answer_table, dumps, summary_records

if TYPE_CHECKING:
    from dsim.app.answer import Answer

Writer = Callable[[pd.DataFrame, Path], None]


def write_csv(summary: pd.DataFrame, path: Path) -> None:
    write_text(summary.to_csv(index=False), path)


def write_parquet_file(summary: pd.DataFrame, path: Path) -> None:
    write_parquet(pa.Table.from_pandas(summary, preserve_index=False), path)


def write_json_file(summary: pd.DataFrame, path: Path) -> None:
    write_text(dumps(summary_records(summary)), path)


#: One writer per name the options accept (``dsim.options.FORMAT_NAMES``, in its order).
FORMATS: dict[str, Writer] = dict(
    zip(FORMAT_NAMES, (write_csv, write_parquet_file, write_json_file), strict=True)
)


def write_summary_files(
    summary: pd.DataFrame, out: str | Path, formats: Sequence[str], stem: str = "summary"
) -> list[Path]:
    """Write ``<out>/<stem>.<format>`` for each format; returns the paths written."""
    paths = []
    for name in formats:
        path = Path(out) / f"{stem}.{name}"
        FORMATS[name](summary, path)
        paths.append(path)
    return paths


def summary_bytes(summary: pd.DataFrame, name: str) -> bytes:
    """The bytes ``write_summary_files`` would write for one format (``--out -``: stdout)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dsim-") as tmp:
        path = Path(tmp) / f"summary.{name}"
        FORMATS[name](summary, path)
        return path.read_bytes()


def write_answer_files(
    answer: Answer, out: str | Path, formats: Sequence[str], stem: str = "summary"
) -> list[Path]:
    """An ``Answer``'s table (``dsim.render.machine.answer_table``: the summary rows its
    verdicts, overview and checks were computed from, with its best policy, verdict and
    attribution per row) as ``<out>/<stem>.<format>`` files, so the files agree with every
    other output."""
    return write_summary_files(answer_table(answer), out, formats, stem)


def answer_bytes(answer: Answer, name: str) -> bytes:
    """The bytes ``write_answer_files`` would write for one format (``--out -``)."""
    return summary_bytes(answer_table(answer), name)
