"""The per-study summary and the sortable metric values, written in the transaction that writes trials.

``StudyDB.apply`` hands each batch of trial writes to :func:`apply_writes`, which, in the caller's
transaction: takes the study's summary row for update (an UPDATE first, so that on SQLite the write lock
is held before anything is read), gives every write the next number of the study's change sequence
(``tuner_trials.seq``, what event streams page by), writes the rows, mirrors each finite metric into
``tuner_trial_values`` and folds the writes into the summary: counts by status, the Pareto front, the
re-measured medians and the best trial. Reads (``tuner/store/queries.py``) then never scan a study's trials.

The front is kept incrementally: a new point enters unless a front point dominates it, and evicts the
points it dominates; by transitivity of dominance that is the front of every point seen so far. A write
that changes a trial already finished ``ok`` (never made by the orchestrator, but possible) marks the
summary stale, and it is rebuilt from the table in the same transaction.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Connection

log = logging.getLogger("tuner.store.summary")

OK = "ok"
DUPLICATE = "duplicate"  # as in tuner.store.storage (not imported: storage imports this module)


@dataclass
class Summary:
    """A study's summary: see ``StudySummaryRow``. ``front`` holds ``(number, key)`` pairs, the key being the
    objective values as "smaller is better" numbers, kept in front order (by key, then number); ``order``
    is the front's numbers in that order where the summary was read without the front."""

    seq: int = 0
    n_trials: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    front: list[tuple[int, list[float]]] = field(default_factory=list)
    remeasured: dict[int, float] = field(default_factory=dict)
    best: dict[str, Any] | None = None
    front_size: int = 0
    stale: bool = False
    order: list[int] | None = None

    @classmethod
    def from_row(cls, row: Any, *, with_front: bool = True, with_order: bool = False) -> Summary:
        """From a summary row; ``with_front=False`` for a row read without its front and re-measurements
        (what a study's list entry needs: the front of a large study is the bulk of the row);
        ``with_order``: the row was read with ``front_order`` (the front's numbers, in order)."""
        summary = cls(
            seq=int(row.seq or 0),
            n_trials=int(row.n_trials or 0),
            counts=dict(row.counts or {}),
            best=row.best,
            front_size=int(row.front_size or 0),
        )
        if with_order and row.front_order is not None:
            summary.order = [int(n) for n in row.front_order]
        if with_front:
            summary.front = [(int(n), [float(v) for v in key]) for n, key in (row.front or [])]
            if row.front_order is None:  # written before the front was kept in order
                summary.front.sort(key=_front_order)
            summary.remeasured = {int(n): float(v) for n, v in (row.remeasured or {}).items()}
            summary.front_size = len(summary.front)
        return summary

    def columns(self, front: bool = True) -> dict[str, Any]:
        """The row's columns; ``front=False``: without the front, its order and size, and the re-measurements
        (a write that changed none of them: the front is the bulk of a large study's row)."""
        light = {
            "seq": self.seq,
            "n_trials": self.n_trials,
            "counts": {k: v for k, v in self.counts.items() if v},
            "best": self.best,
        }
        if not front:
            return light
        return {
            **light,
            "front": [[n, key] for n, key in self.front],
            "front_order": [n for n, _ in self.front],
            "front_size": len(self.front),
            "remeasured": {str(n): v for n, v in self.remeasured.items()},
        }

    def front_numbers(self) -> list[int]:
        """Front trial numbers ordered as ``pareto.pareto_front`` orders them (by key, then number)."""
        if self.order is not None and not self.front:
            return list(self.order)
        return [n for n, _ in self.front]

    def pick(self) -> int | None:
        """The default pick as stored with the summary (what :meth:`best_number` gave at the last write):
        readable without the front and the re-measurements."""
        return None if self.best is None else int(self.best["trial"])

    def best_number(self, objectives: Sequence[tuple[str, str]]) -> int | None:
        """The default pick of this summary's front and re-measurements (:func:`pick_number`)."""
        return pick_number(self.front_numbers(), self.remeasured, objectives)


def pick_number(
    front: Sequence[int], remeasured: Mapping[int, float], objectives: Sequence[tuple[str, str]]
) -> int | None:
    """The default pick (the one rule, also ``pareto.best_trial``'s): None without a front; else the best
    re-measured median of the first objective if any trial was re-measured (ties: the lower number: a lead
    smaller than clock drift does not decide), else the front's first point (``front`` in front order)."""
    if not front:
        return None
    if remeasured and objectives:
        sign = -1.0 if objectives[0][1] == "maximize" else 1.0
        return min(remeasured.items(), key=lambda nv: (sign * nv[1], nv[0]))[0]
    return front[0]


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether objective key ``a`` dominates ``b`` (no worse on each, better on one: smaller is better)."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def objective_key(metrics: Mapping[str, Any], objectives: Sequence[tuple[str, str]]) -> list[float] | None:
    """The objective values as "smaller is better" numbers, or None if one is missing or not a number
    (the one definition: ``pareto.pareto_front`` keys trials with it too)."""
    if not objectives:
        return None
    out = []
    for metric, direction in objectives:
        value = metrics.get(metric)
        if value is None or isinstance(value, bool):
            return None
        out.append(-float(value) if direction == "maximize" else float(value))
    return out


def _front_order(point: tuple[int, list[float]]) -> tuple[list[float], int]:
    return point[1], point[0]


def add_to_front(front: list[tuple[int, list[float]]], number: int, key: list[float]) -> None:
    """Fold one point into a front in place, keeping it in front order (by key, then number); equal points
    are all kept, as ``pareto_front`` keeps them."""
    if any(dominates(other, key) for _, other in front):
        return
    front[:] = [(n, other) for n, other in front if not dominates(key, other)]
    bisect.insort(front, (number, key), key=_front_order)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _tables() -> tuple[Any, Any, Any, Any]:
    from tuner.store.schema import StudyRow, StudySummaryRow, TrialRow, TrialValueRow

    return TrialRow.__table__, TrialValueRow.__table__, StudySummaryRow.__table__, StudyRow.__table__


def study_objectives(conn: Connection, study_id: int) -> list[tuple[str, str]]:
    """The objectives stored with the study; a study stored before they were is given them now, when its
    workload can still be built (else none: its summary then has counts but no front)."""
    studies = _tables()[3]
    row = conn.execute(select(studies.c.objectives, studies.c.spec).where(studies.c.id == study_id)).first()
    if row is None:
        return []
    if row.objectives is not None:
        return [(o["metric"], o["direction"]) for o in row.objectives]
    from tuner.study.spec import objectives_from_spec

    try:
        objectives = objectives_from_spec(row.spec or {})
    except Exception as exc:  # any failure to rebuild the workload leaves the study without
        log.warning("study %s: objectives unknown (%s)", study_id, exc)
        return []
    conn.execute(
        update(studies)
        .where(studies.c.id == study_id)
        .values(objectives=[{"metric": m, "direction": d} for m, d in objectives])
    )
    return objectives


def rebuild(conn: Connection, study_id: int, objectives: Sequence[tuple[str, str]]) -> Summary:
    """The summary computed from the trial table (for a study stored before summaries, or a stale one)."""
    trials = _tables()[0]
    summary = Summary()
    rows = conn.execute(
        select(trials.c.status, trials.c.duplicate_of.is_not(None), func.count(), func.max(trials.c.seq))
        .where(trials.c.study_id == study_id)
        .group_by(trials.c.status, trials.c.duplicate_of.is_not(None))
    )
    for status, duplicate, count, seq in rows:
        key = DUPLICATE if duplicate else status
        summary.counts[key] = summary.counts.get(key, 0) + count
        summary.n_trials += count
        summary.seq = max(summary.seq, seq or 0)
    ok_rows = conn.execute(
        select(trials.c.number, trials.c.metrics, trials.c.remeasured)
        .where(trials.c.study_id == study_id, trials.c.status == OK, trials.c.feasible.is_(True))
        .where(trials.c.duplicate_of.is_(None))
        .order_by(trials.c.number)
    )
    for number, metrics, remeasured in ok_rows:
        key = objective_key(metrics or {}, objectives)
        if key is not None:
            add_to_front(summary.front, number, key)
        _note_remeasured(summary, number, remeasured, objectives)
    summary.best = _best_entry(conn, study_id, summary, objectives)
    return summary


def _note_remeasured(summary: Summary, number: int, data: Any, objectives: Sequence[tuple[str, str]]) -> None:
    if data and objectives and data.get("metric") == objectives[0][0] and data.get("median") is not None:
        summary.remeasured[number] = float(data["median"])
    else:
        summary.remeasured.pop(number, None)


def _best_entry(
    conn: Connection, study_id: int, summary: Summary, objectives: Sequence[tuple[str, str]]
) -> dict[str, Any] | None:
    number = summary.best_number(objectives)
    if number is None:
        return None
    trials = _tables()[0]
    row = conn.execute(
        select(trials.c.params, trials.c.metrics).where(trials.c.study_id == study_id, trials.c.number == number)
    ).first()
    if row is None:
        return None
    return {"trial": number, "params": row.params or {}, "metrics": row.metrics or {}}


def _take(
    conn: Connection, study_id: int, n_writes: int, objectives: Sequence[tuple[str, str]], light: bool = False
) -> tuple[Summary, bool]:
    """The study's summary, locked for this transaction; its ``seq`` is the last one before these writes.
    ``light``: read without the front and the re-measurements (writes that cannot change them). Returns
    the summary and whether it was read light."""
    _, _, summaries, _ = _tables()
    columns = [summaries.c.seq, summaries.c.n_trials, summaries.c.counts, summaries.c.best, summaries.c.front_size]
    row = conn.execute(
        update(summaries)
        .where(summaries.c.study_id == study_id)
        .values(seq=summaries.c.seq + n_writes)
        .returning(*(columns if light else summaries.c))
    ).first()
    if row is not None:
        summary = Summary.from_row(row, with_front=not light)
        summary.seq -= n_writes
        return summary, light
    summary = rebuild(conn, study_id, objectives)
    conn.execute(insert(summaries).values(study_id=study_id, **summary.columns()))
    return summary, False


def _may_change_front(writes: Sequence[Any]) -> bool:
    """Whether the writes may change the front, the re-measurements or the best trial: every write but the
    insert of a row that is no original ``ok`` result (a trial set running, a copy, a statically
    infeasible config: what most of a study's transactions are)."""
    for write in writes:
        if write.kind != "insert":
            return True
        if write.values.get("status") == OK and write.values.get("duplicate_of") is None:
            return True
    return False


def _known_rows(conn: Connection, study_id: int, numbers: set[int]) -> dict[int, tuple[str, bool, bool | None]]:
    """(status, is a copy, feasible) of rows about to be updated."""
    if not numbers:
        return {}
    trials = _tables()[0]
    rows = conn.execute(
        select(trials.c.number, trials.c.status, trials.c.duplicate_of.is_not(None), trials.c.feasible).where(
            trials.c.study_id == study_id, trials.c.number.in_(sorted(numbers))
        )
    )
    return {number: (status, bool(dup), feasible) for number, status, dup, feasible in rows}


def _value_rows(study_id: int, number: int, metrics: Mapping[str, Any], status: str) -> list[dict[str, Any]]:
    return [
        {"study_id": study_id, "number": number, "metric": str(name), "value": float(value), "status": status}
        for name, value in metrics.items()
        if _finite(value)
    ]


def _execute(conn: Connection, study_id: int, writes: Sequence[Any], first_seq: int) -> list[tuple[Any, int]]:
    """Write the rows: inserts first (``executemany`` by column set), then updates in order, consecutive ones
    of one column set in one ``executemany`` (the hot path: a statement per write cost more than the rest).
    An update listed before its row's insert matches nothing, as it would have in order. Returns the
    writes applied, each with its sequence number."""
    trials = _tables()[0]
    inserted_at: dict[int, int] = {}
    for pos, write in enumerate(writes):
        if write.kind == "insert":
            inserted_at.setdefault(write.number, pos)
    inserts: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    runs: list[tuple[tuple[str, ...], list[dict[str, Any]]]] = []
    applied = []
    for pos, write in enumerate(writes):
        seq = first_seq + pos + 1
        if write.kind == "insert":
            row = {"study_id": study_id, "number": write.number, "seq": seq, **write.values}
            inserts.setdefault(tuple(sorted(row)), []).append(row)
        elif inserted_at.get(write.number, -1) > pos:
            continue
        else:
            keys = tuple(sorted(write.values))
            params = {"b_number": write.number, "b_seq": seq, **{f"v_{k}": v for k, v in write.values.items()}}
            if runs and runs[-1][0] == keys:
                runs[-1][1].append(params)
            else:
                runs.append((keys, [params]))
        applied.append((write, seq))
    for rows in inserts.values():
        conn.execute(insert(trials), rows)
    for keys, params in runs:
        columns = {k: bindparam(f"v_{k}", type_=trials.c[k].type) for k in keys}
        statement = (
            update(trials)
            .where(trials.c.study_id == study_id, trials.c.number == bindparam("b_number"))
            .values(seq=bindparam("b_seq"), **columns)
        )
        conn.execute(statement, params)
    return applied


def _write_values(
    conn: Connection,
    study_id: int,
    applied: Sequence[tuple[Any, int]],
    fresh: set[int],
    known: Mapping[int, tuple[str, bool, bool | None]],
) -> None:
    """Mirror the metrics (and status) of the writes into ``tuner_trial_values``; ``fresh``: rows that had
    none before; ``known``: each row's (status, copy, feasible) after the writes."""
    values_table = _tables()[1]
    latest: dict[int, Mapping[str, Any]] = {}
    moved: set[int] = set()  # status changed, metrics not rewritten
    for write, _ in applied:
        if "metrics" in write.values:
            latest[write.number] = write.values["metrics"] or {}
        elif "status" in write.values and write.number not in fresh:
            moved.add(write.number)
    stale = sorted(set(latest) - fresh)
    if stale:
        conn.execute(delete(values_table).where(values_table.c.study_id == study_id, values_table.c.number.in_(stale)))
    for number in sorted(moved - set(latest)):
        conn.execute(
            update(values_table)
            .where(values_table.c.study_id == study_id, values_table.c.number == number)
            .values(status=known[number][0])
        )
    rows = [
        row
        for number, metrics in latest.items()
        if number in known
        for row in _value_rows(study_id, number, metrics, known[number][0])
    ]
    if rows:
        conn.execute(insert(values_table), rows)


def _account(
    summary: Summary,
    write: Any,
    before: tuple[str, bool, bool | None] | None,
    objectives: Sequence[tuple[str, str]],
) -> tuple[str, bool, bool | None] | None:
    """Fold one write into the summary; returns the row's (status, is a copy, feasible) after it."""
    values = write.values
    if write.kind == "insert":
        status, dup, feasible = values.get("status"), values.get("duplicate_of") is not None, values.get("feasible")
        summary.n_trials += 1
        summary.counts[DUPLICATE if dup else status] = summary.counts.get(DUPLICATE if dup else status, 0) + 1
    else:
        if before is None:
            return None  # the UPDATE matches no row
        old_status, dup, old_feasible = before
        if old_status == OK and any(k in values for k in ("status", "metrics", "feasible")):
            summary.stale = True  # a finished result changed: rebuild rather than unfold the front
        status, feasible = values.get("status", old_status), values.get("feasible", old_feasible)
        if not dup and status != old_status:
            summary.counts[old_status] = summary.counts.get(old_status, 0) - 1
            summary.counts[status] = summary.counts.get(status, 0) + 1
    if status == OK and feasible and not dup:
        if "metrics" in values:
            key = objective_key(values["metrics"] or {}, objectives)
            if key is not None:
                add_to_front(summary.front, write.number, key)
        if "remeasured" in values:
            _note_remeasured(summary, write.number, values["remeasured"], objectives)
    return status, dup, feasible


def apply_writes(
    conn: Connection, study_id: int, writes: Sequence[Any], objectives: Sequence[tuple[str, str]] | None = None
) -> list[tuple[str, str]]:
    """Apply one study's trial writes (``storage.TrialWrite``, in order) and its summary, in ``conn``'s
    transaction. ``objectives``: the study's, if the caller knows them (else read); returns them."""
    summaries = _tables()[2]
    objectives = list(objectives) if objectives else study_objectives(conn, study_id)
    summary, light = _take(conn, study_id, len(writes), objectives, light=not _may_change_front(writes))
    inserted = {w.number for w in writes if w.kind == "insert"}
    known = _known_rows(conn, study_id, {w.number for w in writes if w.kind != "insert"} - inserted)
    # Rows with no metric value stored yet: inserted now, or still running (a running row has no metrics).
    fresh = inserted | {n for n, (status, _, _) in known.items() if status == "running"}
    previous_best = None if light else summary.best_number(objectives)
    before = None if light else (summary.front_numbers(), dict(summary.remeasured))
    applied = _execute(conn, study_id, writes, summary.seq)
    for write, _ in applied:
        after = _account(summary, write, known.get(write.number), objectives)
        if after is not None:
            known[write.number] = after
    _write_values(conn, study_id, applied, fresh, known)
    summary.seq += len(writes)
    if summary.stale:
        seq, summary = summary.seq, rebuild(conn, study_id, objectives)
        summary.seq, before = seq, None
    elif not light and (
        summary.best_number(objectives) != previous_best or any(w.number == previous_best for w in writes)
    ):
        summary.best = _best_entry(conn, study_id, summary, objectives)
    # The front's columns are rewritten only when the front or the re-measurements changed.
    front = not light and before != (summary.front_numbers(), summary.remeasured)
    conn.execute(update(summaries).where(summaries.c.study_id == study_id).values(**summary.columns(front=front)))
    return objectives


def backfill(conn: Connection, study_id: int) -> None:
    """Give a study stored before summaries existed its summary and metric values (idempotent)."""
    trials, values_table, summaries, _ = _tables()
    objectives = study_objectives(conn, study_id)
    conn.execute(delete(values_table).where(values_table.c.study_id == study_id))
    rows = conn.execute(select(trials.c.number, trials.c.metrics, trials.c.status).where(trials.c.study_id == study_id))
    batch = [row for number, metrics, status in rows for row in _value_rows(study_id, number, metrics or {}, status)]
    if batch:
        conn.execute(insert(values_table), batch)
    summary = rebuild(conn, study_id, objectives)
    conn.execute(delete(summaries).where(summaries.c.study_id == study_id))
    conn.execute(insert(summaries).values(study_id=study_id, **summary.columns()))
