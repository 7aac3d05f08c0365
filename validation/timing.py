"""What the physical job's timing is made of, measured from a sweep's logs.

The pipeline model calibrates every unobserved term from a trace; these are
the terms, measured directly, so that the model's calibration can be checked
against them (validation/README.md quotes them):

* fetch overhead — a fetch line's duration minus the batch's cost-table
  entry (sleep wake-ups, sample creation, collation, the log line);
* handover — the stall of a batch that was already waiting when the loop
  asked for it (fetch ended before the request): queue, unpickling, the
  tensors' shared-memory handles;
* delivery — arrival minus fetch end of a batch the loop was waiting for;
* dispatch — fetch start minus the moment its index was sent (the hand-over
  of batch k - prefetch x workers) when that was the later constraint: index
  queue and worker wake-up;
* restart — fetch start minus the same worker's previous fetch end when that
  was the later constraint (a worker that was busy picks its next index);
* iteration overhead — per iteration, the shortest non-stall time of any rank
  (the rank whose batch came last) minus the simulated compute: forward,
  backward with the gloo all-reduce, optimizer step, the training line.

    python -m validation.timing                 # validation/data
    python -m validation.timing --data /tmp/sweep --only 'w2_p2_none$'
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from validation.compare import dsim, unpack_logs
from validation.manifest import DEFAULT_OUT, load_manifest
from validation.regimes import Regime, align_table, cost_table


def start_latencies(both: pd.DataFrame, job: dict) -> tuple[np.ndarray, np.ndarray]:
    """Fetch start after the index was sent / after the worker's last fetch, whichever binds.

    Batches of the epoch's first window (sent with the iterator) and each
    worker's first batch of an epoch are left out.
    """
    window = (job["prefetch_factor"] or 0) * job["workers"]
    if not window:
        return np.array([]), np.array([])
    rows = both.sort_values(["gpu", "epoch", "iteration"]).reset_index(drop=True)
    arrival = rows.set_index(["gpu", "epoch", "iteration"])["start_t"]
    key = pd.MultiIndex.from_arrays([rows["gpu"], rows["epoch"], rows["iteration"] - window])
    sent = pd.Series(arrival.reindex(key).to_numpy(), index=rows.index)
    free = rows.groupby(["gpu", "epoch", "worker"])["end"].shift(1)
    start = rows["start_f"]
    ok = sent.notna() & free.notna()
    by_sent = ok & (sent >= free)
    by_free = ok & (free > sent)
    return (
        (start - sent)[by_sent].dt.total_seconds().to_numpy(),
        (start - free)[by_free].dt.total_seconds().to_numpy(),
    )


def run_timing(trace: Path, job: dict) -> dict[str, float]:
    """Medians and 90th percentiles (ms) of the four terms, over all epochs and ranks."""
    fetch = pd.read_parquet(trace / "fetch.parquet")
    train = pd.read_parquet(trace / "train.parquet")
    table = cost_table(
        Regime(**job["regime"]), job["epochs"], job["iterations"], job["ranks"], job["seed"]
    )
    table = align_table(table, job["align"])
    overhead = fetch["fetch_s"] - table[fetch["epoch"], fetch["iteration"], fetch["gpu"]]
    both = fetch.merge(train, on=["epoch", "iteration", "gpu"], suffixes=("_f", "_t"))
    request = both["start_t"] - pd.to_timedelta(both["stall_s"], unit="s")
    ready = both["end"] < request
    delivery = (both["start_t"] - both["end"]).dt.total_seconds()[~ready]
    dispatch, restart = start_latencies(both, job)
    train = train.assign(busy=train["iteration_s"] - train["stall_s"])
    later = train[train["iteration"] > 0]  # iteration 0 waits for the epoch's first batches
    busy = later.groupby(["epoch", "iteration"])["busy"].min()
    compute = job["regime"]["compute_ms"] / 1e3
    out: dict[str, float] = {}
    for name, values in (
        ("fetch_overhead", overhead),
        ("handover", both["stall_s"][ready]),
        ("delivery", delivery),
        ("dispatch", dispatch),
        ("restart", restart),
        ("iteration_overhead", busy - compute),
    ):
        values = np.asarray(values, dtype=np.float64)
        out[f"{name}_median_ms"] = float(np.median(values)) * 1e3 if len(values) else np.nan
        out[f"{name}_p90_ms"] = float(np.quantile(values, 0.9)) * 1e3 if len(values) else np.nan
    out["ready_share_pct"] = 100.0 * float(ready.mean())
    return out


def timing(data: Path, only: str | None = None) -> pd.DataFrame:
    manifest = load_manifest(data)
    names = [n for n in manifest["runs"] if not only or re.search(only, n)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="dsim-timing-") as tmp:
        logs, traces = Path(tmp) / "logs", Path(tmp) / "traces"
        for name in names:
            unpack_logs(data / name, logs / name)
        dsim("parse", str(logs), "--out", str(traces), "--quiet")
        for name in names:
            job = json.loads((data / name / "job.json").read_text())
            rows.append({"run": name, **run_timing(traces / name, job)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(DEFAULT_OUT))
    p.add_argument("--only", metavar="REGEX", help="runs whose name matches")
    args = p.parse_args(argv)
    frame = timing(Path(args.data), args.only)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(frame.round(2).to_string(index=False))
        print("\nmedian over runs:")
        print(frame.drop(columns="run").median().round(2).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
