"""Alignment policies (docs/SPEC.md §3) as a registry: name -> aggregate over GPUs.

A policy is a pair (fetch-align, start-align). Each side names an aggregate
over the GPUs of one iteration that every GPU then takes on:

==========  ===========================  ================================
name        fetch duration F'[g]         fetch start S'[g]
==========  ===========================  ================================
``actual``  F[g] (unchanged)             S[g] (unchanged)
``min``     min over GPUs of F           min over GPUs of S
``avg``     mean over GPUs of F          (max S + min S) / 2, the midpoint
``max``     (not a fetch alignment)      max over GPUs of S (a barrier)
==========  ===========================  ================================

``avg`` of starts is the midpoint, as the original analysis computed it; new
aggregates get new names and never change these. ``max`` is a start
alignment only: every GPU starts batch i when the last one could (a
barrier). It is known but not in ``DEFAULT``, so configs replay what they
always did; on the fetch side it is a ``UsageError``. The pipeline model
applies every start aggregate causally (a fetch never starts before its
rank's own causal start, docs/SPEC.md §4.2); the per-iteration model sets
every start to it, as §3 does for ``min`` and ``avg``.

Stall alignments (docs/SPEC.md §4.3) align neither side: ``stall-min`` and
``stall-avg`` replace every GPU's training stall by the min / mean over GPUs,
which needs only the train table (profiler traces have no fetch records).
They stand on the fetch side of a pair whose start side is ``actual``
(``stall-min/actual``), so file names, summary columns and figures keep
their pair form; only the ``stall-only`` replay model replays them. Configs may spell
``actual`` as ``false``, ``null`` or ``"actual"``.

Adding a policy is one ``register`` call here: every aggregate has the same
signature, ``f(values [N, G]) -> [N]``, and the replay models, the config,
the options and the figures all read this registry. ``KNOWN`` (the
alignments that may stand on either side) and ``START_KNOWN`` (those and the
start-only ones; ``STALL_ALIGNMENTS`` are apart) are separate from
``DEFAULT`` (what a config without explicit ``FETCH_ALIGN``/``START_ALIGN``
replays), so a new policy never changes what existing configs compute.

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
    stall: Aggregate | None = None  # a stall alignment: every GPU's stall takes this value

    @property
    def is_identity(self) -> bool:
        return self.fetch is None and self.start is None and self.stall is None


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


def _max(values: np.ndarray) -> np.ndarray:
    return column_reduce(values, np.maximum)


#: name -> Alignment, in display order (the measured run first).
REGISTRY: dict[str, Alignment] = {}


def register(alignment: Alignment) -> Alignment:
    REGISTRY[alignment.name] = alignment
    return alignment


ACTUAL = register(Alignment("actual", "actual", None, None)).name
AVG = register(Alignment("avg", "avg", fetch=_mean, start=_midpoint)).name
MIN = register(Alignment("min", "min", fetch=_min, start=_min)).name
MAX = register(Alignment("max", "max", fetch=None, start=_max)).name
STALL_AVG = register(Alignment("stall-avg", "stall avg", None, None, stall=_mean)).name
STALL_MIN = register(Alignment("stall-min", "stall min", None, None, stall=_min)).name


def is_start_only(name: str) -> bool:
    """Whether ``name`` aligns starts but has no fetch side (``max``): fetch-side use is refused."""
    alignment = REGISTRY.get(name)
    return alignment is not None and alignment.fetch is None and alignment.start is not None


#: The alignments that may stand on either side, in display order; every pair of them is
#: a policy of the fetch models.
KNOWN: tuple[str, ...] = tuple(
    name for name, a in REGISTRY.items() if a.stall is None and not is_start_only(name)
)
#: Alignments of starts only (``max``): they pair with any fetch alignment of ``KNOWN``.
START_ONLY: tuple[str, ...] = tuple(name for name in REGISTRY if is_start_only(name))
#: Every start alignment that may be asked for, in display order.
START_KNOWN: tuple[str, ...] = KNOWN + START_ONLY
#: Former name of ``KNOWN``.
POLICIES = KNOWN
#: The stall alignments (the stall-only model; they pair only with start ``actual``).
STALL_ALIGNMENTS: tuple[str, ...] = (STALL_AVG, STALL_MIN)
#: What a config without FETCH_ALIGN / START_ALIGN replays: 3 x 3 = 9 pairs.
DEFAULT: tuple[str, ...] = (ACTUAL, AVG, MIN)
#: What a run without fetch records replays by default (the ``stall-only`` model).
STALL_ONLY: tuple[Policy, ...] = ((ACTUAL, ACTUAL), (STALL_AVG, ACTUAL), (STALL_MIN, ACTUAL))

BASELINE: Policy = (ACTUAL, ACTUAL)


def label(name: str) -> str:
    """Display label of an alignment name (the name itself when unknown)."""
    alignment = REGISTRY.get(name)
    return alignment.label if alignment is not None else name


def is_stall_alignment(name: str) -> bool:
    """Whether ``name`` is a stall alignment (``stall-min``, ``stall-avg``)."""
    alignment = REGISTRY.get(name)
    return alignment is not None and alignment.stall is not None


def needs_fetch(policy: Policy) -> bool:
    """Whether replaying ``policy`` needs fetch records: any side that aligns fetches or starts."""
    return any(
        (a := REGISTRY.get(side)) is not None and (a.fetch is not None or a.start is not None)
        for side in policy
    )


def check_pair(policy: Policy) -> None:
    """A stall alignment stands on the fetch side with start ``actual``, a start-only alignment
    on the start side; else a ``UsageError``."""
    fetch, start = policy
    if is_start_only(fetch):
        raise UsageError(
            f"{fetch} aligns fetch starts only: it goes on the start side (actual/{fetch}), "
            f"not {fetch}/{start}"
        )
    if is_stall_alignment(start):
        raise UsageError(
            f"{start} is a stall alignment: it goes on the fetch side ({start}/actual)"
        )
    if is_stall_alignment(fetch) and start != ACTUAL:
        raise UsageError(
            f"{fetch} replaces stalls, not fetches: it pairs only with start actual "
            f"({fetch}/actual), not {fetch}/{start}"
        )


def normalize_policy(value: object) -> str:
    """Map a config value to a canonical policy name, or raise a ``UsageError``."""
    if value is False or value is None:
        return ACTUAL
    if isinstance(value, str) and value.strip().lower() in REGISTRY:
        return value.strip().lower()
    accepted = ", ".join(["false", "null", *(f'"{p}"' for p in REGISTRY)])
    raise UsageError(f"unknown policy {value!r}; accepted: {accepted}")


def policy_pairs(fetch_aligns: Iterable[object], start_aligns: Iterable[object]) -> list[Policy]:
    """Every (fetch, start) pair, canonical names, duplicates removed, in config order.

    A stall alignment on the fetch side pairs only with start ``actual`` (it has
    no start side); one on the start side is a ``UsageError``.
    """
    fetch = [normalize_policy(v) for v in fetch_aligns]
    start = [normalize_policy(v) for v in start_aligns]
    for name in start:
        check_pair((ACTUAL, name))
    for name in fetch:
        if is_start_only(name):
            check_pair((name, ACTUAL))
    pairs = itertools.product(fetch, start)
    return list(
        dict.fromkeys(p for p in pairs if not (is_stall_alignment(p[0]) and p[1] != ACTUAL))
    )


def policy_label(policy: Policy) -> str:
    """File-name-safe label, e.g. ``avg__min``."""
    return f"{policy[0]}__{policy[1]}"


def parse_policy_label(label: str) -> Policy:
    fetch, sep, start = label.partition("__")
    if not sep:
        raise UsageError(f"not a policy label: {label!r} (expected FETCH__START, e.g. avg__min)")
    return normalize_policy(fetch), normalize_policy(start)
