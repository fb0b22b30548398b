"""End to end: ``tuner serve`` (uvicorn + a real orchestrator), a real noop study, a real headless Chromium.

The browser opens the study page while the study runs, waits for the Pareto plot to carry every
finished feasible trial, clicks a point with the mouse, checks the selected-trial panel, downloads
that trial's export through the page's link and checks it is that trial's config. A full-page
screenshot goes to ``test-artifacts/dashboard-study.png``.

Skipped when Chromium or Playwright is missing, unless ``TUNER_REQUIRE_BROWSER=1`` (then it fails).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CHROMIUM_ARGS, chromium_or_skip

httpx = pytest.importorskip("httpx")

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"
TOKEN = "test-token"
SPEC = {
    "name": "e2e-noop",
    "workload": "noop",
    "args": {"sleep_ms": 50},
    "objectives": [{"metric": "score"}, {"metric": "cost"}],
    "budget": {"trials": 16},
    "seed": 0,
}
# A categorical choice that is markup: trials that draw it fail (noop knows no such mode) with an error
# that repeats it, and it is a tick label of the parallel-coordinates plot. It must show as text only.
HOSTILE = '<img src=x onerror="window.__pwned=1">'
HOSTILE_SPEC = {
    "name": "e2e-hostile",
    "workload": "noop",
    "objectives": [{"metric": "score"}, {"metric": "cost"}],
    "space": {"mode": {"choices": ["balanced", "fast", HOSTILE]}},
    "budget": {"trials": 8},
    "seed": 1,
}


def _chromium() -> str:
    return chromium_or_skip()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc), children before grandchildren."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    queue = [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            out.append(child)
            queue.append(child)
    return out


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop ``tuner serve``: SIGTERM its process group (it stops its runner, which stops its Ray), wait,
    then SIGKILL whatever it started that is still alive (the runner runs in a session of its own)."""
    started = _descendants(proc.pid) if Path("/proc").is_dir() else []
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=45)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    deadline = time.monotonic() + 15
    for pid in started:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """``python -m tuner.cli serve`` on a free port with a fresh SQLite file; yields its base URL."""
    port = _free_port()
    log_path = tmp_path / "server.log"
    env = dict(os.environ, TUNER_API_TOKEN=TOKEN, PYTHONUNBUFFERED="1")
    env.setdefault("TRITON_INTERPRET", "1")
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--db",
        f"sqlite:///{tmp_path / 'e2e.db'}",
    ]
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


def _wait_for(page: Any, predicate_js: str, timeout_s: float, what: str, arg: Any = None) -> Any:
    """Poll ``predicate_js`` (a JS function of ``arg``) in the page until it returns a truthy value."""
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = page.evaluate(predicate_js, arg)
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; last value {value!r}")


PARETO_POINTS_JS = """() => {
  const gd = document.getElementById('pareto-plot');
  if (!gd || !gd.data) return null;
  const trace = gd.data.find((t) => t.name === 'trials');
  return trace ? Array.from(trace.customdata) : null;
}"""

POINT_PIXEL_JS = """(number) => {
  // Page pixel of a trial's point in the 'trials' trace: axis value -> plot pixel -> page pixel.
  const gd = document.getElementById('pareto-plot');
  const trace = gd.data.find((t) => t.name === 'trials');
  const i = Array.from(trace.customdata).indexOf(number);
  const fl = gd._fullLayout;
  const box = gd.getBoundingClientRect();
  return {
    x: box.left + fl._size.l + fl.xaxis.l2p(trace.x[i]),
    y: box.top + fl._size.t + fl.yaxis.l2p(trace.y[i]),
  };
}"""


def _feasible_numbers(client: Any, study_id: int) -> list[int]:
    items = client.get(f"/api/studies/{study_id}/trials", params={"limit": 1000}).json()["items"]
    return sorted(
        t["number"] for t in items if t["status"] == "ok" and t["feasible"] is True and t["duplicate_of"] is None
    )


def _pick_isolated(points: list[int], page: Any) -> int:
    """The trial whose point lies farthest from every other (a click there can only hit it)."""
    pixels = {n: page.evaluate(POINT_PIXEL_JS, n) for n in points}

    def clearance(n: int) -> float:
        p = pixels[n]
        others = [(q["x"] - p["x"]) ** 2 + (q["y"] - p["y"]) ** 2 for m, q in pixels.items() if m != n]
        return min(others, default=1e9)

    return max(points, key=clearance)


@pytest.mark.timeout(300)
def test_study_page_in_a_real_browser(server: str) -> None:
    chromium_path = _chromium()
    from playwright.sync_api import sync_playwright

    client = httpx.Client(base_url=server, timeout=30)
    ids = []
    for spec in (SPEC, HOSTILE_SPEC):
        response = client.post("/api/studies", json=spec, headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code in (200, 201, 202), response.text
        ids.append(int(response.json()["id"]))
    study_id, hostile_id = ids

    ARTIFACTS.mkdir(exist_ok=True)
    page_errors: list[str] = []
    failed_requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
            page = context.new_page()
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.on("console", lambda msg: page_errors.append(msg.text) if msg.type == "error" else None)
            page.on("response", lambda r: failed_requests.append(f"{r.status} {r.url}") if r.status >= 400 else None)

            # The studies page lists the study, with a link to its page.
            page.goto(f"{server}/")
            page.wait_for_selector(f'#studies-table tr[data-study-id="{study_id}"]', timeout=30_000)
            row = page.locator(f'#studies-table tr[data-study-id="{study_id}"]')
            assert "e2e-noop" in row.inner_text()
            assert row.locator("a").get_attribute("href").endswith(f"/studies/{study_id}")

            # The study page, opened while the study is queued or running.
            page.goto(f"{server}/studies/{study_id}")
            page.wait_for_selector("#pareto-plot .main-svg", timeout=30_000)
            opened_as = page.evaluate("() => document.body.dataset.studyStatus")

            # Live updates: the page's own polling/events bring every trial in, until the study ends.
            _wait_for(
                page,
                "() => ['completed', 'stopped', 'failed'].includes(document.body.dataset.studyStatus)",
                180,
                "the study page to show a terminal status",
            )
            status = client.get(f"/api/studies/{study_id}").json()["status"]
            assert status == "completed", status
            print(f"study page opened while the study was {opened_as!r}; it updated itself to 'completed'")
            assert page.locator("#study-status").inner_text() == "completed"
            feasible = _feasible_numbers(client, study_id)
            assert len(feasible) >= 5, feasible
            points = _wait_for(
                page,
                f"() => {{ const p = ({PARETO_POINTS_JS})(); return p && p.length === {len(feasible)} ? p : null; }}",
                30,
                f"{len(feasible)} points in the Pareto plot",
            )
            assert sorted(points) == feasible

            # Every chart drew (Plotly writes this note where WebGL, for parcoords, cannot start). The parallel
            # plot needs Plotly's full bundle, which the page loads only for it: wait for that plot's drawing.
            page.wait_for_selector("#parallel-plot .main-svg", timeout=30_000)
            assert "WebGL is not supported" not in page.locator("main").text_content()
            assert "tile" in page.locator("#parallel-plot").text_content()

            # The history plot has one point per feasible trial, and the table one row per trial.
            history = page.evaluate(
                "() => document.getElementById('history-plot').data.find((t) => t.name === 'score').x.length"
            )
            assert history == len(feasible)
            total = client.get(f"/api/studies/{study_id}/trials").json()["total"]
            assert page.locator("#trial-table tbody tr").count() == total

            # Click a point with the real mouse: Plotly's hover picks it, the click selects it.
            chosen = _pick_isolated(points, page)
            pixel = page.evaluate(POINT_PIXEL_JS, chosen)
            page.mouse.move(pixel["x"] + 3, pixel["y"] + 3)
            page.mouse.move(pixel["x"], pixel["y"])
            page.mouse.click(pixel["x"], pixel["y"])
            panel = page.locator("#selected-trial")
            page.wait_for_function(
                "(n) => document.getElementById('selected-trial').dataset.trial === String(n)", arg=chosen
            )
            page.wait_for_selector("#export-link")
            assert f"Trial #{chosen}" in panel.locator("#selected-trial-title").inner_text()
            trial = client.get(f"/api/studies/{study_id}/trials/{chosen}").json()
            panel_text = panel.inner_text()
            for name, value in trial["params"].items():
                assert name in panel_text
                assert str(value) in panel_text or isinstance(value, float)

            # The export link is a real download of that trial's config.
            link = page.locator("#export-link")
            assert link.get_attribute("download") is not None
            assert f"trial={chosen}" in link.get_attribute("href")
            with page.expect_download(timeout=30_000) as download_info:
                link.click()
            download = download_info.value
            document = json.loads(Path(download.path()).read_text())
            assert document["trial"] == chosen
            assert document["study_id"] == study_id
            assert document["params"] == trial["params"]
            assert document["metrics"]["score"] == pytest.approx(trial["metrics"]["score"])

            # Let the last redraws settle, then keep a picture of the page for people to look at.
            page.wait_for_timeout(500)
            page.screenshot(path=str(ARTIFACTS / "dashboard-study.png"), full_page=True)

            # Markup in user strings stays text: in the trial table, the failure texts and Plotly's ticks.
            page.goto(f"{server}/studies/{hostile_id}")
            _wait_for(
                page,
                "() => ['completed', 'stopped', 'failed'].includes(document.body.dataset.studyStatus)",
                120,
                "the hostile study to end",
            )
            page.wait_for_selector("#parallel-plot .main-svg", timeout=30_000)
            page.wait_for_timeout(500)
            assert page.evaluate("() => window.__pwned") is None
            assert page.locator('img[src="x"]').count() == 0
            assert HOSTILE in page.locator("#parallel-plot").text_content()
            trials = client.get(f"/api/studies/{hostile_id}/trials").json()["items"]
            drew_it = [t["number"] for t in trials if t["params"].get("mode") == HOSTILE]
            if drew_it:
                assert HOSTILE in page.locator("#trial-table").text_content()
                page.locator("#failures details summary").first.click()
                assert HOSTILE in page.locator("#failures").text_content()
                page.locator(f'#trial-table tr[data-trial="{drew_it[0]}"]').click()
                page.wait_for_selector("#selected-trial-title")
                assert HOSTILE in page.locator("#selected-trial").text_content()
            assert page.evaluate("() => window.__pwned") is None
            assert page.locator('img[src="x"]').count() == 0
            page.screenshot(path=str(ARTIFACTS / "dashboard-hostile.png"), full_page=True)

            # Back on the studies page, both studies show as completed.
            page.goto(f"{server}/")
            page.wait_for_selector(f'#studies-table tr[data-study-id="{study_id}"] .badge.status-completed')
            assert page.locator(f'#studies-table tr[data-study-id="{hostile_id}"]').count() == 1
            page.screenshot(path=str(ARTIFACTS / "dashboard-index.png"), full_page=True)
        finally:
            browser.close()
    client.close()
    assert not failed_requests, failed_requests
    assert not page_errors, page_errors


def _wait_completed(client: Any, study_id: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while (status := client.get(f"/api/studies/{study_id}").json()["status"]) not in ("completed", "stopped", "failed"):
        assert time.monotonic() < deadline, f"study {study_id} still {status}"
        time.sleep(0.5)
    assert status == "completed", status


@pytest.mark.timeout(300)
def test_registry_page_in_a_real_browser(server: str, tmp_path: Path) -> None:
    """A study publishes its pick, a second warm-starts from it, a recheck flags it regressed, an entry of
    older software is unverified: the registry page shows and filters them, the study page the origins."""
    chromium_path = _chromium()
    from playwright.sync_api import sync_playwright
    from test_configs import gemm_config, measured_study

    from tuner.best_configs import registry as configs
    from tuner.run import jobs
    from tuner.store.storage import StudyDB

    db_url = f"sqlite:///{tmp_path / 'e2e.db'}"
    client = httpx.Client(base_url=server, timeout=30)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    base = {"workload": "noop", "objectives": [{"metric": "score"}], "budget": {"trials": 6}}
    first = client.post("/api/studies", json={**base, "name": "registry-first", "seed": 0}, headers=auth).json()
    _wait_completed(client, first["id"])
    warm = {**base, "name": "registry-warm", "seed": 1, "warm_start": "registry"}
    second = client.post("/api/studies", json=warm, headers=auth).json()
    _wait_completed(client, second["id"])
    command = ["recheck", "--db", db_url, "--workload", "noop", "--rounds", "1", "--arg", "drift=0.4"]
    recheck = subprocess.run(
        [sys.executable, "-m", "tuner.cli", *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert recheck.returncode == 1 and "regressed" in recheck.stdout, recheck.stdout + recheck.stderr
    db = StudyDB(db_url)
    gemm = measured_study(db, "gemm-h200", {"m": 4096, "n": 4096, "k": 4096}, [(gemm_config(), 700.0)])
    gemm_entry = configs.publish(db, gemm).entry.id
    assert configs.mark_unverified(db, "NVIDIA H200", {"driver": "999.0"}) == [gemm_entry]
    noop_entry = client.get("/api/configs/entries", params={"workload": "noop"}).json()["items"][0]
    # What a runner's scheduled recheck (tuner/run/jobs.py) records, as the page reads it.
    assert jobs.claim(db, jobs.RECHECK, "runner e2e", 86400)
    flagged = {"entry": noop_entry["id"], "was": noop_entry["recheck"]["previous"], "now": noop_entry["interval"]}
    jobs.record(db, jobs.RECHECK, "runner e2e", {"entries": 2, "checked": 2, "regressed": [flagged]}, finished=True)
    db.dispose()

    page_errors: list[str] = []
    failed_requests: list[str] = []
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.on("response", lambda r: failed_requests.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            page.goto(f"{server}/")
            page.click("nav >> text=Registry")
            page.wait_for_selector(f'#registry-table tr[data-entry-id="{gemm_entry}"]', timeout=30_000)
            page.wait_for_selector("#recheck-job[data-regressed='1']", timeout=15_000)
            job_line = page.locator("#recheck-job").inner_text()
            assert "every 24 h" in job_line and f"regressed: #{noop_entry['id']}" in job_line, job_line
            regressed = page.locator(f'#registry-table tr[data-entry-id="{noop_entry["id"]}"]')
            assert regressed.get_attribute("class") == "entry-regressed"
            assert regressed.locator(".badge").inner_text() == "regressed" and "was [" in regressed.inner_text()
            unverified = page.locator(f'#registry-table tr[data-entry-id="{gemm_entry}"]')
            assert unverified.get_attribute("class") == "entry-unverified" and "NVIDIA H200" in unverified.inner_text()
            colours = page.evaluate(
                "(ids) => ids.map((id) => getComputedStyle(document.querySelector("
                '`#registry-table tr[data-entry-id="${id}"]`)).backgroundColor)',
                [noop_entry["id"], gemm_entry],
            )
            assert len(set(colours)) == 2 and "rgba(0, 0, 0, 0)" not in colours  # both stand out, differently
            page.screenshot(path=str(ARTIFACTS / "dashboard-registry.png"), full_page=True)

            page.fill("#registry-shape", "m=4096")
            _wait_for(page, "() => document.querySelectorAll('#registry-table tbody tr').length === 1", 15, "filter")
            page.fill("#registry-shape", "")
            page.fill("#registry-gpu", "cpu")
            _wait_for(
                page,
                "(id) => { const rows = document.querySelectorAll('#registry-table tbody tr');"
                " return rows.length === 1 && rows[0].dataset.entryId === String(id); }",
                15,
                "the GPU filter",
                noop_entry["id"],
            )
            link = page.locator(f'#registry-table tr[data-entry-id="{noop_entry["id"]}"] a')
            assert link.get_attribute("href").endswith(f"/studies/{noop_entry['study_id']}#trial-{noop_entry['trial']}")

            # A regressed entry's re-tune is queued from the page (with the API token).
            page.fill("#registry-token", TOKEN)
            page.locator(f'#registry-table tr[data-entry-id="{noop_entry["id"]}"] button.retune').click()
            page.wait_for_selector("#retune-link", timeout=15_000)
            queued = client.get("/api/studies", params={"workload": "noop", "limit": 50}).json()["items"]
            retune = [s for s in queued if s["name"] == page.locator("#retune-link").inner_text()]
            assert len(retune) == 1 and page.locator("#retune-link").get_attribute("href").endswith(
                f"/studies/{retune[0]['id']}"
            )

            # The warm-started study's page says which trial came from the registry.
            page.goto(f"{server}/studies/{second['id']}")
            page.wait_for_selector("#warm-start-table tr[data-source='registry']", timeout=30_000)
            origin = page.locator("#warm-start-table tr[data-source='registry']").first
            assert origin.get_attribute("data-trial") == "0" and "registry" in origin.inner_text()
            decision = page.locator("#warm-start-decision")
            assert decision.get_attribute("data-mode") == "registry" and "priors" in decision.inner_text()
            page.goto(f"{server}/studies/{first['id']}")  # the first found no entry: the default took the seeds
            page.wait_for_selector("#warm-start-decision[data-mode='seeds']", timeout=30_000)
            assert "default (auto)" in page.locator("#warm-start-decision").inner_text()
        finally:
            browser.close()
    client.close()
    assert not failed_requests, failed_requests
    assert not page_errors, page_errors
