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

from dsim.errors import UsageError
from dsim.io.atomic import write_parquet, write_text
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


FORMATS: dict[str, Writer] = {
    "csv": write_csv,
    "parquet": write_parquet_file,
    "json": write_json_file,
}


def parse_formats(spec: str | Sequence[str]) -> list[str]:
    """``"csv,parquet"`` or ``["csv", "json"]`` → validated format names, in order, no repeats."""
    items = spec.split(",") if isinstance(spec, str) else [p for s in spec for p in s.split(",")]
    names = [item.strip().lower() for item in items if item.strip()]
    unknown = [n for n in names if n not in FORMATS]
    if unknown or not names:
        raise UsageError(
            f"unknown output format {', '.join(unknown) or repr(spec)}; "
            f"choose from {', '.join(FORMATS)}"
        )
    return list(dict.fromkeys(names))


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
