"""Reads of studies and trials, done in the database: pages, counts, sorts, filters, the front, changes.

Nothing here loads a study's trials to show some of them. A page of trials is an ``ORDER BY ... LIMIT``
on indexed columns (``(study_id, number)``, ``(study_id, status)``); a sort by a metric walks the
``tuner_trial_values`` index ``(study_id, metric, value, number)`` (see ``storage.TrialValueRow``); counts,
the best trial and the Pareto front come from the summary that ``StudyDB.apply`` keeps in the transaction
of each trial write (``tuner/store/summary.py``); the event stream pages by the change sequence ``seq``.
Lists never select raw timing samples or fingerprints (``samples_ms``, ``fingerprint``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, func, select, text
from sqlalchemy.orm import defer

from tuner.store.storage import (
    DUPLICATE,
    FAILED_SQL,
    StudyDB,
    StudyRow,
    StudySummaryRow,
    TrialRow,
    TrialValueRow,
    clean_metrics,
)
from tuner.store.summary import Summary, rebuild
from tuner.study.spec import objectives_or_error
from tuner.workloads.base import TrialStatus

#: What the trial table shows; raw samples and fingerprints are only in a single trial's detail.
_LIST_OPTIONS = (defer(TrialRow.samples_ms), defer(TrialRow.fingerprint))


@dataclass
class StudyView:
    """A study row with what its list entry shows: the summary, the objectives, and why they are missing."""

    row: StudyRow
    summary: Summary
    objectives: list[tuple[str, str]]
    error: str | None


#: A summary read for a list entry or a study's header: without the front, its order and re-measurements.
_LIGHT_SUMMARY = (
    defer(StudySummaryRow.front),
    defer(StudySummaryRow.front_order),
    defer(StudySummaryRow.remeasured),
)
#: A summary read for the front's pages: the front's numbers in order, not the front's points.
_ORDER_SUMMARY = (defer(StudySummaryRow.front), defer(StudySummaryRow.remeasured))


def _view(
    db: StudyDB, row: StudyRow, summary_row: StudySummaryRow | None, with_front: bool = False, with_order: bool = False
) -> StudyView:
    objectives, error = objectives_or_error(row)
    if summary_row is not None:
        summary = Summary.from_row(summary_row, with_front=with_front, with_order=with_order)
    else:  # stored before summaries, in a database not upgraded yet: computed here, not stored by a read
        with db.engine.connect() as conn:
            summary = rebuild(conn, row.id, objectives)
    return StudyView(row, summary, objectives, error)


def study_view(db: StudyDB, row: StudyRow, *, with_front: bool = False, with_order: bool = False) -> StudyView:
    """One study's view (its summary read by primary key); ``with_front``: with the Pareto front's points
    and the re-measurements; ``with_order``: with the front's numbers in order (``Summary.front_numbers``),
    what the front's pages need (the front's points too only for a summary stored without its order)."""
    options = () if with_front else _ORDER_SUMMARY if with_order else _LIGHT_SUMMARY
    with db.Session() as s:
        summary_row = s.get(StudySummaryRow, row.id, options=options)
        if with_order and not with_front and summary_row is not None and summary_row.front_order is None:
            s.refresh(summary_row, ["front", "remeasured"])  # stored before the order was: sorted on read
            with_front = True
    return _view(db, row, summary_row, with_front=with_front, with_order=with_order)


def study_page(
    db: StudyDB, *, status: str | None = None, workload: str | None = None, limit: int = 50, offset: int = 0
) -> tuple[list[StudyView], int]:
    """Studies newest first, filtered by status and workload: one page and the total that match."""
    filters = [StudyRow.status != "deleted"]  # being deleted (tuner/store/lifecycle.py): gone for readers
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
        total = _total(s, study_id, status, where)
        base = select(TrialRow).where(*where).options(*_LIST_OPTIONS)
        if key == "number":
            order = TrialRow.number.desc() if descending else TrialRow.number.asc()
            return list(s.scalars(base.order_by(order).limit(limit).offset(offset))), total
        if key == "status":
            order = TrialRow.status.desc() if descending else TrialRow.status.asc()
            return list(s.scalars(base.order_by(order, TrialRow.number).limit(limit).offset(offset))), total
        return _by_metric(s, study_id, status, key, descending, limit, offset), total


def _total(s: Any, study_id: int, status: str | None, where: list[Any]) -> int:
    """How many trials match: from the summary (kept in each write's transaction) where it can say, else a
    count. The summary counts copies under ``duplicate``, not under their status, so a status filter on a
    study with copies is counted in SQL (an index range on ``(study_id, status)``)."""
    row = s.execute(
        select(StudySummaryRow.n_trials, StudySummaryRow.counts).where(StudySummaryRow.study_id == study_id)
    ).first()
    if row is not None:
        counts = row.counts or {}
        if status is None:
            return int(row.n_trials or 0)
        if not counts.get(DUPLICATE) and status != DUPLICATE:
            return int(counts.get(status, 0))
    return s.scalar(select(func.count()).select_from(TrialRow).where(*where)) or 0


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
    order = value.desc() if descending else value.asc()
    numbers = list(s.scalars(select(number).where(*has_value).order_by(order, number).limit(limit).offset(offset)))
    rows = _in_order(s, study_id, numbers)
    if len(rows) < limit:
        # Past the trials with a value: only now is their count needed (a full page never counts them).
        with_value = offset + len(numbers) if numbers else _count(s, has_value)
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


def _count(s: Any, where: list[Any]) -> int:
    return s.scalar(select(func.count()).select_from(TrialValueRow).where(*where)) or 0


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
    trials, best, _ = front_page(db, view)
    return trials, best


def front_numbers(view: StudyView) -> list[int]:
    """The front's trial numbers in ``pareto.pareto_front``'s order (for one objective: the best one)."""
    numbers = view.summary.front_numbers()
    return numbers[:1] if len(view.objectives) == 1 else numbers


def front_page(
    db: StudyDB, view: StudyView, *, limit: int | None = None, offset: int = 0
) -> tuple[list[TrialRow], int | None, int]:
    """A page of the front (``limit`` trials from ``offset`` in front order; None: to its end), the
    default pick and the front's size. The order comes from the summary's stored front (no trial is read
    for it); only the page's trials are read, by primary key."""
    numbers = front_numbers(view)
    page = numbers[offset:] if limit is None else numbers[offset : offset + limit]
    return trials_by_number(db, view.row.id, page), view.summary.pick(), len(numbers)


def front_sample(view: StudyView, cap: int) -> tuple[list[int], int, int]:
    """At most ``cap`` + 1 front trial numbers spread evenly along the front (both ends kept), the stride
    (1 when the front has no more than ``cap`` points: then it is the whole front) and the front's size."""
    numbers = front_numbers(view)
    if len(numbers) <= cap:
        return numbers, 1, len(numbers)
    stride = -(-len(numbers) // cap)
    sample = numbers[::stride]
    if sample[-1] != numbers[-1]:
        sample.append(numbers[-1])
    return sample, stride, len(numbers)


@dataclass
class KeptResults:
    """A study's results as its summary keeps them: ``numbers``, the whole front's trial numbers in front
    order; ``front``, the first ``limit`` of its trials (as :func:`trials_by_number` reads them); ``pick``,
    the default pick's trial with every column (None: nothing to pick yet)."""

    numbers: list[int]
    front: list[Any]
    pick: TrialRow | None


def kept_results(db: StudyDB, row: StudyRow, *, limit: int | None = None) -> KeptResults:
    """The front and the default pick that the study's summary keeps (what the export, the registry's
    publish and the end of a run report), read without any scan of the study's trials: the summary row by
    primary key, then at most ``limit`` front trials (None: the whole front) and the pick, by number. For
    one objective the front is every trial tied for the best value (the API's ``/pareto`` shows one)."""
    view = study_view(db, row, with_order=True)
    numbers = view.summary.front_numbers()
    page = numbers if limit is None else numbers[:limit]
    number = view.summary.pick()
    pick = None if number is None else db.trial(row.id, number)
    return KeptResults(numbers, trials_by_number(db, row.id, page), pick)


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


#: The most trials the plots get one point each (the study page's first draw is bounded by it whatever the
#: study's size); a larger study gets every k-th trial and the front's points (``front_sample``).
MAX_POINTS = 800


def plot_points(
    db: StudyDB, study_id: int, summary: Summary, keep: Sequence[int] = (), max_points: int | None = None
) -> tuple[list[dict[str, Any]], int]:
    """The trials as the plots draw them (number, status, feasibility, copy, params, metrics; no samples, no
    error text), in number order, and the stride: every trial up to ``max_points`` (default
    :data:`MAX_POINTS`), else every ``stride``-th one by number, and the trials in ``keep`` (the front)
    whatever their number."""
    columns = (
        TrialRow.number,
        TrialRow.status,
        TrialRow.feasible,
        TrialRow.duplicate_of,
        TrialRow.timing_comparable,
        TrialRow.params,
        TrialRow.metrics,
    )
    stride = max(1, -(-summary.n_trials // (max_points or MAX_POINTS)))
    where = [TrialRow.study_id == study_id]
    with db.Session() as s:
        if stride > 1:  # the numbers looked up one by one in the (study_id, number) index, not a scan
            last = s.scalar(select(func.max(TrialRow.number)).where(TrialRow.study_id == study_id)) or 0
            where.append(TrialRow.number.in_(sorted(set(range(0, last + 1, stride)) | set(keep))))
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
    out), newest first, at most ``limit``: what the failure panel groups by error. Walks the partial index
    of failures (``storage.FAILED_SQL``), whatever the number of good trials."""
    with db.Session() as s:
        return list(
            s.scalars(
                select(TrialRow)
                .where(TrialRow.study_id == study_id, text(FAILED_SQL))
                .options(*_LIST_OPTIONS)
                .order_by(TrialRow.number.desc())
                .limit(limit)
            )
        )


#: Every status a trial row may have: the outcomes, and ``running`` while it is in flight.
TRIAL_STATUSES = (*(s.value for s in TrialStatus), "running")


def sort_keys(db: StudyDB, row: StudyRow, wanted: str | None = None) -> list[str]:
    """What a study's trials may be sorted by: ``number``, ``status``, its objectives, the metrics its
    workload declares, and any metric its trials hold. With ``wanted`` among the first ones, the trials'
    metrics are not read; else they are, by a skip scan of the values index (one probe per distinct
    metric, not a walk over every value of the study)."""
    from tuner.workloads.registry import UnknownWorkload, workload_class

    names = ["number", "status", *(m for m, _ in objectives_or_error(row)[0])]
    try:
        names += [m.name for m in workload_class(row.workload).metrics]
    except UnknownWorkload:
        pass
    if wanted is None or wanted not in names:
        names += _stored_metrics(db, row.id)
    return list(dict.fromkeys(names))


#: The distinct metric names of a study's values, each found by one probe of the (study_id, metric, ...) index.
_DISTINCT_METRICS = text(
    "WITH RECURSIVE m(metric) AS ("
    " SELECT MIN(metric) FROM tuner_trial_values WHERE study_id = :study_id"
    " UNION ALL SELECT (SELECT MIN(metric) FROM tuner_trial_values WHERE study_id = :study_id AND metric > m.metric)"
    " FROM m WHERE m.metric IS NOT NULL"
    ") SELECT metric FROM m WHERE metric IS NOT NULL"
)


def _stored_metrics(db: StudyDB, study_id: int) -> list[str]:
    with db.engine.connect() as conn:
        return [str(name) for (name,) in conn.execute(_DISTINCT_METRICS, {"study_id": study_id})]
