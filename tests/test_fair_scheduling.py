"""Fair scheduling across studies: one runner runs several studies at once and shares its worker slots
between them (issue 62 item 3). Real API, runner, Ray workers and database; the noop workload."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_api import AUTH, TOKEN

from api.main import create_app
from api.settings import Settings
from tuner.run.fair import SlotBroker
from tuner.run.service import StudyRunner
from tuner.store import lifecycle
from tuner.store.storage import StudyDB

pytestmark = pytest.mark.timeout(400)
SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
HUGE = 1_000_000  # allowed by the limits


def spec(name: str, trials: int, sleep_ms: float = 20, **changes: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "workload": "noop",
        "args": {"sleep_ms": sleep_ms},
        "objectives": [{"metric": "score"}],
        "budget": {"trials": trials},
        "sampler": "random",
        "remeasure": {"top_k": 0},
    }
    body.update(changes)
    return body


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    app = create_app(Settings(db_url=db_url, token=TOKEN))
    with TestClient(app) as c:
        yield c
    app.state.db.dispose()


def submit(client: TestClient, body: dict[str, Any]) -> int:
    response = client.post("/api/studies", json=body, headers=AUTH)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def finished(db: StudyDB, study_id: int) -> int:
    return sum(n for status, n in db.status_counts(study_id).items() if status != "running")


def wait_for(until: Callable[[], bool], timeout_s: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.1)


@pytest.fixture
def start_runner(client: TestClient) -> Iterator[Callable[..., StudyRunner]]:
    started: list[tuple[StudyRunner, threading.Thread]] = []

    def start(**kwargs: Any) -> StudyRunner:
        runner = StudyRunner(client.app.state.db, poll_s=0.1, workers=2, **kwargs)
        thread = threading.Thread(target=runner.run_forever, daemon=True)
        thread.start()
        started.append((runner, thread))
        return runner

    yield start
    for runner, thread in started:
        runner.stop()
        thread.join(timeout=120)
        assert not thread.is_alive(), "the runner did not stop"


@SQLITE
@pytest.mark.usefixtures("ray_session")
def test_a_small_study_after_a_huge_one_starts_at_once_and_completes_while_the_huge_one_runs(
    client: TestClient, start_runner: Callable[..., StudyRunner]
) -> None:
    db: StudyDB = client.app.state.db
    runner = start_runner()
    assert runner.max_studies == 4  # the default
    huge = submit(client, spec("huge", HUGE, sleep_ms=50))
    wait_for(lambda: finished(db, huge) >= 4, what="the huge study's first trials")
    small = submit(client, spec("small", 10))
    # its workers start (seconds), then its first trial goes out beside the huge study's
    wait_for(lambda: len(db.trials(small)) >= 1, timeout_s=60, what="the small study's first trial")
    huge_at_start = finished(db, huge)
    wait_for(lambda: db.get_study(small).status == "completed", what="the small study's end")
    assert db.get_study(huge).status == "running"
    assert client.get(f"/api/studies/{small}").json()["measured"] == 10
    # while the small study ran, the two studies took turns on the two worker slots: the huge one got about
    # as many trials as the small one, not every slot
    assert finished(db, huge) - huge_at_start <= 2 * 10 + 4
    # each study holds its own lease, renewed by its own thread
    assert db.get_study(huge).lease_owner == runner.owner
    # stopping one study stops that one only; the runner goes on with the next
    lifecycle.request_stop(db, huge)
    wait_for(lambda: db.get_study(huge).status == "stopped", what="the huge study's stop")
    again = submit(client, spec("again", 3))
    wait_for(lambda: db.get_study(again).status == "completed", what="a study after the stop")
    wait_for(lambda: runner.running() == [], what="the runner holding no study")


@SQLITE
@pytest.mark.usefixtures("ray_session")
def test_priority_weights_the_share_and_max_studies_caps_the_running_ones(
    client: TestClient, start_runner: Callable[..., StudyRunner]
) -> None:
    db: StudyDB = client.app.state.db
    high = submit(client, spec("high", HUGE, priority=3))
    low = submit(client, spec("low", HUGE))
    waiting = submit(client, spec("waiting", 4))
    runner = start_runner(max_studies=2)
    wait_for(lambda: finished(db, low) >= 1 and finished(db, high) >= 1, what="both studies' first trials")
    base_high, base_low = finished(db, high), finished(db, low)
    wait_for(lambda: finished(db, low) - base_low >= 15, timeout_s=240, what="15 trials of the low study")
    gained_high, gained_low = finished(db, high) - base_high, finished(db, low) - base_low
    assert gained_high >= 2 * gained_low, (gained_high, gained_low)  # 3:1 by priority
    assert db.get_study(waiting).status == "queued"  # the cap: two studies run, the third waits
    assert sorted(runner.running()) == sorted([high, low])
    lifecycle.request_stop(db, high)
    wait_for(lambda: db.get_study(waiting).status == "completed", what="the third study, once a place was free")
    assert db.get_study(low).status == "running"


@SQLITE
def test_priority_is_validated_and_named_in_the_error(client: TestClient) -> None:
    for bad in (0, 101, "high", 1.5):
        response = client.post("/api/studies", json=spec("bad", 3, priority=bad), headers=AUTH)
        assert response.status_code == 422, response.text
        assert "priority" in response.text


def test_the_broker_hands_a_slot_to_the_study_furthest_behind_for_its_weight() -> None:
    broker = SlotBroker()
    broker.join(1, weight=1)
    broker.join(2, weight=2)
    grants: list[int] = []
    for _ in range(30):  # one slot, both studies asking for it each turn; the one that got it gives it back
        holder = None
        for study in (1, 2):
            if broker.take(study, "slot") and holder is None:
                holder = study
                grants.append(study)
        assert holder is not None
        broker.settle(holder, {})
    assert grants[-27:].count(2) == 2 * grants[-27:].count(1)  # 2:1 by weight, once both are asking
    assert broker.take(1, "gpu0") and not broker.take(2, "gpu0")  # a held device is one study's at a time
    broker.leave(1)
    assert broker.take(2, "gpu0")


def test_max_studies_from_the_cli_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.cli import build_parser
    from tuner.run.service import default_max_studies

    parser = build_parser()
    assert parser.parse_args(["worker", "--max-studies", "7"]).max_studies == 7
    assert parser.parse_args(["serve", "--max-studies", "2"]).max_studies == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["worker", "--max-studies", "0"])
    monkeypatch.setenv("TUNER_MAX_STUDIES", "3")
    assert default_max_studies() == 3
    monkeypatch.setenv("TUNER_MAX_STUDIES", "many")
    with pytest.raises(ValueError, match="TUNER_MAX_STUDIES"):
        default_max_studies()
