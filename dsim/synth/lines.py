"""The two raw line layouts of docs/SPEC.md §1, formatted and merged by time.

The layouts are written here once, field by field, so that the text dsim
synth prints and the grammar dsim parse reads can be compared side by side;
the byte-level work is ``textmatrix``'s.
"""

from __future__ import annotations

import numpy as np

from dsim.synth.events import Events, take
from dsim.synth.textmatrix import Lines

# Training line fields printed as ``<label> <value> (<running mean>)``:
# (label, event column, decimals); the mean is the column ``<name>_avg``.
_MEASURES = (("Time", "step", 6), ("Data", "stall", 6), ("Throughput", "throughput", 3))


def _begin(ev: Events, before_rank: str) -> Lines:
    """Both kinds of line begin with the timestamp and, after some text, the rank."""
    lines = Lines(ev["time"].shape[0])
    lines.timestamp(ev["time"])
    lines.text(before_rank)
    lines.uint(ev["rank"])
    return lines


def fetch_lines(ev: Events) -> Lines:
    """``<timestamp> DEBUG:\tGPU: r worker_id: w, END FETCH at_time s data idx<i>``."""
    lines = _begin(ev, " DEBUG:\tGPU: ")
    lines.text(" worker_id: ")
    lines.uint(ev["worker"])
    lines.text(", END FETCH at_time ")
    lines.fixed(ev["fetch"], 6)
    lines.text(" data idx")
    lines.uint(ev["iteration"])
    lines.text("\n")
    return lines


def train_lines(ev: Events, iterations: int) -> Lines:
    """``<timestamp> GPU: r Epoch: [e][i/N]`` then Time, Data, Throughput with their means."""
    lines = _begin(ev, " GPU: ")
    lines.text(" Epoch: [")
    lines.uint(ev["epoch"])
    lines.text("][")
    lines.uint(ev["iteration"], pad_to=len(str(iterations)))
    lines.text(f"/{iterations}]")
    for label, column, decimals in _MEASURES:
        lines.text(f"\t{label} ")
        lines.fixed(ev[column], decimals)
        lines.text(" (")
        lines.fixed(ev[f"{column}_avg"], decimals)
        lines.text(")")
    lines.text("\n")
    return lines


def render_lines(
    fetch: Events, train: Events, iterations: int
) -> tuple[np.ndarray, np.ndarray, Events]:
    """Format both kinds of lines, ordered by time (ties: fetch first, then input order).

    Each kind arrives in (iteration, rank) order, so a stable sort by time alone
    gives one deterministic order whatever the chunking; the input is nearly
    sorted already, which the stable sort handles in about linear time.
    """
    kinds = []
    if fetch["time"].size:
        kinds.append(fetch_lines(fetch))
    if train["time"].size:
        kinds.append(train_lines(train, iterations))
    width = max(lines.width for lines in kinds)
    total = sum(lines.n for lines in kinds)
    matrix = np.empty((total, width), dtype=np.uint8)
    mask = np.empty((total, width), dtype=bool)
    row = 0
    for lines in kinds:
        lines.build(matrix[row : row + lines.n], mask[row : row + lines.n])
        row += lines.n
    keys = {k: np.concatenate([fetch[k], train[k]]) for k in ("time", "rank")}
    order = np.argsort(keys["time"], kind="stable")
    row_type = np.dtype((np.void, width))
    matrix = matrix.view(row_type).ravel()[order].view(np.uint8).reshape(total, width)
    mask = mask.view(np.uint8).view(row_type).ravel()[order].view(bool).reshape(total, width)
    return matrix, mask, take(keys, order)
