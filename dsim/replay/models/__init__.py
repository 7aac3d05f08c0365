"""Replay models by name (docs/SPEC.md §3): a new model is a module here plus one line below.

``DEFAULT_MODEL`` is what ``dsim run`` uses without ``--model`` or a config
``model`` key. Models are instances of ``ReplayModel`` subclasses and hold no
state, so execution workers look them up by name (``get_model``).
"""

from __future__ import annotations

from dsim.errors import UsageError
from dsim.replay.models.base import Replay, ReplayModel
from dsim.replay.models.per_iteration import PerIterationModel
from dsim.replay.models.pipeline import PipelineModel
from dsim.replay.models.stall_only import StallOnlyModel

MODELS: dict[str, ReplayModel] = {
    model.name: model for model in (PerIterationModel(), PipelineModel(), StallOnlyModel())
}
#: The model a run without fetch records is replayed with (``dsim.app.run``).
STALL_ONLY_MODEL = StallOnlyModel.name
DEFAULT_MODEL = PerIterationModel.name

__all__ = ["DEFAULT_MODEL", "MODELS", "STALL_ONLY_MODEL", "Replay", "ReplayModel", "get_model"]


def get_model(name: str) -> ReplayModel:
    """The registered model ``name``; a ``UsageError`` naming the known ones otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(MODELS)
        raise UsageError(f"unknown replay model {name!r}; known models: {known}") from None
