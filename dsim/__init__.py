"""dsim: replay the data-loading timeline of a PyTorch DDP run under alignment policies.

Layers, one way only (see docs/ARCHITECTURE.md):
raw-log grammar -> tables -> policies and replay kernel -> execution -> summaries -> rendering.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dsim")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
