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
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("dsim")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

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


def __getattr__(name: str) -> Any:
    if name in _API:
        # By name, not `from dsim import api`: the lower layers import this package for
        # __version__, and a static import here would make them import dsim.app.
        return getattr(importlib.import_module("dsim.api"), name)
    raise AttributeError(f"module 'dsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
