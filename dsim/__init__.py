"""dsim: replay the data-loading timeline of a PyTorch DDP run under alignment policies.

Layers, one way only (see docs/ARCHITECTURE.md):
raw-log grammar -> tables -> policies and replay kernel -> execution -> summaries -> rendering.

The Python API (``dsim.api``: ``parse``, ``run``, ``load_results``,
``load_trace``, ``tune``, ``report``, ``compare``, ``Trace``, ``Results``) is
importable from here. It is loaded on first use, so that ``import dsim`` (and
``dsim --help``) does not load pandas, pyarrow and the replay machinery.
"""

from __future__ import annotations

import importlib

_API = (
    "Results",
    "Trace",
    "compare",
    "load_results",
    "load_trace",
    "parse",
    "report",
    "run",
    "tune",
)

__all__ = ["__version__", *_API]


def _version() -> str:
    """The installed version. Looked up on first use: ``importlib.metadata`` takes ~0.1 s to
    import, and ``dsim``'s entry point must install its signal handlers before that
    (``dsim/__main__.py``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dsim")
    except PackageNotFoundError:  # running from a source tree without installing
        return "0.0.0+unknown"


def __getattr__(name: str) -> object:  # (no `typing` import: start-up time, see _version)
    if name == "__version__":
        globals()["__version__"] = found = _version()
        return found
    if name in _API:
        # By name, not `from dsim import api`: the lower layers import this package for
        # __version__, and a static import here would make them import dsim.app.
        return getattr(importlib.import_module("dsim.api"), name)
    raise AttributeError(f"module 'dsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "__version__", *_API})
