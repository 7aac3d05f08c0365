"""The raw DDP training log (docs/SPEC.md §1) as a ``Source``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsim.sources.base import ParsedRun, RunSource, Source


class RawLogSource(Source):
    """Fetch and training lines in text logs, one file or one file per rank."""

    name = "rawlog"

    def discover(self, paths: list[Path], name: str | None = None) -> list[RunSource]:
        from dsim.sources.rawlog.discover import discover_runs

        return discover_runs(paths, name=name)

    def parse(
        self,
        run: RunSource,
        *,
        strict: bool = False,
        progress: Callable[[int], None] | None = None,
        **limits: Any,
    ) -> ParsedRun:
        from dsim.sources.gpuutil import attach
        from dsim.sources.rawlog.parse import parse_run

        parsed = parse_run(run, strict=strict, progress=progress, **limits)
        if "max_line" in limits:  # nvidia-smi logs beside the run: the same line bound
            return attach(parsed, run.extras, strict=strict, max_line=limits["max_line"])
        return attach(parsed, run.extras, strict=strict)
