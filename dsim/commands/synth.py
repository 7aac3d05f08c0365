"""`dsim synth`: placeholder until its issue lands (see docs/ARCHITECTURE.md)."""

from __future__ import annotations

from dsim.errors import UsageError


def command() -> None:
    """Not available yet."""
    raise UsageError("`dsim synth` is not implemented yet")
