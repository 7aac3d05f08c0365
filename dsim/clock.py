"""Clocks that go backwards: blame the outlier, not its neighbours.

Within a group of records that must be in time order (the fetch lines one
DataLoader worker wrote, in file order; the training lines of one rank, in
(epoch, iteration) order), a time below the one before it is a *descent*.
"Below the running maximum" would blame every good record after a single
timestamp that jumped forward, and everything after a real clock step back
(NTP). Instead, at a descent at record ``i`` (``x[i] < x[top]``, ``top`` the
last record kept):

- ``H``: the fewest of the last kept records (1..K) whose removal restores
  order (the kept record below them is <= ``x[i]``, or none is left);
- ``L``: the fewest records from ``i`` on (1..K) that are all below
  ``x[top]`` and followed by a record >= ``x[top]`` (or by the group's end);
- the smaller of the two is rejected as outliers (a tie goes to ``L``: the
  later records); if neither exists within ``K``, the clock *stepped*: every
  record is kept, the step is reported, and ``x[i]`` is the new baseline.

``K = 3``. Groups without a descent -- every group of a good log -- are
found with one vectorised comparison and never scanned; only groups with a
descent are scanned, in Python, once.
"""

from __future__ import annotations

import numpy as np

K = 3  # at most this many consecutive records are blamed for one descent


def scan(x: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """Positions of the outliers in one group's times ``x`` (in group order), and the steps.

    A step is ``(position, size)``: the first record after the step back, and
    how far below the last kept time it reads.
    """
    n = len(x)
    stack: list[int] = []  # positions kept so far, in order; their times never decrease
    rejected: list[int] = []
    steps: list[tuple[int, int]] = []
    i = 0
    while i < n:
        if not stack or x[i] >= x[stack[-1]]:
            stack.append(i)
            i += 1
            continue
        top = x[stack[-1]]
        high = None  # H
        for h in range(1, min(K, len(stack)) + 1):
            if h == len(stack) or x[stack[-h - 1]] <= x[i]:
                high = h
                break
        low = None  # L: x[i] < top is known; extend while the next record is still below top
        for span in range(1, K + 1):
            after = i + span
            if after >= n or x[after] >= top:
                low = span
                break
        if low is not None and (high is None or low <= high):
            rejected.extend(range(i, i + low))
            i += low
        elif high is not None:
            rejected.extend(stack[-high:])
            del stack[-high:]
            stack.append(i)
            i += 1
        else:
            steps.append((i, top - x[i]))
            stack = [i]
            i += 1
    return rejected, steps


def outliers(time: np.ndarray, sort: np.ndarray, new_group: np.ndarray) -> tuple[np.ndarray, list]:
    """Rows (of ``time``) rejected as outliers, and the rows right after each clock step.

    ``sort`` orders the rows group by group, each group in the order its times
    must rise in; ``new_group`` (in ``sort`` order) is True at each group's
    first row. Returns a boolean mask over the rows and a list of
    ``(row, size)`` per step, the size in the unit of ``time``.
    """
    bad = np.zeros(len(time), dtype=bool)
    if len(sort) < 2:
        return bad, []
    t = time[sort]
    descent = np.flatnonzero((t[1:] < t[:-1]) & ~new_group[1:]) + 1
    if len(descent) == 0:
        return bad, []
    starts = np.flatnonzero(new_group)
    ends = np.append(starts[1:], len(sort))
    steps = []
    for g in np.unique(np.searchsorted(starts, descent, side="right") - 1):
        lo, hi = int(starts[g]), int(ends[g])
        x = t[lo:hi].tolist()
        rejected, stepped = scan(x)
        bad[sort[lo + np.asarray(rejected, dtype=np.int64)]] = True
        steps.extend((int(sort[lo + p]), size) for p, size in stepped)
    return bad, steps
