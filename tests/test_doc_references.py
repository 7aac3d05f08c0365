"""No reference to a file that is not in the repository (docs/SPEC.md is the contract).

Scans the tree users and contributors read (code, tests, benchmarks, docs,
README, traces, examples, configs) for two kinds of references: the old
contract ``DESIGN.md`` (replaced by docs/SPEC.md, and never in the
repository), and Markdown links ``](path)`` whose target does not exist
relative to the file that links. A dead reference fails CI here instead of
meeting a user who cloned the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

SCANNED = ["dsim", "tests", "bench", "docs", "README.md", "traces", "examples", "configs"]
SUFFIXES = {".py", ".md", ".json", ".toml", ".txt", ".html", ".cfg"}
#: Files that must exist wherever they are named (the project's own documents).
NAMED_FILES = re.compile(r"\b(DESIGN\.md|FIDELITY\.md|SPEC\.md|ARCHITECTURE\.md)\b")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
THIS_FILE = Path(__file__).resolve()


def _files() -> list[Path]:
    found: list[Path] = []
    for name in SCANNED:
        path = REPO / name
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += [p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in SUFFIXES]
    return [p for p in found if "__pycache__" not in p.parts and p.resolve() != THIS_FILE]


def dead_references(files: list[Path]) -> list[str]:
    """``file:line: reference`` for every reference to a file the repository lacks."""
    present = {p.name for p in REPO.rglob("*.md") if ".venv" not in p.parts}
    dead: list[str] = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{number}"
            for match in NAMED_FILES.finditer(line):
                if match[1] not in present:
                    dead.append(f"{where}: {match[1]} is not in the repository")
            if path.suffix != ".md":
                continue
            for match in LINK.finditer(line):
                target = match[1]
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
                    continue
                if not (path.parent / target).exists():
                    dead.append(f"{where}: link to missing {target}")
    return dead


def test_no_reference_points_outside_the_repository() -> None:
    assert dead_references(_files()) == []


def test_the_check_finds_dead_references(tmp_path: Path) -> None:
    page = REPO / "docs" / "_dead_reference_probe.md"
    page.write_text("See DESIGN.md §1 and [the spec](SPEC.md) and [gone](nowhere.md).\n")
    try:
        dead = dead_references([page])
    finally:
        page.unlink()
    assert len(dead) == 2, dead
    assert "DESIGN.md is not in the repository" in dead[0]
    assert "link to missing nowhere.md" in dead[1]
