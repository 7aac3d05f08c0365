"""Which log files form which run, and what each run is called.

* A file is one run (anything that is not a directory: a FIFO, ``/dev/null``
  or a process substitution ``<(zcat log.gz)`` is a file to read).
* A directory holding ``*.log`` files is one run: one interleaved file or
  one file per rank. Compressed (``*.log.gz``, ``.bz2``, ``.xz``, ``.zst``)
  and rotated files (``rank0.log.1``, ``rank0.log.2.gz``,
  ``rank0.log-20261101``, ``rank0.log.2026-11-01``) count as logs too; the
  files of one log are read oldest first (see ``log_files``).
* A directory without such files of its own is a tree of runs: every
  directory below it that holds them is a run.

Names: the original analysis's tree
``.../<logtype>/<dataset>/<aug>/<model>/epoch<E>/b<B>/worker<W>/thread<T>/output.log``
gives ``<logtype>_<dataset>_<aug>_<model>_epoch<E>_b<B>_worker<W>_thread<T>``;
elsewhere a run is named after its directory, or, for a file with a telling
name of its own (not ``output.log``, ``rank0.log``...), after the file stem.
"""

from __future__ import annotations

import itertools
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
# ``<base>.log``, then a rotation suffix (a logrotate number, or a date with an optional
# hour, minute and second), then a compression suffix; each part optional but the base.
_LOG_NAME = re.compile(
    r"^(?P<base>.+\.log)"
    r"(?:\.(?P<number>\d{1,6})"
    r"|[.-](?P<date>\d{4}-?\d{2}-?\d{2}(?:[T_.-]?\d{2}(?:[:-]?\d{2}){0,2})?))?"
    r"(?P<compressed>\.(?:gz|bz2|xz|zst))?$"
)
_RANK_IN_NAME = re.compile(r"(?:rank|gpu)[_-]?(\d+)", re.IGNORECASE)
_TREE_TAIL = [re.compile(p) for p in (r"epoch\d+", r"b\d+", r"worker\d+", r"thread\d+")]


def log_base(path: Path) -> str:
    """The log a file belongs to: ``rank0.log.2.gz`` -> ``rank0.log`` (its name, otherwise)."""
    match = _LOG_NAME.match(path.name)
    if match:
        return match.group("base")
    return _strip_compression(path.name)


def _strip_compression(name: str) -> str:
    for suffix in (".gz", ".bz2", ".xz", ".zst"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def _age(path: Path) -> tuple:
    """Sort key of one file of a log, oldest first.

    Dated files come first, by date (ascending); then logrotate's numbered
    files, highest number first (``.2`` is older than ``.1``); the live file,
    without a suffix, is the newest. A log rotated both ways at once has no
    order to recover; this one is at least stable.
    """
    match = _LOG_NAME.match(path.name)
    if match is None:
        return (3, path.name)
    if match.group("date"):
        return (0, re.sub(r"\D", "", match.group("date")))
    if match.group("number"):
        return (1, -int(match.group("number")))
    return (2, 0)


def log_files(paths: list[Path]) -> tuple[Path, ...]:
    """Log files in reading order: by log (``log_base``), each log's files oldest first.

    Two files that are the same rotation of one log (``rank0.log.1`` and
    ``rank0.log.1.gz``: a copy left beside its compressed twin) would repeat
    every record, so they are refused.
    """
    keyed = sorted(((log_base(p), _age(p)), p) for p in paths)
    for (key, first), (other, second) in itertools.pairwise(keyed):
        if key == other:
            raise InputError(
                f"{first.name} and {second.name} are the same file of one log, "
                "compressed and not: keep one of them",
                first.parent,
            )
    return tuple(p for _, p in keyed)


def is_log_name(name: str) -> bool:
    """``*.log``, or a rotated or compressed file of one (``rank0.log.1``, ``rank0.log.2.gz``)."""
    return _LOG_NAME.match(name) is not None


_is_log_name = is_log_name


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
    stem = Path(log_base(path)).stem
    if _GENERIC_STEM.search(stem):
        return _directory_run_name(path.parent)
    return stem


def _logs_in(directory: Path) -> tuple[Path, ...]:
    """The log files of a directory run; an entry named like a log that is no file to read
    (a broken or looping link, a named pipe) is an input error naming it, not skipped: the
    run would silently lack that rank."""
    logs = []
    for path in directory.iterdir():
        if not _is_log_name(path.name) or path.is_dir():
            continue
        if not path.is_file():
            raise InputError(_not_a_file(path), path)
        logs.append(path)
    return log_files(logs)


def _not_a_file(path: Path) -> str:
    if path.is_symlink():
        return "cannot read: a symbolic link to nothing (broken, or a loop)"
    if path.is_fifo():
        return "cannot read: a named pipe among a directory's logs (give it as a path of its own)"
    return "cannot read: not a regular file"


def _log_entry(path: Path) -> bool:
    """Named like a log and no directory: a log file, or an entry ``_logs_in`` refuses."""
    return _is_log_name(path.name) and not path.is_dir()


def _extras_in(directory: Path) -> tuple[Path, ...]:
    """GPU utilisation logs beside a directory run's logs (recognised by their header)."""
    from dsim.sources.gpuutil import is_util_log

    return tuple(sorted(p for p in directory.iterdir() if is_util_log(p)))


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
            runs.append(RunSource(_file_run_name(path), (path,), origin=path))
            continue
        logs = _logs_in(path)
        if logs:
            runs.append(RunSource(_directory_run_name(path), logs, _extras_in(path), path))
            continue
        leaves = sorted({p.parent for p in path.rglob("*") if _log_entry(p)})
        if not leaves:
            raise InputError(
                f"no log files ({LOG_GLOB}, or rotated or compressed: *.log.1, "
                "*.log.gz, .bz2, .xz, .zst) in this directory or below",
                path,
            )
        runs.extend(
            RunSource(_directory_run_name(leaf), _logs_in(leaf), _extras_in(leaf), leaf)
            for leaf in leaves
        )

    if name is not None:
        if len(runs) != 1:
            raise UsageError(f"--name names one run, but the paths hold {len(runs)} runs")
        runs = [RunSource(name, runs[0].files, runs[0].extras)]
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
