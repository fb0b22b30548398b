"""The study database (SQLAlchemy 2): studies and trials, on SQLite or PostgreSQL.

One code path for both. SQLite files run in WAL mode with a busy timeout so
readers (CLI, API) never block the orchestrator, which is the only writer.
The sampler's Optuna study is rebuilt in memory from these rows
(``tuner/strategy/adapter.py``); databases made by earlier releases also hold
Optuna's RDB tables, which is why ours are prefixed ``tuner_``.

The tables are in ``tuner/store/schema.py`` and the connections (URLs, engines, retries) in
``tuner/store/engine.py``; this module is their public front (the names are imported from here)
and holds :class:`StudyDB`, the reads and writes of rows.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import math
import os
import re
import socket
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import sessionmaker

from tuner.store.engine import (
    DEFAULT_DB_URL,
    RUNNER_RETRY_S,
    T,
    is_transient,
    make_engine,
    resolve_url,
    retry_transient,
    tune_sqlite_engine,
)
from tuner.store.schema import (
    DUPLICATE,
    FAILED_SQL,
    NOT_MEASURED,
    RUNNING,
    STUDY_STATUSES,
    Base,
    StudyRow,
    StudySummaryRow,
    TrialRow,
    TrialValueRow,
    UTCDateTime,
    _now,
    empty_summary,
    measured_count,
)
from tuner.study.yamlio import json_safe

__all__ = [
    "DEFAULT_DB_URL",
    "DUPLICATE",
    "FAILED_SQL",
    "NOT_MEASURED",
    "RUNNER_RETRY_S",
    "RUNNING",
    "STUDY_STATUSES",
    "Base",
    "StudyDB",
    "StudyRow",
    "StudySummaryRow",
    "TrialRow",
    "TrialValueRow",
    "TrialWrite",
    "UTCDateTime",
    "clean_metrics",
    "clean_number",
    "empty_summary",
    "is_transient",
    "lease_owner_name",
    "make_engine",
    "measured_count",
    "owner_is_dead",
    "resolve_url",
    "retry_transient",
    "stored_objectives",
    "tune_sqlite_engine",
]

log = logging.getLogger("tuner.store.storage")


def clean_number(value: Any) -> float | None:
    """A metric as JSON can carry it: NaN and inf become null (the status says why)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def clean_metrics(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    return {str(k): clean_number(v) for k, v in metrics.items()}


def lease_owner_name(role: str) -> str:
    """A lease owner's name: the role, this host and this process (what :func:`owner_is_dead` reads)."""
    return f"{role} {socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_is_dead(owner: str | None) -> bool:
    """Whether a lease owner named by :func:`lease_owner_name` is a process of this host that no longer
    runs: its lease can be taken at once instead of waiting for it to lapse. Unknown owners are alive."""
    if not owner:
        return False
    match = re.search(r"(\S+):(\d+):[0-9a-f]{8}$", owner)
    if match is None or match.group(1) != socket.gethostname():
        return False
    try:
        os.kill(int(match.group(2)), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


@dataclass(frozen=True)
class TrialWrite:
    """One pending write of a trial row: an insert, or the update that finishes it."""

    kind: str  # "insert", or "finish"/"update": an update of the row's columns
    study_id: int
    number: int
    values: dict[str, Any]


def stored_objectives(
    spec: Mapping[str, Any], objectives: Iterable[tuple[str, str]] | None = None
) -> list[dict[str, str]] | None:
    """A study's objectives as stored with it (``StudyRow.objectives``): the given (metric, direction) pairs,
    else the spec's resolved against its workload now; None when the spec's workload cannot be built."""
    if objectives is None:
        from tuner.study.spec import objectives_from_spec

        try:
            objectives = objectives_from_spec(spec)
        except Exception:  # an unbuildable spec is stored without objectives (shown with its error)
            return None
    return [{"metric": m, "direction": d} for m, d in objectives]


def _retrying(method: Callable[..., T]) -> Callable[..., T]:
    """A StudyDB method retried on transient database errors for the instance's ``retry_s`` seconds."""

    @functools.wraps(method)
    def wrapper(self: StudyDB, *args: Any, **kwargs: Any) -> T:
        if self.retry_s <= 0:
            return method(self, *args, **kwargs)
        return retry_transient(lambda: method(self, *args, **kwargs), self.retry_s, method.__name__)

    return wrapper


class StudyDB:
    """Reads and writes studies and trials. Each method is one short transaction.

    ``retry_s``: how long a method (and a new connection) retries a database it cannot reach before
    the error reaches the caller; 0 (the default) fails at once, as a read-only command or the API wants.
    """

    def __init__(self, url: str | None = None, *, retry_s: float = 0.0) -> None:
        self.url = resolve_url(url)
        self.retry_s = retry_s
        self.engine = make_engine(self.url, retry_s=retry_s)
        self.Session = sessionmaker(self.engine, expire_on_commit=False)
        # A study's objectives, read at its first write here: they never change once stored, and reading
        # them again cost a query per write on the orchestrator's hot path.
        self._objectives: dict[int, list[tuple[str, str]]] = {}

    def create_tables(self) -> None:
        """Create the tables or bring them up to date: the schema migrations (tuner/store/migrations) to the
        newest, then the summaries of studies stored before summaries existed. Commands that write run it
        once on start; read-only commands never do."""
        from tuner.store.migrations import upgrade

        upgrade(self.engine)
        self.backfill_summaries()

    def backfill_summaries(self) -> list[int]:
        """Give studies stored before summaries existed their summary and metric values; returns their ids."""
        from tuner.store.summary import backfill

        with self.Session() as s:
            missing = list(
                s.scalars(
                    select(StudyRow.id)
                    .outerjoin(StudySummaryRow, StudySummaryRow.study_id == StudyRow.id)
                    .where(StudySummaryRow.study_id.is_(None))
                )
            )
        for study_id in missing:
            with self.engine.begin() as conn:
                backfill(conn, study_id)
        if missing:
            log.warning("study database %s: summarised %d studies stored before summaries", self.url, len(missing))
        return missing

    def schema_is_current(self) -> bool:
        """Whether the database has the tables at the newest migration (False: run ``tuner db upgrade``)."""
        from tuner.store.migrations import is_current

        return is_current(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    # studies -----------------------------------------------------------------
    @_retrying
    def find_study(self, ref: str | int) -> StudyRow | None:
        """A study by name, or by id when ``ref`` is all digits and no study has that name."""
        with self.Session() as s:
            row = s.scalar(select(StudyRow).where(StudyRow.name == str(ref)))
            if row is None and str(ref).isdigit() and int(ref) < 2**63:  # past a 64-bit id: no such study
                row = s.get(StudyRow, int(ref))
            return row

    def create_study(
        self,
        *,
        name: str,
        workload: str,
        spec: dict[str, Any],
        space: dict[str, Any],
        space_hash: str,
        status: str = "queued",
        idempotency_key: str | None = None,
        objectives: Iterable[tuple[str, str]] | None = None,
    ) -> StudyRow:
        """A new study with an empty summary. ``objectives`` ((metric, direction) pairs) default to the
        spec's, resolved against its workload now, so that no later read has to build the workload."""
        with self.Session.begin() as s:
            row = StudyRow(
                name=name,
                workload=workload,
                spec=spec,
                space=space,
                space_hash=space_hash,
                optuna_name="",
                status=status,
                idempotency_key=idempotency_key,
                stop_requested=False,
                objectives=stored_objectives(spec, objectives),
            )
            s.add(row)
            s.flush()
            row.optuna_name = f"tuner-{row.id}-{name}"
            s.add(empty_summary(row.id))
        return row

    @_retrying
    def get_study(self, study_id: int) -> StudyRow | None:
        with self.Session() as s:
            return s.get(StudyRow, study_id)

    @_retrying
    def find_by_idempotency_key(self, key: str, max_age_s: float | None = None) -> StudyRow | None:
        """The study a submit with this key made; with ``max_age_s``, a key older than that is released
        (the study keeps running, the key is cleared) and None returned, so the key can be used again."""
        with self.Session() as s:
            row = s.scalar(select(StudyRow).where(StudyRow.idempotency_key == key))
        if row is not None and max_age_s is not None and _now() - row.created_at > dt.timedelta(seconds=max_age_s):
            with self.Session.begin() as s:
                s.execute(update(StudyRow).where(StudyRow.id == row.id).values(idempotency_key=None))
            return None
        return row

    # leases ------------------------------------------------------------------
    @_retrying
    def take_lease(self, study_id: int, owner: str, lease_s: float, *, steal_from: str | None = None) -> bool:
        """Hold the study's lease unless another owner's lease is still live (a conditional UPDATE).

        ``steal_from``: also take it from that owner, live or not (its process is known to be dead).
        """
        now = _now()
        free = StudyRow.lease_owner.is_(None) | (StudyRow.lease_owner == owner)
        if steal_from is not None:
            free = free | (StudyRow.lease_owner == steal_from)
        free = free | StudyRow.lease_expires_at.is_(None) | (StudyRow.lease_expires_at < now)
        with self.Session.begin() as s:
            result = s.execute(
                update(StudyRow)
                .where(StudyRow.id == study_id, free)
                .values(lease_owner=owner, lease_expires_at=now + dt.timedelta(seconds=lease_s))
            )
        return result.rowcount == 1

    @_retrying
    def renew_lease(self, study_id: int, owner: str, lease_s: float, elapsed_s: float | None = None) -> bool:
        """Extend our lease (and record the run's ``elapsed_s`` with it); False when another orchestrator holds
        the study now."""
        fields: dict[str, Any] = {} if elapsed_s is None else {"elapsed_s": elapsed_s}
        with self.Session.begin() as s:
            result = s.execute(
                update(StudyRow)
                .where(StudyRow.id == study_id, StudyRow.lease_owner == owner)
                .values(lease_expires_at=_now() + dt.timedelta(seconds=lease_s), **fields)
            )
        return result.rowcount == 1

    @_retrying
    def release_lease(self, study_id: int, owner: str) -> None:
        with self.Session.begin() as s:
            s.execute(
                update(StudyRow)
                .where(StudyRow.id == study_id, StudyRow.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
            )

    @_retrying
    def update_study(self, study_id: int, **fields: Any) -> None:
        with self.Session.begin() as s:
            s.execute(update(StudyRow).where(StudyRow.id == study_id).values(**fields, updated_at=_now()))

    @_retrying
    def list_studies(self) -> list[StudyRow]:
        with self.Session() as s:
            return list(s.scalars(select(StudyRow).order_by(StudyRow.id)))

    def delete_study(self, study_id: int) -> None:
        self._objectives.pop(study_id, None)
        with self.Session.begin() as s:
            s.query(TrialValueRow).filter(TrialValueRow.study_id == study_id).delete()
            s.query(StudySummaryRow).filter(StudySummaryRow.study_id == study_id).delete()
            s.query(TrialRow).filter(TrialRow.study_id == study_id).delete()
            s.query(StudyRow).filter(StudyRow.id == study_id).delete()

    # trials ------------------------------------------------------------------
    # Writes come as operations so the orchestrator can apply several in one transaction.
    @staticmethod
    def insert_op(
        study_id: int,
        number: int,
        params: dict[str, Any],
        *,
        optuna_trial_id: int | None,
        status: str = RUNNING,
        error: str | None = None,
        copy_of: Any = None,
    ) -> TrialWrite:
        """A new trial row; ``copy_of`` makes it a finished copy of an earlier trial's result."""
        now = _now()
        if copy_of is not None:
            values = {
                column: getattr(copy_of, column)
                for column in (
                    "status",
                    "metrics",
                    "samples_ms",
                    "extra",
                    "feasible",
                    "timing_comparable",
                    "fingerprint",
                )
            }
            values.update(
                optuna_trial_id=optuna_trial_id,
                params=params,
                error=f"same config as trial {copy_of.number}: its result is reused, not measured again",
                duplicate_of=copy_of.number,
                started_at=now,
                finished_at=now,
            )
            return TrialWrite("insert", study_id, number, values)
        return TrialWrite(
            "insert",
            study_id,
            number,
            {
                "optuna_trial_id": optuna_trial_id,
                "status": status,
                "params": params,
                "metrics": {},
                "samples_ms": [],
                "error": error,
                "started_at": now,
                "finished_at": None if status == RUNNING else now,
                "feasible": None if status == RUNNING else False,
            },
        )

    @staticmethod
    def finish_op(
        study_id: int,
        number: int,
        *,
        status: str,
        metrics: Mapping[str, Any],
        samples_ms: Iterable[float] = (),
        extra: Mapping[str, Any] | None = None,
        feasible: bool,
        timing_comparable: bool | None,
        error: str | None,
        worker: str | None,
        attempt: int,
        fingerprint: dict[str, Any] | None,
    ) -> TrialWrite:
        return TrialWrite(
            "finish",
            study_id,
            number,
            {
                "status": status,
                "metrics": clean_metrics(metrics),
                "samples_ms": [x for x in (clean_number(v) for v in samples_ms) if x is not None],
                "extra": json_safe(dict(extra or {})),
                "feasible": feasible,
                "timing_comparable": timing_comparable,
                "error": error,
                "worker": worker,
                "attempt": attempt,
                "fingerprint": fingerprint,
                "finished_at": _now(),
            },
        )

    @_retrying
    def apply(self, writes: Iterable[TrialWrite]) -> None:
        """Apply trial writes in order, in one transaction (SQL Core: this is the orchestrator's hot path),
        with each study's summary, change sequence and metric values (``tuner/store/summary.py``) in the same one."""
        from tuner.store.summary import apply_writes

        by_study: dict[int, list[TrialWrite]] = {}
        for write in writes:
            by_study.setdefault(write.study_id, []).append(write)
        if not by_study:
            return
        with self.engine.begin() as conn:
            for study_id, group in by_study.items():
                objectives = apply_writes(conn, study_id, group, self._objectives.get(study_id))
                self._objectives[study_id] = objectives

    def insert_trial(self, study_id: int, number: int, params: dict[str, Any], **kwargs: Any) -> None:
        self.apply([self.insert_op(study_id, number, params, **kwargs)])

    def finish_trial(self, study_id: int, number: int, **kwargs: Any) -> None:
        self.apply([self.finish_op(study_id, number, **kwargs)])

    @_retrying
    def trials(self, study_id: int, status: str | None = None) -> list[TrialRow]:
        with self.Session() as s:
            q = select(TrialRow).where(TrialRow.study_id == study_id)
            if status is not None:
                q = q.where(TrialRow.status == status)
            return list(s.scalars(q.order_by(TrialRow.number)))

    @_retrying
    def trial(self, study_id: int, number: int) -> TrialRow | None:
        with self.Session() as s:
            return s.scalar(select(TrialRow).where(TrialRow.study_id == study_id, TrialRow.number == number))

    @_retrying
    def status_counts(self, study_id: int) -> dict[str, int]:
        with self.Session() as s:
            rows = s.execute(
                select(TrialRow.status, TrialRow.duplicate_of.is_not(None), func.count())
                .where(TrialRow.study_id == study_id)
                .group_by(TrialRow.status, TrialRow.duplicate_of.is_not(None))
            )
            counts: dict[str, int] = {}
            for status, duplicate, count in rows:
                key = DUPLICATE if duplicate else status
                counts[key] = counts.get(key, 0) + count
            return counts
