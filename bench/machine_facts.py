"""The machine a benchmark ran on, read once for every benchmark (``machine``).

bench_e2e.py, bench_replay.py and bench_pipeline.py each had their own copy of this
reader of /proc, with different keys for the same facts. Light: nothing heavy is
imported (``run_all.py`` records the environment before any benchmark runs); a
benchmark adds the versions it depends on as keyword arguments.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine(**versions: Any) -> dict[str, Any]:
    """CPUs, CPU model, memory, Python, the load average when the benchmark started, and
    ``versions`` (e.g. ``numpy=np.__version__``) as given."""
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        **versions,
    }
