"""Whether numba can keep the pipeline model's compiled kernels on disk here.

Why: ``njit(cache=True)`` raises "cannot cache function ...: no locator
available" at a kernel's first call where numba finds no writable cache
directory: ``NUMBA_CACHE_DIR``, the package's ``__pycache__``, then the user's
cache directory. A read-only install run by a user without a writable home (a
container run as a non-root user, say) met it as dsim's internal error. There
the kernels are compiled in memory at each start instead (a second or two),
which is all caching saves.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def _writable(directory: Path) -> bool:
    """Whether ``directory`` could be made and written: its nearest existing ancestor is
    a directory this process may write (``access`` also says no on a read-only mount)."""
    while not os.path.exists(directory):  # also False where a parent may not be searched
        if directory.parent == directory:
            return False
        directory = directory.parent
    return os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)


def _numba_directories(module_file: str) -> list[Path]:
    """Where numba would keep a module's compiled functions, in the order it tries them."""
    from numba.core import config

    found = [Path(config.CACHE_DIR)] if config.CACHE_DIR else []
    found.append(Path(module_file).resolve().parent / "__pycache__")
    try:  # numba's own rule for the user's cache directory
        from numba.misc.appdirs import AppDirs
    except ImportError:  # pragma: no cover - every numba dsim supports has it
        return found
    found.append(Path(AppDirs(appname="numba", appauthor=False).user_cache_dir))
    return found


def can_cache(module_file: str, directories: Iterable[Path] | None = None) -> bool:
    """Whether one of ``directories`` (default: numba's, for ``module_file``) is writable."""
    chosen = _numba_directories(module_file) if directories is None else directories
    return any(_writable(Path(d)) for d in chosen)
