"""Replay parameters and their defaults, defined once (docs/SPEC.md §3).

The two thresholds of the per-iteration model are the original analysis's
values. The config (``stall_floor_s``, ``stall_grow_min_s``), the cache key and
``result.json`` all take them from here, so a default cannot drift between
the place that validates it and the place that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

#: A stall that an aligned fetch would make negative is floored at this (s).
DEFAULT_STALL_FLOOR_S = 0.000002
#: A stall only grows when it was already longer than this (s).
DEFAULT_STALL_GROW_MIN_S = 0.01
#: Accepted ranges of the two thresholds (s): a floor is a rounding guard (microseconds), never
#: a second; a stall longer than a day is no stall a log can hold (SPEC §1.3).
STALL_FLOOR_RANGE_S = (0.0, 1.0)
STALL_GROW_MIN_RANGE_S = (0.0, 86_400.0)
#: Largest DataLoader worker count or prefetch factor a what-if may ask for (``dsim run``'s
#: ``workers``/``prefetch_factor`` and ``dsim tune``'s grids): a sane bound, not PyTorch's.
MAX_LOADER_SETTING = 256


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


#: PyTorch's default ``prefetch_factor``: what a trace without loader lines is taken to have used.
TORCH_DEFAULT_PREFETCH = 2


@dataclass(frozen=True)
class LoaderSettings:
    """A run's DataLoader settings, and where dsim learnt them.

    ``source`` is ``"log"`` (the instrumentation's loader lines),
    ``"implied"`` (workers from the fetch lines' worker ids, prefetch factor
    PyTorch's default) or ``"log+ids"`` (the loader lines, but the workers
    counted from the fetch lines' ids, which are more than the lines say), so
    that a replay can say how sure it is.
    """

    workers: int
    prefetch_factor: int
    source: str = "log"
    #: The node, when the loader lines carry it (SPEC §1.2): cores the job may use and
    #: ranks per node (``None``: not logged). Only the CPU-aware pipeline model reads them.
    cores: int | None = None
    local_world_size: int | None = None
    #: Where the ranks were bound to CPUs of their own (SPEC §1.2): each process's cores,
    #: and the ranks that share one CPU set (a CPU domain), when they split so; ``None``
    #: otherwise.
    process_cores: int | None = None
    cpu_domain_ranks: int | None = None

    @classmethod
    def implied(cls, worker: np.ndarray) -> LoaderSettings:
        """What the fetch lines imply: as many workers as worker ids, PyTorch's prefetch default.

        A loader without workers (``num_workers=0``) logs worker id 0, like one
        worker: the two cannot be told apart from fetch lines alone. Workers are
        the distinct ids a rank logged (the most over ranks), not the highest id
        + 1: sparse ids (0, 5, 9) are three workers, not ten (SPEC §4.2).
        """
        if not worker.size:
            return cls(1, TORCH_DEFAULT_PREFETCH, "implied")
        columns = worker.reshape(len(worker), -1).T  # [N, G] -> one row per rank
        workers = max(len(np.unique(ids)) for ids in columns)
        return cls(workers, TORCH_DEFAULT_PREFETCH, "implied")

    def document(self) -> dict[str, object]:
        """The record in ``result.json``; the node's fields only when logged (older bytes kept)."""
        doc: dict[str, object] = {
            "workers": self.workers,
            "prefetch_factor": self.prefetch_factor,
            "source": self.source,
        }
        if self.cores is not None:
            doc["cores"] = self.cores
            doc["local_world_size"] = self.local_world_size
        if self.process_cores is not None:
            doc["process_cores"] = self.process_cores
        if self.cpu_domain_ranks is not None:
            doc["cpu_domain_ranks"] = self.cpu_domain_ranks
        return doc
