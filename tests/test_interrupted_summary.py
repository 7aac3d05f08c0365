"""An interrupt while `dsim run` writes the results directory's summary and attribution
files leaves them a whole set, then exits 130.

Found by an adversarial check of the CLI: SIGINT about 2 s into a fresh run left
`summary.parquet` but no `summary.csv` or `attribution.*`. Each file was written
atomically, the set was not. The signal is sent here by the process itself, right after
`summary.parquet` is in place, so that it lands in that window every time.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tracegen import write_synthetic

_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import dsim.app.run as run
    from dsim import cli

    written = run.write_answer_files

    def then_interrupted(answer, out, formats, stem):
        paths = written(answer, out, formats[:1], stem)  # summary.parquet in place
        os.kill(os.getpid(), signal.SIGINT)
        return paths + written(answer, out, formats[1:], stem)

    run.write_answer_files = then_interrupted
    cli.main(sys.argv[1:])
    """
)


def test_an_interrupt_leaves_summary_and_attribution_a_whole_set(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    write_synthetic(traces, "r1", iterations=20)
    out = tmp_path / "results"
    args = ["run", "r1", "--traces", str(traces), "--out", str(out), "--executor", "local"]
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().endswith("dsim: interrupted"), proc.stderr
    names = ("summary.parquet", "summary.csv", "attribution.parquet", "attribution.csv")
    assert all((out / name).is_file() for name in names), sorted(p.name for p in out.iterdir())
