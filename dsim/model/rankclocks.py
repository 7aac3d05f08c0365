"""Ranks' clocks set right: one rank's times shifted by its constant offset (docs/SPEC.md §1.7.1).

``dsim.model.consistency.clock_offsets`` finds a rank whose node clock is off
(its iteration ends all lie, say, an hour before the other ranks'); when the
offset is constant, that rank's fetch and training times are moved by
−offset here, so that replays align its batches with the other ranks' ones as
the job did. Every time of the rank moves by the same amount, so nothing
within its own timeline changes (durations, the epoch of each fetch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsim.io.arrowtables import numpy_of
from dsim.model.tables import RunTables


def _shifted(table: pa.Table, columns: tuple[str, ...], shift_ns: Mapping[int, int]) -> pa.Table:
    """``table`` with its time ``columns`` moved by ``shift_ns[gpu]`` on the rows of each rank."""
    if table.num_rows == 0:
        return table
    gpu = numpy_of(table.column("gpu"))
    delta = np.zeros(len(gpu), dtype=np.int64)
    for rank, ns in shift_ns.items():
        delta[gpu == rank] = ns
    for name in columns:
        index = table.schema.get_field_index(name)
        field = table.schema.field(index)
        moved = pc.add(table.column(name).cast(pa.int64()), pa.array(delta))
        table = table.set_column(index, field, moved.cast(field.type))
    return table


def shift_ranks(tables: RunTables, offsets_s: Mapping[int, float]) -> RunTables:
    """The run with each named rank's times moved by −offset (seconds, to the nanosecond)."""
    shift_ns = {int(g): -round(float(s) * 1e9) for g, s in offsets_s.items() if s}
    if not shift_ns:
        return tables
    return replace(
        tables,
        fetch=_shifted(tables.fetch, ("start", "end"), shift_ns),
        train=_shifted(tables.train, ("start",), shift_ns),
    )
