"""The HTML report at scale: its size and the time headless Chromium takes to draw it.

Makes a synthetic run of GPUS ranks x ITERATIONS iterations (`dsim synth` → `dsim
parse` → `dsim run`, untimed, cached under --work), times `dsim report`, then opens
the page in headless Chromium (/usr/bin/chromium through Playwright, as
tests/test_report_browser.py drives it) and times load → every figure drawn
(a `.main-svg` in each plotly div). Prints one JSON object; BENCHMARKS.md's
"Report at scale" section is its output.

    python bench/bench_report.py --gpus 1024 --iterations 10000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
DRAWN = (
    "() => { const ds = Array.from(document.querySelectorAll('.js-plotly-plot'));"
    " return ds.length > 0 && ds.every(d => d._fullLayout && d.querySelector('.main-svg')); }"
)


def dsim(*args: object, cwd: Path) -> float:
    """Run the CLI; seconds it took. Fails loudly: a benchmark of a failed run is no number."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dsim", *map(str, args)], cwd=cwd, check=True)
    return time.perf_counter() - start


def make_run(work: Path, gpus: int, iterations: int) -> str:
    """The synthetic run's results under ``work`` (made once); its name."""
    name = f"scale_g{gpus}_i{iterations}"
    if not (work / "results" / name / "result.json").is_file():
        work.mkdir(parents=True, exist_ok=True)
        common = ["--workers", "2", "--skew", "0.5", "--name", name, "-q"]
        dsim("synth", "--gpus", gpus, "--iterations", iterations, "--epochs", 1, "--out", "logs",
             *common, cwd=work)  # fmt: skip
        dsim("parse", Path("logs") / name, "--out", "traces", "-q", cwd=work)
        dsim("run", name, "--traces", "traces", "--out", "results", "-q", cwd=work)
    return name


def render_seconds(page_path: Path, timeout_s: float) -> float:
    """Seconds from navigation to every figure drawn, in a fresh headless Chromium page."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            start = time.perf_counter()
            page.goto(page_path.as_uri(), wait_until="load", timeout=timeout_s * 1000)
            page.wait_for_function(DRAWN, timeout=timeout_s * 1000)
            return time.perf_counter() - start
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument(
        "--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "dsim-bench-report"
    )
    parser.add_argument(
        "--results", type=Path, help="an existing results directory to report (no synthetic run)"
    )
    parser.add_argument("--traces", type=Path, help="its parsed runs (with --results)")
    parser.add_argument("--repeats", type=int, default=1, help="renders; the best is reported")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    out = args.work / "report.html"
    if args.results is not None:
        traces = ["--traces", args.traces.resolve()] if args.traces else []
        report_s = dsim(
            "report", args.results.resolve(), *traces, "--out", out, "-q", cwd=args.work
        )
    else:
        name = make_run(args.work, args.gpus, args.iterations)
        report_s = dsim("report", "results", "--run", name, "--out", out, "-q", cwd=args.work)
    renders = [render_seconds(out, args.timeout) for _ in range(args.repeats)]
    print(
        json.dumps(
            {
                "results": str(args.results) if args.results else None,
                "gpus": None if args.results else args.gpus,
                "iterations": None if args.results else args.iterations,
                "html_bytes": out.stat().st_size,
                "report_s": round(report_s, 2),
                "render_s": [round(r, 2) for r in renders],
                "load_average": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
