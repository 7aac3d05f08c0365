"""PyTorch profiler (Kineto) traces as a ``Source`` (docs/SPEC.md §1.8).

A run is a directory of per-rank trace files, or the trace files given
together. Traces have no per-worker fetch records, so the run's fetch table
is empty: its stalls, delays and attribution by stall can be summarised, but
no alignment policy can be replayed (``dsim run`` says so).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from dsim.errors import InputError
from dsim.io.arrowtables import empty_table
from dsim.model.runinfo import RunInfo
from dsim.model.runname import parse_run_name
from dsim.model.tables import FETCH_SCHEMA, RunTables
from dsim.sources.base import ParsedRun, RunSource, Source

#: ``run.json``'s ``format`` of a run read from profiler traces.
FORMAT = "kineto"


def holds_traces(path: Path) -> bool:
    """Whether a path is a profiler trace, or a directory of them (and of no raw log)."""
    from dsim.sources.kineto import find_traces, is_trace_name

    try:
        if path.is_dir():
            if any(p.name.endswith(".log") for p in path.iterdir()):
                return False
            return bool(find_traces(path))
    except OSError:  # unreadable: the raw-log reader says so, naming the path
        return False
    return is_trace_name(path)


class KinetoSource(Source):
    """Per-rank Chrome-trace files written by ``torch.profiler`` (tensorboard_trace_handler)."""

    name = FORMAT

    def discover(self, paths: list[Path], name: str | None = None) -> list[RunSource]:
        from dsim.sources.kineto import find_traces

        runs: list[RunSource] = []
        loose: list[Path] = []
        for path in paths:
            if path.is_dir():
                files = tuple(find_traces(path))
                if not files:
                    raise InputError("no profiler traces (*.pt.trace.json[.gz])", path)
                runs.append(RunSource(path.resolve().name, files, origin=path))
            else:
                loose.append(path)
        if loose:  # trace files given one by one: the ranks of one run
            runs.append(
                RunSource(loose[0].resolve().parent.name, tuple(loose), origin=loose[0].parent)
            )
        if name is not None:
            if len(runs) != 1:
                raise InputError(f"--name names one run, but the paths hold {len(runs)}")
            runs = [RunSource(name, runs[0].files)]
        return runs

    def parse(
        self,
        run: RunSource,
        *,
        strict: bool = False,
        progress: Callable[[int], None] | None = None,
        **limits: Any,
    ) -> ParsedRun:
        from dsim.sources.kineto import read_profiled_run

        profiled = read_profiled_run(run.files, **_duration(limits))
        rejects = _as_line_rejects(profiled.rejects)
        if strict and rejects.num_rows:
            first = rejects.slice(0, 1).to_pylist()[0]
            raise InputError(f"event {first['line']}: {first['reason']}", Path(first["file"]))
        train = profiled.train
        if train.num_rows == 0:  # as the raw-log reader: a run of nothing is no run
            skipped = profiled.report.get("skipped") or {}
            reasons = "; ".join(f"{reason}: {n}" for reason, n in skipped.items())
            raise InputError(
                f"no profiler step left to replay, every one rejected ({reasons})",
                run.files[0] if len(run.files) == 1 else run.files[0].parent,
            )
        gpu_ids = sorted({int(g) for g in train["gpu"].to_pylist()})
        iterations = len(set(train["iteration"].to_pylist()))
        info = RunInfo(
            name=run.name,
            input_format=FORMAT,
            gpu_count=len(gpu_ids),
            gpu_ids=tuple(gpu_ids),
            epochs_present=(0,) if train.num_rows else (),
            iterations_per_epoch={"0": iterations} if train.num_rows else {},
            metadata=parse_run_name(run.name),
            sources=tuple(profiled.sources),
            report=profiled.report,
        )
        fetch = empty_table(FETCH_SCHEMA)
        return ParsedRun(RunTables(run.name, fetch, train, info), rejects, profiled.report)


def _as_line_rejects(rejects: pa.Table) -> pa.Table:
    """The trace's rejects (file, event, reason, name) in the columns of ``rejects.csv``:
    the event's index in ``traceEvents`` stands where a log's line number does."""
    return pa.table(
        {
            "file": rejects["file"],
            "line": rejects["event"],
            "reason": rejects["reason"],
            "text": rejects["name"],
        }
    )


def _duration(limits: dict[str, Any]) -> dict[str, float]:
    """``--max-duration`` for the profiler reader (the raw-log reader's other limits are
    about lines, which a trace has none of)."""
    return {"max_duration": limits["max_duration"]} if "max_duration" in limits else {}
