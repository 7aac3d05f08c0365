"""Which log files form which run, and what each run is called.

* A file is one run (anything that is not a directory: a FIFO, ``/dev/null``
  or a process substitution ``<(zcat log.gz)`` is a file to read).
* A directory holding ``*.log`` files is one run: one interleaved file or
  one file per rank.
* A directory without ``*.log`` files of its own is a tree of runs: every
  directory below it that holds ``*.log`` files is a run.

Names: the original analysis's tree
``.../<logtype>/<dataset>/<aug>/<model>/epoch<E>/b<B>/worker<W>/thread<T>/output.log``
gives ``<logtype>_<dataset>_<aug>_<model>_epoch<E>_b<B>_worker<W>_thread<T>``;
elsewhere a run is named after its directory, or, for a file with a telling
name of its own (not ``output.log``, ``rank0.log``...), after the file stem.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from dsim.errors import InputError, UsageError
from dsim.sources.base import RunSource

LOG_GLOB = "*.log"
_GENERIC_STEM = re.compile(
    r"^(output|out|log|logs|train|training|stdout|stderr|console|nohup)$"
    r"|rank[_-]?\d+|^gpu[_-]?\d+$|^\d+$",
    re.IGNORECASE,
)
_RANK_IN_NAME = re.compile(r"(?:rank|gpu)[_-]?(\d+)", re.IGNORECASE)
_TREE_TAIL = [re.compile(p) for p in (r"epoch\d+", r"b\d+", r"worker\d+", r"thread\d+")]


def rank_from_file_name(path: Path) -> int | None:
    """``rank3.log`` or ``gpu3.log`` -> 3: the rank of a per-rank file without ``GPU:`` fields."""
    match = _RANK_IN_NAME.search(path.stem)
    return int(match.group(1)) if match else None


def tree_run_name(directory: Path) -> str | None:
    """The original analysis's name for a leaf of its log tree, or ``None``."""
    parts = directory.parts
    if len(parts) < 8:
        return None
    tail = parts[-4:]
    if not all(p.fullmatch(t) for p, t in zip(_TREE_TAIL, tail, strict=True)):
        return None
    return "_".join(parts[-8:])


def _directory_run_name(directory: Path) -> str:
    return tree_run_name(directory) or directory.resolve().name


def _file_run_name(path: Path) -> str:
    if _GENERIC_STEM.search(path.stem):
        return _directory_run_name(path.parent)
    return path.stem


def _logs_in(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob(LOG_GLOB) if p.is_file())


def _is_dir(path: Path) -> bool:
    """Whether ``path`` is a directory we can list; a clear input error if it is neither."""
    try:
        if not stat.S_ISDIR(os.stat(path).st_mode):
            return False
        os.listdir(path)
    except FileNotFoundError:
        raise InputError("no such file or directory", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    return True


def discover_runs(paths: list[Path], name: str | None = None) -> list[RunSource]:
    """Turn the command line's paths into runs; ``name`` overrides the name of a single run."""
    runs: list[RunSource] = []
    for path in paths:
        if not _is_dir(path):  # a file, or a FIFO, /dev/null, a process substitution <(...)
            runs.append(RunSource(_file_run_name(path), (path,)))
            continue
        logs = _logs_in(path)
        if logs:
            runs.append(RunSource(_directory_run_name(path), tuple(logs)))
            continue
        leaves = sorted({p.parent for p in path.rglob(LOG_GLOB) if p.is_file()})
        if not leaves:
            raise InputError(f"no log files (*{LOG_GLOB[1:]}) in this directory or below", path)
        runs.extend(RunSource(_directory_run_name(leaf), tuple(_logs_in(leaf))) for leaf in leaves)

    if name is not None:
        if len(runs) != 1:
            raise UsageError(f"--name names one run, but the paths hold {len(runs)} runs")
        runs = [RunSource(name, runs[0].files)]
    seen: dict[str, RunSource] = {}
    for run in runs:
        if run.name in seen and seen[run.name].files != run.files:
            raise UsageError(
                f"two runs would both be named {run.name!r}: "
                f"{seen[run.name].files[0].parent} and {run.files[0].parent}; "
                "parse them separately with --name"
            )
        seen[run.name] = run
    return list(seen.values())
