"""When held lines reach the file (dsim.instrument.sinks, docs/SPEC.md §1.2 "Writing").

The training process holds its records and writes them in blocks; these tests
pin every point where the SPEC promises they are written — HOLD_LINES records,
the flusher thread after HOLD_SECONDS, the end of a loop (also one left by an
exception), a clean interpreter exit (also after an uncaught exception) — and
that nothing is written twice or torn: a forked child never writes its
parent's records, a worker's copy writes at once, and each ``write`` carries
whole lines of at most PIPE_BUF bytes.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dsim.instrument import TrainingTimer, fetch_line, sinks
from dsim.instrument.sinks import HOLD_LINES, PIPE_BUF, FileSink, flush_held

REPO = Path(__file__).resolve().parents[1]


def _line(text: str) -> str:
    return f"{text}\n"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_held_records_are_written_in_order_once_hold_lines_are_held(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    sink = FileSink(path)
    for i in range(HOLD_LINES - 1):
        sink.put(_line, f"r{i}")
    assert _lines(path) == []  # held: not one write per record
    sink.put(_line, f"r{HOLD_LINES - 1}")
    assert _lines(path) == [f"r{i}" for i in range(HOLD_LINES)]
    sink.put(_line, "held")
    sink.write("now\n")  # an immediate line comes after what was held
    assert _lines(path)[-2:] == ["held", "now"]


def test_the_flusher_thread_writes_what_waited_hold_seconds(tmp_path: Path) -> None:
    """A loop that stops putting (a long evaluation, a hang) still gets its lines out,
    also from a sink nothing refers to any more (a loader dropped mid-epoch)."""
    path = tmp_path / "rank0.log"
    FileSink(path).put(_line, "alone")
    deadline = time.monotonic() + 4 * sinks.HOLD_SECONDS + 5
    while _lines(path) != ["alone"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _lines(path) == ["alone"]


def test_blocks_are_whole_lines_of_at_most_pipe_buf_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[bytes] = []
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(data) or real(fd, data))
    sink = FileSink(tmp_path / "rank0.log")
    expected = [f"record {i} " + "x" * (100 + i % 90) for i in range(HOLD_LINES - 1)]
    for text in expected:
        sink.put(_line, text)
    sink.flush()
    assert 1 < len(writes) < len(expected)  # blocks, not one write per line
    assert all(len(block) <= PIPE_BUF and block.endswith(b"\n") for block in writes)
    assert b"".join(writes).decode().splitlines() == expected


def _hammer_blocks(path: str, who: int, count: int) -> None:
    sink = FileSink(path)  # made in this process: it holds and writes blocks
    for i in range(count):
        sink.put(fetch_line, 1_630_525_734.0 + i, who, who, 0.25 * i, i, 0.001 * i, 1e-6 * i)
    sink.flush()


def test_blocks_from_many_processes_never_tear_a_line(tmp_path: Path) -> None:
    """Four processes append blocks to one file at once: every line whole, each
    process's lines all there, in its own order."""
    import multiprocessing
    import re

    path = tmp_path / "rank0.log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hammer_blocks, args=(str(path), w, 2000)) for w in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
        assert proc.exitcode == 0
    pattern = re.compile(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} DEBUG:\tGPU: (\d) worker_id: \1, "
        r"END FETCH at_time \d+\.\d{9} data idx(\d+) cpu \d+\.\d{9} runq \d+\.\d{9}"
    )
    seen: dict[str, list[int]] = {str(w): [] for w in range(4)}
    for line in _lines(path):
        match = pattern.fullmatch(line)
        assert match, line
        seen[match.group(1)].append(int(match.group(2)))
    assert all(indices == list(range(2000)) for indices in seen.values())


def test_a_copy_in_another_process_writes_at_once(tmp_path: Path) -> None:
    """What a spawned DataLoader worker gets: a sink that is not its process's own."""
    path = tmp_path / "rank0.log"
    worker_copy = pickle.loads(pickle.dumps(FileSink(path)))
    worker_copy.put(_line, "from a worker")
    assert _lines(path) == ["from a worker"]


def test_the_timer_writes_the_finished_iterations_when_the_loop_raises(tmp_path: Path) -> None:
    timer = TrainingTimer(log_dir=tmp_path, rank=0)
    with pytest.raises(RuntimeError):
        for i in timer.iterate(range(10), epoch=0):
            if i == 3:
                raise RuntimeError("the training step failed")
    lines = _lines(tmp_path / "rank0.log")
    assert len(lines) == 3 and all("Epoch: [0][" in line for line in lines)  # 0, 1, 2
    for _ in timer.iterate(range(5), epoch=1):
        pass
    assert len(_lines(tmp_path / "rank0.log")) == 8  # an epoch's end writes its lines


def _script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    code = "from dsim.instrument.sinks import FileSink, flush_held\nimport os, sys\n"
    code += textwrap.dedent(body)
    script = tmp_path / "script.py"  # a file, so that spawned children can import it
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )


def test_held_lines_are_written_at_exit_also_after_an_uncaught_exception(tmp_path: Path) -> None:
    done = _script(
        tmp_path,
        """
        sink = FileSink("clean.log")
        for i in range(5):
            sink.put(lambda i: f"c{i}\\n", i)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert _lines(tmp_path / "clean.log") == [f"c{i}" for i in range(5)]
    done = _script(
        tmp_path,
        """
        sink = FileSink("crash.log")
        for i in range(5):
            sink.put(lambda i: f"x{i}\\n", i)
        raise SystemError("the job failed")
        """,
    )
    assert done.returncode == 1 and "the job failed" in done.stderr
    assert _lines(tmp_path / "crash.log") == [f"x{i}" for i in range(5)]
    done = _script(  # killed (os._exit stands in for a signal): what was held is lost
        tmp_path,
        """
        sink = FileSink("killed.log")
        sink.put(lambda: "kept\\n")
        sink.flush()
        sink.put(lambda: "lost\\n")
        os._exit(0)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert _lines(tmp_path / "killed.log") == ["kept"]


def test_a_rank_started_by_multiprocessing_writes_its_held_lines_when_it_returns(
    tmp_path: Path,
) -> None:
    """torch.multiprocessing.start_processes / mp.spawn ranks end with os._exit after their
    function returns: atexit never runs there, multiprocessing's exit finalizers do."""
    done = _script(
        tmp_path,
        """
        import multiprocessing

        def rank(path):
            sink = FileSink(path)
            for i in range(3):
                sink.put(lambda i: f"rank line {i}\\n", i)

        if __name__ == "__main__":
            for method in ("fork", "spawn"):
                context = multiprocessing.get_context(method)
                child = context.Process(target=rank, args=(method + ".log",))
                child.start()
                child.join()
                assert child.exitcode == 0, child.exitcode
        """,
    )
    assert done.returncode == 0, done.stderr
    for method in ("fork", "spawn"):
        assert _lines(tmp_path / f"{method}.log") == [f"rank line {i}" for i in range(3)]


def test_a_forked_child_never_writes_its_parents_held_lines(tmp_path: Path) -> None:
    """Without the owner check the child's flush wrote the parent's records: twice in all."""
    done = _script(
        tmp_path,
        """
        sink = FileSink("rank0.log")
        for i in range(3):
            sink.put(lambda i: f"parent {i}\\n", i)
        child = os.fork()
        if child == 0:
            flush_held()
            sink.put(lambda: "child\\n")  # a worker's line: written at once
            sink.flush()
            os._exit(0)
        os.waitpid(child, 0)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(_lines(tmp_path / "rank0.log")) == ["child", "parent 0", "parent 1", "parent 2"]


@pytest.mark.torch
def test_a_loader_without_timer_writes_its_fetch_lines_at_the_epochs_end(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from dsim.instrument import instrument_loader

    loader = instrument_loader(DataLoader(list(range(10)), batch_size=3), log_dir=tmp_path, rank=0)
    for epoch in range(2):
        assert len(list(loader)) == 4
        fetches = [line for line in _lines(tmp_path / "rank0.log") if "END FETCH" in line]
        assert len(fetches) == 4 * (epoch + 1)
    flush_held()


def test_the_flusher_names_a_log_it_cannot_write_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A write error in the flusher thread is one line naming the file (the thread goes
    on with the other sinks); the loop's own next flush raises it."""
    path = tmp_path / "rank0.log"
    sink = FileSink(path)
    sink.put(_line, "first")  # opens the file
    assert sink._fd is not None
    os.close(sink._fd)
    sink._fd = read_only = os.open(path, os.O_RDONLY)  # writes fail with EBADF
    try:
        deadline = time.monotonic() + 4 * sinks.HOLD_SECONDS + 5
        err = ""
        while "cannot write" not in err and time.monotonic() < deadline:
            time.sleep(0.05)
            err += capfd.readouterr().err
        assert f"dsim.instrument: cannot write {path}: Bad file descriptor" in err
        time.sleep(2 * sinks.HOLD_SECONDS)
        assert "cannot write" not in capfd.readouterr().err  # once
        sink.put(_line, "second")
        with pytest.raises(OSError):
            sink.flush()
    finally:
        sink._held.clear()
        sink._fd = sink._pid = None
        os.close(read_only)
