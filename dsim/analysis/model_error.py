"""The pipeline model's error on physical re-runs, as the bands of its answers carry it.

Why: a what-if is only as good as its error against a re-run of the job with
the change applied, and that error is measured (FIDELITY.md, every committed
sweep under validation/). A speed-up said without it overstates: the
alignment cells' predictions missed their re-runs by up to 15 %, the loader
cells' by up to 32 %. So every pipeline-model answer that states a speed-up
states the band that error gives (``dsim run``'s verdict, ``dsim tune``).

Each constant is the 95th percentile of the model's absolute error of the
mean iteration time over one kind of cell of every committed sweep
(validation/fidelity.csv and validation/*/fidelity.csv), so that the band
covers the model's error as often as a 95 % interval covers the noise.
tests/test_tune.py and tests/test_verdict.py recompute both from the CSVs:
they move whenever FIDELITY.md is re-run.
"""

from __future__ import annotations

#: Loader what-ifs (more workers, another prefetch): 462 cells of 32 sweeps, 2 and 16 cores, GPU
#: runs and ranks bound two to a CPU included; 13.7 %, where the mean is 4.8 % (13.9 % before
#: a few busy hand-overs counted where the time left explains them, 2026-12-07, which took the
#: 16-core cpu regime's 4 -> 8 workers from +13 % to +1…+6 %: validation/README.md, "A few busy
#: hand-overs"; 15.4 % over 444
#: cells of 31 sweeps before ranks bound in groups were replayed as CPU domains, 2026-12-07:
#: validation/README.md, "The twenty-seventh held-out sweep"; 15.1 % over 408
#: cells of 29 sweeps before the two bound sweeps, 2026-12-07, whose pooled CPUs put the
#: loader what-ifs 9-10 % too fast: validation/README.md, "The twenty-fifth held-out sweep";
#: 16.2 % over 388 cells before each batch's
#: wait for a core scaled with its CPU and the cores' wall-clock bound, 2026-12-07:
#: validation/README.md, "The twenty-third held-out sweep"; 15.3 % over 358 before the second
#: 16-core sweep). A mean error (4.4 %
#: of one 2-core sweep, until 2026-11-28) made bands of about ±10 % where tune's predictions
#: missed the 16-core sweep's re-runs by up to 28 %.
LOADER_WHATIF_ERROR = 0.137
#: Alignment what-ifs (fetch and start alignment): 202 cells of 20 sweeps; 12.4 %, where the
#: mean is 4.5 % (12.3 % before the contention's fixed point was found by interpolation, which
#: moved the predictions within its tolerance; 12.4 % over 194 cells before the twenty-fourth
#: held-out sweep, 2026-12-07;
#: 10.6 % over 186 cells before the 16-core sweeps of 2026-11-29, whose cpu
#: regime's fetch alignments the model missed by 13-33 % too slow before busy hand-overs waited
#: for the batch being built, and by up to 17 % too fast after: validation/README.md, "The
#: twenty-first held-out sweep"). Most of the rest is the re-runs' own spread: the same work's
#: CPU time moves by ±12 % between runs on the 2-core VM (validation/README.md, "The tenth
#: held-out sweep").
ALIGN_WHATIF_ERROR = 0.124

#: The effective-delay share of the same alignment cells, in percentage points: 9.3, where the
#: mean is 3.0 (9.4 before the twenty-fourth held-out sweep; 10.2 before each batch's wait for a
#: core scaled with its CPU, 2026-12-07; 10.5 before the 16-core sweeps of 2026-11-29; 12.4
#: before the busy worker's hand-over by quantile, 2026-11-29, which took the mixed regime's
#: align mean at 2 workers from 10-16 points too low on 8 of 10 sweeps to -0.5 on average over
#: 11; validation/README.md, "The busy worker's spread").
ALIGN_SHARE_ERROR_PTS = 9.3
#: ... of the loader cells: 44.2 points (462 cells; 44.5 over 444; 45.2 over 408; 45.3 over
#: 388). A loader change moves the fetches' overlap and the stalls' spread together, and the
#: share, a count of iterations over a 30 ms line, swings with both; the band says how little
#: the predicted share of a loader what-if pins down.
LOADER_SHARE_ERROR_PTS = 44.2
#: Fewer workers than the run had (a run with more predicting fewer: what ``dsim tune`` does
#: from every base run): 454 cells of 32 sweeps; 16.6 %, where the mean is 5.7 % (16.4 % over 436
#: cells before CPU domains; 13.9 % over 400
#: cells before the two sweeps of ranks bound two to a CPU, 2026-12-07, whose fewer-worker
#: what-ifs came out 11-14 % too slow, pooled or as CPU domains; 20.4 % over
#: 380 cells before each batch's wait for a core scaled with its CPU, 2026-12-07; 29.7 and 9.2 %
#: before the workers' population scaled their stretch, 2026-11-29: a run with 8 workers
#: predicting 1 came out 20-34 % too slow on the 2-core sweeps; validation/README.md, "The
#: nineteenth held-out sweep" and "The twentieth"). Measured since 2026-11-29; until then these
#: what-ifs took the loader error above, measured only on more workers, and overstated how sure
#: a recommendation of fewer workers was (validation/README.md, "Fewer workers").
LOADER_FEWER_ERROR = 0.166
#: ... their effective-delay share: 14.2 points (the same cells; the mean is 4.9; 13.5 and 4.8
#: before CPU domains; 12.4 and 4.4 before the bound sweeps; 20.6 and 5.6
#: before 2026-12-07; 17.7 and 5.4 with the square root of the population ratio, which fitted
#: the time less well).
LOADER_FEWER_SHARE_ERROR_PTS = 14.2


def loader_errors(fewer: bool) -> tuple[float, float]:
    """(time error, share error in points) of a loader what-if: fewer workers than measured,
    or not (more workers, another prefetch factor)."""
    if fewer:
        return LOADER_FEWER_ERROR, LOADER_FEWER_SHARE_ERROR_PTS
    return LOADER_WHATIF_ERROR, LOADER_SHARE_ERROR_PTS


def speedup_band(low: float, high: float, error: float) -> tuple[float, float]:
    """A speed-up interval [low, high] widened by a relative error of the predicted time.

    The predicted iteration time t may be off by ±error, so t × (1 ∓ error): the speed-up
    s = before / t becomes s ÷ (1 ± error).
    """
    return low / (1.0 + error), (high / (1.0 - error) if error < 1.0 else float("inf"))


def share_band(share: float, points: float) -> tuple[float, float]:
    """A predicted effective-delay share ± the model's error in points, kept within 0-100 %."""
    return max(share - points, 0.0), min(share + points, 100.0)
