"""sim_conf.json validation (docs/SPEC.md §6): every problem reported at once, before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracegen import ORIGINAL_CONFIG as ORIGINAL
from tracegen import write_synthetic

from dsim.config import LEGACY_KEYS, REJECTED_KEYS, Overrides, load_config
from dsim.errors import InputError, UsageError
from dsim.options import parse_epochs_option
from dsim.replay.policies import BASELINE

RUN = "fsNprepNloadNtrain_openimage_randaugment_resnet50_epoch2_b2048_worker12_thread0"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """cwd with ./traces holding the original run's name and a second run (epochs 0 and 1)."""
    monkeypatch.chdir(tmp_path)
    write_synthetic(tmp_path / "traces", RUN, iterations=12)
    write_synthetic(tmp_path / "traces", "other_run", iterations=12, seed=1)
    return tmp_path


def _write(path: Path, conf: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(conf), encoding="utf-8")
    return path


def _error(path: Path, overrides: Overrides | None = None) -> str:
    with pytest.raises(UsageError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message  # the CLI prints it as one line
    return message


def test_original_analysis_config_runs_unchanged(workdir: Path) -> None:
    config = load_config(_write(workdir / "sim_conf.json", ORIGINAL))
    assert config.runs == (RUN,)
    assert config.run_dirs == (Path("traces") / RUN,)
    assert len(config.policies) == 9
    assert config.policies[0] == BASELINE  # false/false is actual/actual
    assert {p for pair in config.policies for p in pair} == {"actual", "avg", "min"}
    assert config.out == Path("results")
    assert config.epochs is None and config.warmup is None and config.threshold_s is None
    assert config.stall_floor_s == 0.000002 and config.stall_grow_min_s == 0.01
    assert config.executor == "auto"
    assert set(ORIGINAL) | {"IOFILE"} >= LEGACY_KEYS


@pytest.mark.parametrize(
    ("key", "instead"),
    [("TRAINING_TIME", "measured training times;"), ("FETCH_DELAY", "measured fetch starts,")],
)
def test_dependency_replay_keys_are_rejected_not_ignored(
    workdir: Path, key: str, instead: str
) -> None:
    """The original dependency replay's keys would change the numbers: never silently ignored."""
    path = _write(workdir / "sim_conf.json", {**ORIGINAL, key: 0.2})
    message = _error(path)
    assert f"invalid config {path}: 1 problem: {key} (the original simulator's" in message
    assert f"is not supported: dsim replays the {instead}" in message
    assert message.endswith("remove the key")
    assert key not in LEGACY_KEYS and set(REJECTED_KEYS) == {"TRAINING_TIME", "FETCH_DELAY"}


def test_baseline_always_included_and_policies_normalised(workdir: Path) -> None:
    conf = {"FILE": RUN, "FETCH_ALIGN": ["MIN", None], "START_ALIGN": ["avg", "actual"]}
    config = load_config(_write(workdir / "c.json", conf))
    assert config.policies == (("min", "avg"), ("min", "actual"), ("actual", "avg"), BASELINE)


def test_paths_are_relative_to_the_config_file(workdir: Path) -> None:
    (workdir / "traces").rename(workdir / "elsewhere")
    conf = {**ORIGINAL, "traces": "../elsewhere", "out": "../res"}
    config = load_config(_write(workdir / "configs" / "sim.json", conf))
    assert config.traces == workdir / "configs" / ".." / "elsewhere"
    assert config.out == workdir / "configs" / ".." / "res"
    assert config.runs == (RUN,)


def test_command_line_overrides_config(workdir: Path) -> None:
    (workdir / "traces").rename(workdir / "t2")
    conf = {**ORIGINAL, "traces": "nowhere", "warmup": 3, "epochs": [0], "executor": "ray"}
    overrides = Overrides(
        traces=Path("t2"),
        out=Path("o"),
        warmup=0,
        epochs="all",
        threshold_s=0.5,
        executor="local",
        num_cpus=2,
        runs=("other_*",),
    )
    config = load_config(_write(workdir / "c.json", conf), overrides)
    assert config.runs == ("other_run",)
    assert (config.traces, config.out) == (Path("t2"), Path("o"))
    assert (config.warmup, config.epochs, config.threshold_s) == (0, "all", 0.5)
    assert (config.executor, config.num_cpus) == ("local", 2)


def test_globs_and_lists_of_runs(workdir: Path) -> None:
    config = load_config(_write(workdir / "c.json", {"FILE": ["*_run", "fsN*"]}))
    assert config.runs == ("other_run", RUN)
    assert len(config.policies) == 9  # FETCH_ALIGN/START_ALIGN default to every policy


def test_a_run_given_as_its_path_in_the_traces_directory_is_that_run(workdir: Path) -> None:
    """What a shell's tab completion or glob hands over (``traces/RUN``) names the run."""
    conf = _write(workdir / "c.json", {"FILE": "x"})
    for given in (f"traces/{RUN}", f"./traces/{RUN}/", str(workdir / "traces" / "other_run")):
        assert load_config(conf, Overrides(runs=(given,))).runs == (Path(given).name,)
    config = load_config(conf, Overrides(runs=("traces/other_*", f"traces/{RUN}")))
    assert config.runs == ("other_run", RUN)


def test_runs_given_as_paths_elsewhere_are_one_problem_naming_the_option(workdir: Path) -> None:
    write_synthetic(workdir / "else", "far", iterations=12)
    conf = _write(workdir / "c.json", {"FILE": "x"})
    runs = tuple(f"else/far{k}" for k in range(5))
    message = _error(conf, Overrides(runs=runs))
    assert "1 problem:" in message
    assert "'else/far0', 'else/far1', 'else/far2' and 2 more given as paths outside" in message
    assert "--traces else far0" in message
    message = _error(conf, Overrides(runs=("traces/", "/")))
    assert "run 'traces/' is the traces directory itself: name its runs" in message
    assert "run(s) '/' given as paths outside" in message and "e.g." not in message
    message = _error(conf, Overrides(runs=("traces/nope",)))
    assert f"run(s) not found: traces/nope; available in traces: {RUN}, other_run" in message


def test_optional_keys_accepted(workdir: Path) -> None:
    conf = {
        **ORIGINAL,
        "epochs": [1, 0],
        "warmup": 0,
        "effective_delay_threshold_s": 0.05,
        "stall_floor_s": 0,
        "stall_grow_min_s": 0.02,
        "executor": "ray",
        "num_cpus": 2,
        "ray_address": "127.0.0.1:6379",
    }
    config = load_config(_write(workdir / "c.json", conf))
    assert config.epochs == [0, 1]
    assert (config.warmup, config.threshold_s) == (0, 0.05)
    assert (config.stall_floor_s, config.stall_grow_min_s) == (0.0, 0.02)
    assert (config.executor, config.num_cpus, config.ray_address) == ("ray", 2, "127.0.0.1:6379")


def test_every_problem_is_listed_in_one_error(workdir: Path) -> None:
    conf = {
        "FILE": RUN,
        "FETCH_ALIGN": [False, "mean"],
        "START_ALIGN": "avg",
        "WARMUP": 5,
        "stall_floor": 1,
        "warmup": -1,
        "effective_delay_threshold_s": "0.03",
        "stall_grow_min_s": True,
        "epochs": [1, "2"],
        "executor": "dask",
        "num_cpus": 0,
        "traces": 3,
    }
    message = _error(_write(workdir / "bad.json", conf))
    assert message.startswith(f"invalid config {workdir / 'bad.json'}: 11 problems")
    for part in (
        "unknown policy 'mean'",
        "START_ALIGN must be a non-empty list",
        "unknown key 'WARMUP' (did you mean warmup?)",
        "unknown key 'stall_floor' (did you mean stall_floor_s?)",
        "warmup must be a non-negative integer",
        "effective_delay_threshold_s must be a non-negative number",
        "stall_grow_min_s must be a non-negative number",
        "epochs must be a list of epoch numbers",
        "executor must be one of auto, local, ray, got 'dask'",
        "num_cpus must be an integer from 1 to",
        "traces must be a path string",
    ):
        assert part in message, part


def test_missing_file_key(workdir: Path) -> None:
    message = _error(_write(workdir / "c.json", {"FETCH_ALIGN": [False]}))
    assert "FILE is missing" in message


@pytest.mark.parametrize("value", [[], "", [3], ["ok", ""]])
def test_file_of_wrong_type(workdir: Path, value: object) -> None:
    assert "FILE must be a run name" in _error(_write(workdir / "c.json", {"FILE": value}))


def test_missing_run_lists_available_runs(workdir: Path) -> None:
    message = _error(_write(workdir / "c.json", {"FILE": ["nope", "other_run", "x*"]}))
    assert "run(s) not found: nope, x*" in message
    assert f"available in traces: {RUN}, other_run" in message


def test_a_missing_run_among_many_lists_a_few_and_the_closest(workdir: Path) -> None:
    for k in range(20):  # only their names are looked at: run.json of each
        (workdir / "traces" / f"resnet_{k:02d}").mkdir()
        (workdir / "traces" / f"resnet_{k:02d}" / "run.json").write_text("{}")
    message = _error(_write(workdir / "c.json", {"FILE": ["resnet_7", "zzz"]}))
    assert "run(s) not found: resnet_7 (did you mean resnet_07 or resnet_17?), zzz;" in message
    message = _error(_write(workdir / "c.json", {"FILE": "resnet_011"}))
    assert "not found: resnet_011 (did you mean resnet_01 or resnet_11?);" in message
    listed = message.split("available in traces: ")[1]
    assert listed.startswith(f"{RUN}, other_run, resnet_00, ")
    assert listed.endswith("resnet_09 and 10 more"), listed  # 12 of the 22 names


def test_missing_traces_directory(workdir: Path) -> None:
    message = _error(_write(workdir / "c.json", {"FILE": RUN, "traces": "absent"}))
    assert f"traces directory {workdir / 'absent'} does not exist" in message


def test_empty_traces_directory(workdir: Path) -> None:
    (workdir / "empty").mkdir()
    message = _error(_write(workdir / "c.json", {"FILE": RUN, "traces": "empty"}))
    assert "no parsed runs in" in message and "dsim parse" in message


def test_epoch_not_in_trace_lists_available_epochs(workdir: Path) -> None:
    message = _error(_write(workdir / "c.json", {**ORIGINAL, "epochs": [1, 2, 7]}))
    assert f"epoch(s) 2, 7 not in run {RUN}; available epochs: 0, 1" in message
    message = _error(_write(workdir / "c.json", ORIGINAL), Overrides(epochs=[5]))
    assert "epoch(s) 5 not in run" in message


def test_unreadable_run_is_bad_input_naming_its_file(workdir: Path) -> None:
    """A damaged run.json is the input's fault (exit 3), not the command line's (it was
    reported among the config's problems, exit 2); the config's own problems come first."""
    run_json = workdir / "traces" / "other_run" / "run.json"
    run_json.write_text("{broken", encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_config(_write(workdir / "c.json", {"FILE": "other_run"}))
    assert info.value.path.resolve() == run_json.resolve()
    assert "unreadable run description" in str(info.value)
    assert "\n" not in str(info.value)
    message = _error(_write(workdir / "c.json", {"FILE": "other_run", "warmup": -1}))
    assert "warmup" in message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_malformed_file(workdir: Path, text: str, needle: str) -> None:
    path = workdir / "c.json"
    path.write_text(text, encoding="utf-8")
    assert needle in _error(path)


def test_missing_config_file(workdir: Path) -> None:
    assert "config file not found" in _error(workdir / "none.json")


def test_runs_without_config(workdir: Path) -> None:
    config = load_config(None, Overrides(runs=("other_run",)))
    assert config.runs == ("other_run",) and len(config.policies) == 9
    with pytest.raises(UsageError, match="nothing to run"):
        load_config(None, Overrides())


def test_epochs_option() -> None:
    assert parse_epochs_option("1, 2") == [1, 2]
    assert parse_epochs_option("ALL") == "all"
    for bad in ("one", ",", "1;2"):
        with pytest.raises(UsageError, match="--epochs"):
            parse_epochs_option(bad)


# --- #20: configs that must fail cleanly, each naming the file and the key --------------------


def test_duplicate_keys_are_refused_naming_key_and_file(workdir: Path) -> None:
    path = workdir / "dup.json"
    path.write_text(f'{{"FILE": "{RUN}", "mlflow": {{"experiment": "a", "experiment": "b"}}}}')
    message = _error(path)
    assert message == f"config {path} gives key 'experiment' twice in one object: keep one"
    path.write_text(f'{{"FILE": "{RUN}", "FILE": "other_run"}}')
    assert "gives key 'FILE' twice" in _error(path)


def test_oversized_and_deeply_nested_configs_fail_fast(workdir: Path) -> None:
    from dsim.config import MAX_CONFIG_BYTES

    big = workdir / "big.json"
    big.write_text(json.dumps({"FILE": RUN, "x": "a" * MAX_CONFIG_BYTES}))
    assert f"config {big} is larger than 1024 KiB" in _error(big)
    deep = workdir / "deep.json"
    deep.write_text('{"FILE": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert f"config {deep} nests arrays or objects more than 32 deep" in _error(deep)
    fine = workdir / "brackets.json"  # brackets inside strings are no nesting
    fine.write_text(json.dumps({"FILE": RUN, "mlflow": {"experiment": "[" * 100}}))
    assert load_config(fine).mlflow.experiment == "[" * 100


def test_dev_zero_as_config_is_a_clean_error(workdir: Path) -> None:
    from conftest import run_dsim_in_process  # one message: in-process (its docstring)

    result = run_dsim_in_process("run", "--conf", "/dev/zero", cwd=workdir)
    assert result.returncode == 2, result.stderr
    assert (
        result.stderr
        == "dsim: error: config /dev/zero is larger than 1024 KiB: not a dsim config\n"
    )


@pytest.mark.parametrize("model", [["pipeline"], {"name": "pipeline"}])
def test_model_of_the_wrong_type_is_a_clean_error(workdir: Path, model: object) -> None:
    message = _error(_write(workdir / "c.json", {"FILE": RUN, "model": model}))
    assert f"model must be a replay model's name, got {model!r}" in message


def test_settings_out_of_range_name_key_file_and_range(workdir: Path) -> None:
    from dsim.config import max_num_cpus

    conf = {
        "FILE": RUN,
        "model": "pipeline",
        "workers": 10**9,
        "prefetch_factor": 10**12,
        "num_cpus": 10**9,
        "stall_floor_s": 1e300,
        "stall_grow_min_s": 1e9,
    }
    path = _write(workdir / "c.json", conf)
    message = _error(path)
    assert message.startswith(f"invalid config {path}: 5 problems")
    for part in (
        "workers must be an integer from 0 to 256, got 1000000000",
        "prefetch_factor must be an integer from 1 to 256, got 1000000000000",
        f"num_cpus must be an integer from 1 to {max_num_cpus()}",
        "stall_floor_s must be between 0 and 1 s, got 1e+300",
        "stall_grow_min_s must be between 0 and 86400 s",
    ):
        assert part in message, part
    edge = {"FILE": RUN, "model": "pipeline", "workers": 256, "prefetch_factor": 256}
    edge |= {"num_cpus": max_num_cpus(), "stall_floor_s": 1, "stall_grow_min_s": 86400}
    config = load_config(_write(workdir / "edge.json", edge))
    assert (config.workers, config.prefetch_factor, config.stall_floor_s) == (256, 256, 1.0)


def test_command_line_values_get_the_same_ranges(workdir: Path) -> None:
    overrides = Overrides(
        runs=(RUN,), model="pipeline", workers=257, prefetch_factor=0, num_cpus=10**9
    )
    message = _error(None, overrides)  # type: ignore[arg-type]
    for part in (
        "--workers must be an integer from 0 to 256, got 257",
        "--prefetch-factor must be an integer from 1 to 256, got 0",
        "--num-cpus must be an integer from 1 to",
    ):
        assert part in message, part


@pytest.mark.parametrize("name", ["../" + RUN, ".", "..", "/abs/path"])
def test_run_names_in_a_config_follow_the_name_rule(workdir: Path, name: str) -> None:
    message = _error(_write(workdir / "c.json", {"FILE": name}))
    if "/" in name:  # a path, though not to a run in the traces directory
        assert f"run(s) {name!r} given as paths outside the traces directory" in message
    else:
        assert f"run {name!r} is not a valid run name" in message


@pytest.mark.parametrize("value", ["gpu", ["local"], 3])
def test_a_bad_executor_in_the_config_is_reported_even_when_overridden(
    workdir: Path, value: object
) -> None:
    path = _write(workdir / "c.json", {"FILE": RUN, "executor": value})
    for overrides in (None, Overrides(executor="local")):
        message = _error(path, overrides)
        assert "executor must be one of" in message and repr(value) in message


def test_a_traces_path_that_is_a_file_is_named_as_one(workdir: Path) -> None:
    """It said the directory "does not exist"."""
    (workdir / "afile").write_text("x")
    message = _error(_write(workdir / "c.json", {"FILE": RUN, "traces": "afile"}))
    assert f"traces directory {workdir / 'afile'} is a file" in message


def test_a_run_named_like_a_glob_is_that_run(tmp_path: Path) -> None:
    """`a[1]` matched nothing ("did you mean a[1]?"), and `a*b` replayed a*b, a:b and a?b."""
    from types import SimpleNamespace

    from dsim.options import select_runs

    for name in ("a[1]", "a*b", "a:b", "a?b"):
        write_synthetic(tmp_path / "traces", name, iterations=12)
    for given, runs in (("a[1]", ("a[1]",)), ("a*b", ("a*b",)), ("a?b", ("a?b",)),
                        ("a[:?]b", ("a:b", "a?b"))):  # fmt: skip
        config = load_config(None, Overrides(runs=(given,), traces=tmp_path / "traces"))
        assert config.runs == runs, given
    results = [SimpleNamespace(name=n) for n in ("a*b", "a:b", "a?b", "a[1]")]
    assert [r.name for r in select_runs(results, ["a*b"])] == ["a*b"]
    assert [r.name for r in select_runs(results, ["a*"])] == ["a*b", "a:b", "a?b", "a[1]"]


@pytest.mark.parametrize(
    ("sides", "said"),
    [
        ({"START_ALIGN": ["stall-min"]}, "FETCH_ALIGN/START_ALIGN: stall-min is a stall alignment"),
        ({"FETCH_ALIGN": ["stall-min"], "START_ALIGN": ["avg"]},
         "FETCH_ALIGN stall-min replaces stalls and pairs only with start actual"),
    ],
)  # fmt: skip
def test_a_policy_the_config_cannot_replay_names_the_config(workdir: Path, sides, said) -> None:
    """These read "stall-min is a stall alignment ..." without the file, and "no replay
    matches the selected runs and policies" (the stall alignment dropped without a word)."""
    path = workdir / "c.json"
    path.write_text(json.dumps({"FILE": RUN, **sides}), encoding="utf-8")
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert str(info.value).startswith(f"invalid config {path}: 1 problem: {said}")
