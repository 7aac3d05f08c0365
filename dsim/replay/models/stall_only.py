"""The ``stall-only`` replay model (docs/SPEC.md §4.3): what-ifs from the train table alone.

Why a model and not only policies: every other model replays fetch starts
and durations, which a PyTorch profiler trace does not record; this one
reads only what every run has (each rank's iteration time T and training
stall ST), so it is the one that can replay a profiled run. Its what-ifs are
registered as stall alignments in ``dsim.replay.policies`` (``stall-min``,
``stall-avg``), so they have names of their own in results, summaries and
figures; this model replays them and ``actual/actual``, and refuses the
fetch/start alignments (they need fetch records).

Per iteration, with ST′ = ST (``actual/actual``), or ST′[g] = min / mean over
ranks of ST (``stall-min/actual``, ``stall-avg/actual``):

* iteration time = max T + (max ST′ − max ST): the all-reduce ends each
  iteration when the slowest rank is done, so it moves by the change of the
  largest stall (§4.1's formula, evaluated the same way, so ``actual/actual``
  gives back max T bit for bit);
* stall = max ST′; delay = max ST′ − min ST′ (0 under a stall alignment);
* fetch diff, start diff: max − min over ranks of the measured fetch
  durations and starts, NaN where a rank has no fetch record (always, for a
  profiled run); a stall alignment does not change them.

Pure NumPy, no I/O; iterations are independent, so execution may cut a run
anywhere. Reductions go over the rank columns left to right (the aggregates
of ``dsim.replay.policies``), so the result is bitwise equal to the
row-by-row reference in ``tests/reference_stall_only.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dsim.replay.models.base import Replay, ReplayModel
from dsim.replay.params import ReplayParams
from dsim.replay.policies import ACTUAL, BASELINE, REGISTRY, Policy, column_reduce

if TYPE_CHECKING:
    from dsim.replay.arrays import IterationArrays

__all__ = ["StallOnlyModel", "StallPrepared", "prepare_stalls", "replay_stalls"]


@dataclass(frozen=True)
class StallPrepared:
    """Policy-independent quantities of one run: [N, G] stalls, [N] row extremes."""

    stall: np.ndarray
    max_iteration: np.ndarray
    max_stall: np.ndarray
    fetch_diff: np.ndarray
    start_diff: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.stall.shape  # type: ignore[return-value]

    def take(self, lo: int, hi: int) -> StallPrepared:
        return StallPrepared(
            self.stall[lo:hi],
            self.max_iteration[lo:hi],
            self.max_stall[lo:hi],
            self.fetch_diff[lo:hi],
            self.start_diff[lo:hi],
        )


def _spread(values: np.ndarray) -> np.ndarray:
    """max − min over ranks; NaN where any rank's value is NaN (no fetch record)."""
    return column_reduce(values, np.maximum) - column_reduce(values, np.minimum)


def prepare_stalls(
    iteration_time: np.ndarray, stall: np.ndarray, fetch: np.ndarray, start: np.ndarray
) -> StallPrepared:
    """Precompute what every policy shares from plain [N, G] arrays (seconds)."""
    t = np.asarray(iteration_time, dtype=np.float64)
    st = np.asfortranarray(np.asarray(stall, dtype=np.float64))
    n, g = st.shape
    if t.shape != st.shape:
        raise ValueError(f"iteration_time has shape {t.shape}, expected {st.shape}")
    if g == 0:
        empty = np.zeros(n, dtype=np.float64)
        return StallPrepared(st, empty, empty, empty, empty)
    return StallPrepared(
        stall=st,
        max_iteration=column_reduce(t, np.maximum),
        max_stall=column_reduce(st, np.maximum),
        fetch_diff=_spread(np.asarray(fetch, dtype=np.float64)),
        start_diff=_spread(np.asarray(start, dtype=np.float64)),
    )


def replay_stalls(prep: StallPrepared, policy: Policy) -> Replay:
    """Replay every iteration of ``prep`` under ``actual/actual`` or a stall alignment."""
    fetch_align, start_align = policy
    alignment = REGISTRY.get(fetch_align)
    if policy != BASELINE and (
        alignment is None or alignment.stall is None or start_align != ACTUAL
    ):
        raise ValueError(
            f"the stall-only model replays actual/actual and stall alignments "
            f"(stall-min/actual, stall-avg/actual), not {fetch_align}/{start_align}"
        )
    n, g = prep.shape
    if g == 0:
        empty = np.zeros(n, dtype=np.float64)
        return Replay(empty, empty.copy(), empty.copy(), empty.copy(), empty.copy(), prep.stall)
    if policy == BASELINE:
        gpu_stall = np.array(prep.stall, order="F", copy=True)
        stall = prep.max_stall.copy()
        delay = stall - column_reduce(gpu_stall, np.minimum)
    else:
        stall = alignment.stall(prep.stall)  # type: ignore[union-attr]
        gpu_stall = np.asfortranarray(np.repeat(stall[:, None], g, axis=1))
        delay = np.zeros(n, dtype=np.float64)
    iteration = prep.max_iteration + (stall - prep.max_stall)
    return Replay(
        iteration_s=iteration,
        stall_s=stall,
        delay_s=delay,
        fetch_diff_s=prep.fetch_diff.copy(),
        start_diff_s=prep.start_diff.copy(),
        gpu_stall_s=gpu_stall,
    )


class StallOnlyModel(ReplayModel):
    """Stall what-ifs from the train table: the model for runs without fetch records."""

    name = "stall-only"
    params = ()
    needs_fetch = False

    def prepare(self, arrays: IterationArrays, params: ReplayParams) -> StallPrepared:
        return prepare_stalls(arrays.iteration_time, arrays.stall, arrays.fetch, arrays.start)

    def replay(self, prepared: StallPrepared, policy: Policy, params: ReplayParams) -> Replay:
        return replay_stalls(prepared, policy)

    def supports(self, policy: Policy) -> bool:
        alignment = REGISTRY.get(policy[0])
        return policy == BASELINE or (
            alignment is not None and alignment.stall is not None and policy[1] == ACTUAL
        )
