"""One storage contract, run on an SQLite file and on a real PostgreSQL."""

from __future__ import annotations

import math

import optuna
import pytest
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import IntegrityError

from tuner.store import lifecycle
from tuner.store.storage import RUNNING, StudyDB, resolve_url

pytestmark = pytest.mark.timeout(120)


def make_study(db: StudyDB, name: str = "s1") -> int:
    row = db.create_study(name=name, workload="noop", spec={"name": name}, space={"params": {}}, space_hash="abc")
    return row.id


def test_studies_and_trials_round_trip(db_url: str) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    study_id = make_study(db)
    assert db.find_study("s1").id == study_id
    assert db.find_study(str(study_id)).name == "s1"
    assert db.find_study("nope") is None
    db.insert_trial(study_id, 0, {"tile": 64, "mode": "fast"}, optuna_trial_id=10)
    db.insert_trial(study_id, 1, {"tile": 32}, optuna_trial_id=11, status="infeasible_static", error="rule")
    assert db.status_counts(study_id) == {RUNNING: 1, "infeasible_static": 1}
    db.finish_trial(
        study_id,
        0,
        status="ok",
        metrics={"tflops": 512.5, "nan_metric": float("nan"), "inf_metric": math.inf},
        samples_ms=[1.0, 1.1, float("nan")],
        feasible=True,
        timing_comparable=True,
        error=None,
        worker="w0.0",
        attempt=2,
        fingerprint={"gpu": "H200", "driver": "580"},
    )
    trial = db.trial(study_id, 0)
    assert trial.status == "ok"
    assert trial.metrics == {"tflops": 512.5, "nan_metric": None, "inf_metric": None}
    assert trial.samples_ms == [1.0, 1.1]
    assert trial.params == {"tile": 64, "mode": "fast"}
    assert (trial.attempt, trial.worker, trial.feasible) == (2, "w0.0", True)
    assert trial.fingerprint["gpu"] == "H200"
    assert trial.finished_at is not None and trial.started_at is not None
    assert [t.number for t in db.trials(study_id)] == [0, 1]
    assert [t.number for t in db.trials(study_id, status="infeasible_static")] == [1]
    db.update_study(study_id, status="completed", elapsed_s=12.5)
    assert db.find_study("s1").status == "completed"
    db.dispose()


def test_trial_numbers_are_unique_per_study(db_url: str) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    a, b = make_study(db, "a"), make_study(db, "b")
    db.insert_trial(a, 0, {}, optuna_trial_id=None)
    db.insert_trial(b, 0, {}, optuna_trial_id=None)  # same number, other study: fine
    with pytest.raises(IntegrityError):
        db.insert_trial(a, 0, {}, optuna_trial_id=None)
    with pytest.raises(IntegrityError):
        make_study(db, "a")
    db.delete_study(a)
    assert db.find_study("a") is None and db.trials(a) == []
    db.dispose()


def test_optuna_storage_lives_in_the_same_database(db_url: str) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    make_study(db)
    study = optuna.create_study(storage=db.url, study_name="optuna-side", direction="maximize")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    tables = set(sa_inspect(db.engine).get_table_names())
    assert {"tuner_studies", "tuner_trials", "studies", "trials"} <= tables
    assert len(optuna.load_study(storage=db.url, study_name="optuna-side").trials) == 3
    db.dispose()


def test_url_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_DB_URL", raising=False)
    assert resolve_url(None) == "sqlite:///tuner.db"
    assert resolve_url("/tmp/x.db") == "sqlite:////tmp/x.db"
    assert resolve_url("postgresql://u:p@h/d") == "postgresql+psycopg://u:p@h/d"
    monkeypatch.setenv("TUNER_DB_URL", "sqlite:///env.db")
    assert resolve_url(None) == "sqlite:///env.db"


def test_sqlite_runs_in_wal_mode(sqlite_url: str) -> None:
    db = StudyDB(sqlite_url)
    db.create_tables()
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    db.dispose()


def test_leases_let_one_runner_hold_a_study_and_another_take_over_when_it_lapses(db_url: str) -> None:
    import time

    db = StudyDB(db_url)
    db.create_tables()
    study_id = make_study(db, "leased")  # created queued
    first = lifecycle.claim_next(db, "runner-a", lease_s=0.5)
    assert first is not None and first.id == study_id and first.status == "running"
    assert lifecycle.claim_next(db, "runner-b", lease_s=30) is None  # held
    assert db.renew_lease(study_id, "runner-a", 0.5)
    time.sleep(0.8)  # runner-a stops renewing: its lease lapses
    taken = lifecycle.claim_next(db, "runner-b", lease_s=30)
    assert taken is not None and taken.id == study_id and taken.lease_owner == "runner-b"
    assert not db.renew_lease(study_id, "runner-a", 30)  # the old owner learns it lost the study
    assert not lifecycle.hand_back(db, study_id, "runner-a", "queued again")  # not a's any more
    assert lifecycle.hand_back(db, study_id, "runner-b", "queued again")
    row = db.get_study(study_id)
    assert (row.status, row.message, row.lease_owner, row.lease_expires_at) == ("queued", "queued again", None, None)
    assert not lifecycle.hand_back(db, study_id, "runner-b", "queued again")  # handed back once
    assert lifecycle.claim_next(db, "runner-b", lease_s=30).id == study_id
    db.release_lease(study_id, "runner-b")
    assert db.get_study(study_id).lease_owner is None
    db.update_study(study_id, status="completed")
    assert lifecycle.claim_next(db, "runner-c", lease_s=30) is None
    db.dispose()


def test_a_database_of_an_earlier_version_gains_the_new_columns_and_keeps_its_rows(db_url: str) -> None:
    """A database made before leases, idempotency keys and repeat detection existed still opens and works."""
    from sqlalchemy import Column, ForeignKey, MetaData, Table, insert

    from tuner.store.storage import Base, make_engine, resolve_url

    dropped = {"tuner_studies": {"lease_owner", "lease_expires_at", "idempotency_key", "stop_requested",
                                 "idempotency_spec_hash", "objectives",
                                 "proposal_counts"},  # columns of later migrations
               "tuner_trials": {"duplicate_of", "remeasured", "attempt", "seq", "extra"}}  # fmt: skip
    old = MetaData()
    for table in Base.metadata.sorted_tables:
        if table.name not in dropped:  # a table of a later version (summaries, metric values)
            continue
        columns = [
            Column(
                c.name, c.type, *[ForeignKey(fk.target_fullname) for fk in c.foreign_keys], primary_key=c.primary_key
            )
            for c in table.columns
            if c.name not in dropped[table.name]
        ]
        Table(table.name, old, *columns)
    engine = make_engine(resolve_url(db_url))
    old.create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            insert(old.tables["tuner_studies"]).values(
                name="before", workload="noop", status="completed", spec={}, space={}, space_hash="h",
                optuna_name="tuner-1-before", elapsed_s=1.0,
            )
        )  # fmt: skip
        study_id = conn.execute(old.tables["tuner_studies"].select()).first().id
        conn.execute(
            insert(old.tables["tuner_trials"]).values(
                study_id=study_id, number=0, status="ok", params={"x": 1}, metrics={"score": 0.5}, samples_ms=[]
            )
        )
    engine.dispose()

    db = StudyDB(db_url)
    db.create_tables()
    db.create_tables()  # nothing left to do: a second open changes nothing
    assert db.schema_is_current()
    row = db.find_study("before")
    assert row.status == "completed" and row.stop_requested is False and row.lease_owner is None
    (trial,) = db.trials(row.id)
    assert trial.metrics == {"score": 0.5} and trial.attempt == 1 and trial.duplicate_of is None
    # What the new columns serve works on the upgraded database.
    assert db.take_lease(row.id, "me", 30) and not db.take_lease(row.id, "other", 30)
    fresh = db.create_study(name="after", workload="noop", spec={}, space={}, space_hash="h", idempotency_key="key-1")
    assert db.find_by_idempotency_key("key-1").id == fresh.id
    with pytest.raises(IntegrityError):  # the key stays unique (a unique index on the added column)
        db.create_study(name="again", workload="noop", spec={}, space={}, space_hash="h", idempotency_key="key-1")
    db.dispose()


def test_a_study_reference_past_a_64_bit_id_finds_nothing(db_url: str) -> None:
    """An all-digit reference too large for an integer column is no study, not a database error."""
    db = StudyDB(db_url)
    db.create_tables()
    assert db.find_study("9223372036854775808") is None
    assert db.find_study(str(2**70)) is None
    db.dispose()
