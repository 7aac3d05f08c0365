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


#: The only test files with tests the floors phase deselects (marker ``latest_only``),
#: each with why and the files that run, in the floors phase, the dsim code paths those
#: tests go through (the selection rule of ``.ci/run``: a test is deselected only where
#: what it adds is not a dependency's behaviour: developer tools outside the package,
#: real training jobs (dsim.instrument is the standard library and torch), or dsim's own
#: handling of processes racing or killed, whose parse/run/report calls the files named
#: here make at the floors).
LATEST_ONLY: dict[str, tuple[str, tuple[str, ...]]] = {
    "test_bench_smoke.py": (
        "bench/: developer tools outside the package",
        ("test_parse_cli.py", "test_run_cli.py", "test_original_method.py"),
    ),
    "test_example_ddp.py": (
        "a real DDP job (torch, dsim.instrument)",
        ("test_instrument.py", "test_parse_cli.py", "test_run_cli.py"),
    ),
    "test_fidelity_smoke.py": (
        "validation/'s physical runs: real DDP jobs of a developer tool",
        ("test_validation_harness.py", "test_fidelity_compare.py", "test_harness_contention.py"),
    ),
    "test_instrument_hf.py": (
        "transformers and accelerate are not installed in the floors phase",
        ("test_instrument.py",),
    ),
    "test_instrument_lightning.py": (
        "Lightning is not installed in the floors phase",
        ("test_instrument.py",),
    ),
    "test_iterable.py": (
        "one test: a real DDP job over an IterableDataset (torch, dsim.instrument)",
        ("test_iterable.py", "test_instrument.py"),
    ),
    "test_watch.py": (
        "one test: dsim watch beside a real DDP job (torch, dsim.instrument)",
        ("test_watch.py", "test_watch_follow.py"),
    ),
    "test_kill_resume.py": (
        "dsim's atomic outputs and resumption under signals at random moments",
        ("test_parse_cli.py", "test_run_cli.py", "test_report.py", "test_signals.py"),
    ),
    "test_concurrency.py": (
        "two tests: two runs taking turns on dsim's lock and the leftovers of killed "
        "writers (fcntl, os); the lock's other tests and the parse workers' end with a "
        "killed parent (psutil) stay",
        ("test_concurrency.py", "test_run_cli.py", "test_parse_cli.py"),
    ),
    "test_snapshot.py": (
        "one test: parse and run racing in two processes; the snapshot rules are the "
        "file's other tests",
        ("test_snapshot.py",),
    ),
    "test_profiled_replay.py": (
        "one test: rotated compressed raw logs replay as plain ones; the decompression is "
        "the subject of the compressed-log files",
        ("test_parse_compressed.py", "test_fuzz_compressed.py", "test_run_cli.py"),
    ),
}


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
    """A test of parsing, replay, results, Ray, the CLI or the report marked ``latest_only``
    would silently stop being tested at the floors: adding a file here is a reviewed choice,
    with its reason and the files that still run its dsim code at the floors."""
    marked = _marked_files(REPO / "tests")
    assert marked.keys() == LATEST_ONLY.keys()
    for name, (reason, covering) in LATEST_ONLY.items():
        assert reason and covering, name
        for other in covering:
            assert (REPO / "tests" / other).is_file(), f"{name}: no tests/{other}"
            assert not marked.get(other, False), f"{name}: {other} is not in the floors phase"
    ci = (REPO / ".ci" / "run").read_text("utf-8")
    floors = [line for line in ci.splitlines() if "DSIM_FUZZ_CASES=100 suite" in line]
    assert floors == ['DSIM_FUZZ_CASES=100 suite -m "not latest_only" || floors=$?']


def test_a_whole_file_marked_latest_only_cannot_cover_another(tmp_path: Path) -> None:
    """The check above tells a file marked as a whole from one with a marked test."""
    (tmp_path / "test_whole.py").write_text(
        "pytestmark = [\n    pytest.mark.torch,\n    pytest.mark.latest_only,\n]\n"
    )
    (tmp_path / "test_part.py").write_text("@pytest.mark.latest_only\ndef test_x(): ...\n")
    (tmp_path / "test_none.py").write_text("def test_y(): ...\n")
    assert _marked_files(tmp_path) == {"test_whole.py": True, "test_part.py": False}
