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

from dsim.errors import InputError, UsageError
from dsim.io.atomic import check_replaceable
from dsim.io.memory import release_freed_for
from dsim.io.names import check_run_name, run_path
from dsim.model.consistency import clock_offsets, consistency, train_arrays
from dsim.model.rankclocks import shift_ranks
from dsim.model.runinfo import RunInfo, check_run_directory
from dsim.model.tables import RunTables, write_run_info
from dsim.sources import RunSource, detect_source, get_source


def discover_runs(
    paths: Sequence[Path], *, name: str | None = None, input_format: str = "auto"
) -> tuple[str, list[RunSource]]:
    """The input format (``auto`` detected) and the runs the paths hold (docs/SPEC.md §1.1)."""
    paths = [Path(p) for p in paths]
    if any(str(p) == "-" and not p.exists() for p in paths):  # the shell's "standard input"
        raise UsageError(
            "-: dsim parse reads files and directories; to read standard input, give "
            "/dev/stdin (and --name to name the run)"
        )
    fmt = detect_source(paths) if input_format == "auto" else input_format
    runs = get_source(fmt).discover(paths, name=name)
    for run in runs:  # a name becomes <out>/<name>/: one rule, before any work (§1.1)
        check_run_name(run.name, origin=run.origin)
    return fmt, runs


def parse_and_write(
    run: RunSource,
    out: Path,
    *,
    fmt: str,
    strict: bool = False,
    limits: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[Path, RunInfo]:
    """Parse one run and write ``<out>/<run>/`` atomically; its directory and ``RunInfo``.

    An existing ``<out>/<run>/`` is replaced only if dsim wrote it (§2.3).
    """
    target = run_path(out, run.name)  # inside --out, not through a link
    check_replaceable(target, check_run_directory)  # fail before parsing, not after
    kwargs: dict[str, Any] = dict(limits or {})
    if progress is not None:
        kwargs["progress"] = progress
    try:
        parsed = get_source(fmt).parse(run, strict=strict, **kwargs)
        size = parsed.tables.train.num_rows
        release_freed_for(size)  # the parse's own buffers, before the checks' arrays
        train = parsed.tables.train
        # both checks read the same arrays of the train table: made once (a shifted table's
        # are made again)
        arrays = train_arrays(train) if train.num_rows else None
        tables = with_clocks_set(parsed.tables, arrays)
        if tables.train is not train:
            arrays = None
        del train
        # every input format: whether the ranks' timelines can come from synchronous DDP (§2.3)
        figures = consistency(tables.train, arrays)
        del arrays
        tables = replace(tables, info=tables.info.with_consistency(figures))
        release_freed_for(size)  # the checks' arrays, before the Parquet writer's buffers
        info = write_run_info(tables, target, parsed.rejects)  # with the version written
    except MemoryError:
        # A run too large for this machine is a fact about the input, not a bug: one line
        # naming it (exit 3), like every other input dsim cannot take.
        raise InputError(
            "out of memory parsing this run (its tables do not fit in memory; "
            "parse it alone with --jobs 1 or on a machine with more memory)",
            _where(run),
        ) from None
    return target, info


def with_clocks_set(tables: RunTables, arrays: tuple | None = None) -> RunTables:
    """Ranks whose clocks are off (§1.7.1): constant offsets corrected, all of them recorded.

    ``run.json`` ``report.clock_offsets`` keeps what was found and done, so that a
    corrected trace says so; ``dsim parse`` prints it (``clock_offset_lines``).
    ``arrays``: the train table's ``consistency.train_arrays``, when made already.
    """
    found = clock_offsets(tables.train, arrays)
    if found is None:
        return tables
    fixed = {r["gpu"]: r["offset_s"] for r in found["ranks"] if r["corrected"]}
    tables = shift_ranks(tables, fixed)
    report = {**tables.info.report, "clock_offsets": found}
    return replace(tables, info=replace(tables.info, report=report))


def clock_offset_lines(name: str, found: dict[str, Any] | None) -> list[str]:
    """What ``dsim parse`` says of a run's clock offsets: one line per rank off."""
    out = []
    for r in (found or {}).get("ranks", []):
        offset = r["offset_s"]
        side = "ahead of" if offset > 0 else "behind"
        head = f"run {name}: GPU {r['gpu']}'s clock is {abs(offset):.3f} s {side} the other ranks'"
        if r["corrected"]:
            out.append(
                f"{head} (constant: iteration ends within {r['spread_s'] * 1000:.1f} ms once "
                f"moved); corrected, its times shifted by {-offset:+.3f} s "
                "(run.json report.clock_offsets)"
            )
        else:
            out.append(
                f"{head} (median), but not constant (deviation p95 {r['spread_s']:.3g} s); "
                "not corrected"
            )
    return out


def _where(run: RunSource) -> Path | None:
    """The path that names a run in a message: its one file, or the folder of its files."""
    files = [Path(f) for f in run.files]
    if len(files) == 1:
        return files[0]
    parents = {f.parent for f in files}
    return parents.pop() if len(parents) == 1 else None


#: Below this share of non-blank lines being records, the input is probably not a
#: training log at all (``dsim parse README.md``): said on stderr, the exit stays 0.
MIN_USABLE_SHARE = 0.10


def little_usable_warning(name: str, info: RunInfo) -> str | None:
    """A warning when almost nothing of a raw log became records, else None.

    ``dsim parse`` skips lines that are not its own (a training script prints
    other things too), so text that is no training log at all still "parses"
    into one stray record; without this line, exit 0 and "1 GPU, 1 of 851
    iterations" would be the only hint.
    """
    rep = info.report
    if "other_lines" not in rep:  # profiler traces count events, not lines
        return None
    text_lines = int(rep.get("lines", 0)) - int(rep.get("blank_lines", 0))
    usable = text_lines - int(rep["other_lines"]) - int(rep.get("rejected", 0))
    if text_lines <= 0 or usable >= MIN_USABLE_SHARE * text_lines:
        return None
    paths = [str(s.get("path")) for s in info.sources if s.get("path")]
    where = paths[0] if len(paths) == 1 else f"run {name} ({len(paths)} files)"
    share = 100 * usable / text_lines
    return (
        f"{where}: only {usable} of {text_lines} non-blank lines ({share:.1f} %) "
        "are dsim records, the rest was skipped: is this a log written by dsim.instrument?"
    )
