"""A deliberately plain, row-by-row implementation of docs/SPEC.md §4.1 for testing the kernel.

Python floats, one loop over iterations and one over GPUs, read straight off
the text of docs/SPEC.md §4.1 with no attempt at speed, so that it can be checked by eye.
The iteration time is evaluated literally, ``max ST' + max_g pure[g]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dsim.replay.policies import REGISTRY


@dataclass
class ReferenceRow:
    iteration_s: float
    stall_s: float
    delay_s: float
    fetch_diff_s: float
    start_diff_s: float
    gpu_stall_s: list[float]


def _registered(name: str, side: str, values: Sequence[float]) -> float:
    """A policy beyond the three spelled out here: the registry's aggregate of one row.

    The original three are re-derived by hand above; a policy added later is
    checked for everything around its aggregate (gaps, floors, growth).
    """
    aggregate = getattr(REGISTRY[name], side)
    return float(aggregate(np.asarray([values], dtype=np.float64))[0])


def reference_row(
    start: Sequence[float],
    fetch: Sequence[float],
    iteration_time: Sequence[float],
    stall: Sequence[float],
    policy: tuple[str, str],
    stall_floor: float = 0.000002,
    stall_grow_min: float = 0.01,
) -> ReferenceRow:
    """Replay one iteration (one value per GPU in each sequence)."""
    fetch_align, start_align = policy
    gpus = len(start)

    new_fetch = []
    new_start = []
    for g in range(gpus):
        if fetch_align == "actual":
            new_fetch.append(fetch[g])
        elif fetch_align == "min":
            new_fetch.append(min(fetch))
        elif fetch_align == "avg":
            new_fetch.append(sum(fetch) / gpus)
        else:
            new_fetch.append(_registered(fetch_align, "fetch", fetch))
        if start_align == "actual":
            new_start.append(start[g])
        elif start_align == "min":
            new_start.append(min(start))
        elif start_align == "avg":
            new_start.append(max(start) - (max(start) - min(start)) / 2)
        else:
            new_start.append(_registered(start_align, "start", start))

    new_stall = []
    for g in range(gpus):
        done = start[g] + fetch[g]
        new_done = new_start[g] + new_fetch[g]
        gap = done - new_done
        if gap > 0:
            value = stall[g] - gap
            if value < 0:
                value = stall_floor
        elif gap < 0:
            value = stall[g] + abs(gap) if stall[g] > stall_grow_min else stall[g]
        else:
            value = stall[g]
        new_stall.append(value)

    pure = [iteration_time[g] - max(stall) for g in range(gpus)]
    return ReferenceRow(
        iteration_s=max(new_stall) + max(pure),
        stall_s=max(new_stall),
        delay_s=max(new_stall) - min(new_stall),
        fetch_diff_s=max(new_fetch) - min(new_fetch),
        start_diff_s=max(new_start) - min(new_start),
        gpu_stall_s=new_stall,
    )


def reference_replay(
    start: Sequence[Sequence[float]],
    fetch: Sequence[Sequence[float]],
    iteration_time: Sequence[Sequence[float]],
    stall: Sequence[Sequence[float]],
    policy: tuple[str, str],
    stall_floor: float = 0.000002,
    stall_grow_min: float = 0.01,
) -> list[ReferenceRow]:
    """Replay every iteration (rows of [iterations][GPUs] nested sequences)."""
    return [
        reference_row(
            [float(x) for x in start[i]],
            [float(x) for x in fetch[i]],
            [float(x) for x in iteration_time[i]],
            [float(x) for x in stall[i]],
            policy,
            stall_floor,
            stall_grow_min,
        )
        for i in range(len(start))
    ]
