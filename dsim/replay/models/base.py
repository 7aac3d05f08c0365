"""The interface every replay model implements (docs/SPEC.md §3).

A replay model turns one run's ``IterationArrays`` and one policy into
per-iteration outputs (``Replay``). It works in two steps so that work shared
by all policies is done once per run: ``prepare`` (policy-independent; its
result is what execution ships to workers) and ``replay`` (one policy).

Execution never assumes how a model treats iterations: it asks
``cut_points`` where the rows of a run may be split into chunks that are
replayed independently and concatenated. The per-iteration model may be cut
anywhere; a model that carries time from one iteration to the next may only
be cut where it restarts (e.g. epoch boundaries), or nowhere.

``params`` names the ``ReplayParams`` fields a model reads: only those enter
its cache keys and provenance, and config keys for the others are noted as
ignored. Models import nothing that does I/O (enforced in pyproject.toml).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from dsim.model.columns import METRIC_COLUMNS
from dsim.replay.params import ReplayParams
from dsim.replay.policies import Policy, is_stall_alignment

if TYPE_CHECKING:
    from dsim.replay.arrays import IterationArrays


@dataclass(frozen=True)
class Replay:
    """Per-iteration results of one policy; arrays of length N (iterations)."""

    iteration_s: np.ndarray
    stall_s: np.ndarray
    delay_s: np.ndarray
    fetch_diff_s: np.ndarray
    start_diff_s: np.ndarray
    gpu_stall_s: np.ndarray  # [N, G] replayed stall ST' per GPU

    def metrics(self) -> dict[str, np.ndarray]:
        """The per-iteration metric columns of a replay table (``dsim.model.columns``)."""
        return {name: getattr(self, name) for name in METRIC_COLUMNS}


class PreparedRun(Protocol):
    """What execution needs of a model's prepared run: its shape and row slices."""

    @property
    def shape(self) -> tuple[int, int]: ...

    def take(self, lo: int, hi: int) -> Any: ...


class ReplayModel(ABC):
    """One way of replaying a run; registered by ``name`` in ``dsim.replay.models``."""

    #: The model's name: in ``--model``, the config, cache keys, result.json, replay metadata.
    name: ClassVar[str]
    #: The ``ReplayParams`` fields this model reads.
    params: ClassVar[tuple[str, ...]]
    #: Whether the model reads the run's loader settings (then they enter its cache keys).
    uses_loader: ClassVar[bool] = False
    #: Whether the model replays fetch records (a run without them needs a model that does not).
    needs_fetch: ClassVar[bool] = True
    #: Whether the model reads the trace's CPU times (SPEC §1.2); ``dsim run`` leaves them
    #: unread for a model that does not (``dsim.app.runplan.unread``).
    reads_cpu: ClassVar[bool] = False
    #: The date the model's replays of a given trace and parameters last changed; it enters
    #: their cache keys (SPEC §7.2), so that a cached replay of an earlier dsim is computed
    #: again, not shown as today's. ``None``: the replays never change (a model whose
    #: numbers are fixed by SPEC §3, as the original analysis's); its keys carry no revision.
    revision: ClassVar[str | None] = None

    @abstractmethod
    def prepare(self, arrays: IterationArrays, params: ReplayParams) -> PreparedRun:
        """Policy-independent work, once per run; the result goes to every worker."""

    @abstractmethod
    def replay(self, prepared: Any, policy: Policy, params: ReplayParams) -> Replay:
        """Replay every row of ``prepared`` (the whole run or a chunk) under ``policy``."""

    def supports(self, policy: Policy) -> bool:
        """Whether this model replays ``policy``; fetch/start models refuse stall alignments."""
        return not any(is_stall_alignment(side) for side in policy)

    def cut_points(self, arrays: IterationArrays) -> np.ndarray | None:
        """Rows before which a run may be split for execution; ``None``: before any row."""
        return None
