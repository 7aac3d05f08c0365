"""A deliberately plain, row-by-row implementation of docs/SPEC.md §4.3 (the stall-only model).

Python floats, one loop over iterations and one over GPUs, read straight off
the text of §4.3 with no attempt at speed. Means are ``sum(row) / G`` (Python
sums left to right, as the kernel's column reduction does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class StallRow:
    iteration_s: float
    stall_s: float
    delay_s: float
    fetch_diff_s: float
    start_diff_s: float
    gpu_stall_s: list[float]


def _spread(values: Sequence[float]) -> float:
    """max − min; NaN when any value is NaN (a rank without a fetch record)."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values) - min(values)


def reference_stall_row(
    iteration_time: Sequence[float],
    stall: Sequence[float],
    fetch: Sequence[float],
    start: Sequence[float],
    policy: tuple[str, str],
) -> StallRow:
    """Replay one iteration (one value per GPU in each sequence)."""
    gpus = len(stall)
    if policy == ("actual", "actual"):
        new = list(stall)
    elif policy == ("stall-min", "actual"):
        new = [min(stall)] * gpus
    elif policy == ("stall-avg", "actual"):
        new = [sum(stall) / gpus] * gpus
    else:
        raise ValueError(f"not a stall-only policy: {policy}")
    # The all-reduce ends the iteration when the slowest rank is done: the
    # iteration moves by the change of the largest stall.
    iteration = max(iteration_time) + (max(new) - max(stall))
    return StallRow(
        iteration_s=iteration,
        stall_s=max(new),
        delay_s=max(new) - min(new),
        fetch_diff_s=_spread(fetch),
        start_diff_s=_spread(start),
        gpu_stall_s=new,
    )
