"""The study runner: claims queued studies from the database and runs them, one at a time.

The API only writes a queued study; a runner (``tuner worker``, started beside
the API by ``tuner serve``, or on other machines against the same database
and Ray cluster) claims it with a lease that it renews while the study runs.
A runner that dies lets its lease lapse, and another runner takes the study
over and resumes it. Stop requests arrive through the database too. Between
studies a runner may do scheduled jobs (the registry's recheck, tuner/run/jobs.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from tuner.run.jobs import RecheckSchedule
from tuner.store import lifecycle
from tuner.store.storage import StudyDB, StudyRow, is_transient, lease_owner_name

log = logging.getLogger("tuner.run.service")
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
        recheck_every_s: float | None = None,
        recheck_args: Mapping[str, Any] | None = None,
    ) -> None:
        """``recheck_every_s``: run the registry's recheck when the last run began that long ago, between
        studies (:mod:`tuner.run.jobs`); None: never. ``recheck_args``: run-setting args it measures with."""
        self.db = db
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.ray_address = ray_address
        self.workers = workers
        self.owner = owner or lease_owner_name("runner")
        self._stop = threading.Event()
        self._current: int | None = None  # the study in hand
        self.recheck: RecheckSchedule | None = None
        if recheck_every_s:
            self.recheck = RecheckSchedule(db, self.owner, recheck_every_s, args_override=recheck_args)

    def stop(self) -> None:
        self._stop.set()

    def hand_back(self) -> None:
        """Queue the study in hand again without Ray, for a shutdown that took Ray's processes with it.

        Every finished trial is already in the database (the orchestrator writes before it waits on
        Ray); trials that were in flight are re-sent by the next runner.
        """
        study_id = self._current
        if study_id is not None and lifecycle.hand_back(self.db, study_id, self.owner, REQUEUED):
            log.warning("study %s queued again for the next runner; its trials in flight will be re-sent", study_id)

    def run_forever(self) -> None:
        """Claim and run studies until :meth:`stop`. A database that cannot be reached is waited for
        (polling again), never fatal; the caller runs the migrations first (``create_tables``)."""
        log.info("runner %s waiting for studies in %s", self.owner, self.db.url)
        while not self._stop.is_set():
            try:
                row = lifecycle.claim_next(self.db, self.owner, self.lease_s)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                log.warning("database unreachable (%s); polling again in %.0f s", exc, self.poll_s)
                row = None
            if row is None:
                # idle: the scheduled recheck measures one entry, then we look for studies again
                if self.recheck is None or not self.recheck.step():
                    self._stop.wait(self.poll_s)
                continue
            self.run_study(row)

    def run_study(self, row: StudyRow) -> None:
        """Run one claimed study to its end (or a stop request); never raises for the study's own failures."""
        from tuner.run.orchestrator import Orchestrator, StudyConflict, StudyFailed
        from tuner.study.spec import SpecError, StudySpec, compile_study

        log.info("runner %s took study %s (%s)", self.owner, row.id, row.name)
        try:
            compiled = compile_study(StudySpec.model_validate(row.spec))
        except (SpecError, ValueError) as exc:
            lifecycle.fail(self.db, row.id, f"invalid spec: {exc}", owner=self.owner)
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
                current = self.db.get_study(row.id)  # retried for a while, then the run stops (below)
                if current is None or current.stop_requested or current.status in ("stopping", "deleted"):
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
                    lifecycle.requeue_stopped(self.db, row.id, REQUEUED)
        except (StudyConflict, StudyFailed) as exc:
            log.warning("study %s failed: %s", row.id, exc)
            self._settle(row.id, f"{exc}")
        except Exception as exc:
            if is_transient(exc):
                _kill_workers(orchestrator)  # its clean-up stopped at the first write that failed
                self._give_up(row.id, exc)
            else:
                log.exception("study %s crashed the orchestrator", row.id)
                self._settle(row.id, f"orchestrator error: {exc}")
        finally:
            self._current = None
            self._release(row.id)

    def _settle(self, study_id: int, message: str) -> None:
        try:
            lifecycle.fail(self.db, study_id, message)
        except Exception as exc:
            if not is_transient(exc):
                raise
            self._give_up(study_id, exc)

    def _give_up(self, study_id: int, exc: BaseException) -> None:
        """The database stayed out of reach longer than our retries: the study is not at fault. Hand it
        back if the database answers again, else let our lease lapse; either way a runner resumes it."""
        log.warning("study %s: database unreachable (%s); handing the study back", study_id, exc)
        try:
            if not lifecycle.hand_back(self.db, study_id, self.owner, "database unreachable; queued again"):
                lifecycle.requeue_stopped(self.db, study_id, "database unreachable; queued again")
        except Exception as again:
            if not is_transient(again):
                raise
            log.warning("study %s: its lease lapses in %.0f s, then a runner resumes it", study_id, self.lease_s)

    def _release(self, study_id: int) -> None:
        try:
            self.db.release_lease(study_id, self.owner)
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("study %s: lease not released (%s); it lapses", study_id, exc)


def _kill_workers(orchestrator: object) -> None:
    """Kill the Ray actors of an orchestrator whose run ended on an error before its own clean-up did."""
    import ray

    for worker in list(getattr(orchestrator, "_workers", ())):
        try:
            ray.kill(worker.actor, no_restart=True)
        except Exception:  # already gone
            pass
