"""The study session: the study's row while an orchestrator runs it, and the lease that makes it ours.

Opening a session finds the study by name or creates it, refuses a spec that
would change what an existing study measures, takes the study's lease (from a
dead process of this host at once, else only once it lapsed), and marks the
study running. While the study runs, :meth:`StudySession.beat` renews the lease
every ``lease_s / 3`` seconds and says when another runner took it over;
:meth:`StudySession.close` records how the run ended and releases the lease.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tuner.store import lifecycle
from tuner.store.storage import StudyDB, StudyRow, owner_is_dead
from tuner.study.spec import CompiledStudy

log = logging.getLogger("tuner.run.orchestrator")


class StudyConflict(RuntimeError):
    """A study of that name exists and the spec would change what it measures, or another runner holds it."""


class StudyFailed(RuntimeError):
    """The study cannot go on (no worker starts, the space yields no feasible config)."""


class StudySession:
    """One run's hold on one study row. ``lease_owner`` None: run without a lease (tests, benchmarks)."""

    def __init__(self, db: StudyDB, compiled: CompiledStudy, lease_owner: str | None, lease_s: float) -> None:
        self.db = db
        self.compiled = compiled
        self.lease_owner = lease_owner
        self.lease_s = lease_s
        self.row: StudyRow | None = None
        self._lease_renewed = 0.0

    @property
    def study_id(self) -> int:
        assert self.row is not None, "the session is not open"
        return self.row.id

    def open(self) -> StudyRow:
        """Find or create the study row, check it against the spec, take the lease, mark it running."""
        spec, space = self.compiled.spec, self.compiled.space
        spec_json = spec.model_dump(mode="json")
        row = self.db.find_study(spec.name)
        if row is None:  # created holding our lease; a run that raced us to it gets our row, finds it leased
            row = lifecycle.create_running(
                self.db,
                name=spec.name,
                workload=spec.workload,
                spec=spec_json,
                space=space.canonical,
                space_hash=space.hash,
                owner=self.lease_owner,
                lease_s=self.lease_s,
            )
        else:
            self._check_unchanged(row)
        self.row = row
        if self.lease_owner is not None:
            self._take_lease(row)
        self._lease_renewed = time.monotonic()
        fresh = {"spec": spec_json, "message": None, "stop_requested": False}
        if not lifecycle.start_run(self.db, row.id, self.lease_owner, **fresh):
            raise StudyConflict(f"study {spec.name!r} was deleted, or another run took it over")
        return row

    def _check_unchanged(self, row: StudyRow) -> None:
        spec, space = self.compiled.spec, self.compiled.space
        if row.name != spec.name:
            raise StudyConflict(f"study {spec.name!r} not found by name")
        if row.space_hash != space.hash:
            raise StudyConflict(
                f"study {spec.name!r} exists with a different search space (hash {row.space_hash} != "
                f"{space.hash}); resuming with a changed space is refused: use a new study name"
            )
        stored = type(spec).model_validate(row.spec).identity()
        if stored != spec.identity():
            changed = sorted(k for k in stored if stored[k] != spec.identity()[k])
            raise StudyConflict(f"study {spec.name!r} exists with different {', '.join(changed)}; use a new study name")

    def _take_lease(self, row: StudyRow) -> None:
        assert self.lease_owner is not None
        if self.db.take_lease(row.id, self.lease_owner, self.lease_s):
            return
        holder = self.db.get_study(row.id)
        dead = holder.lease_owner if holder is not None and owner_is_dead(holder.lease_owner) else None
        if dead is not None and self.db.take_lease(row.id, self.lease_owner, self.lease_s, steal_from=dead):
            log.warning("study %s: took the lease of %s, whose process is gone", row.name, dead)
            return
        until = holder.lease_expires_at if holder is not None else None
        raise StudyConflict(
            f"study {row.name!r} is being run by {holder.lease_owner if holder else '?'} (lease until "
            f"{until:%Y-%m-%d %H:%M:%S} UTC); stop that run or wait for it to end"
        )

    def beat(self, elapsed_s: float | None = None) -> bool:
        """Renew the lease when a renewal is due, writing ``elapsed_s`` (the run's seconds so far) with it:
        every write of a running study's row carries its elapsed time, so a reader adds the seconds since
        ``updated_at``. False when another runner holds the study now."""
        if self.lease_owner is None or time.monotonic() - self._lease_renewed < self.lease_s / 3:
            return True
        self._lease_renewed = time.monotonic()
        if self.db.renew_lease(self.study_id, self.lease_owner, self.lease_s, elapsed_s=elapsed_s):
            return True
        log.warning("lost the lease of study %s to another runner; stopping", self.study_id)
        return False

    def record(self, **fields: Any) -> None:
        """Write fields of the study row (device, fingerprint, elapsed time)."""
        self.db.update_study(self.study_id, **fields)

    def close(self, status: str, elapsed_s: float, message: str | None) -> None:
        """Record how the run ended and release the lease."""
        lifecycle.finish(self.db, self.study_id, status, owner=self.lease_owner, elapsed_s=elapsed_s, message=message)
        if self.lease_owner is not None:
            self.db.release_lease(self.study_id, self.lease_owner)
