"""What a slow loader spends its fetches on: sample reads or collation (docs/SPEC.md §5.2).

Why: attribution names the rank whose loader is late; the fix depends on
what inside its fetches takes the time. With ``instrument_loader(...,
stages=True)`` each fetch record carries the wall and CPU seconds of the
dataset's sample reads (``__getitem__``/``__getitems__``: reading, decoding,
augmenting) and of the ``collate_fn`` (SPEC §1.2, §2.1). Per rank, each
stage's share of the fetch time, and the share of the stage's wall time its
thread spent on a core, say which stage dominates and whether it computes
(CPU-bound: more workers or cheaper transforms help only with idle cores)
or waits (I/O, a lock, a busy core). The two stages add up to the fetch
(dsim's own bookkeeping, microseconds, falls into them).

Pure functions over the fetch table; nothing is said of a run whose logs
carry no stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

STAGES = (("read", "sample reads"), ("collate", "collation"))
CPU_BOUND_PCT = 80.0  # a stage whose thread was on a core this much of its wall time computes
WAITING_PCT = 30.0  # ... and below this it mostly waited
STAGE_COLUMNS = (
    "stage_read_pct",
    "stage_read_cpu_pct",
    "stage_collate_pct",
    "stage_collate_cpu_pct",
)


@dataclass(frozen=True)
class StageShare:
    """One rank's fetches split into stages, over the selected iterations."""

    gpu: int
    fetches: int  # fetches that carried stages
    read_pct: float  # % of the fetch time spent in sample reads
    read_cpu_pct: float  # % of the reads' wall time the thread ran on a core (NaN: no time)
    collate_pct: float
    collate_cpu_pct: float

    def row(self) -> dict[str, float]:
        """The attribution table's stage columns (``STAGE_COLUMNS``)."""
        return dict(zip(STAGE_COLUMNS, self._values(), strict=True))

    def _values(self) -> tuple[float, float, float, float]:
        return (self.read_pct, self.read_cpu_pct, self.collate_pct, self.collate_cpu_pct)


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else float("nan")


def stage_shares(fetch: pa.Table, keep: np.ndarray | None = None) -> list[StageShare]:
    """Per rank (ascending), the stage shares of its fetches ``keep`` selects (all by default).

    Empty when the table has no stage columns or no selected fetch carries stages.
    """
    if "read_s" not in fetch.column_names or fetch.num_rows == 0:
        return []

    def col(name: str) -> np.ndarray:
        return np.asarray(fetch.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)

    read, collate = col("read_s"), col("collate_s")
    rows = ~np.isnan(read) & ~np.isnan(collate)
    if keep is not None:
        rows &= np.asarray(keep, dtype=bool)
    gpu = np.asarray(fetch.column("gpu").to_numpy(), dtype=np.int64)
    total, read_cpu, collate_cpu = col("fetch_s"), col("read_cpu_s"), col("collate_cpu_s")
    out = []
    for g in np.unique(gpu[rows]):
        here = rows & (gpu == g)
        wall = float(total[here].sum())
        r, c = float(read[here].sum()), float(collate[here].sum())
        out.append(
            StageShare(
                gpu=int(g),
                fetches=int(here.sum()),
                read_pct=_pct(r, wall),
                read_cpu_pct=_pct(float(np.nansum(read_cpu[here])), r),
                collate_pct=_pct(c, wall),
                collate_cpu_pct=_pct(float(np.nansum(collate_cpu[here])), c),
            )
        )
    return out


def _how(cpu_pct: float) -> str:
    if np.isnan(cpu_pct):
        return ""
    if cpu_pct >= CPU_BOUND_PCT:
        return f" (CPU-bound: CPU {min(cpu_pct, 100.0):.0f} % of wall)"
    if cpu_pct <= WAITING_PCT:
        return f" (waiting: CPU {cpu_pct:.0f} % of wall; I/O, a lock or a busy core)"
    return f" (CPU {cpu_pct:.0f} % of wall)"


def describe_stages(gpu: int, row: Mapping[str, Any], why: str = "") -> str | None:
    """``GPU 3: 71 % of fetch time is sample reads (CPU-bound: CPU 95 % of wall); ...``.

    ``row`` holds ``STAGE_COLUMNS`` (one rank's); None when it has no stages.
    The larger stage comes first: it is the one to work on.
    """
    values = {name: float(row.get(name, float("nan"))) for name in STAGE_COLUMNS}
    if np.isnan(values["stage_read_pct"]) or np.isnan(values["stage_collate_pct"]):
        return None
    parts = sorted(
        (
            (values[f"stage_{key}_pct"], label, values[f"stage_{key}_cpu_pct"])
            for key, label in STAGES
        ),
        key=lambda part: -part[0],
    )
    (top, label, cpu), rest = parts[0], parts[1:]
    text = f"Inside the fetch: GPU {gpu}{why}: {top:.0f} % of fetch time is {label}{_how(cpu)}"
    for pct, name, cpu_pct in rest:
        text += f"; {pct:.0f} % {name}{_how(cpu_pct)}"
    return text + "."
