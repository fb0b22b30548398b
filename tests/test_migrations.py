"""Schema migrations: databases made by release 0.1.0 upgrade, and read-only commands never write."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from tuner.cli import main
from tuner.store import lifecycle
from tuner.store.migrations import VERSION_TABLE, current, head
from tuner.store.storage import StudyDB, make_engine, resolve_url

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def spec(name: str) -> dict:
    return {"name": name, "workload": "noop", "objectives": [{"metric": "score"}], "budget": {"trials": 1}}


pytestmark = pytest.mark.timeout(120)


def run_sql(url: str, path: Path) -> None:
    """Execute a fixture of ``;``-terminated statements (comments and blank lines skipped)."""
    body = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("--"))
    engine = make_engine(resolve_url(url))
    with engine.begin() as conn:
        for statement in body.split(";\n"):
            if statement.strip() and statement.strip() not in ("BEGIN TRANSACTION", "COMMIT"):
                conn.exec_driver_sql(statement)
    engine.dispose()


def release_0_1_0(url: str) -> None:
    """The tables exactly as release 0.1.0 created them, with a finished study, a keyed one and a trial."""
    dialect = "postgresql" if url.startswith("postgresql") else "sqlite"
    run_sql(url, FIXTURES / f"schema-0.1.0-{dialect}.sql")
    engine = make_engine(resolve_url(url))
    with engine.begin() as conn:
        for name, key in (("before", None), ("keyed", "key-0")):
            conn.execute(
                text(
                    "INSERT INTO tuner_studies (name, workload, status, spec, space, space_hash, optuna_name, "
                    "elapsed_s, stop_requested, idempotency_key, created_at, updated_at) VALUES (:name, 'noop', "
                    "'completed', :spec, '{}', 'h', :optuna, 1.0, false, :key, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                ),
                {"name": name, "spec": json.dumps(spec(name)), "optuna": f"tuner-x-{name}", "key": key},
            )
        study_id = conn.execute(text("SELECT id FROM tuner_studies WHERE name = 'before'")).scalar()
        conn.execute(
            text(
                "INSERT INTO tuner_trials (study_id, number, status, params, metrics, samples_ms, attempt) "
                "VALUES (:id, 0, 'ok', '{\"x\": 1}', '{\"score\": 0.5}', '[1.0]', 1)"
            ),
            {"id": study_id},
        )
    engine.dispose()


def check_upgraded(db: StudyDB) -> None:
    """Rows kept, the newest revision reached, and what the new schema serves works."""
    assert current(db.engine) == head()
    before = db.find_study("before")
    assert before.status == "completed" and before.stop_requested is False and before.idempotency_spec_hash is None
    (trial,) = db.trials(before.id)
    assert trial.metrics == {"score": 0.5} and trial.attempt == 1 and trial.samples_ms == [1.0]
    # A key stored before hashes existed is compared against its stored spec.
    same, created = lifecycle.submit(
        db, name="keyed", workload="noop", spec=spec("keyed"), space={}, space_hash="h", idempotency_key="key-0"
    )
    assert not created and same.name == "keyed"
    with pytest.raises(lifecycle.IdempotencyConflict):
        lifecycle.submit(
            db, name="other", workload="noop", spec=spec("other"), space={}, space_hash="h", idempotency_key="key-0"
        )
    with pytest.raises(IntegrityError):  # the key stays unique
        db.create_study(name="again", workload="noop", spec={}, space={}, space_hash="h", idempotency_key="key-0")
    assert db.take_lease(before.id, "me", 30) and not db.take_lease(before.id, "other", 30)
    _, created = lifecycle.submit(
        db, name="after", workload="noop", spec=spec("after"), space={}, space_hash="h", idempotency_key="key-1"
    )
    assert created and db.find_study("after").idempotency_spec_hash == lifecycle.spec_hash(spec("after"))


def test_a_database_made_by_release_0_1_0_upgrades_and_keeps_its_rows(db_url: str) -> None:
    release_0_1_0(db_url)
    db = StudyDB(db_url)
    assert current(db.engine) is None and not db.schema_is_current()
    db.create_tables()
    db.create_tables()  # a second upgrade finds nothing to do
    check_upgraded(db)
    db.dispose()


def test_a_database_grown_by_release_0_1_0s_alter_loop_upgrades(sqlite_url: str) -> None:
    run_sql(sqlite_url, FIXTURES / "study-0.1.0-altered-sqlite.sql")
    db = StudyDB(sqlite_url)
    db.create_tables()
    assert current(db.engine) == head()
    keyed = db.find_study("keyed")
    assert keyed.idempotency_key == "key-0" and keyed.idempotency_spec_hash is None
    same, created = lifecycle.submit(
        db, name="keyed", workload="noop", spec={"name": "keyed"}, space={}, space_hash="h", idempotency_key="key-0"
    )
    assert not created and same.id == keyed.id
    (trial,) = db.trials(db.find_study("before").id)
    assert trial.metrics == {"score": 0.5} and trial.attempt == 1
    db.dispose()


def test_an_empty_database_gets_the_schema_the_models_describe(db_url: str) -> None:
    from tuner.store.storage import Base

    db = StudyDB(db_url)
    db.create_tables()
    inspector = inspect(db.engine)
    for table in Base.metadata.sorted_tables:
        assert {c["name"] for c in inspector.get_columns(table.name)} == {c.name for c in table.columns}
    assert inspector.has_table(VERSION_TABLE) and not inspector.has_table("alembic_version")  # Optuna's name
    db.dispose()


def _fingerprint(path: Path) -> tuple[str, str]:
    """The database file and its write-ahead log (what a write changes; the -shm index is not data)."""
    wal = path.with_name(path.name + "-wal")
    return hashlib.sha256(path.read_bytes()).hexdigest(), hashlib.sha256(
        wal.read_bytes() if wal.exists() else b""
    ).hexdigest()


def test_read_only_commands_never_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "old.db"
    release_0_1_0(f"sqlite:///{path}")
    before = _fingerprint(path)
    for command in (["status"], ["trials", "before"], ["export", "before"]):
        with pytest.raises(SystemExit) as refused:
            main([*command, "--db", str(path)])
        assert refused.value.code == 2 and "tuner db upgrade" in capsys.readouterr().err
    assert _fingerprint(path) == before  # not migrated behind the user's back
    assert not inspect(make_engine(f"sqlite:///{path}")).has_table(VERSION_TABLE)

    assert main(["db", "upgrade", "--db", str(path)]) == 0
    assert "upgraded from revision (none)" in capsys.readouterr().out
    upgraded = _fingerprint(path)
    assert main(["status", "--db", str(path)]) == 0 and "before" in capsys.readouterr().out
    assert main(["trials", "before", "--db", str(path)]) == 0
    main(["export", "before", "--db", str(path)])
    assert _fingerprint(path) == upgraded
    assert main(["db", "upgrade", "--db", str(path)]) == 0 and "nothing to do" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["status", "--db", str(tmp_path / "missing.db")])
    assert not (tmp_path / "missing.db").exists()
