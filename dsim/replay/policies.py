"""Alignment policies (docs/SPEC.md §3) as a registry: name -> aggregate over GPUs.

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

Adding a policy is one ``register`` call here: every aggregate has the same
signature, ``f(values [N, G]) -> [N]``, and the replay models, the config,
the options and the figures all read this registry. ``KNOWN`` (what may be
asked for) is separate from ``DEFAULT`` (what a config without explicit
``FETCH_ALIGN``/``START_ALIGN`` replays), so a new policy never changes what
existing configs compute.

Exactness: aggregates reduce the GPU columns one at a time, left to right
(``column_reduce``), so that the kernel stays bitwise equal to the row-by-row
reference (``sum(row) / G`` in Python sums left to right too).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from dsim.errors import UsageError

Aggregate = Callable[[np.ndarray], np.ndarray]
Policy = tuple[str, str]  # (fetch_align, start_align)


@dataclass(frozen=True)
class Alignment:
    """One registered alignment: how it aggregates fetch durations and starts.

    ``fetch``/``start`` are ``None`` for the identity (``actual``): every GPU
    keeps its own value.
    """

    name: str
    label: str
    fetch: Aggregate | None
    start: Aggregate | None

    @property
    def is_identity(self) -> bool:
        return self.fetch is None and self.start is None


def column_reduce(values: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """Reduce [N, G] over GPUs one column at a time, left to right (bitwise reproducible)."""
    out = np.array(values[:, 0], dtype=np.float64, copy=True)
    for g in range(1, values.shape[1]):
        ufunc(out, values[:, g], out=out)
    return out


def _min(values: np.ndarray) -> np.ndarray:
    return column_reduce(values, np.minimum)


def _mean(values: np.ndarray) -> np.ndarray:
    return np.divide(column_reduce(values, np.add), values.shape[1])


def _midpoint(values: np.ndarray) -> np.ndarray:
    """``max - (max - min) / 2``: the original analysis's formula, kept bit for bit."""
    hi = column_reduce(values, np.maximum)
    return hi - (hi - column_reduce(values, np.minimum)) / 2


#: name -> Alignment, in display order (the measured run first).
REGISTRY: dict[str, Alignment] = {}


def register(alignment: Alignment) -> Alignment:
    REGISTRY[alignment.name] = alignment
    return alignment


ACTUAL = register(Alignment("actual", "actual", None, None)).name
AVG = register(Alignment("avg", "avg", fetch=_mean, start=_midpoint)).name
MIN = register(Alignment("min", "min", fetch=_min, start=_min)).name

#: Every alignment that may be asked for, in display order.
KNOWN: tuple[str, ...] = tuple(REGISTRY)
#: What a config without FETCH_ALIGN / START_ALIGN replays: 3 x 3 = 9 pairs.
DEFAULT: tuple[str, ...] = (ACTUAL, AVG, MIN)
#: Former name of ``KNOWN``.
POLICIES = KNOWN

BASELINE: Policy = (ACTUAL, ACTUAL)


def label(name: str) -> str:
    """Display label of an alignment name (the name itself when unknown)."""
    alignment = REGISTRY.get(name)
    return alignment.label if alignment is not None else name


def normalize_policy(value: object) -> str:
    """Map a config value to a canonical policy name, or raise a ``UsageError``."""
    if value is False or value is None:
        return ACTUAL
    if isinstance(value, str) and value.strip().lower() in REGISTRY:
        return value.strip().lower()
    accepted = ", ".join(["false", "null", *(f'"{p}"' for p in REGISTRY)])
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
