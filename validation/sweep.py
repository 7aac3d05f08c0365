"""One command for the whole fidelity sweep: run the physical jobs, then compare.

For every regime and worker count W (1, 2, 4) it runs, one at a time (never
two at once: they would steal each other's CPU and the timings would be
worthless):

* ``A`` — no alignment, prefetch 2 (the run every prediction starts from);
* ``min`` and ``mean`` — the same cost table with the alignment physically
  applied (every rank's batch costs the min / mean over ranks);
* ``repeat`` — A again, for the run-to-run noise floor;
* at W = 2 also prefetch 1 and 4 (A's settings otherwise).

Each run goes to ``<out>/<run>/`` (``rank<N>.log.gz``, ``job.json``) and into
``<out>/manifest.json`` with its wall time, the git commit and the machine's
load before and after. A run already in the manifest with all its logs is
skipped, so an interrupted sweep resumes; ``--only REGEX`` re-runs the
matching ones. At the end ``validation.compare`` writes the table.

    python -m validation.sweep --out validation/data
    python -m validation.sweep --only 'balanced_w2_.*' --no-compare
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from dsim.errors import DsimError, InputError, UsageError
from dsim.io.atomic import write_json
from validation.machine import REPO, git_commit, load_average, machine_facts
from validation.regimes import REGIMES

DEFAULT_OUT = REPO / "validation" / "data"
VARIANTS = ("repeat", "min", "mean", "prefetch")
BASE_PREFETCH = 2
WHAT_IF_PREFETCH = (1, 4)
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
JOB_TIMEOUT_S = 900


class JobFailed(DsimError):
    exit_code = 3


@dataclass(frozen=True)
class RunSpec:
    """One physical run; ``repeat`` marks the second run of A's settings."""

    regime: str
    workers: int
    prefetch: int
    align: str
    repeat: bool = False

    @property
    def name(self) -> str:
        tail = "_repeat" if self.repeat else ""
        return f"{self.regime}_w{self.workers}_p{self.prefetch}_{self.align}{tail}"


def plan(regimes: list[str], workers: list[int], variants: set[str]) -> list[RunSpec]:
    """Runs in execution order: per regime and worker count A first, its repeat last."""
    runs: list[RunSpec] = []
    for regime in regimes:
        for w in workers:
            runs.append(RunSpec(regime, w, BASE_PREFETCH, "none"))
            runs += [RunSpec(regime, w, BASE_PREFETCH, a) for a in ("min", "mean") if a in variants]
            if "prefetch" in variants and w == 2:
                runs += [RunSpec(regime, w, p, "none") for p in WHAT_IF_PREFETCH]
            if "repeat" in variants:
                runs.append(RunSpec(regime, w, BASE_PREFETCH, "none", repeat=True))
    return runs


def job_command(spec: RunSpec, args: argparse.Namespace, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "validation.job",
        "--regime", spec.regime,
        "--workers", str(spec.workers),
        "--prefetch-factor", str(spec.prefetch),
        "--align", spec.align,
        "--ranks", str(args.ranks),
        "--iterations", str(args.iterations),
        "--epochs", str(args.epochs),
        "--batch-size", str(args.batch_size),
        "--seed", str(args.seed),
        "--out", str(out),
        "--name", spec.name,
    ]  # fmt: skip


def settings_of(spec: RunSpec, args: argparse.Namespace) -> dict[str, object]:
    """What must be equal for a stored run to count as this planned run."""
    return {
        **asdict(spec),
        "regime_numbers": REGIMES[spec.regime].as_dict(),
        "ranks": args.ranks,
        "iterations": args.iterations,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "seed": args.seed,
    }


def load_manifest(out: Path) -> dict:
    path = out / MANIFEST
    if not path.is_file():
        return {"format": MANIFEST_FORMAT, "runs": {}}
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable manifest ({exc})") from exc
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("runs"), dict):
        raise InputError(f"{path}: unknown manifest format")
    return manifest


def logs_complete(run_dir: Path, ranks: int) -> bool:
    return all((run_dir / f"rank{r}.log.gz").is_file() for r in range(ranks))


def compress_logs(run_dir: Path) -> None:
    """rank<N>.log -> rank<N>.log.gz (deterministic: no name or time in the gzip header)."""
    for log in sorted(run_dir.glob("rank*.log")):
        target = log.with_name(log.name + ".gz")
        with (
            log.open("rb") as src,
            open(target, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as dst,
        ):
            shutil.copyfileobj(src, dst)
        log.unlink()


def execute(spec: RunSpec, args: argparse.Namespace, out: Path) -> dict[str, object]:
    """Run one job to completion; its manifest entry."""
    run_dir = out / spec.name
    command = job_command(spec, args, out)
    load_before = load_average()
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    wall = time.perf_counter() - t0
    load_after = load_average()
    if proc.returncode != 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "job.err").write_text(proc.stdout + proc.stderr)
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise JobFailed(
            f"run {spec.name} failed (exit {proc.returncode}): {last} "
            f"(full output: {run_dir / 'job.err'})"
        )
    (run_dir / "job.err").unlink(missing_ok=True)
    compress_logs(run_dir)
    if not logs_complete(run_dir, args.ranks):
        raise JobFailed(f"run {spec.name} left no log for some rank in {run_dir}")
    return {
        **settings_of(spec, args),
        "name": spec.name,
        "started_utc": started.isoformat(timespec="seconds"),
        "wall_s": round(wall, 3),
        "git_commit": git_commit(),
        "machine": machine_facts(),
        "load_before": load_before,
        "load_after": load_after,
        "command": shlex.join(["python", *command[1:]]),
    }


def sweep(args: argparse.Namespace) -> Path:
    out = Path(args.out).resolve()
    runs = plan(args.regime, args.workers, set(args.variants))
    only = re.compile(args.only) if args.only else None
    manifest = load_manifest(out)
    todo: list[RunSpec] = []
    for spec in runs:
        stored = manifest["runs"].get(spec.name)
        if only is not None:
            if only.search(spec.name):
                todo.append(spec)
            continue
        if stored and logs_complete(out / spec.name, args.ranks):
            same = {k: stored.get(k) for k in settings_of(spec, args)}
            if same != settings_of(spec, args):
                raise UsageError(
                    f"run {spec.name} in {out} was made with other settings; "
                    f"use another --out or re-run it with --only '^{spec.name}$'"
                )
            continue
        todo.append(spec)
    if args.dry_run:
        for spec in todo:
            print(shlex.join(["python", *job_command(spec, args, out)[1:]]))
        return out
    out.mkdir(parents=True, exist_ok=True)
    manifest["command"] = shlex.join(["python", "-m", "validation.sweep", *sys.argv[1:]])
    for k, spec in enumerate(todo, start=1):
        print(f"[{k}/{len(todo)}] {spec.name}", end=" ", flush=True)
        entry = execute(spec, args, out)
        manifest["runs"][spec.name] = entry
        write_json(manifest, out / MANIFEST)
        print(f"{entry['wall_s']:.1f} s, load {entry['load_before']} -> {entry['load_after']}")
    if not todo:
        print("every planned run is already there")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help="data directory (default: %(default)s)")
    p.add_argument("--regime", nargs="+", choices=sorted(REGIMES), default=list(REGIMES))
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument(
        "--variants",
        type=lambda s: [v for v in s.split(",") if v],
        default=list(VARIANTS),
        help=f"besides A: any of {','.join(VARIANTS)} (default: all)",
    )
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--iterations", type=int, default=400, help="iterations per epoch")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", metavar="REGEX", help="(re-)run only the planned runs matching")
    p.add_argument("--dry-run", action="store_true", help="print the job commands, run nothing")
    p.add_argument("--no-compare", action="store_true", help="do not run validation.compare")
    p.add_argument("--fidelity", help="FIDELITY.md to write (default: the repo's for the "
                   "default --out, else <out>/FIDELITY.md)")  # fmt: skip
    p.add_argument("--csv", help="CSV of all numbers (default: validation/fidelity.csv for "
                   "the default --out, else <out>/fidelity.csv)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="runs `dsim parse` reads at once")
    args = p.parse_args(argv)
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if min(args.workers) < 1:
        p.error("--workers must be >= 1 (the what-ifs need DataLoader workers)")
    if min(args.ranks, args.iterations, args.epochs, args.batch_size) < 1:
        p.error("--ranks, --iterations, --epochs and --batch-size must be >= 1")
    if args.only:
        try:
            re.compile(args.only)
        except re.error as exc:
            p.error(f"--only: not a regular expression ({exc})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        out = sweep(args)
        if not (args.no_compare or args.dry_run):
            from validation import compare

            compare.compare(out, fidelity=args.fidelity, csv=args.csv, jobs=args.jobs)
    except DsimError as exc:
        print(f"validation.sweep: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("validation.sweep: interrupted; finished runs are kept", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
