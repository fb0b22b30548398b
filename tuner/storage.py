"""The study database (SQLAlchemy 2): studies and trials, on SQLite or PostgreSQL.

One code path for both. SQLite files run in WAL mode with a busy timeout so
readers (CLI, API) never block the orchestrator, which is the only writer.
The sampler's Optuna study is rebuilt in memory from these rows
(``tuner/sampler_adapter.py``); databases made by earlier releases also hold
Optuna's RDB tables, which is why ours are prefixed ``tuner_``.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import math
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    select,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator

from tuner.workload import json_safe

log = logging.getLogger("tuner.storage")

DEFAULT_DB_URL = "sqlite:///tuner.db"
# What a study can be (tuner/lifecycle.py owns the moves between them); "deleted" rows are never shown.
STUDY_STATUSES = ("queued", "running", "stopping", "completed", "stopped", "failed")
RUNNING = "running"  # a trial dispatched and not yet finished
DUPLICATE = "duplicate"  # in counts: trials that reused an earlier trial's result (duplicate_of set)
NOT_MEASURED = frozenset({"infeasible_static", DUPLICATE})  # rows that cost no GPU time nor budget


def measured_count(counts: Mapping[str, int], *, include_running: bool = False) -> int:
    """Trials that count against the budget, from counts by status (``status_counts``'s form)."""
    return sum(n for s, n in counts.items() if s not in NOT_MEASURED and (include_running or s != RUNNING))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC datetime on every backend (SQLite hands back naive ones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value


class Base(DeclarativeBase):
    pass


class StudyRow(Base):
    __tablename__ = "tuner_studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True, index=True)
    workload: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    space: Mapped[dict[str, Any]] = mapped_column(JSON)
    space_hash: Mapped[str] = mapped_column(String(64))
    optuna_name: Mapped[str] = mapped_column(String(160))
    device: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    fingerprint: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    elapsed_s: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Who runs it: an orchestrator holds a lease it keeps renewing; a lapsed lease lets another take over.
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True, nullable=True)
    # The hash of the spec the key's first request submitted, stored in the transaction that made the study.
    idempotency_spec_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # [{"metric": m, "direction": d}] resolved at submit time, so reads never rebuild the workload
    objectives: Mapped[list[dict[str, str]] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=_now)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=_now, onupdate=_now)


class TrialRow(Base):
    __tablename__ = "tuner_trials"
    __table_args__ = (
        UniqueConstraint("study_id", "number", name="uq_tuner_trial_number"),
        Index("ix_tuner_trials_study_status", "study_id", "status"),
        Index("ix_tuner_trials_study_seq", "study_id", "seq"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    optuna_trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[str] = mapped_column(String(24), default=RUNNING, index=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    samples_ms: Mapped[list[float]] = mapped_column(JSON, default=list)
    # What the workload reported beside its metrics (TrialResult.extra, JSON-safe): the timing summary
    # ("timing": median, 95% interval, repetitions, convergence), loss curves, memory facts...
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    feasible: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    timing_comparable: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    worker: Mapped[str | None] = mapped_column(String(128), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    duplicate_of: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # {"metric": name, "values": [...], "median": x, "rounds": n}: the interleaved re-measurement
    remeasured: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    fingerprint: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The study's change sequence at this row's last write: event streams send rows with seq > the client's
    seq: Mapped[int | None] = mapped_column(Integer, nullable=True)


class TrialValueRow(Base):
    """One finite metric of one trial, so that trials sort and page by a metric in SQL.

    A narrow table rather than a column per objective: every metric of every workload becomes sortable
    without a schema change, and ``(study_id, metric, value)`` is an index the database walks in order,
    so a page of fifty by ``-score`` reads fifty entries, not the study. Kept by ``StudyDB.apply`` in the
    transaction that writes the trial's metrics; a metric that is null (NaN, inf, missing) has no row.
    The trial's status is repeated here so that a page filtered by status and sorted by a metric walks
    one index too, ``(study_id, metric, status, value, number)``.
    """

    __tablename__ = "tuner_trial_values"
    __table_args__ = (
        Index("ix_tuner_trial_values_order", "study_id", "metric", "value", "number"),
        Index("ix_tuner_trial_values_status_order", "study_id", "metric", "status", "value", "number"),
    )

    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    metric: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(24))  # the trial's, kept with it


class StudySummaryRow(Base):
    """What a study's list entry and page header show, kept current by ``StudyDB.apply`` in the same
    transaction as each trial write (``tuner/summary.py``): reads never count or scan trials."""

    __tablename__ = "tuner_study_summaries"

    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, default=0)  # the last change's sequence number
    n_trials: Mapped[int] = mapped_column(Integer, default=0)
    counts: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)  # status_counts' form
    # [[number, [objective values, smaller is better]], ...]: the maintained Pareto front
    front: Mapped[list[Any]] = mapped_column(JSON, default=list)
    front_size: Mapped[int] = mapped_column(Integer, default=0)
    remeasured: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)  # number -> median, first objective
    best: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # {"trial", "params", "metrics"}
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=_now, onupdate=_now)


def resolve_url(db: str | None) -> str:
    """``--db`` or ``TUNER_DB_URL`` or the default; a bare path means an SQLite file."""
    url = db or os.environ.get("TUNER_DB_URL") or DEFAULT_DB_URL
    if "://" not in url:
        url = f"sqlite:///{Path(url).expanduser()}"
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL: readers never block the writer. synchronous=NORMAL: a commit survives a killed
    # process (not a power cut), without an fsync per commit.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


#: Seconds a runner keeps retrying a database it cannot reach before it gives the study up (its lease lapses).
RUNNER_RETRY_S = 30.0
T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """Whether a database error is a blip worth retrying (a lost or refused connection, a locked SQLite
    file), not a bug or a constraint violation. Looks through wrappers such as Optuna's storage errors."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, sa_exc.IntegrityError):
            return False
        if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)):
            return True
        if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return False


def retry_transient(fn: Callable[[], T], retry_s: float, what: str) -> T:
    """``fn()``, called again with backoff (0.1 s doubling to 2 s) while it fails on a transient database
    error and fewer than ``retry_s`` seconds have passed; the last error is raised after that."""
    deadline = time.monotonic() + retry_s
    delay = 0.1
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("database unreachable (%s): retrying %s in %.1f s", type(exc).__name__, what, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _retry_connect(engine: Engine, retry_s: float) -> None:
    """Let a new connection wait up to ``retry_s`` seconds for a server that is restarting."""

    @event.listens_for(engine, "do_connect")
    def connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        return retry_transient(lambda: _wrapped_connect(dialect, cargs, cparams), retry_s, "a connection")


def _wrapped_connect(dialect: Any, cargs: Any, cparams: Any) -> Any:
    try:
        return dialect.connect(*cargs, **cparams)
    except dialect.loaded_dbapi.Error as exc:  # as SQLAlchemy would wrap it, so is_transient can read it
        raise sa_exc.DBAPIError.instance(None, None, exc, dialect.loaded_dbapi.Error) from exc


def _ping_on_checkout(engine: Engine) -> None:
    """Pre-ping for an engine made elsewhere (Optuna's): a pooled connection the server dropped is
    replaced on checkout instead of failing the next statement (what ``pool_pre_ping`` does)."""

    @event.listens_for(engine, "checkout")
    def ping(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        try:
            cur = dbapi_conn.cursor()
            cur.execute("SELECT 1")
            cur.close()
        except Exception as exc:
            raise sa_exc.DisconnectionError() from exc


def tune_sqlite_engine(engine: Engine, retry_s: float = RUNNER_RETRY_S) -> None:
    """Apply this module's engine settings to an engine made elsewhere (Optuna's), from its next
    connection on: the SQLite pragmas below, or on a server, pre-ping and connections that wait for a
    restarting server for up to ``retry_s`` seconds."""
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        _ping_on_checkout(engine)
        _retry_connect(engine, retry_s)
    engine.dispose()


def make_engine(url: str, retry_s: float = 0.0) -> Engine:
    """An engine with pre-ping; on a server, a new connection waits up to ``retry_s`` s for it to come back."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30}, pool_pre_ping=True)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_engine(url, pool_pre_ping=True)
    if retry_s > 0:
        _retry_connect(engine, retry_s)
    return engine


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
        from tuner.export import objectives_from_spec

        try:
            objectives = objectives_from_spec(spec)
        except Exception:  # an unbuildable spec is stored without objectives (shown with its error)
            return None
    return [{"metric": m, "direction": d} for m, d in objectives]


def empty_summary(study_id: int) -> StudySummaryRow:
    """The summary row of a study with no trial yet (``tuner/summary.py`` keeps it from there)."""
    return StudySummaryRow(study_id=study_id, seq=0, n_trials=0, counts={}, front=[], front_size=0, remeasured={})


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

    def create_tables(self) -> None:
        """Create the tables or bring them up to date: the schema migrations (tuner/migrations) to the
        newest, then the summaries of studies stored before summaries existed. Commands that write run it
        once on start; read-only commands never do."""
        from tuner.migrations import upgrade

        upgrade(self.engine)
        self.backfill_summaries()

    def backfill_summaries(self) -> list[int]:
        """Give studies stored before summaries existed their summary and metric values; returns their ids."""
        from tuner.summary import backfill

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
        from tuner.migrations import is_current

        return is_current(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    # studies -----------------------------------------------------------------
    @_retrying
    def find_study(self, ref: str | int) -> StudyRow | None:
        """A study by name, or by id when ``ref`` is all digits and no study has that name."""
        with self.Session() as s:
            row = s.scalar(select(StudyRow).where(StudyRow.name == str(ref)))
            if row is None and str(ref).isdigit():
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
    def claim_next(self, owner: str, lease_s: float) -> StudyRow | None:
        """Take the oldest queued study, or a running one whose lease lapsed (:func:`tuner.lifecycle.claim_next`)."""
        from tuner import lifecycle

        return lifecycle.claim_next(self, owner, lease_s)

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

    def hand_back(self, study_id: int, owner: str, message: str) -> bool:
        """Queue a study we run again and drop our lease (:func:`tuner.lifecycle.hand_back`)."""
        from tuner import lifecycle

        return lifecycle.hand_back(self, study_id, owner, message)

    @_retrying
    def update_study(self, study_id: int, **fields: Any) -> None:
        with self.Session.begin() as s:
            s.execute(update(StudyRow).where(StudyRow.id == study_id).values(**fields, updated_at=_now()))

    @_retrying
    def list_studies(self) -> list[StudyRow]:
        with self.Session() as s:
            return list(s.scalars(select(StudyRow).order_by(StudyRow.id)))

    def delete_study(self, study_id: int) -> None:
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
        with each study's summary, change sequence and metric values (``tuner/summary.py``) in the same one."""
        from tuner.summary import apply_writes

        by_study: dict[int, list[TrialWrite]] = {}
        for write in writes:
            by_study.setdefault(write.study_id, []).append(write)
        if not by_study:
            return
        with self.engine.begin() as conn:
            for study_id, group in by_study.items():
                apply_writes(conn, study_id, group)

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
