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
    """Install the early handlers, then load and run the CLI."""
    for signum in (_signal.SIGINT, _signal.SIGTERM):
        _signal.signal(signum, _interrupted_early)
    from dsim.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
