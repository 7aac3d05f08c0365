"""The errors dsim reports to users, and the exit codes they map to.

Every failure a user can act on is a ``DsimError``: the CLI prints its message
as one line and exits with its code, with no traceback (unless ``--debug``).
Exit codes distinguish *how you called dsim* from *what you fed it*, so that
scripts can tell a typo from a corrupt log.
"""

from __future__ import annotations

from pathlib import Path

EXIT_FAILURE = 1  # internal error: a bug in dsim
EXIT_USAGE = 2  # bad command line or config (typer/click use 2 as well)
EXIT_INPUT = 3  # bad input data: logs, tables, results
EXIT_OUTPUT = 4  # an output could not be written
EXIT_CHECK = 5  # a --fail-if condition held (a CI gate), outputs were written
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # stdout closed early (`dsim summarize | head`): 128 + SIGPIPE, silently


class DsimError(Exception):
    """A failure with a message meant for the user."""

    exit_code = EXIT_FAILURE


class UsageError(DsimError):
    """The command line or the config asks for something impossible."""

    exit_code = EXIT_USAGE


class InputError(DsimError):
    """An input file is missing, unreadable or malformed.

    ``path`` and ``line`` (1-based) locate the problem when known, so the
    message always says where to look.
    """

    exit_code = EXIT_INPUT

    def __init__(self, reason: str, path: str | Path | None = None, line: int | None = None):
        self.reason = reason
        self.path = Path(path) if path is not None else None
        self.line = line
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        super().__init__(f"{where}{reason}")


class OutputError(DsimError):
    """An output could not be written (permissions, full disk, a file in the way)."""

    exit_code = EXIT_OUTPUT


class WorkerDied(DsimError):
    """A worker process was killed from outside (the out-of-memory killer, ``kill -9``).

    Neither the command line nor the input is known to be at fault, so the exit
    code stays 1; but it is no bug in dsim either, and the message says which
    run was lost and that nothing of it was written.
    """

    exit_code = EXIT_FAILURE


class CheckFailed(DsimError):
    """A ``--fail-if`` condition held for a run: the command did its work, the gate failed."""

    exit_code = EXIT_CHECK
