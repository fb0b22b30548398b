"""Reads in SQL: trial pages, sorts and filters, the summary kept with each trial write, the event stream's
changes since the client's last event, and a study list that survives a study whose workload no longer builds.

Each check compares the database's answer with the same answer computed in Python from every trial
(``StudyDB.trials``, ``pareto.pareto_front``, ``pareto.best_trial``), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, select, text, update

from api.main import create_app
from api.settings import Settings
from tuner.results.pareto import best_trial, pareto_front
from tuner.store import queries
from tuner.store.storage import DUPLICATE, FAILED_SQL, StudyDB, StudyRow, StudySummaryRow, TrialRow, TrialWrite
from tuner.store.summary import Summary, rebuild

pytestmark = [pytest.mark.timeout(120)]
OBJECTIVES = [("score", "maximize"), ("cost", "minimize")]
STATUSES = ("ok", "ok", "ok", "runtime_error", "timeout", "numerics_fail")
REPO = Path(__file__).resolve().parent.parent


def _noop_spec(name: str, **args: Any) -> dict[str, Any]:
    return {
        "name": name,
        "workload": "noop",
        "args": args,
        "objectives": [{"metric": "score"}, {"metric": "cost"}],
        "budget": {"trials": 100},
    }


def _study(db: StudyDB, name: str = "s") -> int:
    return db.create_study(name=name, workload="noop", spec=_noop_spec(name), space={}, space_hash="h").id


def _fill(db: StudyDB, study_id: int, n: int, seed: int = 0) -> random.Random:
    """``n`` trials through ``StudyDB.apply`` as the orchestrator writes them: inserts and finishes in mixed
    batches, statically pruned ones, copies of earlier results, missing and tied metrics, some still running."""
    rng = random.Random(seed)
    pending: list[TrialWrite] = []
    finished: dict[int, Any] = {}
    for number in range(n):
        params = {"x": round(rng.random(), 3), "tile": rng.choice([16, 32, 64])}
        roll = rng.random()
        if roll < 0.08:
            pending.append(db.insert_op(study_id, number, params, optuna_trial_id=None, status="infeasible_static"))
            continue
        if roll < 0.16 and finished:
            earlier = finished[rng.choice(sorted(finished))]
            pending.append(db.insert_op(study_id, number, params, optuna_trial_id=None, copy_of=earlier))
            continue
        pending.append(db.insert_op(study_id, number, params, optuna_trial_id=None))
        if roll > 0.95:
            continue  # left running
        status = rng.choice(STATUSES)
        metrics: dict[str, Any] = {}
        if status == "ok":
            metrics = {"score": round(rng.random(), 2), "cost": round(rng.random(), 2), "latency_ms": rng.random()}
            if rng.random() < 0.1:
                metrics["cost"] = float("nan")  # stored as null: no value, sorted last
        write = db.finish_op(
            study_id,
            number,
            status=status,
            metrics=metrics,
            samples_ms=[1.0, 2.0],
            feasible=status == "ok" and rng.random() < 0.85,
            timing_comparable=True,
            error=None if status == "ok" else f"failed {number}",
            worker="w0",
            attempt=1,
            fingerprint={"gpu": "cpu"},
        )
        pending.append(write)
        if status == "ok":
            finished[number] = _Copy(number, write.values)
        if rng.random() < 0.3:
            db.apply(pending)
            pending = []
    db.apply(pending)
    return rng


class _Copy:
    """A finished result not yet written, as ``insert_op(copy_of=...)`` reads it."""

    def __init__(self, number: int, values: dict[str, Any]) -> None:
        self.__dict__.update(values)
        self.number = number


def _python_sorted(trials: list[TrialRow], sort: str) -> list[int]:
    """The order the API gave before reads moved to SQL (a stable sort of trials in number order)."""
    key, descending = sort.lstrip("-"), sort.startswith("-")
    trials = sorted(trials, key=lambda t: t.number)
    if key == "number":
        return [t.number for t in sorted(trials, key=lambda t: t.number, reverse=descending)]
    if key == "status":
        return [t.number for t in sorted(trials, key=lambda t: t.status, reverse=descending)]
    present = [t for t in trials if (t.metrics or {}).get(key) is not None]
    missing = [t for t in trials if (t.metrics or {}).get(key) is None]
    present.sort(key=lambda t: t.metrics[key], reverse=descending)
    return [t.number for t in present + missing]


def test_trial_pages_sorts_and_filters_match_a_sort_of_every_trial(db_url: str) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    study_id = _study(db)
    _fill(db, study_id, 240, seed=1)
    other = _study(db, "other")  # another study's trials never leak into a page
    _fill(db, other, 30, seed=2)
    every = db.trials(study_id)
    for status in (None, "ok", "runtime_error", "infeasible_static", "running", "no-such-status"):
        subset = [t for t in every if status is None or t.status == status]
        for sort in ("number", "-number", "status", "score", "-score", "cost", "-cost", "latency_ms", "nothing"):
            expected = _python_sorted(subset, sort)
            for limit, offset in ((50, 0), (50, 50), (7, 180), (1000, 0), (10, max(0, len(expected) - 3)), (5, 10_000)):
                rows, total = queries.trial_page(db, study_id, status=status, sort=sort, limit=limit, offset=offset)
                assert total == len(subset)
                assert [t.number for t in rows] == expected[offset : offset + limit], (status, sort, limit, offset)
    db.dispose()


def test_the_summary_kept_with_each_write_equals_one_computed_from_every_trial(db_url: str) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    study_id = _study(db)
    _fill(db, study_id, 300, seed=3)
    # A re-measurement decides the pick; a finished result rewritten makes the summary rebuild itself.
    trials = db.trials(study_id)
    feasible = [t for t in trials if t.status == "ok" and t.feasible and t.duplicate_of is None]
    slow, fast = feasible[0], feasible[1]
    db.apply(
        [
            TrialWrite("update", study_id, slow.number, {"remeasured": {"metric": "score", "median": 0.1}}),
            TrialWrite("update", study_id, fast.number, {"remeasured": {"metric": "score", "median": 0.9}}),
        ]
    )
    view = queries.study_view(db, db.get_study(study_id), with_front=True)
    _assert_summary_matches(db, study_id, view.summary)
    assert view.summary.best["trial"] == fast.number
    front = [t for t in pareto_front(db.trials(study_id), OBJECTIVES)]
    rewritten = front[0]
    db.apply([TrialWrite("finish", study_id, rewritten.number, {"status": "runtime_error", "metrics": {}})])
    summary = queries.study_view(db, db.get_study(study_id), with_front=True).summary
    _assert_summary_matches(db, study_id, summary)
    assert rewritten.number not in summary.front_numbers()
    db.dispose()


def _assert_summary_matches(db: StudyDB, study_id: int, summary: Summary) -> None:
    trials = db.trials(study_id)
    assert summary.counts == db.status_counts(study_id)
    assert summary.n_trials == len(trials)
    assert summary.seq == max(t.seq for t in trials)
    assert summary.front_numbers() == [t.number for t in pareto_front(trials, OBJECTIVES)]
    best = best_trial(trials, OBJECTIVES)
    assert summary.best["trial"] == best.number and summary.best["params"] == best.params
    with db.engine.connect() as conn:
        assert rebuild(conn, study_id, OBJECTIVES).columns() == summary.columns()
    # The front endpoint's rows are those trials, in that order; the pick is best_trial's.
    front, pick = queries.pareto(db, queries.study_view(db, db.get_study(study_id), with_front=True))
    assert [t.number for t in front] == summary.front_numbers() and pick == best.number


def test_a_database_of_an_earlier_version_is_summarised_on_upgrade(db_url: str) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    study_id = _study(db)
    _fill(db, study_id, 60, seed=4)
    expected = queries.study_view(db, db.get_study(study_id), with_front=True).summary.columns()
    with db.engine.begin() as conn:  # as an earlier version left it: no summary, no values, no objectives
        conn.exec_driver_sql("DELETE FROM tuner_study_summaries")
        conn.exec_driver_sql("DELETE FROM tuner_trial_values")
        conn.execute(update(StudyRow).values(objectives=None))
    not_upgraded = queries.study_view(db, db.get_study(study_id), with_front=True).summary.columns()
    assert not_upgraded["counts"] == expected["counts"] and not_upgraded["front"] == expected["front"]
    assert db.backfill_summaries() == [study_id]
    assert queries.study_view(db, db.get_study(study_id), with_front=True).summary.columns() == expected
    rows, _ = queries.trial_page(db, study_id, sort="-score", limit=5)
    assert [t.number for t in rows] == _python_sorted(db.trials(study_id), "-score")[:5]
    assert db.backfill_summaries() == []
    db.dispose()


@pytest.fixture
def client(db_url: str) -> TestClient:
    app = create_app(Settings(db_url=db_url))
    with TestClient(app) as c:
        yield c
    app.state.db.dispose()


def _events(text: str) -> list[tuple[str, str, Any]]:
    """(id, event, data) of each event in a server-sent event stream."""
    out = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "event" in fields:
            out.append((fields.get("id", ""), fields["event"], json.loads(fields["data"])))
    return out


def test_the_event_stream_sends_what_changed_since_the_last_event_id(client: TestClient) -> None:
    db: StudyDB = client.app.state.db
    study_id = _study(db)
    _fill(db, study_id, 40, seed=5)
    db.update_study(study_id, status="completed")  # a terminal study: its stream ends by itself
    seq = queries.last_seq(db, study_id)
    assert seq >= 40

    # From now (no id): the study only, with the sequence it stands at.
    events = _events(client.get(f"/api/studies/{study_id}/events").text)
    assert [(i, e) for i, e, _ in events] == [(str(seq), "study")]
    assert events[0][2]["status"] == "completed" and events[0][2]["seq"] == seq

    # A reconnect with Last-Event-ID: the trials written after it, each once and as it is now, then the study.
    cut = seq - 12
    events = _events(client.get(f"/api/studies/{study_id}/events", headers={"Last-Event-ID": str(cut)}).text)
    assert [e for _, e, _ in events] == ["trials", "study"]
    sent = events[0][2]["trials"]
    changed = sorted((t for t in db.trials(study_id) if t.seq > cut), key=lambda t: t.seq)
    assert [t["number"] for t in sent] == [t.number for t in changed] and len(sent) <= 12
    assert events[0][0] == str(seq) and events[0][2]["seq"] == seq
    assert all("samples_ms" not in t for t in sent)
    by_number = {t.number: t for t in changed}
    assert all(t["status"] == by_number[t["number"]].status for t in sent)

    # ?after= (what an EventSource's first connect can pass) is the same start; the header wins over it.
    after = _events(client.get(f"/api/studies/{study_id}/events", params={"after": cut}).text)
    assert after == events
    both = client.get(f"/api/studies/{study_id}/events", params={"after": 0}, headers={"Last-Event-ID": str(seq)})
    assert [e for _, e, _ in _events(both.text)] == ["study"]


class _Open:
    """A request whose client never goes away (what ``_event_stream`` asks of its request)."""

    async def is_disconnected(self) -> bool:
        return False


def test_an_idle_event_stream_keeps_alive_in_seconds_not_polls(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream of a study where nothing changes sends a keep-alive comment every ``EVENT_KEEPALIVE_S`` of
    wall time, however long each look at the database takes: counted in looks (every 15th), a loaded
    server went silent for 30 s and more, and clients and proxies with a read timeout dropped the stream."""
    import asyncio
    import time

    from api import streams

    db = StudyDB(db_url)
    db.create_tables()
    study_id = _study(db)
    monkeypatch.setattr(streams, "EVENT_POLL_S", 0.05)
    monkeypatch.setattr(streams, "EVENT_KEEPALIVE_S", 1.0, raising=False)
    slow = lambda *_: time.sleep(0.1)  # noqa: E731 - a loaded database: each statement takes 0.1 s
    event.listen(db.engine, "before_cursor_execute", slow)

    async def first_keep_alive() -> float:
        started = time.monotonic()
        stream = streams._event_stream(db, study_id, _Open(), None)
        async for message in stream:
            if message.startswith(": keep-alive"):
                await stream.aclose()
                return time.monotonic() - started
        raise AssertionError("the stream ended")

    try:
        waited = asyncio.run(asyncio.wait_for(first_keep_alive(), timeout=60))
    finally:
        event.remove(db.engine, "before_cursor_execute", slow)
        db.dispose()
    assert waited < 4.0, f"the first keep-alive came after {waited:.1f} s of silence"


def test_the_event_stream_sends_the_eta_that_the_api_answers(client: TestClient) -> None:
    """The study page shows the study's ``eta_s`` as its event stream sends it: the same estimate as
    ``GET /api/studies/{id}`` (the recent trial rate), not one from the run's mean rate (at 7/40 the page said
    2 min 5 s where the API said 62 s)."""
    import asyncio
    import datetime as dt

    from api import streams

    db: StudyDB = client.app.state.db
    study_id = _study(db, "eta")
    _fill(db, study_id, 30, seed=7)
    now = dt.datetime.now(dt.timezone.utc)
    with db.engine.begin() as conn:  # the recent trials one a second; the run an hour long: a slow start
        for number in range(30):
            conn.execute(
                update(TrialRow)
                .where(TrialRow.study_id == study_id, TrialRow.number == number, TrialRow.finished_at.is_not(None))
                .values(finished_at=now - dt.timedelta(seconds=30 - number))
            )
    db.update_study(study_id, status="running", elapsed_s=3600.0)

    async def first_study_event() -> dict[str, Any]:
        stream = streams._event_stream(db, study_id, _Open(), None)
        async for message in stream:
            if "event: study" in message:
                await stream.aclose()
                return json.loads(message.split("data: ", 1)[1])
        raise AssertionError("the stream ended")

    streamed = asyncio.run(asyncio.wait_for(first_study_event(), timeout=60))
    answered = client.get(f"/api/studies/{study_id}").json()
    measured, budget = answered["measured"], answered["budget_trials"]
    mean_rate_eta = (budget - measured) * 3600.0 / measured
    assert 0 < measured < budget and answered["eta_s"] < mean_rate_eta / 10
    assert streamed["eta_s"] == pytest.approx(answered["eta_s"], abs=2.0)


def test_overview_and_reads_never_select_raw_samples(client: TestClient) -> None:
    db: StudyDB = client.app.state.db
    study_id = _study(db)
    _fill(db, study_id, 80, seed=6)
    statements: list[str] = []
    listener = lambda *args: statements.append(args[2])  # noqa: E731 - (conn, cursor, statement, ...)
    event.listen(db.engine, "before_cursor_execute", listener)
    try:
        assert client.get("/api/studies").status_code == 200
        assert not any("tuner_trials" in s for s in statements)  # a list reads no trial
        statements.clear()
        for path in ("", "/trials?limit=50", "/trials?limit=50&sort=-score&status=ok", "/pareto", "/overview"):
            assert client.get(f"/api/studies/{study_id}{path}").status_code == 200, path
        assert statements and not any("samples_ms" in s for s in statements)
    finally:
        event.remove(db.engine, "before_cursor_execute", listener)
    overview = client.get(f"/api/studies/{study_id}/overview", params={"limit": 20}).json()
    assert overview["seq"] == queries.last_seq(db, study_id)
    assert [t["number"] for t in overview["trials"]["items"]] == list(range(20))
    assert overview["trials"]["total"] == 80 and len(overview["points"]) == 80
    assert set(overview["points"][0]) == {
        "number", "status", "feasible", "duplicate_of", "timing_comparable", "params", "metrics",
    }  # fmt: skip
    assert overview["pareto"] == client.get(f"/api/studies/{study_id}/pareto").json()
    failed = {t.number for t in db.trials(study_id) if t.status not in ("ok", "running") and t.duplicate_of is None}
    failed |= {t.number for t in db.trials(study_id) if t.status == "ok" and t.feasible is False and not t.duplicate_of}
    assert {t["number"] for t in overview["failures"]} == failed
    assert overview["study"]["counts"] == db.status_counts(study_id)
    assert overview["study"]["front_size"] == len(overview["pareto"]["trials"])
    assert DUPLICATE in overview["study"]["counts"]


def test_a_study_whose_workload_no_longer_builds_is_listed_with_its_error(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before objectives were stored with the study, each of these made every page of the list a 500."""
    monkeypatch.setenv("TUNER_LANDSCAPE_DIR", str(tmp_path))  # where replay files may be read from
    db: StudyDB = client.app.state.db
    landscape = tmp_path / "softmax.jsonl"
    shutil.copy(REPO / "bench/landscapes/softmax-8192.jsonl", landscape)
    replay = {
        "name": "replayed",
        "workload": "replay",
        "args": {"file": str(landscape)},
        "objectives": [{"metric": "gbps"}],
        "budget": {"trials": 5},
    }
    assert client.post("/api/studies", json=replay).status_code == 202
    assert client.post("/api/studies", json=_noop_spec("nan-sleep", sleep_ms=1)).status_code == 202
    landscape.unlink()  # the landscape file was removed later
    # args.sleep_ms: NaN is stored as null by model_dump(mode="json")
    nan_id = db.find_study("nan-sleep").id
    with db.engine.begin() as conn:
        conn.execute(update(StudyRow).where(StudyRow.id == nan_id).values(spec=_noop_spec("nan-sleep", sleep_ms=None)))
    # ... and one stored before objectives were, with such a spec: shown with its error.
    legacy = db.create_study(
        name="legacy", workload="noop", spec=_noop_spec("legacy", sleep_ms=None), space={}, space_hash="h"
    )
    assert legacy.objectives is None

    page = client.get("/api/studies")
    assert page.status_code == 200, page.text
    items = {s["name"]: s for s in page.json()["items"]}
    assert items["replayed"]["objectives"] == [{"metric": "gbps", "direction": "maximize"}]
    assert "softmax.jsonl" in items["replayed"]["error"]  # listed with its objectives, and why it cannot run
    assert items["nan-sleep"]["objectives"] == [
        {"metric": "score", "direction": "maximize"},
        {"metric": "cost", "direction": "minimize"},
    ]
    assert "sleep_ms" in items["nan-sleep"]["error"]
    assert items["legacy"]["objectives"] == [] and "sleep_ms" in items["legacy"]["error"]
    for study in items.values():
        for path in ("", "/trials", "/pareto", "/overview"):
            assert client.get(f"/api/studies/{study['id']}{path}").status_code == 200, (study["name"], path)


def test_the_plots_of_a_very_large_study_get_every_kth_trial_and_the_whole_front(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    db: StudyDB = client.app.state.db
    study_id = _study(db)
    _fill(db, study_id, 120, seed=7)
    monkeypatch.setattr(queries, "MAX_POINTS", 25)
    overview = client.get(f"/api/studies/{study_id}/overview").json()
    assert overview["points_stride"] == 5  # ceil(120 / 25)
    front = {t["number"] for t in overview["pareto"]["trials"]}
    assert front and {p["number"] for p in overview["points"]} == set(range(0, 120, 5)) | front


def test_the_front_is_paged_and_sampled_in_front_order_from_the_summary(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/pareto`` pages (``limit``, ``offset``, ``total``), gives the whole front on request (``all``) and a
    sample spread along it (``sample``, what the study page's first draw gets); all in ``pareto_front``'s
    order, also for a summary stored before the front's order was."""
    db: StudyDB = client.app.state.db
    study_id = _study(db)
    rng = random.Random(8)
    writes = []
    for number in range(60):  # score against cost: a wide front, with dominated points and ties among it
        x = round(rng.random(), 2)
        worse = rng.random() < 0.3
        writes.append(db.insert_op(study_id, number, {"x": x}, optuna_trial_id=None))
        writes.append(
            db.finish_op(study_id, number, status="ok", metrics={"score": x - 0.5 * worse, "cost": x + 0.5 * worse},
                         feasible=True, timing_comparable=True, error=None, worker="w", attempt=1, fingerprint=None)
        )  # fmt: skip
        if number % 7 == 0:
            db.apply(writes)
            writes = []
    db.apply(writes)
    expected = [t.number for t in pareto_front(db.trials(study_id), OBJECTIVES)]
    assert len(expected) >= 20
    base = f"/api/studies/{study_id}/pareto"
    for _stored_order in (True, False):
        whole = client.get(base, params={"all": "true"}).json()
        assert [t["number"] for t in whole["trials"]] == expected and whole["total"] == len(expected)
        assert client.get(base).json() == whole  # a front smaller than the default page
        paged = [client.get(base, params={"limit": 4, "offset": o}).json() for o in range(0, len(expected), 4)]
        assert [t["number"] for p in paged for t in p["trials"]] == expected
        assert {p["total"] for p in paged} == {len(expected)} and [p["offset"] for p in paged][:2] == [0, 4]
        sample = client.get(base, params={"sample": 3}).json()
        stride = -(-len(expected) // 3)
        numbers = expected[::stride] + ([expected[-1]] if expected[::stride][-1] != expected[-1] else [])
        assert [t["number"] for t in sample["trials"]] == numbers and sample["stride"] == stride
        assert sample["default_pick"] == whole["default_pick"] == best_trial(db.trials(study_id), OBJECTIVES).number
        monkeypatch.setattr("api.routes.studies.FRONT_SAMPLE", 3)
        overview = client.get(f"/api/studies/{study_id}/overview").json()
        monkeypatch.undo()
        assert overview["pareto"] == sample
        assert set(numbers) <= {p["number"] for p in overview["points"]}
        with db.engine.begin() as conn:  # as a release before the front's order was stored left it
            conn.execute(update(StudySummaryRow).values(front_order=None))


def test_page_totals_come_from_the_summary_where_it_knows_them(db_url: str) -> None:
    """No ``count(*)`` over a study's trials for a page of a study without copies (a 100,000-trial study
    counted on every page read), and the same totals as a count."""
    db = StudyDB(db_url)
    db.create_tables()
    study_id = _study(db)
    for number in range(40):
        db.insert_trial(study_id, number, {"x": number}, optuna_trial_id=None)
        if number % 4:
            status = "ok" if number % 3 else "timeout"
            db.finish_trial(study_id, number, status=status, metrics={"score": float(number), "cost": 1.0},
                            feasible=True, timing_comparable=True, error=None, worker="w", attempt=1,
                            fingerprint=None)  # fmt: skip
    statements: list[str] = []
    listener = lambda *args: statements.append(args[2])  # noqa: E731 - (conn, cursor, statement, ...)
    event.listen(db.engine, "before_cursor_execute", listener)
    try:
        every = db.trials(study_id)
        for status in (None, "ok", "timeout", "running", "runtime_error"):
            statements.clear()
            rows, total = queries.trial_page(db, study_id, status=status, limit=5)
            assert total == len([t for t in every if status is None or t.status == status])
            assert not any("count(" in s.lower() for s in statements), status
        for status in (None, "ok"):  # a full page of trials with the metric: the values are not counted either
            statements.clear()
            rows, _ = queries.trial_page(db, study_id, status=status, sort="-score", limit=5)
            assert len(rows) == 5 and not any("count(" in s.lower() for s in statements), status
    finally:
        event.remove(db.engine, "before_cursor_execute", listener)
    db.dispose()


def test_the_failure_panel_walks_the_partial_index_of_failures(tmp_path: Path) -> None:
    db = StudyDB(f"sqlite:///{tmp_path / 'f.db'}")
    db.create_tables()
    study_id = _study(db)
    _fill(db, study_id, 60, seed=9)
    failed = {
        t.number
        for t in db.trials(study_id)
        if t.duplicate_of is None and (t.status not in ("ok", "running") or (t.status == "ok" and t.feasible is False))
    }
    assert {t.number for t in queries.failures(db, study_id)} == failed and failed
    with db.engine.connect() as conn:
        statement = select(TrialRow.number).where(TrialRow.study_id == study_id, text(FAILED_SQL))
        compiled = statement.order_by(TrialRow.number.desc()).limit(500).compile(compile_kwargs={"literal_binds": True})
        plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}"))
    assert "ix_tuner_trials_failures" in plan, plan
    db.dispose()
