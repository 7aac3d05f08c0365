"""Counts printed in English: one rule (``dsim.words.counted``) for every count and noun."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_dsim

from dsim.words import byte_size, counted, plural


@pytest.mark.parametrize(
    ("n", "noun", "text"),
    [
        (1, "GPU", "1 GPU"),
        (0, "GPU", "0 GPUs"),
        (8, "GPU", "8 GPUs"),
        (1, "DataLoader worker", "1 DataLoader worker"),
        (4, "worker process", "4 worker processes"),
        (2, "batch", "2 batches"),
        (2, "epoch", "2 epochs"),  # a hard "ch": it read "2 epoches"
        (3, "policy", "3 policies"),
        (2, "day", "2 days"),
        (1.0, "iteration", "1 iteration"),
        (np.int64(12000), "iteration", "12000 iterations"),
    ],
)
def test_counted(n: float, noun: str, text: str) -> None:
    assert counted(n, noun) == text


def test_counted_separators_and_irregular_plurals() -> None:
    assert counted(12000, "line", sep=",") == "12,000 lines"
    assert counted(2, "index", "indices") == "2 indices"
    assert plural("box") == "boxes"
    assert byte_size(512) == "512 B" and byte_size(1536) == "1.5 KiB"
    assert byte_size(63.2 * 2**30) == "63.2 GiB" and byte_size(2**60) == "1024.0 PiB"


def test_parse_of_a_one_gpu_run_speaks_in_the_singular(tmp_path) -> None:
    """A one-GPU, one-worker run: "1 GPU", never "1 GPUs" (issue #22)."""
    logs = tmp_path / "logs"
    proc = run_dsim(
        "synth", "--gpus", "1", "--workers", "1", "--iterations", "40", "--epochs", "1",
        "--out", logs,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    proc = run_dsim("parse", logs, "--out", tmp_path / "traces")
    assert proc.returncode == 0, proc.stderr
    assert "1 GPU," in proc.stdout, proc.stdout
    assert "1 GPUs" not in proc.stdout
