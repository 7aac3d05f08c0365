"""Facts about the machine and the code that a timing measurement is only valid with."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (other work on the machine adds timing noise)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def gpus() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists (none where it is missing): the GPU variant's hardware."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU")]


def machine_facts() -> dict[str, object]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "gpus": gpus(),
    }


def git_commit() -> str:
    """HEAD, with ``-dirty`` when code changed (a sweep's data, validation/data*/, is not code)."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    head = git("rev-parse", "HEAD")
    if not head:
        return "unknown"
    code = ["dsim", "validation", "tests", ":(glob,exclude)validation/data*/**"]
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", *code)
    return head + ("-dirty" if dirty else "")


def node_cpu_seconds() -> tuple[float, float] | None:
    """(busy, idle) CPU seconds of the whole node since boot, every core, from /proc/stat.

    Why: dsim's logs account for the CPU of the job's own threads (each batch's
    builder, each worker and training process); the node's counters also hold
    what they do not see (the kernel's work for the job's pipes and sockets,
    the launcher, other tenants). Busy is everything but idle and iowait
    (steal included: cores the hypervisor took are not the job's either).
    ``None`` without /proc (not Linux).
    """
    try:
        with open("/proc/stat", "rb") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != b"cpu":
        return None
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    hz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / hz, idle / hz


NODE_CPU_FILE = "node_cpu.json"


class NodeSamples:
    """The node's CPU counters at each iteration's batch arrival, written as node_cpu.json.

    One rank samples them (the harness runs every rank on one node): a row
    ``[epoch, wall, busy_s, idle_s]`` per iteration as its batch reaches the
    loop, and one at the end of the last iteration. Between any two rows the
    node's busy CPU seconds are the difference of ``busy_s``, set against the
    CPU seconds the job's logs account for in the same iterations
    (``validation.nodecpu``). The counters tick at ``SC_CLK_TCK`` (100 per
    second per core): a single iteration's value is coarse, a run's sum is not.
    """

    def __init__(self, log_dir: Path) -> None:
        self.path = Path(log_dir) / NODE_CPU_FILE
        self.rows: list[list[float]] = []

    def sample(self, epoch: int) -> None:
        counters = node_cpu_seconds()
        if counters is not None:
            self.rows.append([epoch, time.time(), *counters])

    def write(self) -> None:
        if self.rows:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
            body = {"cores": os.cpu_count(), "usable_cores": cores, "rows": self.rows}
            self.path.write_text(json.dumps(body) + "\n")
