"""The study runner: claims queued studies from the database and runs several at once.

The API only writes a queued study; a runner (``tuner worker``, started beside
the API by ``tuner serve``, or on other machines against the same database
and Ray cluster) claims it with a lease that it renews while the study runs.
A runner that dies lets its lease lapse, and another runner takes the study
over and resumes it. Stop requests arrive through the database too. Between
studies a runner may do scheduled jobs (the registry's recheck, tuner/run/jobs.py).

Up to ``max_studies`` studies run at once, each in its own thread with its own orchestrator, lease
and worker actors; they share the runner's worker slots (one per GPU, or the CPU workers) through a
:class:`~tuner.run.fair.SlotBroker`, in turns weighted by each spec's ``priority``. So a small study
submitted after a huge one starts at once and finishes while the huge one goes on.
"""

from __future__ import annotations

import logging
import os
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
DEFAULT_MAX_STUDIES = 4
MAX_STUDIES_ENV = "TUNER_MAX_STUDIES"


def default_max_studies() -> int:
    """``$TUNER_MAX_STUDIES`` when set (a whole number >= 1), else 4."""
    raw = os.environ.get(MAX_STUDIES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_STUDIES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{MAX_STUDIES_ENV}={raw!r}: expected a whole number >= 1")
    return value


class StudyRunner:
    """Claims and runs studies until ``stop`` is called: up to ``max_studies`` at once."""

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
        max_studies: int | None = None,
    ) -> None:
        """``recheck_every_s``: run the registry's recheck when the last run began that long ago, between
        studies (:mod:`tuner.run.jobs`); None: never. ``recheck_args``: run-setting args it measures with.
        ``max_studies``: how many studies run at once (default ``$TUNER_MAX_STUDIES``, else 4)."""
        from tuner.run.fair import SlotBroker

        self.max_studies = max_studies if max_studies is not None else default_max_studies()
        if self.max_studies < 1:
            raise ValueError(f"max_studies={self.max_studies}: expected at least 1")
        self.broker = SlotBroker()
        self.db = db
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.ray_address = ray_address
        self.workers = workers
        self.owner = owner or lease_owner_name("runner")
        self._stop = threading.Event()
        self._current: dict[int, threading.Thread] = {}  # the studies in hand, each run by its thread
        self._lock = threading.Lock()
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
        for study_id in self.running():
            if lifecycle.hand_back(self.db, study_id, self.owner, REQUEUED):
                log.warning("study %s queued again for the next runner; its trials in flight will be re-sent", study_id)

    def running(self) -> list[int]:
        """The ids of the studies this runner runs now."""
        with self._lock:
            return sorted(self._current)

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the studies' threads to end (after :meth:`stop`)."""
        with self._lock:
            threads = list(self._current.values())
        for thread in threads:
            thread.join(timeout_s)

    def run_forever(self) -> None:
        """Claim and run studies until :meth:`stop`. A database that cannot be reached is waited for
        (polling again), never fatal; the caller runs the migrations first (``create_tables``)."""
        log.info("runner %s waiting for studies in %s (%d at once)", self.owner, self.db.url, self.max_studies)
        try:
            self._claim_loop()
        finally:
            self.join()  # each study stops at its next heartbeat and settles its own row and lease

    def _claim_loop(self) -> None:
        while not self._stop.is_set():
            if len(self.running()) >= self.max_studies:
                self._stop.wait(self.poll_s)
                continue
            try:
                row = lifecycle.claim_next(self.db, self.owner, self.lease_s)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                log.warning("database unreachable (%s); polling again in %.0f s", exc, self.poll_s)
                row = None
            if row is None:
                # idle: the scheduled recheck measures one entry, then we look for studies again
                if self.running() or self.recheck is None or not self.recheck.step():
                    self._stop.wait(self.poll_s)
                continue
            self._start_study(row)

    def _start_study(self, row: StudyRow) -> None:
        with self._lock:
            if row.id in self._current:  # its lease lapsed while its thread still runs it: that thread goes on
                log.warning("study %s: lease lapsed under its own run; renewed", row.id)
                return
        thread = threading.Thread(target=self._run_in_thread, args=(row,), name=f"study-{row.id}", daemon=True)
        with self._lock:
            self._current[row.id] = thread
        thread.start()

    def _run_in_thread(self, row: StudyRow) -> None:
        try:
            self.run_study(row)
        except Exception:  # the database went away for good, a bug: the lease lapses, a runner resumes it
            log.exception("study %s: its runner thread ended", row.id)
        finally:
            with self._lock:
                self._current.pop(row.id, None)

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
            broker=self.broker,
            resource_share=1.0 / self.max_studies,
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
