"""The ``dsim`` command's entry point (also ``python -m dsim``): signals are handled first.

Importing the CLI (typer, rich, the commands) takes a few hundred
milliseconds. A Ctrl-C or ``kill`` in that time used to end in a
``KeyboardInterrupt`` traceback; here a minimal handler is installed before
anything heavy is imported. Nothing has been started yet, so it only says
``dsim: interrupted`` and exits 130 or 143 at once; ``dsim.cli.main`` then
installs the full handlers (``dsim.processes``), which unwind a running
command.
"""

from __future__ import annotations

import _signal  # the interpreter's own module: loaded already, unlike `signal`
import os


def _interrupted_early(signum: int, frame: object) -> None:
    """Before the CLI is loaded there is nothing to clean up: say so and leave."""
    os.write(2, b"dsim: interrupted\n")
    os._exit(128 + signum)


def main() -> None:
    """Install the early handlers, then load and run the CLI, and leave (``_leave``)."""
    for signum in (_signal.SIGINT, _signal.SIGTERM):
        _signal.signal(signum, _interrupted_early)
    from dsim.cli import main as cli_main

    try:
        cli_main()
        code = 0
    except SystemExit as exc:  # how dsim.cli.main ends, always with an int
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    _leave(code)


def _leave(code: int) -> None:
    """End the process with ``code`` once its exit handlers ran, skipping the teardown.

    The command has finished and said what it had to. What the interpreter
    still does after the exit handlers is free modules and run C++ static
    destructors, and there pyarrow's thread pools sometimes abort the process
    ("terminate called without an active exception", apache/arrow#34314):
    exit code 134 after a command that had succeeded or reported its error
    (seen in about 1 of 20 `dsim run` usage errors). So non-daemon threads are
    joined and the ``atexit`` handlers run (Ray's shutdown, logging, child
    processes), the standard streams flushed, and the process leaves with
    ``os._exit``.
    """
    import atexit
    import contextlib
    import sys
    import threading

    # What the interpreter's own exit does first: wake idle executor threads, then join
    # every non-daemon thread (joining an idle pool worker before waking it would hang).
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    else:  # pragma: no cover - every CPython dsim supports has it
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: the code is chosen
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
