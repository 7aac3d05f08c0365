"""dsim's signal handling where Python cannot raise: the interrupt must not be lost.

A signal that arrives while Python runs a ``__del__`` (or an at-fork hook, as
when ``dsim parse`` forks its workers) raises its ``KeyboardInterrupt`` where
it is printed as "Exception ignored" and dropped. Real subprocess, real signal.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import os, signal, time
    from dsim import processes

    processes.install_handlers()

    class Victim:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100_000):  # the handler runs here, inside __del__
                pass

    try:
        v = Victim()
        del v
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.01)
        print("lost", flush=True)
    except KeyboardInterrupt:
        print("interrupted", processes.received(), flush=True)
    """
)


def test_interrupt_raised_inside_del_is_redelivered_not_printed() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["interrupted", "15"], (done.stdout, done.stderr)
    assert "Exception ignored" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
