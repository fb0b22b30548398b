"""The CLI end to end, and killing the orchestrator mid-study then resuming it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tuner.store.storage import StudyDB, StudyRow
from tuner.study.spec import load_spec

pytestmark = pytest.mark.timeout(400)

SPEC = {
    "name": "resume-me",
    "workload": "noop",
    "args": {"sleep_ms": 400},
    "space": {"tile": {"high": 128}, "stages": {"high": 4}},
    "objectives": [{"metric": "score"}, {"metric": "cost"}],
    "budget": {"trials": 16, "trial_timeout_s": 60},
    "seed": 3,
}


def tuner(*args: str, cwd: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}
    return subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def finished_rows(db: StudyDB) -> list:
    row = db.find_study("resume-me")
    if row is None:
        return []
    return [t for t in db.trials(row.id) if t.status not in ("running",)]


def test_kill_the_orchestrator_and_resume(tmp_path: Path) -> None:
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC))
    db_path = tmp_path / "study.db"
    db = StudyDB(str(db_path))
    db.create_tables()

    # start, wait for a few finished trials, then kill the orchestrator and its local Ray
    first = tuner(
        "run", str(spec_path), "--db", str(db_path), "--workers", "2", "--quiet", cwd=tmp_path, start_new_session=True
    )
    deadline = time.monotonic() + 240
    while len(finished_rows(db)) < 5:
        assert first.poll() is None, first.stdout.read()
        assert time.monotonic() < deadline, "the first run made no progress"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before = {t.number: t for t in finished_rows(db)}
    study = db.find_study("resume-me")
    assert study.status == "running"  # nobody marked it: it was killed
    in_flight = [t for t in db.trials(study.id) if t.status == "running"]
    assert len(before) < 16

    second = tuner("run", str(spec_path), "--db", str(db_path), "--workers", "2", "--quiet", cwd=tmp_path)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    trials = db.trials(study.id)
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)), "a trial number was duplicated"
    assert numbers == list(range(len(numbers))), "a trial number was skipped"
    measured = [t for t in trials if t.status != "infeasible_static"]
    assert len(measured) == 16, "the budget was not honoured"
    assert all(t.status == "ok" for t in measured)
    for number, old in before.items():  # no finished trial lost or changed
        new = next(t for t in trials if t.number == number)
        assert (new.status, new.params, new.metrics) == (old.status, old.params, old.metrics)
    for old in in_flight:  # trials cut off by the kill were run again under their own numbers
        new = next(t for t in trials if t.number == old.number)
        assert new.status == "ok" and new.params == old.params
    assert db.find_study("resume-me").status == "completed"
    assert "Pareto front" in out

    # the CLI's other commands against the same database
    status = tuner("status", "--db", str(db_path), cwd=tmp_path).communicate(timeout=60)[0]
    assert "resume-me" in status and "completed" in status and "16/16" in status
    listing = tuner("trials", "resume-me", "--db", str(db_path), cwd=tmp_path).communicate(timeout=60)[0]
    assert "ok" in listing
    exported = tuner("export", "resume-me", "--format", "json", "--db", str(db_path), cwd=tmp_path)
    doc = json.loads(exported.communicate(timeout=60)[0])
    assert doc["study"] == "resume-me" and doc["on_pareto_front"]
    assert doc["spec"]["name"] == "resume-me" and doc["fingerprint"]["python"]
    best_score = max(t.metrics["score"] for t in measured)
    assert doc["metrics"]["score"] == best_score
    as_yaml = tuner("export", str(study.id), "--format", "yaml", "--trial", "0", "--db", str(db_path), cwd=tmp_path)
    assert yaml.safe_load(as_yaml.communicate(timeout=60)[0])["trial"] == 0
    db.dispose()


def test_cli_refuses_a_bad_spec_naming_the_field(tmp_path: Path) -> None:
    spec = dict(SPEC, objectives=[{"metric": "speed"}])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = tuner("run", str(path), "--db", str(tmp_path / "x.db"), cwd=tmp_path)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 2
    assert "objectives.0.metric" in out and "unknown metric 'speed'" in out


def test_cli_lists_workloads(tmp_path: Path) -> None:
    out = tuner("workloads", cwd=tmp_path).communicate(timeout=60)[0]
    assert "triton_gemm" in out and "tflops" in out and "noop" in out


def test_serve_submit_wait_and_export_over_http(tmp_path: Path) -> None:
    server, url = start_server(tmp_path / "svc.db", token="cli-token")
    try:
        spec = dict(SPEC, name="over-http", args={"sleep_ms": 10}, budget={"trials": 5})
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        refused = tuner("submit", str(path), "--url", url, cwd=tmp_path)  # no token
        assert refused.wait(timeout=60) == 2 and "401" in refused.stdout.read()
        submit = subprocess.run(
            [sys.executable, "-m", "tuner.cli", "submit", str(path), "--url", url, "--wait", "--token", "cli-token"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert submit.returncode == 0, submit.stdout + submit.stderr
        assert "completed: 5/5 trials" in submit.stdout
        exported = subprocess.run(
            [sys.executable, "-m", "tuner.cli", "export", "over-http", "--url", url, "--format", "python"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert exported.returncode == 0 and exported.stdout.startswith("# study over-http, trial ")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def start_server(db_path: Path, token: str) -> tuple[subprocess.Popen, str]:
    """``tuner serve`` (API and a one-worker runner) on a free port, once its health check answers."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "tuner.cli", "serve", "--port", str(port), "--db", str(db_path), "--workers", "1"]
    server = subprocess.Popen(
        command,
        cwd=db_path.parent,
        env={**os.environ, "TUNER_API_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            os.killpg(server.pid, signal.SIGKILL)
            raise AssertionError("the server did not start")
        time.sleep(0.3)


def test_stopping_the_server_stops_its_runner_and_queues_the_study_again(tmp_path: Path) -> None:
    import httpx

    db_path = tmp_path / "svc.db"
    server, url = start_server(db_path, token="t")
    try:
        spec = dict(SPEC, name="interrupted", args={"sleep_ms": 1500}, budget={"trials": 40})
        answer = httpx.post(f"{url}/api/studies", json=spec, headers={"Authorization": "Bearer t"}, timeout=30)
        assert answer.status_code in (200, 201, 202), answer.text
        db = StudyDB(str(db_path))
        study_id = db.find_study("interrupted").id
        deadline = time.monotonic() + 120
        while not any(t.status == "ok" for t in db.trials(study_id)):
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.3)
        server.send_signal(signal.SIGTERM)  # the server process alone, as `kill PID` does
        assert server.wait(timeout=120) == 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    row = db.get_study(study_id)
    assert (row.status, row.lease_owner) == ("queued", None) and "queued again" in row.message
    trials = db.trials(study_id)
    assert all(t.status == "ok" for t in trials) and len(trials) < 40  # trials in flight finished
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(db_path) in _cmdline(p)]
    assert not leftovers, "the runner outlived the server"
    db.dispose()


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_runner_shut_down_mid_study_queues_it_again_and_the_next_runner_finishes_it(tmp_path: Path) -> None:
    db_path = tmp_path / "runner.db"
    db, study = queued_study(db_path, name="handover", args={"sleep_ms": 300}, budget={"trials": 12})

    def start_runner() -> subprocess.Popen:
        return tuner("worker", "--db", str(db_path), "--workers", "1", cwd=tmp_path, start_new_session=True)

    first = start_runner()
    deadline = time.monotonic() + 180
    while len(finished_rows_of(db, study.id)) < 3:
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGTERM)  # the whole group, its local Ray too: Ctrl-C, a service manager
    assert first.wait(timeout=120) == 0, first.stdout.read()[-6000:]
    after_first = db.get_study(study.id)
    assert after_first.status == "queued" and "queued again" in after_first.message
    assert after_first.lease_owner is None
    done_by_first = {t.number: t.metrics for t in finished_rows_of(db, study.id)}
    assert 3 <= len(done_by_first) < 12

    second = start_runner()
    try:
        deadline = time.monotonic() + 180
        while db.get_study(study.id).status != "completed":
            assert second.poll() is None and time.monotonic() < deadline
            time.sleep(0.3)
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        second.wait(timeout=120)
    trials = db.trials(study.id)
    assert [t.number for t in trials] == list(range(len(trials)))
    assert sum(t.status == "ok" and t.duplicate_of is None for t in trials) == 12
    assert all(next(t for t in trials if t.number == n).metrics == m for n, m in done_by_first.items())
    db.dispose()


def test_a_runner_whose_ray_dies_with_it_hands_its_study_back_at_once(tmp_path: Path) -> None:
    """Ctrl-C or a service manager signals the runner's whole process group: its local Ray dies too.

    The trial in flight takes a minute and can no longer finish; the runner must not wait on Ray (it
    would block, then abort after 60 s with the study still leased) but queue the study again.
    """
    db_path = tmp_path / "runner.db"
    db, study = queued_study(db_path, name="long", args={"sleep_ms": 60_000}, budget={"trials": 4})
    runner = tuner("worker", "--db", str(db_path), "--workers", "1", cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 180
    while not db.trials(study.id):  # the first trial is in flight
        assert runner.poll() is None and time.monotonic() < deadline, runner.stdout.read()
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(runner.pid, signal.SIGTERM)
    assert runner.wait(timeout=45) == 0
    output = runner.stdout.read()
    assert "control store is gone" in output, output[-4000:]
    row = db.get_study(study.id)
    assert (row.status, row.lease_owner) == ("queued", None) and "queued again" in row.message
    assert {t.status for t in db.trials(study.id)} == {"running"}  # re-sent by the next runner
    db.dispose()


def queued_study(db_path: Path, **changes: object) -> tuple[StudyDB, StudyRow]:
    """A new SQLite study database at ``db_path`` holding ``SPEC`` with ``changes``, queued for a runner."""
    db = StudyDB(str(db_path))
    db.create_tables()
    compiled = load_spec(dict(SPEC, **changes))
    study = db.create_study(
        name=compiled.spec.name,
        workload=compiled.spec.workload,
        spec=compiled.spec.model_dump(mode="json"),
        space=compiled.space.canonical,
        space_hash=compiled.space.hash,
    )
    return db, study


def finished_rows_of(db: StudyDB, study_id: int) -> list:
    return [t for t in db.trials(study_id) if t.status == "ok"]
