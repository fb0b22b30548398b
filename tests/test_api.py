"""The REST API through the real app, a real orchestrator (Ray actors) and a real database."""

from __future__ import annotations

import datetime as dt
import json
import math
import threading
import time
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from tuner.run.service import StudyRunner
from tuner.store import lifecycle
from tuner.store.storage import StudyDB

pytestmark = [pytest.mark.timeout(300)]
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def noop_spec(name: str, trials: int = 8, **changes: Any) -> dict[str, Any]:
    spec = {
        "name": name,
        "workload": "noop",
        "args": {"sleep_ms": 20},
        "space": {"tile": {"high": 128}, "stages": {"high": 4}},
        "objectives": [{"metric": "score"}, {"metric": "cost"}],
        "constraints": ["score >= 0.2"],
        "budget": {"trials": trials},
        "seed": 5,
    }
    spec.update(changes)
    return spec


@pytest.fixture
def client(db_url: str) -> TestClient:
    app = create_app(Settings(db_url=db_url, token=TOKEN))
    with TestClient(app) as c:
        yield c
    app.state.db.dispose()


def run_queued(client: TestClient) -> None:
    """What `tuner worker` does, here in the test's thread: claim the next queued study and run it."""
    db: StudyDB = client.app.state.db
    runner = StudyRunner(db, workers=2)
    row = lifecycle.claim_next(db, runner.owner, runner.lease_s)
    assert row is not None, "nothing was queued"
    runner.run_study(row)


@pytest.mark.usefixtures("ray_session")
def test_submit_run_inspect_export(client: TestClient) -> None:
    response = client.post("/api/studies", json=noop_spec("api-study"), headers=AUTH)
    assert response.status_code == 202, response.text
    study = response.json()
    assert study["status"] == "queued" and study["url"] == f"/api/studies/{study['id']}"
    assert response.headers["location"] == study["url"]
    assert client.get(study["url"]).json()["status"] == "queued"

    run_queued(client)

    detail = client.get(study["url"]).json()
    assert detail["status"] == "completed" and detail["measured"] == 8 and detail["progress"] == 1.0
    assert detail["spec"]["name"] == "api-study" and detail["fingerprint"]["python"]
    assert detail["best"] is not None and detail["objectives"][0] == {"metric": "score", "direction": "maximize"}
    # the default strategy's replaced proposals, counted on the study (not trial rows)
    assert detail["proposals"] == {"repeats_replaced": 0, "static_rejected": 0}
    listing = client.get("/api/studies", params={"status": "completed"}).json()
    assert [s["id"] for s in listing["items"]] == [study["id"]] and listing["total"] == 1
    assert client.get("/api/studies", params={"workload": "triton_gemm"}).json()["total"] == 0

    trials = client.get(f"{study['url']}/trials", params={"sort": "-score"}).json()
    scores = [t["metrics"]["score"] for t in trials["items"] if t["metrics"].get("score") is not None]
    assert scores == sorted(scores, reverse=True) and trials["total"] >= 8
    one = client.get(f"{study['url']}/trials/{trials['items'][0]['number']}").json()
    assert one["samples_ms"] and one["fingerprint"]["torch"]
    assert client.get(f"{study['url']}/trials/9999").status_code == 404

    pareto = client.get(f"{study['url']}/pareto").json()
    assert pareto["trials"] and pareto["default_pick"] == detail["best"]["trial"]
    assert all(t["feasible"] for t in pareto["trials"])
    importances = client.get(f"{study['url']}/importance").json()["importances"]
    assert importances and set(importances) <= {"x", "tile", "stages", "mode", "depth"}

    exported = client.get(f"{study['url']}/export", params={"format": "json"})
    assert exported.status_code == 200 and "attachment" in exported.headers["content-disposition"]
    doc = json.loads(exported.text)
    assert doc["trial"] == detail["best"]["trial"] and doc["spec"]["name"] == "api-study"
    other = pareto["trials"][-1]["number"]
    assert yaml.safe_load(client.get(f"{study['url']}/export?format=yaml&trial={other}").text)["trial"] == other
    env = client.get(f"{study['url']}/export?format=env").text
    assert "\nX=" in env and "\nMODE=" in env
    python = client.get(f"{study['url']}/export?format=python").text
    namespace: dict[str, Any] = {}
    exec(compile(python, "export.py", "exec"), namespace)  # the export is valid Python that defines the config
    assert namespace["config"] == doc["params"]

    events = client.get(f"{study['url']}/events")
    assert events.headers["content-type"].startswith("text/event-stream")
    first = next(line for line in events.text.splitlines() if line.startswith("data: "))
    assert json.loads(first[len("data: ") :])["status"] == "completed"

    metrics = client.get("/metrics").text
    assert 'tuner_studies{status="completed"} 1' in metrics and 'tuner_trials{status="ok"}' in metrics
    assert "tuner_trial_duration_seconds_count" in metrics and "tuner_queue_depth 0" in metrics

    assert client.delete(study["url"]).status_code == 401
    assert client.delete(study["url"], headers=AUTH).status_code == 204
    assert client.get(study["url"]).status_code == 404


@pytest.mark.usefixtures("ray_session")
def test_stop_a_running_study_then_resume_it(sqlite_url: str) -> None:
    app = create_app(Settings(db_url=sqlite_url, token=TOKEN))
    with TestClient(app) as client:
        spec = noop_spec("stoppable", trials=40, args={"sleep_ms": 300})
        study = client.post("/api/studies", json=spec, headers=AUTH).json()
        db: StudyDB = app.state.db
        runner = StudyRunner(db, workers=1, lease_s=3)
        claimed = lifecycle.claim_next(db, runner.owner, runner.lease_s)
        thread = threading.Thread(target=runner.run_study, args=(claimed,))
        thread.start()
        deadline = time.monotonic() + 120
        while client.get(study["url"]).json()["measured"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert client.post(f"{study['url']}/stop", headers=AUTH).status_code == 202
        thread.join(timeout=120)
        stopped = client.get(study["url"]).json()
        assert stopped["status"] == "stopped" and 3 <= stopped["measured"] < 40
        assert client.post(f"{study['url']}/resume").status_code == 401
        resumed = client.post(f"{study['url']}/resume", headers=AUTH)
        assert resumed.status_code == 202 and resumed.json()["status"] == "queued"
        assert client.post(f"{study['url']}/resume", headers=AUTH).status_code == 409
        db.update_study(study["id"], spec={**db.get_study(study["id"]).spec, "budget": {"trials": 6}})
        runner.run_study(lifecycle.claim_next(db, runner.owner, runner.lease_s))
        final = client.get(study["url"]).json()
        assert final["status"] == "completed" and final["measured"] >= stopped["measured"]
    db.dispose()


def test_auth_size_validation_and_idempotency(client: TestClient) -> None:
    spec = noop_spec("idem")
    assert client.post("/api/studies", json=spec).status_code == 401
    assert client.post("/api/studies", json=spec, headers={"Authorization": "Bearer nope"}).status_code == 401
    first = client.post("/api/studies", json=spec, headers={**AUTH, "Idempotency-Key": "k-1"})
    again = client.post("/api/studies", json=spec, headers={**AUTH, "Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 202 and first.json()["id"] == again.json()["id"]
    assert client.post("/api/studies", json=spec, headers=AUTH).status_code == 409  # same name, no key
    # The same key with another spec is refused; after 24 hours the key is free again.
    other = client.post("/api/studies", json=noop_spec("idem-2"), headers={**AUTH, "Idempotency-Key": "k-1"})
    assert other.status_code == 422 and "another spec" in other.json()["detail"]
    db: StudyDB = client.app.state.db
    db.update_study(first.json()["id"], created_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=25))
    fresh = client.post("/api/studies", json=noop_spec("idem-2"), headers={**AUTH, "Idempotency-Key": "k-1"})
    assert fresh.status_code == 202 and fresh.json()["id"] != first.json()["id"]
    assert db.get_study(first.json()["id"]).idempotency_key is None  # the old study stays, without the key

    big = {**noop_spec("big"), "args": {"sleep_ms": 0, "faults": {str(i): "raise" for i in range(120_000)}}}
    response = client.post(
        "/api/studies", content=json.dumps(big), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert response.status_code == 413

    bad_metric = client.post("/api/studies", json=noop_spec("bad", objectives=[{"metric": "speed"}]), headers=AUTH)
    assert bad_metric.status_code == 422
    assert bad_metric.json()["detail"][0]["loc"] == ["body", "objectives", "0", "metric"]
    bad_budget = client.post("/api/studies", json=noop_spec("bad2", budget={"trials": 0}), headers=AUTH)
    assert bad_budget.status_code == 422 and bad_budget.json()["detail"][0]["loc"] == ["body", "budget", "trials"]
    bad_space = client.post("/api/studies", json=noop_spec("bad3", space={"x": {"low": 2, "high": 1}}), headers=AUTH)
    assert bad_space.json()["detail"][0]["loc"] == ["body", "space", "x", "low"]
    assert client.get("/api/studies", params={"limit": 0}).status_code == 422
    assert client.get("/api/studies/abc").status_code == 422
    assert client.get("/api/studies/12345").status_code == 404
    # a queued study stops at once and can be resumed
    sid = first.json()["id"]
    assert client.post(f"/api/studies/{sid}/stop", headers=AUTH).json()["status"] == "stopped"


def test_nan_metrics_are_null_with_the_trial_status(client: TestClient) -> None:
    study = client.post("/api/studies", json=noop_spec("nan"), headers=AUTH).json()
    db: StudyDB = client.app.state.db
    db.insert_trial(study["id"], 0, {"x": 0.5}, optuna_trial_id=None)
    db.finish_trial(
        study["id"],
        0,
        status="numerics_fail",
        metrics={"score": math.nan, "cost": math.inf},
        feasible=False,
        timing_comparable=False,
        error="diverged",
        worker="w0.0",
        attempt=1,
        fingerprint=None,
    )
    trial = client.get(f"/api/studies/{study['id']}/trials/0")
    assert trial.status_code == 200
    assert trial.json()["metrics"] == {"score": None, "cost": None} and trial.json()["status"] == "numerics_fail"
    assert client.get(f"/api/studies/{study['id']}/export").status_code == 409  # nothing feasible yet


def test_workloads_health_and_settings(client: TestClient) -> None:
    workloads = {w["name"]: w for w in client.get("/api/workloads").json()}
    assert {"triton_gemm", "noop"} <= set(workloads)
    gemm = workloads["triton_gemm"]
    assert {m["name"]: m["direction"] for m in gemm["metrics"]}["tflops"] == "maximize"
    assert gemm["space_points"] >= 500 and "BLOCK_M" in gemm["params"]
    assert client.get("/healthz").json() == {"status": "ok", "db": "ok"}
    assert client.get("/openapi.json").json()["paths"]["/api/studies"]["post"]
    with pytest.raises(SystemExit, match="TUNER_API_TOKEN"):
        Settings(host="0.0.0.0").check()
    Settings(host="0.0.0.0", token="x").check()
    assert Settings(host="0.0.0.0", token="x").reads_need_token
    assert not Settings(host="127.0.0.1", token="x").reads_need_token


def test_reads_need_the_token_beyond_loopback_and_cors_is_an_allow_list(sqlite_url: str) -> None:
    app = create_app(Settings(db_url=sqlite_url, token=TOKEN, host="0.0.0.0", cors_origins=("https://ok.example",)))
    with TestClient(app) as client:
        assert client.get("/api/studies").status_code == 401
        assert client.get("/api/studies", headers=AUTH).status_code == 200
        allowed = client.get("/healthz", headers={"Origin": "https://ok.example"})
        assert allowed.headers.get("access-control-allow-origin") == "https://ok.example"
        denied = client.get("/healthz", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in denied.headers
    app.state.db.dispose()


def test_the_api_starts_without_torch_triton_or_ray() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from api.main import create_app; from api.settings import Settings; "
        "create_app(Settings(db_url='sqlite://')); "
        "print(sorted(m for m in ('torch', 'triton', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
