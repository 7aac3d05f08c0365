"""What an embedded Ray costs to start, per set of ``ray.init`` options (issue #21 item 2).

Why: the quick start's ``--executor ray`` pays Ray's start-up on a job that
takes well under a second in-process; this measures, each in a fresh
interpreter and interleaved, the time to import Ray, ``ray.init`` an embedded
loopback instance, run a first task and shut it down, under Ray's defaults,
under the options dsim uses, and under candidates for saving more.

Usage (repository root)::

    python bench/bench_ray_start.py                 # 3 repeats of every variant
    python bench/bench_ray_start.py --repeats 1 --variants defaults dsim
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

#: name -> (ray.init keyword arguments as Python source, extra environment); "dsim" is what
#: dsim.execute.ray_connect starts an embedded instance with (EMBEDDED_ENV included)
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "defaults": ("", {}),
    "dsim until #21": (
        "include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, "
        "num_cpus=os.cpu_count()",
        {},
    ),
    "dsim+num_cpus=2": (
        "include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, num_cpus=2",
        {},
    ),
    "dsim+small object store": (
        "include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, "
        "num_cpus=os.cpu_count(), object_store_memory=100 * 1024 * 1024",
        {},
    ),
    "dsim (+no metrics/usage)": (
        "include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, "
        "num_cpus=os.cpu_count()",
        {"RAY_USAGE_STATS_ENABLED": "0", "RAY_enable_metrics_collection": "0"},
    ),
}

CHILD = """
import json, logging, os, sys, time
t0 = time.perf_counter()
import ray
t1 = time.perf_counter()
ray.init(address="local", {options})
t2 = time.perf_counter()
ray.get(ray.remote(lambda: 1).remote())
t3 = time.perf_counter()
ray.shutdown()
t4 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "init_s": t2 - t1, "first_task_s": t3 - t2,
                  "shutdown_s": t4 - t3, "total_s": t4 - t0}}))
"""


def one(name: str) -> dict[str, float]:
    options, extra = VARIANTS[name]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **extra}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(options=options)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in args.variants}
    for _ in range(args.repeats):  # interleaved, so that load changes hit every variant
        for name in args.variants:
            samples[name].append(one(name))
            print(name, json.dumps(samples[name][-1]), flush=True)
    print(f"\nmedian of {args.repeats}, {os.cpu_count()} cores")
    print(f"{'variant':>26} {'import':>7} {'init':>7} {'1st task':>8} {'shutdown':>8} {'total':>7}")
    for name, rows in samples.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(
            f"{name:>26} {med['import_s']:7.2f} {med['init_s']:7.2f} "
            f"{med['first_task_s']:8.2f} {med['shutdown_s']:8.2f} {med['total_s']:7.2f}"
        )


if __name__ == "__main__":
    main()
