"""The original pandas analysis that dsim reproduces, rewritten over dsim's tables.

Why this file exists: it is (1) the speed baseline dsim's replay kernel is
measured against and (2) an independent cross-check of the kernel, because it
computes the same numbers a completely different way: pandas Timestamps at
nanosecond resolution, ``iterrows()``, per-row Series arithmetic and
DataFrames grown one row at a time, exactly as the original notebook did.
Keep it slow and literal; do not "fix" its style, or it stops being either.

What differs from the notebook, and why:

* the per-GPU columns come from dsim's ``fetch``/``train`` tables instead of
  the authors' pre-merged CSV files; training columns are merged on
  (epoch, iteration) rather than assigned by position, which is the same thing
  for complete data and drops iterations that lack a GPU, as dsim does;
* no Ray, no CSV writing: one policy per call, results returned;
* policy ``actual`` is passed to the notebook's logic as ``False``, the value
  its config used for it (so ``if FETCH_ALIGN or START_ALIGN`` behaves as it did);
* columns the notebook grew but never reported (slowest end time, training
  end times) are still computed, so the cost per iteration stays comparable.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pyarrow as pa

STALL_FLOOR = 0.000002
STALL_GROW_MIN = 0.01

OUTPUT_COLUMNS = ["iteration_s", "stall_s", "delay_s", "fetch_diff_s", "start_diff_s"]
TRAIN_COL = ["Epoch", "Index number"]


class GpuColumns:
    """The notebook's per-GPU column names, built once for ``gpu_num`` GPUs."""

    def __init__(self, gpus: list[int]) -> None:
        self.gpus = gpus
        self.start = [f"Start time_gpu{i}" for i in gpus]
        self.fetch = [f"Fetch time (sec)_gpu{i}" for i in gpus]
        self.fetch_done = [f"Fetch done time (sec)_gpu{i}" for i in gpus]
        self.training_stall = [f"Training Stall time (sec)_gpu{i}" for i in gpus]
        self.training = [f"Training start time_gpu{i}" for i in gpus]
        self.training_time = [f"Iteration time (sec)_gpu{i}" for i in gpus]
        self.pure_training = [f"Pure training_gpu{i}" for i in gpus]


def _notebook_policy(name: str) -> str | bool:
    """dsim's ``actual`` is the notebook's ``False``; the other names are shared."""
    if name == "actual":
        return False
    if name in ("avg", "min"):
        return name
    raise ValueError(f"unknown policy {name!r}")


def simulation_frame(
    fetch: pa.Table, train: pa.Table, epoch: int
) -> tuple[pd.DataFrame, GpuColumns]:
    """One epoch as the notebook's ``simulation_df``: one row per iteration, columns per GPU."""
    fetch_df = fetch.to_pandas()
    perf_df = train.to_pandas()
    fetch_df = fetch_df[fetch_df["epoch"] == epoch]
    perf_df = perf_df[perf_df["epoch"] == epoch]
    gpus = sorted(set(fetch_df["gpu"].tolist()) | set(perf_df["gpu"].tolist()))
    cols = GpuColumns(gpus)

    simulation_df = None
    for i, gpu in enumerate(gpus):
        f = fetch_df[fetch_df["gpu"] == gpu]
        f = f.rename(
            columns={
                "epoch": "Epoch",
                "iteration": "Index number",
                "fetch_s": cols.fetch[i],
                "start": cols.start[i],
            }
        )[[*TRAIN_COL, cols.fetch[i], cols.start[i]]]
        simulation_df = f if simulation_df is None else simulation_df.merge(f, on=TRAIN_COL)
    if simulation_df is None:
        simulation_df = pd.DataFrame(columns=TRAIN_COL)
    simulation_df = simulation_df[TRAIN_COL + cols.fetch + cols.start]

    simulation_df["Min fetch time (sec)"] = simulation_df[cols.fetch].min(axis=1)
    simulation_df["Avg fetch time (sec)"] = simulation_df[cols.fetch].mean(axis=1)
    simulation_df["Min start time"] = simulation_df[cols.start].min(axis=1)

    for i, gpu in enumerate(gpus):
        p = perf_df[perf_df["gpu"] == gpu].rename(
            columns={
                "epoch": "Epoch",
                "iteration": "Index number",
                "start": cols.training[i],
                "iteration_s": cols.training_time[i],
                "stall_s": cols.training_stall[i],
            }
        )[[*TRAIN_COL, cols.training[i], cols.training_time[i], cols.training_stall[i]]]
        simulation_df = simulation_df.merge(p, on=TRAIN_COL)

    simulation_df = simulation_df.sort_values(by=TRAIN_COL)
    simulation_df = simulation_df.reset_index(drop=True)
    for i in range(len(gpus)):
        simulation_df[cols.fetch_done[i]] = simulation_df[cols.start[i]] + pd.to_timedelta(
            simulation_df[cols.fetch[i]], "s"
        )
    return simulation_df, cols


def simulate_dataload(FETCH_ALIGN, START_ALIGN, idx, row, cols: GpuColumns) -> dict:
    simulated_gpu_info = {}
    for i in range(len(cols.gpus)):
        if START_ALIGN == "avg":
            next_fetch_start_time = row[cols.start].max() - (
                (row[cols.start].max() - row[cols.start].min()) / 2
            )
        elif START_ALIGN == "min":
            next_fetch_start_time = row[cols.start].min()
        else:
            next_fetch_start_time = row[cols.start[i]]
        simulated_gpu_info[cols.start[i]] = next_fetch_start_time

        if FETCH_ALIGN == "avg":
            fetch_time = row["Avg fetch time (sec)"]
        elif FETCH_ALIGN == "min":
            fetch_time = row["Min fetch time (sec)"]
        else:
            fetch_time = row[cols.fetch[i]]
        simulated_gpu_info[cols.fetch[i]] = fetch_time
        simulated_gpu_info[cols.fetch_done[i]] = simulated_gpu_info[
            cols.start[i]
        ] + pd.to_timedelta(simulated_gpu_info[cols.fetch[i]], "s")
    return simulated_gpu_info


def simulate_training(FETCH_ALIGN, START_ALIGN, idx, row, sim_dataload_df, cols: GpuColumns):
    fetch_done_times = sim_dataload_df.loc[idx][cols.fetch_done]
    slowest_fetch_time = fetch_done_times.max()

    info_fetch_done_times = row[cols.fetch_done]
    info_training_start_times = row[cols.training].values
    info_training_times = row[cols.training_time].values.astype(float)
    info_training_stall_times = row[cols.training_stall].values.astype(float)
    info_pure_training_times = info_training_times - info_training_stall_times.max()
    info_training_end_times = info_training_start_times + pd.to_timedelta(
        info_pure_training_times, "s"
    )

    if FETCH_ALIGN or START_ALIGN:
        sim_gaps = np.array([])
        training_stall_times = np.array([])
        for _info_fetch_done_time, _fetch_done_time, _training_stall_time in zip(
            info_fetch_done_times.values,
            fetch_done_times.values,
            info_training_stall_times,
            strict=True,
        ):
            if _info_fetch_done_time > _fetch_done_time:
                _sim_gap = _info_fetch_done_time - _fetch_done_time
                new_training_stall_time = _training_stall_time - (_sim_gap / np.timedelta64(1, "s"))
                if new_training_stall_time < 0.0:
                    new_training_stall_time = STALL_FLOOR
            elif _info_fetch_done_time < _fetch_done_time:
                _sim_gap = _fetch_done_time - _info_fetch_done_time
                if _training_stall_time > STALL_GROW_MIN:
                    new_training_stall_time = _training_stall_time + (
                        _sim_gap / np.timedelta64(1, "s")
                    )
                else:
                    new_training_stall_time = _training_stall_time
            else:
                _sim_gap = pd.Timedelta(0, "s")
                new_training_stall_time = _training_stall_time
            sim_gaps = np.append(sim_gaps, _sim_gap)
            training_stall_times = np.append(training_stall_times, new_training_stall_time)
        training_times = training_stall_times.max() + info_pure_training_times
        # The notebook's pd.Timedelta(float) reads the float as nanoseconds; kept as is,
        # it only feeds an unreported column.
        training_end_times = info_training_start_times + pd.Timedelta(training_times.max())
    else:
        training_times = info_training_times
        training_end_times = info_training_end_times
        training_stall_times = info_training_stall_times

    done_row = {
        "Slowest end time": slowest_fetch_time,
        "Training end time": training_end_times.max(),
        "Training time": training_times.max(),
    }
    for i in range(len(cols.gpus)):
        done_row[cols.training[i]] = info_training_start_times[i]
        done_row[cols.pure_training[i]] = info_pure_training_times[i]
        done_row[cols.training_stall[i]] = training_stall_times[i]
    done_row["Delay time (sec)"] = training_stall_times.max() - training_stall_times.min()
    done_row["Training stall time (sec)"] = training_stall_times.max()
    return done_row


def simulate(
    simulation_df: pd.DataFrame, cols: GpuColumns, policy: tuple[str, str]
) -> pd.DataFrame:
    """The notebook's ``simulation`` task for one policy, on a prepared ``simulation_df``."""
    FETCH_ALIGN, START_ALIGN = (_notebook_policy(p) for p in policy)
    columns = TRAIN_COL + cols.start + cols.fetch + cols.fetch_done
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simulated_df = pd.DataFrame(columns=columns)
        done_df = pd.DataFrame(
            columns=[
                "Slowest end time",
                "Training time",
                "Training end time",
                "Delay time (sec)",
                "Training stall time (sec)",
                *cols.training,
                *cols.pure_training,
                *cols.training_stall,
            ]
        )
        for idx, row in simulation_df.iterrows():
            simulated_row = {TRAIN_COL[0]: row[TRAIN_COL[0]], TRAIN_COL[1]: row[TRAIN_COL[1]]}
            simulated_row.update(simulate_dataload(FETCH_ALIGN, START_ALIGN, idx, row, cols))
            simulated_df.loc[len(simulated_df)] = simulated_row
            done_df.loc[len(simulated_df)] = simulate_training(
                FETCH_ALIGN, START_ALIGN, idx, row, simulated_df, cols
            )

        out = pd.DataFrame()
        out["epoch"] = simulation_df[TRAIN_COL[0]].reset_index(drop=True)
        out["iteration"] = simulation_df[TRAIN_COL[1]].reset_index(drop=True)
        out["iteration_s"] = done_df["Training time"].reset_index(drop=True).astype(float)
        out["stall_s"] = done_df["Training stall time (sec)"].reset_index(drop=True).astype(float)
        out["delay_s"] = done_df["Delay time (sec)"].reset_index(drop=True).astype(float)
        fetch_cols = simulated_df[cols.fetch].astype(float)
        out["fetch_diff_s"] = fetch_cols.max(axis=1) - fetch_cols.min(axis=1)
        # Rows grown with .loc hold object columns; the notebook's pandas kept datetimes.
        start_cols = simulated_df[cols.start].apply(pd.to_datetime)
        out["start_diff_s"] = (start_cols.max(axis=1) - start_cols.min(axis=1)).dt.total_seconds()
    return out


def original_replay(
    fetch: pa.Table, train: pa.Table, epoch: int, policy: tuple[str, str]
) -> pd.DataFrame:
    """Replay one epoch of a run under ``policy`` the way the original analysis did.

    Returns one row per complete iteration (sorted), with columns ``epoch``,
    ``iteration`` and the metrics ``iteration_s``, ``stall_s``, ``delay_s``,
    ``fetch_diff_s``, ``start_diff_s`` in seconds.
    """
    simulation_df, cols = simulation_frame(fetch, train, epoch)
    return simulate(simulation_df, cols, policy)
