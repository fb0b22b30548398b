"""The newcomer's path in a real headless Chromium: ``tuner serve`` as the demo starts it (loopback, no token),
the demo's replay study submitted, its page opened at once.

Asserts that the page's Pareto front has more than one point within 60 s of the submit (the moment the demo
prints the URL), that the page says the measurements are replayed, that Stop and Resume work from the page
with no token box, and that ``/docs`` and ``/redoc`` render with no request leaving the server (the page's
network log). Skipped without Chromium or Playwright, unless ``TUNER_REQUIRE_BROWSER=1``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import CHROMIUM_ARGS, chromium_or_skip
from test_dashboard_e2e import _free_port, _stop, _wait_for

httpx = pytest.importorskip("httpx")

REPO = Path(__file__).resolve().parent.parent
#: The demo's promise: the front fills in within this many seconds of the URL (on a machine that is not
#: overloaded: ``TUNER_TEST_FRONT_S`` gives a shared one more).
FRONT_WITHIN_S = float(os.environ.get("TUNER_TEST_FRONT_S", "60"))
FRONT_POINTS_JS = """() => {
  const gd = document.getElementById('pareto-plot');
  const front = gd && gd.data ? gd.data.find((t) => t.name === 'Pareto front') : null;
  return front ? front.x.length : 0;
}"""


@pytest.fixture
def demo_server(tmp_path: Path) -> Iterator[str]:
    """``tuner serve`` as scripts/demo.sh runs it without a GPU: loopback, no token, the interpreter."""
    port = _free_port()
    log_path = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if k != "TUNER_API_TOKEN"}
    env.update(PYTHONUNBUFFERED="1", TRITON_INTERPRET="1")
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    cmd = [sys.executable, "-m", "tuner.cli", "serve", "--port", str(port), "--db", db]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"tuner serve exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"tuner serve did not answer /healthz in 90 s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.3)
        yield base
    finally:
        _stop(proc)


def _status(page: Any) -> str:
    return page.evaluate("() => document.body.dataset.studyStatus")


@pytest.mark.timeout(300)
def test_the_demo_page_fills_its_front_stops_resumes_and_the_docs_work_offline(demo_server: str) -> None:
    chromium_path = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    spec = yaml.safe_load((REPO / "examples" / "demo-replay.yaml").read_text())
    # The demo's study with a larger budget, so that it still runs when the test stops it.
    spec["budget"] = {"trials": 300, "minutes": 5}
    spec["args"]["delay_ms"] = 250
    client = httpx.Client(base_url=demo_server, timeout=30)

    requests: list[str] = []
    page_errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.on("request", lambda r: requests.append(r.url))
            blocked: set[str] = set()
            context.on(
                "requestfailed",
                # Chromium's reason for a request it refused to send: "csp" (the page's policy), net::ERR_BLOCKED_BY_*
                lambda r: blocked.add(r.url) if (r.failure or "") == "csp" or "BLOCKED" in (r.failure or "") else None,
            )
            page = context.new_page()
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            # The browser is up before the clock starts: the demo's user has one open when the URL appears.
            submitted = time.monotonic()
            response = client.post("/api/studies", json=spec)  # no token: the server has none
            assert response.status_code == 202, response.text
            study_id = response.json()["id"]
            page.goto(f"{demo_server}/studies/{study_id}")

            # The front: more than one point within the demo's promise.
            try:
                more_than_one = f"() => {{ const n = ({FRONT_POINTS_JS})(); return n > 1 ? n : 0; }}"
                points = _wait_for(page, more_than_one, FRONT_WITHIN_S, "a front of more than one point")
            except AssertionError as exc:
                study = client.get(f"/api/studies/{study_id}").json()
                raise AssertionError(f"{exc}; the study: {study['status']}, counts {study['counts']}") from None
            front_s = time.monotonic() - submitted
            print(f"the demo page's front had {points} points {front_s:.1f} s after the submit")
            assert front_s <= FRONT_WITHIN_S
            note = page.locator("#provenance-note").inner_text()
            assert note.startswith("Replayed, recorded on NVIDIA H200")
            ticking = page.locator("#study-elapsed").inner_text()

            # Stop and Resume from the page: no token box on a server without a token.
            assert page.locator("#api-token").count() == 0
            assert _status(page) == "running"
            page.locator("#controls summary").click()
            page.locator("#stop-button").click()
            _wait_for(page, "() => document.body.dataset.studyStatus === 'stopped'", 90, "the study to stop")
            assert "stop requested" in page.locator("#control-result").inner_text()
            # The hardware panel (drawn again as the study stops): the recorded GPU's fingerprint, said to be
            # replayed; the CPU only answered the trials.
            expected = "replayed, recorded on NVIDIA H200; the device below only answered the trials"
            _wait_for(page, f"() => document.getElementById('fingerprint').textContent.includes({expected!r})", 30,
                      "the hardware panel to say replayed")  # fmt: skip
            assert "replayed_on" in (page.locator("#fingerprint").text_content() or "")
            measured = client.get(f"/api/studies/{study_id}").json()["measured"]
            assert 0 < measured < 300
            page.locator("#resume-button").click()
            _wait_for(
                page,
                "() => ['queued', 'running'].includes(document.body.dataset.studyStatus)",
                30,
                "the study to be queued again",
            )
            assert "resume requested" in page.locator("#control-result").inner_text()
            _wait_for(page, "() => document.body.dataset.studyStatus === 'running'", 60, "the study to run again")
            assert page.locator("#study-elapsed").inner_text() != ticking  # the clock moved on
            client.post(f"/api/studies/{study_id}/stop")

            # The API docs, offline: every request the pages make goes to the server itself.
            requests.clear()
            page.goto(f"{demo_server}/docs")
            page.wait_for_selector(".swagger-ui .opblock", timeout=30_000)
            assert page.locator(".swagger-ui .btn.authorize").count() == 1  # the bearer scheme
            page.goto(f"{demo_server}/redoc")
            page.wait_for_selector(".redoc-wrap .api-content", timeout=60_000)
            assert "Queue a study" in page.locator(".redoc-wrap").inner_text()
            # Sent: a request to another origin that the browser did not block itself (the docs' policy blocks
            # ReDoc's CDN logo before it leaves; ReDoc then drops the image).
            local = (demo_server, f"blob:{demo_server}", "data:")
            sent = [url for url in requests if not url.startswith(local) and url not in blocked]
            assert not sent, sent
            assert any(url.endswith("/docs-assets/swagger-ui-bundle.js") for url in requests)
        finally:
            browser.close()
    assert not page_errors, page_errors
