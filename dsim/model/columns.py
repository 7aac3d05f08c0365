"""The vocabulary of replay outputs, shared by the replay models, the results
format and the summary (docs/SPEC.md §3, §4).

Pure names, no I/O: the replay kernels import this without loading the
results I/O (and pyarrow.parquet) into every Ray worker.
"""

from __future__ import annotations

#: The per-iteration metric columns of a replay table, in table order.
METRIC_COLUMNS = ("iteration_s", "stall_s", "delay_s", "fetch_diff_s", "start_diff_s")

#: The summary's statistics of one run under one policy (docs/SPEC.md §5.1), and its what-if
#: columns against the measured run: the numbers ``--fail-if`` may name, here so that a
#: condition is checked before the summary's I/O (and pandas) is imported.
STAT_COLUMNS = [
    "iterations",
    *(f"{metric}_{stat}" for metric in METRIC_COLUMNS[:3] for stat in ("mean", "std")),
    "start_diff_s_mean",
    "start_diff_s_std",
    "fetch_diff_s_mean",
    "fetch_diff_s_std",
    "effective_delay_pct",
]
WHAT_IF_COLUMNS = ["speedup", "stall_change_s", "effective_delay_change_pts"]


def gpu_stall_column(gpu: int) -> str:
    """Name of the replayed-stall column of one GPU rank in a replay table."""
    return f"stall_s_gpu{gpu}"
