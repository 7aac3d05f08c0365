"""Where a sweep's data lies and its manifest: shared by ``validation.sweep`` (which writes
them) and the readers ``validation.compare`` and ``validation.timing``.

Here, not in ``sweep``, so that the readers do not import the sweep: ``validation.sweep``
runs ``validation.compare`` after a sweep, and ``compare`` importing ``sweep`` for these
names made the two modules import each other.
"""

from __future__ import annotations

import json
from pathlib import Path

from dsim.errors import InputError
from validation.machine import REPO

DEFAULT_OUT = REPO / "validation" / "data"  # the committed (legacy) sleep sweep
CPU_OUT = REPO / "validation" / "data-cpu"  # the contention sweep's default
BASE_PREFETCH = 2  # the prefetch factor of every run but the prefetch what-ifs
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


def load_manifest(out: Path) -> dict:
    """``<out>/manifest.json`` (an empty one when the sweep has not started)."""
    path = out / MANIFEST
    if not path.is_file():
        return {"format": MANIFEST_FORMAT, "runs": {}}
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable manifest ({exc})") from exc
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("runs"), dict):
        raise InputError(f"{path}: unknown manifest format")
    return manifest
