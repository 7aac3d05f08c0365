"""Writing a synthetic run: the destination check and the streaming, atomic write.

A run directory appears whole or not at all (``dsim.io.atomic``), and only a
directory an earlier ``dsim synth`` wrote is ever replaced, so a mistyped
``--out`` cannot destroy a user's files. Lines are written chunk by chunk as
the model produces them, so memory stays bounded whatever the number of lines.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from dsim.errors import OutputError, UsageError
from dsim.io.atomic import atomic_dir
from dsim.io.names import run_path
from dsim.synth.events import ordered_events, released_iterations
from dsim.synth.lines import render_lines
from dsim.synth.params import SynthParams
from dsim.words import byte_size, counted

SINGLE_FILE = "output.log"
_RANK_FILE = re.compile(r"^rank\d+\.log$")


def _check_target(target: Path) -> None:
    """Replace only what an earlier ``dsim synth`` wrote; never a user's other files."""
    if not target.exists() and not target.is_symlink():
        return
    if not target.is_dir() or target.is_symlink():
        raise UsageError(f"{target} exists and is not a directory; choose another --name or --out")
    foreign = [p.name for p in target.iterdir() if not _is_log_name(p.name) or not p.is_file()]
    if foreign:
        shown = ", ".join(sorted(foreign)[:3])
        raise UsageError(
            f"{target} exists and holds files dsim synth did not write ({shown}); "
            "choose another --name or --out"
        )


def _is_log_name(name: str) -> bool:
    return name == SINGLE_FILE or _RANK_FILE.match(name) is not None


def check_output(params: SynthParams, out_dir: str | Path) -> Path:
    """Validate params and the destination; return the run directory that will be written."""
    params.validate()
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} exists and is not a directory")
    target = run_path(out_dir, params.run_name)  # inside --out, not through a link
    _check_target(target)
    _check_space(params, out_dir)
    return target


def estimated_bytes(params: SynthParams) -> int:
    """About how many bytes the run's logs take: its lines times the mean line of a
    4-GPU, 4-iteration run of the same parameters, whose numbers are no longer than
    the run's own (more ranks and iterations only print more digits)."""
    small = replace(
        params, gpus=min(params.gpus, 4), iterations=min(params.iterations, 4), epochs=1
    )
    written = sum(
        int(render_lines(fetch, train, small.iterations)[1].sum())
        for fetch, train in ordered_events(small)
    )
    return params.lines * written // small.lines


def _check_space(params: SynthParams, out_dir: Path) -> None:
    """Refuse a run whose logs cannot fit the free space where they would be written.

    Why: ``--gpus 1024 --iterations 300000`` wrote for five minutes until the disk
    was full, and left nothing (the run is written atomically).
    """
    need = estimated_bytes(params)
    where = out_dir.absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return  # nothing to compare with; the write says what fails
    if need > free:
        raise UsageError(
            f"{params.lines:,} lines ({counted(params.gpus, 'GPU')} × "
            f"{counted(params.iterations, 'iteration')} × {counted(params.epochs, 'epoch')} × 2) "
            f"take about {byte_size(need)}, and {where} has "
            f"{byte_size(free)} free: choose a smaller run or another --out"
        )


def synthesize(
    params: SynthParams,
    out_dir: str | Path,
    *,
    progress: Callable[[int, int], None] | None = None,
    chunk_iterations: int | None = None,
) -> Path:
    """Write the run ``<out_dir>/<run_name>/`` atomically and return its path.

    ``progress(done, total)`` is called with iterations done (over all epochs).
    Memory is bounded by one chunk plus the lines still waiting for their turn
    (at most one prefetch window per rank), whatever the run's length.
    """
    target = check_output(params, out_dir)
    total = params.iterations * params.epochs
    done = 0
    try:
        with atomic_dir(target, check_existing=_check_target) as tmp:
            names = (
                [f"rank{r}.log" for r in range(params.gpus)] if params.per_rank else [SINGLE_FILE]
            )
            files = [open(tmp / name, "wb") for name in names]  # noqa: SIM115 - closed below
            try:
                for fetch, train in ordered_events(params, chunk_iterations):
                    matrix, mask, keys = render_lines(fetch, train, params.iterations)
                    if params.per_rank:
                        for r, handle in enumerate(files):
                            rows = keys["rank"] == r
                            handle.write(matrix[rows][mask[rows]].tobytes())
                    else:
                        files[0].write(matrix[mask].tobytes())
                    if progress is not None:
                        done = min(total, done + released_iterations(train, params))
                        progress(done, total)
            finally:
                for handle in files:
                    handle.close()
    except OSError as exc:  # e.g. disk full while writing inside the temporary directory
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from exc
    if progress is not None:
        progress(total, total)
    return target
