"""Predicted vs measured: every re-run of the sweep against both replay models' predictions.

For each pair (run A -> re-run with one change) it takes the re-run's
*measured* numbers (dsim's ``actual/actual`` replay of the re-run, i.e. the
run itself) and the numbers *predicted* from A's logs alone:

* ``per-iteration`` (today's ``dsim run``): align min -> policy ``min/actual``,
  align mean -> ``avg/actual``; it has no loader what-ifs ("n/a");
* ``pipeline``: through ``validation.predict.predict_pipeline`` with the same
  policies, or A's trace with another worker count / prefetch factor.

Logs are parsed and replayed by the real dsim CLI in a temporary directory.
Writes a CSV of every number and the generated part of FIDELITY.md.

    python -m validation.compare                     # validation/data -> FIDELITY.md
    python -m validation.compare --data /tmp/sweep   # -> /tmp/sweep/FIDELITY.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from dsim.errors import DsimError, InputError
from dsim.io.atomic import write_text
from validation.machine import REPO, git_commit
from validation.metrics import METRICS, error
from validation.predict import predict_per_iteration, predict_pipeline
from validation.sweep import BASE_PREFETCH, DEFAULT_OUT, MANIFEST, load_manifest
from validation.targets import verdicts

POLICY_OF_ALIGN = {"min": ("min", "actual"), "mean": ("avg", "actual")}
BASELINE = ("actual", "actual")
WORKER_STEPS = ((1, 2), (1, 4), (2, 4))


class ToolFailed(DsimError):
    exit_code = 3


@dataclass(frozen=True)
class Pair:
    """One what-if: predict ``target`` from ``base``'s logs."""

    regime: str
    kind: str  # align | loader | repeat | identity
    what_if: str
    base: str
    target: str
    workers: int  # the re-run's worker count (for its noise floor)
    per_iteration_policy: tuple[str, str] | None
    pipeline_policy: tuple[str, str]
    pipeline_workers: int | None = None  # None: as in A
    pipeline_prefetch: int | None = None


def default_outputs(data: Path) -> tuple[Path, Path]:
    """The repo's FIDELITY.md and validation/fidelity.csv for the committed data, else beside it."""
    if data.resolve() == DEFAULT_OUT.resolve():
        return REPO / "FIDELITY.md", REPO / "validation" / "fidelity.csv"
    return data / "FIDELITY.md", data / "fidelity.csv"


def unpack_logs(run_dir: Path, dest: Path) -> None:
    """A run's logs as plain ``rank<N>.log`` files in ``dest`` (dsim parse reads no .gz)."""
    dest.mkdir(parents=True, exist_ok=True)
    for log in sorted(run_dir.glob("rank*.log.gz")):
        with gzip.open(log, "rb") as src, open(dest / log.name[: -len(".gz")], "wb") as dst:
            shutil.copyfileobj(src, dst)
    for log in sorted(run_dir.glob("rank*.log")):
        shutil.copy(log, dest / log.name)


def dsim(*args: str) -> None:
    """The real dsim CLI, as a user runs it; its one-line error becomes ours."""
    proc = subprocess.run(
        [sys.executable, "-m", "dsim", *args], cwd=REPO, capture_output=True, text=True
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolFailed(f"dsim {args[0]} failed (exit {proc.returncode}): {last}")


def pairs(runs: dict[str, dict]) -> list[Pair]:
    """Every what-if the stored runs allow, per regime in the table's row order."""
    index = {
        (r["regime"], r["workers"], r["prefetch"], r["align"], bool(r.get("repeat"))): name
        for name, r in runs.items()
    }
    regimes = list(dict.fromkeys(r["regime"] for r in runs.values()))
    workers = sorted({r["workers"] for r in runs.values()})
    prefetches = sorted({r["prefetch"] for r in runs.values()} - {BASE_PREFETCH})
    out: list[Pair] = []
    for regime in regimes:
        a = {w: index.get((regime, w, BASE_PREFETCH, "none", False)) for w in workers}
        for align in ("min", "mean"):
            policy = POLICY_OF_ALIGN[align]
            for w in workers:
                target = index.get((regime, w, BASE_PREFETCH, align, False))
                if a[w] and target:
                    label = f"align {align}, {w} w"
                    out.append(Pair(regime, "align", label, a[w], target, w, policy, policy))
        for lo, hi in WORKER_STEPS:
            if a.get(lo) and a.get(hi):
                label = f"workers {lo} -> {hi}"
                out.append(Pair(regime, "loader", label, a[lo], a[hi], hi, None, BASELINE, hi))
        for w in workers:
            for p in prefetches:
                target = index.get((regime, w, p, "none", False))
                if a[w] and target:
                    label = f"prefetch {BASE_PREFETCH} -> {p}, {w} w"
                    out.append(
                        Pair(regime, "loader", label, a[w], target, w, None, BASELINE, None, p)
                    )
        for w in workers:
            target = index.get((regime, w, BASE_PREFETCH, "none", True))
            if a[w] and target:
                label = f"repeat, {w} w (noise floor)"
                out.append(Pair(regime, "repeat", label, a[w], target, w, BASELINE, BASELINE))
        for w in workers:  # A predicted from itself: the models' identity
            if a[w]:
                label = f"identity, {w} w"
                out.append(Pair(regime, "identity", label, a[w], a[w], w, BASELINE, BASELINE))
    return out


def check_against_summary(results: Path, measured: dict[str, dict[str, float]]) -> None:
    """Our metrics must be dsim's own summary, or the comparison would compare bookkeeping."""
    summary = pd.read_csv(results / "summary.csv")
    base = summary[(summary.fetch_align == "actual") & (summary.start_align == "actual")]
    for row in base.itertuples():
        ours = measured.get(row.run)
        if ours is None:
            continue
        pairs_ = (
            (ours["iteration_ms"], row.iteration_s_mean * 1e3),
            (ours["stall_ms"], row.stall_s_mean * 1e3),
            (ours["delay_ms"], row.delay_s_mean * 1e3),
            (ours["effective_delay_pct"], row.effective_delay_pct),
        )
        if any(not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in pairs_):
            raise ToolFailed(
                f"run {row.run}: the harness's metrics differ from dsim's summary "
                "(selection rules out of step with dsim.summary?)"
            )


def compare_runs(data: Path, manifest: dict, work: Path, jobs: int) -> pd.DataFrame:
    """Parse, replay and predict every pair; one row per pair."""
    runs = manifest["runs"]
    logs, traces, results = work / "logs", work / "traces", work / "results"
    present = [name for name in runs if any((data / name).glob("rank*.log*"))]
    if not present:
        raise InputError(f"{data}: no run with logs")
    for name in present:
        unpack_logs(data / name, logs / name)
    dsim("parse", str(logs), "--out", str(traces), "--quiet", "--jobs", str(jobs))
    for name in present:
        job = data / name / "job.json"
        if job.is_file():  # the loader settings, for the pipeline adapter
            shutil.copy(job, traces / name / "job.json")
    conf = {
        "FILE": present,
        "FETCH_ALIGN": [False, "min", "avg"],
        "START_ALIGN": [False],
        "traces": str(traces),
        "out": str(results),
        "executor": "local",
    }
    (work / "conf.json").write_text(json.dumps(conf))
    dsim("run", "--conf", str(work / "conf.json"), "--quiet")

    measured = {name: predict_per_iteration(results, name, BASELINE) for name in present}
    check_against_summary(results, measured)
    what_ifs = pairs({n: runs[n] for n in present})
    noise = {  # run-to-run noise of the mean iteration time: |A - repeat|, % of the repeat
        (p.regime, p.workers): abs(
            error(
                "iteration_ms", measured[p.base]["iteration_ms"], measured[p.target]["iteration_ms"]
            )
        )
        for p in what_ifs
        if p.kind == "repeat"
    }
    rows = []
    for p in what_ifs:
        meas = measured[p.target]
        per_it = (
            predict_per_iteration(results, p.base, p.per_iteration_policy)
            if p.per_iteration_policy
            else None
        )
        pipe = predict_pipeline(
            traces / p.base, p.pipeline_policy, p.pipeline_workers, p.pipeline_prefetch
        )
        row: dict[str, object] = {
            "regime": p.regime,
            "kind": p.kind,
            "what_if": p.what_if,
            "base_run": p.base,
            "target_run": p.target,
            "workers": p.workers,
            "noise_pct": noise.get((p.regime, p.workers)),
            "per_iteration_policy": "/".join(p.per_iteration_policy or ()) or "n/a",
            "pipeline_policy": "/".join(p.pipeline_policy),
            "pipeline_workers": p.pipeline_workers or runs[p.base]["workers"],
            "pipeline_prefetch": p.pipeline_prefetch or runs[p.base]["prefetch"],
        }
        for model, pred in (("per_iteration", per_it), ("pipeline", pipe)):
            errors = {}
            for m in METRICS:
                row[f"{m}_measured"] = meas[m]
                row[f"{m}_{model}"] = pred[m] if pred else None
                errors[m] = error(m, pred[m], meas[m]) if pred else None
                row[f"{m}_err_{model}"] = errors[m]
            for target, ok in verdicts(p.kind, errors, row["noise_pct"]).items():
                row[f"target_{target}_{model}"] = {True: "met", False: "missed"}.get(ok, "n/a")
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame


def compare(
    data: Path,
    *,
    fidelity: str | Path | None = None,
    csv: str | Path | None = None,
    jobs: int = 1,
) -> pd.DataFrame:
    """Compare every pair of the sweep in ``data``; write the CSV and FIDELITY.md's table."""
    from validation.report import update_fidelity

    data = Path(data)
    if not (data / MANIFEST).is_file():
        raise InputError(f"{data / MANIFEST}: no such manifest (run validation.sweep first)")
    manifest = load_manifest(data)
    default_md, default_csv = default_outputs(data)
    fidelity_path = Path(fidelity) if fidelity else default_md
    csv_path = Path(csv) if csv else default_csv
    with tempfile.TemporaryDirectory(prefix="dsim-fidelity-") as tmp:
        frame = compare_runs(data, manifest, Path(tmp), jobs)
    if frame.empty:
        raise InputError(f"{data}: no pair of runs to compare (A and a re-run)")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    write_text(frame.to_csv(index=False, float_format="%.6g"), csv_path)
    context = {
        "compared_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": " ".join(["python -m validation.compare", *sys.argv[1:]])
        if Path(sys.argv[0]).stem == "compare"
        else "python -m validation.compare (run by validation.sweep)",
        "data": _shown_path(data),
        "csv": _shown_path(csv_path),
    }
    update_fidelity(fidelity_path, frame, manifest, context)
    print(f"wrote {csv_path} and {fidelity_path} ({len(frame)} rows)")
    return frame


def _shown_path(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(DEFAULT_OUT), help="sweep directory (%(default)s)")
    p.add_argument("--fidelity", help="FIDELITY.md to update (default: see validation/README)")
    p.add_argument("--csv", help="CSV of every number (default: see validation/README)")
    p.add_argument("--jobs", type=int, default=1, help="runs `dsim parse` reads at once")
    args = p.parse_args(argv)
    try:
        compare(Path(args.data), fidelity=args.fidelity, csv=args.csv, jobs=args.jobs)
    except DsimError as exc:
        print(f"validation.compare: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
