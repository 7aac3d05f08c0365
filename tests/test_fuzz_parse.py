"""A seeded mutation fuzzer over real and generated logs: no internal error, no record moved.

Each case edits a log a few times (``fuzzlog``: byte flips, dropped,
duplicated and inserted lines, swapped fields, lines cut short, binary
garbage, changed digits, a file cut inside its last line), parses it in
process and checks, against the parse of the unedited log, that

(a) nothing but an ``InputError`` for an unusable input escapes;
(b) every record kept from an unchanged line is that line's original record;
(c) every iteration no edit touched keeps exactly its records.

Two more generators keep the parse bounds covered: lines stretched to either
side of the line limit (a run with one over it fails naming that line), and
profiler traces nesting and stretching names about the depth and string bounds.

``DSIM_FUZZ_CASES`` sets the number of cases (default 300, about 15 s);
``DSIM_FUZZ_SEED`` the first case's seed, to reproduce a failure alone.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
from conftest import REPO
from fuzzlog import FUZZ_EDITS, LONG_EDITS, Original, check, mutate, nested_trace

from dsim.synth import SynthParams, synthesize

CASES = int(os.environ.get("DSIM_FUZZ_CASES", "300"))
FIRST = int(os.environ.get("DSIM_FUZZ_SEED", "0"))
SAMPLE = REPO / "traces" / "raw" / "cpuDDP_synthetic_none_mlp_epoch2_b128_worker2_thread0"


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[tuple[Path, Original]]:
    """The shipped sample (4 per-rank files, 4,800 lines) and small generated runs."""
    out = tmp_path_factory.mktemp("sources")
    runs = [SAMPLE]
    for seed, per_rank, workers in ((0, False, 2), (1, True, 3), (2, False, 1)):
        params = SynthParams(
            gpus=3, iterations=24, epochs=2, workers=workers, prefetch=2, seed=seed,
            per_rank=per_rank, straggler_prob=0.1, name=f"synth{seed}",
        )  # fmt: skip
        runs.append(synthesize(params, out))
    return [(run, Original(run)) for run in runs]


def test_fuzzed_logs_parse_to_their_original_records(sources, tmp_path):
    outcomes = {"error": 0, "rejected": 0}
    for case in range(FIRST, FIRST + CASES):
        rng = random.Random(case)
        run, original = sources[case % len(sources)]
        edits = rng.randint(1, 6) if rng.random() < 0.8 else rng.randint(7, 25)
        mutant = mutate(run, rng, edits, kinds=FUZZ_EDITS)
        where = tmp_path / f"case{case}"
        try:
            result = check(original, mutant, where)
        except AssertionError as exc:
            raise AssertionError(f"case {case} (DSIM_FUZZ_SEED={case}) on {run.name}") from exc
        for key in outcomes:
            outcomes[key] += int(result.get(key, 0) > 0)
        shutil.rmtree(where)
    assert outcomes["rejected"] > CASES // 2  # the edits do reach the parser's rules


LONG_CASES = max(CASES // 5, 10)  # cases with lines about the line limit (about 3 s)


def test_fuzzed_logs_with_long_lines_fail_on_the_first_one_or_parse_as_before(sources, tmp_path):
    """The long-line edit stretches lines to either side of ``fuzzlog.LINE_LIMIT``: a run
    with a line over it fails naming that line, one without parses as the oracle says."""
    outcomes = {"too long": 0, "parsed": 0}
    for case in range(FIRST, FIRST + LONG_CASES):
        rng = random.Random(10_000 + case)
        run, original = sources[case % len(sources)]
        mutant = mutate(run, rng, rng.randint(1, 6), kinds=LONG_EDITS)
        where = tmp_path / f"case{case}"
        try:
            result = check(original, mutant, where)
        except AssertionError as exc:
            raise AssertionError(f"long-line case {case} (DSIM_FUZZ_SEED={case})") from exc
        outcomes["too long" if result.get("too long") else "parsed"] += 1
        shutil.rmtree(where)
    assert min(outcomes.values()) > 0, outcomes  # both outcomes are reached


TRACE_CASES = max(CASES // 3, 20)


def test_fuzzed_traces_about_the_depth_and_string_bounds(tmp_path, monkeypatch):
    """Traces nesting about MAX_DEPTH deep with names about MAX_STRING_BYTES long (bounds
    lowered, and ijson fed a few bytes at a time, so that cases are small and chunk edges
    fall everywhere): the first bound crossed is the error, or the trace reads whole."""
    import gzip

    from dsim.errors import InputError
    from dsim.sources import jsonbounds, kineto

    max_depth, max_string = 12, 200
    monkeypatch.setattr(jsonbounds, "MAX_DEPTH", max_depth)
    monkeypatch.setattr(jsonbounds, "MAX_STRING_BYTES", max_string)
    outcomes = {"nested deeper": 0, "string longer": 0, None: 0}
    for case in range(FIRST, FIRST + TRACE_CASES):
        rng = random.Random(20_000 + case)
        monkeypatch.setattr(kineto, "_READ_BYTES", rng.choice([1, 7, 64, 4096]))
        text, error = nested_trace(rng, max_depth, max_string)
        path = tmp_path / f"rank0.{case}.pt.trace.json"
        if rng.random() < 0.3:
            path = path.with_name(path.name + ".gz")
            text = gzip.compress(text)
        path.write_bytes(text)
        where = f"trace case {case} (DSIM_FUZZ_SEED={case}): expected {error}"
        try:
            trace = kineto.read_trace(path)
        except InputError as exc:
            assert error is not None and f"JSON {error} than" in str(exc), (where, str(exc))
            assert exc.path == path, where
        else:
            assert error is None, where
            assert len(trace.steps["step"]) == len(trace.loader["ts"]) > 0, where
        outcomes[error] += 1
    assert min(outcomes.values()) > 0, outcomes
