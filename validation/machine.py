"""Facts about the machine and the code that a timing measurement is only valid with."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
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
