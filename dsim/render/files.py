"""The summary as files: one writer per format behind one small interface.

Every writer takes ``(summary, path)`` and writes atomically (``dsim.atomic``),
so an interrupted write never leaves a half file that looks complete. Adding
a format means adding one function to ``FORMATS``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from dsim.atomic import write_parquet, write_text
from dsim.errors import UsageError

Writer = Callable[[pd.DataFrame, Path], None]


def write_csv(summary: pd.DataFrame, path: Path) -> None:
    write_text(summary.to_csv(index=False), path)


def write_parquet_file(summary: pd.DataFrame, path: Path) -> None:
    write_parquet(pa.Table.from_pandas(summary, preserve_index=False), path)


def _plain(value: Any) -> Any:
    """JSON has no NaN or infinity: undefined or unbounded statistics become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # NumPy scalar
        return _plain(value.item())
    return value


def write_json_file(summary: pd.DataFrame, path: Path) -> None:
    records = [
        {key: _plain(value) for key, value in row.items()}
        for row in summary.to_dict(orient="records")
    ]
    write_text(json.dumps(records, indent=2, allow_nan=False) + "\n", path)


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
