"""A run's memo: proof that its ``result.json`` and attribution table still stand.

Why: a ``dsim run`` whose every replay is cached read each run's trace, built its
arrays and attributed it again, only to write the same ``result.json`` and
attribution table (2.8x ``dsim summarize``, issue #21). What ``dsim run`` derives
from a run besides its replays (the plan: model, policies and their keys, selection,
batch, dropped iterations; the attribution) is a function of the run's trace (its
``run.json`` and the tables' bytes), the options that shape the plan, where the
results go, and the code. The memo (``<out>/attribution/memo/<run>.json``) records
the digest of those inputs (``inputs_digest``) and the sha256 of each
``result.json`` and attribution table written from them. A later ``dsim run`` whose
inputs have the same digest, and finds those files with those bytes, knows they are
what a fresh run would write again, without reading the tables
(``dsim.app.runtask.reuse_run`` also checks every replay's key and the dataset, as
any cached run does). Anything else (another trace version, an option, another dsim
or another version of its code, a file changed or missing, no memo) is a full run.

The memo is written last for a run, after its attribution tables; an interrupted run
leaves an old memo whose hashes no longer match the files rewritten since.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import dsim
from dsim.app.attribution import run_table_path
from dsim.config import SimConfig
from dsim.errors import DsimError
from dsim.io.atomic import write_text
from dsim.model.datasetfiles import modified_ns
from dsim.model.resultinfo import KEY_FORMAT_VERSION, RESULT_FILE, RESULTS_FORMAT_VERSION
from dsim.model.runinfo import RunInfo
from dsim.model.tables import read_version

#: Where the memos are: ``<out>/attribution/memo/<run>.json`` (two levels down, like the
#: attribution tables, so that no results scan takes the folder for a run directory).
MEMO_DIR = ("attribution", "memo")
#: Bumped whenever what a memo vouches for changes meaning.
MEMO_FORMAT = 1

#: The config fields a run's plan, ``result.json`` or attribution depend on (with the
#: run's own name and trace directory); ``IGNORED`` are those they do not. Every field of
#: ``SimConfig`` is in one of the two (a test checks it), so a new option is a decision.
PLANNED = (
    "policies",
    "policies_explicit",
    "epochs",
    "warmup",
    "threshold_s",
    "stall_floor_s",
    "stall_grow_min_s",
    "model",
    "workers",
    "prefetch_factor",
    "out",
)
IGNORED = (
    "runs",  # the other runs: each run's plan is its own
    "run_dirs",  # this run's is in the digest
    "traces",  # named by the run's directory
    "executor",  # files are the same wherever a run went
    "num_cpus",
    "ray_address",
    "source",
    "mlflow",
    "run_infos",  # the runs' run.json, read again from the snapshot
)


def memo_path(out: str | Path, run: str) -> Path:
    """Where ``dsim run`` keeps the memo of run ``run``."""
    return Path(out).joinpath(*MEMO_DIR, f"{run}.json")


@functools.cache
def code_digest() -> str:
    """sha256 of dsim's installed version and of every source file of the package: a
    memo never outlives a change of the code that wrote it, released or not (~1 MB read
    once per process). Source that cannot be read gives a digest of this process alone:
    no memo is then reused, every run goes the full way."""
    digest = hashlib.sha256(str(dsim.__version__).encode())
    root = Path(dsim.__file__).parent
    try:
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    except OSError:
        return f"unreadable-{uuid.uuid4().hex}"
    return digest.hexdigest()


def inputs_digest(
    name: str,
    run_dir: Path,
    config: SimConfig,
    info: RunInfo,
    files: Mapping[str, Mapping[str, Any]],
) -> str:
    """The digest of everything ``dsim run`` derives run ``name``'s plan, ``result.json``
    and attribution from: the version of its trace (``info``: its ``run.json``;
    ``files``: the tables' ``file_digest``s, of one snapshot), the options that shape
    them (``PLANNED``), where the trace is from the results, and the code."""
    options = {key: getattr(config, key) for key in PLANNED if key != "out"}
    options["policies"] = [list(p) for p in config.policies]
    document = {
        "memo": MEMO_FORMAT,
        "key_format": KEY_FORMAT_VERSION,
        "results_format": RESULTS_FORMAT_VERSION,
        "code": code_digest(),
        "run": name,
        # as result.json's ``trace_path`` (relative: results and traces moved together,
        # or written side by side elsewhere, give the same memo)
        "trace_path": os.path.relpath(os.path.abspath(run_dir), os.path.abspath(config.out)),
        "trace": info.document(),
        "files": {str(k): dict(v) for k, v in files.items()},
        "options": options,
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def trace_inputs(name: str, run_dir: Path, config: SimConfig) -> str | None:
    """``inputs_digest`` of the trace as it is now (read, not decoded), or None when it
    cannot be read as one version (a full run then says why)."""
    try:
        info, files = read_version(run_dir)
    except (DsimError, OSError):
        return None
    return inputs_digest(name, run_dir, config, info, files)


def reuse_inputs(name: str, run_dir: Path, config: SimConfig, force: bool) -> str | None:
    """``trace_inputs`` where a memo of run ``name`` exists to compare it with, else None
    (and with ``force``): a run without one, as every first run is, is planned anyway,
    and hashing its tables here would read them a second time."""
    if force or not memo_path(config.out, name).is_file():
        return None
    return trace_inputs(name, run_dir, config)


def _sha256(path: Path) -> str | None:
    """The file's hash; None where it is absent or cannot be read (a file the memo cannot
    vouch for: the run takes the full way, whose reads say what is wrong with it)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _outputs(out: Path, directory: str) -> dict[str, str | None]:
    """The hashes a memo records of one run directory's files (None: absent)."""
    return {
        "result": _sha256(out / directory / RESULT_FILE),
        "attribution": _sha256(run_table_path(out, directory)),
    }


def dataset_changed(out: Path, name: str, directory: str) -> bool:
    """Whether a dataset file of ``directory`` was modified after run ``name``'s memo was
    written: dsim writes the memo last, so such a file changed since dsim wrote it (a full
    run then checks its pages, ``datasetfiles.intact``). False without a memo.

    Why times, not hashes: hashing the dataset would cost every cached run a read of its
    data, and the memo's bytes must stay the same on every machine (both executors
    write the same files)."""
    try:
        written = memo_path(out, name).stat().st_mtime_ns
    except OSError:
        return False
    return any(modified > written for modified in modified_ns(out, directory))


def write_memo(out: Path, name: str, inputs: str, directories: list[str]) -> Path:
    """Record that ``directories``' ``result.json`` and attribution tables, as they are
    now, are what ``inputs`` give (called once they are all written)."""
    memo = {
        "format": MEMO_FORMAT,
        "inputs": inputs,
        # a list: the plans' order (a what-if before its baseline), which reports keep
        "directories": [{"directory": d, **_outputs(out, d)} for d in directories],
    }
    path = memo_path(out, name)
    write_text(json.dumps(memo, sort_keys=True, indent=1) + "\n", path)
    return path


def memo_candidate(out: Path, name: str, inputs: str | None) -> bool:
    """Whether run ``name`` has a memo of these inputs (a hint, read without the lock:
    ``vouched_directories`` decides, under it)."""
    return inputs is not None and _read_memo(out, name, inputs) is not None


def vouched_directories(out: Path, name: str, inputs: str | None) -> list[str] | None:
    """The run directories whose ``result.json`` and attribution table the memo of run
    ``name`` vouches for as what ``inputs`` give, or None: no memo, of other inputs, or a
    file changed or missing since it was written."""
    if inputs is None:
        return None
    memo = _read_memo(out, name, inputs)
    if memo is None:
        return None
    directories = []
    for recorded in memo["directories"]:
        directory = recorded.pop("directory")
        if recorded.get("result") is None or _outputs(out, directory) != recorded:
            return None
        if dataset_changed(out, name, directory):
            return None  # the full way checks the file (``runplan.dataset_damaged``)
        directories.append(directory)
    return directories


def _read_memo(out: Path, name: str, inputs: str) -> dict[str, Any] | None:
    try:
        memo = json.loads(memo_path(out, name).read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(memo, dict) or memo.get("format") != MEMO_FORMAT:
        return None
    directories = memo.get("directories")
    if memo.get("inputs") != inputs or not isinstance(directories, list) or not directories:
        return None
    for entry in directories:  # the run's own directories (RUN, RUN@…), nothing else
        where = entry.get("directory") if isinstance(entry, dict) else None
        if not isinstance(where, str) or not _is_variant(where, name):
            return None
    return memo


def _is_variant(directory: str, name: str) -> bool:
    """Whether ``directory`` is one of run ``name``'s (``RUN`` or ``RUN@…``, one level)."""
    plain = "/" not in directory and "\\" not in directory and directory not in ("", ".", "..")
    return plain and (directory == name or directory.startswith(f"{name}@"))


def config_fields() -> set[str]:
    """Every field of ``SimConfig`` (for the test that each is PLANNED or IGNORED)."""
    return {f.name for f in fields(SimConfig)}
