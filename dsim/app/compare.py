"""``dsim compare`` as a library call: one run found on each side, summarised, compared.

The command (``dsim.commands.compare``) and the Python API (``dsim.compare``)
both call ``compare_runs``, so that they read the same runs under the same
lock and give the same answer (docs/SPEC.md §5.3).
"""

from __future__ import annotations

from pathlib import Path

from dsim.analysis.comparison import Comparison, compare
from dsim.analysis.summary import summarize_results
from dsim.app.compareside import check_side
from dsim.errors import UsageError
from dsim.io import lock
from dsim.model.results import ResultRun, results_directories, scan_results
from dsim.replay.policies import Policy


def one_run(path: Path, side: str) -> ResultRun:
    """The one run a side names: a run directory, or a results directory holding one run."""
    check_side(path, side)
    runs = scan_results([path]).runs
    if len(runs) != 1:
        # directory names: a run and its model variants (RUN, RUN@pipeline) share a name
        names = ", ".join(r.directory.name for r in runs[:5]) + (" …" if len(runs) > 5 else "")
        example = f", e.g. {runs[0].directory}" if runs else ""
        raise UsageError(
            f"{side} {path} holds {len(runs)} runs ({names}); name one run directory{example}"
        )
    return runs[0]


def compare_runs(before: Path, after: Path, policy: Policy | None = None) -> Comparison:
    """BEFORE and AFTER (each with its recorded selection) compared under ``policy``
    (default: BEFORE's best); a side without the rows to compare is a usage error."""
    with lock.shared(results_directories([before, after])):
        sides = [one_run(Path(p), s) for p, s in ((before, "BEFORE"), (after, "AFTER"))]
        rows = [summarize_results([run]).to_dict("records") for run in sides]
    try:
        result = compare(rows[0], rows[1], policy)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if sides[0].directory.resolve() == sides[1].directory.resolve():
        result.warnings.append(
            f"BEFORE and AFTER are the same run directory ({sides[0].directory}): "
            "every change is zero; name the run before the change and the run after it"
        )
    return result
