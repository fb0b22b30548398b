"""The read path at scale: API latencies and the study page on 10,000- and 100,000-trial studies, and 50
clients against a running study, in one run on loopback.

1. A study of ``--engine-trials`` (10,000) run through the engine: the ``noop`` workload, two objectives
   (``score`` against ``cost``: ``x`` trades one for the other continuously, so the front is wide),
   NSGA-II, Ray workers, SQLite.
2. A study of ``--storage-trials`` (100,000) written through the storage layer (``StudyDB.apply``, the
   orchestrator's write path: summary and metric values in the same transactions), each trial with ten
   raw timing samples, params drawn at random and metrics from the ``noop`` reference.
3. ``tuner serve`` on ``--port``: p50/p95 of ``GET /api/studies/{id}``, ``/trials?limit=50`` and
   ``/pareto`` (its default page: 100 front trials) on both studies (target: p95 <= 100 ms each), and
   more reads beside them (``/pareto?limit=50``, the whole front ``/pareto?all=true``, sorted pages...).
4. The study page in headless Chromium, from navigation to every chart and the table drawn
   (``body[data-refreshes] >= 1``; target <= 2 s) on both studies: ``cold`` (a fresh browser context: no
   cache, plotly.min.js fetched and compiled) and ``warm`` (a second visit in the same context, as a user
   who opened a study page before), each with its parts: the document and scripts ready
   (``DOMContentLoaded``), the overview request, and the milliseconds each chart took to draw.
5. A study running under the server's runner (``noop`` with ``sleep_ms``, random sampler): its trial rate
   with no client, then with ``--clients`` (50) concurrent clients for ``--duration-s`` (60 s): API readers,
   event streams and page loads (the page's HTML, script and overview request); then with no client
   again. Target: 0 errors, the rate under load within 10% of the mean rate without clients. The clients
   stand for remote browsers: they run at the lowest CPU priority (``--clients-nice``), so that on a small
   machine their own CPU does not count as the server's cost.

    PYTHONPATH=. python bench/api_scale.py --out bench/results/api-scale-cpu.json

Everything is bounded in time (``--duration-s``, per-request timeouts, a deadline on the engine run)
and stops what it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

REPO = Path(__file__).resolve().parent.parent
TARGET_P95_MS = 100.0
TARGET_PAGE_S = 2.0
TARGET_RATE_DROP = 0.10
OBJECTIVES = [{"metric": "score"}, {"metric": "cost"}]


def noop_spec(name: str, trials: int, sampler: str, sleep_ms: float = 0.0) -> dict[str, Any]:
    return {
        "name": name,
        "workload": "noop",
        "args": {"sleep_ms": sleep_ms},
        "space": {"tile": {"high": 128}, "stages": {"high": 4}},  # every config feasible
        "objectives": OBJECTIVES,
        "budget": {"trials": trials, "trial_timeout_s": 60},
        "sampler": sampler,
        "seed": 0,
        "warm_start": False,
        "remeasure": {"top_k": 0},
    }


def run_engine_study(url: str, trials: int, workers: int) -> dict[str, Any]:
    from tuner.run.orchestrator import Orchestrator
    from tuner.store.storage import StudyDB
    from tuner.study.spec import load_spec

    db = StudyDB(url)
    started = time.monotonic()
    summary = Orchestrator(load_spec(noop_spec("engine", trials, "nsga2")), db, workers=workers).run()
    wall = time.monotonic() - started
    db.dispose()
    return {
        "study_id": summary.study_id,
        "trials": sum(summary.counts.values()),
        "counts": summary.counts,
        "front_size": len(summary.pareto),
        "wall_s": round(wall, 1),
        "loop_ms_per_trial": round(summary.loop_s / max(1, trials) * 1000, 2),
    }


def write_storage_study(url: str, trials: int, batch: int = 250) -> dict[str, Any]:
    """``trials`` finished trials through ``StudyDB.apply``, ``batch`` trials (two writes each) a transaction."""
    from objectives.noop import NoOp
    from tuner.store.storage import StudyDB
    from tuner.study.spec import load_spec

    compiled = load_spec(noop_spec("storage", trials, "random"))
    db = StudyDB(url)
    row = db.create_study(
        name="storage",
        workload="noop",
        spec=compiled.spec.model_dump(mode="json"),
        space=compiled.space.canonical,
        space_hash=compiled.space.hash,
        status="completed",
        objectives=compiled.objectives,
    )
    rng = random.Random(0)
    started = time.monotonic()
    for first in range(0, trials, batch):
        writes = []
        for number in range(first, min(trials, first + batch)):
            mode = rng.choice(["fast", "balanced", "exact"])
            config = {"x": rng.random(), "tile": rng.choice([16, 32, 64, 128]), "stages": rng.randint(1, 4)}
            config.update(mode=mode, **({"depth": 8 * rng.randint(1, 8)} if mode == "exact" else {}))
            score = NoOp.reference(config)
            cost = config["x"] + config["stages"] / 6 + math.log2(config["tile"]) / 8
            samples = [rng.uniform(0.9, 1.1) for _ in range(10)]
            writes.append(db.insert_op(row.id, number, config, optuna_trial_id=None))
            writes.append(
                db.finish_op(
                    row.id,
                    number,
                    status="ok",
                    metrics={"score": score, "cost": cost, "latency_ms": statistics.median(samples)},
                    samples_ms=samples,
                    feasible=True,
                    timing_comparable=False,
                    error=None,
                    worker="bench",
                    attempt=1,
                    fingerprint={"hostname": "bench"},
                )
            )
        db.apply(writes)
    wall = time.monotonic() - started
    db.update_study(row.id, elapsed_s=wall)
    db.dispose()
    return {
        "study_id": row.id,
        "trials": trials,
        "write_s": round(wall, 1),
        "ms_per_trial": round(wall / trials * 1000, 3),
    }


# ---------------------------------------------------------------- the server
def start_server(url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TUNER_API_TOKEN", None)  # loopback, no token: writes (the final stop) are allowed
    cmd = [sys.executable, "-m", "tuner.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--db", url]
    cmd += ["--workers", "2"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tuner serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                # the server keeps static files in memory, gzipped on first use: that use is not timed
                httpx.get(f"http://127.0.0.1:{port}/static/plotly.min.js", headers={"Accept-Encoding": "gzip"})
                return proc
        time.sleep(0.3)
    stop_server(proc)
    raise RuntimeError("tuner serve did not answer /healthz in 120 s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (it stops its runner), then SIGKILL what is left of it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# ---------------------------------------------------------------- latencies
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def latencies(client: httpx.Client, path: str, n: int) -> dict[str, Any]:
    times, sizes = [], []
    for i in range(n + 3):
        start = time.perf_counter()
        response = client.get(path)
        elapsed = (time.perf_counter() - start) * 1000
        response.raise_for_status()
        if i >= 3:  # the first few warm caches up
            times.append(elapsed)
            sizes.append(len(response.content))
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(percentile(times, 0.95), 1),
        "max_ms": round(max(times), 1),
        "bytes": int(statistics.median(sizes)),
    }


def measure_reads(base: str, study_id: int, n: int) -> dict[str, Any]:
    targets = ("", "/trials?limit=50", "/pareto")
    extras = (
        "/pareto?limit=50",
        "/pareto?sample=300",
        "/trials?limit=50&offset=5000",
        "/trials?limit=50&sort=-score",
        "/trials?limit=50&status=ok&sort=cost",
    )
    out: dict[str, Any] = {}
    with httpx.Client(base_url=base, timeout=60) as client:
        for path in targets + extras:
            out[f"GET /api/studies/{{id}}{path}"] = latencies(client, f"/api/studies/{study_id}{path}", n)
        out["GET /api/studies"] = latencies(client, "/api/studies", n)
        out["GET /api/studies/{id}/overview"] = latencies(client, f"/api/studies/{study_id}/overview", 10)
        out["GET /api/studies/{id}/pareto?all=true"] = latencies(client, f"/api/studies/{study_id}/pareto?all=true", 5)
    out["targets_met"] = all(out[f"GET /api/studies/{{id}}{p}"]["p95_ms"] <= TARGET_P95_MS for p in targets)
    return out


#: What the page reports of its own load: the document ready, the overview request, each chart's draw.
PAGE_PARTS_JS = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const overview = performance.getEntriesByType('resource').find((e) => e.name.includes('/overview'));
  const scripts = performance.getEntriesByType('resource').filter((e) => e.name.includes('plotly'));
  const plotly = scripts[0];
  const full = scripts.find((e) => e.name.includes('/plotly.min.js'));
  return {
    html_ms: Math.round(nav.responseEnd),
    dom_content_loaded_ms: Math.round(nav.domContentLoadedEventEnd),
    plotly_bundle: plotly ? plotly.name.split('/').pop() : null,
    plotly_fetch_ms: plotly ? Math.round(plotly.duration) : null,
    full_bundle_loaded: Boolean(full),
    overview_sent_ms: overview ? Math.round(overview.startTime) : null,
    overview_request_ms: overview ? Math.round(overview.duration) : null,
    overview_bytes: overview ? overview.encodedBodySize : null,
    render_ms: window.tunerDashboard.renderMs,
    notes: [...document.querySelectorAll('#pareto-note, #parallel-note')].map((n) => n.textContent),
  };
}"""


def _visit(page: Any, url: str) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    page.goto(url)
    page.wait_for_function("() => Number(document.body.dataset.refreshes) >= 1", timeout=120_000)
    return time.perf_counter() - start, page.evaluate(PAGE_PARTS_JS)


def measure_page(base: str, study_id: int, repeats: int) -> dict[str, Any]:
    """Seconds from navigation to the page fully drawn (every chart and the table: ``data-refreshes``), in
    a fresh browser context (``cold``) and again in the same one (``warm``: plotly.min.js from the cache)."""
    import shutil

    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    args = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--enable-unsafe-swiftshader"]
    runs: dict[str, list[tuple[float, dict[str, Any]]]] = {"cold": [], "warm": []}
    errors: list[str] = []
    url = f"{base}/studies/{study_id}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=args)
        try:
            for _ in range(repeats):
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                for kind in ("cold", "warm"):
                    page = context.new_page()
                    page.on("pageerror", lambda exc: errors.append(str(exc)))
                    runs[kind].append(_visit(page, url))
                    if kind == "warm":
                        points = page.evaluate(
                            "() => (document.getElementById('pareto-plot').data || []).map((t) => (t.x || []).length)"
                        )
                        rows = page.locator("#trial-table tbody tr").count()
                    page.close()
                context.close()
        finally:
            browser.close()
    out: dict[str, Any] = {}
    for kind, visits in runs.items():
        times = [t for t, _ in visits]
        out[kind] = {
            "seconds": [round(t, 2) for t in times],
            "median_s": round(statistics.median(times), 2),
            "max_s": round(max(times), 2),
            "parts": visits[-1][1],
        }
    return {
        **out,
        "max_s": out["cold"]["max_s"],
        "warm_max_s": out["warm"]["max_s"],
        "pareto_trace_points": points,
        "table_rows": rows,
        "page_errors": errors[:5],
        "target_met": out["cold"]["max_s"] <= TARGET_PAGE_S and not errors,
        "warm_target_met": out["warm"]["max_s"] <= TARGET_PAGE_S and not errors,
    }


# ---------------------------------------------------------------- clients against a running study
def finished_between(url: str, study_id: int, t0: float, t1: float) -> int:
    import datetime as dt

    from sqlalchemy import func, select

    from tuner.store.storage import StudyDB, TrialRow

    db = StudyDB(url)
    lo, hi = (dt.datetime.fromtimestamp(t, dt.timezone.utc) for t in (t0, t1))
    with db.Session() as s:
        n = s.scalar(
            select(func.count()).where(
                TrialRow.study_id == study_id, TrialRow.finished_at >= lo, TrialRow.finished_at < hi
            )
        )
    db.dispose()
    return int(n or 0)


async def _reader(client: httpx.AsyncClient, paths: list[str], stop: float, stats: dict[str, Any], seed: int) -> None:
    rng = random.Random(seed)  # each reader its own sequence (all started at once, a shared seed made them one)
    while time.monotonic() < stop:
        path = rng.choice(paths)
        start = time.perf_counter()
        try:
            response = await client.get(path)
            if response.status_code != 200:
                stats["errors"].append(f"{response.status_code} {path}")
        except httpx.HTTPError as exc:
            stats["errors"].append(f"{type(exc).__name__} {path}")
        stats["latency_ms"].append((time.perf_counter() - start) * 1000)


async def _streamer(client: httpx.AsyncClient, study_id: int, stop: float, stats: dict[str, Any]) -> None:
    last = "0"
    while time.monotonic() < stop:
        try:
            headers = {"Last-Event-ID": last} if last != "0" else {}
            async with client.stream("GET", f"/api/studies/{study_id}/events", headers=headers) as response:
                if response.status_code != 200:
                    stats["errors"].append(f"{response.status_code} events")
                    await asyncio.sleep(1)
                    continue
                async for line in response.aiter_lines():
                    if line.startswith("id: "):
                        last = line[4:]
                    elif line.startswith("event: "):
                        stats["events"] += 1
                    if time.monotonic() >= stop:
                        return
        except (httpx.ReadTimeout, asyncio.TimeoutError):
            continue
        except httpx.HTTPError as exc:
            stats["errors"].append(f"{type(exc).__name__} events")


async def _pages(client: httpx.AsyncClient, study_id: int, stop: float, stats: dict[str, Any]) -> None:
    """What a browser's load of the study page requests: the HTML, the script, the overview."""
    paths = [f"/studies/{study_id}", "/static/js/study.js", f"/api/studies/{study_id}/overview"]
    while time.monotonic() < stop:
        start = time.perf_counter()
        for path in paths:
            try:
                response = await client.get(path)
                if response.status_code != 200:
                    stats["errors"].append(f"{response.status_code} {path}")
            except httpx.HTTPError as exc:
                stats["errors"].append(f"{type(exc).__name__} {path}")
        stats["page_s"].append(time.perf_counter() - start)


async def load(base: str, running: int, big: list[int], clients: int, duration_s: float) -> dict[str, Any]:
    stats: dict[str, Any] = {"errors": [], "latency_ms": [], "events": 0, "page_s": []}
    paths = [f"/api/studies/{running}", f"/api/studies/{running}/trials?limit=50", f"/api/studies/{running}/pareto"]
    for study_id in big:
        paths += [f"/api/studies/{study_id}", f"/api/studies/{study_id}/trials?limit=50&offset=1000"]
        paths += [f"/api/studies/{study_id}/pareto", "/api/studies?limit=20"]
    n_streams, n_pages = clients * 3 // 10, clients // 10
    n_readers = clients - n_streams - n_pages
    stop = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
    timeout = httpx.Timeout(30.0, read=5.0)
    async with httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits) as client:
        tasks = [_reader(client, paths, stop, stats, seed) for seed in range(n_readers)]
        tasks += [_streamer(client, running, stop, stats) for _ in range(n_streams)]
        tasks += [_pages(client, running, stop, stats) for _ in range(n_pages)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=duration_s + 60)
    lat = stats["latency_ms"]
    return {
        "clients": {"api_readers": n_readers, "event_streams": n_streams, "page_loads": n_pages},
        "requests": len(lat),
        "errors": len(stats["errors"]),
        "error_samples": stats["errors"][:10],
        "read_p50_ms": round(statistics.median(lat), 1) if lat else None,
        "read_p95_ms": round(percentile(lat, 0.95), 1) if lat else None,
        "events_received": stats["events"],
        "page_loads": len(stats["page_s"]),
        "page_load_p95_s": round(percentile(stats["page_s"], 0.95), 2) if stats["page_s"] else None,
    }


def _load_in_child(base: str, running: int, big: list[int], clients: int, duration_s: float, nice: int) -> dict:
    """:func:`load` in a child process at niceness ``nice`` (the clients stand for remote browsers)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_load_child, args=(queue, base, running, big, clients, duration_s, nice))
    child.start()
    try:
        result = queue.get(timeout=duration_s + 180)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    return result


def _load_child(
    queue: Any, base: str, running: int, big: list[int], clients: int, duration_s: float, nice: int
) -> None:
    os.nice(nice)
    queue.put(asyncio.run(load(base, running, big, clients, duration_s)))


def measure_under_load(
    url: str, base: str, big: list[int], clients: int, duration_s: float, quiet_s: float, nice: int = 19
) -> dict:
    spec = noop_spec(f"running-{int(time.time())}", 1_000_000, "random", sleep_ms=20)  # a reused --db has others
    spec["budget"]["minutes"] = (2 * quiet_s + duration_s + 240) / 60  # ends by itself if this script dies
    response = httpx.post(f"{base}/api/studies", json=spec, timeout=30)
    response.raise_for_status()
    study_id = response.json()["id"]
    deadline = time.monotonic() + 180
    while finished_between(url, study_id, 0, time.time()) < 50:  # Ray up, workers warm
        if time.monotonic() > deadline:
            raise RuntimeError("the running study did not start in 180 s")
        time.sleep(1)
    t0 = time.time()
    time.sleep(quiet_s)
    t1 = time.time()
    loaded = _load_in_child(base, study_id, big, clients, duration_s, nice)
    t2 = time.time()
    time.sleep(quiet_s)
    t3 = time.time()
    httpx.post(f"{base}/api/studies/{study_id}/stop", timeout=30)
    before = finished_between(url, study_id, t0, t1) / (t1 - t0)
    during = finished_between(url, study_id, t1, t2) / (t2 - t1)
    after = finished_between(url, study_id, t2, t3) / (t3 - t2)
    quiet = (before + after) / 2
    drop = 1 - during / quiet if quiet else None
    return {
        "running_study_id": study_id,
        "duration_s": duration_s,
        "clients_nice": nice,
        **loaded,
        "trials_per_s_no_clients_before": round(before, 2),
        "trials_per_s_with_clients": round(during, 2),
        "trials_per_s_no_clients_after": round(after, 2),
        "rate_drop": None if drop is None else round(drop, 3),
        "target_met": loaded["errors"] == 0 and drop is not None and drop <= TARGET_RATE_DROP,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-trials", type=int, default=10_000)
    parser.add_argument("--storage-trials", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=60, help="timed requests per endpoint")
    parser.add_argument("--page-repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--quiet-s", type=float, default=20.0, help="rate windows without clients, before and after")
    parser.add_argument("--clients-nice", type=int, default=19, help="niceness of the client processes")
    parser.add_argument("--skip-engine", action="store_true", help="no engine study (reads of the storage one only)")
    parser.add_argument("--port", type=int, default=8101)
    parser.add_argument("--db", help="SQLite file (default: a fresh temporary one)")
    parser.add_argument(
        "--reuse", action="store_true", help="use the studies named engine and storage that --db holds, if any"
    )
    parser.add_argument("--phases", default="reads,page,load", help="which of reads,page,load to measure")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="api-scale-"))
    url = f"sqlite:///{Path(args.db) if args.db else work / 'scale.db'}"
    from tuner.store.storage import StudyDB

    StudyDB(url).create_tables()
    result: dict[str, Any] = {"benchmark": "read path at scale", "db": "sqlite", "load_average": {}}
    note_load = lambda phase: result["load_average"].__setitem__(phase, [round(x, 2) for x in os.getloadavg()])  # noqa: E731
    note_load("start")
    studies = _make_studies(args, url, result)
    phases = set(args.phases.split(","))
    server = start_server(url, args.port, work / "server.log")
    base = f"http://127.0.0.1:{args.port}"
    try:
        for name, study_id in studies.items():
            print(f"reads and page: {name} study", flush=True)
            if "reads" in phases:
                note_load(f"reads_{name}")
                result[f"reads_{name}"] = measure_reads(base, study_id, args.requests)
            if "page" in phases:
                note_load(f"page_{name}")
                result[f"page_{name}"] = measure_page(base, study_id, args.page_repeats)
        if "load" in phases:
            print(f"{args.clients} clients for {args.duration_s:g} s against a running study", flush=True)
            note_load("under_load")
            result["under_load"] = measure_under_load(
                url, base, list(studies.values()), args.clients, args.duration_s, args.quiet_s, args.clients_nice
            )
    finally:
        stop_server(server)
    note_load("end")
    if phases == {"reads", "page", "load"}:
        result["summary"] = _summary(result, studies)
    write_result(result, args.out)


def _existing(url: str, name: str) -> int | None:
    from tuner.store.storage import StudyDB

    db = StudyDB(url)
    try:
        row = next((r for r in db.list_studies() if r.name == name and r.status == "completed"), None)
        return None if row is None else row.id
    finally:
        db.dispose()


def _make_studies(args: argparse.Namespace, url: str, result: dict[str, Any]) -> dict[str, int]:
    """The engine study (run here) and the storage study (written here), or with ``--reuse`` those --db has."""
    studies: dict[str, int] = {}
    reuse = {name: _existing(url, name) for name in ("engine", "storage")} if args.reuse else {}
    if not args.skip_engine:
        if reuse.get("engine") is not None:
            studies["engine"] = reuse["engine"]
            result["engine_study"] = {"study_id": studies["engine"], "reused": True}
        else:
            print(f"engine study: {args.engine_trials} trials", flush=True)
            result["engine_study"] = run_engine_study(url, args.engine_trials, args.workers)
            studies["engine"] = result["engine_study"]["study_id"]
            import ray

            ray.shutdown()  # the engine's local Ray: the running study later gets the server's runner's own
    if reuse.get("storage") is not None:
        studies["storage"] = reuse["storage"]
        result["storage_study"] = {"study_id": studies["storage"], "trials": args.storage_trials, "reused": True}
    else:
        print(f"storage study: {args.storage_trials} trials", flush=True)
        result["storage_study"] = write_storage_study(url, args.storage_trials)
        studies["storage"] = result["storage_study"]["study_id"]
    return studies


def _summary(result: dict[str, Any], studies: dict[str, int]) -> dict[str, Any]:
    engine = result.get("engine_study", {})
    return {
        "engine_trials": engine.get("trials"),
        "engine_front_size": engine.get("front_size"),
        "storage_trials": result["storage_study"]["trials"],
        **{
            f"{name}_p95_ms": {k: v["p95_ms"] for k, v in result[f"reads_{name}"].items() if isinstance(v, dict)}
            for name in studies
        },
        **{f"{name}_page_cold_max_s": result[f"page_{name}"]["max_s"] for name in studies},
        **{f"{name}_page_warm_max_s": result[f"page_{name}"]["warm_max_s"] for name in studies},
        "load_errors": result["under_load"]["errors"],
        "load_rate_drop": result["under_load"]["rate_drop"],
        "targets_met": {
            "reads_p95_le_100ms": all(result[f"reads_{n}"]["targets_met"] for n in studies),
            "page_le_2s_cold": all(result[f"page_{n}"]["target_met"] for n in studies),
            "page_le_2s_warm": all(result[f"page_{n}"]["warm_target_met"] for n in studies),
            "load_0_errors_rate_within_10pct": result["under_load"]["target_met"],
        },
    }


if __name__ == "__main__":
    main()
