"""A seeded mutation fuzzer over real and generated logs: no internal error, no record moved.

Each case edits a log a few times (``fuzzlog``: byte flips, dropped,
duplicated and inserted lines, swapped fields, lines cut short, binary
garbage, changed digits, a file cut inside its last line), parses it in
process and checks, against the parse of the unedited log, that

(a) nothing but an ``InputError`` for an unusable input escapes;
(b) every record kept from an unchanged line is that line's original record;
(c) every iteration no edit touched keeps exactly its records.

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
from fuzzlog import FUZZ_EDITS, Original, check, mutate

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
