"""One command for the whole fidelity sweep: run the physical jobs, then compare.

Two plans (``--plan``). ``cpu`` (the default) is the contention sweep of
issue #18: regimes cpu, mixed, decode and balanced (sleep), 4 ranks, 1 epoch
of 100 iterations; per regime A at W = 1, 2, 4, 8 workers (prefetch 2) and,
except decode, align min / mean at W = 1, 2 and start-align min / max /
control at W = 2 (``--prefetch P ...`` adds a cell per factor P at every W);
every cell ``--repeats`` times (3), interleaved: repeat 1 of
every cell of a regime, then repeat 2, ... so that drift cancels. Runs are
named ``<regime>_w<W>_p<P>_<align>[_s<min|max|ctl>]_r<k>``. The CPU work of
the cpu and mixed regimes is calibrated once, at the sweep's start (before any
run), and handed to every job (``--cpu-units-per-ms``); the manifest keeps it
and a resumed sweep reuses it.

``legacy`` is the committed sleep sweep. For every regime and worker count W
(1, 2, 4) it runs, one at a time (never two at once: they would steal each
other's CPU and the timings would be worthless):

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

    python -m validation.sweep --dry-run                  # the cpu plan, its length
    python -m validation.sweep --out validation/data-cpu  # the cpu plan (~25 min)
    python -m validation.sweep --plan legacy --out validation/data
    python -m validation.sweep --only 'balanced_w2_.*' --no-compare
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from dsim.errors import DsimError, UsageError
from dsim.io.atomic import write_json
from validation.cpuwork import calibrate
from validation.machine import REPO, git_commit, load_average, machine_facts
from validation.manifest import (
    BASE_PREFETCH,
    CPU_OUT,
    DEFAULT_OUT,
    MANIFEST,
    load_manifest,
)
from validation.regimes import REGIMES, SLEEP_REGIMES, Regime

PLANS = ("cpu", "legacy")
CPU_REGIMES = ("cpu", "mixed", "decode", "balanced")
CPU_WORKERS = (1, 2, 4, 8)
ALIGN_WORKERS = (1, 2)  # align min / mean cells
START_WORKERS = (2,)  # start-align cells: W = 2, where the ranks' fetch windows overlap most
START_TAGS = {"min": "min", "max": "max", "control": "ctl"}
PLAN_SHAPE = {"cpu": (100, 1), "legacy": (400, 2)}  # iterations, epochs
# Per-run time estimate of --dry-run (measured on the 2-core VM, validation/README.md):
# start-up of 4 ranks, plus per worker process, plus iterations x the estimate of
# iteration_ms(); DECODE_COMPUTE_MS is the conv net's forward + backward of a batch.
STARTUP_S = 6.0
PER_WORKER_S = 0.15
OVERHEAD_MS = 6.0
TRAINER_CPU_MS = 2.0  # a rank's CPU per step besides compute (all-reduce, Python, log line)
DECODE_COMPUTE_MS = 6.0
# The GPU variant spawns its ranks (CUDA must not be forked), and each rank starts its
# workers one after another: measured on the H200 machine (16 cores; validation/README.md),
# 16 s at 1 worker, 35-42 s at 8, for 1 and for 4 ranks alike.
CUDA_STARTUP_S = 13.0
CUDA_PER_WORKER_S = 3.0
VARIANTS = ("repeat", "min", "mean", "prefetch")
WHAT_IF_PREFETCH = (1, 4)
JOB_TIMEOUT_S = 900


class JobFailed(DsimError):
    exit_code = 3


@dataclass(frozen=True)
class RunSpec:
    """One physical run.

    ``repeat`` marks the second run of A's settings in the legacy plan; ``k``
    (1, 2, ...) is the repeat number in the cpu plan (0: a legacy run, named
    and recorded as before).
    """

    regime: str
    workers: int
    prefetch: int
    align: str
    repeat: bool = False
    start: str = "none"
    k: int = 0

    @property
    def name(self) -> str:
        base = f"{self.regime}_w{self.workers}_p{self.prefetch}_{self.align}"
        if not self.k:
            return base + ("_repeat" if self.repeat else "")
        start = f"_s{START_TAGS[self.start]}" if self.start != "none" else ""
        return f"{base}{start}_r{self.k}"

    def record(self) -> dict[str, object]:
        """The spec as the manifest keeps it (a legacy run's entry keeps its old keys)."""
        d = asdict(self)
        if not self.k:
            del d["start"], d["k"]
        return d


def cells(regime: str, workers: list[int], prefetch: tuple[int, ...] = ()) -> list[RunSpec]:
    """The cpu plan's cells of one regime (repeat number 0: set by ``plan_cpu``).

    ``prefetch``: what-if prefetch factors, each a cell at every worker count, so that
    ``validation.compare`` judges prefetch what-ifs and ``validation.tunecheck`` tune's
    whole workers x prefetch grid (it takes only factors measured at every count).
    """
    out = [RunSpec(regime, w, BASE_PREFETCH, "none") for w in workers]
    out += [RunSpec(regime, w, p, "none") for w in workers for p in prefetch]
    if REGIMES[regime].kind == "decode":  # loader what-ifs only: no table to align
        return out
    for w in (w for w in ALIGN_WORKERS if w in workers):
        out += [RunSpec(regime, w, BASE_PREFETCH, a) for a in ("min", "mean")]
    for w in (w for w in START_WORKERS if w in workers):
        out += [RunSpec(regime, w, BASE_PREFETCH, "none", start=s) for s in START_TAGS]
    return out


def plan_cpu(
    regimes: list[str], workers: list[int], repeats: int, prefetch: tuple[int, ...] = ()
) -> list[RunSpec]:
    """Interleaved: per regime, repeat 1 of every cell, then repeat 2, ... (drift cancels)."""
    runs: list[RunSpec] = []
    for regime in regimes:
        regime_cells = cells(regime, workers, prefetch)
        for k in range(1, repeats + 1):
            runs += [RunSpec(**{**asdict(c), "k": k}) for c in regime_cells]
    return runs


def iteration_ms(regime: Regime, workers: int, ranks: int, cores: int) -> float:
    """A rough iteration time for --dry-run's estimate (not a model: a budget).

    The slowest rank's mean batch cost over its workers, the compute floor, and
    the cores' capacity: all ranks' CPU work per iteration (loading, compute,
    the trainer's own) over the cores. Checked on the committed sleep sweep:
    28.4 min estimated, 26.7 min measured.
    """
    stragglers = 1 + regime.straggler_prob * (regime.straggler_factor - 1)
    slowest = regime.batch_ms * (1 + regime.skew) * stragglers
    mean = regime.batch_ms * (1 + regime.skew / 2) * stragglers
    compute = DECODE_COMPUTE_MS if regime.kind == "decode" else regime.compute_ms
    cpu_share = {"sleep": 0.0, "cpu": 1.0, "mixed": 0.5, "decode": 1.0}[regime.kind]
    cpu_compute = compute if regime.kind != "sleep" else 0.0
    demand = ranks * (mean * cpu_share + cpu_compute + TRAINER_CPU_MS) / max(cores, 1)
    return max(compute + OVERHEAD_MS, slowest / workers, demand)


def estimate_s(spec: RunSpec, args: argparse.Namespace, cores: int) -> float:
    """Estimated wall time of one run (seconds): start-up plus its iterations."""
    per_iteration = iteration_ms(REGIMES[spec.regime], spec.workers, args.ranks, cores)
    if args.device == "cuda":
        startup = CUDA_STARTUP_S + CUDA_PER_WORKER_S * spec.workers
    else:
        startup = STARTUP_S + PER_WORKER_S * spec.workers * args.ranks
    return startup + args.iterations * args.epochs * per_iteration / 1000


def plan(regimes: list[str], workers: list[int], variants: set[str]) -> list[RunSpec]:
    """Runs in execution order: per regime and worker count A first, its repeat last."""
    runs: list[RunSpec] = []
    for regime in regimes:
        for w in workers:
            runs.append(RunSpec(regime, w, BASE_PREFETCH, "none"))
            aligns = [a for a in ("min", "mean") if a in variants]
            if REGIMES[regime].kind == "decode":  # no cost table to align
                aligns = []
            runs += [RunSpec(regime, w, BASE_PREFETCH, a) for a in aligns]
            if "prefetch" in variants and w == 2:
                runs += [RunSpec(regime, w, p, "none") for p in WHAT_IF_PREFETCH]
            if "repeat" in variants:
                runs.append(RunSpec(regime, w, BASE_PREFETCH, "none", repeat=True))
    return runs


def needs_calibration(spec: RunSpec) -> bool:
    return REGIMES[spec.regime].kind in ("cpu", "mixed")


def job_command(
    spec: RunSpec, args: argparse.Namespace, out: Path, units_per_ms: float | None = None
) -> list[str]:
    extra = ["--start-align", spec.start] if spec.start != "none" else []
    if needs_calibration(spec):
        extra += ["--cpu-units-per-ms", f"{units_per_ms:.3f}" if units_per_ms else "CALIBRATED"]
    if args.device != "cpu":
        extra += ["--device", args.device]
    if args.share_gpus:
        extra += ["--share-gpus"]
    if args.bind:
        extra += ["--bind"]
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
        *extra,
    ]  # fmt: skip


def settings_of(spec: RunSpec, args: argparse.Namespace) -> dict[str, object]:
    """What must be equal for a stored run to count as this planned run."""
    device = {"device": args.device} if args.device != "cpu" else {}
    if args.share_gpus:
        device["share_gpus"] = True
    if args.bind:
        device["bind"] = True
    return {
        **spec.record(),
        **device,
        "regime_numbers": REGIMES[spec.regime].as_dict(),
        "ranks": args.ranks,
        "iterations": args.iterations,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "seed": args.seed,
    }


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


def execute(
    spec: RunSpec, args: argparse.Namespace, out: Path, units_per_ms: float | None = None
) -> dict[str, object]:
    """Run one job to completion; its manifest entry."""
    run_dir = out / spec.name
    command = job_command(spec, args, out, units_per_ms)
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
        **({"cpu_units_per_ms": units_per_ms} if needs_calibration(spec) else {}),
    }


def calibration(manifest: dict, args: argparse.Namespace) -> float:
    """The sweep's CPU work units per ms: given, stored by an earlier part of it, or measured now.

    Measured once, before any run (so on a machine the sweep has not yet
    loaded), and kept in the manifest so that a resumed sweep's runs do the
    same work as the first part's.
    """
    stored = manifest.get("calibration")
    if args.cpu_units_per_ms:
        value, how = args.cpu_units_per_ms, "argument"
    elif stored:
        return float(stored["cpu_units_per_ms"])
    else:
        load = load_average()
        value, how = calibrate(), "measured at the sweep's start"
        print(f"calibration: {value:.1f} CPU work units per ms (load {load})")
    manifest["calibration"] = {
        "cpu_units_per_ms": round(value, 3),
        "how": how,
        "unit": "SHA-256 of 1 KiB (validation/cpuwork.py)",
        "when_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "load": load_average(),
    }
    return round(value, 3)


def plan_of(args: argparse.Namespace) -> list[RunSpec]:
    if args.plan == "legacy":
        return plan(args.regime, args.workers, set(args.variants))
    return plan_cpu(args.regime, args.workers, args.repeats, tuple(args.prefetch))


def sweep(args: argparse.Namespace) -> Path:
    out = Path(args.out).resolve()
    runs = plan_of(args)
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
            same.pop("cpu_units_per_ms", None)
            if same != settings_of(spec, args):
                raise UsageError(
                    f"run {spec.name} in {out} was made with other settings; "
                    f"use another --out or re-run it with --only '^{spec.name}$'"
                )
            continue
        todo.append(spec)
    if args.dry_run:
        stored = (manifest.get("calibration") or {}).get("cpu_units_per_ms")
        for spec in todo:
            print(shlex.join(["python", *job_command(spec, args, out, stored)[1:]]))
        cores = os.cpu_count() or 1
        total = sum(estimate_s(spec, args, cores) for spec in todo)
        startup = (
            f"{CUDA_STARTUP_S:.0f} s start-up + {CUDA_PER_WORKER_S} s per worker of a rank"
            if args.device == "cuda"
            else f"{STARTUP_S:.0f} s start-up + {PER_WORKER_S} s per worker process"
        )
        print(
            f"# plan {args.plan}: {len(todo)} runs of {len(runs)}, estimated {total / 60:.1f} min "
            f"on {cores} cores (per run: {startup} + iterations x a rough iteration time; "
            "validation/README.md)"
        )
        return out
    out.mkdir(parents=True, exist_ok=True)
    manifest["command"] = shlex.join(["python", "-m", "validation.sweep", *sys.argv[1:]])
    units = calibration(manifest, args) if any(map(needs_calibration, todo)) else None
    if units is not None:
        write_json(manifest, out / MANIFEST)
    ended: float | None = None
    for k, spec in enumerate(todo, start=1):
        print(f"[{k}/{len(todo)}] {spec.name}", end=" ", flush=True)
        gap = None if ended is None else round(time.perf_counter() - ended, 3)
        entry = execute(spec, args, out, units if needs_calibration(spec) else None)
        ended = time.perf_counter()
        entry["gap_before_s"] = gap  # time since the previous run of this invocation ended
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
    p.add_argument(
        "--plan", choices=PLANS, default="cpu", help="which sweep (default: %(default)s)"
    )
    p.add_argument("--out", help=f"data directory (default: {CPU_OUT} for the cpu plan, "
                   f"{DEFAULT_OUT} for legacy)")  # fmt: skip
    p.add_argument("--regime", nargs="+", choices=sorted(REGIMES), help="default: the plan's")
    p.add_argument("--workers", nargs="+", type=int, help="default: the plan's")
    p.add_argument("--repeats", type=int, default=3, help="runs of every cell (cpu plan)")
    p.add_argument(
        "--prefetch",
        nargs="+",
        type=int,
        default=[],
        help=f"cpu plan: what-if prefetch factors besides {BASE_PREFETCH}, a cell at every "
        "worker count (default: none)",
    )
    p.add_argument("--cpu-units-per-ms", type=float, help="skip the calibration (cpu plan)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: the GPU variant (NCCL, decode regime only)")  # fmt: skip
    p.add_argument(
        "--bind",
        action="store_true",
        help="each rank and its workers bound to their own share of the CPUs",
    )
    p.add_argument("--share-gpus", action="store_true",
                   help="cuda, more ranks than GPUs: ranks share GPUs (gloo)")  # fmt: skip
    p.add_argument(
        "--variants",
        type=lambda s: [v for v in s.split(",") if v],
        help=f"legacy plan, besides A: any of {','.join(VARIANTS)} (default: all)",
    )
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--iterations", type=int, help="per epoch (cpu plan 100, legacy 400)")
    p.add_argument("--epochs", type=int, help="cpu plan 1, legacy 2")
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
    legacy = args.plan == "legacy"
    args.out = args.out or str(DEFAULT_OUT if legacy else CPU_OUT)
    if args.regime is None:
        args.regime = list(SLEEP_REGIMES if legacy else CPU_REGIMES)
        if args.device == "cuda":
            args.regime = [r for r in args.regime if REGIMES[r].kind == "decode"]
    args.workers = args.workers or ([1, 2, 4] if legacy else list(CPU_WORKERS))
    shape = PLAN_SHAPE[args.plan]
    args.iterations = args.iterations or shape[0]
    args.epochs = args.epochs or shape[1]
    if args.share_gpus and args.device != "cuda":
        p.error("--share-gpus needs --device cuda")
    if args.device == "cuda" and any(REGIMES[r].kind != "decode" for r in args.regime):
        p.error("--device cuda: only the decode regime has a GPU variant (--regime decode)")
    if args.repeats < 1 or (args.cpu_units_per_ms is not None and args.cpu_units_per_ms <= 0):
        p.error("--repeats must be >= 1 and --cpu-units-per-ms > 0")
    if args.variants is not None and not legacy:
        p.error("--variants belongs to --plan legacy (the cpu plan's cells are fixed)")
    args.variants = VARIANTS if args.variants is None else args.variants
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if min(args.workers) < 1:
        p.error("--workers must be >= 1 (the what-ifs need DataLoader workers)")
    if args.prefetch and legacy:
        p.error("--prefetch belongs to the cpu plan (the legacy plan's variant 'prefetch')")
    if any(f < 1 for f in args.prefetch):
        p.error("--prefetch factors must be >= 1")
    args.prefetch = sorted(set(args.prefetch) - {BASE_PREFETCH})
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
