"""The ``dsim`` command line: a thin layer over the library.

Each command lives in ``dsim/commands/<name>.py`` and only turns options into
library calls and results into terminal output. This module wires them up
and turns every ``DsimError`` into one line on stderr and its exit code;
tracebacks are shown only with ``--debug`` (or ``DSIM_DEBUG=1``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys

import typer
from typer.core import TyperCommand, TyperGroup

try:  # typer >= 0.20 ships its own copy of click
    from typer._click import core as click_core
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import core as click_core
    from click import exceptions as click_exceptions

from dsim import processes
from dsim.commands import compare as compare_cmd
from dsim.commands import help as help_cmd
from dsim.commands import parse as parse_cmd
from dsim.commands import report as report_cmd
from dsim.commands import run as run_cmd
from dsim.commands import summarize as summarize_cmd
from dsim.commands import synth as synth_cmd
from dsim.commands import tune as tune_cmd
from dsim.commands import watch as watch_cmd
from dsim.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OUTPUT,
    EXIT_USAGE,
    DsimError,
)


def _plain_flags(command: click_core.Command, ctx: click_core.Context) -> None:
    """Give every on/off flag an empty metavar, so help shows no ``<bool>`` after it.

    Typer's rich help prints a value placeholder for flags too, which reads as
    if ``--quiet true`` were the way to use one (``true`` then becomes a run
    name). A flag takes no value; its help should not suggest one.
    """
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""


def _single_values(command: click_core.Command, ctx: click_core.Context) -> dict[str, str]:
    """Each spelling (``--jobs``, ``-j``) of the command's options that take one value, to
    the option's first spelling."""
    single: dict[str, str] = {}
    for param in command.get_params(ctx):
        if param.param_type_name == "option" and not (
            param.multiple or getattr(param, "is_flag", False) or getattr(param, "count", False)
        ):
            for spelling in (*param.opts, *param.secondary_opts):
                single[spelling] = param.opts[0]
    return single


def refuse_repeated_options(
    command: click_core.Command, ctx: click_core.Context, args: list[str]
) -> None:
    """Refuse an option of one value given twice (``--name a --name b``).

    Why: click keeps the last silently, so the command would do something the
    user did not ask for alone (issue #19: never last-wins). Options that take
    several values (``--policy``, ``--workers``) are the commands' own to take.
    """
    from dsim.errors import UsageError

    single = _single_values(command, ctx)
    seen: dict[str, list[str]] = {}
    tokens = iter(args)
    for token in tokens:
        if token == "--":
            break
        if token.startswith("--"):
            spelling, eq, value = token.partition("=")
        elif token.startswith("-") and len(token) > 1:
            spelling, value = token[:2], token[2:]
            eq = "=" if value else ""
        else:
            continue
        if spelling not in single:
            continue
        if not eq:
            value = next(tokens, "")
        seen.setdefault(single[spelling], []).append(value)
    for option, values in seen.items():
        if len(values) > 1:
            raise UsageError(
                f"{option} given {len(values)} times ({', '.join(values)}): give it once"
            )


class _Command(TyperCommand):
    """A command whose help shows flags as flags (see ``_plain_flags``) and that refuses an
    option of one value given twice (``refuse_repeated_options``)."""

    def format_help(self, ctx: click_core.Context, formatter: click_core.HelpFormatter) -> None:
        _plain_flags(self, ctx)
        super().format_help(ctx, formatter)

    def parse_args(self, ctx: click_core.Context, args: list[str]) -> list[str]:
        refuse_repeated_options(self, ctx, args)
        return super().parse_args(ctx, args)


class _Group(TyperGroup):
    """The ``dsim`` group, its own flags shown as flags too."""

    def format_help(self, ctx: click_core.Context, formatter: click_core.HelpFormatter) -> None:
        _plain_flags(self, ctx)
        super().format_help(ctx, formatter)


app = typer.Typer(
    name="dsim",
    cls=_Group,
    # Explicit, so that help texts mean the same under every supported typer:
    # a literal "[" in help is written "\\[" (rich markup would eat "[@FETCH/START]").
    rich_markup_mode="rich",
    help=(
        "Replay the data-loading timeline of PyTorch DDP runs under alignment policies, "
        "and see how much training stall and inter-GPU delay aligned data loaders would remove."
        "\n\nTypical session:\n\n"
        "  dsim parse logs/myrun/            # raw logs -> traces/myrun/*.parquet\n\n"
        "  dsim run --conf configs/sim_conf.json   # replay 9 policies -> results/\n\n"
        "  dsim report results/ --out report.html\n\n"
        "  dsim help spec 5.6                # the specification, section 5.6"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        # Looked up here, not imported at the top: importlib.metadata costs every other
        # command's start-up ~0.05 s (see dsim/__init__.py).
        from dsim import __version__

        typer.echo(f"dsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks (also DSIM_DEBUG=1)."),
) -> None:
    if debug:
        os.environ["DSIM_DEBUG"] = "1"


app.command("parse", cls=_Command)(parse_cmd.command)
app.command("run", cls=_Command)(run_cmd.command)
app.command("summarize", cls=_Command)(summarize_cmd.command)
app.command("report", cls=_Command)(report_cmd.command)
app.command("compare", cls=_Command)(compare_cmd.command)
app.command("synth", cls=_Command)(synth_cmd.command)
app.command("tune", cls=_Command)(tune_cmd.command)
app.command("watch", cls=_Command)(watch_cmd.command)

help_app = typer.Typer(
    name="help",
    cls=_Group,
    rich_markup_mode="rich",
    help="Documentation that ships with dsim: `dsim help spec [SECTION]`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
help_app.command("spec", cls=_Command)(help_cmd.spec)
app.add_typer(help_app, name="help")


def _one_line_text(message: str) -> str:
    """``message`` with line breaks and other control characters escaped (``\\n``): a path
    may hold them, and an error is one line (SPEC §9)."""
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)


def _one_line(exc: click_exceptions.ClickException) -> str:
    """A command-line error as every other error reads, ``dsim: error: ...`` on one line,
    pointing at the command's help (click prints a three-line usage block)."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    return f"dsim: error: {message}{where}"


def _debugging(argv: list[str]) -> bool:
    return os.environ.get("DSIM_DEBUG", "") not in ("", "0") or "--debug" in argv


def _sigterm_taken_over() -> bool:
    """Whether a library replaced our SIGTERM handler (Ray's driver exits with 15 on SIGTERM)."""
    return not processes.handles(signal.SIGTERM)


def _stdout_closed(exc: BaseException) -> bool:
    """Whether ``exc`` comes from writing to a stdout whose reader has gone (``| head``).

    Rich turns that ``BrokenPipeError`` into ``SystemExit(1)`` (after pointing stdout at
    /dev/null); click and ``print`` raise it as it is.
    """
    while exc is not None:
        if isinstance(exc, BrokenPipeError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush cannot fail again
    (Python would print "Exception ignored ... BrokenPipeError" and exit 120)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


#: errno values of a write that cannot succeed until the user acts: a full disk or quota, a
#: read-only file system, a file too large for it.
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def _stdout_fails() -> bool:
    """After a failed write: whether stdout is what fails (then silenced, so that its
    buffer cannot fail again at exit)."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        _silence_stdout()
        return True
    return False


def _flush_stdout() -> tuple[int, str] | None:
    """Flush stdout now, where a failure can still be answered: the exit code it calls for
    and why (141 when the reader has gone, 4 when stdout is a full or read-only device),
    else None."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE, ""
    except OSError as exc:  # stdout closed or not a stream: nothing to flush into
        if exc.errno in _OUTPUT_ERRNOS:
            _silence_stdout()  # the interpreter's last flush must not fail again
            return EXIT_OUTPUT, os.strerror(exc.errno)
    except ValueError:
        pass
    return None


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dsim`` script; never lets a traceback reach a user by accident.

    SIGINT and SIGTERM end every command the same way: ``finally`` blocks
    run (no temporary file stays), then one line ``dsim: interrupted`` and
    exit code 130 (SIGINT) or 143 (SIGTERM), whatever the
    ``KeyboardInterrupt`` was turned into on its way up (``dsim.processes``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    _lenient_streams()
    try:
        # Inside the try: a signal may land while the second handler is being set, when
        # the first one already turns it into a KeyboardInterrupt.
        processes.install_handlers()
        code, signum = _main(argv)
    except KeyboardInterrupt:  # a signal while an error was being reported, or set up
        code, signum = EXIT_FAILURE, signal.SIGINT
    processes.ignore_further()  # from here on the process is leaving: nothing to interrupt
    flushed = _flush_stdout()
    if flushed is not None and flushed[0] == EXIT_BROKEN_PIPE:
        code = EXIT_BROKEN_PIPE
    elif flushed is not None and code in (0, None):  # output lost after the command's end
        typer.echo(f"dsim: error: cannot write standard output: {flushed[1]}", err=True)
        code = flushed[0]
    signum = processes.received() or signum  # the signal itself beats what it turned into
    if signum is not None:
        typer.echo("dsim: interrupted", err=True)
        code = processes.exit_code(signum)
    code = code if isinstance(code, int) else 0
    if processes.hard_exit_requested():  # see processes.request_hard_exit
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _lenient_streams() -> None:
    """Where standard output or error cannot encode every character (``LC_ALL=C``,
    ``PYTHONIOENCODING=ascii``), write what it can and a replacement for the rest.

    Why: dsim prints ×, →, … and users' run names; in an ASCII locale the first of
    them was an internal error (UnicodeEncodeError) after the results were written.
    """
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("_", "-")
        if encoding not in ("utf-8", "utf8") and hasattr(stream, "reconfigure"):
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")


def _main(argv: list[str]) -> tuple[object, int | None]:
    """Run the command; its exit code, and the signal that stopped it if one did."""
    command = typer.main.get_command(app)
    code: object = EXIT_FAILURE
    signum: int | None = None
    try:
        # Typer returns 130 for a KeyboardInterrupt; no command returns it otherwise.
        code = command.main(args=argv, prog_name="dsim", standalone_mode=False)
        if code == EXIT_INTERRUPTED:
            signum = signal.SIGINT
    except typer.Exit as exc:
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        signum = signal.SIGINT
    except click_exceptions.ClickException as exc:
        typer.echo(_one_line(exc), err=True)
        code = exc.exit_code if exc.exit_code else EXIT_USAGE
    except SystemExit as exc:
        if _stdout_closed(exc):
            _silence_stdout()
            return EXIT_BROKEN_PIPE, None
        if processes.received() is not None:  # a library's exit on the way out of a signal
            signum = processes.received()
        elif exc.code != signal.SIGTERM or not _sigterm_taken_over():
            raise
        else:
            signum = signal.SIGTERM
    except BrokenPipeError:  # a reader that stopped early is not an error (SPEC §9)
        _silence_stdout()
        code = EXIT_BROKEN_PIPE
    except DsimError as exc:
        if processes.received() is None:
            if _debugging(argv):
                raise
            typer.echo(f"dsim: error: {_one_line_text(str(exc))}", err=True)
        code = exc.exit_code
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS or _debugging(argv):
            raise
        # A full disk or a read-only file system met where no code named the file (stdout
        # to a full device, a library's own write): the user's to act on, not a bug (SPEC §9).
        stdout = _stdout_fails()
        if processes.received() is None:
            where = exc.filename or ("standard output" if stdout else "standard output or a file")
            typer.echo(f"dsim: error: cannot write {where}: {os.strerror(exc.errno)}", err=True)
        code = EXIT_OUTPUT
    except Exception as exc:
        if processes.received() is None:
            if _debugging(argv):
                raise
            typer.echo(
                f"dsim: internal error: {type(exc).__name__}: {exc}\n"
                "This is a bug in dsim; run again with --debug for the traceback.",
                err=True,
            )
        code = EXIT_FAILURE
    return code, signum
