"""Attribution: whose data loader is slow — which rank, how often, and which workers.

In DDP a rank whose loader is late makes every other rank wait in the
all-reduce, so its peers *look* slow; the measured stall alone does not say
who is to blame. Attribution looks at the fetches themselves, per iteration:

* **last to finish**: the rank whose fetch ended last (start + duration);
* **largest stall**: the rank with the largest training stall;
* **straggler**: *fixed* when one rank was last in at least
  ``FIXED_STRAGGLER_SHARE`` (60 %) of the iterations, *wandering* otherwise,
  *none* when no iteration had a single last rank (one GPU, or ties only);
  the straggler rank is the one last most often (ties: the lowest rank);
* **slowest workers**: per iteration, the part of each fetch above the median
  fetch duration of that iteration across ranks (the excess); each (rank,
  worker) is charged its fetches' excess, and its share of the total excess
  ranks it.

Without fetch records (a profiled run, docs/SPEC.md §4.3) only stalls are
known: the straggler is then the rank with the largest stall most often
(the iterations start together after the all-reduce, so the rank whose data
comes last waits longest; on the shipped sample the rank that finished its
fetch last had the largest stall in 72 % of iterations, the smallest in
9 %), ``gpu_last_pct`` is NaN, and each rank has one row with worker -1 and
no fetch numbers.

An iteration counts for a rank only when that rank is the *only* one at the
maximum; ties (e.g. every stall 0) count for nobody, so the shares of the
ranks add up to at most 100 % and an idle run blames no one. Only the
iterations the summary selected (epochs, warm-up) count.

Over time (``last_over_time``): the share of iterations in which each rank
alone was last, per window of consecutive selected iterations, so a report
can show whether the straggler stays put or moves (docs/SPEC.md §5.2).

Pure functions over ``IterationArrays`` plus a worker matrix; the table form
(``attribution_table``) is what ``dsim run`` writes next to the summary and
what the terminal lines (``describe``) are printed from.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from dsim.fetchstages import STAGE_COLUMNS, StageShare, describe_stages
from dsim.replay.arrays import IterationArrays
from dsim.sets import distinct_inverse

FIXED_STRAGGLER_SHARE = 60.0  # % of iterations one rank must be last in to be "fixed"
TOP_WORKERS = 3
FIXED, WANDERING, NONE = "fixed", "wandering", "none"

ATTRIBUTION_COLUMNS = [
    "run",
    "gpu",
    "worker",
    "fetches",
    "fetch_s_mean",
    "excess_s",
    "excess_share_pct",
    "gpu_last_pct",
    "gpu_max_stall_pct",
    "straggler",
    "straggler_gpu",
    "iterations",
    "selected_epochs",
    "warmup",
]


@dataclass(frozen=True)
class RankShare:
    gpu: int
    last_pct: float  # % of iterations in which this rank alone finished its fetch last
    max_stall_pct: float  # % of iterations in which this rank alone had the largest stall


@dataclass(frozen=True)
class WorkerShare:
    gpu: int
    worker: int
    fetches: int
    fetch_s_mean: float
    excess_s: float  # total fetch time above the per-iteration median
    excess_share_pct: float  # of the run's total excess; NaN when there is none


@dataclass(frozen=True)
class Attribution:
    run: str
    iterations: int
    ranks: list[RankShare]
    straggler: str  # FIXED, WANDERING or NONE
    straggler_gpu: int | None  # the rank last most often (None when no rank ever was)
    workers: list[WorkerShare]  # largest excess share first
    # per rank, what its fetches spent their time on (empty: the logs carry no stages)
    stages: tuple[StageShare, ...] = ()

    def top_workers(self, k: int = TOP_WORKERS) -> list[WorkerShare]:
        return [w for w in self.workers if w.excess_s > 0][:k]


def _sole_max(values: np.ndarray) -> np.ndarray:
    """Per row, the column of the single maximum, or -1 when several columns share it."""
    if values.shape[1] == 0:
        return np.full(values.shape[0], -1)
    top = values.max(axis=1, keepdims=True)
    at_top = values == top
    return np.where(at_top.sum(axis=1) == 1, values.argmax(axis=1), -1)


def last_ranks(start: np.ndarray, fetch: np.ndarray) -> np.ndarray:
    """Per iteration, the GPU column whose fetch alone ended last (start + duration), or -1
    (a tie, or a single GPU: it waits for no peer)."""
    if fetch.shape[1] < 2:
        return np.full(fetch.shape[0], -1)
    return _sole_max(start + fetch)


WINDOW_STEPS = (1, 2, 5)
MAX_WINDOWS = 40
"""``last_over_time`` picks the smallest window of 1, 2, 5, 10, 20, 50, ... iterations
that cuts the selected iterations into at most this many windows."""


def window_size(n: int, max_windows: int = MAX_WINDOWS) -> int:
    """Iterations per window: a round number (1-2-5 steps) giving at most ``max_windows``."""
    scale = 1
    while True:
        for step in WINDOW_STEPS:
            if step * scale * max_windows >= n:
                return step * scale
        scale *= 10


@dataclass(frozen=True)
class LastOverTime:
    """Who was last, per window of ``window`` consecutive selected iterations."""

    gpus: np.ndarray  # int [G]
    window: int
    first: np.ndarray  # int [W]: position of each window's first iteration among the selected
    size: np.ndarray  # int [W]: iterations in each window (the last may be shorter)
    last_pct: np.ndarray  # float [W, G]: % of the window's iterations this rank alone was last
    tie_pct: np.ndarray  # float [W]: % with no single last rank (the rest to 100)
    epoch: np.ndarray  # int [W, 2]: epoch of each window's first and last iteration
    iteration: np.ndarray  # int [W, 2]: iteration of each window's first and last iteration


def last_over_time(
    arrays: IterationArrays, mask: np.ndarray | None = None, window: int | None = None
) -> LastOverTime:
    """The "who was last" shares over the iterations ``mask`` selects, per window of
    ``window`` of them in order (``window_size`` by default). Each window's rank shares
    and tie share add up to 100 %."""
    mask = np.ones(arrays.n_iterations, bool) if mask is None else np.asarray(mask, bool)
    last = _selected_last(arrays, mask)
    epoch, iteration = arrays.epoch[mask], arrays.iteration[mask]
    n, g = len(last), arrays.n_gpus
    window = window or window_size(n)
    first = np.arange(0, n, window)
    size = np.minimum(first + window, n) - first
    counts = np.zeros((len(first), g))
    ties = np.zeros(len(first))
    which = np.arange(n) // window
    np.add.at(counts, (which[last >= 0], last[last >= 0]), 1.0)
    np.add.at(ties, which[last < 0], 1.0)
    end = first + size - 1
    return LastOverTime(
        gpus=np.asarray(arrays.gpus),
        window=window,
        first=first,
        size=size,
        last_pct=100.0 * counts / np.maximum(size, 1)[:, None],
        tie_pct=100.0 * ties / np.maximum(size, 1),
        epoch=np.column_stack([epoch[first], epoch[end]]) if n else np.zeros((0, 2), int),
        iteration=(
            np.column_stack([iteration[first], iteration[end]]) if n else np.zeros((0, 2), int)
        ),
    )


def worker_matrix(fetch: pa.Table, arrays: IterationArrays) -> np.ndarray:
    """The worker id of every [iteration, GPU] fetch of ``arrays`` (-1 where unknown)."""

    def col(name: str) -> np.ndarray:
        return np.asarray(fetch.column(name).to_numpy(), dtype=np.int64)

    keys = (arrays.epoch.astype(np.int64) << 32) + (arrays.iteration.astype(np.int64) + 2**31)
    f_keys = (col("epoch") << 32) + (col("iteration") + 2**31)
    row = np.searchsorted(keys, f_keys)
    g = np.searchsorted(arrays.gpus, col("gpu"))
    ok = (row < len(keys)) & (g < len(arrays.gpus))
    ok[ok] &= (keys[row[ok]] == f_keys[ok]) & (arrays.gpus[g[ok]] == col("gpu")[ok])
    out = np.full((arrays.n_iterations, arrays.n_gpus), -1, dtype=np.int64)
    out[row[ok], g[ok]] = col("worker")[ok]
    return out


#: Iterations per block: attribution copies the selected rows a block at a time, never
#: whole (each whole copy of an [N, G] matrix was 8 bytes per GPU-iteration at its peak).
BLOCK_ROWS = 1 << 16


def _blocks(matrix: np.ndarray, mask: np.ndarray) -> Iterator[np.ndarray]:
    """The rows of ``matrix`` that ``mask`` selects, in order, a block of them at a time."""
    for lo in range(0, len(mask), BLOCK_ROWS):
        yield matrix[lo : lo + BLOCK_ROWS][mask[lo : lo + BLOCK_ROWS]]


def _selected_last(arrays: IterationArrays, mask: np.ndarray) -> np.ndarray:
    """``last_ranks`` of the selected iterations, computed a block at a time (row by row,
    the same values as of the selected rows copied whole)."""
    parts = [
        last_ranks(start, fetch)
        for start, fetch in zip(
            _blocks(arrays.start, mask), _blocks(arrays.fetch, mask), strict=True
        )
    ]
    return np.concatenate(parts) if parts else np.full(0, -1)


def attribute(
    run: str, arrays: IterationArrays, workers: np.ndarray, mask: np.ndarray | None = None
) -> Attribution:
    """Attribution of one run over the iterations ``mask`` selects (all by default).

    The selected rows are read a block at a time (``BLOCK_ROWS``) and the workers' shares a
    GPU at a time: beside the arrays it holds one [selected, G] matrix (the excess), not
    copies of four; the numbers are those of the selected rows copied whole.
    """
    mask = np.ones(arrays.n_iterations, bool) if mask is None else np.asarray(mask, bool)
    n, g = int(mask.sum()), arrays.n_gpus
    stalls_only = bool(n and g) and all(np.isnan(f).all() for f in _blocks(arrays.fetch, mask))
    last = _selected_last(arrays, mask)
    # a single GPU waits for no peer: nobody to blame
    if g >= 2:
        stalled = [_sole_max(stall) for stall in _blocks(arrays.stall, mask)]
        most_stalled = np.concatenate(stalled) if stalled else np.full(0, -1)
    else:
        most_stalled = np.full(n, -1)
    ranks = [
        RankShare(
            gpu=int(gpu),
            last_pct=100.0 * int((last == j).sum()) / n if n and not stalls_only else np.nan,
            max_stall_pct=100.0 * int((most_stalled == j).sum()) / n if n else np.nan,
        )
        for j, gpu in enumerate(arrays.gpus)
    ]
    share = (lambda r: r.max_stall_pct) if stalls_only else (lambda r: r.last_pct)
    counted = [r for r in ranks if share(r) > 0]
    if not counted:
        straggler, straggler_gpu = NONE, None
    else:
        top = max(counted, key=lambda r: (share(r), -r.gpu))
        straggler = FIXED if share(top) >= FIXED_STRAGGLER_SHARE else WANDERING
        straggler_gpu = top.gpu
    if stalls_only:
        shares = [WorkerShare(int(gpu), -1, 0, np.nan, np.nan, np.nan) for gpu in arrays.gpus]
    else:
        shares = _worker_shares(arrays, workers, mask, n) if n and g else []
    return Attribution(
        run=run,
        iterations=n,
        ranks=ranks,
        straggler=straggler,
        straggler_gpu=straggler_gpu,
        workers=shares,
    )


def _excess(arrays: IterationArrays, mask: np.ndarray, n: int) -> np.ndarray:
    """Per selected fetch, its time above the median of its iteration's fetches: [n, G],
    row-major like the selected rows copied whole (so that its sum is theirs, bit for
    bit), filled a block at a time."""
    excess = np.empty((n, arrays.n_gpus))
    lo = 0
    for fetch in _blocks(arrays.fetch, mask):
        excess[lo : lo + len(fetch)] = np.maximum(
            fetch - np.median(fetch, axis=1, keepdims=True), 0.0
        )
        lo += len(fetch)
    return excess


def _worker_shares(
    arrays: IterationArrays, workers: np.ndarray, mask: np.ndarray, n: int
) -> list[WorkerShare]:
    """Each (rank, worker)'s fetches, mean fetch (NaN fetches left out) and summed excess,
    one GPU at a time with ``np.bincount``.

    Why not a pandas ``groupby``: one per GPU cost ~20 ms of pandas overhead whatever the
    rows, 0.17 s a run of 8 GPUs and 45 % of a cached ``dsim run`` of 100 runs
    (BENCHMARKS.md, "End to end"). ``bincount`` sums in row order; pandas'
    compensated sums can differ from it in the last bits (~1e-15 relative).
    """
    gpus = arrays.gpus
    excess = _excess(arrays, mask, n)
    total = float(excess.sum())
    shares = []
    for j, gpu in enumerate(gpus):
        ids, group = distinct_inverse(workers[:, j][mask].astype(np.int64))
        k = len(ids)
        fetch = arrays.fetch[:, j][mask]
        known = ~np.isnan(fetch)
        counted = np.bincount(group[known], minlength=k)
        fetch_sum = np.bincount(group[known], weights=fetch[known], minlength=k)
        mean = np.divide(fetch_sum, counted, out=np.full(k, np.nan), where=counted > 0)
        column = excess[:, j]
        kept = ~np.isnan(column)
        excess_s = np.bincount(group[kept], weights=column[kept], minlength=k)
        fetches = np.bincount(group, minlength=k)
        shares += [
            WorkerShare(
                gpu=int(gpu),
                worker=int(ids[w]),
                fetches=int(fetches[w]),
                fetch_s_mean=float(mean[w]),
                excess_s=float(excess_s[w]),
                excess_share_pct=100.0 * float(excess_s[w]) / total if total > 0 else np.nan,
            )
            for w in range(k)
        ]
    return sorted(shares, key=lambda s: (-s.excess_s, s.gpu, s.worker))


def attribution_table(
    attributions: Sequence[Attribution], selections: Sequence[tuple[str, int]] | None = None
) -> pd.DataFrame:
    """One row per run, rank and worker (``ATTRIBUTION_COLUMNS``): the file ``dsim run`` writes.

    Rank-level shares and the run's straggler repeat on every worker row of
    their rank / run, so that the table stays one flat, filterable frame.
    The stage columns (``dsim.fetchstages.STAGE_COLUMNS``) follow only when
    some run's logs carry a fetch's stages (NaN for a rank without them).
    ``selections`` gives each run's (selected epochs "1,2", warm-up), as in
    the summary.
    """
    rows: list[dict[str, Any]] = []
    selections = selections or [("", 0)] * len(attributions)
    with_stages = any(a.stages for a in attributions)
    no_stages = dict.fromkeys(STAGE_COLUMNS, np.nan)
    for a, (epochs, warmup) in zip(attributions, selections, strict=True):
        by_gpu = {r.gpu: r for r in a.ranks}
        stages = {s.gpu: s.row() for s in a.stages}
        for w in a.workers:
            rank = by_gpu[w.gpu]
            rows.append(
                {
                    "run": a.run,
                    "gpu": w.gpu,
                    "worker": w.worker,
                    "fetches": w.fetches,
                    "fetch_s_mean": w.fetch_s_mean,
                    "excess_s": w.excess_s,
                    "excess_share_pct": w.excess_share_pct,
                    "gpu_last_pct": rank.last_pct,
                    "gpu_max_stall_pct": rank.max_stall_pct,
                    "straggler": a.straggler,
                    "straggler_gpu": a.straggler_gpu,
                    "iterations": a.iterations,
                    "selected_epochs": epochs,
                    "warmup": warmup,
                    **(stages.get(w.gpu, no_stages) if with_stages else {}),
                }
            )
    columns = ATTRIBUTION_COLUMNS + (list(STAGE_COLUMNS) if with_stages else [])
    frame = pd.DataFrame(rows, columns=columns)
    frame["straggler_gpu"] = frame["straggler_gpu"].astype("Int64")
    return frame


def _rows(table: pd.DataFrame, *columns: str) -> list[Any]:
    """``table[list(columns)].itertuples(index=False)``'s rows, the same values (Python
    scalars, as a Series iterates) and attribute names. Why: ``itertuples`` makes one Series
    per column of the table and a namedtuple class per call; over the attribution table's
    ~50 columns that was most of ``describe``'s ~16 ms a run, and ``dsim run`` describes
    every run it answers for."""
    row = _row_type(columns)
    return [row(*values) for values in zip(*(table[c].tolist() for c in columns), strict=True)]


@functools.lru_cache(maxsize=16)
def _row_type(columns: tuple[str, ...]) -> Any:
    return collections.namedtuple("Row", columns)


def _describe_stalls(first: Any, ranks: pd.DataFrame) -> list[str]:
    """The straggler line of a run without fetch records: the rank that waited longest."""
    ranks = ranks.sort_values(["gpu_max_stall_pct", "gpu"], ascending=[False, True])
    shares = ", ".join(
        f"GPU {int(r.gpu)} {r.gpu_max_stall_pct:.0f} %"
        for r in _rows(ranks, "gpu", "gpu_max_stall_pct")
        if r.gpu_max_stall_pct
    )
    how = "no fetch records: judged by the largest data wait"
    if first["straggler"] == FIXED:
        gpu = int(first["straggler_gpu"])
        share = float(ranks[ranks["gpu"] == gpu]["gpu_max_stall_pct"].iloc[0])
        return [
            f"Straggler: GPU {gpu}'s loader, fixed — it had the largest data wait in "
            f"{share:.0f} % of iterations ({how})."
        ]
    if first["straggler"] == WANDERING:
        mostly = _mostly(ranks, "gpu_max_stall_pct", "had the largest data wait", how)
        if mostly is not None:
            return [mostly]
        return [
            f"Straggler wanders between ranks (none has the largest data wait in "
            f"≥ {FIXED_STRAGGLER_SHARE:.0f} % of iterations; {how}): {shares}."
        ]
    return ["Straggler: none (no rank alone had the largest data wait)."]


def _mostly(ranks: pd.DataFrame, column: str, did: str, how: str = "") -> str | None:
    """The straggler line of a wandering straggler one rank still leads, or None on a tie.

    Below the 60 % of a fixed straggler, the rank most often late is still
    the one to look at first ("mostly GPU 3, 54 %"); only when two ranks share
    the top is there no rank to name. ``ranks`` is sorted by ``column``,
    largest first.
    """
    shares = [(int(r.gpu), float(getattr(r, column))) for r in _rows(ranks, "gpu", column)]
    shares = [(gpu, share) for gpu, share in shares if share > 0]
    if not shares or (len(shares) > 1 and shares[1][1] == shares[0][1]):
        return None
    (gpu, share), others = shares[0], shares[1:]
    rest = ", ".join(f"GPU {g} {a:.0f} %" for g, a in others)
    why = f"below the {FIXED_STRAGGLER_SHARE:.0f} % of a fixed one" + (f"; {how}" if how else "")
    return (
        f"Straggler: mostly GPU {gpu}'s loader — it {did} in {share:.0f} % of iterations "
        f"({why})" + (f"; then {rest}." if rest else ".")
    )


def describe(table: pd.DataFrame, top: int = TOP_WORKERS) -> list[str]:
    """A few plain lines on one run's rows of ``attribution_table``: straggler, workers."""
    if table.empty:
        return []
    first = table.iloc[0]
    ranks = table.drop_duplicates("gpu").sort_values(
        ["gpu_last_pct", "gpu"], ascending=[False, True]
    )
    lines = []
    if pd.isna(first["gpu_last_pct"]):  # no fetch records: judged by the stalls alone
        return _describe_stalls(first, ranks)
    if first["straggler"] == FIXED:
        gpu = int(first["straggler_gpu"])
        rank = ranks[ranks["gpu"] == gpu].iloc[0]
        lines.append(
            f"Straggler: GPU {gpu}'s loader, fixed — it finished its fetch last in "
            f"{rank['gpu_last_pct']:.0f} % of iterations and had the largest stall in "
            f"{rank['gpu_max_stall_pct']:.0f} %."
        )
    elif first["straggler"] == WANDERING:
        shares = ", ".join(
            f"GPU {int(r.gpu)} {r.gpu_last_pct:.0f} %"
            for r in _rows(ranks, "gpu", "gpu_last_pct")
            if r.gpu_last_pct
        )
        mostly = _mostly(ranks, "gpu_last_pct", "finished its fetch last")
        lines.append(
            mostly
            or f"Straggler wanders between ranks (none is last in ≥ {FIXED_STRAGGLER_SHARE:.0f} % "
            f"of iterations); last to finish its fetch: {shares}."
        )
    else:
        lines.append("Straggler: none (no rank alone finished its fetch last).")
    slow = table[table["excess_s"] > 0].sort_values(
        ["excess_s", "gpu", "worker"], ascending=[False, True, True]
    )
    if len(slow):
        named = ", ".join(
            f"GPU {int(r.gpu)} worker {int(r.worker)} {r.excess_share_pct:.0f} %"
            for r in _rows(slow.head(top), "gpu", "worker", "excess_share_pct")
        )
        lines.append(
            f"Slowest workers (share of fetch time above the iteration's median): {named}."
        )
    stage = _stage_line(table, first)
    return lines + ([stage] if stage else [])


def _stage_line(table: pd.DataFrame, first: Any) -> str | None:
    """What the slow rank's fetches spent their time on, when the logs carry stages.

    The slow rank is the straggler (the rank last most often); without one,
    the rank whose fetches took longest on average.
    """
    if STAGE_COLUMNS[0] not in table.columns or table[STAGE_COLUMNS[0]].isna().all():
        return None
    if not pd.isna(first["straggler_gpu"]):
        gpu, why = int(first["straggler_gpu"]), " (the straggler)"
    else:
        weighted = (table["fetch_s_mean"] * table["fetches"]).groupby(table["gpu"]).sum()
        gpu = int(weighted.div(table.groupby("gpu")["fetches"].sum()).idxmax())
        why = " (slowest fetches)" if table["gpu"].nunique() > 1 else ""
    row = table[table["gpu"] == gpu].iloc[0]
    return describe_stages(gpu, row, why)
