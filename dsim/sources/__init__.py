"""Input formats by name: a new format is a module under ``dsim/sources/`` plus one line below.

``dsim parse`` asks this registry for a ``Source`` (``dsim.sources.base``)
and never calls a format's grammar directly. Today there is one format, the
raw DDP training log (``rawlog``) and PyTorch profiler traces (``kineto``).
"""

from __future__ import annotations

from pathlib import Path

from dsim.errors import UsageError
from dsim.sources.base import ParsedRun, RunSource, Source
from dsim.sources.kineto_source import KinetoSource, holds_traces
from dsim.sources.rawlog.source import RawLogSource

SOURCES: dict[str, Source] = {source.name: source for source in (RawLogSource(), KinetoSource())}
DEFAULT_SOURCE = RawLogSource.name

__all__ = [
    "DEFAULT_SOURCE",
    "SOURCES",
    "ParsedRun",
    "RunSource",
    "Source",
    "detect_source",
    "get_source",
]


def detect_source(paths: list[Path]) -> str:
    """The format of the given paths: profiler traces when every path holds them, else raw logs."""
    if paths and all(p.exists() and holds_traces(p) for p in paths):
        return KinetoSource.name
    return DEFAULT_SOURCE


def get_source(name: str = DEFAULT_SOURCE) -> Source:
    """The registered input format ``name``; a ``UsageError`` naming the known ones otherwise."""
    try:
        return SOURCES[name]
    except KeyError:
        known = ", ".join(SOURCES)
        raise UsageError(f"unknown input format {name!r}; known formats: {known}") from None
