"""The dashboard's pages and files, fast: FastAPI's TestClient against the router, a stub of the JSON API
(so that fields real workloads never fill, such as a study name full of markup, can be served), and
the real app. One test draws every chart from hostile stub data in headless Chromium (skipped without
a browser unless ``TUNER_REQUIRE_BROWSER=1``).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import CHROMIUM_ARGS, chromium_or_skip

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")

from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from fastapi.testclient import TestClient

from api import dashboard
from tuner.results.pareto import pareto_front

REPO = Path(__file__).resolve().parent.parent
HOSTILE = '<img src=x onerror="window.__pwned=1">&amp;<b>'
HOSTILE_NAME = f"</title><script>window.__pwned=2</script>{HOSTILE}"
NOW = "2026-01-01T00:00:00+00:00"


# ---------------------------------------------------------------- a stub of the JSON API
def _trial(number: int, status: str = "ok", knob: str = "a", **metrics: float | None) -> dict[str, Any]:
    return {
        "number": number,
        "status": status,
        "params": {"<i>knob</i>": knob, "tile": 2 ** (4 + number % 4), "x": number / 10},
        "metrics": metrics,
        "feasible": status == "ok",
        "timing_comparable": True,
        "error": None if status == "ok" else f"Traceback (most recent call last):\nKeyError: {HOSTILE}",
        "worker": f"w{number % 2}<b>",
        "attempt": 1,
        "duplicate_of": None,
        "started_at": NOW,
        "finished_at": NOW,
        "duration_s": 0.5,
    }


def _stub_study(study_id: int, objectives: list[tuple[str, str]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    trials = []
    for n in range(12):
        if n in (3, 7):
            trials.append(_trial(n, "runtime_error", knob=HOSTILE))
            continue
        ai = 4.0 * (n + 1)
        trials.append(
            _trial(
                n,
                knob="a" if n % 2 else HOSTILE,
                **{
                    "<b>m1</b>": float(n),
                    "m&2": float(12 - n + (n % 3) * 2),
                    "m3": float((n * 7) % 5),
                    "arithmetic_intensity": ai,
                    "tflops": min(500.0, ai * 3.0) * 0.6,
                },
            )
        )
    study = {
        "id": study_id,
        "name": HOSTILE_NAME,
        "workload": f"noop{HOSTILE}",
        "status": "completed",
        "created_at": NOW,
        "updated_at": NOW,
        "objectives": [{"metric": m, "direction": d} for m, d in objectives],
        "budget_trials": 12,
        "measured": 12,
        "running": 0,
        "counts": {"ok": 10, "runtime_error": 2},
        "progress": 1.0,
        "best": {"trial": 11, "params": trials[11]["params"], "metrics": trials[11]["metrics"]},
        "elapsed_s": 12.5,
        "eta_s": None,
        "message": f"finished {HOSTILE}",
        "spec": {},
        "space": {
            "params": {
                "<i>knob</i>": {"type": "categorical", "choices": ["a", HOSTILE]},
                "tile": {"type": "pow2", "low": 16, "high": 128},
                "x": {"type": "float", "low": 0.0, "high": 1.0},
            }
        },
        "space_hash": "abc123",
        # A roofline device: peak 500 TFLOP/s, 3000 GB/s (ridge at 166.7 FLOP/byte).
        "device": {
            "kind": "cuda",
            "name": f"GPU {HOSTILE}",
            "roofline": {"peak_tflops": 500.0, "bandwidth_gbps": 3000.0},
        },
        "fingerprint": {"hostname": HOSTILE, "gpu_names": [HOSTILE, "H200"], "torch": "2.13"},
    }
    return study, trials


POINT_FIELDS = ("number", "status", "feasible", "duplicate_of", "timing_comparable", "params", "metrics")


def _running_study(study_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A study under way: 62 of 80 measured, the API's ETA 62 s, two failures among 60 successes."""
    study, trials = _stub_study(study_id, [("<b>m1</b>", "maximize"), ("m&2", "minimize")])
    study.update(
        status="running",
        budget_trials=80,
        measured=62,
        running=1,
        counts={"ok": 60, "running": 1, "runtime_error": 2},
        progress=62 / 80,
        eta_s=62.0,
        message=None,
    )
    return study, trials


def stub_api() -> FastAPI:
    """Studies 1 (two objectives), 2 (three), 3 (one), 4 (running); 99 makes the API fail; others are missing."""
    app = FastAPI()
    studies = {
        1: _stub_study(1, [("<b>m1</b>", "maximize"), ("m&2", "minimize")]),
        2: _stub_study(2, [("<b>m1</b>", "maximize"), ("m&2", "minimize"), ("m3", "minimize")]),
        3: _stub_study(3, [("<b>m1</b>", "maximize")]),
        4: _running_study(4),
    }

    def get(study_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        if study_id == 99:
            raise RuntimeError("the API broke")
        if study_id not in studies:
            raise HTTPException(404, f"no study {study_id}")
        return studies[study_id]

    @app.get("/api/studies")
    def list_studies(limit: int = 50, offset: int = 0) -> dict[str, Any]:
        items = [s for s, _ in studies.values()]
        return {"items": items[offset : offset + limit], "total": len(items), "limit": limit, "offset": offset}

    @app.get("/api/studies/{study_id}")
    def study(study_id: int) -> dict[str, Any]:
        return get(study_id)[0]

    @app.get("/api/studies/{study_id}/trials")
    def trials(
        study_id: int, limit: int = 1000, offset: int = 0, sort: str = "number", status: str | None = None
    ) -> dict[str, Any]:
        """As the real API pages: filtered by status, sorted by number, status or a metric (nulls last)."""
        items = [t for t in get(study_id)[1] if status is None or t["status"] == status]
        key, descending = sort.lstrip("-"), sort.startswith("-")
        if key in ("number", "status"):
            items = sorted(items, key=lambda t: t[key], reverse=descending)
        else:
            present = sorted((t for t in items if t["metrics"].get(key) is not None), key=lambda t: t["metrics"][key])
            items = (present[::-1] if descending else present) + [t for t in items if t["metrics"].get(key) is None]
        return {"items": items[offset : offset + limit], "total": len(items), "limit": limit, "offset": offset}

    @app.get("/api/studies/{study_id}/overview")
    def overview(study_id: int, limit: int = 100, sort: str = "number", status: str | None = None) -> dict[str, Any]:
        study, items = get(study_id)
        failed = [t for t in items if t["status"] != "ok" or t["feasible"] is False]
        return {
            "study": study,
            "trials": trials(study_id, limit=limit, sort=sort, status=status),
            "points": [{k: t[k] for k in POINT_FIELDS} for t in items],
            "pareto": pareto(study_id),
            "failures": failed[::-1],
            "seq": len(items),
        }

    @app.get("/api/studies/{study_id}/trials/{number}")
    def trial(study_id: int, number: int) -> dict[str, Any]:
        return dict(get(study_id)[1][number], samples_ms=[1.0, 1.5, 2.0], fingerprint=None)

    @app.get("/api/studies/{study_id}/pareto")
    def pareto(study_id: int) -> dict[str, Any]:
        study, items = get(study_id)
        objectives = [(o["metric"], o["direction"]) for o in study["objectives"]]
        rows = [SimpleNamespace(**t) for t in items]
        front = [t.number for t in pareto_front(rows, objectives)]
        return {
            "objectives": study["objectives"],
            "trials": [items[n] for n in front],
            "default_pick": front[0] if front else None,
        }

    @app.get("/api/studies/{study_id}/importance")
    def importance(study_id: int) -> dict[str, Any]:
        get(study_id)
        return {"importances": {"<i>knob</i>": 0.6, "tile": 0.3, "x": 0.1}}

    @app.get("/api/studies/{study_id}/export")
    def export(study_id: int, format: str = "json", trial: int | None = None) -> PlainTextResponse:
        get(study_id)
        return PlainTextResponse("{}", headers={"Content-Disposition": 'attachment; filename="x.json"'})

    @app.get("/api/studies/{study_id}/events")
    def events(study_id: int) -> PlainTextResponse:
        """The study once, then the end of the stream (the page polls on)."""
        study = get(study_id)[0]
        body = f"id: {len(get(study_id)[1])}\nevent: study\ndata: {json.dumps(study)}\n\n"
        return PlainTextResponse(body, media_type="text/event-stream")

    @app.get("/api/configs/origins/{study_id}")
    def origins(study_id: int) -> dict[str, Any]:  # the study page's warm-start table (registry.js)
        get(study_id)
        return {"study_id": study_id, "origins": []}

    @app.get("/api/configs/entries")
    def entries() -> dict[str, Any]:  # the registry page
        return {"items": [], "total": 0, "limit": 200, "offset": 0}

    @app.get("/api/configs/recheck")
    def recheck() -> dict[str, Any]:
        return {"scheduled": False}

    @app.get("/api/studies/{study_id}/slice")
    def slice_(study_id: int, param: str, color: str | None = None) -> dict[str, Any]:
        """The stub's ok trials against ``param`` (its values are the hostile ones: drawn as text)."""
        study, trials = get(study_id)
        metric, direction = study["objectives"][0]["metric"], study["objectives"][0]["direction"]
        points = [
            {
                "number": t["number"],
                "feasible": t["feasible"],
                "value": t["params"].get(param),
                "objective": t["metrics"].get(metric),
            }
            for t in trials
            if t["status"] == "ok"
        ]
        return {
            "param": param,
            "kind": "categorical",
            "log": False,
            "objective": metric,
            "direction": direction,
            "color": None,
            "points": points,
            "stride": 1,
        }

    @app.get("/api/studies/{study_id}/{part}")
    def analysis_part(study_id: int, part: str) -> dict[str, Any]:
        """The other analysis plots, empty: what a study answers before its first successful trial."""
        get(study_id)
        empty = {
            "contour": {
                "x_cells": [],
                "y_cells": [],
                "z": [],
                "points": [],
                "x": "",
                "y": "",
                "objective": "",
                "direction": "minimize",
                "stride": 1,
                "count": 0,
            },
            "edf": {"color": None, "curves": []},
            "hypervolume": {"objectives": [], "reference_point": {}, "history": [], "hypervolume": 0.0, "count": 0},
            "best": {"objectives": []},
        }
        if part not in empty:
            raise HTTPException(404, f"no {part}")
        return empty[part]

    app.include_router(dashboard.router)
    return app


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(stub_api(), raise_server_exceptions=False) as test_client:
        yield test_client


# ---------------------------------------------------------------- server-rendered pages
def test_index_page_is_a_shell_with_the_dashboard_script(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert 'data-page="index"' in html
    assert 'id="studies-table"' in html
    assert re.search(r'<script type="module" src="/static/js/index\.js\?v=[0-9a-f]+">', html)
    assert "plotly.min.js" not in html  # the studies page draws no plots
    csp = response.headers["content-security-policy"]
    assert "script-src 'self' 'unsafe-eval';" in csp  # no inline scripts (eval: Plotly's parcoords needs it)
    assert "<script>" not in html  # no inline script: the policy forbids it


def test_study_page_escapes_a_hostile_study_name(client: TestClient) -> None:
    response = client.get("/studies/1")
    assert response.status_code == 200
    html = response.text
    assert HOSTILE_NAME not in html
    assert "<script>window.__pwned" not in html
    assert '<img src=x onerror="window.__pwned=1">' not in html
    escaped = (
        "&lt;/title&gt;&lt;script&gt;window.__pwned=2&lt;/script&gt;"
        "&lt;img src=x onerror=&#34;window.__pwned=1&#34;&gt;&amp;amp;&lt;b&gt;"
    )
    assert f"<title>{escaped} · gpu-knob-tuner</title>" in html
    assert f'<span id="study-name">{escaped}</span>' in html
    assert 'data-study-id="1"' in html
    for element_id in ("pareto-plot", "history-plot", "parallel-plot", "importance-plot", "roofline-plot"):
        assert f'id="{element_id}"' in html
    for element_id in ("trial-table", "selected-trial", "study-status", "failures", "fingerprint"):
        assert f'id="{element_id}"' in html
    # Plotly after the dashboard's script (its first request is sent meanwhile); the basic bundle first, the
    # full one named for the plots that need it.
    script = re.search(
        r'<script id="plotly-script" src="/static/plotly-basic\.min\.js" data-full="([^"]+)" defer>', html
    )
    assert script and script.group(1) == "/static/plotly.min.js"
    assert html.index("/static/js/study.js") < html.index("plotly-basic.min.js")
    # The default pick's exports: every format the trial panel offers.
    for fmt in ("json", "yaml", "env", "python"):
        assert f'id="export-best-{fmt}"' in html


def test_missing_study_gets_a_404_page(client: TestClient) -> None:
    response = client.get("/studies/12345")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("text/html")
    assert "There is no study 12345." in response.text
    assert 'href="/"' in response.text


@pytest.mark.parametrize("ref", ["abc", "1.5", "-1", "%3Cscript%3E", "1" * 30])
def test_study_ids_that_are_not_numbers_get_a_404_page(client: TestClient, ref: str) -> None:
    response = client.get(f"/studies/{ref}")
    assert response.status_code == 404
    assert "Study ids are whole numbers." in response.text
    assert "<script>" not in response.text


def test_study_page_still_renders_when_the_api_fails(client: TestClient) -> None:
    # The page's script reports what the API says; the server-side lookup is only for the title and 404s.
    response = client.get("/studies/99")
    assert response.status_code == 200
    assert 'data-study-id="99"' in response.text
    assert "<title>study 99 · gpu-knob-tuner</title>" in response.text


def test_pages_work_under_a_root_path() -> None:
    with TestClient(stub_api(), root_path="/tuner") as test_client:
        html = test_client.get("/studies/1").text
    assert 'data-root="/tuner"' in html
    assert 'src="/tuner/static/plotly-basic.min.js" data-full="/tuner/static/plotly.min.js"' in html
    assert 'href="/tuner/static/dashboard.css' in html


# ---------------------------------------------------------------- static files
def test_static_files_are_served(client: TestClient) -> None:
    js = client.get("/static/js/study.js")
    assert js.status_code == 200
    assert js.headers["content-type"].startswith("text/javascript")  # what a browser runs as a module
    assert "function refreshData" in js.text
    css = client.get("/static/dashboard.css")
    assert css.status_code == 200
    assert css.headers["content-type"].startswith("text/css")


def test_plotly_comes_from_the_installed_package(client: TestClient) -> None:
    path = dashboard.plotly_js_path()
    if path is None:
        pytest.skip("the plotly package is not installed")
    response = client.get("/static/plotly.min.js")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/javascript")
    assert "max-age" in response.headers["cache-control"]
    assert len(response.content) == path.stat().st_size
    assert response.content[:200] == path.read_bytes()[:200]
    assert b"plotly.js" in response.content[:200]


def test_static_files_are_cached_by_version_and_revalidated_by_etag(client: TestClient) -> None:
    basic = client.get("/static/plotly-basic.min.js")
    assert basic.status_code == 200 and b"plotly.js (basic" in basic.content[:200]
    assert "max-age" in basic.headers["cache-control"]
    version = re.search(r"js/study\.js\?v=([0-9a-f]+)", client.get("/studies/1").text).group(1)
    linked = client.get(f"/static/js/study.js?v={version}")
    assert "immutable" in linked.headers["cache-control"]  # the pages link it by version: never stale
    plain = client.get("/static/js/api.js")  # what a module imports, unversioned: revalidated every time
    assert plain.headers["cache-control"] == "no-cache"
    again = client.get("/static/js/api.js", headers={"If-None-Match": plain.headers["etag"]})
    assert again.status_code == 304 and not again.content


@pytest.mark.parametrize(
    "name",
    [
        "nope.js",
        ".hidden",
        "%2E%2E",
        "..%2Fdashboard.py",
        "%2E%2E%2Fdashboard.py",
        "..%5Cdashboard.py",
        "js/nope.js",
        "js/.hidden",
        "js/..%2F..%2Fdashboard.py",
        "js%2F..%2F..%2Fdashboard.py",
        "js//api.js",
        "js",
    ],
)
def test_static_refuses_what_is_not_a_static_file(client: TestClient, name: str) -> None:
    response = client.get(f"/static/{name}")
    assert response.status_code == 404
    assert "import" not in response.text  # never the source of a module


def test_the_package_ships_every_static_file_and_template() -> None:
    """pyproject's package-data names every file of api/static and api/templates, the modules in js/ too: the
    ``"*"`` of a package's data does not reach into its folders, and a wheel without js/ serves no script."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]

    def shipped(name: str, globs: list[str]) -> bool:  # a glob's "*" stays inside one folder
        return any(fnmatch.fnmatch(name, g) and g.count("/") == name.count("/") for g in globs)

    for package, folder in (("api.static", dashboard.STATIC_DIR), ("api.templates", dashboard.TEMPLATE_DIR)):
        names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
        assert names and not [n for n in names if not shipped(n, data[package])], package
    assert shipped("js/study.js", data["api.static"])


def test_templates_escape_everything() -> None:
    assert dashboard._env.autoescape is True


def test_scripts_never_insert_markup() -> None:
    # User strings reach the DOM through textContent or attributes; Plotly text goes through escapeHtml.
    scripts = sorted((dashboard.STATIC_DIR / "js").glob("*.js"))
    assert len(scripts) >= 10
    for path in scripts:
        source = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in source, (path.name, sink)


def test_dashboard_imports_no_heavy_modules() -> None:
    code = (
        "import sys, api.dashboard; "
        "print(','.join(m for m in ('torch', 'triton', 'ray', 'optuna', 'plotly') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


# ---------------------------------------------------------------- the real app
def test_real_app_serves_the_pages(tmp_path: Path) -> None:
    main = pytest.importorskip("api.main")
    from api.settings import Settings

    app = main.create_app(Settings(db_url=f"sqlite:///{tmp_path / 'pages.db'}"))
    spec = {"name": "pages", "workload": "noop", "objectives": [{"metric": "score"}, {"metric": "cost"}]}
    # Spec names are restricted to [A-Za-z0-9._-]; a row written by other means may still hold markup.
    row = app.state.db.create_study(
        name=HOSTILE_NAME[:120], workload="noop", spec=spec, space={"params": {}}, space_hash="0" * 64
    )
    with TestClient(app) as test_client:
        index = test_client.get("/")
        assert index.status_code == 200 and 'id="studies-table"' in index.text
        page = test_client.get(f"/studies/{row.id}")
        assert page.status_code == 200
        assert "<script>window.__pwned" not in page.text
        assert "&lt;/title&gt;&lt;script&gt;" in page.text
        assert test_client.get(f"/studies/{row.id + 1}").status_code == 404
        assert test_client.get("/static/js/study.js").status_code == 200
        assert test_client.get("/static/plotly.min.js").status_code in (200, 404)


# ---------------------------------------------------------------- the charts, in a browser
def _browser() -> str:
    return chromium_or_skip()


@pytest.fixture(scope="module")
def stub_server() -> Iterator[str]:
    """The stub API and the dashboard under uvicorn in a thread, for the browser."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(stub_api(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.timeout(120)
def test_charts_draw_hostile_data_as_text(stub_server: str) -> None:
    chromium = _browser()
    from playwright.sync_api import sync_playwright

    args = CHROMIUM_ARGS
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=args)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)

            # Two objectives: Pareto scatter, history, parallel coordinates, importances, roofline.
            page.goto(f"{stub_server}/studies/1")
            page.wait_for_function("() => Number(document.body.dataset.refreshes) >= 1")
            page.wait_for_selector("#roofline-plot .main-svg")
            page.wait_for_function("() => document.body.dataset.importances === 'drawn'")  # after the first draw
            assert page.locator("#study-name").text_content() == HOSTILE_NAME
            assert page.locator("#study-message").text_content() == f"finished {HOSTILE}"
            data = page.evaluate(
                """() => Object.fromEntries(['pareto-plot', 'history-plot', 'parallel-plot', 'importance-plot',
                   'roofline-plot'].map((id) => [id, (document.getElementById(id).data || []).map((t) => ({
                     name: t.name, type: t.type, n: (t.x || t.dimensions || []).length,
                     hover: t.hovertext ? t.hovertext[0] : null }))]))"""
            )
            trials = {t["name"]: t for t in data["pareto-plot"]}
            assert trials["trials"]["n"] == 10 and trials["trials"]["type"] == "scatter"
            assert trials["Pareto front"]["n"] >= 1
            # Plotly renders hover text as HTML: the markup in params arrives escaped.
            assert '&lt;img src=x onerror="window.__pwned=1"&gt;&amp;amp;&lt;b&gt;' in trials["trials"]["hover"]
            assert "&lt;i&gt;knob&lt;/i&gt;" in trials["trials"]["hover"]
            assert [t["n"] for t in data["roofline-plot"]] == [3, 10]
            assert data["parallel-plot"][0]["type"] == "parcoords" and data["parallel-plot"][0]["n"] == 4
            assert data["importance-plot"][0]["n"] == 3
            assert page.locator("#pareto-plot .xtitle").text_content() == "<b>m1</b> (max ↑)"
            assert "WebGL is not supported" not in page.locator("main").text_content()
            assert HOSTILE[:39] + "…" in page.locator("#parallel-plot").text_content()  # long ticks are cut
            assert "<i>knob</i>" in page.locator("#importance-plot").text_content()
            assert page.locator("#roofline-note").is_hidden()

            # Hover a point: the tooltip shows the markup as text.
            pixel = page.evaluate(
                """() => { const gd = document.getElementById('pareto-plot'); const fl = gd._fullLayout;
                   const t = gd.data.find((d) => d.name === 'trials'); const b = gd.getBoundingClientRect();
                   const i = t.customdata.indexOf(0);
                   return {x: b.left + fl._size.l + fl.xaxis.l2p(t.x[i]),
                           y: b.top + fl._size.t + fl.yaxis.l2p(t.y[i])}; }"""
            )
            page.mouse.move(pixel["x"], pixel["y"])
            page.wait_for_selector("#pareto-plot .hoverlayer .hovertext")
            assert HOSTILE in page.locator("#pareto-plot .hoverlayer").text_content()

            # The trial table sorts by a header click and filters by status; rows select trials.
            table = page.locator("#trial-table")
            assert table.locator("tbody tr").count() == 12
            assert HOSTILE in table.text_content()
            table.locator("th", has_text="<b>m1</b>").click()
            first = table.locator("tbody tr").first.get_attribute("data-trial")
            assert first == "0"
            table.locator("th", has_text="<b>m1</b>").click()
            assert table.locator("tbody tr").first.get_attribute("data-trial") == "11"
            page.select_option("#trial-status-filter", "runtime_error")
            assert table.locator("tbody tr").count() == 2
            table.locator('tbody tr[data-trial="3"]').click()
            page.wait_for_function("() => document.getElementById('selected-trial').dataset.trial === '3'")
            assert "Only successful trials can be exported." in page.locator("#selected-trial").text_content()
            page.locator("#failures details summary").first.click()
            assert f"KeyError: {HOSTILE}" in page.locator("#failures").text_content()
            assert HOSTILE in page.locator("#fingerprint").text_content()
            page.select_option("#trial-status-filter", "")
            table.locator('tbody tr[data-trial="11"]').click()
            page.wait_for_selector("#export-link")
            assert page.locator("#export-link").get_attribute("href") == "/api/studies/1/export?format=json&trial=11"
            assert page.locator("#export-link").get_attribute("download").endswith("-trial-11.json")
            assert page.evaluate("() => window.__pwned") is None
            assert page.locator('img[src="x"]').count() == 0

            # Three objectives: a 3-D scatter.
            page.goto(f"{stub_server}/studies/2")
            page.wait_for_function("() => Number(document.body.dataset.refreshes) >= 1")
            types = page.evaluate("() => document.getElementById('pareto-plot').data.map((t) => t.type)")
            assert set(types) == {"scatter3d"}

            # One objective: no front, a note; the history still draws.
            page.goto(f"{stub_server}/studies/3")
            page.wait_for_function("() => Number(document.body.dataset.refreshes) >= 1")
            assert "One objective" in page.locator("#pareto-note").text_content()
            assert page.evaluate("() => (document.getElementById('pareto-plot').data || []).length") == 0
            assert page.evaluate("() => document.getElementById('history-plot').data.length") >= 3

            # The studies page lists the studies, names as text.
            page.goto(f"{stub_server}/")
            page.wait_for_selector('#studies-table tr[data-study-id="3"]')
            assert HOSTILE_NAME in page.locator('#studies-table tr[data-study-id="1"]').text_content()
            assert page.evaluate("() => window.__pwned") is None
        finally:
            browser.close()
    assert not errors, errors


@pytest.mark.timeout(180)
def test_every_page_loads_its_modules_with_no_console_error(stub_server: str) -> None:
    """The studies page, a finished and a running study's page and the registry page, in a real browser: no
    console error, no uncaught exception, no failed request; every module of api/static/js loads as
    JavaScript (a browser runs a module only with a JavaScript MIME type)."""
    chromium = _browser()
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    failed: list[str] = []
    modules: dict[str, str] = {}

    def on_response(response: Any) -> None:
        if response.status >= 400:
            failed.append(f"{response.status} {response.url}")
        elif "/static/js/" in response.url:
            name = response.url.split("?")[0].rsplit("/static/js/", 1)[1]
            if not modules.get(name):  # the first answer: a later page's copy from the cache has no headers
                modules[name] = response.headers.get("content-type", "")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda msg: errors.append(f"{page.url}: {msg.text}") if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))
            page.on("requestfailed", lambda request: failed.append(f"{request.url}: {request.failure}"))
            page.on("response", on_response)

            page.goto(f"{stub_server}/")
            page.wait_for_selector('#studies-table tr[data-study-id="4"]')
            page.goto(f"{stub_server}/studies/1")
            page.wait_for_function("() => Number(document.body.dataset.refreshes) >= 1")
            page.wait_for_function("() => document.body.dataset.importances === 'drawn'")
            page.goto(f"{stub_server}/studies/4")  # running: the event stream, then polling
            page.wait_for_function("() => Number(document.body.dataset.refreshes) >= 1")
            page.wait_for_function("() => document.getElementById('connection').textContent.startsWith('live')")
            page.goto(f"{stub_server}/registry")
            page.wait_for_function("() => document.getElementById('registry-count').textContent === '0 entries'")
            page.goto(f"{stub_server}/compare?studies=1,2")  # two objectives against three: refused, said so
            page.wait_for_function("() => document.body.dataset.compareDrawn === 'refused'")
            assert "different objectives" in page.locator("#compare-error").text_content()
            page.wait_for_timeout(300)
        finally:
            browser.close()
    assert not errors, errors
    assert not failed, failed
    shipped = {p.name for p in (dashboard.STATIC_DIR / "js").glob("*.js")}
    assert set(modules) == shipped, set(modules) ^ shipped
    assert all(kind.startswith("text/javascript") for kind in modules.values()), modules


@pytest.mark.timeout(120)
def test_a_running_study_shows_the_apis_eta_its_failures_and_every_export(stub_server: str) -> None:
    """The header's ETA is the API's ``eta_s`` as it is (not counted down in the page between answers), the
    failures card names failures only (not ``ok 60``), and the default pick exports in all four formats."""
    chromium = _browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{stub_server}/studies/4")
            page.wait_for_function("() => Number(document.body.dataset.refreshes) >= 1")
            etas = []
            for _ in range(6):  # over three seconds: a page counting down would have moved on
                etas.append(page.locator("#study-eta").text_content())
                page.wait_for_timeout(500)
            assert etas == ["1 min 2 s"] * 6, etas
            assert page.locator("#study-progress-text").text_content() == "62/80 measured (1 running, 2 failed)"
            summary = page.locator("#failures > p").first.text_content()
            assert summary == "runtime_error 2", summary
            assert page.locator("#failures details[data-status='runtime_error'] summary").text_content() == (
                "runtime_error: 2 trials"
            )
            for fmt, suffix in (("json", "json"), ("yaml", "yaml"), ("env", "env"), ("python", "py")):
                link = page.locator(f"#export-best-{fmt}")
                assert link.get_attribute("href") == f"/api/studies/4/export?format={fmt}"
                assert link.get_attribute("download").endswith(f"-best.{suffix}")
            page.locator('#trial-table tbody tr[data-trial="11"]').click()
            page.wait_for_selector("#export-links")
            offered = page.locator("#export-links a").evaluate_all(
                "(links) => links.map((a) => new URL(a.href).searchParams.get('format'))"
            )
            assert offered == ["json", "yaml", "env", "python"]  # the trial panel's: the same four
        finally:
            browser.close()


# ---------------------------------------------------------------- the scripts' shape
JS_MAX_FILE_LINES = 800
JS_MAX_FUNCTION_LINES = 150
_NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "with"}


def _js_functions(source: str) -> list[tuple[int, int]]:
    """(line, length in lines) of every function body in JavaScript ``source``, by brace depth: a ``{`` after
    ``=>`` or after the parameter list of a function or method (not of if/for/while/switch/catch) opens one.
    Strings, template literals (their ``${}`` parts are code) and comments are skipped; a regular expression
    literal is taken to hold no quote or brace (the dashboard's hold none)."""
    out: list[tuple[int, int]] = []
    code: list[str] = []  # the code read so far, strings and comments left out
    braces: list[tuple[str, int]] = []  # ("function" | "block" | "template", line) of each open brace
    line, i, n = 1, 0, len(source)
    in_template = False
    while i < n:
        c = source[i]
        if c == "\n":
            line += 1
        if in_template:
            if c == "\\":
                i += 1
            elif c == "`":
                in_template = False
                code.append("0")
            elif source.startswith("${", i):
                braces.append(("template", line))
                in_template = False
                i += 1
            i += 1
            continue
        if source.startswith("//", i):
            i = source.find("\n", i)
            i = n if i < 0 else i
            continue
        if source.startswith("/*", i):
            end = source.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += source.count("\n", i, end)
            i = end
            continue
        if c in "'\"":
            j = i + 1
            while j < n and source[j] != c:
                j += 2 if source[j] == "\\" else 1
            code.append("0")
            i = j + 1
            continue
        if c == "`":
            in_template = True
        elif c == "{":
            braces.append(("function" if _opens_function("".join(code)) else "block", line))
        elif c == "}" and braces:
            kind, start = braces.pop()
            if kind == "function":
                out.append((start, line - start + 1))
            elif kind == "template":
                in_template = True
        code.append(c)
        i += 1
    return out


def _opens_function(code: str) -> bool:
    """Whether a ``{`` after ``code`` opens a function body."""
    code = code.rstrip()
    if code.endswith("=>"):
        return True
    if not code.endswith(")"):
        return False
    depth = 0
    for k in range(len(code) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(code[k], 0)
        if depth == 0:
            word = re.search(r"([A-Za-z_$][\w$]*)\s*$", code[:k])
            return word is None or word.group(1) not in _NOT_FUNCTIONS
    return False


def test_the_function_scan_finds_functions_methods_and_arrows_not_blocks() -> None:
    source = (
        "function a(x) {\n  if (x) {\n    return `${x}}`;\n  }\n}\n"
        "const b = (y) => {\n  for (const k of y) {}\n  return { k: '}' };\n};\n"
        "const o = { m() {\n  return 1; // }\n} };\n/* function c() { */\n"
    )
    assert _js_functions(source) == [(1, 5), (6, 4), (10, 3)]


def test_no_script_over_800_lines_and_no_function_over_150() -> None:
    """Every script of the dashboard (api/static, the shipped Plotly bundles aside) stays readable whole."""
    scripts = [p for p in sorted(dashboard.STATIC_DIR.rglob("*.js")) if not p.name.endswith(".min.js")]
    assert len(scripts) >= 10
    long_files = {p.name: n for p in scripts if (n := len(p.read_text().splitlines())) > JS_MAX_FILE_LINES}
    assert not long_files, f"split these scripts: {long_files}"
    long_functions = {
        f"{p.relative_to(dashboard.STATIC_DIR)}:{start}": length
        for p in scripts
        for start, length in _js_functions(p.read_text())
        if length > JS_MAX_FUNCTION_LINES
    }
    assert not long_functions, f"split these functions: {long_functions}"
