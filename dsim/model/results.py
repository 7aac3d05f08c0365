"""The on-disk layout of replay results, written by ``dsim run`` and read by
``dsim summarize`` and ``dsim report``.

::

    <out>/
      summary.parquet, summary.csv        one row per run x policy (docs/SPEC.md §5)
      <run>/
        result.json                       run metadata, replay parameters, cache keys
        <fetch>__<start>.parquet          one row per replayed iteration, or a stub
      dataset/iterations/<run>.parquet, dataset/gpus/<run>.parquet   the stubs' rows

A per-iteration replay table has ``epoch``, ``iteration``, ``iteration_s``,
``stall_s``, ``delay_s``, ``fetch_diff_s``, ``start_diff_s`` and one
``stall_s_gpu<rank>`` column per GPU. It holds every complete iteration of
every epoch; epoch selection and warm-up are applied by the summary, so the
same replay serves any summary. Its Parquet schema metadata (key ``dsim``)
records the format version, run, policy and cache key, and the provenance
behind the key (replay model, the trace's digest, replay parameters), so a
table is self-describing even when moved.

Replay format 1 is that whole table. Format 2 is a *stub*: the same metadata
with ``format_version`` 2 and ``"rows": "dataset"``, and no column: once
``dsim run`` has moved a run directory's tidy dataset files into place (which
hold every number of its replays, long), it writes each replay file as a stub,
so results hold one copy of the numbers (docs/SPEC.md §7.1). ``ResultRun.read``
returns the same table for both: a stub's rows are read from the dataset
(``dsim.model.datasetfiles``) and its metadata given back format 1's. A stub is
usable only while both dataset files list its key; otherwise it is refused like
a missing replay, and ``dsim run`` recomputes it.

Provenance rules for readers (``dsim summarize``, ``dsim report``):
``result.json`` lists, per policy, the cache key of exactly the replays of
the last completed ``dsim run`` of that run. A listed replay is used only if
its file exists and its metadata names the same run, the policy its file
name says, and the listed key; otherwise the reader refuses (``InputError``)
rather than mix replays of different traces or parameters. Replay files of
policies not listed are *stale* (left by an earlier config; ``dsim run``
reuses them if the policy comes back) and are ignored, with one note per run
directory. A run directory that has replays but no ``result.json`` (an
interrupted first ``dsim run``) is skipped with a note.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dsim.errors import InputError, OutputError, UsageError
from dsim.io import parquetio
from dsim.io.atomic import write_json, write_parquet
from dsim.io.names import run_path
from dsim.model import datasetfiles
from dsim.model.columns import METRIC_COLUMNS, gpu_stall_column
from dsim.model.resultinfo import RESULT_FILE, RESULTS_FORMAT_VERSION, ResultInfo
from dsim.model.runinfo import RunInfo, refuse_newer, written_version
from dsim.replay.policies import Policy, parse_policy_label, policy_label
from dsim.words import counted

__all__ = [
    "RESULTS_FORMAT_VERSION",
    "RESULT_FILE",
    "ResultInfo",
    "ResultRun",
    "ResultsScan",
    "check_results_directory",
    "find_result_runs",
    "load_replay",
    "read_replay_key",
    "replay_metadata",
    "replay_path",
    "replay_table",
    "results_directories",
    "scan_results",
    "stub_replays",
    "unstub_stale",
    "write_replay",
    "write_result_info",
    "write_stub",
]

SUMMARY_STEM = "summary"
#: A replay file holding its rows (every replay written before results format 2).
REPLAY_FORMAT_VERSION = 1
#: A replay file whose rows are in the run directory's dataset files (a stub).
STUB_FORMAT_VERSION = 2
READABLE_REPLAY_VERSIONS = (REPLAY_FORMAT_VERSION, STUB_FORMAT_VERSION)
STUB_ROWS = "dataset"
_RERUN = "re-run `dsim run` for this run"
_CORRUPT_REMEDY = "re-run `dsim run --force` for this run"  # the cache reads only the footer
_PROVENANCE_PARTS = (("input", "trace"), ("params", "replay parameters"), ("model", "replay model"))


def replay_path(out: str | Path, run: str, policy: Policy) -> Path:
    return Path(out) / run / f"{policy_label(policy)}.parquet"


def replay_table(
    epoch: np.ndarray,
    iteration: np.ndarray,
    metrics: dict[str, np.ndarray],
    gpus: np.ndarray,
    gpu_stall: np.ndarray,
    *,
    run: str,
    policy: Policy,
    key: str,
    provenance: dict[str, Any] | None = None,
    directory: str | None = None,
) -> pa.Table:
    """Assemble a per-iteration replay table with its self-describing metadata.

    ``provenance`` (``model``, ``input``, ``params``: what the key hashes) is
    recorded beside the key so that a mismatch can say what differs.
    """
    columns: dict[str, Any] = {
        "epoch": pa.array(epoch, pa.int32()),
        "iteration": pa.array(iteration, pa.int32()),
    }
    for name in METRIC_COLUMNS:
        columns[name] = pa.array(metrics[name], pa.float64())
    for j, gpu in enumerate(gpus):
        columns[gpu_stall_column(int(gpu))] = pa.array(gpu_stall[:, j], pa.float64())
    meta = {
        "format_version": REPLAY_FORMAT_VERSION,
        "run": run,
        "fetch_align": policy[0],
        "start_align": policy[1],
        "key": key,
        **(provenance or {}),
    }
    if directory is not None and directory != run:  # a model variant (``RUN@MODEL...``)
        meta["directory"] = directory
    table = pa.table(columns)
    return table.replace_schema_metadata({"dsim": json.dumps(meta)})


def write_replay(table: pa.Table, out: str | Path) -> Path:
    meta = replay_metadata(table, Path("<memory>"))
    directory = meta.get("directory", meta["run"])
    path = replay_path(out, directory, (meta["fetch_align"], meta["start_align"]))
    write_parquet(table, path)
    return path


def write_stub(table: pa.Table, out: str | Path) -> Path:
    """The stub of the replay ``table`` (``stub_table``; its schema suffices), where
    ``write_replay`` would write it whole: ``dsim run`` writes a replay it computed once,
    as this stub, after the dataset files that hold its rows are in place (§7.1)."""
    meta = replay_metadata(table, Path("<memory>"))
    directory = meta.get("directory", meta["run"])
    path = replay_path(out, directory, (meta["fetch_align"], meta["start_align"]))
    write_parquet(stub_table(meta), path)
    return path


def replay_metadata(
    table_or_schema: pa.Table | pa.Schema,
    path: Path,
    versions: tuple[int, ...] = READABLE_REPLAY_VERSIONS,
) -> dict[str, Any]:
    """A replay file's ``dsim`` metadata, its ``format_version`` one of ``versions``
    (``InputError`` otherwise: the message a dsim reading only format 1 gives a stub)."""
    schema = table_or_schema if isinstance(table_or_schema, pa.Schema) else table_or_schema.schema
    raw = (schema.metadata or {}).get(b"dsim")
    if raw is None:
        raise InputError("not a dsim replay table (no dsim metadata)", path)
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        meta = None
    if not isinstance(meta, dict):
        raise InputError("not a dsim replay table (unreadable dsim metadata)", path)
    found = meta.get("format_version")
    if isinstance(found, bool) or found not in versions:
        expected = " or ".join(str(v) for v in versions)
        raise InputError(
            f"replay written by another dsim results format ({found}, "
            f"expected {expected}); re-run `dsim run --force`",
            path,
        )
    if found == STUB_FORMAT_VERSION and meta.get("rows") != STUB_ROWS:
        raise InputError(
            "not a dsim replay table (a stub that does not say where its rows are)", path
        )
    return meta


def is_stub(meta: Mapping[str, Any]) -> bool:
    """Whether replay metadata (``replay_metadata``) is a stub's: rows in the dataset."""
    return meta.get("format_version") == STUB_FORMAT_VERSION


def stub_table(meta: Mapping[str, Any]) -> pa.Table:
    """The stub of a replay whose metadata is ``meta``: no column, no row, the same
    metadata (key, run, policy, provenance) with ``format_version`` 2 and where its rows
    are. Key order is kept, so ``replay_meta`` gives back the replay's JSON exactly."""
    stub = {**meta, "format_version": STUB_FORMAT_VERSION, "rows": STUB_ROWS}
    return pa.table({}).replace_schema_metadata({"dsim": json.dumps(stub)})


def replay_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata of the whole replay a stub stands for (format 1, no ``rows``)."""
    whole = {**meta, "format_version": REPLAY_FORMAT_VERSION}
    whole.pop("rows", None)
    return whole


def _location(path: Path) -> tuple[Path, str]:
    """(results directory, run directory name) of a replay file's path."""
    return path.parent.parent, path.parent.name


def _stub_usable(path: Path, meta: Mapping[str, Any]) -> bool:
    """Whether the dataset files beside a stub hold the rows of its key."""
    out, directory = _location(path)
    label = policy_label((meta.get("fetch_align"), meta.get("start_align")))
    return datasetfiles.holds(out, directory, label, str(meta.get("key")))


def _stub_problem(path: Path) -> str:
    """Why a stub's rows cannot be had, and what to do."""
    out, directory = _location(path)
    for table in datasetfiles.TABLES:  # one that is there but cannot be read says so
        held = datasetfiles.dataset_path(out, table, directory)
        try:
            with open(held, "rb"):
                pass
        except FileNotFoundError:
            continue
        except OSError as exc:
            reason = exc.strerror or str(exc)
            return (
                f"its rows are in the dataset file {held}, which cannot be read ({reason}): "
                "check its permissions"
            )
    where = datasetfiles.dataset_path(out, datasetfiles.ITERATIONS, directory)
    return (
        f"its rows are in the dataset files ({where.parent.parent}/*/{where.name}), "
        f"which are missing or were built from other replays: {_RERUN}"
    )


def load_replay(
    path: Path,
    *,
    ranks: tuple[int, ...] = (),
    gpus: bool = True,
    remedy: str,
) -> tuple[pa.Table, dict[str, Any]]:
    """A replay file's table and metadata, whether it holds its rows (format 1) or is a
    stub (format 2: rows from the dataset, metadata given back format 1's), page
    checksums verified (``remedy`` ends the message of a corrupted file). Without
    ``gpus`` only the per-iteration columns are read. ``ranks`` names the ranks of a
    stub whose replay has no row. A stub whose dataset files do not hold its key is an
    ``InputError`` (re-run ``dsim run``); a missing file ``FileNotFoundError``.
    """
    try:
        schema = parquetio.read_schema(path)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise parquetio.unreadable(exc, path, remedy) from exc
    meta = replay_metadata(schema, path)
    if not is_stub(meta):
        columns = None if gpus else ["epoch", "iteration", *METRIC_COLUMNS]
        return parquetio.read_table(path, remedy=remedy, columns=columns), meta
    if not _stub_usable(path, meta):  # ``dsim run`` recomputes it
        raise InputError(_stub_problem(path), path)
    out, directory = _location(path)
    policy = (str(meta["fetch_align"]), str(meta["start_align"]))
    try:
        table = datasetfiles.read_policy(out, directory, policy, ranks, gpus=gpus, remedy=remedy)
    except FileNotFoundError:  # removed since ``holds`` looked
        raise InputError(_stub_problem(path), path) from None
    whole = replay_meta(meta)
    return table.replace_schema_metadata({"dsim": json.dumps(whole)}), whole


def read_replay_key(path: Path) -> str | None:
    """The cache key of a finished replay, or ``None`` if unusable: unreadable, or a stub
    whose dataset files do not hold its rows (then ``dsim run`` recomputes it)."""
    try:
        meta = replay_metadata(parquetio.read_schema(path), path)
    except (OSError, pa.ArrowException, InputError, ValueError):
        return None
    if is_stub(meta) and not _stub_usable(path, meta):
        return None
    return meta.get("key")


def stub_replays(out: str | Path, directory: str, policies: Mapping[str, str]) -> list[Path]:
    """Rewrite as stubs the whole replays of ``directory`` that ``policies`` (label →
    key, ``result.json``'s) lists and whose rows both dataset files now hold: after the
    dataset is in place, the replay files keep only what cache and provenance read.

    A replay of another key, already a stub, or whose rows the dataset lacks is left as
    it is. Each stub replaces its replay atomically, so an interruption leaves every
    file either whole or a usable stub. Returns the stubs written.
    """
    written: list[Path] = []
    for label, key in policies.items():
        path = Path(out) / directory / f"{label}.parquet"
        try:
            meta = replay_metadata(parquetio.read_schema(path), path)
        except (OSError, pa.ArrowException, InputError, ValueError):
            continue
        if is_stub(meta) or meta.get("key") != key:
            continue
        if not datasetfiles.holds(out, directory, label, key):
            continue
        write_parquet(stub_table(meta), path)
        written.append(path)
    return written


def unstub_stale(out: str | Path, directory: str, kept: Mapping[str, str]) -> list[Path]:
    """Before ``directory``'s dataset files are replaced by ones holding only ``kept``
    (label → key): write back whole every stub of a policy they drop, from the dataset
    files still in place, so that a stale replay keeps its numbers and a later ``dsim
    run`` reuses it when the policy comes back (§7.3), as a whole replay always was.

    A stub the dataset in place does not hold is left (it has nothing to keep).
    Returns the replays written back.
    """
    written: list[Path] = []
    for policy, path in _replay_files(Path(out) / directory).items():
        if policy_label(policy) in kept:
            continue
        try:
            meta = replay_metadata(parquetio.read_schema(path), path)
            if not is_stub(meta) or not _stub_usable(path, meta):
                continue
            table, _ = load_replay(path, remedy=_CORRUPT_REMEDY)
        except (OSError, pa.ArrowException, InputError, ValueError):
            continue  # unusable: it would be recomputed anyway
        write_parquet(table, path)
        written.append(path)
    return written


@dataclass
class ResultRun:
    """One run's results directory: its ``result.json`` and the replays it lists.

    ``replays`` and ``keys`` hold the policies ``result.json`` lists (in
    label order), whether or not their files exist; ``stale`` the replay
    files of policies it does not list.
    """

    directory: Path
    info: ResultInfo
    replays: dict[Policy, Path] = field(default_factory=dict)
    keys: dict[Policy, str] = field(default_factory=dict)
    stale: list[Path] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.info.run or self.directory.name

    def _check(self, meta: dict[str, Any], policy: Policy, path: Path) -> None:
        """Refuse a replay whose metadata is not what ``result.json`` lists for it."""
        problems = []
        if meta.get("run") != self.name:
            problems.append(f"it is a replay of run {meta.get('run')!r}, not of {self.name!r}")
        found = (meta.get("fetch_align"), meta.get("start_align"))
        if found != policy:
            problems.append(
                f"it holds policy {found[0]}/{found[1]}, not the {policy[0]}/{policy[1]} "
                "its name says"
            )
        if not problems and meta.get("key") != self.keys[policy]:
            recorded = self.info.document()
            differ = [
                label
                for part, label in _PROVENANCE_PARTS
                if part in meta and part in recorded and meta[part] != recorded[part]
            ]
            what = " and ".join(differ) if differ else "inputs or parameters"
            problems.append(
                f"it was made with other {what} than {RESULT_FILE} lists "
                "(left by another or an interrupted `dsim run`?)"
            )
        if problems:
            raise InputError(f"{'; '.join(problems)}: {_RERUN}", path)

    def verify(self) -> None:
        """Check the provenance of every listed replay (metadata only; for a stub, that
        the dataset files hold its key); ``InputError`` if bad."""
        for policy, path in self.replays.items():
            if not path.is_file():
                raise InputError(
                    f"missing: {RESULT_FILE} lists policy {policy[0]}/{policy[1]} "
                    f"but its replay is not there; {_RERUN}",
                    path,
                )
            try:
                schema = parquetio.read_schema(path)
            except (OSError, pa.ArrowException) as exc:
                raise parquetio.unreadable(exc, path, _CORRUPT_REMEDY) from exc
            meta = replay_metadata(schema, path)
            self._check(meta, policy, path)
            if is_stub(meta) and not _stub_usable(path, meta):
                raise InputError(_stub_problem(path), path)

    def read(self, policy: Policy, *, gpus: bool = True) -> pa.Table:
        """One listed replay, its page checksums and provenance checked: the same table
        whether its file holds the rows or is a stub (rows from the dataset). Without
        ``gpus``, only the per-iteration columns (a summary needs no more)."""
        path = self.replays[policy]
        try:
            schema = parquetio.read_schema(path)
        except FileNotFoundError:
            raise InputError(
                f"missing: {RESULT_FILE} lists it but the file is not there; {_RERUN}", path
            ) from None
        except (OSError, pa.ArrowException) as exc:
            raise parquetio.unreadable(exc, path, _CORRUPT_REMEDY) from exc
        self._check(replay_metadata(schema, path), policy, path)  # before the dataset
        try:
            table, meta = load_replay(
                path, ranks=self.info.ranks, gpus=gpus, remedy=_CORRUPT_REMEDY
            )
        except FileNotFoundError:
            raise InputError(
                f"missing: {RESULT_FILE} lists it but the file is not there; {_RERUN}", path
            ) from None
        self._check(meta, policy, path)
        return table


def stale_trace(run: ResultRun) -> InputError | None:
    """Why ``run``'s replays no longer describe the trace they name (``None`` when they do).

    ``result.json`` records where its trace is (``trace_path``) and which version of it
    was replayed (``trace.digest``); a ``dsim parse`` since has written another version
    there. Only ``run.json`` is read, so checking costs no table read. A trace that is no
    longer there (moved, deleted), or results written before dsim recorded both, cannot be
    checked and pass.
    """
    info = run.info
    replayed = info.trace.version if info.trace is not None else None
    if info.trace_path is None or replayed is None:
        return None
    trace_dir = Path(os.path.normpath(run.directory / info.trace_path))
    try:
        current = RunInfo.load(trace_dir)
    except InputError:
        return None
    if current.version == replayed:
        return None
    return InputError(
        f"results of {run.name} were computed from an older parse of its trace "
        f"{trace_dir}; run `dsim run` again",
        run.directory / RESULT_FILE,
    )


def check_trace_versions(runs: list[ResultRun]) -> None:
    """Refuse (``InputError``, exit 3) the first run whose trace was re-parsed since."""
    for run in runs:
        problem = stale_trace(run)
        if problem is not None:
            raise problem


def write_result_info(
    info: ResultInfo | Mapping[str, Any], out: str | Path, directory: str
) -> Path:
    """``<out>/<directory>/result.json`` (``info.run`` names the run; a variant's directory
    is ``RUN@...``). A mapping of ``result.json`` keys (tests, tools) is written as given,
    with ``format_version`` and ``run`` (default: the directory) first."""
    if isinstance(info, ResultInfo):
        return info.save(Path(out) / directory)
    path = Path(out) / directory / RESULT_FILE
    write_json({"format_version": RESULTS_FORMAT_VERSION, "run": directory, **info}, path)
    return path


def check_results_directory(out: str | Path, directory: str) -> Path:
    """``<out>/<directory>``, checked before ``dsim run`` writes into it.

    It must lie inside ``out`` and not be a link (``run_path``), and a
    ``result.json`` there written by a newer dsim is never rewritten as this
    dsim's older format (``OutputError``: upgrade dsim or choose another ``--out``).
    """
    target = run_path(out, directory)
    if target.exists() and not target.is_dir():
        raise OutputError(
            f"{target} exists and is not a directory; dsim does not replace it: "
            "remove it or choose another --out"
        )
    version = written_version(target / RESULT_FILE)
    if version is not None:
        refuse_newer(version, RESULTS_FORMAT_VERSION, target / RESULT_FILE)
    return target


def _replay_files(directory: Path) -> dict[Policy, Path]:
    """Replay files by the policy their name spells; other files are not dsim's."""
    found: dict[Policy, Path] = {}
    for replay in sorted(directory.glob("*__*.parquet")):
        try:
            found.setdefault(parse_policy_label(replay.stem), replay)
        except UsageError:  # a stray file whose name is not a policy label
            continue
    return found


def _load_result_run(directory: Path) -> ResultRun:
    path = directory / RESULT_FILE
    info = ResultInfo.load(directory)
    listed = info.policies
    keys: dict[Policy, str] = {}
    for label, key in listed.items():
        try:
            keys[parse_policy_label(label)] = key
        except UsageError as exc:
            raise InputError(f"lists {label!r}: {exc}; {_RERUN}", path) from None
    run = ResultRun(directory=directory, info=info)
    for policy in sorted(keys, key=policy_label):
        run.keys[policy] = keys[policy]
        run.replays[policy] = directory / f"{policy_label(policy)}.parquet"
    run.stale = [p for policy, p in _replay_files(directory).items() if policy not in keys]
    return run


@dataclass
class ResultsScan:
    """What ``scan_results`` found: runs with a ``result.json``, and run directories without."""

    runs: list[ResultRun]
    without_result: list[Path] = field(default_factory=list)

    def notes(self, runs: list[ResultRun] | None = None) -> list[str]:
        """One line per directory skipped, and per run (of ``runs``) with stale replays."""
        notes = [
            f"{_shown(d)}: no {RESULT_FILE} (an interrupted `dsim run`?); skipped"
            for d in self.without_result
        ]
        for run in self.runs if runs is None else runs:
            if run.stale:
                notes.append(
                    f"ignored {counted(len(run.stale), 'stale replay')} in "
                    f"{_shown(run.directory)}/ "
                    "not made by its last `dsim run`"
                )
        return notes


def _shown(directory: Path) -> str:
    return os.path.normpath(directory)


def scan_results(paths: list[str | Path]) -> ResultsScan:
    """Every run under the given results directories (or run directories), in name order.

    Raises ``InputError`` naming the path when one holds no usable results.
    """
    runs: dict[Path, ResultRun] = {}
    without: dict[Path, Path] = {}
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise InputError("no such file or directory", path)
        if (path / RESULT_FILE).is_file():
            candidates = [path]
            bare = []
        else:
            candidates = sorted(p.parent for p in path.glob(f"*/{RESULT_FILE}"))
            bare = sorted({p.parent for p in path.glob("*/*__*.parquet")} - set(candidates))
            if _replay_files(path):  # a run directory itself, without its result.json
                raise InputError(
                    f"no {RESULT_FILE} here (an interrupted `dsim run`?); {_RERUN}", path
                )
        for directory in bare:
            without.setdefault(directory.resolve(), directory)
        if not candidates:
            detail = (
                f"; {', '.join(_shown(d) + '/' for d in bare)} hold(s) replays "
                "but no result.json (an interrupted `dsim run`?)"
                if bare
                else "; produce them with `dsim run`"
            )
            raise InputError(f"no dsim results here (no */{RESULT_FILE}{detail})", path)
        for directory in candidates:
            runs.setdefault(directory.resolve(), _load_result_run(directory))
    ordered = sorted(runs.values(), key=lambda r: (r.name, str(r.directory)))
    return ResultsScan(ordered, sorted(without.values()))


def results_directories(paths: list[str | Path]) -> list[Path]:
    """The results directories (the ones ``dsim run`` locks) that ``paths`` name or lie in."""
    return [Path(p).parent if (Path(p) / RESULT_FILE).is_file() else Path(p) for p in paths]


def find_result_runs(paths: list[str | Path]) -> list[ResultRun]:
    """The runs of ``scan_results`` (for callers that print no notes)."""
    return scan_results(paths).runs
