"""``run.json``, typed: what ``dsim parse`` learnt about a run (docs/SPEC.md §2.3).

The JSON document stays exactly what dsim has always written (same keys,
same order, same bytes); ``RunInfo`` gives each field one meaning and one
name in Python, loads and saves itself and refuses a document of another
format version with a message that says what to do. Names that meant
several things in JSON get unambiguous attribute names here:

* ``gpus`` (JSON) is a *count* of ranks: ``RunInfo.gpu_count``; the ranks
  themselves are ``gpu_ids``;
* ``epochs`` (JSON) are the epochs *present* in the tables:
  ``RunInfo.epochs_present``; the epoch count a run *name* declares is
  ``metadata["epochs"]`` (``RunInfo.name_epochs``).

Keys this version does not know are kept (``extra``) and written back after
the known ones, so a document survives a load/save round trip.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsim.errors import InputError, OutputError
from dsim.io.atomic import write_json

FORMAT_VERSION = 1
RUN_FILE = "run.json"
#: The most DataLoader workers or prefetch a loader line (and so ``run.json``'s
#: ``loader``) may say: more worker processes than any node runs (a line saying 999999
#: calibrated the pipeline model with that many, its fetch lines showing 2).
LOADER_SETTING_LIMIT = 1024
#: Largest ``run.json``/``result.json`` read to tell whether a directory is dsim's.
_MAX_DOCUMENT = 64 * 1024 * 1024

# Known keys in the order ``dsim parse`` has always written them.
_KEYS = (
    "format_version",
    "name",
    "format",
    "gpus",
    "gpu_ids",
    "epochs",
    "iterations_per_epoch",
    "declared_iterations_per_epoch",
    "metadata",
    "sources",
    "report",
    "loader",
    "gpu_util",
    "consistency",
    "digest",
)


def json_problem(exc: ValueError) -> str:
    """What is wrong with a JSON document ``json.loads`` refused, in words: a number of
    more digits than Python converts (4300) is no ``JSONDecodeError`` and its message
    names a Python setting, not the file."""
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)) or "digits" not in str(exc):
        return str(exc)
    return f"a number with more than {sys.get_int_max_str_digits()} digits"


def check_version(
    document: Any,
    expected: int,
    path: Path | None,
    what: str,
    remedy: str,
    *,
    oldest: int | None = None,
) -> None:
    """Refuse a JSON document of another format version: newer ones need a newer dsim.
    ``oldest`` (default ``expected``): the oldest version this dsim still reads."""
    if not isinstance(document, dict):
        raise InputError(f"not a dsim {what} (a JSON object expected)", path)
    found = document.get("format_version")
    readable = range(expected if oldest is None else oldest, expected + 1)
    if isinstance(found, int) and not isinstance(found, bool) and found in readable:
        return
    if isinstance(found, int) and not isinstance(found, bool) and found > expected:
        raise InputError(
            f"{what} written by a newer dsim (format_version {found}; this dsim reads "
            f"{expected}): upgrade dsim",
            path,
        )
    raise InputError(
        f"{what} written by another dsim format (format_version {found!r}, expected "
        f"{expected}); {remedy}",
        path,
    )


def written_version(path: Path) -> int | None:
    """The ``format_version`` of the dsim JSON document at ``path``; ``None`` if it is not one.

    ``None`` when the file is missing, unreadable, not JSON, not an object or
    has no integer ``format_version``: then it is not a document dsim wrote.
    """
    try:
        with path.open("rb") as handle:
            text = handle.read(_MAX_DOCUMENT + 1)
        if len(text) > _MAX_DOCUMENT:
            return None
        document = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    found = document.get("format_version")
    return found if isinstance(found, int) and not isinstance(found, bool) else None


def refuse_newer(version: int, expected: int, path: Path) -> None:
    """Never rewrite a document of a newer format as this dsim's older one (``OutputError``)."""
    if version > expected:
        raise OutputError(
            f"{path} was written by a newer dsim (format {version}; this dsim writes "
            f"{expected}); upgrade dsim or choose another --out"
        )


def check_run_directory(directory: Path) -> None:
    """Let ``dsim parse`` replace ``directory`` only if it is a run directory dsim wrote.

    A run directory is marked by its ``run.json``: a JSON object with an
    integer ``format_version`` (SPEC §2.3). Anything else is a user's
    directory (``OutputError``); one of a newer format is refused too, so
    that an older dsim never replaces what a newer one wrote.
    """
    path = directory / RUN_FILE
    version = written_version(path)
    if version is None:
        raise OutputError(
            f"{directory} exists and is not a run directory dsim wrote (no valid {RUN_FILE}); "
            "dsim replaces only its own run directories: move it away or choose another "
            "--name or --out"
        )
    refuse_newer(version, FORMAT_VERSION, path)
    # resultinfo's RESULT_FILE, spelled here: the layers keep runinfo below resultinfo
    if (directory / "result.json").exists():  # dsim run wrote there: --out was the traces
        raise OutputError(
            f"{directory} holds dsim results (result.json) beside its parsed run; "
            "dsim parse does not replace them: move them away or choose another --out"
        )
    # parse writes files only: a directory inside is someone else's (results or a tune
    # table written into the run by `--out`, a user's notes), and would go with the run
    inside = sorted(p.name for p in directory.iterdir() if p.is_dir() and not p.is_symlink())
    if inside:
        raise OutputError(
            f"{directory} holds {', '.join(inside[:3])}{' …' if len(inside) > 3 else ''} "
            "beside its parsed run, which dsim parse did not write and does not replace: "
            "move it away or choose another --out"
        )


def file_digest(data: bytes) -> dict[str, Any]:
    """Size and sha256 of one file's bytes: how ``run.json`` and cache keys name a table."""
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def path_digest(path: Path) -> dict[str, Any]:
    """``file_digest`` of a file read in 1 MiB blocks: a table just written is not held
    whole in memory again to be hashed (it was a parse's peak, BENCHMARKS.md)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


def version_digest(files: Mapping[str, Mapping[str, Any]]) -> str:
    """The digest of one version of a parsed run: sha256 of the canonical JSON of its
    tables' ``file_digest``s (by file name), so two parses that wrote the same tables
    have the same version and any other table bytes give another (SPEC §2.3)."""
    text = json.dumps(
        {str(k): dict(v) for k, v in files.items()}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def digest_document(files: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``run.json``'s ``digest``: the version and the files it covers."""
    return {
        "sha256": version_digest(files),
        "files": {k: dict(v) for k, v in sorted(files.items())},
    }


def _int_map(value: Any) -> dict[str, int]:
    return {str(k): int(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class RunInfo:
    """One run's ``run.json``: its ranks, epochs, iterations, name fields, sources, parse report.

    ``gpu_count`` is the number of ranks (JSON ``gpus``); ``epochs_present``
    the epochs in the tables (JSON ``epochs``). ``input_format`` is ``None``
    for raw logs (the key is absent) and ``"kineto"`` for profiler traces.
    """

    name: str
    gpu_count: int
    gpu_ids: tuple[int, ...]
    epochs_present: tuple[int, ...]
    iterations_per_epoch: Mapping[str, int]
    declared_iterations_per_epoch: Mapping[str, int] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    sources: tuple[Mapping[str, Any], ...] = ()
    report: Mapping[str, Any] = field(default_factory=dict)
    loader: Mapping[str, Any] | None = None
    gpu_util: Mapping[str, Any] | None = None  # per-epoch utilisation means (§1.9), if logged
    # how consistent the ranks' timelines are with synchronous DDP (dsim.model.consistency)
    consistency: Mapping[str, Any] | None = None
    input_format: str | None = None
    # the tables' version (``digest_document``): what readers check the bytes they read against
    digest: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @property
    def name_epochs(self) -> int | None:
        """The epoch count the run's *name* declares (``epoch<E>``), not the epochs present."""
        value = self.metadata.get("epochs")
        return int(value) if isinstance(value, int) else None

    def with_loader(self, loader: Mapping[str, Any] | None) -> RunInfo:
        """The same run with the loader settings its loader lines gave (§2.3 ``loader``)."""
        from dataclasses import replace

        return replace(self, loader=loader)

    def with_consistency(self, figures: Mapping[str, Any] | None) -> RunInfo:
        """The same run with its timelines' consistency figures (§2.3 ``consistency``)."""
        from dataclasses import replace

        return replace(self, consistency=figures)

    @property
    def version(self) -> str | None:
        """The digest of the tables ``dsim parse`` wrote with this ``run.json`` (``None``
        for a run parsed before dsim recorded it)."""
        value = (self.digest or {}).get("sha256")
        return value if isinstance(value, str) else None

    @property
    def files(self) -> dict[str, dict[str, Any]] | None:
        """Size and sha256 per table file as ``dsim parse`` wrote them, if recorded."""
        files = (self.digest or {}).get("files")
        if not isinstance(files, Mapping):
            return None
        return {str(k): dict(v) for k, v in files.items() if isinstance(v, Mapping)}

    @property
    def inconsistent(self) -> list[str]:
        """Why the run's timelines cannot come from synchronous DDP ([] when they can, or
        when the figures are absent: runs parsed before dsim measured them)."""
        return list((self.consistency or {}).get("problems") or [])

    def document(self) -> dict[str, Any]:
        """The JSON document, key for key what ``dsim parse`` writes."""
        values = {
            "format_version": self.format_version,
            "name": self.name,
            "format": self.input_format,
            "gpus": self.gpu_count,
            "gpu_ids": list(self.gpu_ids),
            "epochs": list(self.epochs_present),
            "iterations_per_epoch": dict(self.iterations_per_epoch),
            "declared_iterations_per_epoch": (
                None
                if self.declared_iterations_per_epoch is None
                else dict(self.declared_iterations_per_epoch)
            ),
            "metadata": dict(self.metadata),
            "sources": [dict(s) for s in self.sources],
            "report": dict(self.report),
            "loader": None if self.loader is None else dict(self.loader),
            "gpu_util": None if self.gpu_util is None else dict(self.gpu_util),
            "consistency": None if self.consistency is None else dict(self.consistency),
            "digest": None if self.digest is None else dict(self.digest),
        }
        optional = {
            "format",
            "declared_iterations_per_epoch",
            "loader",
            "gpu_util",
            "consistency",
            "digest",
        }
        doc = {k: values[k] for k in _KEYS if not (k in optional and values[k] is None)}
        doc.update({k: v for k, v in self.extra.items() if k not in doc})
        return doc

    @classmethod
    def from_document(cls, document: Any, path: Path | None = None) -> RunInfo:
        """A ``run.json`` document, version-checked; ``InputError`` naming ``path`` if bad."""
        check_version(document, FORMAT_VERSION, path, "run description", "re-run `dsim parse`")
        try:
            declared = document.get("declared_iterations_per_epoch")
            loader = document.get("loader")
            util = document.get("gpu_util")
            figures = document.get("consistency")
            digest = document.get("digest")
            return cls(
                name=str(document.get("name", path.parent.name if path else "")),
                gpu_count=int(document.get("gpus") or 0),
                gpu_ids=tuple(int(g) for g in document.get("gpu_ids") or ()),
                epochs_present=tuple(int(e) for e in document.get("epochs") or ()),
                iterations_per_epoch=_int_map(document.get("iterations_per_epoch")),
                declared_iterations_per_epoch=None if declared is None else _int_map(declared),
                metadata=dict(document.get("metadata") or {}),
                sources=tuple(dict(s) for s in document.get("sources") or ()),
                report=dict(document.get("report") or {}),
                loader=dict(loader) if isinstance(loader, Mapping) else None,
                gpu_util=dict(util) if isinstance(util, Mapping) else None,
                consistency=dict(figures) if isinstance(figures, Mapping) else None,
                input_format=document.get("format"),
                digest=dict(digest) if isinstance(digest, Mapping) else None,
                extra={k: v for k, v in document.items() if k not in _KEYS},
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"malformed run description: {exc}", path) from exc

    @classmethod
    def load(cls, directory: str | Path) -> RunInfo:
        """``<directory>/run.json``; ``InputError`` if missing, unreadable or of another format."""
        path = Path(directory) / RUN_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise InputError(
                f"no parsed run here (missing {RUN_FILE}; run `dsim parse` first)",
                Path(directory),
            ) from None
        except OSError as exc:
            raise InputError(f"unreadable run description: {exc}", path) from exc
        return cls.from_bytes(data, path)

    @classmethod
    def from_bytes(cls, data: bytes, path: Path | None = None) -> RunInfo:
        """A ``run.json`` from its bytes (a snapshot reader has them already)."""
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"unreadable run description: {json_problem(exc)}", path) from exc
        except RecursionError:
            raise InputError("unreadable run description: nested too deeply", path) from None
        return cls.from_document(document, path)

    def save(self, directory: str | Path) -> Path:
        """Write ``<directory>/run.json`` atomically."""
        path = Path(directory) / RUN_FILE
        write_json(self.document(), path)
        return path
