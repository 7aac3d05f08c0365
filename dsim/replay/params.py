"""Replay parameters and their defaults, defined once (docs/SPEC.md §3).

The two thresholds of the per-iteration model are the original analysis's
values. The config (``stall_floor_s``, ``stall_grow_min_s``), the cache key and
``result.json`` all take them from here, so a default cannot drift between
the place that validates it and the place that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

#: A stall that an aligned fetch would make negative is floored at this (s).
DEFAULT_STALL_FLOOR_S = 0.000002
#: A stall only grows when it was already longer than this (s).
DEFAULT_STALL_GROW_MIN_S = 0.01


@dataclass(frozen=True)
class ReplayParams:
    """Thresholds of docs/SPEC.md §3, defaults as in the original analysis."""

    stall_floor_s: float = DEFAULT_STALL_FLOOR_S
    stall_grow_min_s: float = DEFAULT_STALL_GROW_MIN_S
    #: Loader what-ifs of the pipeline model: DataLoader workers and prefetch factor
    #: to replay with; ``None`` keeps the run's measured settings.
    workers: int | None = None
    prefetch_factor: int | None = None


#: The defaults, as a value (for default arguments).
DEFAULT_PARAMS = ReplayParams()

#: Every parameter name, in declaration order (also the config keys).
PARAM_NAMES: tuple[str, ...] = tuple(f.name for f in fields(ReplayParams))


def params_document(
    params: ReplayParams, names: tuple[str, ...] = PARAM_NAMES
) -> dict[str, float | int | None]:
    """The parameters ``names`` as recorded in cache keys, replays and ``result.json``."""
    return {name: getattr(params, name) for name in names}
