"""Snapshot isolation (docs/SPEC.md §2.3 "Snapshots", §7.3): one version of a trace per replay.

`dsim parse` may rewrite a run while `dsim run` reads it. These tests check
the digest `run.json` records, the reader's checks and retries, that
`summarize` and `report` refuse replays of a trace re-parsed since, and — in
a race between two real processes on real files — that no replay ever mixes
two versions. The race runs a few dozen times here; `DSIM_LONG_TESTS=1` (or
`DSIM_RACE_ITERATIONS=N`) runs it hundreds of times.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tracegen import synthetic_run, write_synthetic

import dsim
from dsim.errors import InputError
from dsim.model import tables as tables_module
from dsim.model.results import find_result_runs, load_replay
from dsim.model.runinfo import RunInfo, version_digest
from dsim.model.tables import FETCH_FILE, TRAIN_FILE, read_run, write_run

RUN = "synth_run"
POLICY = "min/min"
REPLAY = "min__min.parquet"
CHANGED = "trace changed while it was read; run again when `dsim parse` has finished"


def _small(seed: int):
    """Two versions of one run differ in every number but not in shape, so that a mix of
    them replays without error: only its numbers can give it away."""
    return synthetic_run(RUN, gpus=2, epochs=1, iterations=40, seed=seed)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_parse_records_the_digest_of_the_tables_it_wrote(tmp_path: Path) -> None:
    run_dir = write_synthetic(tmp_path, RUN, iterations=40)
    info = RunInfo.load(run_dir)
    files = info.files
    assert files is not None and set(files) == {FETCH_FILE, TRAIN_FILE}
    for name in (FETCH_FILE, TRAIN_FILE):
        assert files[name] == {
            "size": (run_dir / name).stat().st_size,
            "sha256": _sha(run_dir / name),
        }
    assert info.version == version_digest(files)
    tables = read_run(run_dir)
    assert tables.info.version == info.version and dict(tables.files or {}) == files
    # another version of the run is another digest; the same tables, the same digest
    other = write_run(_small(seed=1), tmp_path / "other")
    again = write_run(read_run(other), tmp_path / "again")
    assert RunInfo.load(other).version not in (None, info.version)
    assert RunInfo.load(again).version == RunInfo.load(other).version


def test_tables_replaced_by_hand_are_refused_at_once(tmp_path: Path) -> None:
    run_dir = write_run(_small(seed=0), tmp_path / "a" / RUN)
    other = write_run(_small(seed=1), tmp_path / "b" / RUN)
    shutil.copyfile(other / FETCH_FILE, run_dir / FETCH_FILE)
    began = time.perf_counter()
    with pytest.raises(InputError, match=r"does not match the digest in run\.json") as caught:
        read_run(run_dir)
    assert str(run_dir / FETCH_FILE) in str(caught.value)
    assert time.perf_counter() - began < 0.5  # two reads agree: no waiting for a parse
    (run_dir / TRAIN_FILE).unlink()
    with pytest.raises(InputError, match=r"missing train\.parquet"):
        read_run(run_dir)


def test_a_run_that_keeps_changing_is_read_again_then_refused(tmp_path, monkeypatch) -> None:
    """Each pass sees another run.json: the reader retries, then says why it gave up."""
    run_dir = write_run(_small(seed=0), tmp_path / RUN)
    real = tables_module._read_pass
    passes = []

    def changing(directory: Path):
        snapshot = real(directory)
        passes.append(snapshot)
        return tables_module._Snapshot(
            snapshot.before, snapshot.before + b" " * len(passes), snapshot.blobs, snapshot.files
        )

    monkeypatch.setattr(tables_module, "_read_pass", changing)
    monkeypatch.setattr(tables_module, "SNAPSHOT_PAUSE_S", 0.0)
    with pytest.raises(InputError, match="trace changed while it was read") as caught:
        read_run(run_dir)
    assert str(caught.value) == f"{run_dir}: {CHANGED}"
    assert len(passes) == tables_module.SNAPSHOT_ATTEMPTS


def test_a_run_json_that_moves_the_same_way_twice_is_still_a_parse_under_way(
    tmp_path, monkeypatch
) -> None:
    """A writer swapping two versions back and forth can show two passes the very same
    pair (run.json of one version before the tables, of the other after): that is a parse
    under way, read again then refused as one, never reported as a hand-edited run.json."""
    run_dir = write_run(_small(seed=0), tmp_path / RUN)
    real = tables_module._read_pass
    passes = []

    def swapping(directory: Path):
        snapshot = real(directory)
        passes.append(snapshot)
        return tables_module._Snapshot(
            snapshot.before, snapshot.before + b" ", snapshot.blobs, snapshot.files
        )

    monkeypatch.setattr(tables_module, "_read_pass", swapping)
    monkeypatch.setattr(tables_module, "SNAPSHOT_PAUSE_S", 0.0)
    with pytest.raises(InputError) as caught:
        read_run(run_dir)
    assert str(caught.value) == f"{run_dir}: {CHANGED}"
    assert len(passes) == tables_module.SNAPSHOT_ATTEMPTS


def test_a_run_mid_swap_is_read_once_the_swap_is_over(tmp_path, monkeypatch) -> None:
    """Between atomic_dir's two renames the run is missing and `.<name>.old-<pid>` is there:
    the reader waits for the new version instead of saying the run was never parsed."""
    run_dir = write_run(_small(seed=0), tmp_path / RUN)
    aside = tmp_path / f".{RUN}.old-{os.getpid()}"
    os.replace(run_dir, aside)
    real_sleep = time.sleep

    def finish_swap(seconds: float) -> None:
        if aside.exists():
            write_run(_small(seed=1), run_dir)
            shutil.rmtree(aside)
        real_sleep(0)

    monkeypatch.setattr(tables_module.time, "sleep", finish_swap)
    assert read_run(run_dir).info.version == RunInfo.load(run_dir).version
    shutil.rmtree(run_dir)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".{RUN}.old-{dead.pid}").mkdir()  # what a killed parse left: no swap
    with pytest.raises(InputError, match="no parsed run here"):
        read_run(run_dir)


def test_replays_of_an_older_parse_are_refused_and_recomputed(tmp_path: Path) -> None:
    traces, out = tmp_path / "traces", tmp_path / "results"
    run_dir = write_run(_small(seed=0), traces / RUN)
    dsim.run(run_dir, policies=[POLICY], out=out)
    info = find_result_runs([out])[0].info
    assert info.trace is not None and info.trace.version == RunInfo.load(run_dir).version
    assert info.trace_path == "../../traces/synth_run"
    dsim.load_results(out)  # the trace is the version replayed
    key = info.policies["min__min"]

    write_run(_small(seed=1), run_dir)  # a `dsim parse` of other logs
    message = (
        f"{out / RUN / 'result.json'}: results of {RUN} were computed from an older parse of "
        f"its trace {run_dir}; run `dsim run` again"
    )
    with pytest.raises(InputError) as caught:
        dsim.load_results(out)
    assert str(caught.value) == message
    from dsim.app.report import ReportRequest, make_report

    with pytest.raises(InputError) as caught:
        make_report(ReportRequest(results=[out], out=tmp_path / "r.html", traces=traces))
    assert str(caught.value) == message

    dsim.run(run_dir, policies=[POLICY], out=out)  # not cached: the tables changed
    again = find_result_runs([out])[0].info
    assert again.policies["min__min"] != key
    assert again.trace is not None and again.trace.version == RunInfo.load(run_dir).version
    dsim.load_results(out)


_WRITER = """
import sys
from pathlib import Path

from dsim.model.tables import read_run, write_run

a, b, target, stop = (Path(p) for p in sys.argv[1:5])
versions = [read_run(a), read_run(b)]
Path(f"{stop}.ready").touch()
count = 0
while not stop.exists():
    write_run(versions[count % 2], target)  # what `dsim parse` does to a run it re-parses
    count += 1
print(count)
"""


def _iterations() -> int:
    wanted = os.environ.get("DSIM_RACE_ITERATIONS")
    if wanted:
        return int(wanted)
    return 400 if os.environ.get("DSIM_LONG_TESTS") == "1" else 30


def _replayed(out: Path) -> tuple[dict, np.ndarray]:
    document = json.loads((out / RUN / "result.json").read_text(encoding="utf-8"))
    table, _ = load_replay(out / RUN / REPLAY, remedy="")
    numbers = np.column_stack([table.column(c).to_numpy() for c in sorted(table.column_names)])
    return document, numbers


_BOTH = (FETCH_FILE, TRAIN_FILE)


def _fingerprint(run_dir: Path) -> str:
    """The tables of one version, as result.json's ``input`` records them (canonical JSON)."""
    files = {n: {"size": (run_dir / n).stat().st_size, "sha256": _sha(run_dir / n)} for n in _BOTH}
    return json.dumps(files, sort_keys=True)


@pytest.mark.latest_only  # not in CI's floors phase: tests/test_dependency_floors.py says why
def test_parse_and_run_racing_never_mix_two_versions(tmp_path: Path) -> None:
    """A writer process re-writes the run, alternating two versions, while this process
    replays it again and again: every replay is one version's, and its result.json names
    that version (the fingerprint of the very tables replayed, and their digest)."""
    versions = {}  # the fingerprint of a version's tables -> (its digest, its replay)
    for seed in (0, 1):
        source = write_run(_small(seed), tmp_path / f"v{seed}" / RUN)
        dsim.run(source, policies=[POLICY], out=tmp_path / f"alone{seed}")
        digest = (json.loads((source / "run.json").read_text()).get("digest") or {}).get("sha256")
        versions[_fingerprint(source)] = (digest, _replayed(tmp_path / f"alone{seed}")[1])
    assert len(versions) == 2 and all(digest for digest, _ in versions.values())
    traces, out, stop = tmp_path / "traces", tmp_path / "results", tmp_path / "stop"
    shutil.copytree(tmp_path / "v0" / RUN, traces / RUN)
    sources = [str(tmp_path / f"v{s}" / RUN) for s in (0, 1)]
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, *sources, str(traces / RUN), str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    refused = 0
    try:
        deadline = time.monotonic() + 120
        while not Path(f"{stop}.ready").exists():
            assert writer.poll() is None, writer.communicate()
            assert time.monotonic() < deadline, "the writer never started"
            time.sleep(0.02)
        for _ in range(_iterations()):
            try:
                dsim.run(traces / RUN, policies=[POLICY], out=out, force=True)
            except InputError as exc:  # a parse kept swapping it: refused, never mixed
                assert str(exc).endswith(CHANGED), exc
                refused += 1
                continue
            document, numbers = _replayed(out)
            replayed = json.dumps(document["input"], sort_keys=True)
            assert replayed in versions, "result.json's input is no version the writer wrote"
            digest, expected = versions[replayed]
            assert np.array_equal(numbers, expected, equal_nan=True), "a replay mixes versions"
            named = (document["trace"].get("digest") or {}).get("sha256")
            assert named == digest, "result.json names another version than it replayed"
    finally:
        stop.touch()
        written, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    assert int(written) > 1  # the trace did change under the replays
    assert refused < _iterations() // 2, f"{refused} of {_iterations()} runs gave up"


def test_a_rewritten_run_is_never_missing_on_linux(tmp_path: Path, monkeypatch) -> None:
    """atomic_dir exchanges the old and new directory in one step where the system can
    (renameat2): no moment without the run, which readers would take for no run at all."""
    from dsim.io import atomic

    probe = tmp_path / "probe"
    (probe / "a").mkdir(parents=True)
    (probe / "b").mkdir()
    if not atomic._exchange(probe / "a", probe / "b"):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here: the two-rename swap is used")
    run_dir = write_run(_small(seed=0), tmp_path / RUN)
    renames: list[tuple[str, str]] = []
    real = os.replace

    def recording(src, dst) -> None:
        renames.append((Path(src).name, Path(dst).name))
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", recording)
    write_run(_small(seed=1), run_dir)
    assert not [r for r in renames if RUN in r], renames  # the run was never moved away
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probe", RUN]
    assert (
        RunInfo.load(run_dir).version == RunInfo.load(write_run(_small(1), tmp_path / "x")).version
    )


def test_a_loaded_trace_never_pairs_its_info_with_another_version(tmp_path: Path) -> None:
    run_dir = write_run(_small(seed=0), tmp_path / RUN)
    trace = dsim.load_trace(run_dir)
    assert len(trace.train) == 2 * 40 and len(trace.fetch) > 0
    write_run(_small(seed=1), run_dir)
    with pytest.raises(InputError, match=r"trace changed since dsim\.load_trace read it"):
        trace.fetch  # noqa: B018
    assert len(dsim.load_trace(run_dir).fetch) == read_run(run_dir).fetch.num_rows
