"""Summary statistics of replays (docs/SPEC.md §5) and the what-if comparison.

A replay table holds every complete iteration of every epoch; the summary
decides which of them count. It keeps the selected epochs (default: all but
the first, which carries start-up effects, when a run has more than one) and
skips warm-up iterations (``iteration <= warmup``) of each epoch, then gives
one row per run and policy: mean and sample standard deviation of each metric,
the iteration count and the share of iterations whose delay exceeds the
threshold. What-if columns compare each policy with the same run's
``actual/actual`` replay, the measured run.

``summary_row`` + ``summary_frame`` build the table from in-memory replays
(``dsim run``); ``summarize_results`` builds it from results directories
(``dsim summarize``, ``dsim report``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from dsim.analysis.throughput import THROUGHPUT_COLUMNS, add_throughput, batch_size
from dsim.errors import UsageError
from dsim.model.columns import STAT_COLUMNS, WHAT_IF_COLUMNS
from dsim.model.resultinfo import ResultInfo, Selection
from dsim.model.results import METRIC_COLUMNS, ResultRun
from dsim.model.runname import RUN_NAME_FIELDS, parse_run_name
from dsim.model.selection import Epochs, resolve_epochs, selection_mask
from dsim.replay.policies import ACTUAL, BASELINE, Policy
from dsim.sets import distinct

DEFAULT_WARMUP = 10
DEFAULT_THRESHOLD_S = 0.030

METADATA_COLUMNS = ["run", *RUN_NAME_FIELDS, "gpus"]
#: Which replay model made a row, and the loader settings it assumed (pipeline model only).
#: ("model" is taken: the run name's network, as in the original analysis.)
MODEL_COLUMNS = ["replay_model", "loader_workers", "loader_prefetch_factor", "loader_changed"]
SELECTION_COLUMNS = ["selected_epochs", "warmup", "threshold_s"]
SUMMARY_COLUMNS: list[str] = [
    *METADATA_COLUMNS,
    *MODEL_COLUMNS,
    "fetch_align",
    "start_align",
    *STAT_COLUMNS,
    *WHAT_IF_COLUMNS,
    *SELECTION_COLUMNS,
    *THROUGHPUT_COLUMNS,  # §5.5; after the older columns, which keep their places
]


def _mean_std(values: np.ndarray) -> tuple[float, float]:
    n = len(values)
    mean = float(np.mean(values)) if n else math.nan
    std = float(np.std(values, ddof=1)) if n >= 2 else math.nan
    return mean, std


def summarize_metrics(
    metrics: Mapping[str, np.ndarray], mask: np.ndarray, threshold_s: float
) -> dict[str, Any]:
    """Statistics of one replay over the selected iterations (docs/SPEC.md §5).

    Means and sample standard deviations (ddof=1; NaN with fewer than two
    iterations), the count, and ``effective_delay_pct`` = share of iterations
    with delay strictly above ``threshold_s``.
    """
    mask = np.asarray(mask, dtype=bool)
    out: dict[str, Any] = {"iterations": int(mask.sum())}
    for metric in METRIC_COLUMNS:
        mean, std = _mean_std(np.asarray(metrics[metric], dtype=np.float64)[mask])
        out[f"{metric}_mean"] = mean
        out[f"{metric}_std"] = std
    delay = np.asarray(metrics["delay_s"], dtype=np.float64)[mask]
    n = len(delay)
    out["effective_delay_pct"] = 100.0 * int((delay > threshold_s).sum()) / n if n else math.nan
    return out


def _group_keys(df: pd.DataFrame) -> list[str]:
    """Rows compared with one baseline: a run in one results directory, under one model.

    Model variants of a run (``RUN@pipeline``, ``RUN@pipeline-w8-p2``) live in
    sibling directories, so the results directory is the variant's parent.
    """
    keys = ["run", "replay_model"] if "replay_model" in df.columns else ["run"]
    if "results" in df.columns:
        df["__root"] = [str(Path(r).parent) for r in df["results"]]
        keys.append("__root")
    return keys


def add_what_if(df: pd.DataFrame) -> pd.DataFrame:
    """Compare every row with its run's ``actual/actual`` row; NaN where a run has none.

    speedup = baseline mean iteration time ÷ this policy's (>1 is faster);
    changes are this policy minus the baseline.
    """
    df = df.copy()
    keys = _group_keys(df)
    is_base = (df["fetch_align"] == ACTUAL) & (df["start_align"] == ACTUAL)
    if "loader_changed" in df.columns:  # a loader what-if is not the measured run
        is_base &= ~df["loader_changed"].fillna(False).astype(bool)
    base = df.loc[is_base, [*keys, "iteration_s_mean", "stall_s_mean", "effective_delay_pct"]]
    base = base.drop_duplicates(subset=keys, keep="first")
    base = base.rename(columns=lambda c: c if c in keys else f"__base_{c}")
    merged = df[keys].merge(base, on=keys, how="left")
    merged.index = df.index
    df["speedup"] = merged["__base_iteration_s_mean"] / df["iteration_s_mean"]
    df["stall_change_s"] = df["stall_s_mean"] - merged["__base_stall_s_mean"]
    df["effective_delay_change_pts"] = (
        df["effective_delay_pct"] - merged["__base_effective_delay_pct"]
    )
    return df.drop(columns=["__root"], errors="ignore")


def run_metadata(run: str, trace: Mapping[str, Any] | None) -> dict[str, Any]:
    """Run-name fields and GPU count of a run, from its trace's ``run.json`` when known."""
    trace = trace or {}
    fields = trace.get("metadata") or parse_run_name(run)
    meta: dict[str, Any] = {"run": run}
    meta.update({name: fields.get(name) for name in RUN_NAME_FIELDS})
    meta["gpus"] = trace.get("gpus")
    return meta


def summary_row(
    *,
    run: str,
    trace: Mapping[str, Any] | None,
    policy: Policy,
    stats: Mapping[str, Any],
    epochs: Sequence[int],
    warmup: int,
    threshold_s: float,
) -> dict[str, Any]:
    """One summary row: run metadata, policy, ``summarize_metrics`` output, selection."""
    return {
        **run_metadata(run, trace),
        "fetch_align": policy[0],
        "start_align": policy[1],
        **stats,
        "selected_epochs": ",".join(str(e) for e in epochs),
        "warmup": int(warmup),
        "threshold_s": float(threshold_s),
    }


def model_fields(info: Mapping[str, Any]) -> dict[str, Any]:
    """The model columns of a run's rows, from its ``result.json``."""
    loader = info.get("loader") or {}
    assumed = loader.get("assumed") or {}
    return {
        "replay_model": info.get("model", "per-iteration"),
        "loader_workers": assumed.get("workers"),
        "loader_prefetch_factor": assumed.get("prefetch_factor"),
        "loader_changed": bool(loader.get("changed", False)),
        # where the measured settings came from: "log" (LOADER lines) or "implied" (worker ids)
        "loader_source": (loader.get("measured") or {}).get("source"),
    }


def summary_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows → the summary table: what-if columns added, ``SUMMARY_COLUMNS`` first, extras after."""
    df = pd.DataFrame(list(rows))
    for col in SUMMARY_COLUMNS:
        if col not in df.columns:
            df[col] = pd.Series(dtype="float64")
    df = add_throughput(add_what_if(df))
    extras = [c for c in df.columns if c not in SUMMARY_COLUMNS]
    return df[[*SUMMARY_COLUMNS, *extras]].reset_index(drop=True)


def _run_selection(
    run: ResultRun, epochs: Epochs, warmup: int | None, threshold_s: float | None
) -> tuple[Epochs, int, float]:
    return run_selection(run.info, epochs, warmup, threshold_s)


def run_selection(
    info: ResultInfo, epochs: Epochs, warmup: int | None, threshold_s: float | None
) -> tuple[Epochs, int, float]:
    """The (epochs, warm-up, threshold) a run's summary uses: the options given, else what
    its ``result.json`` recorded, else the defaults."""
    saved = info.selection or Selection(None, None, None)
    if epochs is None and saved.epochs is not None:
        epochs = list(saved.epochs)
    if warmup is None:
        warmup = DEFAULT_WARMUP if saved.warmup is None else saved.warmup
    if threshold_s is None:
        threshold_s = DEFAULT_THRESHOLD_S if saved.threshold_s is None else saved.threshold_s
    return epochs, int(warmup), float(threshold_s)


def selected_iterations(
    epoch: np.ndarray,
    iteration: np.ndarray,
    epochs: Sequence[int] | str | None,
    warmup: int,
    run: str,
) -> tuple[list[int], np.ndarray]:
    """The epochs a summary uses and its row mask; a ``UsageError`` when nothing is left.

    ``dsim run`` calls this before replaying anything, so that a selection
    that would leave no iteration fails before any file is written.
    """
    selected = resolve_epochs(distinct(epoch).tolist(), epochs, run=run)
    mask = selection_mask(epoch, iteration, selected, warmup)
    if not mask.any():
        chosen = np.isin(epoch, selected)
        last = int(iteration[chosen].max()) if chosen.any() else None
        # with epochs of iteration 0 alone no warm-up leaves anything: say so, not "smaller"
        hint = (
            "choose other --epochs or a smaller --warmup"
            if warmup > 0 and last is not None and last > 0
            else "choose other --epochs"
            if last is not None and last > 0
            else "choose other --epochs (the chosen epochs hold only iteration 0, which the "
            "warm-up always skips: iterations > N are kept)"
        )
        raise UsageError(
            f"run {run}: no iterations selected (epochs "
            f"{','.join(map(str, selected)) or 'none'}, iterations > {warmup}); {hint}"
        )
    return selected, mask


def summarize_results(
    runs: list[ResultRun],
    *,
    epochs: Epochs = None,
    warmup: int | None = None,
    threshold_s: float | None = None,
    policies: Sequence[Policy] | None = None,
) -> pd.DataFrame:
    """The summary table of replays stored in results directories.

    Options override the selection each run's ``result.json`` recorded. The
    ``actual/actual`` replay is read for the what-if columns even when
    ``policies`` leaves it out of the rows. Only the replays ``result.json``
    lists are read, and only if their provenance matches (``dsim.model.results``).
    """
    rows = summary_rows(
        runs, epochs=epochs, warmup=warmup, threshold_s=threshold_s, policies=policies
    )
    return summary_table(rows)


def summary_rows(
    runs: list[ResultRun],
    *,
    epochs: Epochs = None,
    warmup: int | None = None,
    threshold_s: float | None = None,
    policies: Sequence[Policy] | None = None,
    made: Mapping[Policy, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The rows of ``summarize_results`` before the columns that compare rows (what-if,
    throughput): each run's are its own, so a run's rows can be made where it ran
    (``dsim run`` on Ray) and joined by ``summary_table``. ``made``: rows ``policy_row``
    already made from the replays in memory (one run's, by policy), used instead of
    reading those replays back; the runs are verified all the same."""
    made = made or {}
    wanted = None if policies is None else list(dict.fromkeys(policies))
    rows: list[dict[str, Any]] = []
    for run in runs:
        chosen = [p for p in run.replays if wanted is None or p in wanted]
        if not chosen:
            continue
        run.verify()  # every listed replay, so that no run mixes two `dsim run`s
        if BASELINE in run.replays and BASELINE not in chosen:
            chosen.append(BASELINE)
        selection = _run_selection(run, epochs, warmup, threshold_s)
        memo: dict[str, Any] = {}  # what the run's policies share (``policy_row``)
        for policy in chosen:
            if policy in made:
                row = dict(made[policy])
                row["results"] = str(run.directory)
            else:
                table = run.read(policy, gpus=False)  # a summary reads no per-GPU column
                row = policy_row(
                    run.name, run.info, run.directory, policy, table, selection, memo=memo
                )
            row["__shown"] = wanted is None or policy in wanted
            rows.append(row)
    return rows


def policy_row(
    name: str,
    info: ResultInfo,
    directory: Path,
    policy: Policy,
    table: pa.Table,
    selection: tuple[Epochs, int, float],
    *,
    memo: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One policy's summary row (``summary_rows``, without ``__shown``) from its replay
    table (whole or its per-iteration columns), for the run of ``info`` in ``directory``
    over ``selection`` (``run_selection``). ``dsim run`` makes it from the table it holds
    after the replay, so that the summary reads no replay back (issue #21).

    ``memo``: one dict per run, given to each of its policies' calls, keeps what they
    share: the run's own columns, and the selected rows while the policies' epoch and
    iteration columns are the same (they are, for every replay of one trace), instead of
    making them (the selection's ``np.unique`` and ``isin``, the run's documents) again
    for each of a run's nine policies.
    """
    run_epochs, run_warmup, run_threshold = selection
    memo = {} if memo is None else memo
    if "trace" not in memo:
        trace = info.trace.document() if info.trace is not None else {}
        if not trace.get("gpus") and info.ranks:
            trace["gpus"] = len(info.ranks)  # ranks replayed, when the trace lacks a count
        document = info.document()
        memo["trace"] = trace
        rank_batch, batch_source = batch_size(document)
        memo["fields"] = {
            **model_fields(document),
            "batch_size_rank": rank_batch,
            "batch_size_source": batch_source,
            "results": str(directory),
        }
    epoch = table.column("epoch").to_numpy()
    iteration = table.column("iteration").to_numpy()
    rows = memo.get("rows")
    if rows is not None and np.array_equal(rows[0], epoch) and np.array_equal(rows[1], iteration):
        selected, mask = rows[2], rows[3]
    else:
        selected, mask = selected_iterations(epoch, iteration, run_epochs, run_warmup, name)
        memo["rows"] = (epoch, iteration, selected, mask)
    metrics = {m: table.column(m).to_numpy() for m in METRIC_COLUMNS}
    stats = summarize_metrics(metrics, mask, run_threshold)
    row = summary_row(
        run=name,
        trace=memo["trace"],
        policy=policy,
        stats=stats,
        epochs=selected,
        warmup=run_warmup,
        threshold_s=run_threshold,
    )
    row.update(memo["fields"])
    return row


def summary_table(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """``summary_rows`` (of one or many runs, in order) → the summary table."""
    if not rows:
        raise UsageError("no replay matches the selected runs and policies")
    df = summary_frame(rows)
    df = df[df.pop("__shown").astype(bool)]
    return df.sort_values(["run", "results"], kind="stable").reset_index(drop=True)
