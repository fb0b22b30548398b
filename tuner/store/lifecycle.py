"""A study's lifecycle: every change of a study's status, each one conditional UPDATE.

::

    queued ──claim/start──▶ running ──finish──▶ completed | stopped | failed
      │  ▲                   │  ▲ │                        │
      │  └──── hand back ────┘  │ └─stop─▶ stopping ─finish─▶ stopped
      │                         │                 │
      └─stop─▶ stopped ─resume──┴────(resume: stopped, completed, failed ▶ queued)
    delete: queued, stopped, completed, failed ▶ gone at once;
            running, stopping ▶ deleted (the runner stops, then the rows go)

Each move is ``UPDATE ... WHERE id = :id AND status IN (allowed-from) [AND lease_owner = :owner]``:
of two racing moves exactly one takes effect and the other learns it lost (a False return), so a
stop, a resume or a delete never overwrites what a runner did a moment before, and two runners never
run one study: only the lease holder's moves out of ``running`` succeed, and a study that is
``running`` or ``stopping`` cannot be queued again until its runner has finished it.

A ``deleted`` study is hidden from every read at once (renamed, so its name is free again); its rows
are removed when its runner finishes it, or by the next claim once its lease lapsed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete as sql_delete
from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError

from tuner.store.storage import (
    StudyDB,
    StudyRow,
    StudySummaryRow,
    TrialRow,
    TrialValueRow,
    empty_summary,
    stored_objectives,
)

log = logging.getLogger("tuner.store.lifecycle")

QUEUED, RUNNING, STOPPING = "queued", "running", "stopping"
STOPPED, COMPLETED, FAILED, DELETED = "stopped", "completed", "failed", "deleted"
TERMINAL = (STOPPED, COMPLETED, FAILED)
ACTIVE = (RUNNING, STOPPING)  # a runner holds it
OUTCOMES = (COMPLETED, STOPPED, FAILED)


class IdempotencyConflict(ValueError):
    """The Idempotency-Key names a study made from another spec."""

    def __init__(self, key: str, study: StudyRow) -> None:
        super().__init__(f"Idempotency-Key {key!r} was used for another spec (study {study.name!r})")
        self.study = study


class NameTaken(ValueError):
    """A study of that name exists."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def spec_hash(spec: dict[str, Any]) -> str:
    """The hash of a spec in its stored JSON form (keys sorted): what an Idempotency-Key is bound to."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def transition(
    db: StudyDB, study_id: int, to: str, allowed_from: tuple[str, ...], *, owner: str | None = None, **fields: Any
) -> bool:
    """Move a study to ``to`` if its status is one of ``allowed_from`` (and, with ``owner``, if that owner
    holds its lease), setting ``fields`` too, in one conditional UPDATE. True when it moved."""
    where = [StudyRow.id == study_id, StudyRow.status.in_(allowed_from)]
    if owner is not None:
        where.append(StudyRow.lease_owner == owner)

    def move() -> int:
        with db.Session.begin() as s:
            return s.execute(update(StudyRow).where(*where).values(status=to, updated_at=_now(), **fields)).rowcount

    return _retry(db, move, f"study {study_id} -> {to}") == 1


def _retry(db: StudyDB, fn: Any, what: str) -> Any:
    from tuner.store.storage import retry_transient

    return retry_transient(fn, db.retry_s, what) if db.retry_s > 0 else fn()


def visible(row: StudyRow | None) -> StudyRow | None:
    """The row, or None for a study being deleted (every read treats it as gone)."""
    return None if row is None or row.status == DELETED else row


# submit ----------------------------------------------------------------------
def submit(
    db: StudyDB,
    *,
    name: str,
    workload: str,
    spec: dict[str, Any],
    space: dict[str, Any],
    space_hash: str,
    idempotency_key: str | None = None,
    objectives: Iterable[tuple[str, str]] | None = None,
) -> tuple[StudyRow, bool]:
    """Queue a new study; returns (the study, whether this call made it).

    With ``idempotency_key``, the key and the spec's hash are written in the transaction that makes the
    study, under the key's unique index; a key already taken is read back with the hash it was stored
    with: the same spec gives the study that key made (False),
    another spec raises :class:`IdempotencyConflict`. Whatever the interleaving of concurrent submits,
    one study is made per key. A name taken without the key raises :class:`NameTaken`.
    ``objectives`` ((metric, direction) pairs, default: the spec's) are stored with it, with an empty summary.
    """
    digest = spec_hash(spec)
    stored = stored_objectives(spec, objectives)
    try:
        with db.Session.begin() as s:
            row = StudyRow(
                name=name, workload=workload, spec=spec, space=space, space_hash=space_hash, optuna_name="",
                status=QUEUED, idempotency_key=idempotency_key,
                idempotency_spec_hash=digest if idempotency_key else None, stop_requested=False,
                objectives=stored,
            )  # fmt: skip
            s.add(row)
            s.flush()
            row.optuna_name = f"tuner-{row.id}-{name}"
            s.add(empty_summary(row.id))
        return row, True
    except IntegrityError:
        pass  # the key or the name is taken: by the submit we race, or by an older study
    if idempotency_key:
        # The unique index made the insert wait for the other transaction's commit, so this sees its row.
        with db.Session() as s:
            taken = s.scalar(select(StudyRow).where(StudyRow.idempotency_key == idempotency_key))
        if taken is not None:
            if (taken.idempotency_spec_hash or spec_hash(taken.spec)) != digest:
                raise IdempotencyConflict(idempotency_key, taken)
            return taken, False
    raise NameTaken(f"a study named {name!r} exists; resume it or choose another name")


def create_running(
    db: StudyDB,
    *,
    name: str,
    workload: str,
    spec: dict[str, Any],
    space: dict[str, Any],
    space_hash: str,
    owner: str | None,
    lease_s: float,
) -> StudyRow:
    """A new study, running, with ``owner`` holding its lease from the insert on (``tuner run``'s first run).

    When a concurrent run of the same spec made it first, that run's study is returned instead: the
    caller then finds its lease held and says who runs it.
    """
    now = _now()
    try:
        with db.Session.begin() as s:
            row = StudyRow(
                name=name, workload=workload, spec=spec, space=space, space_hash=space_hash, optuna_name="",
                status=RUNNING, stop_requested=False, lease_owner=owner,
                lease_expires_at=now + dt.timedelta(seconds=lease_s) if owner else None,
                objectives=stored_objectives(spec),
            )  # fmt: skip
            s.add(row)
            s.flush()
            row.optuna_name = f"tuner-{row.id}-{name}"
            s.add(empty_summary(row.id))
        return row
    except IntegrityError:
        existing = db.find_study(name)
        if existing is None:
            raise
        return existing


# runners ---------------------------------------------------------------------
def claim_next(db: StudyDB, owner: str, lease_s: float) -> StudyRow | None:
    """Take the oldest queued study, or a running one whose lease lapsed; None if there is none.

    First settles what dead runners left: a ``stopping`` study whose lease lapsed is ``stopped``, a
    ``deleted`` one is removed. The claim is a conditional UPDATE, so two runners never take one study.
    """
    sweep(db)
    return _retry(db, lambda: _claim_next(db, owner, lease_s), "a claim")


def _claim_next(db: StudyDB, owner: str, lease_s: float) -> StudyRow | None:
    now = _now()
    lapsed = (StudyRow.status == RUNNING) & StudyRow.lease_expires_at.is_not(None) & (StudyRow.lease_expires_at < now)
    claimable = (StudyRow.status == QUEUED) | lapsed
    with db.Session() as s:
        candidates = list(s.scalars(select(StudyRow.id).where(claimable).order_by(StudyRow.id).limit(5)))
    for study_id in candidates:
        with db.Session.begin() as s:
            result = s.execute(
                update(StudyRow)
                .where(StudyRow.id == study_id, claimable)
                .values(
                    status=RUNNING,
                    lease_owner=owner,
                    lease_expires_at=now + dt.timedelta(seconds=lease_s),
                    stop_requested=False,
                    updated_at=now,
                )
            )
        if result.rowcount == 1:
            return db.get_study(study_id)
    return None


def _lease_free(now: dt.datetime) -> Any:
    return or_(StudyRow.lease_owner.is_(None), StudyRow.lease_expires_at.is_(None), StudyRow.lease_expires_at < now)


def sweep(db: StudyDB) -> None:
    """Finish what runners that died left: stopping -> stopped, deleted -> removed (lease lapsed or none)."""
    for study_id in _retry(db, lambda: _sweep(db), "a sweep"):
        purge(db, study_id)


def _sweep(db: StudyDB) -> list[int]:
    now = _now()
    with db.Session.begin() as s:
        s.execute(
            update(StudyRow)
            .where(StudyRow.status == STOPPING, _lease_free(now))
            .values(status=STOPPED, lease_owner=None, lease_expires_at=None, updated_at=now)
        )
        return list(s.scalars(select(StudyRow.id).where(StudyRow.status == DELETED, _lease_free(now))))


def start_run(db: StudyDB, study_id: int, owner: str | None, **fields: Any) -> bool:
    """Mark a study running for the run that holds its lease (``owner``; None: a run without a lease).

    False when the study was deleted, or another owner holds its lease now. A stop asked for since the
    claim stands: a ``stopping`` study stays so (its runner sees the request and stops).
    """
    if transition(db, study_id, RUNNING, (QUEUED, RUNNING, *TERMINAL), owner=owner, **fields):
        return True
    row = db.get_study(study_id)
    return row is not None and row.status == STOPPING and (owner is None or row.lease_owner == owner)


def finish(db: StudyDB, study_id: int, status: str, *, owner: str | None = None, **fields: Any) -> bool:
    """A run's outcome (completed, stopped or failed), unless the study left ``running``/``stopping``
    meanwhile or another runner holds it. A study deleted while it ran is removed now. True when written."""
    assert status in OUTCOMES, status
    if transition(db, study_id, status, ACTIVE, owner=owner, **fields):
        return True
    current = db.get_study(study_id)
    if current is not None and current.status == DELETED and current.lease_owner in (None, owner):
        purge(db, study_id)
    return False


def fail(db: StudyDB, study_id: int, message: str, *, owner: str | None = None) -> bool:
    """Record a run that failed (its spec, or the orchestrator), also after the run marked it stopped."""
    return transition(db, study_id, FAILED, (QUEUED, *ACTIVE, STOPPED), owner=owner, message=message)


def hand_back(db: StudyDB, study_id: int, owner: str, message: str) -> bool:
    """Queue a study we run again and drop our lease; False when it is no longer ours or running."""
    return transition(
        db, study_id, QUEUED, (RUNNING,), owner=owner, message=message, lease_owner=None, lease_expires_at=None
    )


def requeue_stopped(db: StudyDB, study_id: int, message: str) -> bool:
    """Queue again a study its runner stopped because the runner shut down (nobody asked it to stop)."""
    where = [StudyRow.id == study_id, StudyRow.status == STOPPED, StudyRow.stop_requested.is_(False)]
    where.append(StudyRow.lease_owner.is_(None))

    def move() -> int:
        with db.Session.begin() as s:
            values = {"status": QUEUED, "message": message, "updated_at": _now()}
            return s.execute(update(StudyRow).where(*where).values(**values)).rowcount

    return _retry(db, move, f"study {study_id} -> queued") == 1


# users -----------------------------------------------------------------------
def request_stop(db: StudyDB, study_id: int) -> str | None:
    """Stop a study: a queued one at once, a running one through its runner (trials in flight finish).
    Returns the status it has now (None: no such study); terminal studies are left as they are."""
    if transition(db, study_id, STOPPED, (QUEUED,), message="stopped before it started"):
        return STOPPED
    if transition(db, study_id, STOPPING, (RUNNING,), stop_requested=True):
        return STOPPING
    row = visible(db.get_study(study_id))
    return row.status if row is not None else None


def resume(db: StudyDB, study_id: int) -> bool:
    """Queue a stopped, failed or completed study again (it goes on to its budget). False otherwise:
    a study still running or stopping is its runner's until the runner has finished it."""
    return transition(db, study_id, QUEUED, TERMINAL, stop_requested=False, message=None)


def delete(db: StudyDB, study_id: int) -> str | None:
    """Delete a study: one that no runner holds at once (``"deleted"``); a running or stopping one is
    stopped first (``"deleting"``: hidden now, removed when its runner has stopped). None: no such study."""
    for _ in range(3):  # each lost race means the status changed under us; look again
        row = db.get_study(study_id)
        if row is None or row.status == DELETED:
            return None
        if row.status in ACTIVE:
            hidden = f"~deleted-{study_id}"  # frees the name; no spec name starts with "~"
            if transition(db, study_id, DELETED, ACTIVE, stop_requested=True, name=hidden):
                return "deleting"
        elif transition(db, study_id, DELETED, (QUEUED, *TERMINAL)):
            purge(db, study_id)
            return "deleted"
    return None


def purge(db: StudyDB, study_id: int) -> None:
    """Remove a deleted study's rows and its Optuna study (only ever a study marked ``deleted``)."""
    with db.Session.begin() as s:
        optuna_name = s.scalar(select(StudyRow.optuna_name).where(StudyRow.id == study_id, StudyRow.status == DELETED))
        if optuna_name is None:
            return
        for table in (TrialValueRow, StudySummaryRow, TrialRow):
            s.execute(sql_delete(table).where(table.study_id == study_id))
        s.execute(sql_delete(StudyRow).where(StudyRow.id == study_id))
    _delete_optuna_study(db, optuna_name)
    log.info("study %s deleted", study_id)


def _delete_optuna_study(db: StudyDB, name: str) -> None:
    import optuna
    from sqlalchemy import inspect

    from tuner.store.storage import is_transient

    try:
        if not inspect(db.engine).has_table("version_info"):
            return  # no study ever ran here: Optuna's tables are not made just to find nothing in them
        optuna.delete_study(study_name=name, storage=db.url)
    except KeyError:
        pass  # queued and never started: Optuna never heard of it
    except Exception as exc:  # Optuna's rows are a cache of ours; a blip must not undo the delete
        if not is_transient(exc):
            raise
        log.warning("study %s: Optuna's copy not deleted: %s", name, exc)
