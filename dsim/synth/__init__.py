"""Synthetic raw logs from a queueing model of DDP data loading.

Tests, benchmarks and demos need raw logs of any size whose ground truth is
known exactly; real logs are few, small and cannot be shipped. This package
models what produces the timing in a real log and prints it in the raw log
format of docs/SPEC.md §1, so that every later step (parse, replay, summary) can
be exercised on it. One module per step, data flowing one way:

- ``params``: what determines a run, and which parameters are refused;
- ``model``: the queueing model, pure NumPy, yielding the timeline in chunks;
- ``events``: chunks → line columns, released in exact time order;
- ``textmatrix``: numbers → ASCII digits in byte matrices (no per-line Python);
- ``lines``: the two raw line layouts, merged by time into bytes;
- ``writer``: the destination check and the atomic, streaming write.

Output is byte-identical for a given seed: each random stream is drawn in one
fixed order that does not depend on the chunking.
"""

from __future__ import annotations

from dsim.synth.model import Chunk, simulate
from dsim.synth.params import US_PER_S, SynthParams
from dsim.synth.writer import SINGLE_FILE, check_output, synthesize

__all__ = [
    "SINGLE_FILE",
    "US_PER_S",
    "Chunk",
    "SynthParams",
    "check_output",
    "simulate",
    "synthesize",
]
