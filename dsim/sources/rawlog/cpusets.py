"""A node's cores from its ranks' CPU sets (the loader lines' ``cpus``, docs/SPEC.md §1.2).

Why: ``cores`` is the count of one process's affinity mask. Where a launcher binds each
rank to cores of its own (``srun --cpu-bind``, ``numactl`` per rank), that is the rank's
share, and a node of 8 ranks bound to 8 cores each read as 8 cores for all of them: the
pipeline model then had 8x the node's real demand per core (or, past the cores' bound,
replayed independent of load, SPEC §4.2). The sets say what the node has: their union.
CPU ids number a node's CPUs, so only the sets of one node's ranks are joined.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def intervals(text: str) -> list[tuple[int, int]]:
    """``0-7,16`` as closed intervals ``[(0, 7), (16, 16)]`` (the grammar checked the form)."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        out.append((min(first, last), max(first, last)))
    return out


def union_size(sets: Iterable[str]) -> int:
    """How many CPUs the sets name together (merged as intervals: a set of ``0-999999``
    costs no more than ``0-7``)."""
    merged = sorted(i for text in sets for i in intervals(text))
    total, end = 0, -1
    for lo, hi in merged:
        if hi <= end:
            continue
        total += hi - max(lo, end + 1) + 1
        end = hi
    return total


def node_cores(records: Iterable[Mapping[str, Any]], ranks_per_node: int | None) -> int | None:
    """The fewest CPUs any node's ranks may use together: per node (rank // ranks per node;
    one node when that is unknown), the union of every loader line's ``cpus``; ``None``
    when no line carries them."""
    by_node: dict[int, list[str]] = {}
    per_node = ranks_per_node if ranks_per_node and ranks_per_node > 0 else None
    for record in records:
        if record.get("cpus"):
            node = int(record["gpu"]) // per_node if per_node else 0
            by_node.setdefault(node, []).append(str(record["cpus"]))
    if not by_node:
        return None
    return min(union_size(sets) for sets in by_node.values())
