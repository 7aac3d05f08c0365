"""Raw log lines in the format of docs/SPEC.md §1, written by hand for grammar tests."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from dsim.sources.rawlog.discover import RunSource

T0 = "2021-09-01 19:48:"
_BASE = dt.datetime(2021, 9, 1, 19, 0, 0)


def fetch_line(sec: str, gpu: int | None, worker: int, at: str, idx: int, prefix: str = "") -> str:
    rank = f"GPU: {gpu} " if gpu is not None else ""
    body = f"{rank}worker_id: {worker}, END FETCH at_time {at} data idx{idx}"
    return f"{prefix}{T0}{sec} DEBUG:\t{body}"


def train_line(
    sec: str,
    gpu: int | None,
    epoch: int,
    it: int,
    n: int = 3,
    time: str = "0.9",
    data: str = "0.1",
    prefix: str = "",
    tp: str | None = "50.0",
) -> str:
    rank = f"GPU: {gpu} " if gpu is not None else ""
    tail = f"\tThroughput {tp} ({tp})" if tp is not None else ""
    return (
        f"{prefix}{T0}{sec} {rank}Epoch: [{epoch}][{it:>3}/{n}]\t"
        f"Time {time} ({time})\tData {data} ({data}){tail}"
    )


def run_of(
    tmp_path: Path, files: dict[str, list[str]], newline: str = "\n", final_newline: bool = True
) -> RunSource:
    paths = []
    for name, lines in files.items():
        path = tmp_path / name
        text = newline.join(lines) + (newline if final_newline and lines else "")
        path.write_bytes(text.encode())
        paths.append(path)
    return RunSource("run", tuple(paths))


def one_epoch(gpus=(0, 1), iters=3, epoch=0, base=10) -> list[str]:
    lines = []
    for i in range(iters):
        for g in gpus:
            lines.append(fetch_line(f"{base + i:02d}.5", g, i % 2, "1.25", i))
            lines.append(train_line(f"{base + i:02d}.75", g, epoch, i))
    return lines


def stamp(seconds: float) -> str:
    """The timestamp ``seconds`` after 2021-09-01 19:00:00, with microseconds."""
    return (_BASE + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S.%f")


def timed_lines(gpus=2, iters=30, epochs=2, workers=3, shift=None) -> list[tuple[tuple, str]]:
    """A long valid log as ``((kind, epoch, iteration, gpu), text)`` per line, one iteration a
    second; ``shift`` adds seconds to the clock of the lines it names by that key."""
    shift = shift or {}
    out = []
    for e in range(epochs):
        for i in range(iters):
            k = e * iters + i
            for g in range(gpus):
                key = ("fetch", e, i, g)
                end = stamp(100 + k + 0.3 + 0.01 * g + shift.get(key, 0))
                body = f"worker_id: {i % workers}, END FETCH at_time 0.25 data idx{i}"
                out.append((key, f"{end} DEBUG:\tGPU: {g} {body}"))
            for g in range(gpus):
                key = ("train", e, i, g)
                start = stamp(100 + k + 0.6 + 0.01 * g + shift.get(key, 0))
                body = f"Epoch: [{e}][{i:>3}/{iters}]\tTime 1.0 (1.0)\tData 0.2 (0.2)"
                out.append((key, f"{start} GPU: {g} {body}"))
    return out
