"""Metadata carried by a run's name (docs/SPEC.md §1.1, §2.3).

The original analysis named runs
``{logtype}_{dataset}_{augmentation}_{model}_epoch{E}_b{B}_worker{W}_thread{T}``;
such names yield those fields, any other name leaves them all ``None``.
"""

from __future__ import annotations

import re
from typing import Any

RUN_NAME_FIELDS = (
    "logtype",
    "dataset",
    "augmentation",
    "model",
    "epochs",
    "batch_size",
    "workers",
    "threads",
)

_RUN_NAME = re.compile(
    r"^(?P<logtype>[^_]+)_(?P<dataset>[^_]+)_(?P<augmentation>[^_]+)_(?P<model>.+?)"
    r"_epoch(?P<epochs>\d+)_b(?P<batch_size>\d+)_worker(?P<workers>\d+)_thread(?P<threads>\d+)$"
)
_INT_FIELDS = {"epochs", "batch_size", "workers", "threads"}


def parse_run_name(name: str) -> dict[str, Any]:
    """Return every field of ``RUN_NAME_FIELDS``; all ``None`` when the name has another shape."""
    match = _RUN_NAME.match(name)
    if match is None:
        return dict.fromkeys(RUN_NAME_FIELDS)
    return {
        key: int(value) if key in _INT_FIELDS else value for key, value in match.groupdict().items()
    }
