"""A node's cores from its ranks' CPU sets (the loader lines' ``cpus``, docs/SPEC.md §1.2).

Why: ``cores`` is the count of one process's affinity mask. Where a launcher binds each
rank to cores of its own (``srun --cpu-bind``, ``numactl`` per rank), that is the rank's
share, and a node of 8 ranks bound to 8 cores each read as 8 cores for all of them: the
pipeline model then had 8x the node's real demand per core (or, past the cores' bound,
replayed independent of load, SPEC §4.2). The sets say what the node has: their union.
CPU ids number a node's CPUs, so only the sets of one node's ranks are joined. Where the
sets split a node's ranks into groups that share one set each, disjoint from the other
groups' (ranks 0-1 on CPU 0, ranks 2-3 on CPU 1), each group is a CPU domain of its own:
its ranks' workers compete only for its CPUs (``cpu_domain_ranks``).
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


def cpu_domain_ranks(
    records: Iterable[Mapping[str, Any]], ranks_per_node: int | None
) -> int | None:
    """Ranks per CPU domain, where every node's ranks split into runs of consecutive ranks
    that each share one CPU set, disjoint from the other runs' and of the same size as
    every other set, the runs all of one length: that length. ``None`` otherwise (a rank
    with no set or two, sets that overlap without being equal, uneven groups): the node
    is then one pool (``node_cores``)."""
    sets: dict[int, set[str]] = {}
    ranks_seen: set[int] = set()
    for record in records:
        ranks_seen.add(int(record["gpu"]))
        if record.get("cpus"):
            sets.setdefault(int(record["gpu"]), set()).add(str(record["cpus"]))
    if not sets or any(len(seen) != 1 for seen in sets.values()) or ranks_seen - sets.keys():
        return None  # a rank with two sets, or one whose lines gave none
    per_node = ranks_per_node if ranks_per_node and ranks_per_node > 0 else None
    ranks = sorted(sets)
    by_node: dict[int, list[int]] = {}
    for rank in ranks:
        by_node.setdefault(rank // per_node if per_node else 0, []).append(rank)
    sizes, lengths = set(), set()
    for members in by_node.values():
        if members != list(range(members[0], members[0] + len(members))):
            return None  # a rank of the node is missing from the loader lines
        runs: list[list[int]] = []
        for rank in members:
            if runs and next(iter(sets[runs[-1][-1]])) == next(iter(sets[rank])):
                runs[-1].append(rank)
            else:
                runs.append([rank])
        texts = [next(iter(sets[run[0]])) for run in runs]
        if len(set(texts)) != len(texts) or union_size(texts) != sum(
            union_size([t]) for t in texts
        ):
            return None  # a set shared by runs that are not neighbours, or overlapping sets
        sizes.update(union_size([t]) for t in texts)
        lengths.update(len(run) for run in runs)
    if len(sizes) != 1 or len(lengths) != 1:
        return None
    return lengths.pop()
