"""The tables of the study database (SQLAlchemy 2 models): studies, trials, the sortable metric values and
the per-study summaries, with the statuses their rows take. The schema itself changes only through the
migrations (``tuner/store/migrations``); ``tuner/store/storage.py`` reads and writes these rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# What a study can be (tuner/store/lifecycle.py owns the moves between them); "deleted" rows are never shown.
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
    # Proposals the sampler replaced inside its proposal step (not trial rows): {"repeats_replaced": n,
    # "static_rejected": m}; NULL when the study's sampler replaces nothing (tuner.strategy does).
    proposal_counts: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=_now)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=_now, onupdate=_now)


#: What the failure panel lists: failed and statically pruned trials, and those that violate a constraint,
#: copies left out. One SQL text for the partial index below and the query that walks it, so that both
#: databases see that the query's condition is the index's (SQLite matches the terms as written).
FAILED_SQL = "duplicate_of IS NULL AND (status NOT IN ('ok', 'running') OR (status = 'ok' AND feasible = false))"


class TrialRow(Base):
    __tablename__ = "tuner_trials"
    __table_args__ = (
        UniqueConstraint("study_id", "number", name="uq_tuner_trial_number"),
        # number last: a page filtered by status walks the index in number order and stops at the page
        Index("ix_tuner_trials_study_status", "study_id", "status", "number"),
        Index("ix_tuner_trials_study_seq", "study_id", "seq"),
        # the latest failures of a study of 100,000 mostly good trials, without a pass over them
        Index(
            "ix_tuner_trials_failures",
            "study_id",
            "number",
            sqlite_where=text(FAILED_SQL),
            postgresql_where=text(FAILED_SQL),
        ),
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
    transaction as each trial write (``tuner/store/summary.py``): reads never count or scan trials."""

    __tablename__ = "tuner_study_summaries"

    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, default=0)  # the last change's sequence number
    n_trials: Mapped[int] = mapped_column(Integer, default=0)
    counts: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)  # status_counts' form
    # [[number, [objective values, smaller is better]], ...]: the maintained Pareto front
    front: Mapped[list[Any]] = mapped_column(JSON, default=list)
    front_size: Mapped[int] = mapped_column(Integer, default=0)
    # The front's numbers in front order (by key, then number): what a page of the front reads (NULL: not
    # written since this column was added; readers sort ``front`` then)
    front_order: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    remeasured: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)  # number -> median, first objective
    best: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # {"trial", "params", "metrics"}
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=_now, onupdate=_now)


def empty_summary(study_id: int) -> StudySummaryRow:
    """The summary row of a study with no trial yet (``tuner/store/summary.py`` keeps it from there)."""
    return StudySummaryRow(
        study_id=study_id, seq=0, n_trials=0, counts={}, front=[], front_order=[], front_size=0, remeasured={}
    )


#: The longest note a study or a trial may have, in characters.
MAX_NOTE_CHARS = 10_000
#: The ``number`` of a study's own note in ``tuner_notes`` (trial numbers start at 0).
STUDY_NOTE = -1


class NoteRow(Base):
    """A markdown note of a study (``number`` = :data:`STUDY_NOTE`) or of one of its trials, written over the API."""

    __tablename__ = "tuner_notes"

    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=_now, onupdate=_now)
