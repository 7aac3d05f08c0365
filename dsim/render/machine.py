"""The ``--json`` document of ``dsim run`` and ``dsim summarize`` (docs/SPEC.md §5.6).

One JSON object on stdout, nothing else, so that ``jq`` and scripts read it:
``format_version``, ``dsim_version``, ``summary`` (the summary rows, the
same records as ``summary.json``), ``verdicts`` (one per run and results
directory, ``dsim.analysis.verdict.Verdict`` fields) and ``checks`` (the ``--fail-if``
conditions evaluated per run). JSON has no NaN or infinity: such numbers are
written as null, and ``json.dumps(allow_nan=False)`` guarantees that no
other one slips through.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from dsim.analysis.checks import CheckResult
    from dsim.analysis.comparison import Comparison
    from dsim.analysis.verdict import Verdict
    from dsim.app.answer import Answer
    from dsim.model.runinfo import RunInfo

#: Version of the document's layout; a change of meaning adds a key or bumps it.
MACHINE_FORMAT_VERSION = 1


def plain(value: Any) -> Any:
    """JSON has no NaN or infinity: undefined or unbounded numbers become null."""
    if hasattr(value, "item") and not isinstance(value, list | dict | str):  # NumPy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is not None and not isinstance(value, bool | int | float | str | list | dict):
        try:  # pandas' missing values (NA, NaT)
            import pandas as pd

            if pd.isna(value):
                return None
        except (TypeError, ValueError):
            pass
    return value


def summary_records(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """The summary's rows as JSON-ready records (NaN → null)."""
    return [
        {str(key): plain(value) for key, value in row.items()}
        for row in summary.to_dict(orient="records")
    ]


def document(
    summary: pd.DataFrame,
    verdicts: Sequence[Verdict],
    checks: Sequence[CheckResult] = (),
) -> dict[str, Any]:
    """The ``--json`` document (see the module docstring and docs/SPEC.md §5.6)."""
    from dsim import __version__

    return {
        "format_version": MACHINE_FORMAT_VERSION,
        "dsim_version": __version__,
        "summary": summary_records(summary),
        "verdicts": [{k: plain(v) for k, v in v.as_dict().items()} for v in verdicts],
        "checks": [{k: plain(v) for k, v in asdict(c).items()} for c in checks],
    }


#: What the answer says about a row's run, appended to the summary's columns in every table
#: rendered from an answer (summary files, ``--json``'s ``summary``, MLflow's artifacts).
ANSWER_COLUMNS = ("best", "verdict", "attribution")
#: Between a run's attribution lines in one cell: a CSV row stays one line of text
#: (``wc -l``, ``grep``), and no attribution line holds it.
LINE_SEPARATOR = " | "


def answer_table(answer: Answer) -> pd.DataFrame:
    """The answer's summary rows with ``ANSWER_COLUMNS`` after the §5 columns (docs/SPEC.md
    §5 "One answer"): ``best`` is true on the row of the run's best policy where the
    terminal marks it (the tie rule's, when its speed-up is above 1.0005; the overview's
    ``best``), ``verdict`` the run's verdict sentence (§5.1; empty without one) and
    ``attribution`` its attribution lines (§5.2), joined by ``LINE_SEPARATOR`` (empty
    without any).
    A spreadsheet of the file then says what the terminal says, without recomputing it."""
    table = answer.summary.copy()
    said: dict[tuple[str, str], tuple[str | None, str | None, str | None]] = {}
    for run, overview in zip(answer.runs, answer.overview, strict=True):
        verdict = run.verdict.text if run.verdict is not None else None
        lines = LINE_SEPARATOR.join(run.attribution) or None
        said[(run.run, run.results)] = (overview.best, verdict, lines)
    results = table["results"] if "results" in table else [None] * len(table)
    keys = [(str(r), str(d)) for r, d in zip(table.get("run", []), results, strict=True)]
    policies = [
        f"{f}/{s}"
        for f, s in zip(table.get("fetch_align", []), table.get("start_align", []), strict=True)
    ]
    empty = (None, None, None)
    table["best"] = [said.get(k, empty)[0] == p for k, p in zip(keys, policies, strict=True)]
    table["verdict"] = [said.get(k, empty)[1] for k in keys]
    table["attribution"] = [said.get(k, empty)[2] for k in keys]
    table["best"] = table["best"].astype(bool)
    for column in ("verdict", "attribution"):
        table[column] = table[column].astype(object)
    return table


def answer_document(answer: Answer) -> dict[str, Any]:
    """The ``--json`` document of an ``Answer`` (docs/SPEC.md §5.6): ``document``'s keys (its
    ``summary`` the answer's table, ``answer_table``), and
    ``runs`` (per run: the tie rule's best policy, attribution lines, notes, provenance),
    ``overview`` (one row per run) and ``notes`` (what was skipped or ignored, and why)."""
    doc = document(answer_table(answer), answer.verdicts, answer.checks)
    doc["runs"] = [
        {
            "run": r.run,
            "results": r.results,
            "model": r.model,
            "best_fetch_align": None if r.best is None else r.best[0],
            "best_start_align": None if r.best is None else r.best[1],
            "attribution": list(r.attribution),
            "notes": list(r.notes),
            "provenance": _plain_tree(r.provenance),
        }
        for r in answer.runs
    ]
    doc["overview"] = [{k: plain(v) for k, v in asdict(o).items()} for o in answer.overview]
    doc["notes"] = list(answer.notes)
    return doc


def _plain_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_tree(v) for v in value]
    return plain(value)


def dumps(doc: Any) -> str:
    """Indented JSON; raises ``ValueError`` rather than write NaN or infinity."""
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def parse_record(directory: str, info: RunInfo) -> dict[str, Any]:
    """One parsed run in ``dsim parse --json`` (docs/SPEC.md §5.6): what was read, kept,
    skipped and written, and the warnings the terminal prints (``info``: its ``RunInfo``)."""
    report = dict(info.report)
    kineto = info.input_format == "kineto"
    files = sorted({*(info.files or {}), "run.json"})
    return {
        "run": info.name,
        "directory": directory,
        "format": info.input_format or "rawlog",
        "gpus": info.gpu_count,
        "epochs": list(info.epochs_present),
        "iterations_per_epoch": {str(k): int(v) for k, v in info.iterations_per_epoch.items()},
        "read": int(report.get("events" if kineto else "lines", 0) or 0),
        "read_unit": "trace events" if kineto else "lines",
        "fetch_records": int(report.get("fetch_records", 0) or 0),
        "train_records": int(report.get("train_records", 0) or 0),
        "rejected": int(report.get("rejected", 0) or 0),
        "skipped": {str(k): int(v) for k, v in (report.get("skipped") or {}).items()},
        "incomplete_iterations": int((report.get("incomplete_iterations") or {}).get("count", 0)),
        "warnings": [str(w) for w in report.get("warnings", [])],
        "inconsistent": [str(p) for p in info.inconsistent],
        "files": [f"{directory}/{name}" for name in files],
    }


def parse_document(records: Sequence[dict[str, Any]], errors: Sequence[str]) -> dict[str, Any]:
    """``dsim parse --json``: one record per run written, and the runs that failed."""
    from dsim import __version__

    return {
        "format_version": MACHINE_FORMAT_VERSION,
        "dsim_version": __version__,
        "runs": list(records),
        "errors": list(errors),
    }


def compare_document(comparison: Comparison) -> dict[str, Any]:
    """``dsim compare --json`` (and ``--format json``): the comparison's flat record with
    ``warnings`` as a list (docs/SPEC.md §5.3, §5.6)."""
    from dsim import __version__

    record = {k: plain(v) for k, v in comparison.record().items()}
    record["warnings"] = list(comparison.warnings)
    return {"format_version": MACHINE_FORMAT_VERSION, "dsim_version": __version__, **record}
