"""The parse report's incomplete iterations against a plain-Python reference.

``_incomplete_iterations`` joins the per-iteration rank counts of the two
tables in NumPy (no pandas in the parse); the reference counts distinct ranks
per (epoch, iteration) with sets.
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from dsim.sources.rawlog.parse import _incomplete_iterations

rows = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5), st.integers(0, 3)), max_size=40)


def _table(records: list[tuple[int, int, int]]) -> pa.Table:
    epoch, iteration, gpu = zip(*records, strict=True) if records else ((), (), ())
    return pa.table(
        {
            "epoch": pa.array(epoch, pa.int64()),
            "iteration": pa.array(iteration, pa.int64()),
            "gpu": pa.array(gpu, pa.int32()),
        }
    )


def _reference(fetch, train, gpus: int) -> dict:
    ranks: dict[tuple[int, int], list[set[int]]] = {}
    for side, records in enumerate((fetch, train)):
        for e, i, g in records:
            ranks.setdefault((e, i), [set(), set()])[side].add(g)
    bad = [
        (key, len(f), len(t))
        for key, (f, t) in sorted(ranks.items())
        if len(f) < gpus or len(t) < gpus
    ]
    examples = [
        {"epoch": e, "iteration": i, "fetch_gpus": f, "train_gpus": t} for (e, i), f, t in bad[:5]
    ]
    return {"count": len(bad), "examples": examples}


@settings(max_examples=300, deadline=None)
@given(fetch=rows, train=rows, gpus=st.integers(1, 4))
def test_incomplete_iterations_match_a_row_by_row_count(fetch, train, gpus) -> None:
    got = _incomplete_iterations(_table(fetch), _table(train), gpus)
    assert got == _reference(fetch, train, gpus)


def test_complete_run_has_none_and_train_only_iterations_count() -> None:
    both = [(0, i, g) for i in range(3) for g in range(2)]
    assert _incomplete_iterations(_table(both), _table(both), 2) == {"count": 0, "examples": []}
    got = _incomplete_iterations(_table(both), _table([*both, (0, 7, 0), (0, 7, 1)]), 2)
    assert got == {
        "count": 1,
        "examples": [{"epoch": 0, "iteration": 7, "fetch_gpus": 0, "train_gpus": 2}],
    }
