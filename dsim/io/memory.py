"""Memory freed by Arrow handed back to the system, where a phase of tables ends.

Arrow allocates table buffers from its own pool (jemalloc or mimalloc), which
keeps freed memory for Arrow's later allocations; NumPy allocates from the C
heap and cannot use it. So when a run's tables are let go of and NumPy arrays
(replays, the pipeline model's calibration) are made next, the tables' memory
would stay resident beside them: measured on ``dsim run``'s headline, ~100
bytes per GPU-iteration of a trace already freed (BENCHMARKS.md, "Memory and
disk"). ``release_freed`` asks the pool to return what it holds unused.
"""

from __future__ import annotations


def release_freed() -> None:
    """Return Arrow's pooled, unused memory to the system (cheap; safe at any time)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
