"""Cache keys: when is a finished replay still valid?

A replay file stores the key it was computed with (``dsim.model.results``). The key
hashes what determines its content: the trace's bytes (``fetch.parquet`` and
``train.parquet``), the replay model's name (and revision, for a model whose replays
change between versions of dsim) and the parameters that model reads, the policy,
and the results format version. Summary options (epochs,
warm-up, threshold) are not part of it: a replay holds every iteration, and
the summary is recomputed on every run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dsim.errors import InputError
from dsim.model.resultinfo import KEY_FORMAT_VERSION
from dsim.model.runinfo import path_digest
from dsim.model.tables import FETCH_FILE, TRAIN_FILE, RunTables
from dsim.replay.models import ReplayModel
from dsim.replay.params import ReplayParams
from dsim.replay.params import params_document as _params_document
from dsim.replay.policies import Policy, policy_label


def _file_digest(path: Path) -> dict[str, Any]:
    try:
        return path_digest(path)
    except OSError as exc:
        raise InputError(f"cannot read table: {exc.strerror or exc}", path) from exc


def trace_fingerprint(run_dir: Path) -> dict[str, Any]:
    """Size and sha256 of the run's two tables: changes whenever the trace does."""
    return {name: _file_digest(run_dir / name) for name in (FETCH_FILE, TRAIN_FILE)}


def snapshot_fingerprint(tables: RunTables, run_dir: Path) -> dict[str, Any]:
    """``trace_fingerprint`` of the bytes ``read_run`` decoded ``tables`` from (no second
    read, which a concurrent ``dsim parse`` could have changed); hashed from disk only for
    tables built in memory."""
    files = tables.files or {}
    if all(name in files for name in (FETCH_FILE, TRAIN_FILE)):
        return {name: dict(files[name]) for name in (FETCH_FILE, TRAIN_FILE)}
    return trace_fingerprint(run_dir)


def params_document(model: ReplayModel, params: ReplayParams) -> dict[str, float]:
    """The parameters ``model`` reads, as recorded in keys, replays and ``result.json``."""
    return _params_document(params, model.params)


def replay_key(
    fingerprint: dict[str, Any], model: ReplayModel, params: ReplayParams, policy: Policy
) -> str:
    """The cache key of one replay (hex sha256 of a canonical JSON document)."""
    document = {
        "format_version": KEY_FORMAT_VERSION,
        "model": model.name,
        "trace": fingerprint,
        "params": params_document(model, params),
        "policy": policy_label(policy),
    }
    if model.revision is not None:  # a model whose replays change between versions of dsim
        document["model_revision"] = model.revision
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
