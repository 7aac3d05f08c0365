"""Alignment policies (DESIGN.md §3): how a replay rewrites fetch durations and starts.

A policy is a pair (fetch-align, start-align). Each side names an aggregate
over the GPUs of one iteration that every GPU then takes on:

==========  ===========================  ================================
name        fetch duration F'[g]         fetch start S'[g]
==========  ===========================  ================================
``actual``  F[g] (unchanged)             S[g] (unchanged)
``min``     min over GPUs of F           min over GPUs of S
``avg``     mean over GPUs of F          (max S + min S) / 2, the midpoint
==========  ===========================  ================================

``avg`` of starts is the midpoint, as the original analysis computed it; new
aggregates get new names and never change these. Configs may spell
``actual`` as ``false``, ``null`` or ``"actual"``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from dsim.errors import UsageError

ACTUAL = "actual"
MIN = "min"
AVG = "avg"
POLICIES: tuple[str, ...] = (ACTUAL, AVG, MIN)

Policy = tuple[str, str]  # (fetch_align, start_align)
BASELINE: Policy = (ACTUAL, ACTUAL)


def normalize_policy(value: object) -> str:
    """Map a config value to a canonical policy name, or raise a ``UsageError``."""
    if value is False or value is None:
        return ACTUAL
    if isinstance(value, str) and value.strip().lower() in POLICIES:
        return value.strip().lower()
    accepted = ", ".join(["false", "null", *(f'"{p}"' for p in POLICIES)])
    raise UsageError(f"unknown policy {value!r}; accepted: {accepted}")


def policy_pairs(fetch_aligns: Iterable[object], start_aligns: Iterable[object]) -> list[Policy]:
    """Every (fetch, start) pair, canonical names, duplicates removed, in config order."""
    fetch = [normalize_policy(v) for v in fetch_aligns]
    start = [normalize_policy(v) for v in start_aligns]
    return list(dict.fromkeys(itertools.product(fetch, start)))


def policy_label(policy: Policy) -> str:
    """File-name-safe label, e.g. ``avg__min``."""
    return f"{policy[0]}__{policy[1]}"


def parse_policy_label(label: str) -> Policy:
    fetch, sep, start = label.partition("__")
    if not sep:
        raise UsageError(f"not a policy label: {label!r} (expected FETCH__START, e.g. avg__min)")
    return normalize_policy(fetch), normalize_policy(start)
