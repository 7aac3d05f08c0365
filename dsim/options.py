"""Values of command-line options that several commands share.

``dsim run``, ``dsim summarize`` and ``dsim report`` accept the same
``--epochs``, ``--policy`` and ``--run`` spellings; parsing them in one place
keeps the commands consistent and their error messages identical.
"""

from __future__ import annotations

import fnmatch
import re
from typing import TYPE_CHECKING

from dsim.errors import UsageError
from dsim.replay.policies import (
    ACTUAL,
    Policy,
    check_pair,
    is_stall_alignment,
    normalize_policy,
)

if TYPE_CHECKING:
    from dsim.model.results import ResultRun


def parse_epochs_option(text: str | None) -> list[int] | str | None:
    """``all``, ``2``, ``1,3`` or ``1-3`` (ranges inclusive); ``None`` when not given."""
    if text is None:
        return None
    text = text.strip()
    if text.lower() == "all":
        return "all"
    epochs: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise UsageError(f"--epochs: expected 'all', N, N,M or N-M, not {text!r}")
        lo = int(match.group(1))
        hi = int(match.group(2) or lo)
        if hi < lo:
            raise UsageError(f"--epochs: empty range {part.strip()!r}")
        epochs.extend(range(lo, hi + 1))
    return sorted(set(epochs))


def parse_policy_option(text: str) -> Policy:
    """``avg/min``, ``avg__min`` or ``avg,min`` (fetch first) -> a canonical policy pair.

    A stall alignment alone (``stall-min``) means ``stall-min/actual``.
    """
    parts = re.split(r"__|/|,|:", text.strip())
    if len(parts) == 1 and is_stall_alignment(parts[0].strip().lower()):
        parts.append(ACTUAL)
    if len(parts) != 2:
        raise UsageError(f"--policy: expected FETCH/START such as avg/min, not {text!r}")
    policy = normalize_policy(parts[0]), normalize_policy(parts[1])
    try:
        check_pair(policy)
    except UsageError as exc:
        raise UsageError(f"--policy: {exc}") from None
    return policy


def select_runs(runs: list[ResultRun], globs: list[str] | None) -> list[ResultRun]:
    """Runs whose name matches any ``--run`` glob (all runs without one)."""
    if not globs:
        return runs
    known = {r.name for r in runs}
    # a glob naming a run exactly is that run (a run named a[1] or a*b), else a glob
    exact = [g for g in globs if g in known]
    patterns = [g for g in globs if g not in known]
    chosen = [
        r for r in runs if r.name in exact or any(fnmatch.fnmatchcase(r.name, g) for g in patterns)
    ]
    if not chosen:
        names = ", ".join(r.name for r in runs[:10]) + (" …" if len(runs) > 10 else "")
        raise UsageError(f"--run {' '.join(globs)} matches no run; runs found: {names}")
    return chosen
