"""The floors CI tests are the floors pyproject declares.

``.ci/run`` installs ``pip install -c .ci/floors.txt -e ".[test]"`` and runs
the suite, so the constraints file must pin every direct dependency (runtime
and the ``test`` extra) to exactly its ``>=`` lower bound: a floor raised or
added in one file and not the other would make CI test versions nobody
declared, or leave a declared floor untested.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
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


#: The only test files with tests marked ``latest_only``, each with why: they never run
#: in the floors phase, even where .ci/floors-tests.txt would name them (developer
#: tools outside the package, real training jobs, dsim's own handling of processes
#: racing or killed: no dependency's behaviour is what they check).
LATEST_ONLY: dict[str, str] = {
    "test_bench_smoke.py": "bench/: developer tools outside the package",
    "test_example_ddp.py": "a real DDP job (torch, dsim.instrument)",
    "test_fidelity_smoke.py": "validation/'s physical runs: real DDP jobs of a developer tool",
    "test_instrument_hf.py": "transformers and accelerate are not installed in the floors phase",
    "test_instrument_lightning.py": "Lightning is not installed in the floors phase",
    "test_iterable.py": "one test: a real DDP job over an IterableDataset",
    "test_watch.py": "one test: dsim watch beside a real DDP job",
    "test_kill_resume.py": "dsim's atomic outputs and resumption under signals at random moments",
    "test_concurrency.py": "two tests: runs taking turns on dsim's lock, killed writers' leftovers",
    "test_snapshot.py": "one test: parse and run racing in two processes",
    "test_profiled_replay.py": "one test: rotated compressed raw logs replay as plain ones",
}

#: Declared dependencies no line of .ci/floors-tests.txt names, and why.
EXEMPT: dict[str, str] = {
    "pytest": "runs every test of the phase",
    "pytest-xdist": "runs every test of the phase (-n auto)",
    "pillow": "only validation/decode.py (the harness's decode regime, latest_only)",
}


def floors_tests(text: str) -> dict[str, set[str]]:
    """.ci/floors-tests.txt: test path or node id -> the dependencies it names."""
    listed: dict[str, set[str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        assert words[0].startswith("tests/test_"), f".ci/floors-tests.txt:{number}: {words[0]}"
        assert words[0] not in listed, f".ci/floors-tests.txt:{number}: {words[0]} twice"
        listed[words[0]] = {_name(word) for word in words[1:]}
    return listed


def _marked_files(tests: Path) -> dict[str, bool]:
    """Test file -> whether all of it is ``latest_only`` (a module ``pytestmark``), for
    every file that marks any of its tests so."""
    marked: dict[str, bool] = {}
    for path in tests.glob("test_*.py"):
        text = path.read_text("utf-8")
        if path.name != Path(__file__).name and "mark.latest_only" in text:
            marked[path.name] = any(
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
                and "latest_only" in ast.unparse(node.value)
                for node in ast.parse(text).body
            )
    return marked


def test_the_floors_phase_deselects_only_the_listed_tests() -> None:
    """A test marked ``latest_only`` never runs at the floors: adding a file here is a
    reviewed choice, with its reason."""
    marked = _marked_files(REPO / "tests")
    assert marked.keys() == LATEST_ONLY.keys()
    assert all(LATEST_ONLY.values())
    ci = (REPO / ".ci" / "run").read_text("utf-8")
    floors = [line for line in ci.splitlines() if "DSIM_FUZZ_CASES=100 suite" in line]
    assert floors == [
        'DSIM_FUZZ_CASES=100 suite -m "not latest_only" "${floors_tests[@]}" || floors=$?'
    ]
    assert "< <(sed -e 's/#.*//' .ci/floors-tests.txt | awk 'NF { print $1 }')" in ci


def test_every_floor_is_exercised_by_a_listed_test_that_exists() -> None:
    """The floors phase runs only .ci/floors-tests.txt: a dependency no line names would
    have its floor installed and never called; a line whose test was renamed or removed
    would select nothing (pytest errors on a missing file, not on a missing test)."""
    declared = declared_floors(tomllib.loads((REPO / "pyproject.toml").read_text("utf-8")))
    listed = floors_tests((REPO / ".ci" / "floors-tests.txt").read_text("utf-8"))
    named = set().union(*listed.values())
    assert named <= declared.keys(), named - declared.keys()
    assert declared.keys() - named == EXEMPT.keys()
    marked = _marked_files(REPO / "tests")
    for entry in listed:
        path, _, test = entry.partition("::")
        assert (REPO / path).is_file(), entry
        assert not marked.get(Path(path).name, False), f"{entry}: the whole file is latest_only"
        if test:
            assert re.search(
                rf"^def {re.escape(test)}\(", (REPO / path).read_text("utf-8"), re.M
            ), entry


def test_the_list_reader_sees_names_comments_and_repeats() -> None:
    text = "# a comment\ntests/test_a.py  numpy Import_Linter # why\n\ntests/test_b.py::test_x\n"
    assert floors_tests(text) == {
        "tests/test_a.py": {"numpy", "import-linter"},
        "tests/test_b.py::test_x": set(),
    }
    with pytest.raises(AssertionError, match="twice"):
        floors_tests("tests/test_a.py numpy\ntests/test_a.py pandas\n")
    with pytest.raises(AssertionError, match=r":1: bench/x\.py"):
        floors_tests("bench/x.py numpy\n")


def test_a_whole_file_marked_latest_only_cannot_cover_another(tmp_path: Path) -> None:
    """The check above tells a file marked as a whole from one with a marked test."""
    (tmp_path / "test_whole.py").write_text(
        "pytestmark = [\n    pytest.mark.torch,\n    pytest.mark.latest_only,\n]\n"
    )
    (tmp_path / "test_part.py").write_text("@pytest.mark.latest_only\ndef test_x(): ...\n")
    (tmp_path / "test_none.py").write_text("def test_y(): ...\n")
    assert _marked_files(tmp_path) == {"test_whole.py": True, "test_part.py": False}
