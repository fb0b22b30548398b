"""The study lifecycle under races: runners, stops, resumes and deletes from many threads at once, on
SQLite and PostgreSQL; atomic idempotency; two first runs of one new spec."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from tuner.store import lifecycle
from tuner.store.storage import StudyDB

pytestmark = pytest.mark.timeout(240)


def queue(db: StudyDB, name: str, key: str | None = None, spec: dict[str, Any] | None = None) -> int:
    spec = spec or {"name": name, "workload": "noop", "objectives": [{"metric": "score"}], "budget": {"trials": 1}}
    row, _ = lifecycle.submit(db, name=name, workload="noop", spec=spec, space={}, space_hash="h", idempotency_key=key)
    return row.id


def test_each_move_happens_only_from_the_statuses_it_allows(db_url: str) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    a = queue(db, "a")
    assert not lifecycle.resume(db, a)  # queued already
    assert lifecycle.request_stop(db, a) == "stopped" and db.get_study(a).message == "stopped before it started"
    assert lifecycle.resume(db, a) and db.get_study(a).status == "queued"
    row = lifecycle.claim_next(db, "runner-1", 30)
    assert row.id == a and lifecycle.start_run(db, a, "runner-1")
    assert not lifecycle.start_run(db, a, "runner-2")  # not its lease
    assert lifecycle.request_stop(db, a) == "stopping" and db.get_study(a).stop_requested
    assert not lifecycle.resume(db, a)  # its runner still holds it
    assert lifecycle.claim_next(db, "runner-2", 30) is None
    assert not lifecycle.finish(db, a, "stopped", owner="runner-2")
    assert lifecycle.finish(db, a, "stopped", owner="runner-1") and db.get_study(a).status == "stopped"
    db.release_lease(a, "runner-1")

    # Deleting a running study stops it first: hidden (its name free) at once, gone when its runner stops.
    b = queue(db, "b")
    assert lifecycle.claim_next(db, "runner-1", 30).id == b
    assert lifecycle.delete(db, b) == "deleting"
    hidden = db.get_study(b)
    assert hidden.status == "deleted" and hidden.stop_requested and lifecycle.visible(hidden) is None
    assert db.find_study("b") is None and queue(db, "b") != b  # the name can be used again
    assert not lifecycle.finish(db, b, "completed", owner="runner-1")  # the run ends: its rows go
    assert db.get_study(b) is None
    # A deleted study whose runner died goes once its lease lapsed; a stopping one becomes stopped.
    c, d = queue(db, "c"), queue(db, "d")
    for study_id in (c, d):
        db.take_lease(study_id, "dead-runner", 0.01)
        assert lifecycle.start_run(db, study_id, "dead-runner")
    lifecycle.delete(db, c)
    lifecycle.request_stop(db, d)
    time.sleep(0.05)  # the dead runner's 10 ms leases have lapsed (a fast machine gets here sooner)
    lifecycle.sweep(db)
    assert db.get_study(c) is None and db.get_study(d).status == "stopped"
    assert lifecycle.delete(db, d) == "deleted" and db.get_study(d) is None
    db.dispose()


def _runner(db: StudyDB, owner: str, rounds: int, active: dict[int, str], lock: Any, log: list[str]) -> None:
    """Claim (or take over by lease, as ``tuner run`` does), run a few heartbeats, finish or crash."""
    rng = random.Random(owner)
    for _ in range(rounds):
        if rng.random() < 0.3:  # `tuner run` on a study it names
            ids = [r.id for r in db.list_studies()]
            study_id = rng.choice(ids) if ids else None
            if study_id is None or not db.take_lease(study_id, owner, 30):
                continue
        else:
            row = lifecycle.claim_next(db, owner, 30)
            if row is None:
                continue
            study_id = row.id
        if not lifecycle.start_run(db, study_id, owner):
            db.release_lease(study_id, owner)
            continue
        with lock:
            if study_id in active:
                log.append(f"study {study_id} run by {active[study_id]} and {owner}")
            active[study_id] = owner
        stopped = False
        for _ in range(3):
            if not db.renew_lease(study_id, owner, 30):
                with lock:
                    log.append(f"{owner} lost the live lease of study {study_id}")
            current = db.get_study(study_id)
            if current is None or current.stop_requested or current.status in ("stopping", "deleted"):
                stopped = True
                break
        with lock:
            del active[study_id]
        if rng.random() < 0.1:  # killed: the lease lapses at once, nothing is finished
            db.renew_lease(study_id, owner, 0.001)
            continue
        lifecycle.finish(db, study_id, "stopped" if stopped else rng.choice(["completed", "failed"]), owner=owner)
        db.release_lease(study_id, owner)


def _user(db: StudyDB, seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    for i in range(rounds):
        ids = [r.id for r in db.list_studies()] or [0]
        study_id = rng.choice(ids)
        move = rng.choice(["stop", "resume", "resume", "delete", "submit"])
        if move == "stop":
            lifecycle.request_stop(db, study_id)
        elif move == "resume":
            lifecycle.resume(db, study_id)
        elif move == "delete" and rng.random() < 0.3:
            lifecycle.delete(db, study_id)
        elif move == "submit":
            queue(db, f"user{seed}-{i}")


def test_two_runners_never_run_one_study_whatever_the_interleaving(db_url: str) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    for i in range(4):
        queue(db, f"s{i}")
    active: dict[int, str] = {}
    lock = threading.Lock()
    problems: list[str] = []

    def guarded(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a thread's error fails the test, not just a warning
            with lock:
                problems.append(repr(exc))

    threads = [
        threading.Thread(target=guarded, args=(_runner, db, f"runner-{i}", 40, active, lock, problems))
        for i in range(4)
    ] + [threading.Thread(target=guarded, args=(_user, db, seed, 60)) for seed in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=200)
    assert not any(t.is_alive() for t in threads)
    assert problems == []
    lifecycle.sweep(db)
    statuses = Counter(r.status for r in db.list_studies())
    assert statuses and set(statuses) <= {"queued", "running", "stopped", "completed", "failed"}, statuses
    db.dispose()


def test_idempotency_is_atomic_under_16_concurrent_submits(db_url: str) -> None:
    from tests.test_api import AUTH, TOKEN, noop_spec

    app = create_app(Settings(db_url=db_url, token=TOKEN))
    with TestClient(app) as client:
        # One key, two bodies: one body wins; its retries get its study, the other body 422, always.
        bodies = [noop_spec("idem-a"), noop_spec("idem-b")]
        start = threading.Barrier(16)
        answers: list[tuple[int, int, Any]] = [None] * 16  # type: ignore[list-item]

        def submit(i: int, key: str, body: dict[str, Any], which: int) -> None:
            start.wait()
            response = client.post("/api/studies", json=body, headers={**AUTH, "Idempotency-Key": key})
            answers[i] = (which, response.status_code, response.json())

        threads = [threading.Thread(target=submit, args=(i, "race-1", bodies[i % 2], i % 2)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        codes = {(which, code) for which, code, _ in answers}
        winner = next(which for which, code, _ in answers if code == 202)
        assert codes == {(winner, 202), (1 - winner, 422)}, answers
        assert len({body["id"] for which, code, body in answers if code == 202}) == 1
        assert all("another spec" in body["detail"] for _, code, body in answers if code == 422)

        # One key, one body, 16 at once: one study, every answer names it (never 409 from the name).
        start.reset()
        threads = [threading.Thread(target=submit, args=(i, "race-2", noop_spec("idem-c"), 0)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert {code for _, code, _ in answers} == {202}, answers
        assert len({body["id"] for _, _, body in answers}) == 1
        names = [s["name"] for s in client.get("/api/studies").json()["items"]]
        assert sorted(names) == sorted([bodies[winner]["name"], "idem-c"])
    app.state.db.dispose()


def test_two_first_runs_of_one_new_spec_one_runs_the_other_is_told_who(db_url: str) -> None:
    """Two `tuner run`s of a spec no study has yet, opening it at the same moment: one creates and holds
    it, the other gets the 'is being run by' refusal (never an IntegrityError)."""
    from tuner.run.orchestrator import Orchestrator, StudyConflict
    from tuner.store.storage import lease_owner_name
    from tuner.study.spec import StudySpec, compile_study

    db = StudyDB(db_url)
    db.create_tables()
    for round_ in range(6):
        spec = StudySpec.model_validate(
            {
                "name": f"first-{round_}",
                "workload": "noop",
                "objectives": [{"metric": "score"}],
                "budget": {"trials": 2},
            }
        )
        compiled = compile_study(spec)
        start = threading.Barrier(2)
        outcomes: list[Any] = []

        def open_study(compiled: Any = compiled, start: Any = start, outcomes: list[Any] = outcomes) -> None:
            orchestrator = Orchestrator(compiled, db, lease_owner=lease_owner_name("tuner run"), lease_s=30)
            start.wait()
            try:
                outcomes.append(orchestrator.session.open().id)
            except StudyConflict as exc:
                outcomes.append(str(exc))
            except Exception as exc:  # what the loser died of before
                outcomes.append(exc)

        threads = [threading.Thread(target=open_study) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        ids = [o for o in outcomes if isinstance(o, int)]
        refusals = [o for o in outcomes if isinstance(o, str)]
        assert len(ids) == 1 and len(refusals) == 1, outcomes
        assert "is being run by tuner run" in refusals[0]
    db.dispose()
