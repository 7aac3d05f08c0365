"""`dsim report` in a real headless Chromium: the page renders every figure without errors.

Needs Playwright for Python and the Debian ``chromium`` package at
/usr/bin/chromium (``playwright install`` is never needed); skips otherwise.
A full-page screenshot goes to ``test-artifacts/report.png`` (or
``$DSIM_TEST_ARTIFACTS``) so a failing CI run can be looked at.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_report import RUN_A, RUN_B, dsim, write_synthetic_run

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
FIGURES = ["fig-whatif-0", "fig-whatif-1", "fig-whatif-2", "fig-bars", "fig-timeline", "fig-cdf"]

pytestmark = pytest.mark.browser


def _artifacts() -> Path:
    root = os.environ.get("DSIM_TEST_ARTIFACTS")
    return Path(root) if root else Path(__file__).resolve().parents[1] / "test-artifacts"


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
    proc = dsim("report", results, "--out", out, "--timeline-run", "zz_long")
    assert proc.returncode == 0, proc.stderr
    return out


def test_report_renders_in_chromium(browser, report: Path) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1400, "height": 900})
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
    artifacts = _artifacts()
    artifacts.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(artifacts / "report.png"), full_page=True)
    for div_id in FIGURES:
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

    assert page.locator("#summary-table tbody tr.policy").count() == 27
    page.close()
    assert not errors, errors
    assert not requests, f"the report fetched from the network: {requests}"
