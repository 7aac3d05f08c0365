"""The live view's numbers (``dsim watch``, docs/SPEC.md §9.4): the last window of a running job.

A running job's logs end in iterations some ranks have logged and others not
yet. The view counts only *complete* iterations (every rank has its fetch and
its training record, §1.7: exactly what ``build_iteration_arrays`` keeps),
skips warm-up iterations as ``dsim run`` does, and takes the last ``window``
of them. Over that window it reports what ``dsim run`` would for the same
iterations: the measured stall, delay and iteration time, the alignment
what-ifs of the same policies replayed by the same model (the
per-iteration replay is iteration by iteration, so a window replays exactly
as those rows of the whole run do), the straggler and the verdict. Nothing
here is recomputed its own way: the replay, the summary statistics, the
attribution and the verdict are the library's.

Pure: arrays and counts in, a ``LiveWindow`` out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from dsim.analysis.attribution import Attribution, attribute, attribution_table, describe
from dsim.analysis.headline import calibrate_pipeline, pipeline_verdict_on, replays_policies
from dsim.analysis.summary import (
    DEFAULT_THRESHOLD_S,
    DEFAULT_WARMUP,
    add_what_if,
    summarize_metrics,
)
from dsim.analysis.verdict import Verdict, verdict
from dsim.replay.arrays import IterationArrays
from dsim.replay.models import DEFAULT_MODEL, get_model
from dsim.replay.params import ReplayParams
from dsim.replay.policies import DEFAULT, Policy, policy_pairs

DEFAULT_WINDOW = 100  # iterations
DEFAULT_INTERVAL_S = 2.0
#: The policies a config without FETCH_ALIGN / START_ALIGN replays (``dsim run``'s default).
DEFAULT_POLICIES: tuple[Policy, ...] = tuple(policy_pairs(DEFAULT, DEFAULT))


@dataclass(frozen=True)
class RankProgress:
    """How far one rank has logged: its training records seen, and its latest one."""

    gpu: int
    iterations: int
    epoch: int
    iteration: int


@dataclass(frozen=True)
class LiveWindow:
    """The view of one look: progress per rank and the numbers of the last window.

    ``rows``: one summary row per policy (``summarize_metrics`` plus the what-if
    columns), empty while no complete iteration is past the warm-up.
    """

    run: str
    ranks: list[RankProgress]
    complete: int  # complete iterations in the lines held (warm-up included)
    window: int  # the window asked for
    iterations: int  # complete iterations in the window (≤ window)
    first: tuple[int, int] | None  # (epoch, iteration) of the window's first iteration
    last: tuple[int, int] | None
    warmup: int
    threshold_s: float
    model: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    attribution: Attribution | None = None
    straggler_lines: list[str] = field(default_factory=list)
    verdict: Verdict | None = None
    #: The pipeline model's verdict on the window, printed first as `dsim run` prints its
    #: headline (``verdict`` is then the original analysis's line below it).
    headline: Verdict | None = None


def window_rows(arrays: IterationArrays, window: int, warmup: int) -> np.ndarray:
    """Row indices of the last ``window`` complete iterations past the warm-up, in order."""
    past = np.flatnonzero(arrays.iteration > warmup)
    return past[max(len(past) - window, 0) :]


def live_window(
    run: str,
    arrays: IterationArrays,
    ranks: Sequence[RankProgress],
    *,
    window: int = DEFAULT_WINDOW,
    warmup: int = DEFAULT_WARMUP,
    threshold_s: float = DEFAULT_THRESHOLD_S,
    policies: Sequence[Policy] = DEFAULT_POLICIES,
    trace: Mapping[str, Any] | None = None,
    calibration: int | None = None,
) -> LiveWindow:
    """The window's numbers; ``trace`` (a ``run.json`` document) gives the verdict its epoch
    length and GPU count, as ``dsim run``'s has.

    ``calibration``: the headline, as `dsim run`'s (``dsim.analysis.headline``): the pipeline model
    calibrated on and replaying the complete iterations from ``calibration`` before the
    window's first to the last (warm-up ones included, as `dsim run` calibrates on the whole
    trace), judged over the window; ``None``: no headline. Bounded so that a refresh costs
    the same however long the job has run."""
    rows = window_rows(arrays, window, warmup)
    base = LiveWindow(
        run=run,
        ranks=list(ranks),
        complete=arrays.n_iterations,
        window=window,
        iterations=len(rows),
        first=_at(arrays, rows, 0),
        last=_at(arrays, rows, -1),
        warmup=warmup,
        threshold_s=threshold_s,
        model=DEFAULT_MODEL,
    )
    if not len(rows):
        return base
    part = arrays.take(rows)
    model, params = get_model(DEFAULT_MODEL), ReplayParams()
    prepared = model.prepare(part, params)
    everything = np.ones(len(rows), dtype=bool)
    epochs = ",".join(str(int(e)) for e in np.unique(part.epoch))
    out = []
    for policy in policies:
        replayed = model.replay(prepared, policy, params)
        stats = summarize_metrics(replayed.metrics(), everything, threshold_s)
        out.append(
            {
                "run": run,
                "gpus": part.n_gpus,
                "replay_model": DEFAULT_MODEL,
                "fetch_align": policy[0],
                "start_align": policy[1],
                **stats,
                "selected_epochs": epochs,
                "warmup": warmup,
                "threshold_s": threshold_s,
            }
        )
    table = add_what_if(pd.DataFrame(out)).to_dict("records")
    attribution = attribute(run, part, part.worker.astype(np.int64), everything)
    lines = describe(attribution_table([attribution], [(epochs, warmup)]))
    try:
        judged = verdict(table, trace=trace, model=DEFAULT_MODEL)
    except ValueError:  # only actual/actual asked for: nothing to compare
        judged = None
    head = None
    if calibration is not None:
        head = _headline(arrays, rows, table, calibration, threshold_s, trace)
    return replace(
        base,
        rows=table,
        attribution=attribution,
        straggler_lines=lines,
        verdict=judged,
        headline=head,
    )


def _headline(
    arrays: IterationArrays,
    rows: np.ndarray,
    table: Sequence[Mapping[str, Any]],
    calibration: int,
    threshold_s: float,
    trace: Mapping[str, Any] | None,
) -> Verdict | None:
    """The pipeline model's verdict on the window (``dsim.analysis.headline``), calibrated on the
    ``calibration`` complete iterations before it and the window itself."""
    if not replays_policies(table):
        return None
    span = np.arange(max(int(rows[0]) - calibration, 0), arrays.n_iterations)
    inside = np.isin(span, rows)
    if not inside.any():
        return None
    return pipeline_verdict_on(
        table, calibrate_pipeline(arrays.take(span)), inside, threshold_s, trace
    )


def _at(arrays: IterationArrays, rows: np.ndarray, k: int) -> tuple[int, int] | None:
    if not len(rows):
        return None
    return int(arrays.epoch[rows[k]]), int(arrays.iteration[rows[k]])


def rank_progress(
    gpu: np.ndarray, epoch: np.ndarray, iteration: np.ndarray, earlier: Mapping[int, int]
) -> list[RankProgress]:
    """Per rank (ascending): training records held plus ``earlier`` ones (lines no longer
    held), and the latest (epoch, iteration) among those held."""
    out = []
    ranks = sorted({*(int(g) for g in np.unique(gpu)), *earlier})
    for g in ranks:
        mine = gpu == g
        if mine.any():
            order = np.lexsort((iteration[mine], epoch[mine]))
            e, i = int(epoch[mine][order[-1]]), int(iteration[mine][order[-1]])
        else:
            e, i = -1, -1
        out.append(RankProgress(g, int(mine.sum()) + int(earlier.get(g, 0)), e, i))
    return out


@dataclass(frozen=True)
class Snapshot:
    """One look at a running job: the window's numbers, or why there are none yet.

    ``waiting``: what the lines read so far lack (no record yet, no complete
    iteration, a run the parser refuses), in words; ``view`` is ``None`` then,
    or holds the ranks' progress when records exist but no window does.
    """

    run: str
    path: str
    files: int  # log files followed
    view: LiveWindow | None
    waiting: str | None = None
