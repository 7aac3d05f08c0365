"""A batch's size in bytes, measured once per epoch on the batch the loop receives.

Why: every batch a DataLoader holds ahead of the loop (workers × prefetch
factor per rank) sits in memory — pinned memory with ``pin_memory=True`` —
so ``dsim tune`` can say what a recommended setting costs only if the logs
say how large a batch is (docs/SPEC.md §1.2, the loader line's
``batch_bytes``; §5.7). Counting is cheap: the tensors' sizes are read from
their metadata, nothing is copied, and only the epoch's first batch is
counted (the loader line is written then, once per rank and epoch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: Counting stops (and says "unknown") past this many objects in one batch: a batch
#: of Python objects that large is not what pinned memory holds, and walking it is not cheap.
MAX_ITEMS = 100_000


def batch_nbytes(batch: Any) -> int | None:
    """Sum of ``nbytes`` of the tensors in ``batch`` (nested lists, tuples, dicts).

    ``None`` when the batch holds no tensor or more than ``MAX_ITEMS``
    objects. PyTorch is imported here, never at import time (the loader that
    calls this has imported it already).
    """
    import torch

    total, found, seen = 0, False, 0
    stack = [batch]
    while stack:
        item = stack.pop()
        seen += 1
        if seen > MAX_ITEMS:
            return None
        if isinstance(item, torch.Tensor):
            total += item.element_size() * item.nelement()
            found = True
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total if found else None


class FirstBatch:
    """Stands in for an iterator's ``_next_data`` until its first batch, then steps aside.

    ``on_first(nbytes)`` is called once: with the first batch's size, or with
    ``None`` when the epoch ends without a batch or the iterator is re-armed
    for a new epoch before yielding one. The iterator's own ``_next_data``
    (its class's method) serves every later batch.
    """

    def __init__(self, iterator: Any, on_first: Callable[[int | None], None]):
        self.iterator = iterator
        self.on_first = on_first
        self.pending = True

    def __call__(self) -> Any:
        self.disarm()
        try:
            data = self.iterator._next_data()
        except StopIteration:
            self.report(None)
            raise
        self.report(batch_nbytes(data))
        return data

    def disarm(self) -> None:
        if self.iterator.__dict__.get("_next_data") is self:
            del self.iterator.__dict__["_next_data"]

    def report(self, nbytes: int | None) -> None:
        if self.pending:
            self.pending = False
            self.on_first(nbytes)


def on_first_batch(iterator: Any, on_first: Callable[[int | None], None]) -> None:
    """Call ``on_first`` with the size of the first batch ``iterator`` yields.

    A DataLoader iterator fetches every batch through ``self._next_data()``;
    an instance attribute of that name is found before the class's method,
    and removed again at the first batch. An iterator without it (a PyTorch
    that changed its internals) gets ``on_first(None)`` at once: the settings
    are still logged, only the size is unknown. A persistent-workers
    iterator re-armed before its previous epoch yielded reports that epoch's
    ``None`` first.
    """
    attributes = getattr(iterator, "__dict__", None)
    if attributes is None or not callable(getattr(iterator, "_next_data", None)):
        on_first(None)
        return
    stale = attributes.get("_next_data")
    if isinstance(stale, FirstBatch):
        stale.disarm()
        stale.report(None)
    attributes["_next_data"] = FirstBatch(iterator, on_first)
