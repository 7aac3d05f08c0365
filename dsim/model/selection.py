"""Which iterations a summary counts: the epochs asked for and the warm-up (SPEC §5).

One place for the rules, because three callers apply them: the config check
before ``dsim run`` does any work, the summary of each replay, and the
report's per-iteration figures. An epoch that is not in the run is refused
with the same words wherever it is asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from dsim.errors import UsageError

Epochs = Sequence[int] | str | None  # explicit list, "all", or None for the default


def default_epochs(present: Sequence[int]) -> list[int]:
    """Every epoch but the first when there is more than one (the first carries warm-up)."""
    epochs = sorted({int(e) for e in present})
    return epochs[1:] if len(epochs) > 1 else epochs


def resolve_epochs(present: Sequence[int], epochs: Epochs, *, run: str = "") -> list[int]:
    """Turn an epochs option into a list, checking that every asked-for epoch exists."""
    have = sorted({int(e) for e in present})
    if epochs is None:
        return default_epochs(have)
    if isinstance(epochs, str):
        if epochs.strip().lower() == "all":
            return have
        raise UsageError(f"epochs must be a list of numbers or 'all', not {epochs!r}")
    wanted = sorted({int(e) for e in epochs})
    missing = [e for e in wanted if e not in have]
    if missing:
        raise UsageError(
            f"epoch(s) {', '.join(map(str, missing))} not in {f'run {run}' if run else 'the run'}; "
            f"available epochs: {', '.join(map(str, have)) or 'none'}"
        )
    return wanted


def selection_mask(
    epoch: np.ndarray, iteration: np.ndarray, epochs: Iterable[int], warmup: int
) -> np.ndarray:
    """Iterations that count: in a selected epoch and past the warm-up (``iteration > warmup``)."""
    return np.isin(np.asarray(epoch), np.asarray(list(epochs), dtype=np.int64)) & (
        np.asarray(iteration) > warmup
    )


__all__ = ["Epochs", "default_epochs", "resolve_epochs", "selection_mask"]
