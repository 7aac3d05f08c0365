"""How policies and runs are named and ordered on the page.

Every figure and table lists policies in the same order (the measured run
first) and names them the same way, so a reader can match a bar, a heatmap
cell and a timeline trace at a glance.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping, Sequence

from dsim.replay.policies import BASELINE, START_KNOWN, Policy, label


def policy_name(policy: Policy) -> str:
    """How a policy reads on the page: ``fetch avg / start min``."""
    return f"fetch {label(policy[0])} / start {label(policy[1])}"


def policy_of(row: Mapping[str, object]) -> Policy:
    return (str(row["fetch_align"]), str(row["start_align"]))


def ordered_policies(policies: Sequence[Policy]) -> list[Policy]:
    """Baseline first, then in the canonical order of the policy names."""
    rank = {name: i for i, name in enumerate(START_KNOWN)}

    def key(p: Policy) -> tuple[int, int, int, str, str]:
        return (p != BASELINE, rank.get(p[0], 99), rank.get(p[1], 99), p[0], p[1])

    return sorted(dict.fromkeys(policies), key=key)


def ordered_names(names: Iterable[str]) -> list[str]:
    """Distinct alignment names in canonical order; unknown ones after, sorted."""
    present = set(names)
    known = [n for n in START_KNOWN if n in present]
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


def tick_labels(labels: Sequence[str], room: int = 64) -> tuple[list[str], int]:
    """Run labels for a category axis, escaped and wrapped at underscores to share about
    ``room`` characters of width (18 at most per line, 8 at least), and the most lines
    one takes. Drawn unrotated: plotly rotates labels that do not fit by 45°, and a
    rotated label runs into the legend or the panel below."""
    width = max(8, min(18, room // max(len(labels), 1)))
    wrapped = [_wrap_at(label, width) for label in labels]
    return wrapped, max((w.count("<br>") + 1 for w in wrapped), default=1)


def _wrap_at(label: str, width: int) -> str:
    """``label`` escaped, in lines of at most ``width`` characters where it can break:
    after an underscore, after the ellipsis of a cut, and before a `` · `` variant."""
    pieces = [p for p in re.split(r"(?<=[_…])|(?= · )", label) if p]
    lines: list[str] = []
    for piece in pieces:
        if lines and len(lines[-1]) + len(piece) <= width:
            lines[-1] += piece
        else:
            lines.append(piece.lstrip())
    return "<br>".join(html.escape(line, quote=False) for line in lines)


SHORT_LABEL_WIDTH = 28
"""Most characters of a run's base name in a figure title or axis label."""

_VARIANT = re.compile(r"^(?P<model>[A-Za-z0-9_.]+?)(?:-w(?P<w>\d+)-p(?P<p>\d+))?$")


def variant_text(variant: str) -> str:
    """``pipeline-w8-p4`` → ``pipeline · 8 workers · prefetch 4``: the directory suffix
    spelled out."""
    match = _VARIANT.match(variant)
    if match is None:
        return variant
    parts = [match["model"]]
    if match["w"] is not None:
        parts += [f"{int(match['w'])} workers", f"prefetch {int(match['p'])}"]
    return " · ".join(parts)


def _split_display(name: str) -> tuple[str, str, str]:
    """A display name's base run, model variant and ``[directory]`` suffix."""
    suffix = ""
    if name.endswith("]") and " [" in name:
        name, _, rest = name.rpartition(" [")
        suffix = f" [{rest}"
    base, _, variant = name.partition("@")
    return base, variant, suffix


def _clip(text: str, width: int) -> str:
    """Cut from the middle: run names differ at both ends (dataset first, threads last)."""
    if len(text) <= width:
        return text
    head = (width - 1 + 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def short_labels(names: Sequence[str], width: int = SHORT_LABEL_WIDTH) -> dict[str, str]:
    """A short, unique label per run for titles and axes (the full name stays on hover
    and in the runs table).

    Underscore-separated words that every run's base name shares are dropped
    (they tell nothing apart); what is left is cut to ``width`` in the middle
    with an ellipsis; the model variant is spelled out after a ``·``; labels that
    would still collide get a ``#n`` suffix; two runs that the cut would make
    look alike keep their whole words instead.
    """
    splits = {n: _split_display(n) for n in dict.fromkeys(names)}
    words = {n: b.split("_") for n, (b, _, _) in splits.items()}
    bases = {b for b, _, _ in splits.values()}
    common: set[str] = set()
    if len(bases) > 1:
        common = set.intersection(*(set(w) for w in words.values()))
    kept = {n: "_".join([x for x in w if x not in common] or w) for n, w in words.items()}
    clipped = {n: _clip(k, width) for n, k in kept.items()}
    owners: dict[str, set[str]] = {}
    for n, c in clipped.items():
        owners.setdefault(c, set()).add(kept[n])
    out: dict[str, str] = {}
    for name, (_base, variant, suffix) in splits.items():
        # two different runs cut to the same text keep their whole distinct words
        label = clipped[name] if len(owners[clipped[name]]) == 1 else kept[name]
        if variant:
            label += " · " + variant_text(variant)
        if suffix:
            label += _clip(suffix, 16)
        out[name] = label
    seen: dict[str, int] = {}
    for name, label in out.items():
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1 or list(out.values()).count(label) > 1:
            out[name] = f"{label} #{seen[label]}"
    return out
