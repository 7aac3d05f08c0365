"""What dsim's messages cite must be reachable by a user of an installed wheel (#22).

An installed wheel has no ``docs/``: a help text or error that sends the user
to ``docs/SPEC.md §4.3`` sends them nowhere. Messages cite the command's own
``--help`` instead, and this test checks each such citation against that help.
Every ``SPEC §N`` still cited in a printed string (the report's footer and
notes, owned by the report) must at least name a section the spec has.
Docstrings and comments are for contributors, who have the repository.
"""

from __future__ import annotations

import ast
import re

from conftest import REPO, run_dsim

#: The HTML report (dsim/render/html.py, dsim/render/figures/) is a file a user opens
#: next to the repository's link; its citations are checked for existence only.
REPORT = ("dsim/render/html.py", "dsim/render/figures/")
SECTION = re.compile(r"SPEC(?:\.md)? §(\d+(?:\.\d+)*)")
HELP_CITATION = re.compile(r"see (--[\w-]+)[^`]*`dsim (\w+) --help`")


def _printed_strings() -> list[tuple[str, str]]:
    """(file, text) of every string constant in dsim/ that is not a docstring."""
    found = []
    for path in sorted((REPO / "dsim").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(tree):
            text = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if text and id(node) not in docs:
                found.append((rel, node.value))
    return found


def _spec_sections() -> set[str]:
    text = (REPO / "docs" / "SPEC.md").read_text(encoding="utf-8")
    return set(re.findall(r"^#{2,4} (\d+(?:\.\d+)*)[. ]", text, flags=re.M))


def test_no_message_cites_a_file_an_installed_wheel_lacks() -> None:
    cited = [
        (path, text[:80])
        for path, text in _printed_strings()
        if "docs/" in text and not path.startswith(REPORT)
    ]
    assert cited == []


def test_every_cited_spec_section_exists() -> None:
    sections = _spec_sections()
    assert {"1.2", "4.3", "5.2", "9.1"} <= sections
    missing = [
        (path, number)
        for path, text in _printed_strings()
        for number in SECTION.findall(text)
        if number not in sections
    ]
    assert missing == []


def test_every_cited_help_names_an_option_it_has() -> None:
    citations = {m.groups() for _, text in _printed_strings() for m in HELP_CITATION.finditer(text)}
    assert ("--model", "run") in citations
    for option, command in sorted(citations):
        proc = run_dsim(command, "--help", env={"COLUMNS": "200"})
        assert proc.returncode == 0 and option in proc.stdout, (command, option)
