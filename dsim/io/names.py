"""Run names that become directory names: one rule for every command (docs/SPEC.md §1.1).

A run's name is the last component of ``<out>/<name>/``, the directory that
``dsim parse``, ``dsim synth`` and ``dsim run`` replace as a whole. A name
that is a path (``../mydata``, ``/abs/path``), ``.`` or ``..`` would make
them replace a directory outside ``--out`` or ``--out`` itself; a name
starting with ``.`` is hidden from ``dsim run`` (and looks like one of
dsim's temporary names); a control character makes a name nobody can type.
Whether it came from ``--name``, a log file's or directory's name or a
config, a name is checked here, before any work.
"""

from __future__ import annotations

import os
from pathlib import Path

from dsim.errors import OutputError, UsageError

#: Longest run name in bytes (UTF-8): room below the usual 255-byte file name limit for
#: dsim's temporary names (``.<name>.<pid>.<random>.tmp``) and model variants (``@...``).
MAX_NAME_BYTES = 200

RULE = "no path separators, no '@', not starting with '.', no control characters, at most 200 bytes"


def name_problem(name: str, *, variant: bool = False) -> str | None:
    """Why ``name`` cannot be a run directory's name, or ``None`` when it can.

    ``variant``: ``name`` is a results directory ``<run>@<model>``, the one
    place an ``@`` belongs (it is checked on the run's own name).
    """
    if not name:
        return "it is empty"
    if "/" in name or "\\" in name:
        return "it holds a path separator"
    if not variant and "@" in name:  # results of a model variant live in <out>/<run>@<model>/
        return "it holds '@', which separates a run from its model's results"
    if name.startswith("."):
        return "it starts with '.'"
    if not name.isprintable():
        return "it holds a control character"
    if name != name.strip():
        return "it starts or ends with white space"
    if len(name.encode("utf-8", errors="surrogatepass")) > MAX_NAME_BYTES:
        return f"it is longer than {MAX_NAME_BYTES} bytes"
    return None


def check_run_name(name: str, *, origin: str | Path | None = None, option: str = "--name") -> str:
    """``name`` if it is a valid run name, else a ``UsageError`` that says why and what to do.

    ``origin``: the file or directory the name was taken from; the message
    then names it and suggests ``--name``. Without it the name was given
    (``option``: ``--name``, a config's ``FILE``...).
    """
    problem = name_problem(name)
    if problem is None:
        return name
    if origin is not None:
        raise UsageError(
            f"{origin}: the run name {name!r} taken from this path is not a valid run name "
            f"({problem}; {RULE}); give one with --name"
        )
    raise UsageError(f"{option} {name!r} is not a valid run name ({problem}; {RULE})")


def run_path(out: str | Path, name: str) -> Path:
    """``<out>/<name>``, checked to lie inside ``out`` once both are resolved.

    The name is checked first (``check_run_name``); a symbolic link at
    ``<out>/<name>`` is refused rather than followed, since dsim replaces run
    directories whole and the link's target is not one of them.
    """
    problem = name_problem(name, variant=True)
    if problem is not None:
        raise UsageError(f"--name {name!r} is not a valid run name ({problem}; {RULE})")
    target = Path(out) / name
    if target.is_symlink():
        raise OutputError(
            f"{target} is a symbolic link; dsim writes run directories only inside --out, "
            "never through a link: remove it or choose another --name or --out"
        )
    inside = Path(os.path.realpath(out))
    if Path(os.path.realpath(target)).parent != inside:
        raise OutputError(f"{target} does not lie inside {out}; choose another --name or --out")
    return target
