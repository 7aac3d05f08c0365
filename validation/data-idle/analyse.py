"""The node's CPU per iteration of the four runs here: logged, busy, idle (validation/README.md).

Usage (repository root): ``python validation/data-idle/analyse.py``. Parses each run's
rank logs with ``dsim parse`` into a temporary directory, then sets the body's
iterations (past the first 10 + 2W, before the last 2W) against the
``/proc/stat`` samples ``statsample.py`` took while the run trained (100 jiffies a
second, both cores summed): C is the fetches' ``cpu`` plus the trainers' ``CPU``
per iteration, busy and idle the node's, per iteration of that window.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
HZ = 100.0  # USER_HZ: jiffies per second in /proc/stat
CORES = 2


def main() -> None:
    runs = sorted(p for p in HERE.iterdir() if (p / "job.json").is_file())
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "dsim", "parse", *map(str, runs), "--out", tmp, "--quiet"]
        subprocess.run(cmd, check=True)
        for run in runs:
            workers = int(run.name.split("_w")[1].split("_")[0])
            lo, hi = 10 + 2 * workers, 100 - 2 * workers
            fetch = pd.read_parquet(Path(tmp) / run.name / "fetch.parquet")
            train = pd.read_parquet(Path(tmp) / run.name / "train.parquet")
            start = train["start"].astype("int64") / 1e9
            a = start[train.iteration == lo].min()
            b = start[train.iteration == hi].max()
            n = hi - lo
            body = (fetch.iteration >= lo) & (fetch.iteration < hi)
            steps = (train.iteration >= lo) & (train.iteration < hi)
            logged = (fetch.cpu_s[body].sum() + train.cpu_s[steps].sum()) / n
            with gzip.open(run / "proc_stat.txt.gz", "rt") as f:
                samples = np.loadtxt(f)
            window = samples[(samples[:, 0] >= a) & (samples[:, 0] <= b)]
            busy = (window[-1, 1] - window[0, 1]) / HZ / n
            idle = (window[-1, 2] - window[0, 2]) / HZ / n
            t = (b - a) / n
            print(
                f"{run.name}: T {1e3 * t:.1f} ms, C {1e3 * logged:.1f}, K*T - C "
                f"{1e3 * (CORES * t - logged):.1f}; node busy {1e3 * busy:.1f}, idle "
                f"{1e3 * idle:.1f}; busy - C {1e3 * (busy - logged):.1f} ms per iteration"
            )


if __name__ == "__main__":
    main()
