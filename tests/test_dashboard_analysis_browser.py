"""The analysis plots, notes and compare page in a real headless Chromium: ``tuner serve`` as the demo runs it,
the demo's replay study and a second one (same landscape, another sampler). The browser draws every new plot
of the first study's page (slice, contour, EDF, hypervolume history, best so far by trial and by wall time),
colours them by a categorical knob, writes a note, then ticks both studies on the list and compares them.
Screenshots go to ``test-artifacts/``. Skipped without Chromium or Playwright, unless ``TUNER_REQUIRE_BROWSER=1``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import CHROMIUM_ARGS, chromium_or_skip
from test_newcomer_browser import demo_server  # noqa: F401 (the fixture)

httpx = pytest.importorskip("httpx")

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"
PLOTS = ["slice-plot", "contour-plot", "edf-plot", "hypervolume-plot", "best-trial-plot", "best-time-plot"]
TRACES_JS = "(id) => { const gd = document.getElementById(id); return gd && gd.data ? gd.data.length : 0; }"


def _submit_and_finish(client: Any, spec: dict[str, Any]) -> int:
    response = client.post("/api/studies", json=spec)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def _wait_done(client: Any, ids: list[int], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(client.get(f"/api/studies/{i}").json()["status"] == "completed" for i in ids):
            return
        time.sleep(1)
    pytest.fail(f"studies {ids} did not complete in {timeout_s} s")


@pytest.mark.timeout(400)
def test_analysis_plots_notes_and_compare_in_a_browser(demo_server: str) -> None:  # noqa: F811
    chromium_path = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    spec = yaml.safe_load((REPO / "examples" / "demo-replay.yaml").read_text())
    spec["budget"] = {"trials": 40}
    spec["args"]["delay_ms"] = 20
    client = httpx.Client(base_url=demo_server, timeout=30)
    first = _submit_and_finish(client, spec)
    second = _submit_and_finish(client, {**spec, "name": "demo-replay-random", "sampler": "random", "seed": 1})
    _wait_done(client, [first, second])
    ARTIFACTS.mkdir(exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{demo_server}/studies/{first}")
            page.wait_for_function("() => Number(document.body.dataset.analysisDrawn || 0) >= 1", timeout=60_000)
            for plot in PLOTS:  # the contour waits for the full Plotly bundle
                page.wait_for_function(f"() => ({TRACES_JS})('{plot}') > 0", timeout=60_000)
            assert "Reference point" in page.locator("#hypervolume-note").text_content()
            knob = page.evaluate("() => [...document.getElementById('analysis-color').options].map((o) => o.value)")[1]
            page.select_option("#analysis-color", knob)
            page.wait_for_function(f"() => ({TRACES_JS})('slice-plot') > 1", timeout=30_000)
            page.fill("#study-note-text", "Replayed H200 landscape: **int4** wins below 1% error.")
            page.click("#study-note-save")
            page.wait_for_function("() => document.getElementById('study-note-result').textContent === 'saved'")
            assert "int4" in page.locator("#study-note-view").text_content()
            assert client.get(f"/api/studies/{first}").json()["note"].startswith("Replayed H200")
            page.screenshot(path=str(ARTIFACTS / "dashboard-analysis.png"), full_page=True)

            page.goto(f"{demo_server}/")
            for study_id in (first, second):
                page.check(f'#studies-table tr[data-study-id="{study_id}"] input.compare-pick')
            page.click("#compare-link")
            page.wait_for_function("() => document.body.dataset.compareDrawn === '1'", timeout=60_000)
            assert page.locator("#compare-table tbody tr").count() == 2
            for plot in ("compare-best-plot", "compare-edf-plot", "compare-front-plot"):
                assert page.evaluate(TRACES_JS, plot) == 2
            assert "\u00d7" in page.locator("#compare-table tbody tr").nth(1).text_content()
            page.screenshot(path=str(ARTIFACTS / "dashboard-compare.png"), full_page=True)
        finally:
            browser.close()
    assert not errors, errors
