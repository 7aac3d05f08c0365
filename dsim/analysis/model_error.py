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
covers the model's error as often as a 95 % interval covers the noise. The
time errors are kept per kind of node (``NodeErrors``): pooled, the many-core
sweeps' misses sat outside a band that the few-core sweeps, nine in ten of the
cells, made narrow. tests/test_tune.py and tests/test_verdict.py recompute
them from the CSVs: they move whenever FIDELITY.md is re-run.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A node whose job may use at most this many cores per rank (its logged cores over the ranks on it)
#: is a few-core node. Why two: the committed sweeps ran 4 ranks on 2 cores (0.5 per rank), 1 rank
#: on 2 cores (2) and 4 or 1 ranks on 16 cores (4 and 16), and the model's error splits between the
#: last two. On the many-core nodes the ranks compute side by side after the last batch arrives,
#: which the model does not replay (validation/README.md, "Compute after the last arrival"): the
#: pooled 95th percentiles covered 69 % of their loader cells and 60 % of their alignment cells, and
#: 98 % of the few-core nodes' loader cells (validation/README.md, "The error by the node's cores").
FEW_CORES_PER_RANK = 2.0


@dataclass(frozen=True)
class NodeErrors:
    """One kind of what-if's error on physical re-runs, by the node the run was recorded on."""

    few_cores: float  # nodes of at most FEW_CORES_PER_RANK cores per rank
    many_cores: float  # nodes of more

    def on(self, per_rank: float | None) -> float:
        """The error for a node of ``per_rank`` cores per rank. A run that does not log its
        node's cores takes the larger: a band must not claim a precision measured only on
        nodes the run may not be like."""
        if per_rank is None:
            return max(self.few_cores, self.many_cores)
        return self.few_cores if _few(per_rank) else self.many_cores

    def words(self, per_rank: float | None) -> str:
        """Which re-runs ``on(per_rank)`` comes from, said after the error ("±10.7 %")."""
        if per_rank is None:
            side = _node_words(few=self.few_cores > self.many_cores)
            return f", as{side}: the run does not log its node's cores; dsim.instrument logs them"
        return _node_words(few=_few(per_rank))


def cores_per_rank(cores: int | None, ranks_on_node: int | None) -> float | None:
    """The recorded cores each rank's loader could use, when the run recorded its cores (the
    ranks on the node taken as 1 when not logged)."""
    if not cores or cores <= 0:
        return None
    return cores / max(int(ranks_on_node or 1), 1)


def node_kind(per_rank: float | None) -> str | None:
    """``"few_cores"``, ``"many_cores"`` or ``None`` (not logged): the JSON's name of a node."""
    if per_rank is None:
        return None
    return "few_cores" if _few(per_rank) else "many_cores"


def _few(per_rank: float) -> bool:
    return per_rank <= FEW_CORES_PER_RANK


def _node_words(*, few: bool) -> str:
    limit = f"{FEW_CORES_PER_RANK:g}"
    return f" on nodes with {'≤' if few else '>'} {limit} cores per rank"


#: Loader what-ifs (more workers, another prefetch): 599 cells of 40 sweeps, 551 of them on few-core
#: nodes (2 cores; 10.7 %, mean 4.0 %; 10.2 % over 515 before the thirty-fourth and thirty-fifth
#: held-out sweeps, the second's cpu 1 -> 2 and 1 -> 4 workers 13-17 % too fast (its 2- and 4-worker
#: runs measured slower than its 1-worker runs); 10.4 % over 497 before the thirty-third held-out
#: sweep, 4 ranks at 1-8 workers again; 10.5 % over 495 before the thirty-second, 10.4 % over 477
#: before the thirty-first, 2 ranks on 2 cores; 11.0 % over 450 before the thirtieth held-out sweep,
#: the first to re-run prefetch factors on loaders that cost CPU, the worst of 18 at 8.0 %; 11.3 %
#: over 414 before the twenty-eighth, validation/README.md) and 48 on many-core ones (16 cores, 4
#: sweeps; 25.5 %, mean 10.9 %). Pooled it was 13.7 % (2026-12-07; 13.9 % before a few busy
#: hand-overs counted where the time left explains them, which took the 16-core cpu regime's 4 -> 8
#: workers from +13 % to +1…+6 %: validation/README.md, "A few busy hand-overs"; 15.4 % over 444
#: cells of 31 sweeps before ranks bound in groups were replayed as CPU domains: "The twenty-seventh
#: held-out sweep"; 15.1 % over 408 cells of 29 sweeps before the two bound sweeps, whose pooled
#: CPUs put the loader what-ifs 9-10 % too fast: "The twenty-fifth held-out sweep"; 16.2 % over 388
#: cells before each batch's wait for a core scaled with its CPU and the cores' wall-clock bound:
#: "The twenty-third held-out sweep"; 15.3 % over 358 before the second 16-core sweep). A mean error
#: (4.4 % of one 2-core sweep, until 2026-11-28) made bands of about ±10 % where tune's predictions
#: missed the 16-core sweep's re-runs by up to 28 %.
LOADER_WHATIF_ERROR = NodeErrors(few_cores=0.107, many_cores=0.255)
#: Alignment what-ifs (fetch and start alignment): 246 cells of 24 sweeps, 236 on few-core nodes
#: (11.1 %, mean 4.3 %; 11.0 % over 224 before the thirty-second held-out sweep, 2 ranks on 2 cores
#: again, whose mixed fetch alignments at 2 workers came out 5-6 % too slow; 10.7 % over 212 before
#: the thirty-first, 2 ranks on 2 cores, whose mixed regime's fetch alignments at 2 workers came out
#: 15-17 % too slow; 10.7 % over 200 before the twenty-ninth held-out sweep, 10.6 % over 192 before
#: the twenty-eighth) and 10 on many-core ones (3 sweeps of 16 cores: 25.1 %, mean 10.9 %; the cpu
#: regime's fetch alignments at 1 worker, 15-27 % too fast on two of them). Pooled it was 12.4 %
#: (12.3 % before the contention's fixed point was found by interpolation; 10.6 % over 186 cells
#: before the 16-core sweeps of 2026-11-29, whose cpu regime's fetch alignments the model missed by
#: 13-33 % too slow before busy hand-overs waited for the batch being built, and by up to 17 % too
#: fast after: validation/README.md, "The twenty-first held-out sweep"). Most of the few-core error
#: is the re-runs' own spread: the same work's CPU time moves by ±12 % between runs on the 2-core VM
#: (validation/README.md, "The tenth held-out sweep").
ALIGN_WHATIF_ERROR = NodeErrors(few_cores=0.111, many_cores=0.251)

#: The effective-delay share of the same alignment cells, in percentage points: 11.1, where the mean
#: is 3.6 (pooled over every node: the 16-core sweeps' shares are near 0 and their errors small;
#: 10.5 before the thirty-second held-out sweep, 9.3 before the thirty-first, whose mixed regime's
#: fetch alignments missed by up to 45 points; 9.1 before the twenty-ninth, 9.3 before the
#: twenty-eighth; 9.4 before the twenty-fourth; 10.2 before each batch's wait for a core scaled with
#: its CPU, 2026-12-07; 10.5 before the 16-core sweeps of 2026-11-29; 12.4 before the busy worker's
#: hand-over by quantile, 2026-11-29, which took the mixed regime's align mean at 2 workers from
#: 10-16 points too low on 8 of 10 sweeps to -0.5 on average over 11; validation/README.md, "The
#: busy worker's spread").
ALIGN_SHARE_ERROR_PTS = 11.1
#: ... of the loader cells: 45.0 points (599 cells; 44.9 over 563; 44.5 over 545 and 543; 44.9 over
#: 525; 45.0 over 498 and over 480; 44.2 over 462; 44.5 over 444; 45.2 over 408; 45.3 over 388). A
#: loader change moves the fetches' overlap and the stalls' spread together, and the share, a count
#: of iterations over a 30 ms line, swings with both; the band says how little the predicted share
#: of a loader what-if pins down.
LOADER_SHARE_ERROR_PTS = 45.0
#: Fewer workers than the run had (a run with more predicting fewer: what ``dsim tune`` does from
#: every base run): 573 cells of 40 sweeps, 525 on few-core nodes (14.1 %, mean 4.7 %; 15.9 % over
#: 489 before the measured start-up's rows stopped being carried into a what-if's body, 2026-12-08,
#: which took the 8 -> 1 workers cells from +10.6 % too slow on average to +4.4 %:
#: validation/README.md, "The measured start-up in a what-if's body"; 16.1 % over 471 before the
#: thirty-third held-out sweep, and over 451 before the thirty-first; 16.2 % over 442 before the
#: thirtieth, 1 to 4 workers only; 16.1 % over 424 before the twenty-ninth, whose mixed and decode 8
#: -> 1 workers came out 16.1 and 16.5 % too slow; 16.3 % over 406 before the twenty-eighth) and 48
#: on many-core ones (18.3 %, mean 6.1 %; 17.0 % and 5.7 % before the start-up rule, which took the
#: 16-core sweeps' 8 -> 1 and 8 -> 2 cells 2-3 points further too fast). Pooled it was 16.6 % (16.4
#: % over 436 cells before CPU domains; 13.9 % over 400 cells before the two sweeps of ranks bound
#: two to a CPU, 2026-12-07, whose fewer-worker what-ifs came out 11-14 % too slow, pooled or as CPU
#: domains; 20.4 % over 380 cells before each batch's wait for a core scaled with its CPU,
#: 2026-12-07; 29.7 and 9.2 % before the workers' population scaled their stretch, 2026-11-29: a run
#: with 8 workers predicting 1 came out 20-34 % too slow on the 2-core sweeps; validation/README.md,
#: "The nineteenth held-out sweep" and "The twentieth"). Measured since 2026-11-29; until then these
#: what-ifs took the loader error above, measured only on more workers, and overstated how sure a
#: recommendation of fewer workers was (validation/README.md, "Fewer workers").
LOADER_FEWER_ERROR = NodeErrors(few_cores=0.141, many_cores=0.183)
#: ... their effective-delay share: 15.1 points (the same cells; the mean is 5.4; 14.2 before the
#: start-up's rows left the body, 2026-12-08; 13.6 before the thirty-third held-out sweep, 13.5
#: before the thirty-first; 13.8 before the twenty-ninth held-out sweep, 14.2 before the
#: twenty-eighth; 13.5 and 4.8 before CPU domains; 12.4 and 4.4 before the bound sweeps; 20.6 and
#: 5.6 before 2026-12-07; 17.7 and 5.4 with the square root of the population ratio, which fitted
#: the time less well).
LOADER_FEWER_SHARE_ERROR_PTS = 15.1


def loader_errors(fewer: bool, per_rank: float | None) -> tuple[float, float]:
    """(time error, share error in points) of a loader what-if: fewer workers than measured,
    or not (more workers, another prefetch factor), on a node of ``per_rank`` cores per rank
    (``None``: not logged)."""
    if fewer:
        return LOADER_FEWER_ERROR.on(per_rank), LOADER_FEWER_SHARE_ERROR_PTS
    return LOADER_WHATIF_ERROR.on(per_rank), LOADER_SHARE_ERROR_PTS


def speedup_band(low: float, high: float, error: float) -> tuple[float, float]:
    """A speed-up interval [low, high] widened by a relative error of the predicted time.

    The predicted iteration time t may be off by ±error, so t × (1 ∓ error): the speed-up
    s = before / t becomes s ÷ (1 ± error).
    """
    return low / (1.0 + error), (high / (1.0 - error) if error < 1.0 else float("inf"))


def share_band(share: float, points: float) -> tuple[float, float]:
    """A predicted effective-delay share ± the model's error in points, kept within 0-100 %."""
    return max(share - points, 0.0), min(share + points, 100.0)
