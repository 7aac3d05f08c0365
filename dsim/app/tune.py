"""`dsim tune` as a library call: one parsed run → its loader sweep and recommendation.

Reads the trace, selects iterations as ``dsim run`` does (§5), calibrates the
pipeline model once and replays the grid through the model's public entry
points (``dsim.tuning``), alone and under the best alignment; writes the tidy
table ``<out>/tune/<run>.{parquet,csv}`` atomically. Nothing is printed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dsim.analysis.model_error import (
    ALIGN_WHATIF_ERROR,
    LOADER_FEWER_ERROR,
    LOADER_WHATIF_ERROR,
    NodeErrors,
    cores_per_rank,
)
from dsim.analysis.summary import DEFAULT_WARMUP, selected_iterations
from dsim.analysis.verdict import cores_caveat, cpu_is_aware, cpu_over_cores_note
from dsim.errors import InputError, OutputError
from dsim.io import memory
from dsim.io.memory import release_freed
from dsim.model.runinfo import RUN_FILE
from dsim.model.tables import read_run
from dsim.replay.arrays import IterationArrays, TableColumns, build_iteration_arrays
from dsim.replay.models import get_model
from dsim.replay.models.pipeline import SUPPORTED, check_stream_workers, measured_loader
from dsim.replay.params import LoaderSettings, ReplayParams
from dsim.replay.policies import KNOWN
from dsim.tuning import (
    DEFAULT_PREFETCH,
    Band,
    Flattening,
    Point,
    bands,
    cheapest_near_best,
    default_workers,
    flattening,
    sweep,
)
from dsim.words import counted

ACTUAL = ("actual", "actual")
#: Fewer selected iterations than this make a stated speed-up too uncertain to show bare.
FEW_ITERATIONS = 30
TUNE_DIR = "tune"


@dataclass(frozen=True)
class Choice:
    """A recommended setting under one alignment, with its bands and flattening."""

    point: Point
    bands: dict[str, Band]
    flat: Flattening
    #: The relative error the bands are widened by, and which what-if's it is (SPEC §5.7).
    model_error: float
    error_kind: str
    #: A change that costs something (``is_a_cost``) whose speed-up band reaches 1.00×.
    within_error: bool = False
    #: The recorded node's cores per rank, which chose ``model_error`` (``None``: not logged),
    #: and on which nodes that error was measured, in words (``NodeErrors.words``).
    cores_per_rank: float | None = None
    error_words: str = ""


@dataclass(frozen=True)
class TuneResult:
    """Everything `dsim tune` reports about one run."""

    run: str
    measured: LoaderSettings
    baseline: Point
    alone: list[Point]
    alignment: tuple[str, str]
    combined: list[Point]
    loader_only: Choice
    with_alignment: Choice | None
    iterations: int
    ranks: int
    cores: int | None
    ranks_on_node: int | None
    batch_bytes: int | None
    caveats: list[str]
    files: tuple[Path, ...] = ()

    def __repr__(self) -> str:
        """The recommendation's first line and where the table went, not every grid point."""
        from dsim.render.tune import recommendation_lines

        where = f"; in {self.files[0].parent}" if self.files else ""
        return f"TuneResult({recommendation_lines(self)[0]}{where})"

    def _repr_html_(self) -> str:
        """In a notebook: what ``dsim tune`` prints (recommendation and tables), escaped."""
        from dsim.render.notebook import text_html
        from dsim.render.tune import lines

        return text_html(repr(self), lines(self))


def _positive_int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _node_facts(loader: Any) -> tuple[int | None, int | None, int | None]:
    """Cores, ranks per node and batch bytes, as run.json's loader block recorded them."""
    if not isinstance(loader, dict):
        return None, None, None
    return (
        _positive_int(loader.get("cores")),
        _positive_int(loader.get("local_world_size")),
        _positive_int(loader.get("batch_bytes")),
    )


def fetch_arrays(run_dir: Path, name: str) -> IterationArrays:
    """A run's arrays with its logged loader settings; exit 3 without fetch records."""
    from dsim.app.runplan import UNREAD, logged_loader

    tables = read_run(run_dir, UNREAD)
    if tables.fetch.num_rows == 0:
        raise InputError(
            f"run {name} has no fetch records (profiler traces?): dsim tune replays the "
            "DataLoader's fetches, which only dsim.instrument's fetch lines record",
            run_dir,
        )
    # the tables' columns handed to the build, which frees each once placed (no two whole
    # copies of the run); row-major: the pipeline model's inputs take the matrices as they
    # are (no copy)
    info = tables.info
    fetch = TableColumns.of(tables.fetch, "fetch")
    train = TableColumns.of(tables.train, "training")
    del tables
    size = train.num_rows
    arrays = build_iteration_arrays(fetch, train, order="C", release=memory.releaser(size))
    del fetch, train
    if memory.worth_releasing(size):
        release_freed()  # the tables' memory, before the pipeline model's arrays are made
    if arrays.n_iterations == 0:
        raise InputError(f"run {name}: no iteration has every rank's fetch and train record")
    return replace(arrays, loader=logged_loader(info, run_dir / RUN_FILE))


def _best_alignment(model: Any, prepared: Any, mask: np.ndarray, base: ReplayParams) -> tuple:
    """The alignment with the shortest predicted iteration at the measured loader settings."""
    scores = {}
    both_sides = [name for name in SUPPORTED if name in KNOWN]  # `max` is start-only, a barrier
    for fetch in both_sides:
        for start in both_sides:
            if (fetch, start) == ACTUAL:
                continue
            out = model.replay(prepared, (fetch, start), base)
            scores[(fetch, start)] = float(np.asarray(out.iteration_s)[mask].mean())
    # Ties (equal within 1e-12 s) go to the simpler policy: fewer aligned sides, as verdicts do.
    return min(scores, key=lambda p: (round(scores[p], 12), sum(s != "actual" for s in p), p))


def tune_run(
    run_dir: Path,
    *,
    workers: Sequence[int] | None = None,
    prefetch: Sequence[int] | None = None,
    epochs: Sequence[int] | str | None = None,
    warmup: int | None = None,
    alignment: bool = True,
    out: Path | None = None,
) -> TuneResult:
    """Sweep one run's loader settings; write ``<out>/tune/<run>.{parquet,csv}`` if ``out``."""
    from dsim.model.tables import read_info

    info = read_info(run_dir)
    name = info.name or run_dir.name
    arrays = fetch_arrays(run_dir, name)
    _, mask = selected_iterations(
        arrays.epoch, arrays.iteration, epochs, DEFAULT_WARMUP if warmup is None else warmup, name
    )
    cores, ranks_on_node, batch_bytes = _node_facts(info.loader)
    grid_w = tuple(workers) if workers else default_workers(cores_per_rank(cores, ranks_on_node))
    grid_p = tuple(prefetch) if prefetch else DEFAULT_PREFETCH
    measured = measured_loader(arrays)
    if arrays.stream:  # an IterableDataset's run: only the prefetch factor can be swept (§4.2)
        for asked in workers or ():
            check_stream_workers(arrays, asked, name)
        grid_w = (measured.workers,)

    model = get_model("pipeline")
    base = ReplayParams()
    prepared = model.prepare(arrays, base)
    [baseline] = sweep(
        model, prepared, mask, [measured.workers], [measured.prefetch_factor], ACTUAL, base
    )
    alone = sweep(model, prepared, mask, grid_w, grid_p, ACTUAL, base)
    ranks = [int(g) for g in arrays.gpus]
    saturated = cpu_saturated_at(prepared, grid_w, measured.prefetch_factor)
    node = cores_per_rank(cores, ranks_on_node)
    unknown = unknown_hand_over(prepared) is not None
    loader_only = _choice(baseline, alone, ranks, measured, node, saturated, unknown)
    policy = _best_alignment(model, prepared, mask, base) if alignment else ACTUAL
    combined = sweep(model, prepared, mask, grid_w, grid_p, policy, base) if alignment else []
    with_alignment = (
        _choice(baseline, combined, ranks, measured, node, saturated, unknown) if combined else None
    )
    n = int(mask.sum())
    result = TuneResult(
        name, measured, baseline, alone, policy, combined, loader_only, with_alignment,
        n, arrays.n_gpus, cores, ranks_on_node, batch_bytes,
        caveats(
            n, loader_only.point.workers, cores, ranks_on_node, arrays.n_gpus, measured,
            cpu_aware=getattr(prepared, "cpu", None) is not None,
        )
        + ([STREAM_CAVEAT] if arrays.stream else [])
        + [note for note in [busy_hand_over_note(prepared)] if note]
        + _cpu_over_cores(arrays),
    )  # fmt: skip
    if out is not None:
        result = replace(result, files=write_table(result, out))
    return result


#: The cores' busy share on the wall clock (``Solution.busy``) from which the CPU-aware model
#: calls them saturated.
SATURATED_DEMAND = 0.9


def cpu_saturated_at(prepared: Any, workers: Sequence[int], prefetch: int) -> int | None:
    """The fewest workers at which the CPU-aware pipeline model finds the node's cores saturated.

    ``None`` when the run carries no CPU times (the model then assumes fetch
    durations independent of load, so it cannot say) or no setting saturates.
    """
    from dsim.replay.models.pipeline import solve_contention

    if getattr(prepared, "cpu", None) is None:
        return None
    for w in sorted(x for x in set(workers) if x > 0):
        if solve_contention(prepared, ACTUAL, w, prefetch).busy >= SATURATED_DEMAND:
            return w
    return None


def _choice(
    baseline: Point,
    points: list[Point],
    ranks: list[int],
    measured: LoaderSettings,
    per_rank: float | None,
    saturated: int | None = None,
    hand_over_unknown: bool = False,
) -> Choice:
    chosen = cheapest_near_best(points)
    flat = flattening(
        points, ranks=ranks, cpu_saturated_at=saturated, hand_over_unknown=hand_over_unknown
    )
    errors, kind = model_error_of(chosen, measured)
    error = 0.0 if errors is None else errors.on(per_rank)
    band = bands(baseline, chosen, error)
    uncertain = is_a_cost(chosen, measured) and band["speedup"].low <= 1.0
    words = "" if errors is None else errors.words(per_rank)
    return Choice(chosen, band, flat, error, kind, uncertain, per_rank, words)


def is_a_cost(point: Point, measured: LoaderSettings) -> bool:
    """Whether ``point`` asks the user for more than the recorded run did.

    Why: a recommendation that costs something (more worker processes, more
    batches held ahead, or a loader change to make for alignment) is only worth
    making if it is faster; one whose speed-up band reaches 1.00× may not be
    (on held-out 11's and 13's cpu regimes tune's 2 workers measured 7 % slower
    than the recorded 1, within a band of 0.85-1.34×). A cheaper setting at
    about the same predicted speed is the point of the 2 % rule, so its band
    spanning 1.00× says nothing against it.
    """
    if point.workers != measured.workers:
        return point.workers > measured.workers
    if point.workers > 0 and point.prefetch != measured.prefetch_factor:
        return point.prefetch > measured.prefetch_factor
    return tuple(point.policy) != ACTUAL


def model_error_of(point: Point, measured: LoaderSettings) -> tuple[NodeErrors | None, str]:
    """The validated error of the what-if that ``point`` is, and its kind.

    Why per point: at the recorded settings the aligned sweep's point is an
    alignment what-if alone, whose re-runs missed less (``ALIGN_WHATIF_ERROR``)
    than the loader what-ifs' (``LOADER_WHATIF_ERROR``); widening it by the
    loader's error overstated its uncertainty. The recorded settings without
    alignment are the measured run itself (identity: no model error). A loader
    change combined with alignment has no re-runs of its own and takes the larger,
    the loader's. Fewer workers than recorded take the error measured on such
    what-ifs (``LOADER_FEWER_ERROR``): the loader error was measured on more
    workers only. Without workers the prefetch factor does not apply: any prefetch
    at 0 recorded workers is the recorded setting. Each error is kept by the kind of
    node it was measured on (``NodeErrors.on`` picks the recorded one's).
    """
    same = point.workers == measured.workers and (
        point.workers == 0 or point.prefetch == measured.prefetch_factor
    )
    if same and tuple(point.policy) == ACTUAL:
        return None, "none"
    if same:
        return ALIGN_WHATIF_ERROR, "alignment"
    if point.workers < measured.workers:
        return LOADER_FEWER_ERROR, "fewer-workers"
    return LOADER_WHATIF_ERROR, "loader"


#: Why ``dsim tune`` swept one worker count (SPEC §4.2, §5.7).
STREAM_CAVEAT = (
    "the run read an IterableDataset: each worker streamed its own shard and no sampler "
    "maps batches to workers, so only the prefetch factor was swept, at the measured "
    "worker count"
)


def busy_hand_over_note(prepared: Any) -> str | None:
    """The busy worker's hand-over, in words, where the calibration found one (SPEC §4.2).

    Why: it is what lets more workers help in such a run, the user can act on
    its cause (Python code in the dataset that holds the GIL), and the model
    learned it from two 16-core sweeps: the recommendation leans on it.
    """
    c = getattr(prepared, "calibration", None)
    extra = None if c is None else getattr(c, "busy_excess", None)
    if extra is None or c.busy is None:
        return None
    if not np.any(extra > 0):
        unknown = unknown_hand_over(prepared)
        return None if unknown is None else _always_busy_note(*unknown)
    rows = extra > 0
    busy = float(np.mean(c.busy[rows]))
    slope = getattr(c, "busy_slope", None)
    waits = slope is not None and bool(np.any(slope > 0))
    how = ", as long as that batch still took" if waits else ""
    return (
        f"batches built ahead waited {float(np.mean(extra[rows])) * 1e3:.1f} ms longer to reach "
        f"the loop when their worker was busy building its next one ({busy:.0%} of batches; "
        f"{float(np.mean(c.idle_hand[rows])) * 1e3:.1f} ms when it was idle){how}: typical of "
        "Python code in the dataset that holds the GIL; the replay lets more workers, idle "
        "more often, shorten it (measured against the re-runs of two 16-core sweeps, "
        "validation/README.md)"
    )


#: Share of built batches whose worker was busy from which the idle hand-over is unknowable.
ALWAYS_BUSY = 0.9


def unknown_hand_over(prepared: Any) -> tuple[float, float] | None:
    """Where the calibration found no busy extra but nearly every built batch had a busy
    worker: the share of such batches and their mean wait (s); else ``None``.

    Why: with no idle hand-over to compare with, the calibration's extra is 0, so more
    workers are predicted not to shorten the wait: a 1-rank cpu run (99 % busy)
    recommended 1 worker where 8 measured 35 % faster (validation/README.md, "A
    held-out check of the busy hand-over"). Both the caveat and the curve's knee
    (``dsim.tuning.flattening``) then say that the gain is not known.
    """
    from dsim.replay.models.pipeline import ready_batches

    c = getattr(prepared, "calibration", None)
    extra = None if c is None else getattr(c, "busy_excess", None)
    if extra is None or c.busy is None or np.any(extra > 0) or c.workers == 0:
        return None
    ready = ready_batches(prepared)
    if ready.sum() < 10:
        return None
    share = float(np.mean(c.busy[ready] > 0))
    if share < ALWAYS_BUSY:
        return None
    return share, float(np.mean(prepared.inputs.stall[ready]))


def _always_busy_note(share: float, wait_s: float) -> str:
    return (
        f"{share:.0%} of the batches built ahead reached the loop while their worker was busy "
        f"building its next one, after {wait_s * 1e3:.1f} ms on average: with no idle worker "
        "to compare, the replay cannot tell how much of that wait more workers would remove "
        "(Python code in the dataset that holds the GIL makes it long), so its gain from more "
        "workers may be too small"
    )


def _cpu_over_cores(arrays: Any) -> list[str]:
    """The caveat of a run whose logged CPU times exceed its logged cores (SPEC §4.2)."""
    from dsim.replay.models.pipeline import cpu_assumption

    cpu = cpu_assumption(arrays)
    return [] if cpu is None or cpu_is_aware(cpu) else [cpu_over_cores_note(cpu)]


def caveats(
    n: int,
    workers: int,
    cores: int | None,
    ranks_on_node: int | None,
    ranks: int,
    measured: LoaderSettings,
    *,
    cpu_aware: bool = False,
) -> list[str]:
    """What limits how far the recommendation can be trusted, in words.

    ``cpu_aware``: the run logged CPU times, so the model shares the cores
    between the processes it replays (SPEC §4.2); the caveat on more worker
    processes than cores then says what it still misses instead of that it
    does not know the cores.
    """
    notes = []
    if n < FEW_ITERATIONS:
        notes.append(
            f"only {counted(n, 'iteration')} selected (fewer than {FEW_ITERATIONS}): read the "
            "interval, "
            "not the number"
        )
    note = (
        None if cores is None else cores_caveat(workers, ranks_on_node or ranks, cores, cpu_aware)
    )
    if note is not None:
        notes.append(note)
    if measured.source == "log+ids":
        notes.append(
            "the run's LOADER lines say fewer workers than its fetch lines come from: taken as "
            f"{counted(measured.workers, 'worker')} (from worker ids)"
        )
    if measured.source == "implied":
        notes.append(
            "the run's loader settings were not logged: taken as "
            f"{counted(measured.workers, 'worker')} (from worker ids) and prefetch "
            f"{measured.prefetch_factor} (PyTorch's default)"
        )
    return notes


def table(result: TuneResult) -> Any:
    """The tidy table: one row per (alignment, workers, prefetch) with predictions."""
    import pyarrow as pa

    base = result.baseline.mean_iteration_s
    rows: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
    for points, choice in (
        (result.alone, result.loader_only),
        (result.combined, result.with_alignment),
    ):
        for p in points:
            rows["run"].append(result.run)
            rows["policy"].append(f"{p.policy[0]}/{p.policy[1]}")
            rows["workers"].append(p.workers)
            rows["prefetch_factor"].append(p.prefetch)
            rows["iteration_ms"].append(p.mean_iteration_s * 1e3)
            rows["stall_ms"].append(p.mean_stall_s * 1e3)
            rows["speedup"].append(base / p.mean_iteration_s)
            rows["recommended"].append(choice is not None and p is choice.point)
            rows["measured_setting"].append(
                (p.workers, p.prefetch)
                == (result.measured.workers, result.measured.prefetch_factor)
            )
    return pa.table(rows)


_COLUMNS = (
    "run", "policy", "workers", "prefetch_factor", "iteration_ms", "stall_ms", "speedup",
    "recommended", "measured_setting",
)  # fmt: skip


def write_table(result: TuneResult, out: Path) -> tuple[Path, ...]:
    """``<out>/tune/<run>.parquet`` and ``.csv``, each written atomically."""
    from dsim.io.atomic import write_parquet, write_text

    data = table(result)
    target = Path(out) / TUNE_DIR
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {target}: {exc.strerror or exc}") from exc
    parquet, csv = target / f"{result.run}.parquet", target / f"{result.run}.csv"
    write_parquet(data, parquet)
    write_text(data.to_pandas().to_csv(index=False, float_format="%.6g"), csv)
    return parquet, csv
