"""The specification, shipped with the package, and its sections (``dsim help spec``).

Help texts, notes and the HTML report cite sections of the spec (``§5.6``).
An installed wheel has no ``docs/`` folder, so the spec travels as package
data (``dsim/SPEC.md``, the repository's ``docs/SPEC.md``: ``pyproject.toml``
ships it) and ``dsim help spec SECTION`` prints a section; a citation names
that command (``cite``), which every user of dsim can run. Pure text: no
Markdown is rendered, so the output pipes into ``less`` or ``grep`` as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from dsim.errors import DsimError, UsageError

FILE = "SPEC.md"
COMMAND = "dsim help spec"
"""What a reader types to open a cited section."""

_HEADING = re.compile(r"^(#{2,4}) (\d+(?:\.\d+)*)\.? +(.*\S)\s*$")
_NUMBER = re.compile(r"^§?\s*(\d+(?:\.\d+)*)\.?$")


@dataclass(frozen=True)
class Section:
    """One numbered heading of the spec and the lines it spans (its subsections too)."""

    number: str  # "5.6"
    title: str  # "Machine interfaces: `--json`, `--out -`, `--fail-if`"
    level: int  # 2 for "## 5.", 3 for "### 5.6", 4 for "#### ..."
    start: int  # index of its heading line
    end: int  # index after its last line


def text() -> str:
    """The spec shipped with this dsim (``DsimError`` when the installation lacks it)."""
    try:
        return resources.files("dsim").joinpath(FILE).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError) as exc:  # a broken or partial install
        raise DsimError(
            f"the specification ({FILE}) is not installed with this dsim; reinstall dsim"
        ) from exc


def sections(spec: str) -> list[Section]:
    """The numbered headings of ``spec`` in order, each up to the next heading of its level
    or a higher one (so ``5`` spans ``5.1`` … ``5.7``)."""
    lines = spec.splitlines()
    found = [(i, m) for i, line in enumerate(lines) if (m := _HEADING.match(line)) is not None]
    out = []
    for k, (i, m) in enumerate(found):
        level = len(m[1])
        end = next((j for j, n in found[k + 1 :] if len(n[1]) <= level), len(lines))
        out.append(Section(m[2], m[3], level, i, end))
    return out


def cite(number: str) -> str:
    """``§5.6 (dsim help spec 5.6)``: a section and the command that prints it."""
    return f"§{number} ({COMMAND} {number})"


def find(spec: str, query: str) -> str:
    """The text of the section ``query`` names: a number (``5.6``, ``§5.6``), else words of a
    heading's title, else a named part of a section (``One answer``: the paragraph that
    opens with it in bold, up to the next heading). ``UsageError`` when none matches."""
    lines = spec.splitlines()
    numbered = sections(spec)
    asked = query.strip().strip("\"'“”")
    number = _NUMBER.match(asked)
    if number is not None:
        hit = next((s for s in numbered if s.number == number[1]), None)
        if hit is not None:
            return "\n".join(lines[hit.start : hit.end]).rstrip() + "\n"
    elif asked:
        words = asked.lower()
        hit = next((s for s in numbered if words in s.title.lower()), None)
        if hit is not None:
            return "\n".join(lines[hit.start : hit.end]).rstrip() + "\n"
        lead = re.compile(r"^\*\*" + re.escape(asked) + r"[.:]?\*\*", re.IGNORECASE)
        start = next((i for i, line in enumerate(lines) if lead.match(line)), None)
        if start is not None:
            end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")), None)
            return "\n".join(lines[start : end or len(lines)]).rstrip() + "\n"
    raise UsageError(
        f"the spec has no section {query!r}: give a number such as 5.6 or words of a title "
        f"(`{COMMAND}` lists the sections)"
    )


def contents(spec: str) -> str:
    """The table of contents: one line per numbered heading, indented by its level."""
    return "".join(f"{'  ' * (s.level - 2)}§{s.number} {s.title}\n" for s in sections(spec))
