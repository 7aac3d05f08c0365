"""A fully cached `dsim run` reads no trace, and still recomputes whatever is stale.

Issue #21 item 1: a run whose every replay was cached still read its trace, built its
arrays and attributed it again (2.8x `dsim summarize`). The run's memo
(``dsim.app.runmemo``) proves that its ``result.json`` and attribution tables are
what its trace and options give; every other change still goes the full way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tracegen import write_synthetic

from dsim.app import attribution as app_attribution
from dsim.app import run as app_run
from dsim.app import runmemo, runplan, runtask
from dsim.app.run import run_replays
from dsim.config import Overrides, load_config
from dsim.errors import InputError

RUNS = ("ra", "rb")


def _traces(root: Path) -> Path:
    for k, name in enumerate(RUNS):
        write_synthetic(root / "traces", name, iterations=30, seed=21 + k)
    return root / "traces"


def _config(root: Path, **kwargs):
    overrides = Overrides(
        runs=RUNS, traces=root / "traces", out=root / "out", executor="local", **kwargs
    )
    return load_config(None, overrides)


def _tree(root: Path) -> dict[str, bytes]:
    """Every output file but the lock, by path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runs whose trace tables were decoded (``read_run``) or arrays built."""
    seen: list[str] = []

    def counting(real, what=None):
        def wrapper(*args, **kwargs):
            seen.append(what or Path(args[0]).name)  # the run's name, for a read
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(app_run, "read_run", counting(app_run.read_run))
    monkeypatch.setattr(runtask, "read_run", counting(runtask.read_run))
    monkeypatch.setattr(runplan, "read_run", counting(runplan.read_run))
    build = "build_iteration_arrays"
    monkeypatch.setattr(runplan, build, counting(runplan.build_iteration_arrays, "arrays"))
    monkeypatch.setattr(
        app_attribution, build, counting(app_attribution.build_iteration_arrays, "arrays")
    )
    return seen


def test_a_fully_cached_run_reads_no_trace_and_writes_the_same_bytes(
    tmp_path: Path, reads: list[str]
) -> None:
    """The memo's run decodes no table and builds no array, and leaves every file as a
    fresh run wrote it; without the memo (deleted) the full way gives the same bytes."""
    _traces(tmp_path)
    fresh = run_replays(_config(tmp_path))
    assert fresh.computed == 2 * 9 and reads
    written = _tree(tmp_path / "out")
    assert {f"attribution/memo/{name}.json" for name in RUNS} <= written.keys()

    reads.clear()
    cached = run_replays(_config(tmp_path))
    assert (cached.computed, cached.cached) == (0, 2 * 9)
    assert reads == []
    assert cached.summary.equals(fresh.summary)
    assert _tree(tmp_path / "out") == written

    shutil.rmtree(tmp_path / "out" / "attribution" / "memo")
    full = run_replays(_config(tmp_path))
    assert full.cached == 2 * 9 and reads  # the full way: each trace read
    assert _tree(tmp_path / "out") == written
    assert full.written == cached.written  # what the outcome lists (the answer's files)


def test_a_run_without_a_memo_hashes_its_trace_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first run (no memo to compare with) reads its tables once, when it is planned:
    the memo's digest of the trace (``read_version``) is taken only where a memo exists."""
    _traces(tmp_path)
    versions: list[str] = []
    real = runmemo.read_version
    monkeypatch.setattr(runmemo, "read_version", lambda d: versions.append(Path(d).name) or real(d))
    run_replays(_config(tmp_path))
    assert versions == []
    run_replays(_config(tmp_path))  # the memos exist now: each trace's version is compared
    assert sorted(versions) == sorted(RUNS)


def test_a_what_ifs_two_directories_are_reused_in_plan_order(
    tmp_path: Path, reads: list[str]
) -> None:
    """A loader what-if's memo vouches for both its directories (RUN@pipeline-w4-p2 and
    its baseline RUN@pipeline); reused, they are listed as the full way lists them."""
    _traces(tmp_path)
    config = _config(tmp_path, model="pipeline", workers=4)
    run_replays(config)
    written = _tree(tmp_path / "out")
    memo = json.loads((tmp_path / "out" / "attribution" / "memo" / "ra.json").read_text())
    assert [d["directory"] for d in memo["directories"]] == ["ra@pipeline-w4-p2", "ra@pipeline"]
    reads.clear()
    cached = run_replays(config)
    assert (cached.computed, cached.cached, reads) == (0, 2 * 2 * 9, [])
    assert _tree(tmp_path / "out") == written
    shutil.rmtree(tmp_path / "out" / "attribution" / "memo")
    full = run_replays(config)
    assert reads and full.written == cached.written and full.summary.equals(cached.summary)
    assert _tree(tmp_path / "out") == written


def test_a_memo_naming_another_directory_is_not_followed(tmp_path: Path, reads: list[str]) -> None:
    """A memo whose directories are not the run's own (edited by hand) vouches for
    nothing: the full way, no error."""
    _traces(tmp_path)
    run_replays(_config(tmp_path))
    path = tmp_path / "out" / "attribution" / "memo" / "ra.json"
    memo = json.loads(path.read_text())
    memo["directories"][0]["directory"] = "../ra"
    path.write_text(json.dumps(memo))
    reads.clear()
    again = run_replays(_config(tmp_path))
    assert again.cached == 2 * 9 and set(reads) == {"ra", "arrays"}


def test_a_trace_reparsed_after_the_results_is_recomputed(tmp_path: Path, reads: list[str]) -> None:
    """A trace written again (another version) after the results is not served from the
    memo: its replays are recomputed, the other run's are not even read."""
    _traces(tmp_path)
    run_replays(_config(tmp_path))
    write_synthetic(tmp_path / "traces", "rb", iterations=30, seed=99)
    reads.clear()
    again = run_replays(_config(tmp_path))
    assert (again.computed, again.cached) == (9, 9)
    assert reads and set(reads) == {"rb", "arrays"}


def test_a_table_changed_by_hand_is_refused_as_without_the_memo(tmp_path: Path) -> None:
    """Tables that no longer match their run.json's digest: the memo does not vouch for
    them, and the full way refuses them, as it always did."""
    traces = _traces(tmp_path)
    run_replays(_config(tmp_path))
    train = traces / "rb" / "train.parquet"
    other = write_synthetic(tmp_path / "other", "rb", iterations=30, seed=5)
    train.write_bytes((other / "train.parquet").read_bytes())
    with pytest.raises(InputError, match="does not match the digest"):
        run_replays(_config(tmp_path))


def test_an_option_or_the_code_changed_goes_the_full_way(
    tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A summary option (in result.json) and another version of dsim's code are not
    vouched for: the trace is read and result.json made again; replays stay cached."""
    _traces(tmp_path)
    run_replays(_config(tmp_path))
    result = tmp_path / "out" / "ra" / "result.json"
    before = json.loads(result.read_text())

    reads.clear()
    warm = run_replays(_config(tmp_path, warmup=0))
    assert (warm.computed, warm.cached) == (0, 2 * 9) and reads
    assert json.loads(result.read_text())["summary"]["warmup"] == 0 != before["summary"]["warmup"]

    reads.clear()
    monkeypatch.setattr(runmemo, "code_digest", lambda: "another dsim")
    again = run_replays(_config(tmp_path, warmup=0))
    assert again.cached == 2 * 9 and reads


def test_an_output_changed_since_the_memo_goes_the_full_way(
    tmp_path: Path, reads: list[str]
) -> None:
    """A result.json or attribution table that is not the one the memo hashed, or a
    replay lost, is made again by the full way (the replay recomputed)."""
    _traces(tmp_path)
    run_replays(_config(tmp_path))
    out = tmp_path / "out"
    table = out / "attribution" / "runs" / "ra.parquet"
    kept = table.read_bytes()
    table.unlink()
    reads.clear()
    run_replays(_config(tmp_path))
    assert reads and set(reads) == {"ra", "arrays"}
    assert table.read_bytes() == kept

    result = out / "rb" / "result.json"
    result.write_text(result.read_text().replace('"run": "rb"', '"run": "rb" '))
    reads.clear()
    run_replays(_config(tmp_path))
    assert reads and set(reads) == {"rb", "arrays"}

    (out / "ra" / "avg__min.parquet").unlink()
    again = run_replays(_config(tmp_path))
    assert (again.computed, again.cached) == (1, 17)


def test_a_ray_tasks_run_reuses_the_memo_too(tmp_path: Path, reads: list[str]) -> None:
    """``run_task`` (what each Ray task runs, called here in-process) takes the same
    shortcut: the same report as the full way, no trace read."""
    _traces(tmp_path)
    config = _config(tmp_path)
    run_replays(config)
    task = runtask.RunTask("rb", config.run_dirs[1], config, force=False)
    reads.clear()
    reused = runtask.run_task(task)
    assert (reused.computed, reused.cached, reads) == (0, 9, [])
    shutil.rmtree(tmp_path / "out" / "attribution" / "memo")
    full = runtask.run_task(task)
    assert set(reads) == {"rb", "arrays"}
    assert (full.cached, full.rows, full.written) == (9, reused.rows, reused.written)


def test_force_ignores_the_memo(tmp_path: Path) -> None:
    _traces(tmp_path)
    run_replays(_config(tmp_path))
    forced = run_replays(_config(tmp_path), force=True)
    assert forced.computed == 2 * 9


def test_every_config_field_is_in_the_memo_or_declared_irrelevant() -> None:
    """A new option must be decided: in the inputs digest, or stated not to shape a plan."""
    planned, ignored = set(runmemo.PLANNED), set(runmemo.IGNORED)
    assert not planned & ignored
    assert planned | ignored == runmemo.config_fields()


def test_source_that_cannot_be_read_never_matches_a_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without dsim's source to hash, the code is unknown: each process's digest is its
    own, so no memo written by another is reused."""
    real = Path.read_bytes

    def unreadable(self: Path) -> bytes:
        if self.suffix == ".py":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    runmemo.code_digest.cache_clear()
    try:
        readable = runmemo.code_digest()
        runmemo.code_digest.cache_clear()
        monkeypatch.setattr(Path, "read_bytes", unreadable)
        first = runmemo.code_digest()
        runmemo.code_digest.cache_clear()
        assert len({readable, first, runmemo.code_digest()}) == 3
    finally:
        runmemo.code_digest.cache_clear()
