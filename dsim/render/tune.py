"""`dsim tune` in the terminal and as JSON: the recommendation first, then the curve.

The first lines answer the user's question in words (which settings, how
much faster, how sure, what it costs); the workers × prefetch table and the
reason the curve flattens follow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dsim.analysis.model_error import node_kind
from dsim.tuning import Band
from dsim.words import byte_size, counted

if TYPE_CHECKING:
    from dsim.app.tune import Choice, TuneResult
    from dsim.tuning import Point


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _band_ms(band: Band) -> str:
    return f"{_ms(band.value)} ({band.low * 1e3:.1f}–{band.high * 1e3:.1f})"


def _speed(band: Band) -> str:
    return f"{band.value:.2f}× ({band.low:.2f}–{band.high:.2f}×)"


def _setting(point: Point) -> str:
    if point.workers == 0:
        return "num_workers=0 (loading in the training process)"
    return f"num_workers={point.workers}, prefetch_factor={point.prefetch}"


_count = counted  # ``1 batch``, ``16 batches``, ``4 worker processes``


def cost_line(result: TuneResult, point: Point) -> str:
    """Worker processes per rank and on the node; batches queued in memory."""
    node = result.ranks_on_node
    if node is not None:
        procs = (
            f"{_count(point.workers, 'worker process')} per rank, "
            f"{point.workers * node} on the node"
        )
    else:
        procs = (
            f"{_count(point.workers, 'worker process')} per rank "
            f"({point.workers * result.ranks} if all {_count(result.ranks, 'rank')} share one node)"
        )
    return f"  costs: {procs}; {memory_text(result, point)}"


def memory_text(result: TuneResult, point: Point) -> str:
    """The batches held ahead of the loop (workers × prefetch per rank) and their bytes.

    The bytes come from the loader lines' ``batch_bytes`` (``run.json``
    ``loader.batch_bytes``, the largest logged); without it the cost is
    unknown and the line says so rather than guess.
    """
    queued = point.workers * point.prefetch
    batches = f"{_count(queued, 'queued batch')}"
    if result.batch_bytes is None:
        return f"pinned memory: unknown ({batches} per rank; the logs carry no batch size in bytes)"
    per_rank = queued * result.batch_bytes
    node = (
        ""
        if result.ranks_on_node is None
        else f", {byte_size(per_rank * result.ranks_on_node)} on the node"
    )
    return (
        f"pinned memory: {byte_size(per_rank)} per rank{node} "
        f"({batches} × {byte_size(result.batch_bytes)})"
    )


def band_origin(choice: Choice, *, short: bool = False) -> str:
    """How the band was widened: by the error of the kind of what-if the choice is.

    The recorded settings without alignment are the measured run (no model
    error to add); the same settings aligned are an alignment what-if, whose
    re-runs missed less than the loader what-ifs'.
    """
    if choice.error_kind == "none":
        if short:
            return ", the recorded settings: no model error added"
        return " (the recorded settings: the model reproduces the run, no model error added)"
    if short:
        return f", its band widened by the {choice.error_kind} error (±{choice.model_error:.1%})"
    return (
        f", widened by the pipeline model's {choice.error_kind} error on re-runs "
        f"(±{choice.model_error:.1%}: its 95th percentile{choice.error_words}; FIDELITY.md)"
    )


#: Said under a recommendation that costs more than the recorded run and whose speed-up
#: band reaches 1.00× (``Choice.within_error``, SPEC §5.7).
WITHIN_ERROR = (
    "within the model's error of the recorded settings: its band reaches 1.00×, so it may "
    "be no faster; re-run with it before keeping the extra cost"
)


def recommendation_lines(result: TuneResult) -> list[str]:
    """The answer in words: settings, speed-up with its band, stall, cost."""
    choice = result.loader_only
    m = result.measured
    lines = [
        f"{result.run}: use {_setting(choice.point)} "
        f"(recorded: {_count(m.workers, 'worker')}, prefetch {m.prefetch_factor})",
        f"  predicted iteration {_band_ms(choice.bands['iteration_s'])}, "
        f"stall {_band_ms(choice.bands['stall_s'])}, "
        f"{_speed(choice.bands['speedup'])} vs the recorded "
        f"{_ms(result.baseline.mean_iteration_s)}",
        f"  95 % band: bootstrap over {_count(result.iterations, 'iteration')}"
        f"{band_origin(choice)}",
    ]
    if choice.within_error:
        lines.append(f"  {WITHIN_ERROR}")
    lines += [
        cost_line(result, choice.point),
        f"  {choice.flat.text}",
    ]
    combined = result.with_alignment
    if combined is not None:
        label = f"{result.alignment[0]}/{result.alignment[1]}"
        lines.append(
            f"  with aligned loaders ({label}) as well: {_setting(combined.point)}, "
            f"{_speed(combined.bands['speedup'])}{band_origin(combined, short=True)}"
            + ("; within the model's error of the recorded run" if combined.within_error else "")
        )
    lines += [f"  caveat: {c}" for c in result.caveats]
    return lines


def curve_table(points: list[Point], baseline: Point, recommended: Point) -> list[str]:
    """Workers (rows) × prefetch (columns): predicted iteration ms and speed-up."""
    workers = sorted({p.workers for p in points})
    prefetch = sorted({p.prefetch for p in points})
    cell = {(p.workers, p.prefetch): p for p in points}
    head = "workers " + "".join(f"{'prefetch ' + str(q):>20}" for q in prefetch)
    lines = [head]
    for w in workers:
        row = f"{w:>7} "
        for q in prefetch:
            p = cell.get((w, q))
            if p is None:
                row += f"{'':>20}"
                continue
            mark = "*" if p is recommended else " "
            speed = baseline.mean_iteration_s / p.mean_iteration_s
            row += f"{p.mean_iteration_s * 1e3:8.1f} ms {speed:5.2f}×{mark}".rjust(20)
        lines.append(row)
    return lines


def lines(result: TuneResult) -> list[str]:
    """Everything `dsim tune` prints for one run."""
    out = recommendation_lines(result)
    out += ["", "predicted iteration time and speed-up, loader alone (* recommended):"]
    out += curve_table(result.alone, result.baseline, result.loader_only.point)
    if result.with_alignment is not None:
        label = f"{result.alignment[0]}/{result.alignment[1]}"
        out += ["", f"with aligned loaders ({label}):"]
        out += curve_table(result.combined, result.baseline, result.with_alignment.point)
    return out


def _band_doc(band: Band) -> dict[str, float]:
    return {"value": band.value, "low": band.low, "high": band.high}


def _choice_doc(result: TuneResult, choice: Choice) -> dict[str, Any]:
    p = choice.point
    return {
        "workers": p.workers,
        "prefetch_factor": p.prefetch,
        "policy": f"{p.policy[0]}/{p.policy[1]}",
        "iteration_s": _band_doc(choice.bands["iteration_s"]),
        "stall_s": _band_doc(choice.bands["stall_s"]),
        "speedup": _band_doc(choice.bands["speedup"]),
        "worker_processes_per_rank": p.workers,
        "worker_processes_on_node": (
            None if result.ranks_on_node is None else p.workers * result.ranks_on_node
        ),
        "queued_batches_per_rank": p.workers * p.prefetch,
        "queued_bytes_per_rank": (
            None if result.batch_bytes is None else p.workers * p.prefetch * result.batch_bytes
        ),
        "flattens_at_workers": choice.flat.workers,
        "flattening_reason": choice.flat.reason,
        "flattening": choice.flat.text,
        "model_error": choice.model_error,
        "model_error_kind": choice.error_kind,
        "model_error_node": node_kind(choice.cores_per_rank) if choice.model_error else None,
        "within_error": choice.within_error,
    }


def document(result: TuneResult) -> dict[str, Any]:
    """One run's ``--json`` object (docs/SPEC.md §5.7)."""
    base = result.baseline.mean_iteration_s

    def grid(points: list[Point]) -> list[dict[str, Any]]:
        return [
            {
                "workers": p.workers,
                "prefetch_factor": p.prefetch,
                "iteration_s": p.mean_iteration_s,
                "stall_s": p.mean_stall_s,
                "speedup": base / p.mean_iteration_s,
            }
            for p in points
        ]

    return {
        "run": result.run,
        "model": "pipeline",
        "measured": result.measured.document(),
        "baseline_iteration_s": base,
        "iterations": result.iterations,
        "ranks": result.ranks,
        "cores": result.cores,
        "ranks_on_node": result.ranks_on_node,
        "batch_bytes": result.batch_bytes,
        "model_error": result.loader_only.model_error,
        "recommendation": _choice_doc(result, result.loader_only),
        "alignment": f"{result.alignment[0]}/{result.alignment[1]}",
        "with_alignment": (
            None if result.with_alignment is None else _choice_doc(result, result.with_alignment)
        ),
        "grid": grid(result.alone),
        "grid_with_alignment": grid(result.combined),
        "caveats": list(result.caveats),
        "files": [str(f) for f in result.files],
    }
