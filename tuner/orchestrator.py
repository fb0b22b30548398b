"""The orchestrator: the one process that asks and tells Optuna and writes the study database.

It dispatches configs to long-lived Ray worker actors (one per GPU, CPU
actors when there is none), keeps several trials in flight, and turns every
failure into a trial status:

- a trial that holds its worker's device longer than ``budget.trial_timeout_s``
  gets the worker killed and replaced (``timeout``);
- a worker that dies mid-trial is replaced and the trial retried once
  (``worker_lost`` if it dies again); other trials queued on it are re-sent;
- exceptions and wrong numerics come back from the worker as statuses.

Killing the orchestrator loses nothing finished: trials are rows in the
database before they are dispatched, and a restart re-sends the rows still
marked running under the same numbers, then goes on until the budget is met.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

from tuner import lifecycle
from tuner.pareto import best_trial, pareto_front
from tuner.samplers import CONSTRAINTS_ATTR, EnumeratedGridSampler, make_sampler, resolve_sampler_name
from tuner.spec import CompiledStudy
from tuner.storage import (
    DUPLICATE,
    RUNNING,
    StudyDB,
    StudyRow,
    TrialRow,
    TrialWrite,
    measured_count,
    owner_is_dead,
    tune_sqlite_engine,
)
from tuner.strategy import SpaceExhausted, TunerSampler
from tuner.workload import DeviceInfo, TrialStatus

log = logging.getLogger("tuner")
MAX_ATTEMPTS = 2
MAX_WORKER_START_FAILURES = 3
STATIC_REJECT_LIMIT = 2000  # consecutive statically infeasible proposals before giving up
EXHAUSTED = "the space is exhausted: every statically feasible config is measured"
DUPLICATE_LIMIT = 200  # consecutive proposals of measured configs: the space is exhausted or the search converged
# A repeated config reuses the earlier result when that result does not depend on luck.
REUSABLE = frozenset({"ok", "compile_error", "out_of_resources", "numerics_fail"})
ELAPSED_SAVE_EVERY_S = 5.0


class StudyConflict(RuntimeError):
    """A study of that name exists and the spec would change what it measures."""


class StudyFailed(RuntimeError):
    pass


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
    startup_s: float = 0.0  # Ray, workers, Optuna study: before the first dispatch
    loop_s: float = 0.0  # from the first dispatch to the last result


@dataclass
class _Work:
    """A trial to dispatch or in flight."""

    number: int
    optuna_trial_id: int | None
    config: dict[str, Any]
    attempt: int = 1
    dispatched_at: float = 0.0
    worker: _Worker | None = None
    ref: Any = None


@dataclass
class _Worker:
    index: int
    generation: int
    actor: Any
    ready_ref: Any
    ready: bool = False
    next_seq: int = 0
    queue: deque[_Work] = field(default_factory=deque)
    last_done_at: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"w{self.index}.{self.generation}"


def ensure_ray(address: str | None = None, min_cpus: int = 2) -> None:
    """Join ``address`` (else ``$RAY_ADDRESS``) or start a local Ray sized to the machine, unless Ray is up.

    The local Ray is a new instance even when a cluster started with ``ray start`` runs on this
    machine (``address="local"``): without an address, ``ray.init`` would join that cluster, and
    refuse the CPU count.
    """
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, min_cpus) + 1, **kwargs)


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
    ) -> None:
        """``progress`` is called after each finished trial; ``heartbeat`` on every turn of the loop
        (at least every ``poll_s`` seconds), where a service checks for stop requests.

        ``lease_owner``: hold the study's lease under this name while running (``tuner run`` passes one;
        a service runner passes the name it claimed the study with). A study whose lease another owner
        holds is refused with :class:`StudyConflict`, unless that owner is a dead process of this host;
        the lease is renewed every ``lease_s / 3`` seconds and released at the end, so after a crash it
        lapses and a service runner on the same database may resume the study.
        """
        self.compiled = compiled
        self.spec = compiled.spec
        self.db = db
        self.ray_address = ray_address
        self.requested_workers = workers or compiled.spec.resources.workers
        self.requested_slots = trials_per_worker or compiled.spec.resources.trials_per_worker
        self.progress = progress
        self.heartbeat = heartbeat
        self.poll_s = poll_s
        self.lease_owner = lease_owner
        self.lease_s = lease_s
        self._lease_renewed = 0.0
        self.workload = compiled.workload_cls(**compiled.spec.args)
        self._gang = compiled.spec.resources.gpus_per_trial > 1  # trials of k ranks (tuner/gang.py)
        self._stop = False
        self._workers: list[_Worker] = []
        self._inflight: dict[Any, _Work] = {}
        self._redispatch: deque[_Work] = deque()
        self._worst: dict[str, float] = {}
        self._best: tuple[float, int] | None = None
        self._counts: dict[str, int] = {}
        self._start_failures = 0
        self._finished_here = 0  # trials finished by this run (for the ETA)
        self._startup_s = self._loop_s = 0.0
        self._pending: list[TrialWrite] = []
        self._reusable: dict[str, Any] = {}  # config key -> finished trial whose result a repeat reuses
        self._duplicates_in_a_row = 0
        self._exhausted: str | None = None

    # public ------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the run loop to stop dispatching; trials in flight are re-sent on resume."""
        self._stop = True

    def run(self) -> RunSummary:
        import ray

        self.db.create_tables()
        row = self._open_study()
        self.study_id = row.id
        self._prior_elapsed = row.elapsed_s or 0.0
        self._run_started = time.monotonic()
        ensure_ray(self.ray_address, min_cpus=self.requested_workers or 2)
        status, message = "completed", None
        try:
            self._start_workers()
            self._optuna = self._open_optuna(row)
            self._recover()
            loop_started = time.monotonic()
            self._startup_s = loop_started - self._run_started
            self._loop()
            self._loop_s = time.monotonic() - loop_started
            if not self._stop:
                self._remeasure()
            if self._stop:
                status = "stopped"
            message = self._exhausted
        except KeyboardInterrupt:
            status, message = "stopped", "interrupted"
        except StudyFailed as exc:
            status, message = "failed", str(exc)
        except BaseException:  # SystemExit from a signal handler, a bug: never record such a run as completed
            status, message = "stopped", "interrupted"
            raise
        finally:
            self._flush()
            for worker in self._workers:
                ray.kill(worker.actor, no_restart=True)
            self._workers.clear()
            elapsed = self._elapsed()
            lifecycle.finish(self.db, self.study_id, status, owner=self.lease_owner, elapsed_s=elapsed, message=message)
            if self.lease_owner is not None:
                self.db.release_lease(self.study_id, self.lease_owner)
        trials = self.db.trials(self.study_id)
        objectives = self.compiled.objectives
        summary = RunSummary(
            study_id=self.study_id,
            name=self.spec.name,
            status=status,
            counts=self.db.status_counts(self.study_id),
            pareto=list(pareto_front(trials, objectives)),
            best=best_trial(trials, objectives),
            elapsed_s=elapsed,
            message=message,
            startup_s=self._startup_s,
            loop_s=self._loop_s,
        )
        if status == "failed":
            raise StudyFailed(message)
        return summary

    # set-up ------------------------------------------------------------------
    def _open_study(self) -> StudyRow:
        spec, space = self.spec, self.compiled.space
        row = self.db.find_study(spec.name)
        spec_json = spec.model_dump(mode="json")
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
                raise StudyConflict(
                    f"study {spec.name!r} exists with different {', '.join(changed)}; use a new study name"
                )
        if self.lease_owner is not None and not self.db.take_lease(row.id, self.lease_owner, self.lease_s):
            holder = self.db.get_study(row.id)
            dead = holder.lease_owner if holder is not None and owner_is_dead(holder.lease_owner) else None
            if dead is not None and self.db.take_lease(row.id, self.lease_owner, self.lease_s, steal_from=dead):
                log.warning("study %s: took the lease of %s, whose process is gone", spec.name, dead)
                holder = None
            else:
                until = holder.lease_expires_at if holder is not None else None
                raise StudyConflict(
                    f"study {spec.name!r} is being run by {holder.lease_owner if holder else '?'} (lease until "
                    f"{until:%Y-%m-%d %H:%M:%S} UTC); stop that run or wait for it to end"
                )
        self._lease_renewed = time.monotonic()
        fresh = {"spec": spec_json, "message": None, "stop_requested": False}
        if not lifecycle.start_run(self.db, row.id, self.lease_owner, **fresh):
            raise StudyConflict(f"study {spec.name!r} was deleted, or another run took it over")
        return row

    def _beat(self) -> None:
        """One turn of the loop: renew our lease when one is due, then the caller's heartbeat."""
        if self.lease_owner is not None and time.monotonic() - self._lease_renewed >= self.lease_s / 3:
            self._lease_renewed = time.monotonic()
            if not self.db.renew_lease(self.study_id, self.lease_owner, self.lease_s):
                log.warning("lost the lease of study %s to another runner; stopping", self.study_id)
                self.stop()
        if self.heartbeat is not None:
            self.heartbeat()

    def _start_workers(self) -> None:
        import ray

        gpus = int(ray.cluster_resources().get("GPU", 0))
        k = self.spec.resources.gpus_per_trial
        if self._gang:
            # A gang of k GPUs runs one trial at a time as k fresh rank processes (tuner/gang.py);
            # on a CPU each gang runs k gloo ranks.
            if gpus and gpus < k:
                raise StudyFailed(f"resources.gpus_per_trial={k} but the cluster has {gpus} GPU(s)")
            n = min(self.requested_workers or gpus // k, gpus // k) if gpus else (self.requested_workers or 1)
        elif gpus:
            n = min(self.requested_workers or gpus, gpus)
        else:
            n = self.requested_workers or 2
        self._gpu = gpus > 0
        # On a GPU, the workload's trials_in_flight per worker: for kernels, while one is timed the
        # others compile on the worker's threads (Triton's compiler and ptxas run in parallel).
        in_flight = self.workload.trials_in_flight if self._gpu else 1
        self._slots = 1 if self._gang else self.requested_slots or in_flight
        self._workers = [self._spawn(i, 0) for i in range(n)]
        deadline = time.monotonic() + 300
        for worker in self._workers:
            self._await_ready(worker, timeout=max(1.0, deadline - time.monotonic()))
        infos = [w.info for w in self._workers if w.ready]
        if not infos:
            raise StudyFailed("no worker could start")
        self.device = DeviceInfo.from_dict(infos[0]["device"])
        device = {**infos[0]["device"], "roofline": infos[0].get("roofline")}
        self.db.update_study(self.study_id, device=device, fingerprint=infos[0]["fingerprint"])

    def _spawn(self, index: int, generation: int) -> _Worker:
        import ray

        from tuner.worker import TrialWorker

        env = {"TRITON_INTERPRET": "1"} if not self._gpu else {}
        options: dict[str, Any] = {
            "num_cpus": 1,
            "num_gpus": self.spec.resources.gpus_per_trial if self._gpu else 0,
            "max_concurrency": self._slots + 1,
            "max_restarts": 0,
        }
        if env:
            options["runtime_env"] = {"env_vars": env}
        label = f"w{index}.{generation}"
        if self._gang:
            from tuner.gang import GangWorker

            k = self.spec.resources.gpus_per_trial
            actor = (
                ray.remote(GangWorker)
                .options(**options)
                .remote(self.spec.workload, self.spec.args, label, k, self.spec.budget.trial_timeout_s)
            )
            return _Worker(index=index, generation=generation, actor=actor, ready_ref=actor.describe.remote())
        actor = ray.remote(TrialWorker).options(**options).remote(self.spec.workload, self.spec.args, label)
        return _Worker(index=index, generation=generation, actor=actor, ready_ref=actor.describe.remote())

    def _await_ready(self, worker: _Worker, timeout: float) -> None:
        import ray

        try:
            worker.info = ray.get(worker.ready_ref, timeout=timeout)
            worker.ready = True
            worker.last_done_at = time.monotonic()
            self._start_failures = 0
        except Exception as exc:
            self._start_failures += 1
            log.warning("worker %s failed to start: %s", worker.label, exc)
            if self._start_failures >= MAX_WORKER_START_FAILURES:
                raise StudyFailed(f"workers fail to start: {exc}") from None
            self._replace(worker)

    def _replace(self, worker: _Worker) -> None:
        import ray

        ray.kill(worker.actor, no_restart=True)
        fresh = self._spawn(worker.index, worker.generation + 1)
        self._workers[self._workers.index(worker)] = fresh

    def _open_optuna(self, row: StudyRow) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        compiled, spec = self.compiled, self.spec
        grid = None
        name = resolve_sampler_name(spec.sampler, len(compiled.objectives))
        if name == "grid":
            grid = [compiled.space.optuna_params(p) for p in compiled.space.grid()]
        # A resumed study reseeds deterministically: the same seed again would replay the proposals
        # (the random start-up ones above all) that the first run already measured.
        done = len(self.db.trials(self.study_id))
        seed = spec.seed + done if spec.seed is not None and done else spec.seed
        sampler = make_sampler(
            name,
            n_objectives=len(compiled.objectives),
            seed=seed,
            budget_trials=spec.budget.trials,
            has_conditions=any(p.when is not None for p in compiled.space.params.values()),
            grid_points=grid,
            space=compiled.space,
            device=self.device.to_dict(),
            static_check=lambda config: self.workload.static_check(config, self.device),
        )
        engine_kwargs = {"connect_args": {"timeout": 30}} if self.db.url.startswith("sqlite") else {}
        storage = optuna.storages.RDBStorage(self.db.url, engine_kwargs=engine_kwargs)
        tune_sqlite_engine(storage.engine)
        study = optuna.create_study(
            storage=storage,
            study_name=row.optuna_name,
            directions=compiled.directions,
            sampler=sampler,
            load_if_exists=True,
        )
        # Samplers that know when nothing new is left to propose (the grid, the project's strategy).
        self._grid_sampler = sampler if isinstance(sampler, (EnumeratedGridSampler, TunerSampler)) else None
        self._constraints_on_every_trial = name not in ("tpe", "random", "grid")
        if spec.warm_start and name != "grid" and not study.get_trials(deepcopy=False):
            limit = max(1, spec.budget.trials // 4)
            feasible = [s for s in compiled.space.seeds if self._static_reason(s) is None]
            seeds = feasible[:limit]
            if len(feasible) > limit:
                log.warning(
                    "warm start: %d of %d seed configs enqueued (seeds take at most a quarter of budget.trials=%d)",
                    limit,
                    len(feasible),
                    spec.budget.trials,
                )
            for seed_config in seeds:
                study.enqueue_trial(compiled.space.optuna_params(seed_config), skip_if_exists=True)
        return study

    def _recover(self) -> None:
        """Re-send trials left running by an earlier orchestrator; settle Optuna's view with ours."""
        rows = {r.number: r for r in self.db.trials(self.study_id)}
        for row in rows.values():
            self._count(DUPLICATE if row.duplicate_of is not None else row.status, +1)
            if row.status in REUSABLE and row.duplicate_of is None:
                self._reusable[_config_key(row.params)] = row
            if row.status == RUNNING:
                self._redispatch.append(_Work(row.number, row.optuna_trial_id, dict(row.params), row.attempt))
            else:
                self._note_result(row.status, row.metrics, row.number, row.feasible)
        states = (optuna.trial.TrialState.RUNNING,)
        for trial in self._optuna.get_trials(deepcopy=False, states=states):
            row = rows.get(trial.number)
            if row is None:  # asked but not yet recorded when the last run died: finish asking it
                resumed = optuna.Trial(self._optuna, trial._trial_id)
                work = self._admit(resumed.number, resumed._trial_id, self.compiled.space.suggest(resumed))
                if work is not None:
                    self._redispatch.append(work)
            elif row.status != RUNNING:  # recorded, not yet told
                self._tell(trial._trial_id, trial.number, row.status, row.metrics)

    # the loop ----------------------------------------------------------------
    def _loop(self) -> None:
        import ray

        last_save = time.monotonic()
        while True:
            exhausted = self._fill()
            if not self._inflight and (exhausted or self._stop) and not self._redispatch:
                return
            refs = list(self._inflight) + [w.ready_ref for w in self._workers if not w.ready]
            if not refs:
                if exhausted or self._stop:
                    return
                continue
            self._flush()  # every dispatched trial has its row before we block
            ready, _ = ray.wait(refs, num_returns=1, timeout=self._wait_timeout())
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                self._handle_ready(ref)
            self._check_timeouts()
            self._beat()
            if time.monotonic() - last_save > ELAPSED_SAVE_EVERY_S:
                self.db.update_study(self.study_id, elapsed_s=self._elapsed())
                last_save = time.monotonic()

    def _fill(self) -> bool:
        """Dispatch while workers have free slots. Returns True when no new trial may start."""
        exhausted = False
        while True:
            worker = self._free_worker()
            if worker is None:
                return exhausted or self._no_new_trials()
            if self._redispatch:
                self._dispatch(self._redispatch.popleft(), worker)
                continue
            if self._no_new_trials():
                return True
            work = self._ask()
            if work is None:
                return True
            self._dispatch(work, worker)

    def _no_new_trials(self) -> bool:
        if self._stop:
            return True
        if measured_count(self._counts, include_running=True) >= self.spec.budget.trials:
            return True
        if self._exhausted is not None:
            return True
        minutes = self.spec.budget.minutes
        if minutes is not None and self._elapsed() >= minutes * 60:
            return True
        if self._grid_sampler is not None and self._grid_sampler.is_exhausted(self._optuna):
            self._space_exhausted()
            return True
        return False

    def _space_exhausted(self, reason: str = EXHAUSTED) -> None:
        """Record why the study ends early (the grid sampler's end is its plan, not worth a message)."""
        if isinstance(self._grid_sampler, TunerSampler) and self._exhausted is None:
            self._exhausted = reason

    def _ask(self) -> _Work | None:
        """Ask Optuna until a statically feasible config comes (each rejection is recorded)."""
        for _ in range(STATIC_REJECT_LIMIT):
            trial = self._optuna.ask()
            try:
                config = self.compiled.space.suggest(trial)
            except SpaceExhausted as exc:  # nothing new to propose: the asked trial never ran
                self._optuna.tell(trial, state=optuna.trial.TrialState.FAIL)
                self._space_exhausted(f"the space is exhausted: {exc}")
                return None
            work = self._admit(trial.number, trial._trial_id, config)
            if work is not None:
                return work
            if self._exhausted is not None:
                return None
            if self._grid_sampler is not None and self._grid_sampler.is_exhausted(self._optuna):
                return None
        raise StudyFailed(f"{STATIC_REJECT_LIMIT} proposals in a row were statically infeasible; widen the space")

    def _admit(self, number: int, trial_id: int, config: dict[str, Any]) -> _Work | None:
        """Record a proposed config: as a trial to run, as a copy of an earlier identical trial, or as
        statically infeasible (both told at once)."""
        earlier = self._reusable.get(_config_key(config))
        if earlier is not None:
            self._pending.append(
                self.db.insert_op(self.study_id, number, config, optuna_trial_id=trial_id, copy_of=earlier)
            )
            self._flush()
            self._count(DUPLICATE, +1)
            self._duplicates_in_a_row += 1
            if self._duplicates_in_a_row >= DUPLICATE_LIMIT:
                self._exhausted = f"{DUPLICATE_LIMIT} proposals in a row repeated measured configs"
            self._tell(trial_id, number, earlier.status, earlier.metrics)
            return None
        self._duplicates_in_a_row = 0
        reason = self._static_reason(config)
        if reason is None:
            self._pending.append(self.db.insert_op(self.study_id, number, config, optuna_trial_id=trial_id))
            self._count(RUNNING, +1)
            return _Work(number, trial_id, config)
        status = TrialStatus.INFEASIBLE_STATIC.value
        self._pending.append(
            self.db.insert_op(self.study_id, number, config, optuna_trial_id=trial_id, status=status, error=reason)
        )
        self._flush()  # recorded before Optuna hears of it: a told trial always has its row
        self._count(status, +1)
        self._tell(trial_id, number, status, {})
        return None

    def _static_reason(self, config: dict[str, Any]) -> str | None:
        device = getattr(self, "device", None)
        device_fields = device.to_dict() if device else None
        reason = self.compiled.space.static_violation(config, device_fields)
        if reason is None and device is not None:
            reason = self.workload.static_check(config, device)
        return reason

    def _free_worker(self) -> _Worker | None:
        ready = [w for w in self._workers if w.ready and len(w.queue) < self._slots]
        return min(ready, key=lambda w: (len(w.queue), w.index)) if ready else None

    def _dispatch(self, work: _Work, worker: _Worker) -> None:
        seq = worker.next_seq
        worker.next_seq += 1
        work.worker, work.dispatched_at = worker, time.monotonic()
        work.ref = worker.actor.run_trial.remote(work.config, work.number, work.attempt, seq)
        worker.queue.append(work)
        self._inflight[work.ref] = work

    def _wait_timeout(self) -> float:
        now = time.monotonic()
        wait = self.poll_s
        for worker in self._workers:
            if worker.queue:
                wait = min(wait, max(0.0, self._deadline(worker) - now))
        return wait

    def _deadline(self, worker: _Worker) -> float:
        head = worker.queue[0]
        return max(head.dispatched_at, worker.last_done_at) + self.spec.budget.trial_timeout_s

    # results -----------------------------------------------------------------
    def _handle_ready(self, ref: Any) -> None:
        import ray

        worker = next((w for w in self._workers if not w.ready and w.ready_ref == ref), None)
        if worker is not None:
            self._await_ready(worker, timeout=1.0)
            return
        work = self._inflight.get(ref)
        if work is None:  # already settled with its worker's loss
            return
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            self._worker_lost(work.worker, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return
        except ray.exceptions.RayError as exc:
            result = {"status": TrialStatus.RUNTIME_ERROR.value, "metrics": {}, "error": str(exc)[-4000:]}
        worker = work.worker
        assert worker is not None
        del self._inflight[ref]
        if work in worker.queue:
            worker.queue.remove(work)
        worker.last_done_at = time.monotonic()
        self._finished_here += 1
        self._finish(work, result, worker.label)
        if result.get("replace_worker"):
            self._requeue_all(worker)
            self._replace(worker)

    def _finish(self, work: _Work, result: dict[str, Any], worker_label: str | None) -> None:
        status = result["status"]
        metrics = dict(result.get("metrics") or {})
        error = result.get("error")
        if status == TrialStatus.OK.value:
            missing = [m for m, _ in self.compiled.objectives if not _finite(metrics.get(m))]
            if missing:
                status = TrialStatus.RUNTIME_ERROR.value
                error = f"the workload reported no finite value for objective(s) {missing}"
        feasible = status == TrialStatus.OK.value and all(c.satisfied(metrics) for c in self.compiled.constraints)
        fingerprint = None
        if work.worker is not None:
            fingerprint = work.worker.info.get("fingerprint")
        write = self.db.finish_op(
            self.study_id,
            work.number,
            status=status,
            metrics=metrics,
            samples_ms=result.get("samples_ms") or [],
            feasible=feasible,
            timing_comparable=result.get("timing_comparable"),
            error=error,
            worker=worker_label,
            attempt=work.attempt,
            fingerprint=fingerprint,
        )
        self._pending.append(write)
        if status in REUSABLE:
            self._reusable[_config_key(work.config)] = _Reusable(number=work.number, **write.values)
        self._count(RUNNING, -1)
        self._count(status, +1)
        self._note_result(status, metrics, work.number, feasible)
        self._tell(work.optuna_trial_id, work.number, status, metrics)
        self._report(status)

    def _tell(self, trial_id: int | None, number: int, status: str, metrics: dict[str, Any]) -> None:
        ok = status == TrialStatus.OK.value
        violations = [c.violation(metrics) if ok else 1.0 for c in self.compiled.constraints]
        violations.append(0.0 if ok else 1.0)
        if ok:
            values = [float(metrics[m]) for m, _ in self.compiled.objectives]
        else:
            values = [self._penalty(m, d, metrics) for m, d in self.compiled.objectives]
        if trial_id is None:
            trial_id = self._optuna._storage.get_trial_id_from_study_id_trial_number(self._optuna._study_id, number)
        # TPE reads a trial without constraints as feasible, so satisfied ones need no write (a
        # transaction per trial saved); GP and NSGA-II want the same constraints on every trial.
        if self._constraints_on_every_trial or any(v > 0 for v in violations):
            try:
                self._optuna._storage.set_trial_system_attr(trial_id, CONSTRAINTS_ATTR, violations)
            except optuna.exceptions.UpdateFinishedTrialError:
                return  # told before a crash, re-run on resume: Optuna keeps its first answer
        self._optuna.tell(number, values, state=optuna.trial.TrialState.COMPLETE, skip_if_finished=True)

    def _penalty(self, metric: str, direction: str, metrics: dict[str, Any]) -> float:
        """A failed trial's stand-in value: the worst seen so far (constraints mark it infeasible)."""
        if metric in self._worst:
            return self._worst[metric]
        value = metrics.get(metric)
        return float(value) if _finite(value) else 0.0

    def _note_result(self, status: str, metrics: dict[str, Any], number: int, feasible: bool | None) -> None:
        if status != TrialStatus.OK.value:
            return
        for metric, direction in self.compiled.objectives:
            value = metrics.get(metric)
            if not _finite(value):
                continue
            worst = self._worst.get(metric)
            if worst is None or (value < worst if direction == "maximize" else value > worst):
                self._worst[metric] = float(value)
        primary, direction = self.compiled.objectives[0]
        value = metrics.get(primary)
        if feasible and _finite(value):
            sign = -1.0 if direction == "maximize" else 1.0
            if self._best is None or sign * value < sign * self._best[0]:
                self._best = (float(value), number)

    # the winner ----------------------------------------------------------------
    def _remeasure(self) -> None:
        """Time the best distinct configs again, interleaved A B C A B C ..., on one worker, and store each
        one's values and median: the default pick then goes by the medians (``pareto.best_trial``)."""
        import ray

        self._flush()  # the last results are in the table before the candidates are chosen
        metric, direction = self.compiled.objectives[0]
        rows = [
            t
            for t in self.db.trials(self.study_id)
            if t.status == "ok" and t.feasible and t.duplicate_of is None and _finite(t.metrics.get(metric))
        ]
        top_k = self.spec.remeasure.top_k
        if top_k is None:
            top_k = 5 if rows and all(t.timing_comparable for t in rows) else 0
        sign = -1.0 if direction == "maximize" else 1.0
        candidates = sorted(rows, key=lambda t: (sign * t.metrics[metric], t.number))[:top_k]
        worker = next((w for w in self._workers if w.ready and not w.queue), None)
        if len(candidates) < 2 or worker is None:
            return
        values: dict[int, list[float]] = {t.number: [] for t in candidates}
        for _ in range(self.spec.remeasure.rounds):
            for trial in candidates:
                if self._stop:
                    return
                seq = worker.next_seq
                worker.next_seq += 1
                ref = worker.actor.run_trial.remote(dict(trial.params), -1, 1, seq)
                try:
                    result = ray.get(ref, timeout=self.spec.budget.trial_timeout_s)
                except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
                    log.warning("re-measurement abandoned: %s", type(exc).__name__)
                    self._replace(worker)
                    return
                value = (result.get("metrics") or {}).get(metric)
                if result.get("status") == TrialStatus.OK.value and _finite(value):
                    values[trial.number].append(float(value))
                self._beat()
        for number, measured in values.items():
            if measured:
                data = {
                    "metric": metric,
                    "values": measured,
                    "median": statistics.median(measured),
                    "rounds": len(measured),
                }
                self._pending.append(TrialWrite("update", self.study_id, number, {"remeasured": data}))
        self._flush()

    # faults ------------------------------------------------------------------
    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.ready and worker.queue and now >= self._deadline(worker):
                head = worker.queue.popleft()
                del self._inflight[head.ref]
                self._requeue_all(worker)
                self._replace(worker)
                self._finish(
                    head,
                    {
                        "status": TrialStatus.TIMEOUT.value,
                        "metrics": {},
                        "error": f"no result within {self.spec.budget.trial_timeout_s:g} s; worker killed",
                    },
                    worker.label,
                )

    def _worker_lost(self, worker: _Worker | None, reason: str) -> None:
        assert worker is not None
        head = worker.queue.popleft()
        del self._inflight[head.ref]
        self._requeue_all(worker)
        self._replace(worker)
        if head.attempt < MAX_ATTEMPTS:
            log.warning("worker %s lost during trial %d (%s); retrying", worker.label, head.number, reason)
            head.attempt += 1
            self._redispatch.appendleft(head)
        else:
            error = f"worker died during the trial on each of {head.attempt} attempts: {reason}"
            self._finish(head, {"status": TrialStatus.WORKER_LOST.value, "metrics": {}, "error": error}, worker.label)

    def _requeue_all(self, worker: _Worker) -> None:
        """Trials queued behind a killed worker's current one go back to the front, same attempt."""
        while worker.queue:
            work = worker.queue.pop()
            self._inflight.pop(work.ref, None)
            self._redispatch.appendleft(work)

    # bookkeeping -------------------------------------------------------------
    def _flush(self) -> None:
        """Write pending trial rows in one transaction (several results and proposals at once)."""
        if self._pending:
            self.db.apply(self._pending)
            self._pending.clear()

    def _count(self, status: str, delta: int) -> None:
        self._counts[status] = self._counts.get(status, 0) + delta

    def _elapsed(self) -> float:
        return self._prior_elapsed + (time.monotonic() - self._run_started)

    def _report(self, last_status: str | None) -> None:
        if self.progress is None:
            return
        counts = self._counts
        static = counts.get(TrialStatus.INFEASIBLE_STATIC.value, 0)
        running = counts.get(RUNNING, 0)
        finished = measured_count(counts)
        failed = finished - counts.get(TrialStatus.OK.value, 0)
        remaining = max(0, self.spec.budget.trials - finished)
        eta = None
        if self._finished_here:
            eta = remaining * (time.monotonic() - self._run_started) / self._finished_here
        self.progress(
            Progress(
                study=self.spec.name,
                budget_trials=self.spec.budget.trials,
                finished=finished,
                failed=failed,
                infeasible_static=static,
                running=running,
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
    feasible: bool
    timing_comparable: bool | None
    fingerprint: dict[str, Any] | None
    error: str | None = None
    worker: str | None = None
    attempt: int = 1
    finished_at: Any = None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
