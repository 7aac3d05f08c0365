"""``result.json``, typed: what the last ``dsim run`` of a run made (docs/SPEC.md §7.1).

The JSON document is what dsim has always written, byte for byte; in Python
every field has one meaning and one name:

* ``gpus`` (JSON) is here the *list of ranks* replayed: ``ResultInfo.ranks``
  (``run.json``'s ``gpus`` is a count; ``ResultInfo.trace.gpu_count``);
* ``summary`` (JSON) is the selection the summary used: ``ResultInfo.selection``,
  whose ``epochs`` are the *selected* epochs (``trace.epochs_present`` are
  the epochs the tables hold).

``ResultInfo`` loads, saves and version-checks itself; keys it does not know
are kept (``extra``) and written back after the known ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsim.errors import InputError
from dsim.io.atomic import write_json
from dsim.model.runinfo import FORMAT_VERSION as RUN_FORMAT_VERSION
from dsim.model.runinfo import RunInfo, check_version, json_problem

#: ``result.json``'s format. 2: the replay files of a run may be stubs whose rows are in
#: the tidy dataset (§7.1), so a dsim that knows only 1 must refuse such a directory
#: rather than read or rewrite it. Version 1 documents (every result written before)
#: still read.
RESULTS_FORMAT_VERSION = 2
OLDEST_RESULTS_FORMAT_VERSION = 1
#: The results format version the cache keys hash (§7.2): 1 while the numbers a key
#: names are computed and laid out as in format 1, so that the stubs of format 2 cost no
#: recomputation of replays written before.
KEY_FORMAT_VERSION = 1
RESULT_FILE = "result.json"

# Known keys in the order ``dsim run`` has always written them.
_KEYS = (
    "format_version",
    "run",
    "model",
    "input",
    "trace",
    "summary",
    "params",
    "loader",
    "batch",
    "dropped",
    "iterations",
    "gpus",
    "policies",
    "trace_path",
)


@dataclass(frozen=True)
class Selection:
    """The iterations a summary uses (§5): ``epochs`` selected, ``warmup``, ``threshold_s``.

    ``dsim run`` records all three; ``None`` is a value a hand-written
    ``result.json`` left out (the summary's default applies).
    """

    epochs: tuple[int, ...] | None
    warmup: int | None
    threshold_s: float | None

    def document(self) -> dict[str, Any]:
        values = {
            "epochs": None if self.epochs is None else list(self.epochs),
            "warmup": self.warmup,
            "threshold_s": self.threshold_s,
        }
        return {k: v for k, v in values.items() if v is not None}

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> Selection:
        epochs = document.get("epochs")
        return cls(
            epochs=None if epochs is None else tuple(int(e) for e in epochs),
            warmup=document.get("warmup"),
            threshold_s=document.get("threshold_s"),
        )


@dataclass(frozen=True)
class ResultInfo:
    """One run directory's ``result.json`` under a results directory.

    ``run`` names the run (a model variant's directory is ``RUN@...``);
    ``input``, ``params`` and ``model`` are the provenance its replays'
    cache keys hash (§7.2); ``policies`` maps ``fetch__start`` to the key of
    the replay the last ``dsim run`` made; ``loader`` is the pipeline model's
    measured and assumed loader settings (``None`` for other models).
    """

    run: str
    model: str
    input: Mapping[str, Any]
    trace: RunInfo | None
    selection: Selection | None
    params: Mapping[str, Any]
    dropped: Mapping[str, int]
    iterations: int
    ranks: tuple[int, ...]
    policies: Mapping[str, str]
    loader: Mapping[str, Any] | None = None
    batch: Mapping[str, Any] | None = None  # per-rank batch size and its source (throughput)
    # the trace replayed, relative to this file's directory: readers check that it is still
    # the version ``trace`` records (``trace.version``), SPEC §7.3
    trace_path: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = RESULTS_FORMAT_VERSION

    @property
    def gpu_count(self) -> int:
        """Ranks replayed (the trace's count when it has one)."""
        return self.trace.gpu_count if self.trace is not None else len(self.ranks)

    def document(self) -> dict[str, Any]:
        """The JSON document, key for key what ``dsim run`` writes."""
        values = {
            "format_version": self.format_version,
            "run": self.run,
            "model": self.model,
            "input": dict(self.input),
            "trace": None if self.trace is None else self.trace.document(),
            "summary": None if self.selection is None else self.selection.document(),
            "params": dict(self.params),
            "loader": None if self.loader is None else dict(self.loader),
            "batch": None if self.batch is None else dict(self.batch),
            "dropped": dict(self.dropped),
            "iterations": self.iterations,
            "gpus": list(self.ranks),
            "policies": dict(self.policies),
            "trace_path": self.trace_path,
        }
        optional = {"trace", "summary", "loader", "batch", "trace_path"}
        doc = {k: values[k] for k in _KEYS if not (k in optional and values[k] is None)}
        doc.update({k: v for k, v in self.extra.items() if k not in doc})
        return doc

    @classmethod
    def from_document(cls, document: Any, path: Path | None = None) -> ResultInfo:
        """A ``result.json`` document, version-checked; ``InputError`` naming ``path`` if bad."""
        check_version(
            document,
            RESULTS_FORMAT_VERSION,
            path,
            "result description",
            "re-run `dsim run --force`",
            oldest=OLDEST_RESULTS_FORMAT_VERSION,
        )
        policies = document.get("policies")
        if not isinstance(policies, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in policies.items()
        ):
            raise InputError(
                "does not list its replays (no 'policies'); re-run `dsim run` for this run", path
            )
        try:
            trace = document.get("trace")
            selection = document.get("summary")
            loader = document.get("loader")
            batch = document.get("batch")
            return cls(
                run=str(document.get("run", path.parent.name if path else "")),
                model=str(document.get("model", "per-iteration")),
                input=dict(document.get("input") or {}),
                trace=(
                    RunInfo.from_document({"format_version": RUN_FORMAT_VERSION, **trace}, path)
                    if isinstance(trace, Mapping)
                    else None
                ),
                selection=(
                    Selection.from_document(selection) if isinstance(selection, Mapping) else None
                ),
                params=dict(document.get("params") or {}),
                dropped={str(k): int(v) for k, v in (document.get("dropped") or {}).items()},
                iterations=int(document.get("iterations") or 0),
                ranks=tuple(int(g) for g in document.get("gpus") or ()),
                policies=dict(policies),
                loader=dict(loader) if isinstance(loader, Mapping) else None,
                batch=dict(batch) if isinstance(batch, Mapping) else None,
                trace_path=(
                    document["trace_path"] if isinstance(document.get("trace_path"), str) else None
                ),
                extra={k: v for k, v in document.items() if k not in _KEYS},
                format_version=int(document["format_version"]),
            )
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise InputError(f"malformed result description: {exc}", path) from exc

    @classmethod
    def load(cls, directory: str | Path) -> ResultInfo:
        """``<directory>/result.json``; ``InputError`` if unreadable or of another format."""
        path = Path(directory) / RESULT_FILE
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(f"unreadable result description: {exc}", path) from exc
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError among them
            raise InputError(f"unreadable result description: {json_problem(exc)}", path) from exc
        except RecursionError:
            raise InputError("unreadable result description: nested too deeply", path) from None
        return cls.from_document(document, path)

    def save(self, directory: str | Path) -> Path:
        """Write ``<directory>/result.json`` atomically."""
        path = Path(directory) / RESULT_FILE
        write_json(self.document(), path)
        return path
