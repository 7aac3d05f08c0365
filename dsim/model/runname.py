"""Metadata carried by a run's name (docs/SPEC.md §1.1, §2.3).

The original analysis named runs
``{logtype}_{dataset}_{augmentation}_{model}_epoch{E}_b{B}_worker{W}_thread{T}``;
such names yield those fields, any other name leaves them all ``None``.

``dsim synth`` names its runs ``synth_queue_seed{S}_gpus{G}_epoch{E}_b{B}_worker{W}_thread{T}``,
which the scheme above would misread (dataset ``queue``, augmentation
``seed0``, model ``gpus8``). Such a name is read as what it is: log type
``synth``, the epoch count, global batch size, workers and threads; dataset,
augmentation and model stay empty (a synthetic run has none).
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
_SYNTH_NAME = re.compile(
    r"^(?P<logtype>synth)_queue_seed\d+_gpus\d+"
    r"_epoch(?P<epochs>\d+)_b(?P<batch_size>\d+)_worker(?P<workers>\d+)_thread(?P<threads>\d+)$"
)
_INT_FIELDS = {"epochs", "batch_size", "workers", "threads"}


def parse_run_name(name: str) -> dict[str, Any]:
    """Return every field of ``RUN_NAME_FIELDS``; all ``None`` when the name has another shape."""
    match = _SYNTH_NAME.match(name) or _RUN_NAME.match(name)
    fields: dict[str, Any] = dict.fromkeys(RUN_NAME_FIELDS)
    if match is not None:
        fields.update({k: int(v) if k in _INT_FIELDS else v for k, v in match.groupdict().items()})
    return fields
