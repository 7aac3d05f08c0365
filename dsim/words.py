"""Counts in English: "1 GPU", "2 GPUs" — one rule for every printed count.

A count printed with a fixed plural ("1 DataLoader workers") reads as a bug
to a careful user; every message, verdict and table line that prints a
count with its noun goes through ``counted``. Lowest layer: imports nothing.
"""

from __future__ import annotations

_SIBILANT = ("s", "x", "z", "ch", "sh")
#: Words whose "ch" is a k: epoch → epochs, not epoches.
_HARD_CH = ("epoch",)


def plural(noun: str) -> str:
    """The regular English plural of ``noun`` (its last word): GPU → GPUs, policy → policies."""
    if noun.endswith(_SIBILANT) and not noun.endswith(_HARD_CH):
        return noun + "es"
    if len(noun) > 1 and noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def counted(n: int | float, noun: str, many: str | None = None, *, sep: str = "") -> str:
    """``n`` and ``noun``, the noun plural unless ``n`` is exactly 1 ("0 GPUs", "1 GPU").

    ``many`` overrides the plural for an irregular noun; ``sep=","`` prints
    thousands separators (``12,000 iterations``).
    """
    value = int(n) if isinstance(n, float) and n.is_integer() else n
    number = format(value, sep)
    word = noun if n == 1 else (many or plural(noun))
    return f"{number} {word}"


def byte_size(n: float) -> str:
    """``n`` bytes in binary units as a reader takes them in: ``512 B``, ``1.5 GiB``,
    ``18.2 TiB`` (up to PiB: an absurd request is still one short number)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    for unit in units:
        if n < 1024 or unit == units[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable: the last unit returns")  # pragma: no cover
