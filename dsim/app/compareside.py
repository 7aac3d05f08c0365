"""Which run a side of ``dsim compare`` names, checked before pandas is loaded.

Why a module of its own: the comparison's modules load pandas (~0.3 s), and a
mistyped or model-variant directory is the most common mistake; it is
reported from the file system alone.
"""

from __future__ import annotations

import glob
from pathlib import Path

from dsim.errors import InputError


def _variants(path: Path) -> list[str]:
    """The model variants of a run beside where it was looked for (``RUN@stall-only`` for
    ``RUN``): a profiled run's results are only those, so ``results/RUN`` is not there."""
    if path.exists() or not path.name or not path.parent.is_dir():
        return []
    return sorted(p.name for p in path.parent.glob(f"{glob.escape(path.name)}@*") if p.is_dir())


def check_side(path: Path, side: str) -> None:
    """An ``InputError`` (exit 3) when ``side``'s ``path`` is not there: pointing to its
    model variants' results where there are some, else "no such file or directory"."""
    variants = _variants(path)
    if variants:
        shown = ", ".join(str(path.parent / v) for v in variants[:3])
        raise InputError(
            f"{side} {path}: no such run directory; its results are in {shown} "
            "(results of another replay model): name that directory"
        )
    if not path.exists():
        raise InputError("no such file or directory", path)
