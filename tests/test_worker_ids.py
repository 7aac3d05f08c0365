"""Worker counts come from LOADER lines or the distinct ids seen, never the highest id + 1."""

from __future__ import annotations

import numpy as np
from loglines import fetch_line, run_of, train_line

from dsim.replay.params import LoaderSettings
from dsim.sources.rawlog.parse import parse_run


def test_sparse_worker_ids_count_as_the_workers_seen():
    worker = np.array([[0, 0], [5, 5], [9, 9], [0, 0], [5, 5], [9, 9]])
    assert LoaderSettings.implied(worker).workers == 3  # was 10
    dense = np.array([[0, 1], [1, 0], [2, 1], [3, 0]])
    assert LoaderSettings.implied(dense).workers == 4  # the most over ranks
    assert LoaderSettings.implied(np.zeros((0, 2), int)).workers == 1


def test_parse_reports_sparse_worker_ids(tmp_path):
    lines = []
    for i in range(4):
        for g in (0, 1):
            worker = (0, 7)[i % 2] if g == 0 else i % 2
            lines.append(fetch_line(f"{10 + i:02d}.5", g, worker, "1.25", i))
            lines.append(train_line(f"{10 + i:02d}.75", g, 0, i, n=4))
    parsed = parse_run(run_of(tmp_path, {"output.log": lines}))
    assert parsed.report["sparse_worker_ids"] == [{"gpu": 0, "workers": 2, "ids": [0, 7]}]
    assert (
        "worker ids of GPU 0 are not 0..1 but 0, 7; the pipeline model counts 2 workers there, "
        "not the highest id + 1 (run.json report.sparse_worker_ids)"
    ) in parsed.report["warnings"]
    dense = parse_run(run_of(tmp_path, {"dense.log": [x.replace("id: 7", "id: 1") for x in lines]}))
    assert "sparse_worker_ids" not in dense.report


def test_distinct_pairs_as_numpy_unique_finds_them():
    """The parse's (gpu, worker) pairs by one sorted int64 key: what np.unique(axis=1) gives."""
    from dsim.sources.rawlog.parse import _distinct_pairs

    rng = np.random.default_rng(7)
    for n, ranks, workers in ((1, 1, 1), (7, 3, 2), (5000, 1024, 8), (3000, 40, 999_999)):
        gpu = rng.integers(0, ranks, n).astype(np.int32)
        worker = rng.integers(0, workers, n).astype(np.int32)
        want = np.unique(np.stack([gpu.astype(np.int64), worker.astype(np.int64)]), axis=1)
        np.testing.assert_array_equal(_distinct_pairs(gpu, worker), want)
