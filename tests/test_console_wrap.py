"""Terminal prose wrapped where a reader expects, and piped output without padding (#22)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from conftest import REPO, run_dsim, run_dsim_in_process

from dsim.render.console import StripTrailing, wrap_prose

VERDICT = (
    "Aligning fetch (min/actual) would make iterations 1.66× faster: stall 16.0 → 5.2 ms "
    "(−67 %), effective delay 18.0 % → 0.0 % of iterations; ≈ 3.24 s saved per epoch."
)


def test_numbers_stay_with_their_units_at_every_width() -> None:
    for width in range(20, 120):
        lines = wrap_prose(VERDICT, width, "  ")
        assert " ".join(x.strip() for x in lines) == VERDICT
        for line in lines:
            assert len(line) <= width or " " not in line.strip()
            assert not re.match(r"^\s*(%|ms|s\b|→|×)", line), (width, lines)
            assert not re.search(r"(\d|→|≈)$", line), (width, lines)


def test_a_gpu_keeps_its_number_and_share() -> None:
    text = "Straggler: mostly GPU 3's loader; then GPU 2 27 %, GPU 1 10 %, GPU 0 9 %."
    for width in range(12, 80):
        for line in wrap_prose(text, width):
            assert not re.search(r"GPU$|GPU \d$", line), (width, line)


def test_line_breaks_of_the_text_are_kept() -> None:
    assert wrap_prose("a b\nc", 80, "  ") == ["  a b", "  c"]


def test_strip_trailing_writes_whole_lines_without_padding(tmp_path: Path) -> None:
    with open(tmp_path / "out", "w") as f:
        stream = StripTrailing(f)
        stream.write("one   \ntw")
        stream.write("o  \n")
        stream.flush()
    assert (tmp_path / "out").read_text() == "one\ntwo\n"


def test_piped_run_at_120_columns(tmp_path: Path) -> None:
    """The shipped sample at COLUMNS=120, stdout a pipe: no line ends in padding, no
    number is parted from its unit (before: "18.0 % →" / "0.0 %", trailing spaces)."""
    shutil.copytree(REPO / "traces" / "raw", tmp_path / "raw")
    proc = run_dsim("parse", "raw", "--out", "traces", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = run_dsim(
        "run", "--conf", REPO / "configs" / "sim_conf.json", "--traces", "traces",
        "--out", "results", "--executor", "local", cwd=tmp_path, env={"COLUMNS": "120"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(line == line.rstrip() for line in lines)
    assert all(len(line) <= 120 for line in lines)
    assert not [x for x in lines if re.match(r"^\s*(%|ms\b|→)", x) or re.search(r"(→|GPU)$", x)]
    assert "effective delay 18.0 % → 0.0 %" in proc.stdout or "18.0 % → 0.0 %" in proc.stdout
    # The README's quick start shows these first lines as printed in 100 columns.
    again = run_dsim(
        "run", "--conf", REPO / "configs" / "sim_conf.json", "--traces", "traces",
        "--out", "results", "--executor", "local", cwd=tmp_path, env={"COLUMNS": "100"},
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    shown = readme.split("the first lines read:\n\n```\n", 1)[1].split("```", 1)[0]
    assert again.stdout.split("\n\n", 1)[0] + "\n" == shown


def test_piped_summarize_and_compare_carry_no_padding(tmp_path: Path) -> None:
    shutil.copytree(REPO / "traces" / "raw", tmp_path / "raw")
    # the inputs through the CLI's entry point in-process (conftest): the subject is what
    # summarize and compare print to a pipe, in subprocesses (the test above pipes `dsim run`)
    parsed = run_dsim_in_process("parse", "raw", "--out", "traces", "-q", cwd=tmp_path)
    assert parsed.returncode == 0, parsed.stderr
    run = "cpuDDP_synthetic_none_mlp_epoch2_b128_worker2_thread0"
    done = run_dsim_in_process("run", run, "--executor", "local", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for args in (["summarize", "results"], ["compare", f"results/{run}", f"results/{run}"]):
        proc = run_dsim(*args, cwd=tmp_path, env={"COLUMNS": "120"})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout and all(x == x.rstrip() for x in proc.stdout.splitlines()), args
