"""How policies and runs are named and ordered on the page.

Every figure and table lists policies in the same order (the measured run
first) and names them the same way, so a reader can match a bar, a heatmap
cell and a timeline trace at a glance.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from dsim.replay.policies import BASELINE, KNOWN, Policy, label


def policy_name(policy: Policy) -> str:
    """How a policy reads on the page: ``fetch avg / start min``."""
    return f"fetch {label(policy[0])} / start {label(policy[1])}"


def policy_of(row: Mapping[str, object]) -> Policy:
    return (str(row["fetch_align"]), str(row["start_align"]))


def ordered_policies(policies: Sequence[Policy]) -> list[Policy]:
    """Baseline first, then in the canonical order of the policy names."""
    rank = {name: i for i, name in enumerate(KNOWN)}

    def key(p: Policy) -> tuple[int, int, int, str, str]:
        return (p != BASELINE, rank.get(p[0], 99), rank.get(p[1], 99), p[0], p[1])

    return sorted(dict.fromkeys(policies), key=key)


def ordered_names(names: Iterable[str]) -> list[str]:
    """Distinct alignment names in canonical order; unknown ones after, sorted."""
    present = set(names)
    known = [n for n in KNOWN if n in present]
    return known + sorted(present - set(known))


def wrap_name(name: str, width: int = 34) -> str:
    """Break a long run name at underscores so axis labels stay readable side by side."""
    lines: list[str] = []
    current = ""
    for part in name.split("_"):
        piece = part if not current else "_" + part
        if current and len(current) + len(piece) > width:
            lines.append(current + "_")
            current = part
        else:
            current += piece
    lines.append(current)
    return "<br>".join(lines)
