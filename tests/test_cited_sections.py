"""What dsim's messages cite must be reachable by a user of an installed wheel (#22).

An installed wheel has no ``docs/``: a help text, note or report that sends the
user to ``docs/SPEC.md §4.3`` sends them nowhere. The spec ships as package data
(``dsim/SPEC.md``, the repository's ``docs/SPEC.md``) and ``dsim help spec
SECTION`` prints a section, so every printed citation — help texts (the
commands' own docstrings included), errors, notes, the report's templates,
notes and footer — cites a section of the shipped spec (``§N``, ``dsim help spec
N``) or a command's own ``--help``. Docstrings and comments elsewhere are for
contributors, who have the repository. No wheel is built here: what the package
ships is read the way an installed dsim reads it (``importlib.resources``).
"""

from __future__ import annotations

import ast
import re
import tomllib
from importlib import resources
from pathlib import Path

from conftest import REPO, run_dsim

from dsim import spec

SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)|dsim help spec (\d+(?:\.\d+)*)|cite\(.(\d[\d.]*).\)")
HELP_CITATION = re.compile(r"see (--[\w-]+)[^`]*`dsim (\w+) --help`")
#: Functions whose docstring is a command's --help (typer prints it).
HELP_FUNCTIONS = {"command", "spec"}


def _help_functions(tree: ast.Module, path: Path) -> list[ast.FunctionDef]:
    """The functions of ``path`` whose docstring typer prints as a command's help."""
    if path.parent.name != "commands":
        return []
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.name in HELP_FUNCTIONS
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    ]


def _printed_strings() -> list[tuple[str, str]]:
    """(file, text) of every string constant in dsim/ that is not a docstring (a command's
    docstring is its help text, so it counts), and of every report template."""
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
            and not (path.parent.name == "commands" and getattr(node, "name", "") in HELP_FUNCTIONS)
        }
        # a bare string statement (an attribute's docstring) is never printed either
        docs |= {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        } - {id(node.body[0].value) for node in _help_functions(tree, path)}
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(tree):
            text = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if text and id(node) not in docs:
                found.append((rel, node.value))
    for path in sorted((REPO / "dsim" / "render" / "templates").glob("*.j2")):
        found.append((path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")))
    return found


def _shipped_sections() -> set[str]:
    """The section numbers of the spec the package ships (as an installed dsim reads it)."""
    return {s.number for s in spec.sections(spec.text())}


def test_the_spec_ships_with_the_package() -> None:
    shipped = resources.files("dsim").joinpath(spec.FILE).read_bytes()
    assert shipped == (REPO / "docs" / "SPEC.md").read_bytes()
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert spec.FILE in config["tool"]["setuptools"]["package-data"]["dsim"]


def test_no_message_cites_a_file_an_installed_wheel_lacks() -> None:
    cited = [(path, text[:80]) for path, text in _printed_strings() if "docs/" in text]
    assert cited == []


def test_every_cited_spec_section_exists_in_the_shipped_spec() -> None:
    sections = _shipped_sections()
    assert {"1.2", "4.3", "5.2", "5.6", "9.1", "9.2"} <= sections
    cited = {
        next(n for n in match.groups() if n)
        for _, text in _printed_strings()
        for match in SECTION.finditer(text)
    }
    assert {"1", "4.1", "4.2", "4.3", "5.5", "5.7"} <= cited  # help, footer, notes, runs table
    assert sorted(cited - sections) == []


def test_help_spec_prints_a_cited_section() -> None:
    proc = run_dsim("help", "spec", "5.6")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("### 5.6 Machine interfaces")
    assert '"$schema"' in proc.stdout and "### 5.7" not in proc.stdout
    chapter = run_dsim("help", "spec", "§5").stdout
    assert chapter.startswith("## 5. Summary") and "### 5.7" in chapter and "## 6." not in chapter
    named = run_dsim("help", "spec", "One answer")
    assert named.returncode == 0 and named.stdout.startswith("**One answer.**")
    assert "### 5.1" not in named.stdout
    listed = run_dsim("help", "spec").stdout
    assert "§5.6 Machine interfaces" in listed and "  §1.6.1 What cannot be one job" in listed
    missing = run_dsim("help", "spec", "99.9")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        "dsim: error: the spec has no section '99.9': give a number such as 5.6 or words of a "
        "title (`dsim help spec` lists the sections)"
    ]


def test_the_report_footer_says_how_to_open_its_sections() -> None:
    import pandas as pd

    from dsim.render.html import footer_text

    text = footer_text(pd.DataFrame({"run": ["a"], "replay_model": ["pipeline"]}))
    assert "§4.2" in text and "dsim help spec SECTION" in text and "docs/" not in text


def test_every_cited_help_names_an_option_it_has() -> None:
    citations = {m.groups() for _, text in _printed_strings() for m in HELP_CITATION.finditer(text)}
    assert ("--model", "run") in citations
    for option, command in sorted(citations):
        proc = run_dsim(command, "--help", env={"COLUMNS": "200"})
        assert proc.returncode == 0 and option in proc.stdout, (command, option)
