"""``sim_conf.json`` (docs/SPEC.md §6): what ``dsim run`` replays, checked before any work.

A config names runs (``FILE``: names or globs under the traces directory) and
the policies to replay (``FETCH_ALIGN`` x ``START_ALIGN``), plus optional
lower-case settings. Validation collects *every* problem and raises one
``UsageError`` listing them all, so a user fixes a config in one edit instead
of one error per attempt. Nothing is read beyond the config itself and each
run's ``run.json``, so a bad config fails in milliseconds and writes nothing.

Precedence: command-line options > config keys > defaults. Paths written in
the config are relative to the config file; paths given on the command line
(and the defaults ``./traces`` and ``./results``) are relative to the
working directory.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsim.errors import InputError, UsageError
from dsim.execute.address import ENV_VAR, FROM_CONFIG, FROM_ENV, FROM_OPTION, parse_ray_address
from dsim.io.names import RULE as NAME_RULE
from dsim.io.names import name_problem
from dsim.model.runinfo import RUN_FILE, RunInfo, json_problem
from dsim.model.selection import resolve_epochs
from dsim.model.tables import TRAIN_FILE, read_info
from dsim.replay.models import DEFAULT_MODEL, MODELS
from dsim.replay.params import (
    DEFAULT_STALL_FLOOR_S,
    DEFAULT_STALL_GROW_MIN_S,
    MAX_LOADER_SETTING,
    STALL_FLOOR_RANGE_S,
    STALL_GROW_MIN_RANGE_S,
)
from dsim.replay.policies import (
    ACTUAL,
    BASELINE,
    DEFAULT,
    Policy,
    is_stall_alignment,
    normalize_policy,
    policy_pairs,
)
from dsim.words import counted

DEFAULT_TRACES = Path("traces")
DEFAULT_OUT = Path("results")
EXECUTORS = ("auto", "local", "ray")

#: Keys the original analysis used; accepted so its configs run unchanged, and ignored:
#: none of them changes what dsim's models replay.
LEGACY_KEYS = frozenset({"IOFILE", "PADDING_TIME", "PREFETCH_DELAY"})
#: Keys of the original analysis's dependency replay that would change its numbers: ignoring
#: them would report a replay the user did not ask for, so they are rejected, each with why.
REJECTED_KEYS = {
    "TRAINING_TIME": (
        "the original simulator's constant training time) is not supported: dsim replays "
        "the measured training times; remove the key"
    ),
    "FETCH_DELAY": (
        "the original simulator's fixed gap between a worker's fetches) is not supported: "
        "dsim replays the measured fetch starts, and the pipeline model calibrates the gaps "
        "from the run; remove the key"
    ),
}
KNOWN_KEYS = frozenset(
    {
        "FILE",
        "FETCH_ALIGN",
        "START_ALIGN",
        "traces",
        "out",
        "epochs",
        "warmup",
        "effective_delay_threshold_s",
        "stall_floor_s",
        "stall_grow_min_s",
        "executor",
        "num_cpus",
        "ray_address",
        "model",
        "workers",
        "prefetch_factor",
        "WORKER_NUM",
        "PREFETCH_FACTOR",
        "mlflow",
    }
)
#: The original analysis's names of the loader settings: the same meaning as dsim's keys.
LOADER_KEY_ALIASES = {"workers": "WORKER_NUM", "prefetch_factor": "PREFETCH_FACTOR"}


@dataclass(frozen=True)
class Overrides:
    """Settings given on the command line; ``None`` means "not given"."""

    runs: tuple[str, ...] = ()
    traces: Path | None = None
    out: Path | None = None
    epochs: list[int] | str | None = None
    warmup: int | None = None
    threshold_s: float | None = None
    executor: str | None = None
    num_cpus: int | None = None
    ray_address: str | None = None
    model: str | None = None
    workers: int | None = None
    prefetch_factor: int | None = None
    policies: tuple[Policy, ...] = ()
    mlflow: bool | None = None  # --mlflow / --no-mlflow


#: Keys of the config's ``mlflow`` object.
MLFLOW_KEYS = ("tracking_uri", "experiment")


@dataclass(frozen=True)
class MlflowSettings:
    """Where ``--mlflow`` logs; ``None`` fields fall back at logging time
    (``MLFLOW_TRACKING_URI`` / ``MLFLOW_EXPERIMENT_NAME``, else dsim's defaults:
    ``dsim.app.tracking``)."""

    tracking_uri: str | None = None
    experiment: str | None = None


@dataclass(frozen=True)
class SimConfig:
    """A validated config: every run exists, every policy and epoch is known.

    ``epochs`` is a list of epoch numbers, ``"all"``, or ``None`` for the
    summary's default; ``warmup``/``threshold_s`` are ``None`` for the
    summary's defaults. ``policies`` always includes ``actual/actual``,
    because the what-if columns compare against it.
    """

    runs: tuple[str, ...]
    run_dirs: tuple[Path, ...]
    policies: tuple[Policy, ...]
    traces: Path
    out: Path
    epochs: list[int] | str | None = None
    warmup: int | None = None
    threshold_s: float | None = None
    stall_floor_s: float = DEFAULT_STALL_FLOOR_S
    stall_grow_min_s: float = DEFAULT_STALL_GROW_MIN_S
    executor: str = "auto"
    num_cpus: int | None = None
    ray_address: str | None = None
    model: str = DEFAULT_MODEL
    workers: int | None = None
    prefetch_factor: int | None = None
    source: Path | None = None
    #: Whether the policies were asked for (``-p``, ``FETCH_ALIGN``/``START_ALIGN``) or defaulted:
    #: a run without fetch records replays the stall-only defaults instead of defaulted ones.
    policies_explicit: bool = False
    mlflow: MlflowSettings | None = None  # None: no MLflow logging
    run_infos: dict[str, RunInfo] = field(default_factory=dict, compare=False)


#: Largest config file read (bytes): a config is a few lines; ``--conf /dev/zero`` or a log
#: given by mistake fails at once instead of filling memory.
MAX_CONFIG_BYTES = 1024 * 1024
#: Deepest nesting of arrays and objects in a config (a real one nests 2 deep); checked before
#: parsing, so that a config nested 100,000 deep is an error, not a ``RecursionError``.
MAX_CONFIG_DEPTH = 32
#: Accepted ranges of the integer settings (inclusive); ``num_cpus``'s top is per machine.
WORKERS_RANGE = (0, MAX_LOADER_SETTING)
PREFETCH_RANGE = (1, MAX_LOADER_SETTING)
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")


def max_num_cpus() -> int:
    """The largest ``num_cpus`` accepted on this machine: what the embedded Ray can start.

    One bound for the file, the flag and the Ray start-up (``dsim.execute.ray_connect``).
    """
    from dsim.execute.ray_connect import max_embedded_cpus

    return max_embedded_cpus()


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's keys, refused when one repeats (``json`` would keep the last silently)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _DuplicateKey(key)
        found[key] = value
    return found


def _depth(data: bytes) -> int:
    """How deeply arrays and objects nest in JSON text (strings skipped), without parsing it."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub(b'""', data)):
        depth += 1 if bracket in (b"[", b"{") else -1
        deepest = max(deepest, depth)
    return deepest


def read_config_file(path: Path) -> dict[str, Any]:
    """The config's JSON object: at most ``MAX_CONFIG_BYTES``, ``MAX_CONFIG_DEPTH`` deep,
    no key twice in one object; anything else a one-line ``UsageError`` naming the file."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise UsageError(
            f"config {path} is larger than {MAX_CONFIG_BYTES // 1024} KiB: not a dsim config"
        )
    if _depth(data) > MAX_CONFIG_DEPTH:
        raise UsageError(
            f"config {path} nests arrays or objects more than {MAX_CONFIG_DEPTH} deep: "
            "not a dsim config"
        )
    try:
        raw = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read config {path}: not UTF-8 text ({exc.reason})") from exc
    except _DuplicateKey as exc:
        raise UsageError(
            f"config {path} gives key {exc.args[0]!r} twice in one object: keep one"
        ) from None
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"config {path} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from exc
    except ValueError as exc:  # an integer past Python's limit on digits (4300)
        raise UsageError(f"config {path} holds {json_problem(exc)}: not a dsim config") from None
    except RecursionError:  # the depth check makes this unreachable; kept as a last guard
        raise UsageError(f"config {path} nests too deeply: not a dsim config") from None
    if not isinstance(raw, dict):
        raise UsageError(f"config {path} must be a JSON object, got {type(raw).__name__}")
    return raw


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)  # type: ignore[arg-type]


class _Problems:
    """Collects validation problems so they are all reported together."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, message: str) -> None:
        self.items.append(message)

    def raise_if_any(self, where: str) -> None:
        if self.items:
            count = len(self.items)
            noun = "problem" if count == 1 else "problems"
            raise UsageError(f"{where}: {count} {noun}: " + "; ".join(self.items))


def _number(
    raw: dict[str, Any], key: str, problems: _Problems, bounds: tuple[float, float] | None = None
) -> float | None:
    """A number of seconds >= 0 (and within ``bounds``, inclusive, when given)."""
    if key not in raw:
        return None
    value = raw[key]
    if not _is_number(value) or value < 0:
        problems.add(f"{key} must be a non-negative number of seconds, got {value!r}")
        return None
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        problems.add(f"{key} must be between {bounds[0]:g} and {bounds[1]:g} s, got {value!r}")
        return None
    return float(value)


def _names(raw: dict[str, Any], problems: _Problems) -> list[str]:
    if "FILE" not in raw:
        problems.add('FILE is missing (a run name or a list of them, e.g. "FILE": "myrun")')
        return []
    value = raw["FILE"]
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, str) and v.strip() for v in value)
    ):
        problems.add(f"FILE must be a run name or a non-empty list of run names, got {value!r}")
        return []
    return [v.strip() for v in value]


def _policies(raw: dict[str, Any], problems: _Problems) -> list[Policy]:
    sides: list[list[object]] = []
    for key in ("FETCH_ALIGN", "START_ALIGN"):
        value = raw.get(key, list(DEFAULT))
        if not isinstance(value, list) or not value:
            problems.add(f'{key} must be a non-empty list such as [false, "avg", "min"]')
            sides.append([])
            continue
        good = []
        for item in value:
            try:
                good.append(normalize_policy(item))
            except UsageError as exc:
                problems.add(f"{key}: {exc}")
        sides.append(good)
    try:
        pairs = policy_pairs(sides[0], sides[1])
    except UsageError as exc:  # a side's alignment on the other side: said as the config's
        problems.add(f"FETCH_ALIGN/START_ALIGN: {exc}")
        return []
    stall = [name for name in sides[0] if is_stall_alignment(name)]
    if stall and ACTUAL not in sides[1]:  # it pairs with start actual only: never replayed
        problems.add(
            f"FETCH_ALIGN {stall[0]} replaces stalls and pairs only with start actual, which "
            "START_ALIGN does not list: add false (actual) to START_ALIGN"
        )
    return list(dict.fromkeys([*pairs, BASELINE])) if pairs else []


def _epochs(value: object, problems: _Problems, what: str) -> list[int] | str | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "all":
        return "all"
    if _is_int(value):
        value = [value]
    if isinstance(value, list) and value and all(_is_int(v) for v in value):
        return sorted(set(value))  # type: ignore[arg-type]
    problems.add(f'{what} must be a list of epoch numbers or "all", got {value!r}')
    return None


def nothing_to_run(traces: Path, command: str) -> str:
    """The message for a command given no run: with the runs ``traces`` holds, the command
    to type. Why: ``dsim run --traces DIR`` alone said only "give --conf or run names",
    leaving the user to look up the parsed run's long name."""
    names = available_runs(Path(traces))
    conf = " --conf sim_conf.json or" if command == "run" else ""
    head = f"nothing to run: give{conf} run names (dsim {command} RUN)"
    if not names:
        return head
    flag = "" if Path(traces) == DEFAULT_TRACES else f" --traces {shlex.quote(str(traces))}"
    first = shlex.quote(names[0])  # the command as a shell takes it: a name may hold spaces
    if len(names) == 1:
        return f"{head}; {traces} holds one parsed run: dsim {command}{flag} {first}"
    listed = f"{head}; {traces} holds {len(names)} parsed runs ({_listing(names)})"
    return f"{listed}: dsim {command}{flag} '*' takes them all"


def available_runs(traces: Path) -> list[str]:
    """Names of the parsed runs under a traces directory (sub-directories holding run.json)."""
    if not traces.is_dir():
        return []
    return sorted(p.parent.name for p in traces.glob(f"*/{RUN_FILE}"))


def _under(pattern: str, traces: Path) -> str | None:
    """The run name in a run given as a path to its directory in ``traces`` (what a shell's
    tab completion or glob hands over: ``traces/myrun``, ``./traces/myrun/``), or ``None``
    for a path whose directory is not ``traces``. Why: the path names the same run, and
    refusing it, once per run of an expanded glob, read as 20 problems for one mistake."""
    path = Path(pattern)
    return path.name if path.name and _same_directory(path.parent, traces) else None


def _inside_a_parsed_run(out: Path) -> Path | None:
    """The parsed run directory (``run.json`` beside its training table) that ``out`` is
    or lies in."""
    try:
        here = out.resolve()
    except (OSError, RuntimeError):
        return None
    for directory in (here, *here.parents):
        try:
            if (directory / RUN_FILE).is_file() and (directory / TRAIN_FILE).is_file():
                return directory
        except OSError:
            return None
    return None


#: How many run names a "not found" problem lists: a traces directory of a thousand runs
#: made one line of a thousand names.
_LISTED_RUNS = 12


def _listing(names: list[str]) -> str:
    """``names`` for a message: the first ``_LISTED_RUNS``, then how many more."""
    shown = ", ".join(names[:_LISTED_RUNS])
    more = len(names) - _LISTED_RUNS
    return f"{shown} and {more} more" if more > 0 else shown


def _guess(available: list[str]):
    """A missing run as the message shows it: with the closest available names, if any
    (two at most, in name order when equally close: ``resnet_7`` is as close to
    ``resnet_07`` as to ``resnet_17``)."""

    def shown(missing: str) -> str:
        name = Path(missing).name
        close = difflib.get_close_matches(name, available, n=3, cutoff=0.8)
        score = {c: difflib.SequenceMatcher(None, name, c).ratio() for c in close}
        best = sorted(c for c in close if score[c] == max(score.values()))[:2]
        return f"{missing} (did you mean {' or '.join(best)}?)" if best else missing

    return shown


def _same_directory(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one directory (through links and ``..``)."""
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):  # a link loop: not a directory dsim can use anyway
        return False


def _raise_unreadable(unreadable: list[InputError]) -> None:
    """A parsed run whose ``run.json`` cannot be read is bad input (exit 3), not a bad
    command line: it is raised after the command line's and config's own problems."""
    if len(unreadable) == 1:
        raise unreadable[0]
    if unreadable:
        raise InputError(
            f"{len(unreadable)} parsed runs cannot be read: "
            + "; ".join(str(exc) for exc in unreadable)
        )


def _resolve_runs(patterns: list[str], traces: Path, problems: _Problems) -> list[str]:
    available = available_runs(traces)
    found: list[str] = []
    missing: list[str] = []
    elsewhere: list[str] = []
    for given in patterns:
        pattern = given
        if "/" in given or os.sep in given:
            pattern = _under(given, traces) or ""
            if not pattern and _same_directory(Path(given), traces):
                problems.add(
                    f"run {given!r} is the traces directory itself: name its runs, or all "
                    f"of them with the glob '*'"
                )
                continue
            if not pattern:
                elsewhere.append(given)
                continue
        if pattern in available:  # a run named a[1] or a*b is itself, not a glob
            matches = [pattern]
        elif any(ch in pattern for ch in "*?["):
            matches = fnmatch.filter(available, pattern)
        else:
            problem = name_problem(pattern)  # a run name is one directory name (§1.1)
            if problem is not None:
                problems.add(f"run {pattern!r} is not a valid run name ({problem}; {NAME_RULE})")
                continue
            matches = [pattern] if pattern in available else []
        for name in matches:
            problem = name_problem(name)  # a directory made by hand under traces
            if problem is not None:
                problems.add(f"run {name!r} in {traces} is not a valid run name ({problem})")
        matches = [name for name in matches if name_problem(name) is None]
        if matches:
            found.extend(matches)
        else:
            missing.append(given)
    if elsewhere:
        shown = ", ".join(repr(p) for p in elsewhere[:3]) + (
            f" and {len(elsewhere) - 3} more" if len(elsewhere) > 3 else ""
        )
        first = Path(elsewhere[0])
        example = f", e.g. --traces {first.parent} {first.name}" if first.name else ""
        problems.add(
            f"run(s) {shown} given as paths outside the traces directory {traces}: runs are "
            f"named under it; name the directory that holds them with --traces (or the "
            f"config's traces){example}"
        )
    if missing:
        if traces.exists() and not traces.is_dir():
            hint = (
                f"traces directory {traces} is a file, not a directory (the --out of `dsim parse`)"
            )
        elif not traces.is_dir():
            hint = f"traces directory {traces} does not exist (run `dsim parse` or set traces)"
        elif available:
            hint = f"available in {traces}: {_listing(available)}"
        else:
            hint = f"no parsed runs in {traces} (run `dsim parse` first)"
        problems.add(f"run(s) not found: {', '.join(map(_guess(available), missing))}; {hint}")
    return list(dict.fromkeys(found))


def resolve_run_names(patterns: list[str], traces: Path, where: str) -> list[str]:
    """The parsed runs under ``traces`` that ``patterns`` name (names, globs such as
    ``'*'``, or paths to run directories in ``traces``), in the order given, each once, as
    ``dsim run`` resolves them; ``UsageError`` listing every problem (a name not found,
    with the closest ones; a path outside ``traces``) under ``where``.

    Why shared: ``dsim tune '*'`` read its argument as one run's name and refused it where
    ``dsim run '*'`` took every run; a command that names runs takes them the same way."""
    problems = _Problems()
    runs = _resolve_runs(patterns, traces, problems)
    problems.raise_if_any(where)
    return runs


def resolve_run_directories(runs: list[str], traces: Path, where: str) -> list[Path]:
    """The run directories ``runs`` name, in the order given, each once: a directory
    holding ``run.json`` anywhere is itself; anything else is a name, a glob (``'*'``) or a
    path under ``traces``, resolved as ``dsim run`` resolves them
    (``resolve_run_names``: every problem reported at once under ``where``, before any
    work).

    Why here and not in the application: a mistyped run is reported before the
    command loads pandas (~0.3 s)."""

    def direct(run: str) -> bool:
        return (Path(run) / RUN_FILE).is_file()

    named = [run for run in runs if not direct(run)]
    if named:
        resolve_run_names(named, traces, where)  # all problems together
    found: list[Path] = []
    for run in runs:
        if direct(run):
            found.append(Path(run))
        else:
            found.extend(traces / name for name in resolve_run_names([run], traces, where))
    return list(dict.fromkeys(found))


def _check_epochs(
    epochs: list[int] | str | None,
    run_infos: dict[str, RunInfo],
    problems: _Problems,
) -> None:
    if not isinstance(epochs, list):
        return
    for name, info in run_infos.items():
        try:
            resolve_epochs(list(info.epochs_present), epochs, run=name)
        except UsageError as exc:
            problems.add(str(exc))


def _model(overrides: Overrides, raw: dict[str, Any], problems: _Problems) -> str:
    """The replay model (``--model`` > config ``model`` > the default), by registered name."""
    value = overrides.model if overrides.model is not None else raw.get("model", DEFAULT_MODEL)
    if not isinstance(value, str):  # a list or object: no model's name (and unhashable)
        problems.add(
            f"model must be a replay model's name, got {value!r}; known models: {', '.join(MODELS)}"
        )
        return DEFAULT_MODEL
    if value not in MODELS:
        problems.add(f"unknown replay model {value!r}; known models: {', '.join(MODELS)}")
        return DEFAULT_MODEL
    return str(value)


def _loader_setting(
    key: str, override: int | None, raw: dict[str, Any], model: str, problems: _Problems
) -> int | None:
    """A loader what-if (``--workers``/``--prefetch-factor``, or its config key or alias).

    Only models that replay the loader read it: given on the command line to
    another model it is an error (the user expects an effect); in a config
    (the original analysis's ``WORKER_NUM`` in particular) it is ignored.
    """
    alias = LOADER_KEY_ALIASES[key]
    flag = "--" + key.replace("_", "-")
    if override is not None:
        value: Any = override
        where = flag
    elif key in raw or alias in raw:
        if key in raw and alias in raw and raw[key] != raw[alias]:
            problems.add(f"{key} and {alias} disagree ({raw[key]!r} vs {raw[alias]!r})")
            return None
        where = key if key in raw else alias
        value = raw[where]
    else:
        return None
    lowest, highest = WORKERS_RANGE if key == "workers" else PREFETCH_RANGE
    if not _is_int(value) or not lowest <= value <= highest:
        problems.add(f"{where} must be an integer from {lowest} to {highest}, got {value!r}")
        return None
    if not MODELS[model].uses_loader:
        if override is not None:
            problems.add(f"{flag} is a what-if of the pipeline model: add --model pipeline")
        return None
    return int(value)


def _ray_address(
    overrides: Overrides, raw: dict[str, Any], executor: object, problems: _Problems
) -> str | None:
    """The configured cluster address, its form checked here so that a typo fails before any work.

    ``RAY_ADDRESS`` is checked too when it will be used: no address is
    configured and the executor may be Ray. Whether a cluster answers there
    is checked when Ray is started (``dsim.execute.ray_connect``).
    """
    if overrides.ray_address:
        value: object = overrides.ray_address
        source = FROM_OPTION
    else:
        value = raw.get("ray_address")
        source = FROM_CONFIG
    if value is not None and (not isinstance(value, str) or not value):
        problems.add(f"ray_address must be a string such as 127.0.0.1:6379, got {value!r}")
        return None
    if value is None and executor != "local":
        value = os.environ.get(ENV_VAR) or None
        source = FROM_ENV
    if value is None:
        return None
    try:
        parse_ray_address(str(value), source)
    except UsageError as exc:
        problems.add(str(exc))
        return None
    # RAY_ADDRESS is not stored: it is read again where Ray is started.
    return None if source == FROM_ENV else str(value)


def _mlflow(
    overrides: Overrides, raw: dict[str, Any], problems: _Problems
) -> MlflowSettings | None:
    """MLflow logging: ``--mlflow``/``--no-mlflow`` > config ``mlflow`` (true, false, or an
    object with ``tracking_uri`` and ``experiment``) > off."""
    value = raw.get("mlflow", False)
    settings: MlflowSettings | None = None
    if isinstance(value, bool):
        settings = MlflowSettings() if value else None
    elif isinstance(value, dict):
        fields: dict[str, str] = {}
        for key, item in value.items():
            if key not in MLFLOW_KEYS:
                problems.add(f"mlflow: unknown key {key!r} (known: {', '.join(MLFLOW_KEYS)})")
            elif not isinstance(item, str) or not item.strip():
                problems.add(f"mlflow.{key} must be a non-empty string, got {item!r}")
            else:
                fields[key] = item.strip()
        settings = MlflowSettings(**fields)
    else:
        problems.add(
            'mlflow must be true, false or an object such as {"tracking_uri": '
            f'"sqlite:///mlflow.db", "experiment": "dsim"}}, got {value!r}'
        )
    if overrides.mlflow is None:
        return settings
    return (settings or MlflowSettings()) if overrides.mlflow else None


def validate_config(
    raw: dict[str, Any],
    *,
    base: Path,
    overrides: Overrides | None = None,
    source: Path | None = None,
) -> SimConfig:
    """Check a config dict against docs/SPEC.md §6 and the traces it names.

    ``base`` is the directory config paths are relative to. Raises one
    ``UsageError`` listing every problem found.
    """
    overrides = overrides or Overrides()
    problems = _Problems()

    for key in raw:
        if key in KNOWN_KEYS or key in LEGACY_KEYS:
            continue
        if key in REJECTED_KEYS:
            problems.add(f"{key} ({REJECTED_KEYS[key]}")
            continue
        spelled = {k.lower(): k for k in KNOWN_KEYS | LEGACY_KEYS}
        close = difflib.get_close_matches(str(key).lower(), sorted(spelled), n=1)
        hint = f" (did you mean {spelled[close[0]]}?)" if close else ""
        problems.add(f"unknown key {key!r}{hint}")

    names = list(overrides.runs) if overrides.runs else _names(raw, problems)
    if overrides.policies:
        policies = list(dict.fromkeys([*overrides.policies, BASELINE]))
    else:
        policies = _policies(raw, problems)
    model = _model(overrides, raw, problems)
    workers = _loader_setting("workers", overrides.workers, raw, model, problems)
    prefetch = _loader_setting("prefetch_factor", overrides.prefetch_factor, raw, model, problems)

    paths: dict[str, Path] = {}
    for key, override, default in (
        ("traces", overrides.traces, DEFAULT_TRACES),
        ("out", overrides.out, DEFAULT_OUT),
    ):
        value = raw.get(key)
        if override is not None:
            paths[key] = Path(override)
        elif value is None:
            paths[key] = default
        elif isinstance(value, str) and value:
            paths[key] = base / Path(value).expanduser()
        else:
            problems.add(f"{key} must be a path string, got {value!r}")
            paths[key] = default
    if _same_directory(paths["traces"], paths["out"]):
        # the results' run directories would be the parsed runs' own, and the next
        # `dsim parse` into that directory would replace them, results and all
        problems.add(
            f"the results directory {paths['out']} is the traces directory: "
            "choose another --out (results/ by default)"
        )
    elif (inside := _inside_a_parsed_run(paths["out"])) is not None:
        # the next `dsim parse` of that run replaces its directory, results and all
        problems.add(
            f"the results directory {paths['out']} is inside the parsed run {inside}, "
            "which the next `dsim parse` of it replaces whole: choose another --out "
            "(results/ by default)"
        )

    if overrides.epochs is not None:
        epochs = overrides.epochs
    else:
        epochs = _epochs(raw.get("epochs"), problems, "epochs")

    warmup = overrides.warmup
    if warmup is None and "warmup" in raw:
        value = raw["warmup"]
        if _is_int(value) and value >= 0:
            warmup = value
        else:
            problems.add(f"warmup must be a non-negative integer (iterations), got {value!r}")
    if warmup is not None and warmup < 0:
        problems.add(f"warmup must be a non-negative integer, got {warmup}")

    threshold = overrides.threshold_s
    if threshold is None:
        threshold = _number(raw, "effective_delay_threshold_s", problems)
    elif not math.isfinite(threshold) or threshold < 0:
        problems.add(f"threshold must be a non-negative number of seconds, got {threshold}")
    stall_floor = _number(raw, "stall_floor_s", problems, STALL_FLOOR_RANGE_S)
    grow_min = _number(raw, "stall_grow_min_s", problems, STALL_GROW_MIN_RANGE_S)

    executor = overrides.executor or raw.get("executor", "auto")
    # the config's own value is checked even where --executor overrides it: a typo there
    # would otherwise surface only on the next run without the option
    overridden = [raw["executor"]] if overrides.executor and "executor" in raw else []
    for value in [executor, *overridden]:
        if not isinstance(value, str) or value not in EXECUTORS:
            problems.add(f"executor must be one of {', '.join(EXECUTORS)}, got {value!r}")
    num_cpus = overrides.num_cpus
    if num_cpus is None and "num_cpus" in raw:
        num_cpus = raw["num_cpus"]
        if not _is_int(num_cpus):
            problems.add(f"num_cpus must be a positive integer, got {num_cpus!r}")
            num_cpus = None
    if num_cpus is not None and not 1 <= num_cpus <= max_num_cpus():
        where = "--num-cpus" if overrides.num_cpus is not None else "num_cpus"
        problems.add(
            f"{where} must be an integer from 1 to {max_num_cpus()} (16 per core, at least 64, "
            f"on this machine's {counted(os.cpu_count() or 1, 'CPU')}), got {num_cpus!r}"
        )
        num_cpus = None
    ray_address = _ray_address(overrides, raw, executor, problems)
    mlflow = _mlflow(overrides, raw, problems)

    runs = _resolve_runs(names, paths["traces"], problems) if names else []
    run_infos: dict[str, RunInfo] = {}
    unreadable: list[InputError] = []
    for name in runs:
        try:
            run_infos[name] = read_info(paths["traces"] / name)
        except InputError as exc:
            unreadable.append(exc)
    _check_epochs(epochs, run_infos, problems)

    where = f"invalid config {source}" if source is not None else "invalid run settings"
    problems.raise_if_any(where)
    _raise_unreadable(unreadable)
    return SimConfig(
        runs=tuple(runs),
        run_dirs=tuple(paths["traces"] / name for name in runs),
        policies=tuple(policies),
        traces=paths["traces"],
        out=paths["out"],
        epochs=epochs,
        warmup=warmup,
        threshold_s=threshold,
        stall_floor_s=DEFAULT_STALL_FLOOR_S if stall_floor is None else stall_floor,
        stall_grow_min_s=DEFAULT_STALL_GROW_MIN_S if grow_min is None else grow_min,
        executor=str(executor),
        policies_explicit=bool(overrides.policies) or "FETCH_ALIGN" in raw or "START_ALIGN" in raw,
        num_cpus=num_cpus,
        ray_address=ray_address,
        model=model,
        workers=workers,
        prefetch_factor=prefetch,
        source=source,
        mlflow=mlflow,
        run_infos=run_infos,
    )


def load_config(path: Path | None, overrides: Overrides | None = None) -> SimConfig:
    """Read and validate ``sim_conf.json``; without one, the command line must name the runs."""
    overrides = overrides or Overrides()
    if path is None:
        if not overrides.runs:
            raise UsageError(nothing_to_run(overrides.traces or DEFAULT_TRACES, "run"))
        return validate_config({}, base=Path.cwd(), overrides=overrides)
    raw = read_config_file(path)
    return validate_config(raw, base=path.parent, overrides=overrides, source=path)
