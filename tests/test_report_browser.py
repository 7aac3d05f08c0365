"""`dsim report` in a real headless Chromium: the page renders every figure without errors.

Needs Playwright for Python and the Debian ``chromium`` package at
/usr/bin/chromium (``playwright install`` is never needed); skips otherwise.
Full-page screenshots at 1400 and 800 px go to the pytest tmp directory (or
``$DSIM_TEST_ARTIFACTS``) and their paths are printed, so a failing CI run can
be looked at. The layout checks read the drawn page: no figure title or
subplot title overlaps the toolbar, a legend, a menu, a colour bar or another
title.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_dsim_in_process
from test_report import RUN_A, RUN_B, figure_ids, read_report, write_synthetic_run

from dsim.synth import SynthParams, synthesize

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
FIGURES = [
    "fig-whatif-0",
    "fig-whatif-1",
    "fig-whatif-2",
    "fig-bars",
    "fig-scaling",
    "fig-timeline",
    "fig-cdf",
]
WIDTHS = (1400, 800)

# Boxes of every title and of what a title must not cover, per figure, in page pixels.
BOXES_JS = """
id => {
  const d = document.getElementById(id);
  const box = e => { const r = e.getBoundingClientRect();
    return {x: r.left, y: r.top, w: r.width, h: r.height,
            name: (e.getAttribute('class') || e.tagName) + ': '
                  + (e.textContent || '').slice(0, 60)}; };
  const all = sel => Array.from(d.querySelectorAll(sel)).map(box)
    .filter(b => b.w > 0 && b.h > 0);
  return {
    titles: all('.gtitle, .annotation-text-g, .xtitle, .ytitle'),
    others: all('.modebar, .legend .bg, .updatemenu-header-group, .updatemenu-button,'
                + ' .colorbar'),
  };
}
"""

pytestmark = pytest.mark.browser

# The pages are built through dsim's CLI entry point in this process (tests/conftest.py):
# their subject here is what Chromium draws, and fifteen fresh interpreters cost ~1 s of
# start-up each. Every command used (`parse` of one run, `run` in-process, `report`) keeps
# its real-subprocess tests (test_parse_cli, test_run_cli, test_report).
dsim = run_dsim_in_process


def _overlap(a: dict, b: dict, slack: float = 1.0) -> bool:
    """Two boxes share more than ``slack`` pixels both ways."""
    return (
        min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"]) > slack
        and min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"]) > slack
    )


def overlaps(boxes: dict) -> list[tuple[str, str]]:
    """Pairs (title, other element) that overlap; titles among themselves too."""
    titles, others = boxes["titles"], boxes["others"]
    found = [(t["name"], o["name"]) for t in titles for o in others if _overlap(t, o)]
    found += [
        (a["name"], b["name"])
        for i, a in enumerate(titles)
        for b in titles[i + 1 :]
        if _overlap(a, b)
    ]
    return found


def test_overlap_check_finds_overlaps() -> None:
    a = {"x": 0, "y": 0, "w": 100, "h": 20, "name": "title"}
    b = {"x": 90, "y": 10, "w": 50, "h": 20, "name": "modebar"}
    c = {"x": 101, "y": 0, "w": 50, "h": 20, "name": "legend"}
    assert overlaps({"titles": [a], "others": [b]}) == [("title", "modebar")]
    assert overlaps({"titles": [a], "others": [c]}) == []


def _artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("DSIM_TEST_ARTIFACTS")
    return Path(root) if root else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright for Python is not installed"
    )
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian package `chromium`)")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("results")
    write_synthetic_run(results, RUN_A, seed=1, iterations=80)
    write_synthetic_run(results, RUN_B, gpus=2, seed=2)
    # long enough to be downsampled in the page
    write_synthetic_run(results, "zz_long", gpus=8, epochs=2, iterations=3000, seed=3)
    out = tmp_path_factory.mktemp("report") / "report.html"
    proc = dsim("report", results, "--out", out, "--timeline-run", "*")
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("width", WIDTHS)
def test_report_renders_in_chromium(  # type: ignore[no-untyped-def]
    browser, report: Path, width: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on(
        "console",
        lambda msg: (
            errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None
        ),
    )
    page.on(
        "request",
        lambda req: (
            requests.append(req.url) if not req.url.startswith(("file:", "data:")) else None
        ),
    )
    page.goto(report.as_uri(), wait_until="load")
    page.wait_for_function(
        "ids => ids.every(id => { const d = document.getElementById(id);"
        " return d && d._fullLayout && d.querySelector('.main-svg'); })",
        arg=FIGURES,
        timeout=60_000,
    )
    artifacts = _artifacts(tmp_path_factory)
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / f"report-{width}.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    for div_id in FIGURES:
        found = overlaps(page.evaluate(BOXES_JS, div_id))
        assert not found, (width, div_id, found)
        inside = page.evaluate(
            """id => { const d = document.getElementById(id).getBoundingClientRect();
                 return d.right <= document.documentElement.clientWidth + 1; }""",
            div_id,
        )
        assert inside, (width, div_id, "wider than the page")
    # fig-scaling: these traces carry no batch size, so it shows why in words (test_throughput)
    for div_id in [f for f in FIGURES if f != "fig-scaling"]:
        info = page.evaluate(
            """id => { const d = document.getElementById(id);
                 const box = d.getBoundingClientRect();
                 const full = d.calcdata.filter(cd => cd.length && cd[0].x !== false);
                 return { traces: d.data.length, nonempty: full.length,
                          drawn: d.querySelectorAll('.trace, .hm, .heatmaplayer image,'
                                   + ' .gl-container canvas, .point, path.js-line').length,
                          width: box.width, height: box.height }; }""",
            div_id,
        )
        assert info["traces"] > 0 and info["nonempty"] > 0, (div_id, info)
        assert info["drawn"] > 0, (div_id, info)
        assert info["width"] > 300 and info["height"] > 200, (div_id, info)

    # the policy drop-down switches the replayed traces of the timeline
    before = page.evaluate(
        "() => document.getElementById('fig-timeline').data.map(t => t.visible !== false)"
    )
    page.click("#fig-timeline .updatemenu-header-group")
    page.locator(
        "#fig-timeline .updatemenu-dropdown-button .updatemenu-item-text",
        has_text="fetch actual / start avg",
    ).click()
    page.wait_for_timeout(300)
    after = page.evaluate(
        "() => document.getElementById('fig-timeline').data.map(t => t.visible !== false)"
    )
    assert before != after and sum(after) == sum(before)

    # the run switcher shows another run's timeline and CDF, drawn at full width
    page.locator("#timeline select.run-switch").select_option("2")
    page.wait_for_timeout(300)
    for div_id in ("fig-timeline-2", "fig-cdf-2"):
        shown = page.evaluate(
            """id => { const d = document.getElementById(id); const b = d.getBoundingClientRect();
                 return {w: b.width, h: b.height, svg: !!d.querySelector('.main-svg')}; }""",
            div_id,
        )
        assert shown["svg"] and shown["w"] > 0.6 * width - 100 and shown["h"] > 200, shown
        assert not overlaps(page.evaluate(BOXES_JS, div_id)), div_id
    hidden = page.evaluate("() => document.getElementById('fig-timeline').offsetParent === null")
    assert hidden

    assert page.locator("#summary-table tbody tr.policy").count() == 27
    page.close()
    assert not errors, errors
    assert not requests, f"the report fetched from the network: {requests}"


SAMPLE = "cpuDDP_synthetic_none_mlp_epoch2_b128_worker2_thread0"
ATTRIBUTION_FIGURES = ["fig-attr-workers", "fig-attr-last"]


@pytest.fixture(scope="module")
def sample_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of the shipped sample trace under both replay models, as README's
    screenshot is made: verdicts, and attribution figures from the real trace."""
    root = tmp_path_factory.mktemp("sample")
    raw = Path(__file__).parents[1] / "traces" / "raw"
    for args in (
        ("parse", raw, "--out", "traces", "-q"),
        ("run", SAMPLE, "-q"),
        ("run", SAMPLE, "--model", "pipeline", "-q"),
        ("report", "results", "--out", "report.html", "-q"),
    ):
        proc = dsim(*args, cwd=root)
        assert proc.returncode == 0, (args, proc.stderr)
    return root / "report.html"


def _drawn(page, div_id: str) -> dict:  # type: ignore[no-untyped-def]
    return page.evaluate(
        """id => { const d = document.getElementById(id); const b = d.getBoundingClientRect();
             return {traces: d.data.length, svg: !!d.querySelector('.main-svg'),
                     drawn: d.querySelectorAll('.trace, .hm, .heatmaplayer image, .point,'
                                               + ' path.js-line').length,
                     w: b.width, h: b.height,
                     inside: b.right <= document.documentElement.clientWidth + 1}; }""",
        div_id,
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_verdict_and_attribution_render_in_chromium(  # type: ignore[no-untyped-def]
    browser, sample_report: Path, width: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    html = read_report(sample_report)
    assert set(ATTRIBUTION_FIGURES) | {"fig-attr-workers-1", "fig-attr-last-1"} <= figure_ids(
        html
    )  # both model variants offered; one trace
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.goto(sample_report.as_uri(), wait_until="load")
    page.wait_for_function(
        "ids => ids.every(id => { const d = document.getElementById(id);"
        " return d && d._fullLayout && d.querySelector('.main-svg'); })",
        arg=ATTRIBUTION_FIGURES,
        timeout=60_000,
    )
    artifacts = _artifacts(tmp_path_factory)
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / f"sample-report-{width}.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    # the verdict is the first thing below the header: one paragraph per model variant
    first = page.evaluate("() => document.querySelector('main section').id")
    assert first == "verdict"
    says = page.locator("#verdict p.say").all_inner_texts()
    # The per-iteration variant's headline is the pipeline model's (the more accurate for
    # alignment what-ifs), its own number the first line below (docs/SPEC.md §5.1).
    pipeline = "(pipeline replay model; fetch durations assumed independent of load"
    assert len(says) == 2 and pipeline in says[0]
    assert pipeline in says[1]
    items = page.locator("#verdict ul.blame li").all_inner_texts()
    assert len(items) == 5  # the original's number; straggler, workers: per variant
    assert items[0].startswith("the original analysis's per-iteration replay says 2.19×")
    for div_id in ATTRIBUTION_FIGURES:
        info = _drawn(page, div_id)
        assert info["svg"] and info["traces"] > 0 and info["drawn"] > 0, (div_id, info)
        assert info["w"] > 300 and info["h"] > 200 and info["inside"], (div_id, info)
        found = overlaps(page.evaluate(BOXES_JS, div_id))
        assert not found, (width, div_id, found)
    # the run switcher shows the other variant's attribution, drawn at full width
    page.locator("#attribution select.run-switch").select_option("1")
    page.wait_for_timeout(300)
    for div_id in ("fig-attr-workers-1", "fig-attr-last-1"):
        info = _drawn(page, div_id)
        assert info["svg"] and info["w"] > 0.6 * width - 100 and info["h"] > 200, info
        assert not overlaps(page.evaluate(BOXES_JS, div_id)), div_id
    page.close()
    assert not errors, errors


MANY_GPUS, MANY_ITERATIONS = 256, 50
PAGE_DATA_BOUND = 1_000_000
"""Bytes of a page beyond plotly.js at 256 ranks × 50 iterations. The target is 20 MB
at 1024 ranks × 10,000 (BENCHMARKS.md, "Report at scale"), about 15 MB of it data;
drawn as bands and named ranks, the data grows with the points per trace (≤ 5,000),
not with the ranks, so 1/200 of the iterations gets a small fraction of it. One line
per GPU and policy made this page's data 3.8 MB."""
MANY_FIGURES = ["fig-timeline", "fig-cdf", "fig-attr-workers", "fig-attr-last"]


@pytest.fixture(scope="module")
def many_ranks_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic run of 256 ranks, the last ones slowest, through the real CLI."""
    root = tmp_path_factory.mktemp("many")
    # `dsim synth --gpus 256 --iterations 50 --epochs 1 --workers 2 --skew 3 --fetch-cv 0.05
    # --straggler-prob 0 --name many` (its code in-process: tests/test_synth.py runs the CLI)
    shape = {"gpus": MANY_GPUS, "iterations": MANY_ITERATIONS, "epochs": 1, "workers": 2}
    loader = {"skew": 3.0, "fetch_cv": 0.05, "straggler_prob": 0.0}
    synthesize(SynthParams(**shape, **loader, name="many"), root / "logs")
    for args in (
        ("parse", Path("logs") / "many", "--out", "traces", "-q"),
        ("run", "many", "-q"),
        ("report", "results", "--out", "report.html", "-q"),
    ):
        proc = dsim(*args, cwd=root)
        assert proc.returncode == 0, (args, proc.stderr)
    return root / "report.html"


def test_report_at_256_ranks_renders_bands_and_named_stragglers(  # type: ignore[no-untyped-def]
    browser, many_ranks_report: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import plotly

    from dsim.render.figures.ranks import TOP_RANKS

    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    data_bytes = many_ranks_report.stat().st_size - plotly_js.stat().st_size
    assert data_bytes < PAGE_DATA_BOUND, data_bytes
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.goto(many_ranks_report.as_uri(), wait_until="load")
    page.wait_for_function(
        "ids => ids.every(id => { const d = document.getElementById(id);"
        " return d && d._fullLayout && d.querySelector('.main-svg'); })",
        arg=MANY_FIGURES,
        timeout=60_000,
    )
    shot = _artifacts(tmp_path_factory) / "many-ranks-1400.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    timeline = page.evaluate(
        """() => { const d = document.getElementById('fig-timeline');
             return {names: d.data.map(t => t.name), fills: d.data.map(t => t.fill || ''),
                     legend: Array.from(d.querySelectorAll('.legendtext'))
                                  .map(e => e.textContent)}; }"""
    )
    # the spread across GPUs: a filled 10th–90th percentile band, the median and the max
    band = timeline["names"].index("p10–p90 over GPUs")
    assert timeline["fills"][band] == "tonexty"
    assert {"p10–p90 over GPUs", "median over GPUs", "max over GPUs"} <= set(timeline["legend"])
    # the stragglers by name, among the slowest ranks (the last ones, --skew), not every GPU
    named = [t for t in timeline["legend"] if t.startswith("GPU ")]
    assert len(named) == TOP_RANKS, timeline["legend"]
    assert all(int(t.split()[1]) >= MANY_GPUS // 2 and t.endswith("%)") for t in named), named
    assert len(timeline["names"]) < 12 * 9  # bands and named ranks per policy, no line per GPU
    workers = page.evaluate("() => document.getElementById('fig-attr-workers').data[0].y")
    assert len(workers) <= TOP_RANKS + 16 and any(y.startswith("GPUs ") for y in workers)
    bars = page.evaluate("() => document.getElementById('fig-attr-last').data.map(t => t.name)")
    assert any("other GPUs" in b for b in bars) and len(bars) == TOP_RANKS + 2, bars
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(300)
        for div_id in MANY_FIGURES:
            found = overlaps(page.evaluate(BOXES_JS, div_id))
            assert not found, (width, div_id, found)
    page.close()
    assert not errors, errors


# Every text and box a reader must see whole, per figure (plotly's classes), for the layout
# check of issue #22: nothing may overlap anything else, nothing may stick out of its figure.
LAYOUT_JS = """
() => {
  const out = [];
  const box = (e, kind, fig) => { const r = e.getBoundingClientRect();
    return {x: r.left, y: r.top, w: r.width, h: r.height, kind: kind, fig: fig,
            name: kind + ' ' + fig + ': ' + (e.textContent || '').slice(0, 50)}; };
  const kinds = [
    ['title', '.gtitle'], ['note', '.annotation-text-g'], ['axis-title', '.xtitle, .ytitle'],
    // every axis's ticks: plotly's groups are xtick, x2tick, …, ytick, y2tick, …
    ['xtick', 'g[class^="x"][class$="tick"] > text'],
    ['ytick', 'g[class^="y"][class$="tick"] > text'], ['legend', '.legend .bg'],
    ['toolbar', '.modebar'], ['menu', '.updatemenu-header-group, .updatemenu-button'],
    ['colorbar', '.colorbar'],
    // heatmap cells' own labels (what-if, worker and tune heatmaps): numbers must not run into
    // each other, a title, a legend or a colour bar
    ['cell', '.heatmap-label text'],
  ];
  document.querySelectorAll('.js-plotly-plot').forEach(d => {
    if (d.offsetParent === null) { return; }  // a run the switcher hides
    const fig = d.id || d.parentElement.id;
    const frame = d.getBoundingClientRect();
    out.push({x: frame.left, y: frame.top, w: frame.width, h: frame.height, kind: 'figure',
              fig: fig, name: 'figure ' + fig});
    kinds.forEach(([kind, sel]) => d.querySelectorAll(sel).forEach(e => {
      if (kind !== 'colorbar' && e.closest('.colorbar')) { return; }  // its own ticks
      const b = box(e, kind, fig);
      if (b.w > 0 && b.h > 0) { out.push(b); }
    }));
  });
  return out;
}
"""
# Pairs that may touch: a tick label and its own axis title are apart by plotly's
# automargin; a menu's buttons sit in its header group.
MAY_TOUCH = {("menu", "menu"), ("ytick", "ytick"), ("xtick", "xtick")}


def layout_defects(boxes: list[dict]) -> list[str]:
    """Overlapping texts or boxes within a figure, and texts sticking out of their figure
    (a subtitle cut off at 800 px). Run labels under the bars (x tick labels at one
    height) must keep 2 px apart: touching, "b256" and "defau…" read as one word."""
    frames = {b["fig"]: b for b in boxes if b["kind"] == "figure"}
    items = [b for b in boxes if b["kind"] != "figure"]
    found = []
    for b in items:
        f = frames[b["fig"]]
        if b["kind"] != "toolbar" and (
            b["x"] < f["x"] - 1 or b["x"] + b["w"] > f["x"] + f["w"] + 1
        ):
            found.append(f"{b['name']!r} sticks out of its figure")
    for i, a in enumerate(items):
        for b in items[i + 1 :]:
            pair = (a["kind"], b["kind"])
            ticks = pair == ("xtick", "xtick") and abs(a["y"] - b["y"]) < 1
            if a["fig"] != b["fig"] or not _overlap(a, b, slack=-2.0 if ticks else 1.0):
                continue
            if pair in MAY_TOUCH and not ticks:
                continue
            found.append(f"{a['name']!r} overlaps {b['name']!r}")
    return found


def test_layout_check_finds_overlaps_and_cut_texts() -> None:
    fig = {"x": 0, "y": 0, "w": 500, "h": 400, "kind": "figure", "fig": "f", "name": "f"}

    def item(kind: str, x: float, y: float, w: float = 60, h: float = 14) -> dict:
        return {"x": x, "y": y, "w": w, "h": h, "kind": kind, "fig": "f", "name": kind}

    assert layout_defects([fig, item("note", 10, 300), item("xtick", 20, 305)]) == [
        "'note' overlaps 'xtick'"
    ]
    assert layout_defects([fig, item("xtick", 10, 300), item("xtick", 50, 300)]) == [
        "'xtick' overlaps 'xtick'"
    ]
    assert layout_defects([fig, item("title", 10, 10, w=600)]) == [
        "'title' sticks out of its figure"
    ]
    assert layout_defects([fig, item("legend", 400, 50), item("xtick", 10, 300)]) == []
    # two heatmap cells whose numbers run into each other; a cell text under a colour bar
    assert layout_defects([fig, item("cell", 10, 100), item("cell", 60, 100)]) == [
        "'cell' overlaps 'cell'"
    ]
    assert layout_defects([fig, item("cell", 10, 100), item("colorbar", 40, 90)]) == [
        "'cell' overlaps 'colorbar'"
    ]
    assert layout_defects([fig, item("cell", 10, 100), item("cell", 80, 100)]) == []


@pytest.fixture(scope="module")
def layout_reports(sample_report: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The shipped sample (both models), a 16-GPU synthetic run and a profiler run named
    with markup (`<b>`, `&`) and without the run name's b<B> (so its throughput note,
    which names ``b<B>``, is shown), all through the real CLI."""
    root = tmp_path_factory.mktemp("layout")
    profiler = (
        Path(__file__).parents[1] / "traces" / "profiler" / SAMPLE.replace("epoch2", "epoch1")
    )
    # `dsim synth --gpus 16 --iterations 120 --epochs 1 --workers 2 --skew 1 --name synth16`
    params = SynthParams(gpus=16, iterations=120, epochs=1, workers=2, skew=1.0, name="synth16")
    synthesize(params, root / "gpus16" / "logs")
    steps = {
        "gpus16": (
            ("parse", Path("logs") / "synth16", "--out", "traces", "-q"),
            ("run", "synth16", "-q"),
        ),
        "profiler": (
            ("parse", profiler, "--name", PROFILED, "--out", "traces", "-q"),
            ("run", PROFILED, "-q"),
        ),
    }  # fmt: skip
    reports = {"sample": sample_report}
    # eight runs: their labels under the bars must fit side by side at 800 px, unrotated
    cwd = root / "runs8"
    names = [RUN_A, RUN_B] + [
        f"fsNprepNloadNtrain_imagenet_default_resnet{d}_epoch2_b256_worker{w}_thread0"
        for d, w in ((18, 4), (34, 8), (50, 12), (101, 16), (152, 2), (50, 24))
    ]
    for seed, name in enumerate(names):
        write_synthetic_run(cwd / "results", name, seed=seed, iterations=30)
    proc = dsim("report", "results", "--out", "report.html", "-q", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    reports["runs8"] = cwd / "report.html"
    for name, commands in steps.items():
        cwd = root / name
        cwd.mkdir(exist_ok=True)
        for args in (*commands, ("report", "results", "--out", "report.html", "-q")):
            proc = dsim(*args, cwd=cwd)
            assert proc.returncode == 0, (args, proc.stderr)
        reports[name] = cwd / "report.html"
    return reports


PROFILED = "prof<b>x&y"
"""A legal run name that is also markup: the page must show it as text."""


@pytest.mark.parametrize("which", ["sample", "gpus16", "profiler", "runs8"])
def test_report_layout_has_no_overlaps_at_1400_and_800_px(  # type: ignore[no-untyped-def]
    browser, layout_reports: dict, which: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Issue #22: no overlapping texts (heatmap cell numbers included), legends, menus or
    toolbars in any figure, no text cut off at the figure's edge, and a runs table that
    does not scroll sideways."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.goto(layout_reports[which].as_uri(), wait_until="load")
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
        ".every(d => d._fullLayout && d.querySelector('.main-svg'))",
        timeout=60_000,
    )
    artifacts = _artifacts(tmp_path_factory)
    artifacts.mkdir(parents=True, exist_ok=True)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(400)  # plotly's responsive relayout
        shot = artifacts / f"layout-{which}-{width}.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
        boxes = page.evaluate(LAYOUT_JS)
        defects = layout_defects(boxes)
        assert not defects, (which, width, defects)
        # the heatmaps' cell numbers were drawn, so the check above looked at them
        assert any(b["kind"] == "cell" for b in boxes), (which, width, "no heatmap cell text")
        scroll = page.evaluate(
            "() => { const t = document.querySelector('#runs .table-wrap');"
            " return [t.scrollWidth, t.clientWidth]; }"
        )
        assert scroll[0] <= scroll[1] + 1, (which, width, "runs table scrolls sideways", scroll)
    if which == "profiler":
        # markup in a run name and in the throughput note is shown as text, not bold
        texts = page.evaluate(
            "() => [document.querySelector('#runs-table').innerText,"
            " document.querySelector('#fig-scaling').textContent,"
            " document.querySelector('#fig-timeline .gtitle').textContent,"
            " document.querySelectorAll('main b').length]"
        )
        assert PROFILED in texts[0] and PROFILED in texts[2]
        assert "b<B>" in texts[1]  # "(no loader line, Throughput field or b<B> in the run name)"
        # the <b> of the page's own notes only (actual / actual, stall-min, stall-avg)
        assert texts[3] == 3
    footer = page.locator("footer").inner_text()
    section = {"sample": "§4.2", "gpus16": "§4.1", "profiler": "§4.3", "runs8": "§4.1"}[which]
    assert section in footer
    if which == "profiler":  # a stall-only report does not cite the per-iteration model
        assert "§4.1" not in footer
    page.close()
    assert not errors, errors
