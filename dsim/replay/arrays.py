"""Tables → [iterations × GPUs] arrays: the shape the replay kernel works on.

``fetch.parquet`` and ``train.parquet`` hold one row per (epoch, iteration,
GPU). The replay needs, for each iteration, the values of *every* GPU side by
side, so this module pivots both tables into dense [N, G] matrices. An
iteration enters the replay only when every GPU has both its fetch and its
training record (docs/SPEC.md §1.7); the others are dropped and counted by reason,
never silently.

Fetch starts are wall-clock timestamps (~1.6e9 s since 1970). As float64
seconds they would keep only ~0.2 µs of resolution, so they are made relative
to a per-run origin in integer nanoseconds first and only then converted to
float seconds, which keeps nanosecond precision for runs up to ~100 days.

Memory: the result holds 5 float64 and one int32 value per GPU-iteration (44
bytes) plus
two int32 per iteration; building it needs about as much again in temporaries
(presence masks, indices), all vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from dsim.errors import InputError
from dsim.replay.params import LoaderSettings

MISSING_FETCH = "missing fetch record"
MISSING_TRAIN = "missing training record"
MISSING_BOTH = "missing fetch and training records"


@dataclass(frozen=True)
class IterationArrays:
    """One run as dense arrays, rows sorted by (epoch, iteration), columns by GPU rank."""

    epoch: np.ndarray  # int32 [N]
    iteration: np.ndarray  # int32 [N]
    gpus: np.ndarray  # int32 [G], ascending
    start: np.ndarray  # float64 [N, G] fetch start S, seconds since origin_ns
    fetch: np.ndarray  # float64 [N, G] fetch duration F (s)
    iteration_time: np.ndarray  # float64 [N, G] T (s)
    stall: np.ndarray  # float64 [N, G] training stall ST (s)
    arrival: np.ndarray  # float64 [N, G] batch arrival (train ``start``), s since origin_ns
    worker: np.ndarray  # int32 [N, G] DataLoader worker of the fetch
    origin_ns: int  # timestamp (ns since 1970, naive) that ``start`` is relative to
    dropped: dict[str, int] = field(default_factory=dict)  # dropped iterations by reason
    loader: LoaderSettings | None = None  # as logged (run.json); None: not logged
    # CPU times (SPEC §2.1), float64 [N, G], NaN where a line lacked them; None: not logged.
    fetch_cpu: np.ndarray | None = None
    fetch_runq: np.ndarray | None = None
    train_cpu: np.ndarray | None = None
    train_runq: np.ndarray | None = None
    # The fetches came from an IterableDataset (the fetch table's ``stream`` column, SPEC
    # §2.1): no sampler maps batches to workers, so worker what-ifs cannot be replayed.
    stream: bool = False

    @property
    def n_iterations(self) -> int:
        return int(self.epoch.shape[0])

    @property
    def n_gpus(self) -> int:
        return int(self.gpus.shape[0])

    def take(self, rows: np.ndarray | slice) -> IterationArrays:
        """A subset of iterations (e.g. one execution chunk); ``dropped`` is kept as is."""
        return IterationArrays(
            epoch=self.epoch[rows],
            iteration=self.iteration[rows],
            gpus=self.gpus,
            start=self.start[rows],
            fetch=self.fetch[rows],
            iteration_time=self.iteration_time[rows],
            stall=self.stall[rows],
            arrival=self.arrival[rows],
            worker=self.worker[rows],
            origin_ns=self.origin_ns,
            dropped=dict(self.dropped),
            loader=self.loader,
            stream=self.stream,
            **{name: _rows(getattr(self, name), rows) for name in CPU_FIELDS},
        )


CPU_FIELDS = ("fetch_cpu", "fetch_runq", "train_cpu", "train_runq")


def _rows(values: np.ndarray | None, rows: np.ndarray | slice) -> np.ndarray | None:
    return None if values is None else values[rows]


def _optional(
    table: pa.Table, name: str, flat: np.ndarray, n: int, g: int, keep: np.ndarray
) -> np.ndarray | None:
    """An optional float column (``cpu_s``, ``runq_s``) as [N, G]; NaN where absent."""
    if name not in table.column_names:
        return None
    values = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
    out = np.full(n * g, np.nan)
    out[flat] = values
    return np.asfortranarray(out.reshape(n, g)[keep])


def _column(table: pa.Table, name: str, what: str, dtype: type) -> np.ndarray:
    if name not in table.column_names:
        raise InputError(f"{what} table has no column {name!r} (re-run `dsim parse`)")
    col = table.column(name)
    if col.null_count:
        raise InputError(f"{what} table: column {name!r} has {col.null_count} missing value(s)")
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("ns")).cast(pa.int64())
    return np.asarray(col.to_numpy(), dtype=dtype)


def _pair_key(epoch: np.ndarray, iteration: np.ndarray) -> np.ndarray:
    """One int64 per (epoch, iteration) whose order is the lexicographic order of the pairs."""
    return (epoch.astype(np.int64) << 32) + (iteration.astype(np.int64) + 2**31)


def _locate(
    keys: np.ndarray, gpus: np.ndarray, key: np.ndarray, gpu: np.ndarray, what: str
) -> np.ndarray:
    """Flat [N*G] position of every row; a second row for the same cell is an error."""
    flat = np.searchsorted(keys, key) * len(gpus) + np.searchsorted(gpus, gpu)
    counts = np.bincount(flat, minlength=len(keys) * len(gpus))
    if (counts > 1).any():
        cell = int(np.flatnonzero(counts > 1)[0])
        k, g = divmod(cell, len(gpus))
        epoch, iteration = int(keys[k] >> 32), int((keys[k] & 0xFFFFFFFF) - 2**31)
        raise InputError(
            f"{what} table has {int(counts[cell])} rows for epoch {epoch}, "
            f"iteration {iteration}, GPU {int(gpus[g])} (expected one; re-run `dsim parse`)"
        )
    return flat


def _scatter(values: np.ndarray, flat: np.ndarray, n: int, g: int) -> np.ndarray:
    """Place row values into a dense [N, G] matrix; cells without a row stay 0."""
    out = np.zeros(n * g, dtype=values.dtype)
    out[flat] = values
    return out.reshape(n, g)


def build_iteration_arrays(
    fetch: pa.Table, train: pa.Table, *, require_fetch: bool = True, origin_ns: int | None = None
) -> IterationArrays:
    """Pivot the fetch and training tables of one run into ``IterationArrays``.

    The GPU set is the union of the GPUs of both tables, so a GPU that lost all
    its training lines makes every iteration incomplete instead of vanishing.
    ``require_fetch=False`` (the ``stall-only`` model, docs/SPEC.md §4.3) keeps
    every iteration with a training record for every GPU; a cell without a
    fetch record then holds NaN start and duration and worker -1.
    ``origin_ns`` (default: the first fetch start) fixes the origin of the times, so
    that part of a run (``dsim watch``'s window) rounds exactly as the whole run does.
    """
    f_epoch = _column(fetch, "epoch", "fetch", np.int32)
    f_iter = _column(fetch, "iteration", "fetch", np.int32)
    f_gpu = _column(fetch, "gpu", "fetch", np.int32)
    f_start = _column(fetch, "start", "fetch", np.int64)
    f_dur = _column(fetch, "fetch_s", "fetch", np.float64)
    f_worker = _column(fetch, "worker", "fetch", np.int32)
    t_epoch = _column(train, "epoch", "training", np.int32)
    t_iter = _column(train, "iteration", "training", np.int32)
    t_gpu = _column(train, "gpu", "training", np.int32)
    t_time = _column(train, "iteration_s", "training", np.float64)
    t_stall = _column(train, "stall_s", "training", np.float64)
    t_start = _column(train, "start", "training", np.int64)

    f_key = _pair_key(f_epoch, f_iter)
    t_key = _pair_key(t_epoch, t_iter)
    keys = np.unique(np.concatenate([f_key, t_key]))
    gpus = np.unique(np.concatenate([f_gpu, t_gpu])).astype(np.int32)
    n, g = len(keys), len(gpus)

    f_flat = _locate(keys, gpus, f_key, f_gpu, "fetch")
    t_flat = _locate(keys, gpus, t_key, t_gpu, "training")
    has_fetch = np.zeros(n * g, dtype=bool)
    has_fetch[f_flat] = True
    has_train = np.zeros(n * g, dtype=bool)
    has_train[t_flat] = True
    fetch_ok = has_fetch.reshape(n, g).all(axis=1)
    train_ok = has_train.reshape(n, g).all(axis=1)
    keep = fetch_ok & train_ok if require_fetch else train_ok

    dropped = {
        MISSING_FETCH: int((~fetch_ok & train_ok).sum()) if require_fetch else 0,
        MISSING_TRAIN: int((fetch_ok & ~train_ok).sum()),
        MISSING_BOTH: int((~fetch_ok & ~train_ok).sum()),
    }
    dropped = {reason: count for reason, count in dropped.items() if count}

    if origin_ns is not None:
        origin_ns = int(origin_ns)
    elif len(f_start):
        origin_ns = int(f_start.min())
    else:  # no fetch record (a profiled run): the first arrival keeps arrivals precise
        origin_ns = int(t_start.min()) if len(t_start) and not require_fetch else 0
    start_ns = _scatter(f_start - origin_ns, f_flat, n, g)[keep]
    start = start_ns.astype(np.float64) / 1e9
    fetch_s = _scatter(f_dur, f_flat, n, g)[keep]
    worker = _scatter(f_worker, f_flat, n, g)[keep]
    if not require_fetch:
        absent = ~has_fetch.reshape(n, g)[keep]
        start[absent] = np.nan
        fetch_s[absent] = np.nan
        worker[absent] = -1
    arrival_ns = _scatter(t_start - origin_ns, t_flat, n, g)[keep]
    kept_keys = keys[keep]
    return IterationArrays(
        epoch=(kept_keys >> 32).astype(np.int32),
        iteration=((kept_keys & 0xFFFFFFFF) - 2**31).astype(np.int32),
        gpus=gpus,
        start=np.asfortranarray(start),
        fetch=np.asfortranarray(fetch_s),
        iteration_time=np.asfortranarray(_scatter(t_time, t_flat, n, g)[keep]),
        stall=np.asfortranarray(_scatter(t_stall, t_flat, n, g)[keep]),
        arrival=np.asfortranarray(arrival_ns.astype(np.float64) / 1e9),
        worker=np.asfortranarray(worker),
        origin_ns=origin_ns,
        dropped=dropped,
        fetch_cpu=_optional(fetch, "cpu_s", f_flat, n, g, keep),
        fetch_runq=_optional(fetch, "runq_s", f_flat, n, g, keep),
        train_cpu=_optional(train, "cpu_s", t_flat, n, g, keep),
        train_runq=_optional(train, "runq_s", t_flat, n, g, keep),
        stream="stream" in fetch.column_names
        and fetch.column("stream").null_count < fetch.num_rows,
    )
