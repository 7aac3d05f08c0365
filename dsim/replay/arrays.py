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
bytes) plus two int32 per iteration. Building it adds, beside the tables, an
int32 position per table row (int64 past 2^31 cells), a presence flag per cell
and one [N, G] temporary at a time: rows are scattered straight into the final
column-major matrices (``_Rows``), never through a full grid of every
iteration nor a row-major copy. Handed the only reference to a run's columns
(``TableColumns``, as ``dsim run`` and the headline do), the build frees each
column once placed, so the tables and the arrays are never both whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from dsim.errors import InputError
from dsim.replay.params import LoaderSettings
from dsim.sets import distinct

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
    # The worker process's CPU seconds since its previous batch (``proc_cpu_s``), [N, G].
    fetch_proc: np.ndarray | None = None
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


CPU_FIELDS = ("fetch_cpu", "fetch_runq", "train_cpu", "train_runq", "fetch_proc")


def _rows(values: np.ndarray | None, rows: np.ndarray | slice) -> np.ndarray | None:
    return None if values is None else values[rows]


#: The columns the build reads, in the order they are checked (a missing or null column is an
#: error before any work, the first in this order named).
FETCH_COLUMNS = ("epoch", "iteration", "gpu", "start", "fetch_s", "worker")
TRAIN_COLUMNS = ("epoch", "iteration", "gpu", "iteration_s", "stall_s", "start")
#: Read when present: CPU times of both tables (SPEC §2.1), the fetch table's stream column.
OPTIONAL_FLOATS = ("cpu_s", "runq_s")
PROC = "proc_cpu_s"  # the fetch table's only
STREAM = "stream"


class TableColumns:
    """The columns of one table that the build reads, taken one at a time (``take``).

    Why: a run's tables (~84 bytes per GPU-iteration) and its arrays (44) were both whole
    while the arrays were built, the largest part of ``dsim run``'s peak. Made from a table
    the caller keeps, nothing is freed early; made from a table whose every other reference
    is gone (``dsim.app.runplan`` hands a run's tables over this way), each column is let go
    of as soon as the build has placed its values, so the tables shrink while the arrays grow.
    """

    def __init__(self, table: pa.Table, what: str, names: tuple[str, ...]) -> None:
        self.what = what
        self.num_rows = table.num_rows
        present = set(table.column_names)
        self._columns = {name: table.column(name) for name in names if name in present}
        self._names = tuple(table.column_names)

    @classmethod
    def of(cls, table: pa.Table, what: str) -> TableColumns:
        """What the build reads of a fetch (``what`` "fetch") or training table."""
        names = (*FETCH_COLUMNS, STREAM, PROC) if what == "fetch" else TRAIN_COLUMNS
        return cls(table, what, names + OPTIONAL_FLOATS)

    def __contains__(self, name: str) -> bool:
        return name in self._columns

    def check(self, name: str) -> None:
        """A column the build needs: present, no missing value."""
        if name not in self._columns:
            raise InputError(f"{self.what} table has no column {name!r} (re-run `dsim parse`)")
        nulls = self._columns[name].null_count
        if nulls:
            raise InputError(f"{self.what} table: column {name!r} has {nulls} missing value(s)")

    def has_values(self, name: str) -> bool:
        """Whether column ``name`` is present with a value in some row; let go of."""
        col = self._columns.pop(name, None)
        return col is not None and col.null_count < self.num_rows

    def take(self, name: str, dtype: type) -> list[np.ndarray]:
        """Column ``name`` as NumPy views of its chunks (no copy of the column: a table read
        from Parquet comes in chunks, and joining them copied every column the build
        reads), no longer held here: once the caller drops the views, it is freed."""
        col = self._columns.pop(name)
        if pa.types.is_timestamp(col.type):
            col = col.cast(pa.timestamp("ns")).cast(pa.int64())
        return [np.asarray(c.to_numpy(zero_copy_only=False), dtype=dtype) for c in col.chunks]


def _pair_keys(epoch: list[np.ndarray], iteration: list[np.ndarray]) -> np.ndarray:
    """One int64 per (epoch, iteration) whose order is the lexicographic order of the
    pairs, of two chunked columns (chunked alike or not), written into one array."""
    key = _joined(epoch, np.int64, lambda k: epoch[k].astype(np.int64) << 32)
    lo = 0
    for chunk in iteration:
        key[lo : lo + len(chunk)] += chunk.astype(np.int64) + 2**31
        lo += len(chunk)
    return key


def _joined(chunks: list[np.ndarray], dtype: type, each) -> np.ndarray:
    """``each(k)`` of every chunk ``k``, written into one array (no list of parts)."""
    out = np.empty(sum(len(c) for c in chunks), dtype=dtype)
    lo = 0
    for k, chunk in enumerate(chunks):
        out[lo : lo + len(chunk)] = each(k)
        lo += len(chunk)
    return out


def _duplicate(
    keys: np.ndarray, gpus: np.ndarray, flat: np.ndarray, what: str
) -> InputError | None:
    """The error for a second row of one [iteration, GPU] cell, if any."""
    counts = np.bincount(flat, minlength=len(keys) * len(gpus))
    if not (counts > 1).any():
        return None
    cell = int(np.flatnonzero(counts > 1)[0])
    k, g = divmod(cell, len(gpus))
    epoch, iteration = int(keys[k] >> 32), int((keys[k] & 0xFFFFFFFF) - 2**31)
    return InputError(
        f"{what} table has {int(counts[cell])} rows for epoch {epoch}, "
        f"iteration {iteration}, GPU {int(gpus[g])} (expected one; re-run `dsim parse`)"
    )


class _Rows:
    """One table's rows, located on the run's [iteration, GPU] grid.

    ``present``: which cells of the grid of every iteration have a row. After
    ``keep``, ``dst``: each row's position in the kept [n, G] matrices, which are
    column-major (Fortran order: each GPU's column contiguous, as the kernels read
    them), or ``n * G`` (a spare cell past the end) for a row of a dropped iteration.
    Values are scattered chunk by chunk straight into the final matrices: no full
    grid of every iteration, no row-major copy turned column-major, no joined copy
    of a column (each had cost 8 bytes per GPU-iteration at the build's peak).
    """

    def __init__(
        self, keys: np.ndarray, gpus: np.ndarray, key: np.ndarray, gpu: list, what: str
    ) -> None:
        cells = len(keys) * len(gpus)
        self.index = np.int32 if cells < 2**31 - 1 else np.int64
        self.row = np.searchsorted(keys, key).astype(self.index)
        self.col = _joined(gpu, self.index, lambda k: np.searchsorted(gpus, gpu[k]))
        flat = self.row * self.index(len(gpus))
        flat += self.col
        present = np.zeros(cells, dtype=bool)
        present[flat] = True
        if int(present.sum()) != len(flat):
            raise _duplicate(keys, gpus, flat, what)  # type: ignore[misc]
        self.present: np.ndarray | None = present
        self.dst = np.empty(0, dtype=self.index)
        self.n, self.order = 0, "F"

    def keep(
        self, keep: np.ndarray, kept_row: np.ndarray, n: int, g: int, order: str = "F"
    ) -> None:
        """Positions in the kept matrices of ``n`` iterations (``kept_row``: each kept
        iteration's row there), in ``order`` (F: column-major, C: row-major); rows of a
        dropped iteration go to the spare cell."""
        self.n, self.order = n, order
        row, col = self.row, self.col
        del self.row, self.col
        dst = row if keep.all() else kept_row[row].astype(self.index)
        dst = col * self.index(n) + dst if order == "F" else dst * self.index(g) + col
        if not keep.all():
            dst[~keep[row]] = n * g
        self.dst = dst

    def place(self, chunks: list[np.ndarray], g: int, fill: Any, dtype: type) -> np.ndarray:
        """The chunks' values (one per row) as a kept [n, g] matrix, ``fill`` where none."""
        out = np.full(self.n * g + 1, fill, dtype=dtype)  # + the spare cell
        dst, lo = self.dst, 0
        for chunk in chunks:
            out[dst[lo : lo + len(chunk)]] = chunk
            lo += len(chunk)
        return out[: self.n * g].reshape((self.n, g), order=self.order)

    def seconds(self, chunks: list[np.ndarray], origin_ns: int, g: int) -> np.ndarray:
        """Timestamps (ns) as float seconds since ``origin_ns``, placed. A cell without a
        row holds a meaningless number: callers mark those (NaN) or have none."""
        ticks = self.place(chunks, g, 0, np.int64)
        flat = ticks.reshape(-1, order=self.order)
        flat -= origin_ns  # exact in int64, so the same as subtracting before placing
        out = flat.astype(np.float64)
        del ticks, flat
        out /= 1e9
        return out.reshape((self.n, g), order=self.order)


def _optional(table: TableColumns, name: str, rows: _Rows, g: int) -> np.ndarray | None:
    """An optional float column (``cpu_s``, ``runq_s``) as [N, G]; NaN where absent."""
    if name not in table:
        return None
    return rows.place(table.take(name, np.float64), g, np.nan, np.float64)


def _no_release() -> None:
    return None


def build_iteration_arrays(
    fetch: pa.Table | TableColumns,
    train: pa.Table | TableColumns,
    *,
    require_fetch: bool = True,
    origin_ns: int | None = None,
    order: str = "F",
    release: Callable[[], None] = _no_release,
) -> IterationArrays:
    """Pivot the fetch and training tables of one run into ``IterationArrays``.

    The GPU set is the union of the GPUs of both tables, so a GPU that lost all
    its training lines makes every iteration incomplete instead of vanishing.
    ``require_fetch=False`` (the ``stall-only`` model, docs/SPEC.md §4.3) keeps
    every iteration with a training record for every GPU; a cell without a
    fetch record then holds NaN start and duration and worker -1.
    ``origin_ns`` (default: the first fetch start) fixes the origin of the times, so
    that part of a run (``dsim watch``'s window) rounds exactly as the whole run does.
    ``order``: the memory layout of the [N, G] matrices, ``F`` (column-major: what the
    per-iteration kernel walks) or ``C`` (row-major: the pipeline kernel's inputs, which
    then take them without a copy); the values are the same.
    ``fetch`` and ``train`` given as ``TableColumns`` that alone hold their columns are
    consumed: each column is freed once placed, and ``release`` (``dsim.io.memory
    .release_freed``) is called then, so that the allocator hands its memory back before
    the next matrix is made.
    """
    f = fetch if isinstance(fetch, TableColumns) else TableColumns.of(fetch, "fetch")
    t = train if isinstance(train, TableColumns) else TableColumns.of(train, "training")
    del fetch, train  # a table given here is the caller's: only ``f`` and ``t`` let go
    for table, names in ((f, FETCH_COLUMNS), (t, TRAIN_COLUMNS)):
        for name in names:  # every column checked first: an error before any work
            table.check(name)
    stream = f.has_values(STREAM)

    f_key = _pair_keys(f.take("epoch", np.int32), f.take("iteration", np.int32))
    t_key = _pair_keys(t.take("epoch", np.int32), t.take("iteration", np.int32))
    release()
    keys = distinct(np.concatenate([distinct(f_key), distinct(t_key)]))  # no copy of both
    f_gpu, t_gpu = f.take("gpu", np.int32), t.take("gpu", np.int32)
    gpus = distinct(np.concatenate([distinct(c) for c in f_gpu + t_gpu] or [np.zeros(0, int)]))
    gpus = gpus.astype(np.int32)
    n, g = len(keys), len(gpus)

    f_rows = _Rows(keys, gpus, f_key, f_gpu, "fetch")
    del f_key, f_gpu
    t_rows = _Rows(keys, gpus, t_key, t_gpu, "training")
    del t_key, t_gpu
    release()
    f_present, t_present = f_rows.present, t_rows.present
    assert f_present is not None and t_present is not None
    fetch_ok = f_present.reshape(n, g).all(axis=1)
    train_ok = t_present.reshape(n, g).all(axis=1)
    keep = fetch_ok & train_ok if require_fetch else train_ok

    dropped = {
        MISSING_FETCH: int((~fetch_ok & train_ok).sum()) if require_fetch else 0,
        MISSING_TRAIN: int((fetch_ok & ~train_ok).sum()),
        MISSING_BOTH: int((~fetch_ok & ~train_ok).sum()),
    }
    dropped = {reason: count for reason, count in dropped.items() if count}

    f_start, t_start = f.take("start", np.int64), t.take("start", np.int64)
    if origin_ns is not None:
        origin_ns = int(origin_ns)
    elif sum(len(c) for c in f_start):
        origin_ns = min(int(c.min()) for c in f_start if len(c))
    else:  # no fetch record (a profiled run): the first arrival keeps arrivals precise
        have = [int(c.min()) for c in t_start if len(c)]
        origin_ns = min(have) if have and not require_fetch else 0
    kept = int(keep.sum())
    kept_row = np.cumsum(keep) - 1
    absent = None if require_fetch else ~f_present.reshape(n, g)[keep]
    f_rows.present = t_rows.present = f_present = t_present = None
    f_rows.keep(keep, kept_row, kept, g, order)
    t_rows.keep(keep, kept_row, kept, g, order)
    del kept_row
    # the two matrices that need a temporary first, while the others do not exist yet;
    # each column let go of (``release``) before the next matrix is made
    start = f_rows.seconds(f_start, origin_ns, g)
    del f_start
    release()
    arrival = t_rows.seconds(t_start, origin_ns, g)
    del t_start
    release()
    fetch_s = f_rows.place(f.take("fetch_s", np.float64), g, 0.0, np.float64)
    release()
    worker = f_rows.place(f.take("worker", np.int32), g, 0, np.int32)
    release()
    if absent is not None:
        start[absent] = np.nan
        fetch_s[absent] = np.nan
        worker[absent] = -1
    iteration_time = t_rows.place(t.take("iteration_s", np.float64), g, 0.0, np.float64)
    release()
    stall = t_rows.place(t.take("stall_s", np.float64), g, 0.0, np.float64)
    release()
    kept_keys = keys[keep]
    return IterationArrays(
        epoch=(kept_keys >> 32).astype(np.int32),
        iteration=((kept_keys & 0xFFFFFFFF) - 2**31).astype(np.int32),
        gpus=gpus,
        start=start,
        fetch=fetch_s,
        iteration_time=iteration_time,
        stall=stall,
        arrival=arrival,
        worker=worker,
        origin_ns=origin_ns,
        dropped=dropped,
        fetch_cpu=_optional(f, "cpu_s", f_rows, g),
        fetch_runq=_optional(f, "runq_s", f_rows, g),
        train_cpu=_optional(t, "cpu_s", t_rows, g),
        train_runq=_optional(t, "runq_s", t_rows, g),
        fetch_proc=_optional(f, PROC, f_rows, g),
        stream=stream,
    )
