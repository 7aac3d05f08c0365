"""Plausibility bounds on the values of a record, shared by both paths of the grammar.

A number can be well-formed and still impossible: ``Time 1e300``, an
iteration that waited longer for its data than the iteration lasted. Such a
value would poison every statistic computed from it, so the line is rejected
(and counted) instead of stored. The canonical fast path (``dsim.sources.rawlog.fastpath``)
and the general path (``dsim.sources.rawlog.grammar``) call the same functions here, so they
keep the same lines: a line the fast path does not vouch for goes to the
general path, which names the reason.

Bounds (documented in the README and the parse notes):

- every duration (fetch ``at_time``, ``Time``, ``Data``) is finite, >= 0 and
  at most ``max_duration`` seconds (default one day, ``--max-duration``);
- ``Data`` (the stall) is at most ``Time`` (the iteration it is part of) plus
  ``STALL_SLACK_S``, which absorbs the rounding of the printed values;
- ``Throughput``, when present, is finite and >= 0;
- a fetch's ``cpu`` and ``runq`` (one thread's time on a core and waiting for one,
  read over the fetch) and an iteration's ``Runq`` (its main thread's wait) are at
  most the span they were read over plus ``CPU_SLACK_S``; an iteration's ``CPU``
  (every thread of the process) and a fetch's ``proc`` (read over another span) are
  bounded by ``max_duration`` only;
- a rank (``GPU: g``, a profiler trace's ``distributedInfo.rank``) is an integer
  0 <= g < ``RANK_LIMIT``: a negative or absurdly large one is a corrupt line,
  never re-attributed to another rank.
"""

from __future__ import annotations

import numpy as np

from dsim.model import runinfo

MAX_DURATION_S = 86_400.0  # one day: no fetch or iteration of a real run lasts longer
STALL_SLACK_S = 1e-3  # printed Time and Data are rounded separately
#: How far one thread's CPU time or run-queue wait may exceed the span it was read over.
#: Read at the span's ends, they should not exceed it at all; the committed validation
#: logs (750,800 fetch lines with CPU times, 2-core and 16-core machines) exceed it by at
#: most 0.15 s (a run-queue wait on a 2-core VM running 36 processes). A value seconds
#: beyond its span is a corrupt line, and one such value (3500 s of waiting in a 53 ms
#: fetch) made the CPU-aware model's stretch of the whole run 327x.
CPU_SLACK_S = 1.0
#: Ranks are below 2**20 (1,048,576): far above any DDP job, and every rank fits int32.
RANK_LIMIT = 1 << 20
#: A loader line's num_workers and prefetch_factor are at most this (``run.json``'s rule).
LOADER_SETTING_LIMIT = runinfo.LOADER_SETTING_LIMIT
BAD_RANK = f"GPU rank out of range (not 0 to {RANK_LIMIT - 1:,})"


def rank_ok(rank: int) -> bool:
    """Whether one rank (a Python int of any size) lies in ``0 <= rank < RANK_LIMIT``."""
    return 0 <= rank < RANK_LIMIT


def over_max(what: str, max_duration: float) -> str:
    """The reject reason for a duration above the bound; it names the field and the bound."""
    return f"{what} above the maximum duration ({max_duration:g} s, --max-duration)"


def stall_too_long(iteration_s: np.ndarray, stall_s: np.ndarray) -> np.ndarray:
    """Rows whose stall exceeds their iteration time by more than the printing slack."""
    return stall_s > iteration_s + STALL_SLACK_S


def absent(values: np.ndarray) -> bool:
    """Whether an optional column is empty or ``logfile.absent_as_views``' view of one NaN
    (no line carried it: most logs), which a check can pass whole without a pass over it."""
    return len(values) == 0 or (values.strides == (0,) and bool(np.isnan(values[0])))


def beyond_span(span_s: np.ndarray, *times: np.ndarray) -> np.ndarray:
    """Rows where any of ``times`` (NaN: absent, passes) exceeds ``span_s`` by more than
    ``CPU_SLACK_S``."""
    out = np.zeros(len(span_s), dtype=bool)
    for values in times:
        if absent(values):
            continue
        with np.errstate(invalid="ignore"):
            out |= values > span_s + CPU_SLACK_S
    return out


def fetch_ok(fetch_s: np.ndarray, max_duration: float) -> np.ndarray:
    """Fetch durations that pass every bound (NaN fails, as every comparison with it does)."""
    return (fetch_s >= 0) & (fetch_s <= max_duration)


def train_ok(
    iteration_s: np.ndarray, stall_s: np.ndarray, throughput: np.ndarray, max_duration: float
) -> np.ndarray:
    """Training values that pass every bound; a NaN throughput means "absent" and passes."""
    ok = (iteration_s >= 0) & (iteration_s <= max_duration)
    ok &= (stall_s >= 0) & (stall_s <= max_duration)
    ok &= ~stall_too_long(iteration_s, stall_s)
    ok &= np.isnan(throughput) | ((throughput >= 0) & np.isfinite(throughput))
    return ok
