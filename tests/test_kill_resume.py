"""Kill and resume: `dsim parse`, `dsim run` and `dsim report` stopped at random moments.

Each trial starts the real command on inputs big enough that it works for
a second or two, sends it SIGKILL, SIGINT or SIGTERM at a seeded random
moment, and checks that

* nothing partial is in place: every file it left is byte-identical to the
  same file of an uninterrupted run, except dsim's own temporary files
  (``.<name>.<pid>.<random>.tmp``), which only SIGKILL may leave behind, and a
  replay file left whole where the finished run has its stub (``dsim run``
  stubs a replay only once the dataset files hold its rows, SPEC §7.1);
* SIGINT and SIGTERM end with exit code 130 / 143 and ``dsim: interrupted``;
* re-running the command gives outputs byte-identical to the uninterrupted
  run, all files included (the temporary files of the killed run are gone).

A handful of trials run by default; ``DSIM_KILL_TRIALS=N`` runs N per command
and signal. Trials are seeded: a failure names its moment and reproduces.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tracegen import write_synthetic

from dsim.errors import InputError
from dsim.model.results import is_stub, replay_metadata, stub_table
from dsim.synth import SynthParams, synthesize

# latest_only: not in CI's floors phase (.ci/run): the subject is dsim's own atomic writes
# and resumption; the floors phase runs these commands' outputs (test_parse_cli, test_run_cli,
# test_report) and signals at start-up (test_signals) (tests/test_dependency_floors.py)
pytestmark = [
    pytest.mark.latest_only,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="reads signal masks from /proc"
    ),
]

TEMP = re.compile(r"^\.(.+)\.([0-9]+)\.[a-z0-9_]{8}\.tmp$|^\.(.+)\.old-([0-9]+)$")
RUNS = ("big0", "big1")


@dataclass(frozen=True)
class Target:
    """A command line, the inputs it reads (linked into each trial) and the outputs it writes."""

    name: str
    args: tuple[str, ...]
    inputs: tuple[str, ...]
    output: str


def _target(spec: str) -> Target:
    name, *options = spec.split()
    if name == "parse":
        return Target(
            spec, ("parse", "logs", "--out", "traces", "--jobs", "2"), ("logs",), "traces"
        )
    if name == "run":
        args = ("run", *RUNS, "--traces", "rt", "--out", "results", *options)
        return Target(spec, args, ("rt",), "results")
    return Target(spec, ("report", "results", "--out", "pages/report.html"), ("results",), "pages")


# Adding the Ray executor is one line here (a marked pytest.param of "run --executor ray").
TARGETS = ["parse", "run --executor local", "report"]
DEFAULT_PLAN = {  # trials per signal in CI; report is the slowest, so it gets fewer
    "parse": {signal.SIGKILL: 2, signal.SIGINT: 1, signal.SIGTERM: 1},
    "run": {signal.SIGKILL: 2, signal.SIGINT: 1, signal.SIGTERM: 1},
    "report": {signal.SIGKILL: 1, signal.SIGINT: 1},
}


def _trials() -> list:
    wanted = int(os.environ.get("DSIM_KILL_TRIALS", "0") or 0)
    params = []
    for spec in TARGETS:
        plan = DEFAULT_PLAN[spec.split()[0]]
        signals = (signal.SIGKILL, signal.SIGINT, signal.SIGTERM)
        for signum in signals:
            count = wanted or plan.get(signum, 0)
            for index in range(count):
                trial_id = f"{spec.replace(' --executor ', '-')}-{signum.name}-{index}"
                params.append(pytest.param(spec, signum, index, id=trial_id))
    return params


def _dsim(args: tuple[str, ...], cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("DSIM_DEBUG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "dsim", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones too), by relative path."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


@dataclass
class World:
    base: Path
    reference: dict[str, dict[str, bytes]]  # target name -> files of an uninterrupted run
    seconds: dict[str, float]  # target name -> how long the uninterrupted run took

    def trial_dir(self, label: str, target: Target) -> Path:
        directory = self.base / label
        directory.mkdir()
        for name in target.inputs:  # read-only inputs are shared, through the same relative path
            (directory / name).symlink_to(self.base / "inputs" / name)
        if target.args[0] == "report":  # a file output's directory must exist (SPEC §9)
            (directory / target.output).mkdir()
        return directory


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    base = tmp_path_factory.mktemp("kill")
    inputs = base / "inputs"
    inputs.mkdir()
    for seed in (1, 2, 3):  # ~1 s of parsing on two cores; `dsim synth`'s code, in-process
        params = SynthParams(gpus=4, iterations=6000, epochs=2, workers=4, seed=seed)
        synthesize(params, inputs / "logs")
    for seed, run in enumerate(RUNS):  # ~1 s of replays in-process
        write_synthetic(inputs / "rt", run, gpus=8, epochs=2, iterations=12000, seed=seed)
    world = World(base, {}, {})
    for spec in ("parse", "run", "report"):
        target = _target(spec)
        directory = world.trial_dir(f"reference-{spec}", target)
        began = time.monotonic()
        proc = _dsim(target.args, directory)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        world.seconds[spec] = time.monotonic() - began
        world.reference[spec] = _files(directory / target.output)
        if spec == "run":  # the report reads these results
            (directory / "results").rename(inputs / "results")
            world.reference[spec] = _files(inputs / "results")
    return world


def _handlers_installed(pid: int) -> bool:
    """Whether dsim's CLI has installed its SIGTERM handler (from then on signals are clean)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # gone already
    caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M).group(1), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def _check_nothing_partial(files: dict[str, bytes], reference: dict[str, bytes], killed: bool):
    for name, data in files.items():
        parts = Path(name).parts
        if any(TEMP.match(part) for part in parts):
            assert killed, f"{name}: temporary file left by a clean interruption"
            continue
        if parts[-1] == ".dsim.lock":  # holds the pid of a killed holder: harmless
            continue
        assert name in reference, f"{name}: not a file of the uninterrupted run"
        if _whole_for_stub(data, reference[name]):
            continue
        assert data == reference[name], f"{name}: differs from the uninterrupted run (partial?)"


def _whole_for_stub(data: bytes, reference: bytes) -> bool:
    """Whether ``data`` is a whole replay (format 1) of which ``reference`` is the stub."""
    if not data.startswith(b"PAR1") or not reference.startswith(b"PAR1"):
        return False
    try:
        left, done = (
            replay_metadata(pq.read_schema(pa.BufferReader(b)), Path("<file>"))
            for b in (data, reference)
        )
    except InputError:  # not a replay (a table, the dataset, a summary)
        return False
    return (
        not is_stub(left)
        and is_stub(done)
        and stub_table(left).schema.metadata
        == (pq.read_schema(pa.BufferReader(reference)).metadata)
    )


@pytest.mark.parametrize(("spec", "signum", "index"), _trials())
def test_interrupted_command_leaves_nothing_partial_and_resumes(
    world: World, spec: str, signum: signal.Signals, index: int
) -> None:
    target = _target(spec)
    name = spec.split()[0]
    rng = random.Random(f"{spec}/{signum.name}/{index}")
    moment = rng.uniform(0.0, 0.7 * world.seconds[name])  # mostly mid-work, sometimes late
    label = f"{spec.replace(' ', '_')}-{signum.name}-{index}"
    directory = world.trial_dir(label, target)
    where = f"{label}: signal at {moment:.2f} s"

    proc = _dsim(target.args, directory)
    if signum != signal.SIGKILL:
        deadline = time.monotonic() + 30
        while not _handlers_installed(proc.pid):
            assert time.monotonic() < deadline, f"{where}: dsim never handled SIGTERM"
            time.sleep(0.005)
    time.sleep(moment)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=300)
    print(f"{where}: exit code {proc.returncode}")  # shown when a trial fails

    if proc.returncode == 0:  # it finished first: its outputs must be complete
        assert _files(directory / target.output) == world.reference[name], where
        return
    if signum == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL, (where, err)
    else:
        assert proc.returncode == 128 + signum, (where, proc.returncode, err)
        assert err.strip().splitlines()[-1] == "dsim: interrupted", (where, err)
        assert "Traceback" not in err, (where, err)
    output = directory / target.output
    left = _files(output) if output.exists() else {}
    _check_nothing_partial(left, world.reference[name], killed=signum == signal.SIGKILL)

    rerun = _dsim(target.args, directory)
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, (where, err)
    resumed = _files(output)
    assert sorted(resumed) == sorted(world.reference[name]), where
    for file, data in resumed.items():
        assert data == world.reference[name][file], f"{where}: {file} differs after the re-run"
