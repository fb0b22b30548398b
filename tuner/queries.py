"""Reads of studies and trials, done in the database: pages, counts, sorts, filters, the front, changes.

Nothing here loads a study's trials to show some of them. A page of trials is an ``ORDER BY ... LIMIT``
on indexed columns (``(study_id, number)``, ``(study_id, status)``); a sort by a metric walks the
``tuner_trial_values`` index ``(study_id, metric, value, number)`` (see ``storage.TrialValueRow``); counts,
the best trial and the Pareto front come from the summary that ``StudyDB.apply`` keeps in the transaction
of each trial write (``tuner/summary.py``); the event stream pages by the change sequence ``seq``.
Lists never select raw timing samples or fingerprints (``samples_ms``, ``fingerprint``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, func, select
from sqlalchemy.orm import defer

from tuner.export import objectives_or_error
from tuner.storage import StudyDB, StudyRow, StudySummaryRow, TrialRow, TrialValueRow, clean_metrics
from tuner.summary import Summary, rebuild
from tuner.workload import TrialStatus

#: What the trial table shows; raw samples and fingerprints are only in a single trial's detail.
_LIST_OPTIONS = (defer(TrialRow.samples_ms), defer(TrialRow.fingerprint))
#: Statuses that are not failures (the failure panel lists the others).
NOT_FAILURES = ("ok", "running")


@dataclass
class StudyView:
    """A study row with what its list entry shows: the summary, the objectives, and why they are missing."""

    row: StudyRow
    summary: Summary
    objectives: list[tuple[str, str]]
    error: str | None


#: A summary read for a list entry or a study's header: without the front and re-measurements.
_LIGHT_SUMMARY = (defer(StudySummaryRow.front), defer(StudySummaryRow.remeasured))


def _view(db: StudyDB, row: StudyRow, summary_row: StudySummaryRow | None, with_front: bool = False) -> StudyView:
    objectives, error = objectives_or_error(row)
    if summary_row is not None:
        summary = Summary.from_row(summary_row, with_front=with_front)
    else:  # stored before summaries, in a database not upgraded yet: computed here, not stored by a read
        with db.engine.connect() as conn:
            summary = rebuild(conn, row.id, objectives)
    return StudyView(row, summary, objectives, error)


def study_view(db: StudyDB, row: StudyRow, *, with_front: bool = False) -> StudyView:
    """One study's view (its summary read by primary key); ``with_front``: with the Pareto front."""
    with db.Session() as s:
        summary_row = s.get(StudySummaryRow, row.id, options=() if with_front else _LIGHT_SUMMARY)
    return _view(db, row, summary_row, with_front)


def study_page(
    db: StudyDB, *, status: str | None = None, workload: str | None = None, limit: int = 50, offset: int = 0
) -> tuple[list[StudyView], int]:
    """Studies newest first, filtered by status and workload: one page and the total that match."""
    filters = [StudyRow.status != "deleted"]  # being deleted (tuner/lifecycle.py): gone for readers
    if status is not None:
        filters.append(StudyRow.status == status)
    if workload is not None:
        filters.append(StudyRow.workload == workload)
    with db.Session() as s:
        total = s.scalar(select(func.count()).select_from(StudyRow).where(*filters)) or 0
        rows = s.execute(
            select(StudyRow, StudySummaryRow)
            .outerjoin(StudySummaryRow, StudySummaryRow.study_id == StudyRow.id)
            .where(*filters)
            .order_by(StudyRow.id.desc())
            .limit(limit)
            .offset(offset)
            .options(defer(StudyRow.space), defer(StudyRow.device), defer(StudyRow.fingerprint), *_LIGHT_SUMMARY)
        ).all()
    return [_view(db, row, summary) for row, summary in rows], total


def trial_page(
    db: StudyDB,
    study_id: int,
    *,
    status: str | None = None,
    sort: str = "number",
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[TrialRow], int]:
    """One page of a study's trials and how many match ``status``.

    ``sort``: ``number``, ``status`` or a metric name, ``-`` first for descending. Ties and trials without
    the metric (nulls, last in both directions) go by number, ascending.
    """
    key, descending = sort.lstrip("-"), sort.startswith("-")
    where = [TrialRow.study_id == study_id]
    if status is not None:
        where.append(TrialRow.status == status)
    with db.Session() as s:
        total = s.scalar(select(func.count()).select_from(TrialRow).where(*where)) or 0
        base = select(TrialRow).where(*where).options(*_LIST_OPTIONS)
        if key == "number":
            order = TrialRow.number.desc() if descending else TrialRow.number.asc()
            return list(s.scalars(base.order_by(order).limit(limit).offset(offset))), total
        if key == "status":
            order = TrialRow.status.desc() if descending else TrialRow.status.asc()
            return list(s.scalars(base.order_by(order, TrialRow.number).limit(limit).offset(offset))), total
        return _by_metric(s, study_id, status, key, descending, limit, offset), total


def _by_metric(
    s: Any, study_id: int, status: str | None, metric: str, descending: bool, limit: int, offset: int
) -> list[TrialRow]:
    """Trials with the metric, in value order off the values index; then those without it, by number.

    The values table is the only table the ordered query reads (it holds the trial's status too), so the
    database walks ``(study_id, metric[, status], value, number)`` in order and stops at the page.
    """
    value, number = TrialValueRow.value, TrialValueRow.number
    has_value = [TrialValueRow.study_id == study_id, TrialValueRow.metric == metric]
    if status is not None:
        has_value.append(TrialValueRow.status == status)
    with_value = s.scalar(select(func.count()).select_from(TrialValueRow).where(*has_value)) or 0
    numbers: list[int] = []
    if offset < with_value:
        order = value.desc() if descending else value.asc()
        numbers = list(s.scalars(select(number).where(*has_value).order_by(order, number).limit(limit).offset(offset)))
    rows = _in_order(s, study_id, numbers)
    if len(rows) < limit:
        joined = and_(
            TrialValueRow.study_id == TrialRow.study_id,
            TrialValueRow.number == TrialRow.number,
            TrialValueRow.metric == metric,
        )
        where = [TrialRow.study_id == study_id] + ([] if status is None else [TrialRow.status == status])
        rows += s.scalars(
            select(TrialRow)
            .where(*where, ~exists().where(joined))
            .options(*_LIST_OPTIONS)
            .order_by(TrialRow.number)
            .limit(limit - len(rows))
            .offset(max(0, offset - with_value))
        )
    return rows


def _in_order(s: Any, study_id: int, numbers: list[int]) -> list[TrialRow]:
    if not numbers:
        return []
    found = {
        t.number: t
        for t in s.scalars(
            select(TrialRow).where(TrialRow.study_id == study_id, TrialRow.number.in_(numbers)).options(*_LIST_OPTIONS)
        )
    }
    return [found[n] for n in numbers if n in found]


#: The columns a list shows (``TrialOut``'s), read as plain rows where many are read at once.
_LIST_COLUMNS = tuple(c for c in TrialRow.__table__.c if c.name not in ("samples_ms", "fingerprint"))


def trials_by_number(db: StudyDB, study_id: int, numbers: Sequence[int]) -> list[Any]:
    """The study's trials of these numbers, in the order given (missing ones left out), as rows with the
    attributes of ``TrialRow`` less samples and fingerprint."""
    if not numbers:
        return []
    with db.engine.connect() as conn:
        rows = {
            r.number: r
            for r in conn.execute(
                select(*_LIST_COLUMNS).where(TrialRow.study_id == study_id, TrialRow.number.in_(list(numbers)))
            )
        }
    return [rows[n] for n in numbers if n in rows]


def pareto(db: StudyDB, view: StudyView) -> tuple[list[TrialRow], int | None]:
    """The maintained front's trials (for one objective: the best one), ordered as ``pareto.pareto_front``
    orders them, and the default pick."""
    numbers = view.summary.front_numbers()
    if len(view.objectives) == 1:
        numbers = numbers[:1]
    best = view.summary.best_number(view.objectives)
    return trials_by_number(db, view.row.id, numbers), best


def changes_since(db: StudyDB, study_id: int, seq: int, limit: int = 500) -> list[TrialRow]:
    """Trials written after change ``seq`` (each as it is now), in the order of their last change."""
    with db.Session() as s:
        return list(
            s.scalars(
                select(TrialRow)
                .where(TrialRow.study_id == study_id, TrialRow.seq > seq)
                .options(*_LIST_OPTIONS)
                .order_by(TrialRow.seq)
                .limit(limit)
            )
        )


def last_seq(db: StudyDB, study_id: int) -> int:
    """The study's last change sequence number (0 before its first trial)."""
    with db.Session() as s:
        seq = s.scalar(select(StudySummaryRow.seq).where(StudySummaryRow.study_id == study_id))
        if seq is None:
            seq = s.scalar(select(func.max(TrialRow.seq)).where(TrialRow.study_id == study_id))
    return int(seq or 0)


#: The most trials the plots get one point each; a larger study gets every k-th trial and its whole front.
MAX_POINTS = 10_000


def plot_points(
    db: StudyDB, study_id: int, summary: Summary, keep: Sequence[int] = ()
) -> tuple[list[dict[str, Any]], int]:
    """The trials as the plots draw them (number, status, feasibility, copy, params, metrics; no samples, no
    error text), in number order, and the stride: every trial up to :data:`MAX_POINTS`, else every
    ``stride``-th one by number, and the trials in ``keep`` (the front) whatever their number."""
    columns = (
        TrialRow.number,
        TrialRow.status,
        TrialRow.feasible,
        TrialRow.duplicate_of,
        TrialRow.timing_comparable,
        TrialRow.params,
        TrialRow.metrics,
    )
    stride = max(1, -(-summary.n_trials // MAX_POINTS))
    where = [TrialRow.study_id == study_id]
    if stride > 1:
        where.append((TrialRow.number % stride == 0) | TrialRow.number.in_(list(keep)))
    with db.Session() as s:
        rows = s.execute(select(*columns).where(*where).order_by(TrialRow.number))
        points = [
            {
                "number": number,
                "status": status,
                "feasible": feasible,
                "duplicate_of": duplicate_of,
                "timing_comparable": timing_comparable,
                "params": params or {},
                "metrics": clean_metrics(metrics or {}),
            }
            for number, status, feasible, duplicate_of, timing_comparable, params, metrics in rows
        ]
    return points, stride


def failures(db: StudyDB, study_id: int, limit: int = 500) -> list[TrialRow]:
    """The latest failed trials, statically infeasible ones and ones that violate a constraint (copies left
    out), newest first, at most ``limit``: what the failure panel groups by error."""
    failed = TrialRow.status.not_in(NOT_FAILURES) | ((TrialRow.status == "ok") & TrialRow.feasible.is_(False))
    with db.Session() as s:
        return list(
            s.scalars(
                select(TrialRow)
                .where(TrialRow.study_id == study_id, TrialRow.duplicate_of.is_(None), failed)
                .options(*_LIST_OPTIONS)
                .order_by(TrialRow.number.desc())
                .limit(limit)
            )
        )


#: Every status a trial row may have: the outcomes, and ``running`` while it is in flight.
TRIAL_STATUSES = (*(s.value for s in TrialStatus), "running")


def sort_keys(db: StudyDB, row: StudyRow) -> list[str]:
    """What a study's trials may be sorted by: ``number``, ``status``, its objectives, the metrics its
    workload declares, and any metric its trials hold (one indexed read)."""
    from tuner.registry import UnknownWorkload, workload_class

    names = [m for m, _ in objectives_or_error(row)[0]]
    try:
        names += [m.name for m in workload_class(row.workload).metrics]
    except UnknownWorkload:
        pass
    with db.Session() as s:
        names += list(s.scalars(select(TrialValueRow.metric).where(TrialValueRow.study_id == row.id).distinct()))
    return ["number", "status", *dict.fromkeys(names)]
