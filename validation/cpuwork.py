"""CPU work that stretches under contention: the loading and compute of the cpu and mixed regimes.

A sleep lasts its time however busy the machine is; a decoder does not — with
fewer free cores it takes longer in wall time. The cpu and mixed regimes
therefore spend their costs as a fixed amount of *work*: ``units`` rounds of
SHA-256 over a 1 KiB buffer. ``calibrate`` measures, once per sweep on the
idle machine, how many units one uncontended core does per millisecond of
CPU time (CPU time, not wall time, so that a busy machine during calibration
does not shrink the work); every job of the sweep is handed that number, so
all runs do the same work and only its wall time depends on contention.
"""

from __future__ import annotations

import hashlib
import time

BLOCK = bytes(range(256)) * 4  # 1 KiB: one unit of work hashes it once


def spin(units: int) -> bytes:
    """Do ``units`` units of CPU work; the digest is returned so nothing is optimised away."""
    digest = b""
    for _ in range(max(int(units), 0)):
        digest = hashlib.sha256(BLOCK).digest()
    return digest


def units_for(ms: float, units_per_ms: float) -> int:
    """Units of work that take ``ms`` milliseconds on one uncontended core."""
    if units_per_ms <= 0:
        raise ValueError(f"units per ms must be > 0, not {units_per_ms}")
    return max(round(ms * units_per_ms), 0)


def work_ms(ms: float, units_per_ms: float) -> None:
    """Spend ``ms`` ms of one uncontended core's CPU time (longer in wall time when busy)."""
    spin(units_for(ms, units_per_ms))


def calibrate(rounds: int = 5, units: int = 20_000) -> float:
    """Units per millisecond of one core's CPU time: the best of ``rounds`` timed rounds.

    The best round is the one least disturbed by other processes (a preempted
    round loses no CPU time, but caches and frequency still suffer).
    """
    if rounds < 1 or units < 1:
        raise ValueError("rounds and units must be >= 1")
    spin(units // 10)  # warm up
    best = 0.0
    for _ in range(rounds):
        t0 = time.thread_time()
        spin(units)
        used_ms = (time.thread_time() - t0) * 1e3
        if used_ms > 0:
            best = max(best, units / used_ms)
    if best <= 0:
        raise RuntimeError("calibration measured no CPU time (thread_time has no resolution here)")
    return best


if __name__ == "__main__":
    print(f"{calibrate():.1f} units/ms")
