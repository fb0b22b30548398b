"""The study runner: claims queued studies from the database and runs them, one at a time.

The API only writes a queued study; a runner (``tuner worker``, started beside
the API by ``tuner serve``, or on other machines against the same database
and Ray cluster) claims it with a lease that it renews while the study runs.
A runner that dies lets its lease lapse, and another runner takes the study
over and resumes it. Stop requests arrive through the database too.
"""

from __future__ import annotations

import logging
import threading
import time

from tuner.storage import StudyDB, StudyRow, lease_owner_name

log = logging.getLogger("tuner.service")
DEFAULT_LEASE_S = 30.0
STOP_CHECK_S = 1.0  # how often a running study looks for a stop request
REQUEUED = "runner shut down; queued again"


class StudyRunner:
    """Claims and runs studies until ``stop`` is called. One study at a time per runner."""

    def __init__(
        self,
        db: StudyDB,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        poll_s: float = 1.0,
        ray_address: str | None = None,
        workers: int | None = None,
        owner: str | None = None,
    ) -> None:
        self.db = db
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.ray_address = ray_address
        self.workers = workers
        self.owner = owner or lease_owner_name("runner")
        self._stop = threading.Event()
        self._current: int | None = None  # the study in hand

    def stop(self) -> None:
        self._stop.set()

    def hand_back(self) -> None:
        """Queue the study in hand again without Ray, for a shutdown that took Ray's processes with it.

        Every finished trial is already in the database (the orchestrator writes before it waits on
        Ray); trials that were in flight are re-sent by the next runner.
        """
        study_id = self._current
        if study_id is not None and self.db.hand_back(study_id, self.owner, REQUEUED):
            log.warning("study %s queued again for the next runner; its trials in flight will be re-sent", study_id)

    def run_forever(self) -> None:
        self.db.create_tables()
        log.info("runner %s waiting for studies in %s", self.owner, self.db.url)
        while not self._stop.is_set():
            row = self.db.claim_next(self.owner, self.lease_s)
            if row is None:
                self._stop.wait(self.poll_s)
                continue
            self.run_study(row)

    def run_study(self, row: StudyRow) -> None:
        """Run one claimed study to its end (or a stop request); never raises for the study's own failures."""
        from tuner.orchestrator import Orchestrator, StudyConflict, StudyFailed
        from tuner.spec import SpecError, StudySpec, compile_study

        log.info("runner %s took study %s (%s)", self.owner, row.id, row.name)
        try:
            compiled = compile_study(StudySpec.model_validate(row.spec))
        except (SpecError, ValueError) as exc:
            self.db.update_study(row.id, status="failed", message=f"invalid spec: {exc}")
            self.db.release_lease(row.id, self.owner)
            return
        self._current = row.id
        orchestrator: Orchestrator | None = None
        last_check = time.monotonic()

        def heartbeat() -> None:
            # The orchestrator renews the lease this runner claimed (and stops if it is lost).
            nonlocal last_check
            if self._stop.is_set():
                orchestrator.stop()
                return
            now = time.monotonic()
            if now - last_check >= STOP_CHECK_S:
                last_check = now
                current = self.db.get_study(row.id)
                if current is not None and current.stop_requested:
                    orchestrator.stop()

        orchestrator = Orchestrator(
            compiled,
            self.db,
            ray_address=self.ray_address,
            workers=self.workers,
            heartbeat=heartbeat,
            lease_owner=self.owner,
            lease_s=self.lease_s,
        )
        try:
            orchestrator.run()
            current = self.db.get_study(row.id)
            if self._stop.is_set() and current is not None and current.status == "stopped":
                if not current.stop_requested:  # we are shutting down, nobody asked: the next runner goes on
                    self.db.update_study(row.id, status="queued", message=REQUEUED)
        except (StudyConflict, StudyFailed) as exc:
            log.warning("study %s failed: %s", row.id, exc)
            self.db.update_study(row.id, status="failed", message=str(exc))
        except Exception as exc:
            log.exception("study %s crashed the orchestrator", row.id)
            self.db.update_study(row.id, status="failed", message=f"orchestrator error: {exc}")
        finally:
            self.db.release_lease(row.id, self.owner)
            self._current = None
