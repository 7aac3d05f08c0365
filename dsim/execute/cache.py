"""Cache keys: when is a finished replay still valid?

A replay file stores the key it was computed with (``dsim.results``). The key
hashes what determines its content: the trace's bytes (``fetch.parquet`` and
``train.parquet``), the replay parameters, the policy, and the results format
version. Summary options (epochs, warm-up, threshold) are not part of it: a
replay holds every iteration, and the summary is recomputed on every run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dsim.errors import InputError
from dsim.policies import Policy, policy_label
from dsim.replay import ReplayParams
from dsim.results import RESULTS_FORMAT_VERSION
from dsim.tables import FETCH_FILE, TRAIN_FILE

#: Names the replay model; a model that propagates time across iterations gets another.
MODEL = "per-iteration"


def _file_digest(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"cannot read table: {exc.strerror or exc}", path) from exc
    return {"size": size, "sha256": digest.hexdigest()}


def trace_fingerprint(run_dir: Path) -> dict[str, Any]:
    """Size and sha256 of the run's two tables: changes whenever the trace does."""
    return {name: _file_digest(run_dir / name) for name in (FETCH_FILE, TRAIN_FILE)}


def params_document(params: ReplayParams) -> dict[str, float]:
    """The replay parameters as recorded in keys, replays and ``result.json``."""
    return {"stall_floor_s": params.stall_floor_s, "stall_grow_min_s": params.stall_grow_min_s}


def replay_key(fingerprint: dict[str, Any], params: ReplayParams, policy: Policy) -> str:
    """The cache key of one replay (hex sha256 of a canonical JSON document)."""
    document = {
        "format_version": RESULTS_FORMAT_VERSION,
        "model": MODEL,
        "trace": fingerprint,
        "params": params_document(params),
        "policy": policy_label(policy),
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
