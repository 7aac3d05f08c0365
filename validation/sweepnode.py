"""The committed comparisons, each with the node its sweep ran on (cores per rank).

Why: the pipeline model's error on re-runs differs between nodes with a core
or two per rank and nodes with many (``dsim.analysis.model_error.NodeErrors``),
so the bands' percentiles are taken per kind of node. A sweep's node is in
every run's ``job.json`` (``cores_available`` over ``local_world_size``); the
first sweep's runs predate those keys, and its FIDELITY.md's machine line
("…, 2 cores, …") says the cores instead, its ``ranks`` the ranks.

``validation/fidelity.csv`` is the comparison of ``validation/data-cpu/``
(FIDELITY.md's), the others sit in their sweep's directory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent
#: The sweep whose comparison is validation/fidelity.csv (FIDELITY.md's "Latest comparison").
HEADLINE_SWEEP = "data-cpu"
_CORES = re.compile(r"^- machine: [^\n]*?, (\d+) cores,", re.MULTILINE)


def committed_comparisons(root: Path = ROOT) -> list[Path]:
    """Every committed fidelity.csv: the headline sweep's, then each sweep directory's."""
    return [root / "fidelity.csv", *sorted(root.glob("*/fidelity.csv"))]


def sweep_directory(csv: Path) -> Path:
    """The sweep directory a comparison was made from."""
    return csv.parent / HEADLINE_SWEEP if csv.parent.name == "validation" else csv.parent


def cores_per_rank(sweep: Path) -> float:
    """The cores the sweep's job could use over its ranks on the node."""
    jobs = sorted(sweep.glob("*/job.json"))
    if not jobs:
        raise ValueError(f"{sweep}: no run with a job.json")
    job = json.loads(jobs[0].read_text())
    cores = job.get("cores_available")
    if cores is None:
        found = _CORES.search((sweep / "FIDELITY.md").read_text())
        if found is None:
            raise ValueError(f"{sweep}: neither job.json nor FIDELITY.md gives the cores")
        cores = int(found.group(1))
    ranks = job.get("local_world_size") or job["ranks"]
    return cores / ranks
