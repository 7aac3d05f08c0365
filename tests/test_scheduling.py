"""tests/conftest.py's scheduler for README's `--dist loadfile`: the slowest files go first.

Why: xdist hands out files with the most tests first, so the few-test, long files (Chromium,
Ray clusters, training jobs) came last and one worker finished them alone. These tests drive
xdist's own LoadFileScheduling (the queue and the hand-out the override relies on), so a
pytest-xdist that changes them fails here instead of silently losing the order.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest
from conftest import SLOW_FILES, pytest_xdist_make_scheduler, slowest_first

HERE = Path(__file__).parent


def test_every_slow_file_is_a_test_file_named_once() -> None:
    assert len(set(SLOW_FILES)) == len(SLOW_FILES)
    missing = [name for name in SLOW_FILES if not (HERE / name).is_file()]
    assert not missing, f"SLOW_FILES names no test file: {missing}"


def test_the_slowest_queued_file_moves_to_the_front() -> None:
    queue = OrderedDict.fromkeys(
        ["tests/test_words.py", f"tests/{SLOW_FILES[3]}", "x", f"tests/{SLOW_FILES[1]}"]
    )
    slowest_first(queue)
    assert list(queue) == [
        f"tests/{SLOW_FILES[1]}",
        "tests/test_words.py",
        f"tests/{SLOW_FILES[3]}",
        "x",
    ]
    plain = OrderedDict.fromkeys(["a", "b"])
    slowest_first(plain)
    assert list(plain) == ["a", "b"]  # nothing slow queued: the order stays


class _Node:
    """What xdist's scheduler asks of a worker: run these tests (indexes in its collection)."""

    def __init__(self) -> None:
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(indexes)


def test_loadfile_hands_out_the_slow_files_first(pytestconfig, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(pytestconfig.option, "dist", "loadfile")
    monkeypatch.setattr(pytestconfig.option, "tx", ["2*popen"], raising=False)  # `-n 2`
    sched = pytest_xdist_make_scheduler(pytestconfig, None)
    files = [
        "tests/test_words.py",
        f"tests/{SLOW_FILES[2]}",
        "tests/test_api.py",
        f"tests/{SLOW_FILES[0]}",
    ]
    collection = [f"{f}::test_{i}" for f in files for i in range(2)]
    node = _Node()
    sched.registered_collections[node] = collection
    for nodeid in collection:
        sched.workqueue.setdefault(nodeid.split("::")[0], {})[nodeid] = False
    for _ in files:
        sched._assign_work_unit(node)
    order = [
        f"tests/{SLOW_FILES[0]}",
        f"tests/{SLOW_FILES[2]}",
        "tests/test_words.py",
        "tests/test_api.py",
    ]
    assert list(sched.assigned_work[node]) == order
    assert node.sent[0] == [collection.index(f"tests/{SLOW_FILES[0]}::test_{i}") for i in range(2)]


@pytest.mark.parametrize("dist", ["load", "loadgroup", "no"])
def test_other_dist_modes_keep_xdists_scheduler(pytestconfig, monkeypatch, dist: str) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(pytestconfig.option, "dist", dist)
    assert pytest_xdist_make_scheduler(pytestconfig, None) is None
