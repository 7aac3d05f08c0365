"""Other recommendation rules for `dsim tune`, judged on the committed sweeps' measured grids.

Not part of dsim: kept so that the table in validation/README.md, "Fewer workers"
(other rules for tune's pick), can be re-run. `dsim tune` recommends the cheapest
setting (fewest workers, then smallest prefetch) whose predicted iteration time is
within 2 % of the best predicted. Here every base run that validation.compare's tune
check judges is given to `dsim.app.tune.tune_run` once, its whole predicted curve is
kept, and each rule below picks from that same curve; a pick is judged as the tune
check judges it (its measured mean within 5 % of the measured best).

    python validation/prototypes/tune_rules.py validation/data-cpu validation/data-holdout ...
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from dsim.app.tune import tune_run  # noqa: E402
from validation.cells import group_runs, parse_run_name  # noqa: E402
from validation.compare import BASELINE, dsim, unpack_logs  # noqa: E402
from validation.manifest import BASE_PREFETCH, load_manifest  # noqa: E402
from validation.predict import predict_per_iteration  # noqa: E402
from validation.tunecheck import TARGET_PCT, measured_grids  # noqa: E402

Setting = tuple[int, int]
Curve = dict[Setting, float]


def cheapest_within(curve: Curve, pct: float) -> Setting:
    best = min(curve.values())
    return min(s for s, v in curve.items() if v <= best * (1 + pct / 100))


def most_within(curve: Curve, pct: float) -> Setting:
    best = min(curve.values())
    return max(s for s, v in curve.items() if v <= best * (1 + pct / 100))


def stay_within(curve: Curve, measured: Setting, pct: float) -> Setting:
    """The recorded setting while it is predicted within ``pct`` % of the best; else tune's."""
    if measured in curve and curve[measured] <= min(curve.values()) * (1 + pct / 100):
        return measured
    return cheapest_within(curve, 2.0)


RULES: dict[str, Callable[[Curve, Setting], Setting]] = {
    "cheapest within 0 % (the best predicted)": lambda c, m: cheapest_within(c, 0.0),
    "cheapest within 1 %": lambda c, m: cheapest_within(c, 1.0),
    "cheapest within 2 % (shipped)": lambda c, m: cheapest_within(c, 2.0),
    "cheapest within 3 %": lambda c, m: cheapest_within(c, 3.0),
    "cheapest within 5 %": lambda c, m: cheapest_within(c, 5.0),
    "most workers within 1 %": lambda c, m: most_within(c, 1.0),
    "most workers within 2 %": lambda c, m: most_within(c, 2.0),
    "the recorded setting while within 3 %": lambda c, m: stay_within(c, m, 3.0),
}


def curves_of(data: Path) -> list[tuple[str, Setting, Curve, dict[Setting, float]]]:
    """(regime, recorded setting, predicted curve, measured means) per judged base run."""
    runs = load_manifest(data)["runs"]
    names = [
        n for n in runs
        if any((data / n).glob("rank*.log*"))
        and parse_run_name(n).cell.align == "none" and parse_run_name(n).cell.start is None
    ]  # fmt: skip
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for n in names:
            unpack_logs(data / n, work / "logs" / n)
        dsim("parse", str(work / "logs"), "--out", str(work / "traces"), "--quiet")
        for n in names:
            if (data / n / "job.json").is_file():
                shutil.copy(data / n / "job.json", work / "traces" / n / "job.json")
        conf = {"FILE": names, "FETCH_ALIGN": [False], "START_ALIGN": [False]}
        conf |= {"traces": str(work / "traces"), "out": str(work / "results")}
        (work / "conf.json").write_text(json.dumps(conf | {"executor": "local"}))
        dsim("run", "--conf", str(work / "conf.json"), "--quiet")
        ms = {
            n: predict_per_iteration(work / "results", n, BASELINE)["iteration_ms"] for n in names
        }
        grids = measured_grids(names, ms)
        for cell, cell_runs in group_runs(names).items():
            grid = grids.get(cell.regime, {})
            workers = sorted({w for w, _ in grid})
            if cell.prefetch != BASE_PREFETCH or len(workers) < 2:
                continue
            prefetch = sorted(
                p for p in {p for _, p in grid} if all((w, p) in grid for w in workers)
            )
            means = {k: s.mean for k, s in grid.items() if k[1] in prefetch}
            for run in cell_runs:
                result = tune_run(work / "traces" / run, workers=workers, prefetch=prefetch,
                                  alignment=False)  # fmt: skip
                curve = {(p.workers, p.prefetch): p.mean_iteration_s for p in result.alone}
                out.append((cell.regime, (cell.workers, cell.prefetch), curve, means))
    return out


def main(argv: list[str]) -> int:
    picks = {name: [0, 0] for name in RULES}
    regimes: dict[str, dict[tuple[str, str], bool]] = {name: {} for name in RULES}
    for d in argv:
        for regime, recorded, curve, means in curves_of(Path(d)):
            best = min(means.values())
            for name, rule in RULES.items():
                ok = (means[rule(curve, recorded)] - best) / best * 100 <= TARGET_PCT
                picks[name][0] += ok
                picks[name][1] += 1
                key = (d, regime)
                regimes[name][key] = regimes[name].get(key, True) and ok
    print("| rule | picks within 5 % of the measured best | regimes with every pick within 5 % |")
    print("|---|---|---|")
    for name in RULES:
        r = regimes[name]
        print(f"| {name} | {picks[name][0]}/{picks[name][1]} | {sum(r.values())}/{len(r)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
