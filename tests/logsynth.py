"""A small writer of valid raw DDP logs whose records are known, for parser tests.

``dsim.synth`` models the timing of a real run; this module does the opposite
job: it exercises the *spelling* of the log format (docs/SPEC.md §1) as widely as
the format allows -- prefixes, tabs or spaces, CRLF, 1 to 9 fraction digits,
optional ``GPU:`` fields, START FETCH and unrelated lines, per-rank files,
training lines printed late -- while keeping every record that the parser must
find in a plain list, so that a test can compare the parse with the truth.

Lines are produced by per-process streams (one per DataLoader worker and one
per training loop) and merged the way a shared terminal or log file merges
them: each stream keeps its own order, streams interleave by jittered write
time. Times are chosen so that the records are unambiguous under the rules of
docs/SPEC.md §1: fetch ends strictly increase per (rank, worker) but not with the
batch index, training starts strictly increase per rank, a training line
starts after its batch's fetch ended, ``Data`` is at most ``Time``, and a
rank's next epoch fetches start ``EPOCH_GAP_NS`` after its previous epoch's
last training line, so the epoch of every fetch has one right answer
(``dsim.sources.rawlog.epochs``).
"""

from __future__ import annotations

import datetime as dt
import heapq
import random
from dataclasses import dataclass
from pathlib import Path

NS = 1_000_000_000
EPOCH_GAP_NS = 10_000_000  # from a rank's last training line of an epoch to its next fetches
_EPOCH_1970 = dt.datetime(1970, 1, 1)

OTHER_TEXTS = (
    "=> creating model 'resnet50'",
    "Test: [ 0/196]\tTime 0.512 (0.512)\tLoss 0.91 (0.91)\tAcc@1 76.0 (76.0)",
    " * Acc@1 76.130 Acc@5 92.862",
    "INFO:root:saving checkpoint to model_best.pth.tar",
    "Epoch 1 done, lr=0.1",
    "worker_id: 3 started",
    "{ts} INFO: GPU: {gpu} all-reduce bucket ready",
    "{ts} DEBUG:\tGPU: {gpu} worker_id: 0, fetched data idx4",
    "Warning: Leaking Caller Ids",
)


@dataclass(frozen=True)
class LogSpec:
    """The shape of a log; values inside it come from a seeded ``random.Random``."""

    gpus: int
    iterations: tuple[int, ...]  # per epoch; len() is the number of epochs
    workers: int
    first_epoch: int = 0
    per_rank_files: bool = False
    omit_gpu: str = "never"  # "never" | "always" | "sometimes"; only where the rank is implied
    crlf: bool = False
    start_lines: bool = False
    other_lines: bool = False
    blank_lines: bool = False
    late_training: float = 0.0  # chance that a rank prints an epoch's training lines after it
    jitter_s: float = 0.0  # how far write order may stray from time order between streams
    throughput: str = "always"  # "always" | "never" | "sometimes"
    prefixes: bool = False


@dataclass
class WrittenLog:
    """What was written: the path to parse, every record, and the counts of other lines."""

    path: Path
    fetch: list[tuple[int, int, int, int, int, float]]  # epoch, iter, gpu, worker, end ns, fetch_s
    train: list[tuple[int, int, int, int, float, float, float | None]]  # epoch, iter, gpu, start..
    lines: int
    start_fetch_lines: int
    other_lines: int
    blank_lines: int


def timestamp(ns: int, digits: int) -> str:
    """``YYYY-mm-dd HH:MM:SS.fff`` with ``digits`` fraction digits; ``ns`` must fit them exactly."""
    seconds, frac = divmod(ns, NS)
    assert frac % 10 ** (9 - digits) == 0, "time not representable with these digits"
    wall = _EPOCH_1970 + dt.timedelta(seconds=seconds)
    return f"{wall:%Y-%m-%d %H:%M:%S}.{frac:09d}"[: 20 + digits]


class _Clock:
    """Strictly increasing times, each a multiple of the unit of its own fraction digits."""

    def __init__(self, rng: random.Random, start_ns: int):
        self.rng = rng
        self.now = start_ns

    def after(self, earliest_ns: int, mean_gap_s: float) -> tuple[int, int]:
        digits = self.rng.randint(1, 9)
        unit = 10 ** (9 - digits)
        gap = max(1, int(self.rng.expovariate(1 / mean_gap_s) * NS))
        target = max(earliest_ns, self.now) + gap
        value = -(-target // unit) * unit  # round up to the printable unit
        self.now = value
        return value, digits


def _value(rng: random.Random, high: float = 20.0) -> float:
    """A non-negative float in one of the spellings repr() produces."""
    kind = rng.randrange(5)
    if kind == 0:
        return rng.uniform(0.0, high)
    if kind == 1:
        return 10 ** rng.uniform(-7, 3)  # 1e-07 .. 1000: exponent and plain spellings
    if kind == 2:
        return float(rng.randint(0, 100))
    if kind == 3:
        return round(rng.uniform(0.0, high), rng.randint(0, 6))
    return 0.0 if rng.random() < 0.3 else rng.random()


def _sep(rng: random.Random) -> str:
    return rng.choice((" ", "\t", "  ", " \t"))


def _prefix(rng: random.Random, spec: LogSpec, rank: int) -> str:
    if not spec.prefixes:
        return ""
    return rng.choice(
        ("", f"(pid={rng.randint(1, 99999)}) ", f"[rank{rank}]:", f"[default{rank}]:",
         f"[rank{rank}]: ", "[stdout] ")
    )  # fmt: skip


def _fetch_line(rng, prefix, end_ns, digits, gpu_text, worker, fetch_s, idx) -> str:
    level = rng.choice(("DEBUG:\t", "DEBUG: ", "", "root DEBUG "))
    return (
        f"{prefix}{timestamp(end_ns, digits)}{rng.choice((' ', chr(9)))}{level}{gpu_text}"
        f"worker_id:{rng.choice((' ', ''))}{worker},{_sep(rng)}END FETCH{_sep(rng)}at_time"
        f"{_sep(rng)}{fetch_s!r}{_sep(rng)}data{_sep(rng)}idx{idx}{rng.choice(('', ' ', chr(9)))}"
    )


def _start_line(rng, prefix, end_ns, gpu_text, worker, idx) -> str:
    stamp = timestamp(end_ns - end_ns % NS, rng.randint(1, 9))
    return f"{prefix}{stamp} DEBUG:\t{gpu_text}worker_id: {worker}, START FETCH data idx{idx}"


def _train_line(rng, spec, prefix, record, digits, gpu_text, total) -> str:
    epoch, iteration, _gpu, start_ns, time_s, data_s, throughput = record
    width = len(str(total)) if rng.random() < 0.7 else 0
    avg = [repr(_value(rng)) for _ in range(3)]
    text = (
        f"{prefix}{timestamp(start_ns, digits)}{_sep(rng)}{gpu_text}Epoch:{rng.choice(('', ' '))}"
        f"[{epoch}][{iteration:>{width}}/{total}]{_sep(rng)}Time {time_s!r} ({avg[0]})"
        f"{_sep(rng)}Data {data_s!r} ({avg[1]})"
    )
    if throughput is not None:
        text += f"{_sep(rng)}Throughput {throughput!r} ({avg[2]})"
    return text


def _gpu_text(rng: random.Random, spec: LogSpec, rank: int) -> str:
    implied = spec.per_rank_files or spec.gpus == 1
    omit = implied and (
        spec.omit_gpu == "always" or (spec.omit_gpu == "sometimes" and rng.random() < 0.5)
    )
    return "" if omit else f"GPU:{rng.choice((' ', '', '  '))}{rank}{_sep(rng)}"


def _other_line(rng: random.Random, now_ns: int, rank: int) -> str:
    text = rng.choice(OTHER_TEXTS)
    return text.format(ts=timestamp(now_ns - now_ns % NS, 3), gpu=rank)


def _merge(streams: list[list[tuple[int, str]]], rng: random.Random, jitter_ns: int) -> list[str]:
    """Interleave streams by jittered write time; every stream keeps its own order."""
    heads: list[tuple[float, int, int]] = []

    def push(s: int, i: int) -> None:
        if i < len(streams[s]):
            key = streams[s][i][0] + rng.uniform(0, jitter_ns)
            heapq.heappush(heads, (key, s, i))

    for s in range(len(streams)):
        push(s, 0)
    out = []
    while heads:
        _, s, i = heapq.heappop(heads)
        out.append(streams[s][i][1])
        push(s, i + 1)
    return out


def write_log(spec: LogSpec, seed: int, directory: Path) -> WrittenLog:
    """Write the log described by ``spec`` under ``directory`` and return its truth."""
    rng = random.Random(seed)
    base = (dt.datetime(2000, 1, 1) - _EPOCH_1970) // dt.timedelta(seconds=1) * NS
    base += rng.randrange(30 * 365 * 86400) * NS
    fetch: list = []
    train: list = []
    counts = {"start": 0, "other": 0, "blank": 0}
    rank_streams: list[list[list[tuple[int, str]]]] = []
    # One job's pace, shared by its ranks: DDP ranks fetch and train together, so a
    # rank's timeline follows these ticks (its own clocks may run ahead, never behind).
    # Without it, ranks drifted apart like two jobs logged into one run (which dsim
    # refuses). Its own generator, so the lines' other random choices stay as they were.
    pace = random.Random(f"{seed}/pace")
    ticks: list[list[int]] = []
    epoch_ticks_start = [base]
    for total in spec.iterations:
        offsets, now = [], 0
        for _ in range(total):
            now += int(pace.expovariate(1 / 0.05) * NS)
            offsets.append(epoch_ticks_start[-1] + now)
        ticks.append(offsets)
        epoch_ticks_start.append(epoch_ticks_start[-1] + now + NS)

    for rank in range(spec.gpus):
        rank_start = base + rng.randrange(NS // 10)  # DDP ranks start together
        train_clock = _Clock(rng, rank_start)
        epoch_start = rank_start
        worker_streams: list[list[tuple[int, str]]] = [[] for _ in range(spec.workers)]
        worker_prefix = [_prefix(rng, spec, rank) for _ in range(spec.workers)]
        loop: list[tuple[int, str]] = []
        loop_prefix = _prefix(rng, spec, rank)
        for e, total in enumerate(spec.iterations):
            epoch = spec.first_epoch + e
            late = rng.random() < spec.late_training
            held: list[tuple[tuple, int, str]] = []
            # Workers build batches side by side: ends rise per worker, not with the index.
            worker_clocks = [_Clock(rng, epoch_start) for _ in range(spec.workers)]
            for i in range(total):
                worker = rng.randrange(spec.workers)
                end_ns, end_digits = worker_clocks[worker].after(ticks[e][i], 0.01)
                fetch_s = _value(rng)
                fetch.append((epoch, i, rank, worker, end_ns, fetch_s))
                line = _fetch_line(
                    rng, worker_prefix[worker], end_ns, end_digits,
                    _gpu_text(rng, spec, rank), worker, fetch_s, i,
                )  # fmt: skip
                if spec.start_lines and rng.random() < 0.5:
                    start = _start_line(
                        rng, worker_prefix[worker], end_ns, _gpu_text(rng, spec, rank), worker, i
                    )
                    worker_streams[worker].append((end_ns, start))
                    counts["start"] += 1
                worker_streams[worker].append((end_ns, line))

                start_ns, start_digits = train_clock.after(end_ns, 0.02)
                throughput = {"always": True, "never": False}.get(spec.throughput)
                if throughput is None:
                    throughput = rng.random() < 0.5
                time_s, data_s = sorted((_value(rng), _value(rng)), reverse=True)  # Data <= Time
                record = (
                    epoch, i, rank, start_ns, time_s, data_s,
                    _value(rng, 500.0) if throughput else None,
                )  # fmt: skip
                train.append(record)
                text = _train_line(
                    rng, spec, loop_prefix, record, start_digits, _gpu_text(rng, spec, rank), total
                )
                held.append((record, start_ns, text))
                if spec.other_lines and rng.random() < 0.1:
                    held.append((None, start_ns, _other_line(rng, start_ns, rank)))
                    counts["other"] += 1
                if spec.blank_lines and rng.random() < 0.05:
                    held.append((None, start_ns, rng.choice(("", " ", "\t"))))
                    counts["blank"] += 1
            epoch_end = max(train_clock.now, *(c.now for c in worker_clocks))
            # The next epoch's loader starts once this epoch's last iteration has run.
            epoch_start = max(epoch_end + EPOCH_GAP_NS, epoch_ticks_start[e + 1])
            for n, (_, start_ns, text) in enumerate(held):
                loop.append((epoch_end + n if late else start_ns, text))
        rank_streams.append([*worker_streams, loop])

    eol = "\r\n" if spec.crlf else "\n"
    jitter_ns = int(spec.jitter_s * NS)
    directory.mkdir(parents=True, exist_ok=True)
    if spec.per_rank_files:
        files = {f"rank{rank}.log": streams for rank, streams in enumerate(rank_streams)}
        path = directory
    else:
        name = rng.choice(("output.log", "train.log", "myrun.log"))
        files = {name: [s for streams in rank_streams for s in streams]}
        path = directory / name if rng.random() < 0.5 else directory
    lines = 0
    for name, streams in files.items():
        text = _merge(streams, rng, jitter_ns)
        lines += len(text)
        (directory / name).write_bytes("".join(t + eol for t in text).encode("utf-8"))
    return WrittenLog(
        path=path,
        fetch=fetch,
        train=train,
        lines=lines,
        start_fetch_lines=counts["start"],
        other_lines=counts["other"],
        blank_lines=counts["blank"],
    )
