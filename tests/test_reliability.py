"""The service survives its dependencies failing: a PostgreSQL restart mid-study, a killed runner, a
killed server. Each runs ``tuner serve`` for real (API + supervised runner + local Ray)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_deployment import stop

pytestmark = pytest.mark.timeout(400)
PG_BIN = Path("/usr/lib/postgresql/15/bin")
TOKEN = "reliability-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def study_spec(name: str, trials: int, sleep_ms: int) -> dict:
    return {
        "name": name,
        "workload": "noop",
        "args": {"sleep_ms": sleep_ms},
        "space": {"tile": {"high": 128}, "stages": {"high": 4}},
        "objectives": [{"metric": "score"}, {"metric": "cost"}],
        "budget": {"trials": trials},
        "seed": 11,
    }


def _as_postgres(*cmd: str) -> list[str]:
    """Run a PostgreSQL tool as the postgres user when we are root (initdb refuses root)."""
    if os.geteuid() != 0:
        return list(cmd)
    return ["runuser", "-u", "postgres", "--", *cmd]


@pytest.fixture
def private_pg() -> Iterator[tuple[str, Path]]:
    """A PostgreSQL cluster of this test's own (it restarts it): (URL, data directory)."""
    if not (PG_BIN / "initdb").exists() or (os.geteuid() == 0 and shutil.which("runuser") is None):
        pytest.skip("needs PostgreSQL 15's initdb/pg_ctl")
    root = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    port = 8202
    subprocess.run(
        _as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres"),
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1"
    subprocess.run(
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start"),
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=60,
    )
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", data
    finally:
        subprocess.run(_as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"))
        shutil.rmtree(root, ignore_errors=True)


class Server:
    """``tuner serve`` on one of this test file's ports, with its runner, logging to a file."""

    def __init__(self, db_url: str, port: int, log: Path, options: tuple[str, ...] = ("--workers", "2")) -> None:
        import httpx

        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tuner.cli", "serve", "--db", db_url, "--port", str(port), *options],
                env={**os.environ, "TUNER_API_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.client = httpx.Client(base_url=self.url, timeout=30)
        deadline = time.monotonic() + 90
        while True:
            try:
                if self.client.get("/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, self.tail()
            time.sleep(0.3)

    def tail(self) -> str:
        return self.log.read_text()[-6000:]

    def submit(self, spec: dict) -> str:
        answer = self.client.post("/api/studies", json=spec, headers=AUTH)
        assert answer.status_code == 202, answer.text
        return answer.json()["url"]

    def wait_for(self, study_url: str, done: object, timeout_s: float = 240) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            response = self.client.get(study_url)
            if response.status_code == 200 and done(response.json()):  # type: ignore[operator]
                return response.json()
            assert time.monotonic() < deadline, f"{response.text}\n{self.tail()}"
            time.sleep(0.3)

    def close(self) -> None:
        self.client.close()
        stop(self.proc, timeout=90)


def _check_trials(db_url: str, name: str, budget: int, before: dict[int, dict]) -> None:
    """The study met its budget; no finished trial was lost or changed, no number was used twice."""
    from tuner.store.storage import StudyDB, measured_count

    db = StudyDB(db_url)
    row = db.find_study(name)
    trials = db.trials(row.id)
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)) and numbers == list(range(len(numbers))), numbers
    assert measured_count(db.status_counts(row.id)) >= budget and not [t for t in trials if t.status == "running"]
    now = {t.number: t.metrics for t in trials}
    assert all(now[number] == metrics for number, metrics in before.items())
    db.dispose()


def _finished(db_url: str, name: str) -> dict[int, dict]:
    from tuner.store.storage import StudyDB

    db = StudyDB(db_url)
    row = db.find_study(name)
    done = {t.number: t.metrics for t in db.trials(row.id) if t.status != "running"}
    db.dispose()
    return done


def test_a_postgresql_restart_mid_study_loses_nothing(private_pg: tuple[str, Path], tmp_path: Path) -> None:
    db_url, data = private_pg
    server = Server(db_url, 8203, tmp_path / "serve.log")
    print("server log:", server.log)
    codes: list[int] = []
    reading = threading.Event()

    def read_all_the_time(study_url: str) -> None:
        import httpx

        with httpx.Client(base_url=server.url, timeout=10) as client:
            while not reading.is_set():
                try:
                    codes.append(client.get(study_url).status_code)
                    codes.append(client.get("/api/studies").status_code)
                except httpx.TransportError:
                    codes.append(-1)
                time.sleep(0.05)

    try:
        study_url = server.submit(study_spec("blip", trials=30, sleep_ms=300))
        server.wait_for(study_url, lambda s: s["measured"] >= 5)
        reader = threading.Thread(target=read_all_the_time, args=(study_url,))
        reader.start()
        before = _finished(db_url, "blip")
        # The server's output goes to its log: a pipe it inherited would never close.
        pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(data.parent / "log"), "-m", "fast", "-w"]
        restarted = subprocess.run(_as_postgres(*pg_ctl, "restart"), stdout=subprocess.DEVNULL, timeout=60)
        assert restarted.returncode == 0
        time.sleep(3)
        reading.set()
        reader.join(timeout=30)
        final = server.wait_for(study_url, lambda s: s["status"] in ("completed", "failed"))
        assert final["status"] == "completed", f"{final}\n{server.tail()}"
        assert server.client.get("/healthz").json()["status"] == "ok"
        log = server.tail()
    finally:
        server.close()
    assert 500 not in codes and 200 in codes, codes  # reads during the blip: 503 (Retry-After), never 500
    assert "crashed the orchestrator" not in log and "Traceback" not in log, log
    _check_trials(db_url, "blip", 30, before)


def _runner_pid(server: Server) -> int:
    out = subprocess.run(
        ["pgrep", "-P", str(server.proc.pid), "-f", "tuner.cli worker"], capture_output=True, text=True
    )
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 1, (out.stdout, server.tail())
    return pids[0]


def test_a_killed_runner_is_restarted_and_resumes_its_study(sqlite_url: str, tmp_path: Path) -> None:
    server = Server(sqlite_url, 8204, tmp_path / "serve.log")
    try:
        assert server.client.get("/healthz").json() == {"status": "ok", "db": "ok", "runner": "running"}
        study_url = server.submit(study_spec("supervised", trials=16, sleep_ms=300))
        server.wait_for(study_url, lambda s: s["measured"] >= 3)
        before = _finished(sqlite_url, "supervised")
        first = _runner_pid(server)
        os.kill(first, signal.SIGKILL)
        killed_at = time.monotonic()
        deadline = time.monotonic() + 10
        while (health := server.client.get("/healthz").json())["runner"] == "running" and _runner_pid_or_none(
            server
        ) in (None, first):
            assert time.monotonic() < deadline, health
            time.sleep(0.05)
        assert health["status"] == "degraded" and health["runner"] == "restarting", health
        deadline = time.monotonic() + 60
        while _runner_pid_or_none(server) in (None, first):
            assert time.monotonic() < deadline, server.tail()
            time.sleep(0.2)
        resumed = server.wait_for(study_url, lambda s: s["measured"] > len(before) + 1)
        # The runner's lease is 30 s: the study was taken over by the new runner within it (plus start-up).
        assert time.monotonic() - killed_at < 30 + 60, resumed
        final = server.wait_for(study_url, lambda s: s["status"] == "completed")
        assert final["measured"] >= 16
        assert server.client.get("/healthz").json()["status"] == "ok"
        log = server.tail()
    finally:
        server.close()
    assert "exited with status -9; starting another" in log, log
    _check_trials(sqlite_url, "supervised", 16, before)
    # The server's graceful stop took its runner with it.
    assert subprocess.run(["pgrep", "-f", f"tuner.cli worker --db {sqlite_url}"]).returncode == 1


def _runner_pid_or_none(server: Server) -> int | None:
    out = subprocess.run(
        ["pgrep", "-P", str(server.proc.pid), "-f", "tuner.cli worker"], capture_output=True, text=True
    )
    pids = [int(p) for p in out.stdout.split()]
    return pids[0] if len(pids) == 1 else None


def test_a_runner_whose_server_died_stops(sqlite_url: str, tmp_path: Path) -> None:
    server = Server(sqlite_url, 8205, tmp_path / "serve.log")
    runner = _runner_pid(server)
    try:
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while _alive(runner):
            assert time.monotonic() < deadline, f"the orphaned runner {runner} still runs\n{server.tail()}"
            time.sleep(0.3)
    finally:
        server.client.close()
        try:
            os.killpg(server.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.killpg(runner, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert "is gone; stopping" in server.tail()


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie nobody reaped yet has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_a_postgresql_restart_under_tuner_run_loses_nothing(private_pg: tuple[str, Path], tmp_path: Path) -> None:
    import yaml

    db_url, data = private_pg
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(study_spec("blip-run", trials=24, sleep_ms=300)))
    run = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "run", str(spec_path), "--db", db_url, "--workers", "2", "--quiet"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while len(before := _finished_or_empty(db_url, "blip-run")) < 5:
            assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
            time.sleep(0.3)
        pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(data.parent / "log"), "-m", "fast", "-w"]
        assert subprocess.run(_as_postgres(*pg_ctl, "restart"), stdout=subprocess.DEVNULL, timeout=60).returncode == 0
        out, _ = run.communicate(timeout=240)
    finally:
        stop(run)
    assert run.returncode == 0 and "Traceback" not in out, out
    _check_trials(db_url, "blip-run", 24, before)


def _finished_or_empty(db_url: str, name: str) -> dict[int, dict]:
    from tuner.store.storage import StudyDB

    db = StudyDB(db_url)
    try:
        return _finished(db_url, name) if db.schema_is_current() and db.find_study(name) else {}
    finally:
        db.dispose()


RUNNER_WITH_CHILDREN = """
import subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
# like a local Ray: an agent in the runner's process group, a worker in a process group of its own
agent = subprocess.Popen(sleep)
worker = subprocess.Popen(sleep, process_group=0)
with open(sys.argv[1], "a") as out:
    out.write(f"{agent.pid} {worker.pid}\\n")
time.sleep(300)
"""


def test_what_a_dead_runner_leaves_behind_is_killed(tmp_path: Path) -> None:
    """A runner SIGKILLed (or stopped) takes its session with it: its Ray's agents and workers do not
    live on beside the next runner (a trial still running on a GPU among them)."""
    from tuner.run.supervisor import RunnerSupervisor

    pids_file = tmp_path / "pids"
    supervisor = RunnerSupervisor([sys.executable, "-c", RUNNER_WITH_CHILDREN, str(pids_file)], stop_timeout_s=10)

    def children(n: int) -> list[int]:
        deadline = time.monotonic() + 30
        while len(lines := pids_file.read_text().splitlines() if pids_file.exists() else []) < n:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return [int(p) for p in lines[n - 1].split()]

    def gone(pids: list[int]) -> bool:
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not any(_alive(p) for p in pids)

    supervisor.start()
    try:
        first = children(1)
        os.kill(supervisor.process.pid, signal.SIGKILL)
        assert gone(first), [Path(f"/proc/{p}/cmdline").read_bytes() for p in first if _alive(p)]
        children(2)  # the restarted runner's, which its graceful stop takes with it
        assert supervisor.restarts == 1
    finally:
        supervisor.stop()
        every = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
        stopped = gone(every)
        for pid in filter(_alive, every):  # a failed run of this test leaves nothing behind either
            os.kill(pid, signal.SIGKILL)
    assert stopped


def _finished_trial(db: object, study_id: int, number: int) -> None:
    from tuner.store.storage import StudyDB

    assert isinstance(db, StudyDB)
    insert = db.insert_op(study_id, number, {"x": number / 10}, optuna_trial_id=None)
    finish = db.finish_op(
        study_id,
        number,
        status="ok",
        metrics={"score": number / 10, "cost": 1.0},
        feasible=True,
        timing_comparable=False,
        error=None,
        worker="test",
        attempt=1,
        fingerprint=None,
    )
    db.apply([insert, finish])


def _next_trials(lines: Iterator[str]) -> list[int]:
    """The trial numbers of the stream's next ``event: trials``."""
    event = None
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event == "trials":
            return [t["number"] for t in json.loads(line[6:])["trials"]]
    return []


def test_an_event_stream_waits_out_a_database_blip(private_pg: tuple[str, Path], tmp_path: Path) -> None:
    """A stream open while PostgreSQL goes away and comes back stays open and goes on with what changes
    after: its response has started, so it cannot answer 503; it was cut mid-stream (a traceback in the
    server's log and an incomplete chunked body for every open dashboard)."""
    import httpx
    from sqlalchemy.engine import make_url

    from tests.test_queries import _noop_spec
    from tuner.store.storage import StudyDB

    db_url, data = private_pg
    db = StudyDB(db_url)
    db.create_tables()
    study_id = db.create_study(name="stream", workload="noop", spec=_noop_spec("stream"), space={}, space_hash="h").id
    _finished_trial(db, study_id, 0)
    server = Server(db_url, 8206, tmp_path / "serve.log", options=("--no-runner",))
    pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(data.parent / "log"), "-w"]
    options = f"-p {make_url(db_url).port} -k {data.parent} -c listen_addresses=127.0.0.1"
    seen: list[int] = []
    try:
        with server.client.stream("GET", f"/api/studies/{study_id}/events?after=0", timeout=20) as stream:
            lines = stream.iter_lines()
            seen += _next_trials(lines)
            assert seen == [0]
            down = subprocess.run(_as_postgres(*pg_ctl, "-m", "fast", "stop"), stdout=subprocess.DEVNULL, timeout=60)
            assert down.returncode == 0
            time.sleep(3)  # the stream looks at the study every second: it meets the database down
            up = subprocess.run(_as_postgres(*pg_ctl, "-o", options, "start"), stdout=subprocess.DEVNULL, timeout=60)
            assert up.returncode == 0
            _finished_trial(db, study_id, 1)
            seen += _next_trials(lines)
    except httpx.TransportError as exc:
        raise AssertionError(f"the stream broke ({exc!r})\n{server.tail()}") from exc
    finally:
        server.close()
        db.dispose()
    assert seen == [0, 1]
    log = server.tail()
    assert "database unreachable" in log and "Traceback" not in log, log


def _http_answer(sock: object) -> bytes:
    """One HTTP/1.1 answer read from ``sock`` (head and Content-Length body); b"" when the server closed."""
    import socket

    assert isinstance(sock, socket.socket)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    except OSError:  # a reset: the server closed with our request unread
        return data
    return head + b"\r\n\r\n" + body


def test_an_idle_connection_outlives_the_clients_keep_alive(sqlite_url: str, tmp_path: Path) -> None:
    """The server keeps an idle connection longer than clients keep theirs (httpx's and many others': 5 s).
    With both at 5 s, a client reusing a connection near its end raced the server's close (a reset or an
    empty answer, for a GET outside any blip: seen under load in the soak benchmark)."""
    import socket

    server = Server(sqlite_url, 8207, tmp_path / "serve.log", options=("--no-runner",))
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    try:
        with socket.create_connection(("127.0.0.1", 8207), timeout=10) as sock:
            sock.sendall(request)
            first = _http_answer(sock)
            time.sleep(6.5)  # idle past a 5 s keep-alive
            try:
                sock.sendall(request)
                second = _http_answer(sock)
            except OSError:
                second = b""
    finally:
        server.close()
    assert first.startswith(b"HTTP/1.1 200"), first
    assert second.startswith(b"HTTP/1.1 200"), f"the server closed the idle connection: {second!r}"
