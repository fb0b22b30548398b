"""A running study's live figures: elapsed time and the time left, for the API, the dashboard and the CLI.

Elapsed time: a runner writes the run's elapsed seconds with every write of a running study's row (the lease
renewals included), so a reader adds the seconds since the row's ``updated_at`` while the lease is live.

Time left: the study ends at whichever comes first, its trial budget or ``budget.minutes``. The trial budget's
end is estimated from the recent trial rate (the last :data:`RATE_WINDOW` trials that finished, up to now, so a
stalled study's estimate grows rather than freezing), else from the run's mean rate.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import select

#: Finished trials the recent rate is measured over.
RATE_WINDOW = 10


def live_elapsed_s(
    elapsed_s: float | None,
    status: str,
    updated_at: dt.datetime | None,
    lease_expires_at: dt.datetime | None,
    now: dt.datetime,
) -> float:
    """Seconds the study has run: the stored ``elapsed_s``, plus the seconds since the row was written while it
    runs under a live lease (a runner that died stops the clock: its lease lapses)."""
    elapsed = float(elapsed_s or 0.0)
    live = lease_expires_at is None or lease_expires_at > now
    if status in ("running", "stopping") and updated_at is not None and live:
        elapsed += max(0.0, (now - updated_at).total_seconds())
    return elapsed


def recent_rate(finished_at: Sequence[dt.datetime], now: dt.datetime) -> float | None:
    """Trials per second over the recent finishes (newest first), measured up to ``now``; None below two."""
    if len(finished_at) < 2:
        return None
    span = (now - min(finished_at)).total_seconds()
    return len(finished_at) / span if span > 0 else None


def eta_s(
    *,
    measured: int,
    budget_trials: int,
    elapsed_s: float,
    budget_minutes: float | None,
    rate_per_s: float | None,
) -> float | None:
    """Seconds until the study ends: the earlier of its trial budget (at ``rate_per_s``, else the run's mean
    rate) and ``budget_minutes``; None when neither can be told yet."""
    candidates = []
    remaining = max(0, budget_trials - measured)
    rate = rate_per_s if rate_per_s else (measured / elapsed_s if measured and elapsed_s > 0 else None)
    if rate:
        candidates.append(remaining / rate)
    elif remaining == 0:
        candidates.append(0.0)
    if budget_minutes is not None:
        candidates.append(max(0.0, budget_minutes * 60 - elapsed_s))
    return min(candidates) if candidates else None


def recent_finishes(db: object, study_id: int, limit: int = RATE_WINDOW) -> list[dt.datetime]:
    """When the study's last ``limit`` measured trials finished, newest first (one read)."""
    from tuner.store.storage import TrialRow

    with db.Session() as s:  # type: ignore[attr-defined]
        rows = s.scalars(
            select(TrialRow.finished_at)
            .where(
                TrialRow.study_id == study_id,
                TrialRow.finished_at.is_not(None),
                TrialRow.duplicate_of.is_(None),  # those cost no time, as statically infeasible configs do
                TrialRow.status != "infeasible_static",
            )
            .order_by(TrialRow.finished_at.desc())
            .limit(limit)
        ).all()
    return [r if r.tzinfo else r.replace(tzinfo=dt.timezone.utc) for r in rows]
