"""The floors CI tests are the floors pyproject declares.

``.ci/run`` installs ``pip install -c .ci/floors.txt -e ".[test]"`` and runs
the suite, so the constraints file must pin every direct dependency (runtime
and the ``test`` extra) to exactly its ``>=`` lower bound: a floor raised or
added in one file and not the other would make CI test versions nobody
declared, or leave a declared floor untested.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from conftest import REPO

FLOOR = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*>=\s*([0-9][0-9A-Za-z.]*)")
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([0-9][0-9A-Za-z.]*)")


def _name(name: str) -> str:
    """PEP 503 normalised project name (``Foo_Bar`` and ``foo-bar`` are one project)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_floors(pyproject: dict) -> dict[str, str]:
    """Project name -> lower bound of every direct dependency; each must be plain ``name>=X``."""
    project = pyproject["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    floors: dict[str, str] = {}
    for req in requirements:
        match = FLOOR.fullmatch(req.strip())
        assert match, f"pyproject.toml: {req!r} is not `name>=version` (a floor CI can pin)"
        name = _name(match[1])
        assert floors.get(name, match[2]) == match[2], f"pyproject.toml: two floors for {name}"
        floors[name] = match[2]
    return floors


def pinned_floors(text: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.fullmatch(line)
        assert match, f".ci/floors.txt:{number}: {line!r} is not `name==version`"
        name = _name(match[1])
        assert name not in pins, f".ci/floors.txt:{number}: {name} pinned twice"
        pins[name] = match[2]
    return pins


def test_constraints_pin_exactly_the_declared_floors() -> None:
    declared = declared_floors(tomllib.loads((REPO / "pyproject.toml").read_text("utf-8")))
    pinned = pinned_floors((REPO / ".ci" / "floors.txt").read_text("utf-8"))
    assert {"numpy", "pyarrow", "ray", "pytest"} <= declared.keys()
    assert pinned == declared


def test_a_drifted_floor_is_caught() -> None:
    """The comparison above sees a raised bound, a missing pin and a pin with no floor."""
    pyproject = {
        "project": {
            "dependencies": ["numpy>=1.26", "Typing_Extensions>=4"],
            "optional-dependencies": {"test": ["pytest>=8"]},
        }
    }
    declared = declared_floors(pyproject)
    assert declared == {"numpy": "1.26", "typing-extensions": "4", "pytest": "8"}
    good = "# comment\nnumpy==1.26  # why\ntyping-extensions==4\n\npytest==8\n"
    assert pinned_floors(good) == declared
    assert pinned_floors(good.replace("1.26", "2.0")) != declared
    assert pinned_floors(good.replace("pytest==8\n", "")) != declared
    assert pinned_floors(good + "ruff==0.17.5\n") != declared


#: The only tests the floors phase deselects (marker ``latest_only``; ``.ci/run`` says why):
#: none of them runs dsim code whose behaviour depends on a floor version.
LATEST_ONLY = {
    "test_bench_smoke.py",
    "test_example_ddp.py",
    "test_fidelity_smoke.py",
    "test_instrument_hf.py",
    "test_instrument_lightning.py",
}


def test_the_floors_phase_deselects_only_the_listed_tests() -> None:
    """A test of parsing, replay, results, Ray, the CLI or the report marked ``latest_only``
    would silently stop being tested at the floors: adding a file here is a reviewed choice."""
    marked = {
        path.name
        for path in (REPO / "tests").glob("test_*.py")
        if path.name != Path(__file__).name and "mark.latest_only" in path.read_text("utf-8")
    }
    assert marked == LATEST_ONLY
    ci = (REPO / ".ci" / "run").read_text("utf-8")
    floors = [line for line in ci.splitlines() if "DSIM_FUZZ_CASES=100 suite" in line]
    assert floors == ['DSIM_FUZZ_CASES=100 suite -m "not latest_only" || floors=$?']
