"""Sample indices that say which batch they belong to: the exact cost-table lookup.

The loading cost of a batch is a function of (epoch, batch index, rank). A
dataset only sees sample indices, and persistent DataLoader workers keep the
dataset they were started with, so they cannot be told the epoch. The
harness's sampler therefore hands out indices that *encode* the cell:
sample j of batch i of epoch e on rank r is
``((e * iterations + i) * ranks + r) * batch_size + j``. Like
``DistributedSampler`` it gives each rank its own disjoint share of the
dataset; unlike it, it does not shuffle (the data are synthetic), and batch i
of an epoch is exactly the i-th batch the loader yields, which is the batch
index ``dsim.instrument`` logs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """Shape of a run: the index space is epochs x iterations x ranks x batch_size."""

    epochs: int
    iterations: int
    ranks: int
    batch_size: int

    def __len__(self) -> int:
        return self.epochs * self.iterations * self.ranks * self.batch_size

    def encode(self, epoch: int, batch: int, rank: int, sample: int) -> int:
        return ((epoch * self.iterations + batch) * self.ranks + rank) * self.batch_size + sample

    def decode(self, index: int) -> tuple[int, int, int, int]:
        """(epoch, batch, rank, sample) of a sample index; ValueError outside the layout."""
        if not 0 <= index < len(self):
            raise ValueError(f"sample index {index} outside the run's layout {self}")
        rest, sample = divmod(index, self.batch_size)
        rest, rank = divmod(rest, self.ranks)
        epoch, batch = divmod(rest, self.iterations)
        return epoch, batch, rank, sample


class TableSampler:
    """Per-rank sampler over a ``Layout``; ``set_epoch`` as with ``DistributedSampler``.

    Iterated in the training process (also with workers), so ``set_epoch``
    takes effect for persistent workers too.
    """

    def __init__(self, layout: Layout, rank: int):
        if not 0 <= rank < layout.ranks:
            raise ValueError(f"rank {rank} outside 0..{layout.ranks - 1}")
        self.layout = layout
        self.rank = rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        if not 0 <= epoch < self.layout.epochs:
            raise ValueError(f"epoch {epoch} outside 0..{self.layout.epochs - 1}")
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        lay = self.layout
        for batch in range(lay.iterations):
            for sample in range(lay.batch_size):
                yield lay.encode(self.epoch, batch, self.rank, sample)

    def __len__(self) -> int:
        return self.layout.iterations * self.layout.batch_size
