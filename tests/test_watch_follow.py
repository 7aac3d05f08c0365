"""dsim.sources.follow: complete lines only, rotation by rename and by truncation, late ranks."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from dsim.sources.follow import LogFollower

LINE = (
    "2026-11-21 16:11:59.217121 DEBUG:\tGPU: {g} worker_id: 0, END FETCH at_time 0.1 data idx{i}\n"
)


def _line(i: int, g: int = 0) -> bytes:
    return LINE.format(g=g, i=i).encode()


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def test_a_partial_line_waits_for_its_line_end(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    whole, cut = _line(0), _line(1)
    log.write_bytes(whole + cut[:30])  # the writer is in the middle of line 2
    follower = LogFollower(tmp_path)
    assert follower.poll() == {"rank0.log": [whole]}
    assert follower.poll() == {}  # nothing new: the half line is still not a line
    _append(log, cut[30:-1])
    assert follower.poll() == {}  # still no line end
    _append(log, b"\n")
    assert follower.poll() == {"rank0.log": [cut]}


def test_only_a_newline_ends_a_line(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_bytes(b"a\rb\x0cc\r\nd")
    assert LogFollower(tmp_path).poll() == {"rank0.log": [b"a\rb\x0cc\r\n"]}


def test_a_renamed_log_is_read_to_its_end_before_the_new_file(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(_line(0))
    follower = LogFollower(tmp_path)
    assert follower.poll() == {"rank0.log": [_line(0)]}
    _append(log, _line(1) + _line(2)[:10])  # written before the rotation, half a line at it
    log.rename(tmp_path / "rank0.log.1")  # logrotate's rename
    _append(tmp_path / "rank0.log.1", _line(2)[10:])  # the writer's open file: still the old inode
    log.write_bytes(_line(3))
    assert follower.poll() == {"rank0.log": [_line(1), _line(2), _line(3)]}
    assert follower.stats.rotations == 1


def test_a_truncated_log_is_read_again_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(_line(0) + _line(1))
    follower = LogFollower(tmp_path)
    assert len(follower.poll()["rank0.log"]) == 2
    with open(log, "r+b") as handle:  # copytruncate: same inode, new text
        handle.truncate(0)
        handle.write(_line(2))
    assert follower.poll() == {"rank0.log": [_line(2)]}
    assert follower.stats.truncations == 1


def test_a_rank_that_starts_late_is_read_from_its_start(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_bytes(_line(0))
    follower = LogFollower(tmp_path)
    assert set(follower.poll()) == {"rank0.log"}
    (tmp_path / "rank1.log").write_bytes(_line(0, g=1) + _line(1, g=1))
    assert follower.poll() == {"rank1.log": [_line(0, g=1), _line(1, g=1)]}


def test_compressed_rotations_are_not_read(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "rank0.log.1.gz", "wb") as handle:
        handle.write(_line(0))
    (tmp_path / "rank0.log").write_bytes(_line(1))
    (tmp_path / "notes.txt").write_bytes(b"not a log\n")
    assert LogFollower(tmp_path).poll() == {"rank0.log": [_line(1)]}


def test_a_long_log_is_caught_up_from_its_end_at_a_line_start(tmp_path: Path) -> None:
    lines = [_line(i) for i in range(100)]
    (tmp_path / "rank0.log").write_bytes(b"".join(lines))
    got = LogFollower(tmp_path, min_catch_up=0, catch_up=len(lines[-1]) * 10 + 5).poll()[
        "rank0.log"
    ]
    assert got == lines[-10:]  # the first, partial line of the catch-up skipped


def test_catch_up_reaches_into_the_previous_rotation(tmp_path: Path) -> None:
    old, new = [_line(i) for i in range(10)], [_line(i) for i in range(10, 13)]
    (tmp_path / "rank0.log.1").write_bytes(b"".join(old))
    (tmp_path / "rank0.log").write_bytes(b"".join(new))
    budget = len(b"".join(new)) + 2 * len(old[0]) + 3  # 3 bytes into old line 7
    got = LogFollower(tmp_path, min_catch_up=0, catch_up=budget).poll()["rank0.log"]
    assert got == old[-2:] + new


def test_the_follower_holds_no_file_open_between_looks(tmp_path: Path) -> None:
    """The writer never waits for dsim: no lock, and nothing left open (a rotation's
    deletion frees the disk space at once)."""
    log = tmp_path / "rank0.log"
    log.write_bytes(_line(0))
    follower = LogFollower(tmp_path)
    follower.poll()
    fds = Path("/proc/self/fd")
    if fds.is_dir():
        assert not any(os.path.realpath(fd) == str(log) for fd in fds.iterdir())


def test_a_single_log_file_is_followed_with_its_rotations(tmp_path: Path) -> None:
    (tmp_path / "output.log.1").write_bytes(_line(0))
    (tmp_path / "output.log").write_bytes(_line(1))
    (tmp_path / "other.log").write_bytes(_line(2))
    assert LogFollower(tmp_path / "output.log").poll() == {"output.log": [_line(0), _line(1)]}


def test_the_catch_up_is_shared_between_the_logs(tmp_path: Path) -> None:
    lines = [_line(i) for i in range(100, 200)]  # all of one length
    for rank in range(4):
        (tmp_path / f"rank{rank}.log").write_bytes(b"".join(lines))
    got = LogFollower(tmp_path, min_catch_up=0, catch_up=4 * (len(lines[0]) * 10 + 5)).poll()
    assert sorted(got) == [f"rank{r}.log" for r in range(4)]
    assert all(found == lines[-10:] for found in got.values())


def test_the_lines_held_are_bounded_all_logs_together(tmp_path: Path, monkeypatch) -> None:
    from dsim.app import watch

    monkeypatch.setattr(watch, "MAX_HELD_LINES", 20)
    monkeypatch.setattr(watch, "MIN_HELD_LINES", 3)
    for rank in range(4):  # no record: nothing is ever let go for a window
        (tmp_path / f"rank{rank}.log").write_bytes(b"starting\n" * 50)
    with watch.Watch(tmp_path) as w:
        w.look()
        assert [len(held) for held in w._held.values()] == [5] * 4
