"""A dataset file damaged after dsim wrote it: the next `dsim run` computes its replays
again and says why, instead of reusing stubs whose numbers are gone.

Found by an adversarial check of the CLI: after one flipped byte in
`dataset/gpus/RUN.parquet`, `dsim run` said "0 replays computed, 9 reused" (exit 0)
and `dsim report` then failed on the page checksum.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from conftest import run_dsim
from tracegen import write_synthetic


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside the pages, not the footer
    path.write_bytes(bytes(data))


def test_a_damaged_dataset_file_is_rebuilt_by_the_next_run(tmp_path: Path) -> None:
    traces, out = tmp_path / "traces", tmp_path / "results"
    write_synthetic(traces, "r1", iterations=200)
    args = ("run", "r1", "--traces", traces, "--out", out, "--executor", "local")
    assert run_dsim(*args, "--quiet").returncode == 0
    again = run_dsim(*args)
    assert again.returncode == 0 and "0 replays computed" in again.stdout + again.stderr
    gpus = out / "dataset" / "gpus" / "r1.parquet"
    _flip(gpus)
    proc = run_dsim(*args)
    assert proc.returncode == 0, proc.stderr
    assert "fail their checksums" in proc.stderr and "were computed again" in proc.stderr
    assert "9 replays computed" in proc.stdout + proc.stderr
    pq.ParquetFile(gpus, page_checksum_verification=True).read()  # whole again
    assert run_dsim("report", out, "--out", tmp_path / "r.html").returncode == 0
    last = run_dsim(*args)
    assert "0 replays computed" in last.stdout + last.stderr and "checksums" not in last.stderr
