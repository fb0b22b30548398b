"""Jobs a study runner does on a schedule the operator sets: the registry's recheck (``--recheck-every``).

A runner started with ``tuner worker --recheck-every 24h`` (or ``tuner serve --recheck-every 24h``) runs
:class:`tuner.best_configs.recheck.RecheckRun` itself once the last run began that long ago, and only while it has no
study: one entry at a time between polls for queued studies. So a recheck never times a config beside a
study's trial on the same GPU, and a study queued meanwhile waits for one entry's measurement at most; the
run goes on after the study. The job's state is a row of ``tuner_jobs``: when the last run began and
ended, which runner ran it, and what it found (entries checked, their verdicts, the regressed ones with
both figures). Runs are claimed with a conditional UPDATE on that row, so one of several runners runs each,
and a restarted runner waits out the interval from the last run's start instead of rechecking at once.
Off by default.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import JSON, Float, String, or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from tuner.store.storage import Base, StudyDB, UTCDateTime, is_transient

log = logging.getLogger("tuner.run.jobs")
RECHECK = "recheck"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class JobRow(Base):
    """A scheduled job's last run."""

    __tablename__ = "tuner_jobs"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    every_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # the schedule of the last claim
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), nullable=True)  # None: unfinished
    owner: Mapped[str | None] = mapped_column(String(256), nullable=True)
    # {"entries": n, "checked": n, "verdicts": {verdict: n}, "regressed": [{"entry", "was", "now"}],
    #  "unverified": [ids], "failed": [{"entry", "message"}]}
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


def parse_duration(text: str) -> float:
    """``"24h"``, ``"30m"``, ``"90s"``, ``"1d"`` or a number of seconds, as seconds (ValueError otherwise)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"a duration is a positive number with an optional unit s, m, h or d: got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def job_state(db: StudyDB, name: str = RECHECK) -> dict[str, Any] | None:
    """A job's last run as the API shows it (None before the first): when it began and ended, who ran it,
    what it found, and when the next run is due on the schedule of the last claim."""
    with db.Session() as s:
        row = s.get(JobRow, name)
        if row is None:
            return None
        due = row.started_at + dt.timedelta(seconds=row.every_s) if row.started_at and row.every_s else None
        return {
            "name": row.name,
            "every_s": row.every_s,
            "started_at": row.started_at.isoformat() if row.started_at else None,
            "finished_at": row.finished_at.isoformat() if row.finished_at else None,
            "running": row.started_at is not None and row.finished_at is None,
            "owner": row.owner,
            "next_due_at": due.isoformat() if due else None,
            "result": row.result,
        }


def claim(db: StudyDB, name: str, owner: str, every_s: float) -> bool:
    """Start a run of job ``name`` if none began in the last ``every_s`` seconds; True when this caller got it."""
    now = _now()
    try:
        with db.Session.begin() as s:
            if s.get(JobRow, name) is None:
                s.add(JobRow(name=name))
    except IntegrityError:  # another runner made the row meanwhile
        pass
    due = or_(JobRow.started_at.is_(None), JobRow.started_at <= now - dt.timedelta(seconds=every_s))
    with db.Session.begin() as s:
        result = s.execute(
            update(JobRow)
            .where(JobRow.name == name, due)
            .values(started_at=now, finished_at=None, owner=owner, every_s=every_s, result=None)
        )
    return result.rowcount == 1


def record(db: StudyDB, name: str, owner: str, result: Mapping[str, Any], finished: bool) -> None:
    """Write a run's findings so far (and its end when ``finished``), if this owner's run is still the job's."""
    values: dict[str, Any] = {"result": dict(result)}
    if finished:
        values["finished_at"] = _now()
    with db.Session.begin() as s:
        s.execute(update(JobRow).where(JobRow.name == name, JobRow.owner == owner).values(**values))


class RecheckSchedule:
    """The runner's recheck job: :meth:`step` between studies does at most one entry's measurement."""

    def __init__(
        self,
        db: StudyDB,
        owner: str,
        every_s: float,
        *,
        rounds: int = 3,
        args_override: Mapping[str, Any] | None = None,
    ) -> None:
        """``args_override``: run-setting args to measure with (as ``tuner recheck --arg``; tests simulate a
        regression with ``noop``'s ``drift``)."""
        self.db, self.owner, self.every_s = db, owner, float(every_s)
        self.rounds, self.args_override = rounds, dict(args_override or {})
        self._run: Any = None  # the RecheckRun in progress

    def step(self) -> bool:
        """Go on with the run in progress, or start one when it is due; True when it measured something
        (the caller polls for studies again at once), False when there was nothing to do."""
        try:
            if self._run is None:
                if not claim(self.db, RECHECK, self.owner, self.every_s):
                    return False
                self._start()
            result = self._run.step()
            record(self.db, RECHECK, self.owner, self._summary(), finished=result is None)
            if result is None:
                log.info("recheck done: %s", self._summary())
                self._run = None
            return result is not None
        except Exception as exc:  # a recheck never takes the runner down; its next run is on schedule
            if is_transient(exc):
                log.warning("recheck: database unreachable (%s); going on later", exc)
                return False
            log.exception("recheck failed")
            self._fail(exc)
            return False

    def _start(self) -> None:
        from tuner.best_configs.recheck import RecheckRun

        self._run = RecheckRun(self.db, rounds=self.rounds, args_override=self.args_override)
        log.info("recheck: %d registry entries to measure again", len(self._run.entries))

    def _fail(self, exc: BaseException) -> None:
        summary = self._summary() if self._run is not None else {}
        self._run = None
        try:
            record(self.db, RECHECK, self.owner, {**summary, "error": f"{type(exc).__name__}: {exc}"}, finished=True)
        except Exception:  # the log has the first error
            pass

    def _summary(self) -> dict[str, Any]:
        run = self._run
        verdicts: dict[str, int] = {}
        for r in run.results:
            verdicts[r.verdict] = verdicts.get(r.verdict, 0) + 1
        return {
            "entries": len(run.entries),
            "checked": len(run.results),
            "verdicts": verdicts,
            "regressed": [
                {"entry": r.entry_id, "was": r.previous, "now": r.interval}
                for r in run.results
                if r.verdict == "regressed"
            ],
            "failed": [{"entry": r.entry_id, "message": r.message} for r in run.results if r.verdict == "failed"],
            "unverified": list(run.unverified),
            "args_override": self.args_override or None,
        }
