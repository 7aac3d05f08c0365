"""``RunInfo`` / ``ResultInfo``: typed ``run.json`` / ``result.json`` that keep their bytes.

Files written by a real ``dsim parse`` and ``dsim run`` load, give each
field one meaning, and save back byte for byte; a future format version is
a clear error naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_dsim, run_dsim_in_process

from dsim.errors import InputError
from dsim.model.resultinfo import RESULTS_FORMAT_VERSION, ResultInfo
from dsim.model.runinfo import FORMAT_VERSION, RunInfo

RUN = "synth_queue_seed3_gpus3_epoch2_b96_worker2_thread0"  # b: the global batch


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("info")
    for args in (
        ("synth", "--gpus", "3", "--iterations", "40", "--epochs", "2", "--workers", "2"),
        ("parse", RUN, "--out", "traces"),
        ("run", RUN, "-p", "min/min"),
        ("run", RUN, "--model", "pipeline", "--workers", "4"),
    ):
        extra = ("--batch-size", "32", "--seed", "3", "--out", ".") if args[0] == "synth" else ()
        # the CLI's entry point in this process (tests/conftest.py): the files are the subject
        proc = run_dsim_in_process(*args, *extra, "-q", cwd=work)
        assert proc.returncode == 0, proc.stderr
    return work


def test_run_json_loads_typed_and_saves_byte_for_byte(workdir: Path, tmp_path: Path) -> None:
    original = (workdir / "traces" / RUN / "run.json").read_bytes()
    info = RunInfo.load(workdir / "traces" / RUN)
    assert info.gpu_count == 3 and info.gpu_ids == (0, 1, 2)  # JSON `gpus` is the count
    assert info.epochs_present == (0, 1) and info.name_epochs == 2
    assert info.iterations_per_epoch == {"0": 40, "1": 40}
    assert info.input_format is None and info.sources and info.report["lines"] > 0
    info.save(tmp_path)
    assert (tmp_path / "run.json").read_bytes() == original


@pytest.mark.parametrize("directory", [RUN, f"{RUN}@pipeline", f"{RUN}@pipeline-w4-p2"])
def test_result_json_loads_typed_and_saves_byte_for_byte(
    workdir: Path, tmp_path: Path, directory: str
) -> None:
    original = (workdir / "results" / directory / "result.json").read_bytes()
    info = ResultInfo.load(workdir / "results" / directory)
    assert info.run == RUN and info.ranks == (0, 1, 2)  # JSON `gpus` is the list of ranks
    assert info.trace is not None and info.trace.gpu_count == info.gpu_count == 3
    assert info.selection is not None and info.selection.epochs == (1,)
    assert info.selection.warmup == 10 and info.selection.threshold_s == 0.03
    assert "actual__actual" in info.policies
    assert (info.loader is None) == (directory == RUN)
    info.save(tmp_path)
    assert (tmp_path / "result.json").read_bytes() == original


def test_unknown_keys_survive_a_round_trip() -> None:
    doc = {"format_version": 1, "name": "r", "gpus": 1, "gpu_ids": [0], "epochs": [0]}
    doc |= {"iterations_per_epoch": {"0": 3}, "metadata": {}, "sources": [], "report": {}}
    doc["added_by_a_later_dsim"] = {"x": 1}
    assert RunInfo.from_document(doc).document() == doc


@pytest.mark.parametrize("name", ["run.json", "result.json"])
def test_a_newer_format_version_is_a_clear_error(workdir: Path, tmp_path: Path, name: str) -> None:
    source = workdir / ("traces" if name == "run.json" else "results") / RUN
    doc = json.loads((source / name).read_text())
    current = FORMAT_VERSION if name == "run.json" else RESULTS_FORMAT_VERSION
    doc["format_version"] = current + 1
    (tmp_path / name).write_text(json.dumps(doc))
    loader = RunInfo if name == "run.json" else ResultInfo
    newer = rf"newer dsim \(format_version {current + 1}; this dsim reads {current}\)"
    with pytest.raises(InputError, match=newer):
        loader.load(tmp_path)
    doc["format_version"] = 0
    (tmp_path / name).write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"another dsim format \(format_version 0"):
        loader.load(tmp_path)


def test_summarize_names_the_file_of_a_newer_format(workdir: Path, tmp_path: Path) -> None:
    results = tmp_path / "results" / RUN
    results.mkdir(parents=True)
    for f in (workdir / "results" / RUN).iterdir():
        (results / f.name).write_bytes(f.read_bytes())
    doc = json.loads((results / "result.json").read_text())
    (results / "result.json").write_text(json.dumps({**doc, "format_version": 7}))
    proc = run_dsim("summarize", "results", cwd=tmp_path)
    assert proc.returncode == 3
    assert proc.stderr.strip().endswith(
        "result.json: result description written by a newer dsim "
        f"(format_version 7; this dsim reads {RESULTS_FORMAT_VERSION}): upgrade dsim"
    )


@pytest.mark.parametrize("name", ["run.json", "result.json"])
@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"format_version": ' + "9" * 4401 + "}", "a number with more than 4300 digits"),
        ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
    ],
)
def test_a_number_too_long_or_nesting_too_deep_is_bad_input(
    tmp_path: Path, name: str, text: str, reason: str
) -> None:
    """Both were internal errors (ValueError from Python's limit on digits, RecursionError)
    in `dsim run`, `tune`, `summarize`, `report` and `compare`."""
    (tmp_path / name).write_text(text)
    loader = RunInfo if name == "run.json" else ResultInfo
    with pytest.raises(InputError, match=reason) as info:
        loader.load(tmp_path)
    assert info.value.path == tmp_path / name


def test_a_config_number_too_long_is_a_usage_error(tmp_path: Path) -> None:
    from dsim.config import load_config
    from dsim.errors import UsageError

    conf = tmp_path / "c.json"
    conf.write_text('{"FILE": "x", "warmup": ' + "9" * 5000 + "}")
    with pytest.raises(UsageError, match="a number with more than 4300 digits"):
        load_config(conf)
