"""The interface of an input format (docs/SPEC.md §1, §2).

A source turns paths into runs (``discover``) and one run's files into the
tables every later step reads, with its rejected lines and a parse report
(``parse`` -> ``ParsedRun``). ``dsim parse`` talks to this interface only, so
a second input format (another logger, profiler traces) is a new module under
``dsim/sources/`` plus its registration in ``dsim/sources/__init__.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from dsim.model.tables import RunTables


@dataclass(frozen=True)
class RunSource:
    """A run to parse: its name and its files, in a stable order.

    ``extras``: side files found with the run's logs that are not logs
    (GPU utilisation logs, SPEC §1.9); they never decide what a run is.
    ``origin``: the file or directory the name was taken from (``None`` when
    it was given, ``--name``), so that a name that cannot be a directory's
    can be refused naming where it came from.
    """

    name: str
    files: tuple[Path, ...]
    extras: tuple[Path, ...] = ()
    origin: Path | None = None


@dataclass
class ParsedRun:
    """A parsed run, its rejected lines (file, line, reason, text) and its report.

    ``lines`` (only with ``parse(..., keep_lines=True)``): for "fetch" and
    "train", the (file index, line number) of each table row, in table order.
    """

    tables: RunTables
    rejects: pa.Table
    report: dict[str, Any]
    lines: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


class Source(ABC):
    """One input format; registered by ``name`` in ``dsim.sources``."""

    name: ClassVar[str]

    @abstractmethod
    def discover(self, paths: list[Path], name: str | None = None) -> list[RunSource]:
        """The runs the given paths hold (``name`` names a single run)."""

    @abstractmethod
    def parse(
        self,
        run: RunSource,
        *,
        strict: bool = False,
        progress: Callable[[int], None] | None = None,
        **limits: Any,
    ) -> ParsedRun:
        """One run's tables, rejects and report; ``strict``: the first reject is an error."""
