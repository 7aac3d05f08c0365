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

from collections.abc import Callable

#: Runs of fewer GPU-iterations skip the releases between their steps
#: (``release_freed_for``). A release hands pages back that the next step faults in
#: again: on the 2-core VM, 20 runs of 10,000 × 8 spent 1.05 s of system time against
#: 0.48 s without them, 2.78 s of wall time against 2.35 (medians of 6 interleaved
#: pairs, BENCHMARKS.md), to keep a few MB off the peak. From 2^19 up (the memory
#: benchmarks' 10^6 and 4×10^6 runs) a step frees tens of MB or more, and releases.
RELEASE_MIN_GPU_ITERATIONS = 1 << 19


def release_freed() -> None:
    """Return Arrow's pooled and the C heap's free memory to the system (cheap; safe at
    any time). The C heap's half matters the other way round: NumPy's freed arrays of a
    phase stay in glibc's heap (its mmap threshold grows with the arrays it saw), where
    Arrow's pool cannot reuse them for the Parquet writing that comes next."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    _trim_c_heap()


def _trim_c_heap() -> None:
    """glibc's ``malloc_trim(0)``; nothing where the C library has none (musl, macOS)."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        import ctypes

        try:  # the process's own symbols: no ctypes.util.find_library (it runs ldconfig)
            _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM = None


def worth_releasing(gpu_iterations: int) -> bool:
    """Whether a run of ``gpu_iterations`` frees enough between its steps to hand back."""
    return gpu_iterations >= RELEASE_MIN_GPU_ITERATIONS


def release_freed_for(gpu_iterations: int) -> None:
    """``release_freed`` between the steps of a run of ``gpu_iterations``, where it pays."""
    if worth_releasing(gpu_iterations):
        release_freed()


def releaser(gpu_iterations: int) -> Callable[[], None]:
    """``release_freed_for`` of a run's size, as the callback the array build takes."""
    return lambda: release_freed_for(gpu_iterations)
