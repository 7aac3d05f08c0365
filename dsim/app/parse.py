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

from dsim.errors import InputError
from dsim.model.consistency import consistency
from dsim.model.runinfo import RunInfo
from dsim.model.tables import write_run
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
    try:
        parsed = get_source(fmt).parse(run, strict=strict, **kwargs)
        tables = parsed.tables
        # every input format: whether the ranks' timelines can come from synchronous DDP (§2.3)
        tables = replace(tables, info=tables.info.with_consistency(consistency(tables.train)))
        directory = write_run(tables, Path(out) / run.name, parsed.rejects)
    except MemoryError:
        # A run too large for this machine is a fact about the input, not a bug: one line
        # naming it (exit 3), like every other input dsim cannot take.
        raise InputError(
            "out of memory parsing this run (its tables do not fit in memory; "
            "parse it alone with --jobs 1 or on a machine with more memory)",
            _where(run),
        ) from None
    return directory, tables.info


def _where(run: RunSource) -> Path | None:
    """The path that names a run in a message: its one file, or the folder of its files."""
    files = [Path(f) for f in run.files]
    if len(files) == 1:
        return files[0]
    parents = {f.parent for f in files}
    return parents.pop() if len(parents) == 1 else None
