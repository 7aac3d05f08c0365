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
import itertools
import json
import math
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from dsim.errors import DsimError, InputError
from dsim.io.atomic import write_text
from dsim.replay.policies import START_KNOWN
from validation.cells import Cell, group_runs, parse_run_name, stat, stats_of
from validation.machine import REPO, git_commit
from validation.manifest import BASE_PREFETCH, CPU_OUT, MANIFEST, load_manifest
from validation.metrics import MATCHED, METRICS, error
from validation.predict import (
    PipelineBase,
    drain_metrics,
    predict_per_iteration,
    prepare_pipeline,
    replay_metrics,
    supports,
)
from validation.swaps import cpu_swap, term_swaps
from validation.targets import verdicts
from validation.tunecheck import tune_rows

POLICY_OF_ALIGN = {"min": ("min", "actual"), "mean": ("avg", "actual")}
BASELINE = ("actual", "actual")
# Physical start alignments: (start of the run name, kind of what-if, label)
START_KINDS = (
    ("min", "start", "start min"),
    ("max", "start", "start max"),
    ("ctl", "control", "start control"),
)
MODELS = ("per_iteration", "pipeline")


class ToolFailed(DsimError):
    exit_code = 3


@dataclass(frozen=True)
class Pair:
    """One what-if: predict cell ``target`` from every repeat of cell ``base``.

    ``pipeline_policy`` None: the installed pipeline model cannot replay it
    ("n/a"); ``per_iteration_policy`` None: likewise for ``dsim run``.
    """

    regime: str
    kind: str  # align | start | control | loader | repeat | identity
    what_if: str
    base: Cell
    target: Cell
    per_iteration_policy: tuple[str, str] | None
    pipeline_policy: tuple[str, str] | None
    pipeline_workers: int | None = None  # None: as in A
    pipeline_prefetch: int | None = None


def default_outputs(data: Path) -> tuple[Path, Path]:
    """The repo's FIDELITY.md and validation/fidelity.csv for the committed contention sweep.

    Any other sweep (the first, sleep-only one in validation/data included) gets
    its FIDELITY.md and fidelity.csv beside its logs.
    """
    if data.resolve() == CPU_OUT.resolve():
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


def start_policy(start: str) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
    """(per-iteration, pipeline) policy that predicts a physical start-``start`` re-run.

    ``ctl`` (the mechanism on but inactive) is predicted as no change. A
    start alignment the installed dsim does not know (``max`` until it is
    added) gives None: the row says "n/a" instead of failing.
    """
    if start == "ctl":
        return BASELINE, BASELINE
    policy = ("actual", start)
    per_iteration = policy if start in START_KNOWN else None
    return per_iteration, policy if start in START_KNOWN and supports(policy) else None


def pairs(names: list[str] | dict[str, object]) -> list[Pair]:
    """Every what-if the stored runs allow, per regime in the table's row order."""
    cells = group_runs(list(names))
    regimes = list(dict.fromkeys(c.regime for c in cells))
    out: list[Pair] = []
    for regime in regimes:
        mine = [c for c in cells if c.regime == regime]
        workers = sorted({c.workers for c in mine})
        prefetches = sorted({c.prefetch for c in mine} - {BASE_PREFETCH})
        a = {w: Cell(regime, w, BASE_PREFETCH, "none") for w in workers}
        a = {w: c for w, c in a.items() if c in cells}
        for align in ("min", "mean"):
            policy = POLICY_OF_ALIGN[align]
            for w, base in a.items():
                target = Cell(regime, w, BASE_PREFETCH, align)
                if target in cells:
                    label = f"align {align}, {w} w"
                    out.append(Pair(regime, "align", label, base, target, policy, policy))
        for start, kind, what in START_KINDS:
            for w, base in a.items():
                target = Cell(regime, w, BASE_PREFETCH, "none", start)
                if target in cells:
                    per_it, pipe = start_policy(start)
                    label = f"{what}, {w} w"
                    out.append(Pair(regime, kind, label, base, target, per_it, pipe))
        for lo, hi in itertools.combinations(sorted(a), 2):
            label = f"workers {lo} -> {hi}"
            out.append(Pair(regime, "loader", label, a[lo], a[hi], None, BASELINE, hi))
        # The other way: a run with more workers predicting fewer, what `dsim tune` does from
        # every base run (validation/README.md, "Fewer workers").
        for lo, hi in itertools.combinations(sorted(a), 2):
            label = f"workers {hi} -> {lo}"
            out.append(Pair(regime, "fewer", label, a[hi], a[lo], None, BASELINE, lo))
        for w, base in a.items():
            for p in prefetches:
                target = Cell(regime, w, p, "none")
                if target in cells:
                    label = f"prefetch {BASE_PREFETCH} -> {p}, {w} w"
                    out.append(Pair(regime, "loader", label, base, target, None, BASELINE, None, p))
        for w, base in a.items():
            if len(cells[base]) >= 2:
                label = f"repeat, {w} w (noise)"
                out.append(Pair(regime, "repeat", label, base, base, BASELINE, BASELINE))
        for w, base in a.items():  # A predicted from itself: the models' identity
            label = f"identity, {w} w"
            out.append(Pair(regime, "identity", label, base, base, BASELINE, BASELINE))
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
                "(selection rules out of step with dsim.analysis.summary?)"
            )


def run_kind(data: Path, name: str, manifest_entry: dict) -> str:
    """The regime's kind (sleep | cpu | mixed | decode); the first sweep's runs are sleep."""
    job = data / name / "job.json"
    settings = json.loads(job.read_text()) if job.is_file() else {}
    for source in (settings, settings.get("regime") or {}, manifest_entry,
                   manifest_entry.get("regime_numbers") or {}):  # fmt: skip
        if isinstance(source, dict) and source.get("kind"):
            return str(source["kind"])
    return "sleep"


def start_aligns(names: list[str]) -> list[object]:
    """``dsim run``'s START_ALIGN: actual, plus what the physical runs need and dsim knows."""
    starts = {parse_run_name(n).cell.start for n in names} - {None, "ctl"}
    return [False, *(s for s in ("min", "max") if s in starts and s in START_KNOWN)]


def clipping(data: Path, names: list[str]) -> dict[str, float]:
    """``clip_<key>``: each numeric top-level entry of the runs' start_align.json, mean over runs.

    The physical start-alignment runs log how often the causal rule clipped
    a start; the file's fields are the physical side's, so they are taken
    as they come (numbers only) rather than assumed.
    """
    values: dict[str, list[float]] = {}
    for name in names:
        path = data / name / "start_align.json"
        if not path.is_file():
            continue
        try:
            entries = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: line {exc.lineno}: not JSON ({exc.msg})") from None
        if not isinstance(entries, dict):
            continue
        for key, value in entries.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                values.setdefault(f"clip_{key}", []).append(float(value))
        for key, value in _rank_totals(entries.get("ranks")).items():
            values.setdefault(f"clip_{key}", []).append(value)
    return {key: stat(v).mean for key, v in values.items()}


def _rank_totals(ranks: object) -> dict[str, float]:
    """Over every rank of one run: the share of batches clipped (%) and the mean shift (ms).

    The harness logs per rank how many batches the causal rule clipped (own
    start later than the earliest rank's by more than the threshold) and by
    how much (``validation/startalign.py``); here they are pooled over ranks.
    """
    if not isinstance(ranks, list):
        return {}
    batches = clipped = shift = waited = 0.0
    for r in ranks:
        if not isinstance(r, dict) or not isinstance(r.get("clipped"), dict):
            continue
        batches += float(r.get("batches") or 0)
        count = float(r["clipped"].get("count") or 0)
        clipped += count
        shift += count * float(r["clipped"].get("mean_ms") or 0.0)
        wait = r.get("waited") if isinstance(r.get("waited"), dict) else {}
        waited += float(wait.get("count") or 0) * float(wait.get("mean_ms") or 0.0)
    if batches <= 0:
        return {}
    return {
        "share_pct": 100.0 * clipped / batches,
        "shift_ms": shift / clipped if clipped else 0.0,
        "wait_ms": waited / batches,
    }


def _predictions(
    pair: Pair,
    cells: dict[Cell, list[str]],
    results: Path,
    measured: dict[str, dict[str, float]],
    bases: dict[str, PipelineBase],
) -> tuple[list[dict], dict[str, list[dict] | None]]:
    """(measured rows, model -> predicted rows), one row per repeat."""
    base_runs, target_runs = cells[pair.base], cells[pair.target]
    if pair.kind == "repeat":  # repeat 1 predicts the others: the noise a model cannot beat
        first = measured[base_runs[0]]
        return [measured[r] for r in base_runs[1:]], {"per_iteration": [first], "pipeline": [first]}
    meas = [measured[r] for r in target_runs]
    preds: dict[str, list[dict] | None] = {}
    per_it = pair.per_iteration_policy
    preds["per_iteration"] = (
        [predict_per_iteration(results, b, per_it) for b in base_runs] if per_it else None
    )
    pipe = pair.pipeline_policy
    preds["pipeline"] = (
        [
            replay_metrics(bases[b], pipe, pair.pipeline_workers, pair.pipeline_prefetch)
            for b in base_runs
        ]
        if pipe
        else None
    )
    return meas, preds


def drain_row(
    pair: Pair,
    base_runs: list[str],
    target_runs: list[str],
    base_of: Callable[[str], PipelineBase],
) -> dict[str, float]:
    """A loader what-if's body and drain (last P·W iterations), measured and predicted, in ms.

    Measured: each re-run's own ``actual/actual`` pipeline replay (the run,
    exactly: the identity); predicted: the pipeline's replay of each base
    repeat under the what-if. Means over the repeats.
    """
    policy = pair.pipeline_policy or BASELINE
    measured = [drain_metrics(base_of(t), BASELINE, None, None) for t in target_runs]
    predicted = [
        drain_metrics(base_of(b), policy, pair.pipeline_workers, pair.pipeline_prefetch)
        for b in base_runs
    ]
    out = {"drain_iterations": float(pair.target.workers * pair.target.prefetch)}
    for name, values in (("measured", measured), ("pipeline", predicted)):
        body, drain = np.array(values, dtype=np.float64).reshape(-1, 2).T
        out[f"body_ms_{name}"] = float(np.nanmean(body)) if len(body) else math.nan
        out[f"drain_ms_{name}"] = float(np.nanmean(drain)) if len(drain) else math.nan
    return out


#: The cells whose pipeline error is also made with the re-run's CPU time per batch
#: (``MATCHED``, ``cpu_swap``). Why every alignment cell, not only the misses: the same
#: work's CPU time moves between runs (validation/README.md, "The tenth held-out sweep"), so
#: this is the error net of the runs' CPU speed, a diagnosis beside the targets (it reads the
#: re-run's logs); NaN without CPU times. Not loader cells: a loader what-if changes the
#: work per batch itself.
ALIGNMENT_KINDS = ("align", "start", "control")


def swaps_wanted(row: dict, kind: str, every: bool) -> bool:
    """Whether a compared pair gets its term swaps: where its pipeline prediction missed
    the iteration or loader target, or, with ``every`` (``--swap-every``), every
    what-if pair. Why the second: a miss on one sweep cannot tell bias from noise; the
    same cell's swaps on every sweep can (validation/README, "Across the four sweeps")."""
    if every:
        return kind in ("align", "start", "control", "loader", "fewer")
    targets = ("iteration", "loader", "fewer")
    return any(row.get(f"target_{t}_pipeline") == "missed" for t in targets)


def compare_runs(
    data: Path, manifest: dict, work: Path, jobs: int, swap_every: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Parse, replay and predict every pair; one row per pair, and the term swaps of misses
    (of every what-if pair with ``swap_every``)."""
    runs = manifest["runs"]
    logs, traces, results = work / "logs", work / "traces", work / "results"
    present = [name for name in runs if any((data / name).glob("rank*.log*"))]
    if not present:
        raise InputError(f"{data}: no run with logs")
    for name in present:
        try:
            parse_run_name(name)
        except ValueError as exc:
            raise InputError(f"{data / MANIFEST}: {exc}") from None
        unpack_logs(data / name, logs / name)
    dsim("parse", str(logs), "--out", str(traces), "--quiet", "--jobs", str(jobs))
    for name in present:
        job = data / name / "job.json"
        if job.is_file():  # the loader settings, for the pipeline adapter
            shutil.copy(job, traces / name / "job.json")
    conf = {
        "FILE": present,
        "FETCH_ALIGN": [False, "min", "avg"],
        "START_ALIGN": start_aligns(present),
        "traces": str(traces),
        "out": str(results),
        "executor": "local",
    }
    (work / "conf.json").write_text(json.dumps(conf))
    dsim("run", "--conf", str(work / "conf.json"), "--quiet")

    measured = {name: predict_per_iteration(results, name, BASELINE) for name in present}
    check_against_summary(results, measured)
    try:
        cells = group_runs(present)
    except ValueError as exc:
        raise InputError(f"{data / MANIFEST}: {exc}") from None
    kinds = {c: run_kind(data, runs_[0], runs[runs_[0]]) for c, runs_ in cells.items()}
    what_ifs = pairs(present)
    bases: dict[str, PipelineBase] = {}

    def base_of(name: str) -> PipelineBase:
        if name not in bases:
            bases[name] = prepare_pipeline(traces / name)
        return bases[name]

    for p in what_ifs:
        if p.pipeline_policy and p.kind != "repeat":
            for b in cells[p.base]:
                base_of(b)
    rows, swaps = [], []
    for p in what_ifs:
        meas_rows, preds = _predictions(p, cells, results, measured, bases)
        meas = stats_of(meas_rows, METRICS)
        base_runs = cells[p.base]
        target_runs = base_runs[1:] if p.kind == "repeat" else cells[p.target]
        row: dict[str, object] = {
            "regime": p.regime,
            "regime_kind": kinds[p.target],
            "kind": p.kind,
            "what_if": p.what_if,
            "base_cell": p.base.label,
            "target_cell": p.target.label,
            "base_run": ";".join(base_runs[:1] if p.kind == "repeat" else base_runs),
            "target_run": ";".join(target_runs),
            "n_base": 1 if p.kind == "repeat" else len(base_runs),
            "n_target": len(target_runs),
            "workers": p.target.workers,
            "per_iteration_policy": "/".join(p.per_iteration_policy or ()) or "n/a",
            "pipeline_policy": "/".join(p.pipeline_policy or ()) or "n/a",
            "pipeline_workers": p.pipeline_workers or p.base.workers,
            "pipeline_prefetch": p.pipeline_prefetch or p.base.prefetch,
        }
        if p.kind in ("start", "control"):
            row.update(clipping(data, target_runs))
        if p.kind == "loader" and p.pipeline_policy:
            row.update(drain_row(p, base_runs, target_runs, base_of))
        pipe_rows = preds["pipeline"] or []
        assumptions = sorted({str(r.get("assumption", "n/a")) for r in pipe_rows})
        row["pipeline_assumption"] = ";".join(assumptions) or "n/a"
        for m in METRICS:
            row[f"{m}_measured"] = meas[m].mean
            row[f"{m}_measured_sd"] = meas[m].sd
        judged = {}
        for model in MODELS:
            pred = stats_of(preds[model], METRICS) if preds[model] else None
            judged[model] = pred
            for m in METRICS:
                value = pred[m] if pred else None
                row[f"{m}_{model}"] = value.mean if value else None
                row[f"{m}_{model}_sd"] = value.sd if value else None
                row[f"{m}_err_{model}"] = error(m, value.mean if value else None, meas[m].mean)
            for target, v in verdicts(p.kind, pred, meas).items():
                row[f"target_{target}_{model}"] = v.word
                row[f"band_{target}_{model}"] = v.bound
                row[f"flips_{target}_{model}"] = v.flips
        rows.append(row)
        if not p.pipeline_policy:
            continue
        pair_bases = [bases[b] for b in base_runs]
        pair_targets = [base_of(t) for t in target_runs]
        args = (p.pipeline_policy, p.pipeline_workers, p.pipeline_prefetch)
        measured_ms = meas["iteration_ms"].mean
        pair_swaps = []
        if swaps_wanted(row, p.kind, swap_every):
            pair_swaps = term_swaps(row, pair_bases, pair_targets, *args, measured_ms)
            swaps += pair_swaps
        if p.kind in ALIGNMENT_KINDS:  # the cpu swap of every alignment cell, made once
            cpu = next((s for s in pair_swaps if s["term"] == "cpu"), None)
            if cpu is None:
                cpu = cpu_swap(row, pair_bases, pair_targets, *args, measured_ms)
            row[MATCHED] = math.nan if cpu is None else float(cpu["swapped_err_pct"])
    return pd.DataFrame(rows), pd.DataFrame(swaps)


def tune_check(data: Path, manifest: dict, work: Path) -> pd.DataFrame:
    """dsim tune on every A run of ``work``'s traces, judged against the measured grid.

    Reads what ``compare_runs`` left in ``work`` (the parsed traces, ``dsim
    run``'s results); the measured iteration time of a run is dsim's own
    ``actual/actual`` replay of it, as everywhere in this comparison.
    """
    runs = manifest["runs"]
    present = [name for name in runs if (work / "traces" / name / "run.json").is_file()]
    grid = [
        n for n in present
        if parse_run_name(n).cell.align == "none" and parse_run_name(n).cell.start is None
    ]  # fmt: skip
    measured = {
        n: predict_per_iteration(work / "results", n, BASELINE)["iteration_ms"] for n in grid
    }
    kinds = {parse_run_name(n).cell.regime: run_kind(data, n, runs[n]) for n in grid}
    return tune_rows(work / "traces", grid, measured, kinds, BASE_PREFETCH)


def compare(
    data: Path,
    *,
    fidelity: str | Path | None = None,
    csv: str | Path | None = None,
    jobs: int = 1,
    swap_every: bool = False,
) -> pd.DataFrame:
    """Compare every pair of the sweep in ``data``; write the CSV and FIDELITY.md's table
    (``swap_every``: term swaps of every what-if pair, as ``swaps_wanted``)."""
    from validation.report import update_fidelity

    data = Path(data)
    if not (data / MANIFEST).is_file():
        raise InputError(f"{data / MANIFEST}: no such manifest (run validation.sweep first)")
    manifest = load_manifest(data)
    default_md, default_csv = default_outputs(data)
    fidelity_path = Path(fidelity) if fidelity else default_md
    csv_path = Path(csv) if csv else default_csv
    commit = git_commit()  # before our outputs change tracked files (it would read -dirty)
    with tempfile.TemporaryDirectory(prefix="dsim-fidelity-") as tmp:
        frame, swaps = compare_runs(data, manifest, Path(tmp), jobs, swap_every)
        tune = tune_check(data, manifest, Path(tmp))
    if frame.empty:
        raise InputError(f"{data}: no pair of runs to compare (A and a re-run)")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    write_text(frame.to_csv(index=False, float_format="%.6g"), csv_path)
    swaps_path = csv_path.with_name(csv_path.stem + "_swaps.csv")
    write_text(swaps.to_csv(index=False, float_format="%.6g"), swaps_path)
    tune_path = csv_path.with_name(csv_path.stem + "_tune.csv")
    write_text(tune.to_csv(index=False, float_format="%.6g"), tune_path)
    context = {
        "compared_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "command": " ".join(["python -m validation.compare", *sys.argv[1:]])
        if Path(sys.argv[0]).stem == "compare"
        else "python -m validation.compare (run by validation.sweep)",
        "data": _shown_path(data),
        "csv": _shown_path(csv_path),
        "swaps_csv": _shown_path(swaps_path),
        "tune_csv": _shown_path(tune_path),
    }
    update_fidelity(fidelity_path, frame, manifest, context, swaps, tune)
    print(f"wrote {csv_path} and {fidelity_path} ({len(frame)} rows)")
    return frame


def _shown_path(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(CPU_OUT), help="sweep directory (%(default)s)")
    p.add_argument("--fidelity", help="FIDELITY.md to update (default: see validation/README)")
    p.add_argument("--csv", help="CSV of every number (default: see validation/README)")
    p.add_argument("--jobs", type=int, default=1, help="runs `dsim parse` reads at once")
    p.add_argument(
        "--swap-every",
        action="store_true",
        help="term swaps of every what-if pair, not only of the missed ones",
    )
    args = p.parse_args(argv)
    try:
        compare(
            Path(args.data),
            fidelity=args.fidelity,
            csv=args.csv,
            jobs=args.jobs,
            swap_every=args.swap_every,
        )
    except DsimError as exc:
        print(f"validation.compare: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
