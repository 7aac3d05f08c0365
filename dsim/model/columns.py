"""The vocabulary of replay outputs, shared by the replay models, the results
format and the summary (docs/SPEC.md §3, §4).

Pure names, no I/O: the replay kernels import this without loading the
results I/O (and pyarrow.parquet) into every Ray worker.
"""

from __future__ import annotations

#: The per-iteration metric columns of a replay table, in table order.
METRIC_COLUMNS = ("iteration_s", "stall_s", "delay_s", "fetch_diff_s", "start_diff_s")


def gpu_stall_column(gpu: int) -> str:
    """Name of the replayed-stall column of one GPU rank in a replay table."""
    return f"stall_s_gpu{gpu}"
