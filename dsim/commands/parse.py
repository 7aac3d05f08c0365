"""`dsim parse`: placeholder (being written)."""

from __future__ import annotations


def command() -> None:
    """Not available yet."""
