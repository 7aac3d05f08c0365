"""dsim.execute.ray_watch without Ray: the head check, the fd-2 capture, the bounded call.

The real head-node kill is tests/test_ray_cluster.py (DSIM_RAY_HEAD_KILL=0 skips it).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import pytest

from dsim.execute import ray_watch
from dsim.execute.ray_watch import ClusterLost, HeadWatch


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_head_that_refuses_for_long_enough_is_lost() -> None:
    now = [100.0]
    watch = HeadWatch("127.0.0.1", _closed_port(), clock=lambda: now[0])
    watch.check(2, 9)  # first refusal: noted, not yet lost
    for step in range(1, 5):
        now[0] = 100.0 + step * 1.0
        watch.check(2, 9)
    now[0] = 100.0 + ray_watch.LOST_AFTER_S
    with pytest.raises(ClusterLost, match=r"127\.0\.0\.1:\d+ stopped answering.*2 of 9 replay"):
        watch.check(2, 9)


def test_a_listening_head_is_alive_and_resets_the_count() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        now = [0.0]
        watch = HeadWatch("127.0.0.1", server.getsockname()[1], clock=lambda: now[0])
        watch.down_since = -100.0  # it had been down: an answer clears that
        watch.check(0, 1)
        assert watch.down_since is None and watch.alive()


def test_native_stderr_is_captured_while_python_stderr_reaches_the_terminal() -> None:
    """What a C library writes on fd 2 is held back; dsim's own messages still show."""
    code = textwrap.dedent(
        """
        import os, sys
        from dsim.execute.ray_watch import native_stderr_captured
        with native_stderr_captured() as captured:
            os.write(2, b"E native log line\\n")
            print("dsim: note: shown", file=sys.stderr)
        print("captured:", captured.getvalue().strip())
        print("after", file=sys.stderr)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "dsim: note: shown\nafter\n"
    assert done.stdout.strip() == "captured: E native log line"


def test_bounded_gives_up_on_a_call_that_hangs() -> None:
    began = time.monotonic()
    assert not ray_watch.bounded(lambda: time.sleep(30), timeout_s=0.2)
    assert ray_watch.bounded(lambda: None, timeout_s=5)
    assert time.monotonic() - began < 5
