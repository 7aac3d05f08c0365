"""``dsim parse`` as library calls: which runs some paths hold, and one run parsed and written.

The command (``dsim.commands.parse``) adds worker processes, progress bars
and its report; the Python API (``dsim.api.parse``) calls the same two
functions, so both write the same run directories.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dsim.model.consistency import consistency
from dsim.model.runinfo import RunInfo
from dsim.model.tables import write_run_info
from dsim.sources import RunSource, detect_source, get_source


def discover_runs(
    paths: Sequence[Path], *, name: str | None = None, input_format: str = "auto"
) -> tuple[str, list[RunSource]]:
    """The input format (``auto`` detected) and the runs the paths hold (docs/SPEC.md §1.1)."""
    paths = [Path(p) for p in paths]
    fmt = detect_source(paths) if input_format == "auto" else input_format
    return fmt, get_source(fmt).discover(paths, name=name)


def parse_and_write(
    run: RunSource,
    out: Path,
    *,
    fmt: str,
    strict: bool = False,
    limits: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[Path, RunInfo]:
    """Parse one run and write ``<out>/<run>/`` atomically; its directory and ``RunInfo``."""
    kwargs: dict[str, Any] = dict(limits or {})
    if progress is not None:
        kwargs["progress"] = progress
    parsed = get_source(fmt).parse(run, strict=strict, **kwargs)
    tables = parsed.tables
    # every input format: whether the ranks' timelines can come from synchronous DDP (§2.3)
    tables = replace(tables, info=tables.info.with_consistency(consistency(tables.train)))
    directory = Path(out) / run.name
    info = write_run_info(tables, directory, parsed.rejects)  # with the version written
    return directory, info
