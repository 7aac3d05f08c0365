"""Synthetic raw logs from a queueing model of DDP data loading.

Tests, benchmarks and demos need raw logs of any size whose ground truth is
known exactly; real logs are few, small and cannot be shipped. This module
models what produces the timing in a real log and prints it in the raw log
format of DESIGN.md §1, so that every later step (parse, replay, summary) can
be exercised on it.

The model, per epoch (one fresh DataLoader iterator per epoch, as in PyTorch
without persistent workers), for every rank r and batch i:

- batch i goes to worker ``i mod W``; the loader hands a worker index i only
  once batch ``i - W·P`` has been consumed by training (the prefetch window of
  P batches per worker); a worker builds its batches one after the other:
  ``fetch_start[i] = max(fetch_end[i - W], train_start[i - W·P])``;
- fetch durations are lognormal (mean, coefficient of variation), slower on
  higher ranks by ``1 + skew · r / (G - 1)``, and with probability
  ``straggler_prob`` multiplied by ``straggler_factor``;
- training of iteration i starts when its batch is ready and iteration i-1
  has finished: ``train_start[i] = max(fetch_end[i], end[i - 1])``; the wait
  is the stall (``Data``);
- compute takes ``compute`` seconds, then a synchronising all-reduce makes
  every rank finish at ``end[i] = max_r train_start[i] + compute + allreduce``;
  ``Time`` is ``end[i] - end[i - 1]``, the same on every rank.

All times are integer microseconds (the resolution of the printed
timestamps), so the printed values are exact and a parse round trip gives
back the model's numbers. Both recurrences are max-plus linear, which lets a
whole prefetch window of W·P iterations be solved at once with cumulative
sums and maxima; only the windows are a Python loop. Lines are formatted
column-wise into byte matrices (no per-line Python), merged in exact time
order and streamed to disk chunk by chunk, so memory stays bounded whatever
the number of lines. Output is byte-identical for a given seed: each random
stream is drawn in one fixed order that does not depend on the chunking.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dsim.atomic import atomic_dir
from dsim.errors import OutputError, UsageError

US_PER_S = 1_000_000
_US_PER_DAY = 86_400 * US_PER_S
_UNIX_EPOCH = dt.datetime(1970, 1, 1)

SINGLE_FILE = "output.log"
_RANK_FILE = re.compile(r"^rank\d+\.log$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]*$")

# Lines per chunk: large enough that NumPy's per-call overhead vanishes, small
# enough that a chunk's byte matrices stay a few tens of MB.
_CHUNK_LINES = 65_536


@dataclass(frozen=True)
class SynthParams:
    """Everything that determines a synthetic run; equal params give identical bytes."""

    gpus: int
    iterations: int  # per epoch
    epochs: int
    workers: int  # DataLoader workers per rank
    prefetch: int = 2  # batches in flight per worker (PyTorch's prefetch_factor)
    seed: int = 0
    fetch_mean_s: float = 1.0  # mean time for one worker to build one batch
    fetch_cv: float = 0.2  # coefficient of variation of the fetch time
    skew: float = 0.0  # the last rank's fetches are (1 + skew) times slower than rank 0's
    straggler_prob: float = 0.01
    straggler_factor: float = 4.0
    compute_s: float = 0.25  # forward + backward per iteration
    allreduce_s: float = 0.02
    batch_size: int = 256  # samples per rank and iteration (for Throughput)
    name: str | None = None
    per_rank: bool = False  # one rank<N>.log per rank instead of one interleaved output.log
    start: dt.datetime = dt.datetime(2021, 9, 1, 0, 0, 0)

    @property
    def run_name(self) -> str:
        """The run directory's name; the default follows the naming scheme of DESIGN.md §2."""
        if self.name is not None:
            return self.name
        return (
            f"synth_queue_seed{self.seed}_gpus{self.gpus}_epoch{self.epochs}"
            f"_b{self.batch_size * self.gpus}_worker{self.workers}_thread0"
        )

    @property
    def lines(self) -> int:
        """Lines the run will have: one fetch and one training line per rank and iteration."""
        return 2 * self.gpus * self.iterations * self.epochs

    def validate(self) -> None:
        """Refuse impossible parameters before anything is written."""
        for field_name, minimum in (
            ("gpus", 1),
            ("iterations", 1),
            ("epochs", 1),
            ("workers", 1),
            ("prefetch", 1),
            ("batch_size", 1),
            ("seed", 0),
        ):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise UsageError(
                    f"{_option(field_name)} must be an integer >= {minimum}, got {value}"
                )
        for field_name, low, low_open, high in (
            ("fetch_mean_s", 0.0, True, None),
            ("fetch_cv", 0.0, False, None),
            ("skew", 0.0, False, None),
            ("straggler_prob", 0.0, False, 1.0),
            ("straggler_factor", 1.0, False, None),
            ("compute_s", 0.0, True, None),
            ("allreduce_s", 0.0, False, None),
        ):
            value = getattr(self, field_name)
            bad = not isinstance(value, int | float) or not math.isfinite(value)
            bad = bad or (value <= low if low_open else value < low)
            bad = bad or (high is not None and value > high)
            if bad:
                bound = f"> {low}" if low_open else f">= {low}"
                if high is not None:
                    bound += f" and <= {high}"
                raise UsageError(
                    f"{_option(field_name)} must be a finite number {bound}, got {value}"
                )
        if self.batch_size > 10**7:
            raise UsageError(f"--batch-size must be at most 10000000, got {self.batch_size}")
        if round(self.fetch_mean_s * US_PER_S) < 1 or round(self.compute_s * US_PER_S) < 1:
            raise UsageError("--fetch-mean and --compute must be at least 1 microsecond")
        slowest = self.fetch_mean_s * (1 + self.skew) * self.straggler_factor * 10
        if self.iterations * self.epochs * (slowest + self.compute_s + self.allreduce_s) > 3e10:
            raise UsageError("this run would last for centuries; lower the times or the size")
        if self.name is not None and (_NAME.match(self.name) is None or len(self.name) > 200):
            raise UsageError(
                f"--name {self.name!r} is not a valid run name: use letters, digits and . _ + = - "
                "(no path separators, not starting with '.')"
            )


def _option(field_name: str) -> str:
    return "--" + field_name.removesuffix("_s").replace("_", "-")


@dataclass(frozen=True)
class Chunk:
    """Consecutive iterations of one epoch as the model computed them (times in µs since 1970).

    Arrays are [L] per iteration or [L, G] per iteration and rank.
    """

    epoch: int
    iteration: np.ndarray  # [L] batch index within the epoch
    fetch_us: np.ndarray  # [L, G] fetch duration (END FETCH at_time)
    fetch_end_us: np.ndarray  # [L, G] fetch end (fetch line timestamp)
    train_start_us: np.ndarray  # [L, G] batch arrival (training line timestamp)
    stall_us: np.ndarray  # [L, G] Data
    time_us: np.ndarray  # [L] Time (equal on every rank)


# --------------------------------------------------------------------------- model


def _fetch_scale(params: SynthParams) -> np.ndarray:
    """Mean fetch time per rank in µs: rank skew grows linearly from rank 0 to the last rank."""
    ranks = np.arange(params.gpus, dtype=np.float64)
    slope = params.skew / (params.gpus - 1) if params.gpus > 1 else 0.0
    return params.fetch_mean_s * US_PER_S * (1.0 + slope * ranks)


def _draw_fetch(
    params: SynthParams,
    scale: np.ndarray,
    normal: np.random.Generator,
    uniform: np.random.Generator,
) -> Callable[[int], np.ndarray]:
    """Return ``draw(L) -> [L, G] µs``; each stream is consumed row by row, so chunking is moot."""
    sigma = math.sqrt(math.log1p(params.fetch_cv**2))
    mu = -0.5 * sigma * sigma  # keeps the mean at ``scale``
    gpus = params.gpus

    def draw(rows: int) -> np.ndarray:
        if sigma == 0.0:
            factor = np.ones((rows, gpus))
        else:
            factor = np.exp(mu + sigma * normal.standard_normal((rows, gpus)))
        if params.straggler_prob > 0.0:
            slow = uniform.random((rows, gpus)) < params.straggler_prob
            factor = np.where(slow, factor * params.straggler_factor, factor)
        return np.rint(factor * scale).astype(np.int64)

    return draw


def simulate(params: SynthParams, chunk_iterations: int | None = None) -> Iterator[Chunk]:
    """Yield the model's timeline chunk by chunk, epoch after epoch (pure; no I/O).

    ``chunk_iterations`` only changes how the work is cut, never the values.
    """
    params.validate()
    g, n, w, p = params.gpus, params.iterations, params.workers, params.prefetch
    window = w * p
    if chunk_iterations is None:
        chunk_iterations = max(1, _CHUNK_LINES // (2 * g))
    # A chunk is a whole number of prefetch windows, so a window never straddles two chunks.
    chunk = window * max(1, -(-chunk_iterations // window))
    step_us = round(params.compute_s * US_PER_S) + round(params.allreduce_s * US_PER_S)
    normal_seed, uniform_seed = np.random.SeedSequence(params.seed).spawn(2)
    draw = _draw_fetch(
        params,
        _fetch_scale(params),
        np.random.Generator(np.random.PCG64(normal_seed)),
        np.random.Generator(np.random.PCG64(uniform_seed)),
    )
    t0 = _to_us(params.start)
    k = np.arange(window, dtype=np.int64)
    k_step, k1_step = k * step_us, (k + 1) * step_us
    for epoch in range(params.epochs):
        # State carried between windows: each worker's last fetch end, the previous
        # window's training starts (they release the next window's indices), last end.
        worker_free = np.full((w, g), t0, dtype=np.int64)
        released = np.full((p, w, g), t0, dtype=np.int64)
        end_prev = t0
        for c0 in range(0, n, chunk):
            rows = min(n, c0 + chunk) - c0
            windows = -(-rows // window)
            # Padded to whole windows; the padding (zero fetches) is computed and cut off.
            fetch = np.zeros((windows * window, g), dtype=np.int64)
            fetch[:rows] = draw(rows)
            f4 = fetch.reshape(windows, p, w, g)
            cum = np.add.accumulate(f4, axis=1)  # per worker, within each window
            cum_before = cum - f4
            fetch_end = np.empty((windows, p, w, g), dtype=np.int64)
            train_start = np.empty((windows, window, g), dtype=np.int64)
            ends = np.empty(windows * window + 1, dtype=np.int64)  # ends[j] = end of row j - 1
            ends[0] = end_prev
            for b in range(windows):
                # Per worker: fe_j = max(fe_{j-1}, released_j) + F_j, solved by cumulative ops.
                lead = np.maximum.accumulate(released - cum_before[b], axis=0)
                fe = fetch_end[b]
                np.add(cum[b], np.maximum(lead, worker_free, out=lead), out=fe)
                # end_i = max(max_r fe_i, end_{i-1}) + step, solved the same way.
                e = ends[b * window + 1 : (b + 1) * window + 1]
                np.maximum.accumulate(fe.reshape(window, g).max(axis=1) - k_step, out=e)
                np.maximum(e, ends[b * window], out=e)
                e += k1_step
                ts = train_start[b]
                np.maximum(fe.reshape(window, g), ends[b * window : (b + 1) * window, None], out=ts)
                worker_free = fe[-1]
                released = ts.reshape(p, w, g)
            end_before = ends[:rows]
            train = train_start.reshape(-1, g)[:rows]
            end_prev = int(ends[rows])
            yield Chunk(
                epoch=epoch,
                iteration=np.arange(c0, c0 + rows, dtype=np.int64),
                fetch_us=fetch[:rows],
                fetch_end_us=fetch_end.reshape(-1, g)[:rows],
                train_start_us=train,
                stall_us=train - end_before[:, None],
                time_us=ends[1 : rows + 1] - end_before,
            )
        t0 = end_prev  # the next epoch's loader starts when this epoch's last step ends


def _to_us(moment: dt.datetime) -> int:
    delta = moment.replace(tzinfo=None) - _UNIX_EPOCH
    return (delta.days * 86_400 + delta.seconds) * US_PER_S + delta.microseconds


# ---------------------------------------------------------------------- formatting

# Four ASCII digits per table entry, read back as one uint32: converting a number
# costs one division per four digits instead of one per digit.
_DIGITS4 = np.array([f"{i:04d}".encode() for i in range(10_000)], dtype="S4").view(np.uint32)


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """[n] non-negative ints -> [n, width] ASCII digits, zero-padded on the left."""
    groups = -(-width // 4)
    quads = np.empty((values.shape[0], groups), dtype=np.uint32)
    v = values.astype(np.int64, copy=True)
    for group in range(groups - 1, -1, -1):
        quads[:, group] = _DIGITS4[v % 10_000]
        v //= 10_000
    return quads.view(np.uint8).reshape(values.shape[0], 4 * groups)[:, 4 * groups - width :]


def _width(values: np.ndarray) -> int:
    top = int(values.max()) if values.size else 0
    return max(1, len(str(top)))


class _Lines:
    """Builds n lines column by column as a byte matrix plus a mask of the bytes to keep.

    Compressing ``matrix[mask]`` in row-major order concatenates the lines, so
    variable-width fields cost no per-line Python. Constant text is written
    once into a template row; only the number columns are written per line.
    """

    def __init__(self, n: int):
        self.n = n
        self.width = 0
        self.template: list[bytes] = []
        # (first column, digits [n, w], shown [n, w] or None)
        self.fields: list[tuple[int, np.ndarray, np.ndarray | None]] = []

    def text(self, text: str) -> None:
        raw = text.encode("ascii")
        self.template.append(raw)
        self.width += len(raw)

    def _put(self, digits: np.ndarray, shown: np.ndarray | None) -> None:
        self.fields.append((self.width, digits, shown))
        self.template.append(b"\0" * digits.shape[1])
        self.width += digits.shape[1]

    def uint(self, values: np.ndarray, pad_to: int | None = None) -> None:
        """Decimal integer; with ``pad_to``, right-aligned in that many columns with spaces."""
        width = max(_width(values), pad_to or 1)
        self._integer(values, _digits(values, width), pad_to is not None)

    def _integer(self, values: np.ndarray, digits: np.ndarray, pad: bool) -> None:
        """Put ``digits`` of ``values`` without their leading zeros (dropped or blanked)."""
        width = digits.shape[1]
        if width == 1:
            self._put(digits, None)
            return
        powers = 10 ** np.arange(width - 1, 0, -1, dtype=np.int64)
        hidden = np.zeros((self.n, width), dtype=bool)
        hidden[:, :-1] = values[:, None] < powers
        if pad:
            digits = digits.copy()
            digits[hidden] = ord(" ")
            self._put(digits, None)
        else:
            self._put(digits, ~hidden)

    def fixed(self, values: np.ndarray, decimals: int) -> None:
        """Fixed-point number given as integer units of 10**-decimals."""
        whole = values // 10**decimals
        width = _width(whole)
        digits = _digits(values, width + decimals)  # one conversion for both parts
        self._integer(whole, digits[:, :width], pad=False)
        self.text(".")
        self._put(digits[:, width:], None)

    def timestamp(self, us: np.ndarray) -> None:
        """``YYYY-mm-dd HH:MM:SS.ffffff`` from µs since 1970; dates come from a per-day table."""
        days = us // _US_PER_DAY
        first = int(days.min())
        table = np.array(
            [
                (_UNIX_EPOCH + dt.timedelta(days=first + d)).strftime("%Y-%m-%d ").encode()
                for d in range(int(days.max()) - first + 1)
            ]
        )
        self._put(table.view(np.uint8).reshape(-1, 11)[days - first], None)
        tod = us - days * _US_PER_DAY
        seconds = tod // US_PER_S
        hhmmss = seconds // 3600 * 10_000 + seconds // 60 % 60 * 100 + seconds % 60
        clock = _digits(hhmmss * US_PER_S + tod % US_PER_S, 12)
        self._put(clock[:, :2], None)
        self.text(":")
        self._put(clock[:, 2:4], None)
        self.text(":")
        self._put(clock[:, 4:6], None)
        self.text(".")
        self._put(clock[:, 6:], None)

    def build(self, matrix: np.ndarray, mask: np.ndarray) -> None:
        """Fill ``matrix`` and ``mask`` [n, >= width]; columns past this width are dropped."""
        template = np.frombuffer(b"".join(self.template), dtype=np.uint8)
        matrix[:, : self.width] = template
        mask[:, : self.width] = True
        mask[:, self.width :] = False
        for col, digits, shown in self.fields:
            span = digits.shape[1]
            matrix[:, col : col + span] = digits
            if shown is not None:
                mask[:, col : col + span] = shown


def _fetch_lines(ev: dict[str, np.ndarray]) -> _Lines:
    lines = _Lines(ev["time"].shape[0])
    lines.timestamp(ev["time"])
    lines.text(" DEBUG:\tGPU: ")
    lines.uint(ev["rank"])
    lines.text(" worker_id: ")
    lines.uint(ev["worker"])
    lines.text(", END FETCH at_time ")
    lines.fixed(ev["fetch"], 6)
    lines.text(" data idx")
    lines.uint(ev["iteration"])
    lines.text("\n")
    return lines


def _train_lines(ev: dict[str, np.ndarray], iterations: int) -> _Lines:
    lines = _Lines(ev["time"].shape[0])
    lines.timestamp(ev["time"])
    lines.text(" GPU: ")
    lines.uint(ev["rank"])
    lines.text(" Epoch: [")
    lines.uint(ev["epoch"])
    lines.text("][")
    lines.uint(ev["iteration"], pad_to=len(str(iterations)))
    lines.text(f"/{iterations}]\tTime ")
    lines.fixed(ev["step"], 6)
    lines.text(" (")
    lines.fixed(ev["step_avg"], 6)
    lines.text(")\tData ")
    lines.fixed(ev["stall"], 6)
    lines.text(" (")
    lines.fixed(ev["stall_avg"], 6)
    lines.text(")\tThroughput ")
    lines.fixed(ev["throughput"], 3)
    lines.text(" (")
    lines.fixed(ev["throughput_avg"], 3)
    lines.text(")\n")
    return lines


# ------------------------------------------------------------------------ events


Events = dict[str, np.ndarray]


def _take(ev: Events, rows: np.ndarray) -> Events:
    return {key: value[rows] for key, value in ev.items()}


def _concat(a: Events | None, b: Events) -> Events:
    if a is None:
        return b
    return {key: np.concatenate([a[key], b[key]]) for key in b}


class _Averages:
    """Running means per epoch, as the training loop's AverageMeter prints them in parentheses."""

    def __init__(self, gpus: int):
        self.gpus = gpus
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.step = 0
        self.throughput = 0
        self.stall = np.zeros(self.gpus, dtype=np.int64)

    def update(self, chunk: Chunk, throughput: np.ndarray) -> tuple[np.ndarray, ...]:
        count = self.count + np.arange(1, chunk.time_us.shape[0] + 1, dtype=np.int64)
        step = self.step + np.cumsum(chunk.time_us)
        thr = self.throughput + np.cumsum(throughput)
        stall = self.stall + np.cumsum(chunk.stall_us, axis=0)
        self.count, self.step, self.throughput = int(count[-1]), int(step[-1]), int(thr[-1])
        self.stall = stall[-1].copy()

        def mean(total: np.ndarray, n: np.ndarray) -> np.ndarray:
            return (2 * total + n) // (2 * n)  # round half up, in integers

        return mean(step, count), mean(thr, count), mean(stall, count[:, None])


def _chunk_events(chunk: Chunk, params: SynthParams, averages: _Averages) -> tuple[Events, Events]:
    """A chunk's fetch and training lines as flat columns (row-major over [iteration, rank])."""
    length, g = chunk.fetch_us.shape
    iteration = np.repeat(chunk.iteration, g)
    rank = np.tile(np.arange(g, dtype=np.int64), length)
    # Throughput in thousandths of samples/s, rounded half up.
    throughput = (2_000 * params.batch_size * US_PER_S // chunk.time_us + 1) // 2
    step_avg, thr_avg, stall_avg = averages.update(chunk, throughput)
    fetch = {
        "time": chunk.fetch_end_us.ravel(),
        "rank": rank,
        "iteration": iteration,
        "worker": iteration % params.workers,
        "fetch": chunk.fetch_us.ravel(),
    }
    train = {
        "time": chunk.train_start_us.ravel(),
        "rank": rank,
        "iteration": iteration,
        "epoch": np.full(length * g, chunk.epoch, dtype=np.int64),
        "step": np.repeat(chunk.time_us, g),
        "step_avg": np.repeat(step_avg, g),
        "stall": chunk.stall_us.ravel(),
        "stall_avg": stall_avg.ravel(),
        "throughput": np.repeat(throughput, g),
        "throughput_avg": np.repeat(thr_avg, g),
    }
    return fetch, train


def _render(fetch: Events, train: Events, iterations: int) -> tuple[np.ndarray, np.ndarray, Events]:
    """Format both kinds of lines, ordered by time (ties: fetch first, then input order).

    Each kind arrives in (iteration, rank) order, so a stable sort by time alone
    gives one deterministic order whatever the chunking; the input is nearly
    sorted already, which the stable sort handles in about linear time.
    """
    kinds = []
    if fetch["time"].size:
        kinds.append(_fetch_lines(fetch))
    if train["time"].size:
        kinds.append(_train_lines(train, iterations))
    width = max(lines.width for lines in kinds)
    total = sum(lines.n for lines in kinds)
    matrix = np.empty((total, width), dtype=np.uint8)
    mask = np.empty((total, width), dtype=bool)
    row = 0
    for lines in kinds:
        lines.build(matrix[row : row + lines.n], mask[row : row + lines.n])
        row += lines.n
    keys = {k: np.concatenate([fetch[k], train[k]]) for k in ("time", "rank")}
    order = np.argsort(keys["time"], kind="stable")
    row_type = np.dtype((np.void, width))
    matrix = matrix.view(row_type).ravel()[order].view(np.uint8).reshape(total, width)
    mask = mask.view(np.uint8).view(row_type).ravel()[order].view(bool).reshape(total, width)
    return matrix, mask, _take(keys, order)


# ------------------------------------------------------------------------ output


def _check_target(target: Path) -> None:
    """Replace only what an earlier ``dsim synth`` wrote; never a user's other files."""
    if not target.exists() and not target.is_symlink():
        return
    if not target.is_dir() or target.is_symlink():
        raise UsageError(f"{target} exists and is not a directory; choose another --name or --out")
    foreign = [p.name for p in target.iterdir() if not _is_log_name(p.name) or not p.is_file()]
    if foreign:
        shown = ", ".join(sorted(foreign)[:3])
        raise UsageError(
            f"{target} exists and holds files dsim synth did not write ({shown}); "
            "choose another --name or --out"
        )


def _is_log_name(name: str) -> bool:
    return name == SINGLE_FILE or _RANK_FILE.match(name) is not None


def check_output(params: SynthParams, out_dir: str | Path) -> Path:
    """Validate params and the destination; return the run directory that will be written."""
    params.validate()
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} exists and is not a directory")
    target = out_dir / params.run_name
    _check_target(target)
    return target


def synthesize(
    params: SynthParams,
    out_dir: str | Path,
    *,
    progress: Callable[[int, int], None] | None = None,
    chunk_iterations: int | None = None,
) -> Path:
    """Write the run ``<out_dir>/<run_name>/`` atomically and return its path.

    ``progress(done, total)`` is called with iterations done (over all epochs).
    Memory is bounded by one chunk plus the lines still waiting for their turn
    (at most one prefetch window per rank), whatever the run's length.
    """
    target = check_output(params, out_dir)
    total = params.iterations * params.epochs
    done = 0
    averages = _Averages(params.gpus)
    try:
        with atomic_dir(target) as tmp:
            names = (
                [f"rank{r}.log" for r in range(params.gpus)] if params.per_rank else [SINGLE_FILE]
            )
            files = [open(tmp / name, "wb") for name in names]  # noqa: SIM115 - closed below
            try:
                for fetch, train in _ordered(params, averages, chunk_iterations):
                    matrix, mask, keys = _render(fetch, train, params.iterations)
                    if params.per_rank:
                        for r, handle in enumerate(files):
                            rows = keys["rank"] == r
                            handle.write(matrix[rows][mask[rows]].tobytes())
                    else:
                        files[0].write(matrix[mask].tobytes())
                    if progress is not None:
                        done = min(total, done + _released_iterations(train, params))
                        progress(done, total)
            finally:
                for handle in files:
                    handle.close()
    except OSError as exc:  # e.g. disk full while writing inside the temporary directory
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from exc
    if progress is not None:
        progress(total, total)
    return target


def _released_iterations(train: Events, params: SynthParams) -> int:
    return int(train["time"].shape[0] // params.gpus)


def _ordered(
    params: SynthParams, averages: _Averages, chunk_iterations: int | None
) -> Iterator[tuple[Events, Events]]:
    """Yield batches of events such that concatenating them gives exact time order.

    After a chunk ending at iteration b, no later event can be earlier than the
    training start of iteration b - W·P on any rank: every later fetch starts
    only after that batch was consumed, and training is monotone. Events before
    that watermark are final; the rest wait for the next chunk. An epoch's
    last event precedes the next epoch's first, so epochs flush completely.
    """
    window = params.workers * params.prefetch
    pending_fetch: Events | None = None
    pending_train: Events | None = None
    last_epoch = 0
    for chunk in simulate(params, chunk_iterations):
        if chunk.epoch != last_epoch:
            averages.reset()
            last_epoch = chunk.epoch
        fetch, train = _chunk_events(chunk, params, averages)
        fetch = _concat(pending_fetch, fetch)
        train = _concat(pending_train, train)
        end = int(chunk.iteration[-1]) + 1
        if end == params.iterations:
            pending_fetch = pending_train = None
            yield fetch, train
            continue
        mark_row = end - window - int(chunk.iteration[0])
        watermark = int(chunk.train_start_us[mark_row].min()) if mark_row >= 0 else -1
        f_now = fetch["time"] < watermark
        t_now = train["time"] < watermark
        pending_fetch, pending_train = _take(fetch, ~f_now), _take(train, ~t_now)
        if f_now.any() or t_now.any():
            yield _take(fetch, f_now), _take(train, t_now)
