"""The orchestrator: the one process that asks and tells the sampler and writes the study database.

Its loop, in one sentence: fill every free worker slot (trials to send again
first, then new proposals), commit the new rows, wait for results, commit them,
then tell the sampler, until the budget is met. The parts live beside it:

- ``tuner/run/session.py``: the study row, the checks against the spec, the lease;
- ``tuner/run/worker_pool.py``: the Ray actors, and every failure turned into an outcome
  (a timeout kills and replaces the worker, a lost worker's trial is retried once);
- ``tuner/strategy/adapter.py``: the sampler, on an in-memory Optuna study rebuilt
  from the trial table.

Killing the orchestrator loses nothing finished: a trial is a row in the
database before the loop waits on it, and its result is committed before the
sampler hears of it. A restart rebuilds the sampler's study from the rows,
re-sends the rows still marked running under the same numbers, and goes on
until the budget is met, proposing what an uninterrupted run would have.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.run.fair import SlotBroker
from tuner.run.session import StudyConflict, StudyFailed, StudySession
from tuner.run.worker_pool import MAX_ATTEMPTS, MAX_WORKER_START_FAILURES, Outcome, Work, WorkerPool, ensure_ray
from tuner.store import progress
from tuner.store.queries import kept_results
from tuner.store.storage import DUPLICATE, RUNNING, StudyDB, TrialRow, TrialWrite, measured_count
from tuner.strategy import SpaceExhausted
from tuner.strategy.adapter import Proposal, SamplerAdapter, finite
from tuner.study.spec import CompiledStudy
from tuner.workloads.base import DeviceInfo, TrialStatus

__all__ = [
    "MAX_ATTEMPTS",
    "MAX_WORKER_START_FAILURES",
    "Orchestrator",
    "Progress",
    "RunSummary",
    "StudyConflict",
    "StudyFailed",
    "ensure_ray",
]

log = logging.getLogger("tuner")
STATIC_REJECT_LIMIT = 2000  # consecutive statically infeasible proposals before giving up
DUPLICATE_LIMIT = 200  # consecutive proposals of measured configs: the space is exhausted or the search converged
# A repeated config reuses the earlier result when that result does not depend on luck.
REUSABLE = frozenset({"ok", "compile_error", "out_of_resources", "numerics_fail"})
ELAPSED_SAVE_EVERY_S = 5.0
#: The rows of just-dispatched trials (status running) wait at most this long for the next commit: a result
#: that comes sooner takes them into its transaction (one commit per trial, not two); otherwise they are
#: committed alone. Nothing finished waits: a result is committed (with its own row) before it is told.
RUNNING_ROWS_WAIT_S = 0.2


@dataclass
class Progress:
    """A snapshot for progress displays. Times in seconds."""

    study: str
    budget_trials: int
    finished: int
    failed: int
    infeasible_static: int
    running: int
    best_value: float | None
    best_trial: int | None
    primary_metric: str
    elapsed_s: float
    eta_s: float | None
    last_status: str | None = None


@dataclass
class RunSummary:
    study_id: int
    name: str
    status: str
    counts: dict[str, int]
    pareto: list[TrialRow]
    best: TrialRow | None
    elapsed_s: float
    message: str | None = None
    startup_s: float = 0.0  # Ray, workers, the sampler's study: before the first dispatch
    loop_s: float = 0.0  # from the first dispatch to the last result


class Orchestrator:
    """Runs one study to its budget. Not thread-safe: one orchestrator per study at a time."""

    def __init__(
        self,
        compiled: CompiledStudy,
        db: StudyDB,
        *,
        ray_address: str | None = None,
        workers: int | None = None,
        trials_per_worker: int | None = None,
        progress: Callable[[Progress], None] | None = None,
        heartbeat: Callable[[], None] | None = None,
        poll_s: float = 0.5,
        lease_owner: str | None = None,
        lease_s: float = 30.0,
        broker: SlotBroker | None = None,
        resource_share: float = 1.0,
    ) -> None:
        """``progress`` is called after each finished trial; ``heartbeat`` on every turn of the loop
        (at least every ``poll_s`` seconds), where a service checks for stop requests.

        ``lease_owner``: hold the study's lease under this name while running (``tuner run`` passes one;
        a service runner passes the name it claimed the study with). A study whose lease another owner
        holds is refused with :class:`StudyConflict`, unless that owner is a dead process of this host;
        the lease is renewed every ``lease_s / 3`` seconds and released at the end, so after a crash it
        lapses and a service runner on the same database may resume the study.

        ``broker``: the worker slots this study shares with the other studies of its runner
        (:mod:`tuner.run.fair`); ``resource_share``: the fraction of a device its actors reserve in Ray.
        """
        self.compiled = compiled
        self.spec = compiled.spec
        self.db = db
        self.ray_address = ray_address
        self.progress = progress
        self.heartbeat = heartbeat
        self.poll_s = poll_s
        self.workload = compiled.workload_cls(**compiled.spec.args)
        self.session = StudySession(db, compiled, lease_owner, lease_s)
        self.pool = WorkerPool(
            compiled,
            self.workload,
            workers or compiled.spec.resources.workers,
            trials_per_worker or compiled.spec.resources.trials_per_worker,
            resource_share=resource_share,
        )
        self.broker = broker
        self.sampler: SamplerAdapter | None = None
        self.device: DeviceInfo | None = None
        self._stop = False
        self._best: tuple[float, int] | None = None
        self._counts: dict[str, int] = {}
        self._finished_here = 0  # trials finished by this run (for the ETA)
        self._startup_s = self._loop_s = 0.0
        self._pending: list[TrialWrite] = []  # rows to commit, in order
        self._to_tell: list[tuple[int, str, dict[str, Any]]] = []  # results to tell once committed
        self._reusable: dict[str, Any] = {}  # config key -> finished trial whose result a repeat reuses
        self._duplicates_in_a_row = 0
        self._exhausted: SpaceExhausted | None = None  # why no new trial may start, once nothing new is left
        self._prior_proposals: dict[str, int] = {}  # replaced-proposal counts of earlier runs of the study

    # public ------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the run loop to stop dispatching; trials in flight are re-sent on resume."""
        self._stop = True

    def run(self) -> RunSummary:
        self.db.create_tables()
        row = self.session.open()
        self.study_id = row.id
        self._prior_elapsed = row.elapsed_s or 0.0
        self._prior_proposals = dict(getattr(row, "proposal_counts", None) or {})
        self._run_started = time.monotonic()
        if self.broker is not None:
            self.broker.join(self.study_id, self.spec.priority)
        ensure_ray(self.ray_address, min_cpus=self.pool.requested_workers or 2)
        status, message = "completed", None
        try:
            self._start()
            loop_started = time.monotonic()
            self._startup_s = loop_started - self._run_started
            self._loop()
            self._loop_s = time.monotonic() - loop_started
            if not self._stop:
                self._remeasure()
            if self._stop:
                status = "stopped"
            message = self._exhausted.reason if self._exhausted is not None else None
        except KeyboardInterrupt:
            status, message = "stopped", "interrupted"
        except StudyFailed as exc:
            status, message = "failed", str(exc)
        except BaseException:  # SystemExit from a signal handler, a bug: never record such a run as completed
            status, message = "stopped", "interrupted"
            raise
        finally:
            self._settle()
            self.pool.kill_all()
            if self.broker is not None:
                self.broker.leave(self.study_id)
            elapsed = self._elapsed()
            if self._proposal_fields():
                self.session.record(**self._proposal_fields())
            self.session.close(status=status, elapsed_s=elapsed, message=message)
        if status == "completed":
            from tuner.best_configs.registry import publish_completed

            publish_completed(self.db, self.study_id)  # unless the spec says publish: false; never raises
        summary = self._summary(status, elapsed, message)
        if status == "failed":
            raise StudyFailed(message)
        return summary

    def _summary(self, status: str, elapsed: float, message: str | None) -> RunSummary:
        """What the run reports: the front and the pick the study's summary keeps (no trial scan)."""
        kept = kept_results(self.db, self.db.get_study(self.study_id))
        return RunSummary(
            study_id=self.study_id,
            name=self.spec.name,
            status=status,
            counts=self.db.status_counts(self.study_id),
            pareto=kept.front,
            best=kept.pick,
            elapsed_s=elapsed,
            message=message,
            startup_s=self._startup_s,
            loop_s=self._loop_s,
        )

    # set-up ------------------------------------------------------------------
    def _start(self) -> None:
        """Start the workers, rebuild the sampler's study from the rows, queue the rows left running."""
        info = self.pool.start()
        self.device = DeviceInfo.from_dict(info["device"])
        self.session.record(
            device={**info["device"], "roofline": info.get("roofline")},
            fingerprint=info["fingerprint"],
            elapsed_s=self._elapsed(),
        )
        rows = self.db.trials(self.study_id)
        self.sampler = self._warm_started_sampler(rows)
        for row in rows:
            self._count(DUPLICATE if row.duplicate_of is not None else row.status, +1)
            if row.status in REUSABLE and row.duplicate_of is None:
                self._reusable[_config_key(row.params)] = row
            if row.status == RUNNING:  # cut off by the end of an earlier run: sent again, same number
                self.pool.redispatch.append(Work(row.number, dict(row.params), row.attempt))
            else:
                self._note_best(row.status, row.metrics, row.number, row.feasible)

    def _warm_started_sampler(self, rows: list[Any]) -> SamplerAdapter:
        """The sampler, after the warm start (tuner/best_configs/warm_start.py: decided at the first start, then read
        back)
        has given it the registry's configs to enqueue and the priors; where they came from is stored."""
        from tuner.best_configs import warm_start
        from tuner.best_configs.registry import record_origins

        assert self.device is not None and self.study_id is not None
        start = warm_start.plan(self.db, self.compiled, self.device.to_dict(), self.study_id, fresh=not rows)
        sampler = SamplerAdapter(
            self.compiled,
            rows,
            self._static_reason,
            device=self.device.to_dict(),
            warm_configs=start.configs,
            priors=start.priors,
        )
        start.priors_note = sampler.priors_note or start.priors_note
        warm_start.save(self.db, self.study_id, start)
        log.info("study %s warm start: %s (%s)", self.spec.name, start.mode, start.reason)
        if sampler.origins:
            record_origins(self.db, self.study_id, sampler.origins)
        return sampler

    def _beat(self) -> None:
        """One turn of the loop: renew our lease when one is due, then the caller's heartbeat."""
        if not self.session.beat(self._elapsed()):
            self.stop()
        if self.heartbeat is not None:
            self.heartbeat()

    # the loop ----------------------------------------------------------------
    def _loop(self) -> None:
        last_save = time.monotonic()
        while True:
            exhausted = self._fill()
            if (exhausted or self._stop) and not self.pool.busy():
                return
            # The dispatched trials' rows ride with the next result's commit, or go alone after a short wait.
            poll_s = self.poll_s if self.broker is None else self.broker.poll_s(self.poll_s)
            outcomes = self.pool.poll(min(poll_s, RUNNING_ROWS_WAIT_S) if self._pending else poll_s)
            if outcomes is None:  # nothing in flight, no worker starting
                self._settle()
                if exhausted or self._stop:
                    return
                if self.broker is not None:  # the other studies hold every slot: wait for one to come back
                    self.broker.wait(self.poll_s)
                    self._beat()  # the lease is renewed while we wait
                continue
            for outcome in outcomes:
                self._finish(outcome)
            self._settle_slots()
            self._settle()  # the results are committed, then told
            self._beat()
            if time.monotonic() - last_save > ELAPSED_SAVE_EVERY_S:
                self.session.record(elapsed_s=self._elapsed(), **self._proposal_fields())
                last_save = time.monotonic()

    def _fill(self) -> bool:
        """Dispatch while workers have free slots. Returns True when no new trial may start."""
        while True:
            if not self.pool.redispatch and self._no_new_trials():
                return True
            worker = self.pool.free_worker(self._may_use)
            if worker is None:
                return self._no_new_trials()
            if self.pool.redispatch:
                self.pool.dispatch(self.pool.redispatch.popleft(), worker)
                continue
            work = self._ask()
            if work is None:
                self._settle_slots()  # the slot taken for it goes back
                return True
            self.pool.dispatch(work, worker)

    def _may_use(self, worker: Any) -> bool:
        """Whether this study may queue a trial on ``worker`` now (its runner's fair share, :mod:`tuner.run.fair`)."""
        return self.broker is None or self.broker.take(self.study_id, self.pool.slot_key(worker))

    def _settle_slots(self) -> None:
        """Give back the shared slots of the trials that ended or went back to be sent again."""
        if self.broker is not None:
            self.broker.settle(self.study_id, self.pool.queued_by_key())

    def _no_new_trials(self) -> bool:
        minutes = self.spec.budget.minutes
        return (
            self._stop
            or measured_count(self._counts, include_running=True) >= self.spec.budget.trials
            or self._exhausted is not None
            or (minutes is not None and self._elapsed() >= minutes * 60)
        )

    def _sampler(self) -> SamplerAdapter:
        assert self.sampler is not None, "the sampler is made once the workers are up"
        return self.sampler

    def _ask(self) -> Work | None:
        """Ask the sampler until a statically feasible config comes (each rejection is recorded); None once
        nothing new is left (the sampler's :class:`SpaceExhausted`, kept with its reason for the study)."""
        for _ in range(STATIC_REJECT_LIMIT):
            try:
                proposal = self._sampler().ask()
            except SpaceExhausted as exc:
                self._exhausted = exc
                return None
            work = self._admit(proposal)
            if work is not None:
                return work
            if self._exhausted is not None:
                return None
        raise StudyFailed(f"{STATIC_REJECT_LIMIT} proposals in a row were statically infeasible; widen the space")

    def _admit(self, proposal: Proposal) -> Work | None:
        """Record a proposed config: as a trial to run, as a copy of an earlier identical trial, or as
        statically infeasible (both committed and told at once)."""
        number, config = proposal.number, proposal.config
        earlier = self._reusable.get(_config_key(config))
        if earlier is not None:
            self._pending.append(
                self.db.insert_op(self.study_id, number, config, optuna_trial_id=None, copy_of=earlier)
            )
            self._to_tell.append((number, earlier.status, earlier.metrics))
            self._settle()
            self._count(DUPLICATE, +1)
            self._duplicates_in_a_row += 1
            if self._duplicates_in_a_row >= DUPLICATE_LIMIT:
                self._exhausted = SpaceExhausted(f"{DUPLICATE_LIMIT} proposals in a row repeated measured configs")
            return None
        self._duplicates_in_a_row = 0
        reason = self._static_reason(config)
        if reason is None:
            self._pending.append(self.db.insert_op(self.study_id, number, config, optuna_trial_id=None))
            self._count(RUNNING, +1)
            return Work(number, config)
        status = TrialStatus.INFEASIBLE_STATIC.value
        self._pending.append(
            self.db.insert_op(self.study_id, number, config, optuna_trial_id=None, status=status, error=reason)
        )
        self._to_tell.append((number, status, {}))
        self._settle()
        self._count(status, +1)
        return None

    def _static_reason(self, config: dict[str, Any]) -> str | None:
        device_fields = self.device.to_dict() if self.device else None
        reason = self.compiled.space.static_violation(config, device_fields)
        if reason is None and self.device is not None:
            reason = self.workload.static_check(config, self.device)
        return reason

    # results -----------------------------------------------------------------
    def _finish(self, outcome: Outcome) -> None:
        """Queue a finished trial's row update, and its result to tell once the update is committed."""
        work, result = outcome.work, outcome.result
        status = result["status"]
        metrics = dict(result.get("metrics") or {})
        error = result.get("error")
        if status == TrialStatus.OK.value:
            missing = [m for m, _ in self.compiled.objectives if not finite(metrics.get(m))]
            if missing:
                status = TrialStatus.RUNTIME_ERROR.value
                error = f"the workload reported no finite value for objective(s) {missing}"
        feasible = status == TrialStatus.OK.value and all(c.satisfied(metrics) for c in self.compiled.constraints)
        write = self.db.finish_op(
            self.study_id,
            work.number,
            status=status,
            metrics=metrics,
            samples_ms=result.get("samples_ms") or [],
            extra=result.get("extra") or {},
            feasible=feasible,
            timing_comparable=result.get("timing_comparable"),
            error=error,
            worker=outcome.worker_label,
            attempt=work.attempt,
            fingerprint=outcome.fingerprint,
        )
        self._pending.append(write)
        if status in REUSABLE:
            self._reusable[_config_key(work.config)] = _Reusable(number=work.number, **write.values)
        self._count(RUNNING, -1)
        self._count(status, +1)
        self._finished_here += 1
        self._note_best(status, metrics, work.number, feasible)
        self._to_tell.append((work.number, status, metrics))
        self._report(status)

    def _settle(self) -> None:
        """Commit the pending rows in one transaction (a result with the rows of the trials dispatched since the
        last commit, or those rows alone), then tell the sampler the results among them: a told result is always
        in the table."""
        if self._pending:
            self.db.apply(self._pending)
            self._pending.clear()
        for number, status, metrics in self._to_tell:
            self._sampler().tell(number, status, metrics)
        self._to_tell.clear()

    def _note_best(self, status: str, metrics: dict[str, Any], number: int, feasible: bool | None) -> None:
        primary, direction = self.compiled.objectives[0]
        value = metrics.get(primary)
        if status != TrialStatus.OK.value or not feasible or not finite(value):
            return
        sign = -1.0 if direction == "maximize" else 1.0
        if self._best is None or sign * value < sign * self._best[0]:
            self._best = (float(value), number)

    # the winner ----------------------------------------------------------------
    def _remeasure(self) -> None:
        """Time the best distinct configs again, interleaved A B C A B C ..., on one worker, and store each
        one's values and median: the default pick then goes by the medians (``pareto.best_trial``)."""
        self._settle()  # the last results are in the table before the candidates are chosen
        metric, direction = self.compiled.objectives[0]
        candidates = self._remeasure_candidates(metric, direction)
        worker = self.pool.idle_worker()
        if len(candidates) < 2 or worker is None:
            return
        while not self._stop and not self._may_use(worker):  # the device is ours alone while we re-measure
            assert self.broker is not None
            self.broker.wait(self.poll_s)
            self._beat()
        try:
            self._remeasure_on(worker, candidates, metric)
        finally:
            self._settle_slots()

    def _remeasure_on(self, worker: Any, candidates: list[TrialRow], metric: str) -> None:
        values: dict[int, list[float]] = {t.number: [] for t in candidates}
        for _ in range(self.spec.remeasure.rounds):
            for trial in candidates:
                if self._stop:
                    return
                result = self.pool.run_now(worker, trial.params)
                if result is None:
                    return
                value = (result.get("metrics") or {}).get(metric)
                if result.get("status") == TrialStatus.OK.value and finite(value):
                    values[trial.number].append(float(value))
                self._beat()
        for number, measured in values.items():
            if measured:
                data = {"metric": metric, "values": measured, "median": statistics.median(measured)}
                data["rounds"] = len(measured)
                self._pending.append(TrialWrite("update", self.study_id, number, {"remeasured": data}))
        self._settle()

    def _remeasure_candidates(self, metric: str, direction: str) -> list[TrialRow]:
        rows = [
            t
            for t in self.db.trials(self.study_id)
            if t.status == "ok" and t.feasible and t.duplicate_of is None and finite(t.metrics.get(metric))
        ]
        top_k = self.spec.remeasure.top_k
        if top_k is None:
            top_k = 5 if rows and all(t.timing_comparable for t in rows) else 0
        sign = -1.0 if direction == "maximize" else 1.0
        return sorted(rows, key=lambda t: (sign * t.metrics[metric], t.number))[:top_k]

    # bookkeeping -------------------------------------------------------------
    def _proposal_fields(self) -> dict[str, Any]:
        """The study's replaced-proposal counts (earlier runs' plus this run's), when its sampler replaces
        proposals inside the proposal step: ``{"proposal_counts": {...}}``, else nothing."""
        counts = self.sampler.proposal_counts() if self.sampler is not None else None
        if counts is None:
            return {}
        keys = set(counts) | set(self._prior_proposals)
        return {"proposal_counts": {k: self._prior_proposals.get(k, 0) + counts.get(k, 0) for k in sorted(keys)}}

    def _count(self, status: str, delta: int) -> None:
        self._counts[status] = self._counts.get(status, 0) + delta

    def _elapsed(self) -> float:
        return self._prior_elapsed + (time.monotonic() - self._run_started)

    def _report(self, last_status: str | None) -> None:
        if self.progress is None:
            return
        counts = self._counts
        finished = measured_count(counts)
        run_s = time.monotonic() - self._run_started
        eta = progress.eta_s(
            measured=finished,
            budget_trials=self.spec.budget.trials,
            elapsed_s=self._elapsed(),
            budget_minutes=self.spec.budget.minutes,
            rate_per_s=self._finished_here / run_s if self._finished_here and run_s > 0 else None,
        )
        self.progress(
            Progress(
                study=self.spec.name,
                budget_trials=self.spec.budget.trials,
                finished=finished,
                failed=finished - counts.get(TrialStatus.OK.value, 0),
                infeasible_static=counts.get(TrialStatus.INFEASIBLE_STATIC.value, 0),
                running=counts.get(RUNNING, 0),
                best_value=self._best[0] if self._best else None,
                best_trial=self._best[1] if self._best else None,
                primary_metric=self.compiled.objectives[0][0],
                elapsed_s=self._elapsed(),
                eta_s=eta,
                last_status=last_status,
            )
        )


def _config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


@dataclass
class _Reusable:
    """A finished trial's result as a repeat of its config copies it (see ``StudyDB.insert_op``)."""

    number: int
    status: str
    metrics: dict[str, Any]
    samples_ms: list[float]
    extra: dict[str, Any] | None
    feasible: bool
    timing_comparable: bool | None
    fingerprint: dict[str, Any] | None
    error: str | None = None
    worker: str | None = None
    attempt: int = 1
    finished_at: Any = None
