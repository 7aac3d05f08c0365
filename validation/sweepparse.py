"""A sweep's runs parsed by the real ``dsim parse``, and the table printers' command line.

Why one module: the diagnostics that print a table from a sweep's committed
logs (``handover``, ``alignedwork``) each pick runs by name, parse them into a
scratch directory and take ``--data`` / ``--only``; written once here, they
pick and parse alike.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dsim.errors import DsimError, InputError
from validation.compare import dsim, unpack_logs
from validation.manifest import MANIFEST, load_manifest


def run_names(data: Path, only: str | None = None) -> list[str]:
    """The sweep's runs in manifest order (those matching ``only``, a regular expression)."""
    if not (data / MANIFEST).is_file():
        raise InputError(f"{data}: not a sweep's data directory (no {MANIFEST})")
    try:
        re.compile(only or "")
    except re.error as exc:
        raise InputError(f"--only {only!r}: not a regular expression ({exc})") from None
    names = [n for n in load_manifest(data)["runs"] if (data / n).is_dir()]
    return [n for n in names if only is None or re.search(only, n)]


@contextmanager
def parsed_runs(data: Path, names: list[str]) -> Iterator[Path]:
    """A scratch directory of ``names`` parsed (one subdirectory each), removed afterwards."""
    if not names:
        raise InputError(f"{data}: no run to parse (none in its manifest matches --only)")
    with tempfile.TemporaryDirectory() as work:
        logs, traces = Path(work) / "logs", Path(work) / "traces"
        for name in names:
            unpack_logs(data / name, logs / name)
        dsim("parse", str(logs), "--out", str(traces), "--quiet")
        yield traces


def table_main(
    prog: str, doc: str | None, table: Callable[[Path, str | None], str], argv: list[str] | None
) -> int:
    """``--data DIR [--only REGEX]``: print ``table`` of that sweep."""
    p = argparse.ArgumentParser(prog=prog, description=doc)
    p.add_argument("--data", required=True, help="a sweep's data directory")
    p.add_argument("--only", metavar="REGEX", help="only the runs whose names match")
    args = p.parse_args(argv)
    try:
        print(table(Path(args.data), args.only))
    except DsimError as exc:  # a bad directory, a failed parse: one line, not a traceback
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
