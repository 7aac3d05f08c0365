"""What dsim.instrument does per batch in the training process, counted (issue 23).

Why counted rather than timed: the < 1 % overhead target is about the work the
instrumentation adds on the training loop's critical path, and timings on a
shared machine cannot pin that down, but the number of clock reads, schedstat
reads, writes and process-id look-ups per batch can. These tests fix the
budget that bench/bench_instrument.py's ``--compare`` measured: per batch of a
map-style loader without workers, two reads of the thread's CPU clock (the
fetch's start and end), one of the process's (the iteration's end), three of
schedstat, no ``getpid``, and the two lines (fetch, training) written in blocks
of about twenty, not with a ``write`` each (``dsim.instrument.sinks``).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsim.instrument import FileSink, cpu
from dsim.instrument.pid import current_pid

SCHEDSTAT = Path("/proc/thread-self/schedstat")


def _child_checks(path: str, sink: FileSink, results: Any) -> None:
    """In a forked child: its pid, its own schedstat descriptor, its own log descriptor."""
    fd = cpu._fd()
    own = os.stat("/proc/thread-self/schedstat")
    seen = os.fstat(fd) if fd is not None else None
    same = seen is not None and (seen.st_dev, seen.st_ino) == (own.st_dev, own.st_ino)
    sink.write("child\n")
    results.put(
        {
            "pid": current_pid() == os.getpid(),
            "schedstat": same,
            "sink": sink._pid == os.getpid(),
        }
    )


@pytest.mark.skipif(not SCHEDSTAT.exists(), reason="needs Linux's /proc/thread-self/schedstat")
def test_a_forked_child_knows_its_pid_and_reads_its_own_schedstat(tmp_path: Path) -> None:
    """The process id is cached (no getpid per line), so a fork must refresh it: else a
    DataLoader worker would read its parent thread's run-queue wait through the inherited
    descriptor and never notice it is a new process."""
    path = tmp_path / "rank0.log"
    sink = FileSink(path)
    sink.write("parent\n")
    assert cpu.thread_wait() is not None  # the parent's descriptor is open now
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_child_checks, args=(str(path), sink, results))
    child.start()
    got = results.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert got == {"pid": True, "schedstat": True, "sink": True}
    assert current_pid() == os.getpid()
    assert path.read_text() == "parent\nchild\n"


def test_each_line_is_in_the_file_when_write_returns(tmp_path: Path) -> None:
    """SPEC §1.2: lines are not buffered in the process, so a job killed right after a
    batch (SIGKILL, the OOM killer) has that batch's line on disk, and ``dsim watch``
    sees it at its next look."""
    path = tmp_path / "rank0.log"
    sink = FileSink(path)
    for i in range(3):
        sink.write(f"line {i}\n")
        assert path.read_text().splitlines()[-1] == f"line {i}"  # read by another descriptor


class _Calls:
    """Counts calls of module functions (os.getpid, time.thread_time, ...) while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, targets: dict[str, tuple[Any, str]]):
        self.counts: Counter[str] = Counter()
        for name, (module, attribute) in targets.items():
            monkeypatch.setattr(module, attribute, self._counting(name, getattr(module, attribute)))

    def _counting(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            return function(*args, **kwargs)

        return counted


@pytest.mark.torch
@pytest.mark.skipif(not SCHEDSTAT.exists(), reason="needs Linux's /proc/thread-self/schedstat")
@pytest.mark.parametrize("streamed", [False, True], ids=["map-style", "iterable"])
def test_system_calls_per_batch_in_the_training_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streamed: bool
) -> None:
    """Per batch, without workers: no getpid (it was 5), two reads of the thread's CPU
    clock (3: the timer read one it did not use), one of the process's, three schedstat
    reads, and a tenth of a write (it was 2). Counted as the difference between epochs of
    40 and 20 batches, so what an epoch costs once (the loader line, opening files) cancels
    out."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset

    from dsim.instrument import TrainingTimer, instrument_loader

    class Rows:
        def __init__(self, n: int):
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int):
            return torch.zeros(2), i

    class Stream(IterableDataset):
        def __init__(self, n: int):
            self.n = n

        def __iter__(self):
            return iter(Rows(self.n)[i] for i in range(self.n))

    def epoch(batches: int, rank: int) -> Counter[str]:
        dataset = Stream(batches * 2) if streamed else Rows(batches * 2)
        loader = instrument_loader(DataLoader(dataset, batch_size=2), log_dir=tmp_path, rank=rank)
        timer = TrainingTimer(log_dir=tmp_path, rank=rank)
        with monkeypatch.context() as patch:
            calls = _Calls(
                patch,
                {
                    "getpid": (os, "getpid"),
                    "pread": (os, "pread"),
                    "write": (os, "write"),
                    "thread_time": (time, "thread_time"),
                    "process_time": (time, "process_time"),
                },
            )
            assert sum(1 for _ in timer.iterate(loader, epoch=0, total=batches)) == batches
        return calls.counts

    epoch(5, 0)  # imports and first-use caches
    short, long = epoch(20, 1), epoch(40, 2)
    per_batch = {name: (long[name] - short[name]) / 20 for name in set(long) | set(short)}
    expected = {"getpid": 0, "pread": 3, "thread_time": 2, "process_time": 1}
    assert {name: per_batch.get(name, 0) for name in expected} == expected
    # Lines are held and written in blocks of up to PIPE_BUF bytes (~20 lines): it was 2.
    assert per_batch.get("write", 0) <= 0.25, per_batch
