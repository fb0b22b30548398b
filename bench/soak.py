"""Soak: 50 clients for 60 s against a study running under ``tuner serve`` on PostgreSQL, with one
PostgreSQL restart and one SIGKILL of the server's runner in the middle, in one run on loopback.

1. A database of its own (``--database``, default ``tuner_soak``) on the PostgreSQL server of
   ``--db-url`` (or ``$TUNER_SOAK_PG_URL``), dropped and created afresh, dropped again at the end.
2. ``tuner serve`` on 127.0.0.1 ``--port`` with its supervised runner (``--workers`` Ray CPU workers).
3. A ``noop`` study submitted through REST: ``args.sleep_ms`` per trial, a budget of trials that the
   workers cannot finish before the soak ends even at full speed (``--trials``, default
   ``warm + workers * duration / sleep``), the random sampler.
4. Once it has finished a few trials, ``--clients`` (50) concurrent clients for ``--duration-s`` (60 s):
   API readers (``/api/studies``, the study, ``/trials?limit=50`` first and latest, ``/pareto``), event
   streams (reconnecting with ``Last-Event-ID``) and page loads (the page, its script, ``/overview``).
   Every response's status and time is recorded; ``/healthz`` is polled every 0.25 s beside them.
5. At ``--pg-restart-at`` seconds into the soak, ``pg_ctlcluster VER NAME restart -m fast`` (the cluster
   serving the URL's port), or ``pg_ctl -D --pgdata -m fast -w restart``, or ``--pg-restart-cmd``; at
   ``--runner-kill-at``, SIGKILL of the runner process that ``tuner serve`` supervises (its child
   ``tuner.cli worker``). A blip window runs from the event to the first healthy ``/healthz`` after it,
   plus ``--margin-s``; a response counts as inside when its request overlaps the window.
6. After the soak: the study runs until it completes its budget; then, from the database: no trial lost
   (every trial a client or a stream saw finished is still there, finished, with the same status and
   score), no number repeated or skipped, measured trials equal to the budget; 5xx inside and outside
   the windows; p50/p95 latency per endpoint; the study's trial rate; processes left behind.

    PYTHONPATH=. python bench/soak.py --out bench/results/soak-pg-cpu.json

Restarting PostgreSQL drops every connection of every user of that cluster for about a second (the
script says so before it does). Everything is bounded in time (``--timeout-s`` over the whole run,
per-request timeouts) and every process it started is stopped, on error too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import math
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result
from soak_figures import LEFT_AFTER_S, classify, event_out, latencies, rates, runner_log, summarize, timeline

REPO = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgresql+psycopg://tuner:tuner@127.0.0.1:5432/tuner_test"
TERMINAL = ("completed", "stopped", "failed")


class Timeout(Exception):
    """The whole run took longer than ``--timeout-s``."""


def loopback(host: str | None) -> bool:
    if host in (None, "", "localhost"):
        return host == "localhost"
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


# ---------------------------------------------------------------- the database of its own
def _psql_as_postgres(url: Any, sql: str) -> None:
    """``sql`` through ``psql`` as the postgres user (root here: ``runuser``), on the URL's port: over the
    default socket directory first, then over TCP to the URL's host."""
    base = ["psql", "-v", "ON_ERROR_STOP=1", "-qtA", "-p", str(url.port or 5432), "-d", "postgres", "-c", sql]
    if os.geteuid() == 0:
        base = ["runuser", "-u", "postgres", "--", *base]
    last = None
    for extra in ([], ["-h", url.host or "127.0.0.1"]):
        last = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        if last.returncode == 0:
            return
    raise RuntimeError(f"psql as postgres failed: {last.stderr.strip() if last else ''}")


def admin(url: Any, sql: str) -> None:
    """Run ``sql`` (CREATE/DROP DATABASE) with the URL's own role, or as the postgres user when that role
    may not (a role without CREATEDB)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    engine = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(sql))
        return
    except DBAPIError as exc:
        reason = str(exc.orig).splitlines()[0] if exc.orig else str(exc)
    finally:
        engine.dispose()
    print(f"  ({reason}: as the postgres user instead)", flush=True)
    _psql_as_postgres(url, sql)


def own_database(url_text: str, name: str) -> str:
    url = make_url(url_text)
    owner = url.username or "postgres"
    admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin(url, f'CREATE DATABASE "{name}" OWNER "{owner}"')
    return url.set(database=name).render_as_string(hide_password=False)


# ---------------------------------------------------------------- the PostgreSQL restart
def restart_command(url_text: str, pgdata: str | None, given: str | None) -> list[str]:
    """How to restart the cluster serving ``url_text``: ``given``; else ``pg_ctl`` on ``pgdata``; else the
    ``pg_ctlcluster`` cluster listening on the URL's port."""
    if given:
        return shlex.split(given)
    if pgdata:
        pg_ctl = shutil.which("pg_ctl") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), None)
        cmd = [str(pg_ctl or "pg_ctl"), "-D", pgdata, "-m", "fast", "-w", "restart"]
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd
    port = str(make_url(url_text).port or 5432)
    if shutil.which("pg_lsclusters"):
        listing = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, timeout=30).stdout
        for line in listing.splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[2] == port:
                return ["pg_ctlcluster", fields[0], fields[1], "restart", "-m", "fast"]
    raise SystemExit(f"no way to restart the PostgreSQL on port {port}: pass --pgdata or --pg-restart-cmd")


# ---------------------------------------------------------------- processes
def _proc_stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, session id, process group) of ``pid``, or None when it is gone (or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[3]), int(fields[2])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def runner_pid(server_pid: int) -> int | None:
    """The runner ``tuner serve`` supervises: its child running ``tuner.cli worker``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _proc_stat(int(entry.name))) and stat[0] == server_pid:
            if "tuner.cli worker" in _cmdline(int(entry.name)):
                return int(entry.name)
    return None


def in_sessions(sessions: set[int]) -> list[dict[str, Any]]:
    """Live processes whose session is one of ``sessions`` (the server's, each runner's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _proc_stat(int(entry.name))) and stat[1] in sessions:
            found.append({"pid": int(entry.name), "pgid": stat[2], "cmd": _cmdline(int(entry.name)).strip()[:160]})
    return found


def left_behind(sessions: set[int], wait_s: float) -> list[dict[str, Any]]:
    """What is still alive in ``sessions`` after up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while (left := in_sessions(sessions)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def start_server(url: str, port: int, workers: int, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TUNER_API_TOKEN", None)  # loopback, no token
    cmd = [sys.executable, "-m", "tuner.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--db", url]
    cmd += ["--workers", str(workers)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tuner serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json().get("status") == "ok":
                return proc
        time.sleep(0.3)
    stop_server(proc)
    raise RuntimeError("tuner serve did not answer /healthz ok in 120 s")


def stop_server(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM the server (it stops its runner gracefully), then SIGKILL its process group if it lingers.
    Returns the seconds the graceful stop took."""
    started = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    return time.monotonic() - started


# ---------------------------------------------------------------- what the clients saw
class Record:
    """Every response (start, end, endpoint, status or error name, Retry-After), stream drops, and the
    trials seen finished (number -> (status, score)), shared by the clients' tasks and threads."""

    def __init__(self) -> None:
        self.responses: list[tuple[float, float, str, int | str, str | None]] = []
        self.stream_drops: list[tuple[float, str]] = []
        self.events = 0
        self.seen: dict[int, tuple[str, Any]] = {}
        self.seen_changed: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def response(self, start: float, label: str, status: int | str, retry_after: str | None = None) -> None:
        self.responses.append((start, time.time(), label, status, retry_after))

    def saw(self, trials: list[dict[str, Any]]) -> None:
        with self.lock:
            for t in trials:
                if t.get("status") in (None, "running"):
                    continue
                now = (t["status"], (t.get("metrics") or {}).get("score"))
                before = self.seen.setdefault(int(t["number"]), now)
                if before != now:
                    self.seen_changed.append({"number": t["number"], "first": before, "later": now})


READS = {
    "GET /api/studies": "/api/studies",
    "GET /api/studies/{id}": "/api/studies/{id}",
    "GET /api/studies/{id}/trials?limit=50": "/api/studies/{id}/trials?limit=50",
    "GET /api/studies/{id}/trials?limit=50&sort=-number": "/api/studies/{id}/trials?limit=50&sort=-number",
    "GET /api/studies/{id}/pareto": "/api/studies/{id}/pareto",
}
PAGE = {
    "GET /studies/{id}": "/studies/{id}",
    "GET /static/js/study.js": "/static/js/study.js",
    "GET /api/studies/{id}/overview": "/api/studies/{id}/overview",
}


async def _get(client: httpx.AsyncClient, rec: Record, label: str, path: str) -> httpx.Response | None:
    start = time.time()
    try:
        response = await client.get(path)
    except httpx.HTTPError as exc:
        rec.response(start, label, type(exc).__name__)
        return None
    rec.response(start, label, response.status_code, response.headers.get("retry-after"))
    return response


async def reader(client: httpx.AsyncClient, rec: Record, study_id: int, stop: float, seed: int) -> None:
    rng = random.Random(seed)
    while time.time() < stop:
        label = rng.choice(list(READS))
        response = await _get(client, rec, label, READS[label].format(id=study_id))
        if response is not None and response.status_code == 200 and "/trials" in label:
            rec.saw(response.json()["items"])
        elif response is None or response.status_code >= 500:
            await asyncio.sleep(0.2)  # what a client does on an error: not a tight loop


async def page_loader(client: httpx.AsyncClient, rec: Record, study_id: int, stop: float) -> None:
    while time.time() < stop:
        for label, path in PAGE.items():
            response = await _get(client, rec, label, path.format(id=study_id))
            if response is not None and response.status_code == 200 and label.endswith("overview"):
                body = response.json()
                rec.saw(body["trials"]["items"] + body["failures"])
        await asyncio.sleep(0.5)  # a person looking at the page before the next load


async def streamer(client: httpx.AsyncClient, rec: Record, study_id: int, stop: float) -> None:
    """An event stream, reconnecting like ``EventSource`` (``Last-Event-ID``) until ``stop``."""
    last: str | None = None
    label = "GET /api/studies/{id}/events"
    while time.time() < stop:
        start, opened = time.time(), False
        headers = {"Last-Event-ID": last} if last else {}
        try:
            async with client.stream("GET", f"/api/studies/{study_id}/events?after=0", headers=headers) as response:
                opened = True
                rec.response(start, label, response.status_code, response.headers.get("retry-after"))
                if response.status_code != 200:
                    await asyncio.sleep(1)
                    continue
                event = None
                async for line in response.aiter_lines():
                    if line.startswith("id: "):
                        last = line[4:]
                    elif line.startswith("event: "):
                        event = line[7:]
                        rec.events += 1
                    elif line.startswith("data: ") and event == "trials":
                        rec.saw(json.loads(line[6:])["trials"])
                    if time.time() >= stop:
                        return
            await asyncio.sleep(1)  # the stream ended: the study reached a terminal status
        except httpx.HTTPError as exc:
            if opened:  # the stream broke after its headers: a drop, which EventSource recovers from
                rec.stream_drops.append((time.time(), type(exc).__name__))
            else:
                rec.response(start, label, type(exc).__name__)
            await asyncio.sleep(0.5)


async def clients(base: str, rec: Record, study_id: int, n: int, duration_s: float) -> dict[str, int]:
    n_streams, n_pages = n * 3 // 10, n // 10
    n_readers = n - n_streams - n_pages
    stop = time.time() + duration_s
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    timeout = httpx.Timeout(30.0, read=20.0)  # streams send a keep-alive at least every 15 s
    async with httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits) as client:
        tasks = [reader(client, rec, study_id, stop, seed) for seed in range(n_readers)]
        tasks += [streamer(client, rec, study_id, stop) for _ in range(n_streams)]
        tasks += [page_loader(client, rec, study_id, stop) for _ in range(n_pages)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=duration_s + 60)
    return {"api_readers": n_readers, "event_streams": n_streams, "page_loads": n_pages}


class HealthPoller(threading.Thread):
    """``GET /healthz`` every ``every_s`` seconds: (request start, healthy?, body or error)."""

    def __init__(self, base: str, every_s: float = 0.25) -> None:
        super().__init__(name="healthz", daemon=True)
        self.base, self.every_s = base, every_s
        self.samples: list[tuple[float, bool, Any]] = []
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=5) as client:
            while not self.done.wait(self.every_s):
                start = time.time()
                try:
                    response = client.get("/healthz")
                    body = response.json()
                    ok = response.status_code == 200 and body.get("status") == "ok"
                except (httpx.HTTPError, ValueError) as exc:
                    ok, body = False, type(exc).__name__
                self.samples.append((start, ok, body))

    def healthy_again(self, start: float, end: float, settle_s: float = 2.0) -> float | None:
        """When the service answered healthy again after an event that ran from ``start`` to ``end``: the
        first ok sample from ``end`` on that follows the first not-ok one seen within ``settle_s`` of
        ``end`` (the first ok one from ``end`` on when none was not ok)."""
        bad = next((s[0] for s in self.samples if start <= s[0] <= end + settle_s and not s[1]), start)
        return next((s[0] for s in self.samples if s[0] >= max(bad, end) and s[1]), None)

    def transitions(self, t0: float) -> list[list[Any]]:
        """Each change of ``/healthz``'s answer: [seconds from ``t0``, answer]."""
        out: list[list[Any]] = []
        for start, _, body in self.samples:
            if not out or out[-1][1] != body:
                out.append([round(start - t0, 2), body])
        return out

    def not_ok(self, lo: float, hi: float) -> list[Any]:
        return sorted({json.dumps(s[2], sort_keys=True) for s in self.samples if lo <= s[0] <= hi and not s[1]})


# ---------------------------------------------------------------- the faults
def restart_postgres(cmd: list[str], url: str, log: Path) -> dict[str, Any]:
    where = make_url(url)
    print(
        f"WARNING: restarting the PostgreSQL cluster on {where.host}:{where.port or 5432} now ({' '.join(cmd)}):"
        " every user of that cluster loses its connections for about a second",
        flush=True,
    )
    start = time.time()
    # Not a pipe: a server that pg_ctl starts inherits its output and would hold a pipe open for good.
    with log.open("ab") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=120, stdin=subprocess.DEVNULL)
    end = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {log.read_text()[-1000:]}")
    return {"event": "postgresql restart", "command": " ".join(cmd), "start": start, "end": end}


def kill_runner(server_pid: int, runners: set[int]) -> dict[str, Any]:
    pid = runner_pid(server_pid)
    if pid is None:
        raise RuntimeError("no runner process under tuner serve")
    runners.add(pid)
    tree = in_sessions({pid})
    start = time.time()
    os.kill(pid, signal.SIGKILL)
    print(f"SIGKILL sent to the runner (pid {pid})", flush=True)
    time.sleep(LEFT_AFTER_S)
    left = in_sessions({pid})
    return {
        "event": "runner SIGKILL",
        "pid": pid,
        "processes_in_its_session": len(tree),
        f"of_them_alive_{LEFT_AFTER_S:g}_s_later": left,
        "start": start,
        "end": start,
    }


# ---------------------------------------------------------------- reading the figures
def check_trials(url: str, study_id: int, budget: int, rec: Record) -> dict[str, Any]:
    from tuner.store.storage import StudyDB, measured_count

    db = StudyDB(url)
    try:
        row = db.get_study(study_id)
        rows = db.trials(study_id)
        counts = db.status_counts(study_id)
    finally:
        db.dispose()
    numbers = [t.number for t in rows]
    by_number = {t.number: t for t in rows}
    lost = []
    for number, (status, score) in sorted(rec.seen.items()):
        t = by_number.get(number)
        if t is None or t.status != status or (t.metrics or {}).get("score") != score:
            lost.append({"number": number, "seen": [status, score], "now": None if t is None else t.status})
    finished = [t.finished_at.timestamp() for t in rows if t.finished_at is not None]
    started = [t.started_at.timestamp() for t in rows if t.started_at is not None]
    return {
        "study_status": row.status,
        "status_counts": dict(counts),
        "trials": len(rows),
        "measured": measured_count(counts),
        "running_left": sum(t.status == "running" for t in rows),
        "budget": budget,
        "numbers_repeated": len(numbers) - len(set(numbers)),
        "numbers_missing": len(set(range(max(numbers, default=-1) + 1)) - set(numbers)),
        "seen_finished_by_clients": len(rec.seen),
        "seen_changed_between_reads": rec.seen_changed[:10],
        "lost": len(lost),
        "lost_samples": lost[:10],
        "attempts_over_1": sum((t.attempt or 1) > 1 for t in rows),
        "finished_at": finished,
        "first_started": min(started, default=None),
    }


# ---------------------------------------------------------------- the run
def noop_spec(name: str, trials: int, sleep_ms: float, minutes: float) -> dict[str, Any]:
    return {
        "name": name,
        "workload": "noop",
        "args": {"sleep_ms": sleep_ms},
        "space": {"tile": {"high": 128}, "stages": {"high": 4}},  # every config feasible
        "objectives": [{"metric": "score"}, {"metric": "cost"}],
        "budget": {"trials": trials, "minutes": minutes, "trial_timeout_s": 60},
        "sampler": "random",
        "seed": 0,
        "warm_start": False,
        "remeasure": {"top_k": 0},
    }


def wait_for(base: str, study_id: int, done: Any, timeout_s: float, every_s: float = 1.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = httpx.get(f"{base}/api/studies/{study_id}", timeout=10)
            if response.status_code == 200:
                last = response.json()
                if done(last):
                    return last
        time.sleep(every_s)
    raise RuntimeError(f"study {study_id} not there in {timeout_s:.0f} s: {json.dumps(last)[:500]}")


def soak(
    args: argparse.Namespace, url: str, base: str, server: subprocess.Popen[bytes], runners: set[int], work: Path
) -> dict:
    budget = args.trials or args.warm_trials + math.ceil(args.workers * args.duration_s * 1000 / args.sleep_ms)
    spec = noop_spec("soak", budget, args.sleep_ms, args.timeout_s / 60)
    response = httpx.post(f"{base}/api/studies", json=spec, timeout=30)
    response.raise_for_status()
    study_id = response.json()["id"]
    print(f"study {study_id}: budget {budget} trials of {args.sleep_ms:g} ms", flush=True)
    wait_for(base, study_id, lambda s: s["measured"] >= args.warm_trials, args.start_timeout_s)
    rec, health = Record(), HealthPoller(base)
    health.start()
    restart = args.restart
    events: list[dict[str, Any]] = []
    t0 = time.time()

    def faults() -> None:
        time.sleep(max(0.0, t0 + args.pg_restart_at - time.time()))
        events.append(restart_postgres(restart, url, work / "restart.log"))
        time.sleep(max(0.0, t0 + args.runner_kill_at - time.time()))
        events.append(kill_runner(server.pid, runners))

    thread = threading.Thread(target=faults, name="faults", daemon=True)
    thread.start()
    print(f"{args.clients} clients for {args.duration_s:g} s", flush=True)
    mix = asyncio.run(clients(base, rec, study_id, args.clients, args.duration_s))
    t1 = time.time()
    thread.join(timeout=120)
    if len(events) != 2:
        raise RuntimeError(f"the faults did not both happen: {events}")
    still_running = wait_for(base, study_id, lambda s: True, 30)["status"]
    print(f"soak over (study {still_running}); waiting for the study to complete", flush=True)
    final = wait_for(base, study_id, lambda s: s["status"] in TERMINAL, args.timeout_s)
    t2 = time.time()
    health.done.set()
    health.join(timeout=10)
    for event in events:
        back = health.healthy_again(event["start"], event["end"])
        event["healthy_again"] = back
        event["window"] = [event["start"], (back or event["end"]) + args.margin_s]
        event["healthz_not_ok"] = health.not_ok(event["start"], back or event["end"])
    windows = [tuple(e["window"]) for e in events]
    killed_left = events[1].pop(f"of_them_alive_{LEFT_AFTER_S:g}_s_later")
    trials = check_trials(url, study_id, budget, rec)
    finished, first = trials.pop("finished_at"), trials.pop("first_started")
    return {
        "study_id": study_id,
        "spec": spec,
        "clients": mix,
        "status_when_soak_ended": still_running,
        "study_completed_s_after_soak": round(t2 - t1, 1),
        "final_study": {k: final.get(k) for k in ("status", "measured", "counts", "error")},
        "events": [event_out(e, t0) for e in events],
        "killed_runner_left_behind": killed_left,
        "runner_log": runner_log(work / "serve.log", t0),
        "margin_s": args.margin_s,
        "healthz": health.transitions(t0),
        "requests": len(rec.responses),
        "events_received": rec.events,
        "errors": classify(rec, windows, t0),
        "latency": latencies(rec),
        "timeline": timeline(rec, t0),
        "trials": trials,
        "rate": rates(finished, first, t0, t1, events),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-url", default=os.environ.get("TUNER_SOAK_PG_URL", DEFAULT_URL))
    parser.add_argument("--database", default="tuner_soak", help="the database of its own, dropped and created")
    parser.add_argument("--keep-db", action="store_true", help="leave the database there at the end")
    parser.add_argument("--pgdata", help="restart with pg_ctl on this data directory (default: pg_ctlcluster)")
    parser.add_argument("--pg-restart-cmd", help="restart with this command instead")
    parser.add_argument("--port", type=int, default=8710)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--pg-restart-at", type=float, default=20.0, help="seconds into the soak")
    parser.add_argument("--runner-kill-at", type=float, default=40.0, help="seconds into the soak")
    parser.add_argument("--margin-s", type=float, default=2.0, help="added to each blip window's end")
    parser.add_argument("--sleep-ms", type=float, default=500.0, help="each trial's sleep")
    parser.add_argument("--trials", type=int, help="budget (default: more than the workers can do in the soak)")
    parser.add_argument("--warm-trials", type=int, default=10, help="trials finished before the clients start")
    parser.add_argument("--start-timeout-s", type=float, default=300.0, help="for the runner's first trials")
    parser.add_argument("--timeout-s", type=float, default=720.0, help="the whole run, hard")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args()
    where = make_url(args.db_url)
    if not where.drivername.startswith("postgresql") or not loopback(where.host):
        raise SystemExit(f"--db-url must be a PostgreSQL on loopback, got {where.render_as_string()}")

    def out_of_time(*_: Any) -> None:
        raise Timeout(f"the soak ran past --timeout-s {args.timeout_s:g}")

    args.restart = restart_command(args.db_url, args.pgdata, args.pg_restart_cmd)  # before anything starts
    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(int(args.timeout_s))
    load_before = [round(x, 2) for x in os.getloadavg()]
    url = own_database(args.db_url, args.database)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"soak-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    server = runners = None
    try:
        print(f"tuner serve on 127.0.0.1:{args.port}, database {args.database}", flush=True)
        server = start_server(url, args.port, args.workers, work / "serve.log")
        runners = {pid for pid in [runner_pid(server.pid)] if pid}
        run = soak(args, url, f"http://127.0.0.1:{args.port}", server, runners, work)
        run["load_average_during"] = [round(x, 2) for x in os.getloadavg()]
        signal.alarm(0)
        run["server_stop_s"] = round(stop_server(server), 1)
        left = left_behind({server.pid, *runners}, wait_s=10)
        run["processes_left_behind"] = left
    finally:
        signal.alarm(0)
        if server is not None and server.poll() is None:
            stop_server(server)
        for proc in in_sessions({server.pid, *(runners or set())} if server else set()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc["pid"], signal.SIGKILL)
        if server is not None:
            log = (work / "serve.log").read_text(errors="replace")
            print(f"server log: {work / 'serve.log'} ({len(log.splitlines())} lines)", flush=True)
        if not args.keep_db:
            with contextlib.suppress(Exception):
                admin(make_url(args.db_url), f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
    result: dict[str, Any] = {
        "benchmark": "soak: clients, a PostgreSQL restart and a runner SIGKILL against a running study",
        "db": "postgresql",
        "loopback_only": True,
        "load_average_before": load_before,
        **run,
    }
    result["targets"] = summarize(run, left)
    result["summary"] = {
        "requests": run["requests"],
        "5xx_inside_blips": run["errors"]["5xx_inside"],
        "5xx_outside_blips": run["errors"]["5xx_outside"],
        "trials": {k: run["trials"][k] for k in ("measured", "budget", "lost", "numbers_repeated", "study_status")},
        "rate": run["rate"],
        "events": run["events"],
        "verdicts": {t["target"]: t["verdict"] for t in result["targets"]},
    }
    write_result(result, args.out)


if __name__ == "__main__":
    main()
