"""The worker pool: long-lived Ray actors that run trials, and what happens when one fails.

One actor per GPU (CPU actors when there is none), or for trials of k ranks one
gang actor per k GPUs (``tuner/run/gang.py``). Each holds up to ``slots`` trials,
run in dispatch order. The pool turns every failure into a trial outcome:

- a trial that holds its worker longer than ``budget.trial_timeout_s`` gets the
  worker killed and replaced (``timeout``);
- a worker that dies mid-trial is replaced and the trial retried once
  (``worker_lost`` if it dies again); other trials queued on it are re-sent;
- exceptions and wrong numerics come back from the worker as statuses.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from tuner.run.session import StudyFailed
from tuner.run.supervisor import SECRET_ENV
from tuner.workloads.base import TrialStatus, read_report

log = logging.getLogger("tuner.run.orchestrator")
MAX_ATTEMPTS = 2
MAX_WORKER_START_FAILURES = 3
WORKER_START_TIMEOUT_S = 300.0


def _load(worker: Worker) -> tuple[int, int]:
    return (len(worker.queue), worker.index)


def ensure_ray(address: str | None = None, min_cpus: int = 2) -> None:
    """Join ``address`` (else ``$RAY_ADDRESS``) or start a local Ray sized to the machine, unless Ray is up.

    The local Ray is a new instance even when a cluster started with ``ray start`` runs on this
    machine (``address="local"``): without an address, ``ray.init`` would join that cluster, and
    refuse the CPU count. It serves this machine only, so everything it starts (GCS, raylet, agents,
    metrics, workers) listens on loopback, and it has no dashboard. Ray listens on every interface for a
    node whose IP is not loopback, and on Linux it takes the machine's address as the node's unless Ray
    clusters are off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), which a local Ray sets. Its processes
    start without ``SECRET_ENV`` (the API token): no trial worker has it.
    """
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when ray is imported, and by its processes
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if address:
        ray.init(address=address, **kwargs)
    else:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False  # where ray was imported before the variable was set
        # Ray's processes (and so every trial worker) take the environment as it is now: without the secrets.
        secrets = {name: os.environ.pop(name) for name in SECRET_ENV if name in os.environ}
        try:
            ray.init(
                address="local",
                num_cpus=max(os.cpu_count() or 1, min_cpus) + 1,
                _node_ip_address="127.0.0.1",
                dashboard_host="127.0.0.1",
                **kwargs,
            )
        finally:
            os.environ.update(secrets)


@dataclass
class Work:
    """A trial to dispatch or in flight."""

    number: int
    config: dict[str, Any]
    attempt: int = 1
    dispatched_at: float = 0.0
    worker: Worker | None = None
    ref: Any = None


@dataclass
class Worker:
    index: int
    generation: int
    actor: Any
    ready_ref: Any
    ready: bool = False
    next_seq: int = 0
    queue: deque[Work] = field(default_factory=deque)
    last_done_at: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"w{self.index}.{self.generation}"


@dataclass
class Outcome:
    """A trial that ended: the worker's result (or the pool's verdict), and who ran it."""

    work: Work
    result: dict[str, Any]
    worker_label: str
    fingerprint: dict[str, Any] | None


class WorkerPool:
    """The study's Ray actors. Not thread-safe; the orchestrator's loop is its only caller."""

    def __init__(
        self,
        compiled: Any,
        workload: Any,
        workers: int | None,
        trials_per_worker: int | None,
        resource_share: float = 1.0,
    ) -> None:
        """``resource_share``: the fraction of a CPU (and of each GPU) an actor reserves in Ray, below 1 when
        a runner runs several studies at once (each with its own actors on the same devices; who uses a
        device when is :mod:`tuner.run.fair`'s)."""
        self.spec = compiled.spec
        self.workload = workload
        self.requested_workers = workers
        self.requested_slots = trials_per_worker
        self.gang = self.spec.resources.gpus_per_trial > 1  # trials of k ranks (tuner/run/gang.py)
        self.workers: list[Worker] = []
        self.inflight: dict[Any, Work] = {}
        self.redispatch: deque[Work] = deque()  # trials to send again, first in line
        self.share = resource_share
        self.gpu = False
        self.slots = 1
        self._start_failures = 0

    # start and stop ------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        """Start the actors and wait until they are ready; returns the first one's description."""
        import ray

        gpus = int(ray.cluster_resources().get("GPU", 0))
        k = self.spec.resources.gpus_per_trial
        if self.gang:
            # A gang of k GPUs runs one trial at a time as k fresh rank processes (tuner/run/gang.py);
            # on a CPU each gang runs k gloo ranks.
            if gpus and gpus < k:
                raise StudyFailed(f"resources.gpus_per_trial={k} but the cluster has {gpus} GPU(s)")
            n = min(self.requested_workers or gpus // k, gpus // k) if gpus else (self.requested_workers or 1)
        elif gpus:
            n = min(self.requested_workers or gpus, gpus)
        else:
            n = self.requested_workers or 2
        self.gpu = gpus > 0
        # On a GPU, the workload's trials_in_flight per worker: for kernels, while one is timed the
        # others compile on the worker's threads (Triton's compiler and ptxas run in parallel).
        in_flight = self.workload.trials_in_flight if self.gpu else 1
        self.slots = 1 if self.gang else self.requested_slots or in_flight
        self.workers = [self._spawn(i, 0) for i in range(n)]
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        for worker in self.workers:
            self._await_ready(worker, timeout=max(1.0, deadline - time.monotonic()))
        infos = [w.info for w in self.workers if w.ready]
        if not infos:
            raise StudyFailed("no worker could start")
        return infos[0]

    def kill_all(self) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker.actor, no_restart=True)
        self.workers.clear()

    def _spawn(self, index: int, generation: int) -> Worker:
        import ray

        options: dict[str, Any] = {
            "num_cpus": self.share,
            # a gang's ranks take whole GPUs (Ray has no fraction of several GPUs)
            "num_gpus": (self.spec.resources.gpus_per_trial if self.gang else self.share) if self.gpu else 0,
            "max_concurrency": self.slots + 1,
            "max_restarts": 0,
        }
        if not self.gpu:
            options["runtime_env"] = {"env_vars": {"TRITON_INTERPRET": "1"}}
        label = f"w{index}.{generation}"
        if self.gang:
            from tuner.run.gang import GangWorker

            k, timeout_s = self.spec.resources.gpus_per_trial, self.spec.budget.trial_timeout_s
            actor = (
                ray.remote(GangWorker)
                .options(**options)
                .remote(self.spec.workload, self.spec.args, label, k, timeout_s)
            )
        else:
            from tuner.run.worker import TrialWorker

            actor = ray.remote(TrialWorker).options(**options).remote(self.spec.workload, self.spec.args, label)
        return Worker(index=index, generation=generation, actor=actor, ready_ref=actor.describe.remote())

    def _await_ready(self, worker: Worker, timeout: float) -> None:
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
            self.replace(worker)

    def replace(self, worker: Worker) -> None:
        """Kill ``worker`` and start a fresh one in its place (it becomes ready later, in ``poll``)."""
        import ray

        ray.kill(worker.actor, no_restart=True)
        fresh = self._spawn(worker.index, worker.generation + 1)
        self.workers[self.workers.index(worker)] = fresh

    # dispatch ------------------------------------------------------------------
    def free_worker(self, may_use: Callable[[Worker], bool] | None = None) -> Worker | None:
        """The ready worker with the fewest queued trials and a free slot (that ``may_use`` accepts)."""
        ready = sorted((w for w in self.workers if w.ready and len(w.queue) < self.slots), key=_load)
        return next((w for w in ready if may_use is None or may_use(w)), None)

    def slot_key(self, worker: Worker) -> Hashable:
        """The device ``worker`` runs on, as the studies of one runner share it (:mod:`tuner.run.fair`)."""
        gpu_ids = worker.info.get("gpu_ids")
        if self.gpu and gpu_ids:
            return ("gpu", worker.info.get("host"), tuple(str(g) for g in gpu_ids))
        return ("worker", worker.index)

    def queued_by_key(self) -> dict[Hashable, int]:
        counts: dict[Hashable, int] = {}
        for worker in self.workers:
            if worker.queue:
                key = self.slot_key(worker)
                counts[key] = counts.get(key, 0) + len(worker.queue)
        return counts

    def idle_worker(self) -> Worker | None:
        return next((w for w in self.workers if w.ready and not w.queue), None)

    def dispatch(self, work: Work, worker: Worker) -> None:
        work.worker, work.dispatched_at = worker, time.monotonic()
        work.ref = worker.actor.run_trial.remote(work.config, work.number, work.attempt, self._next_seq(worker))
        worker.queue.append(work)
        self.inflight[work.ref] = work

    def _next_seq(self, worker: Worker) -> int:
        worker.next_seq += 1
        return worker.next_seq - 1

    def busy(self) -> bool:
        """Whether anything is in flight or waiting to be sent again."""
        return bool(self.inflight or self.redispatch)

    def run_now(self, worker: Worker, config: dict[str, Any]) -> dict[str, Any] | None:
        """Run ``config`` on an idle worker and wait for it (re-measurement); None when the worker timed
        out or died (it is replaced)."""
        import ray

        ref = worker.actor.run_trial.remote(dict(config), -1, 1, self._next_seq(worker))
        try:
            return dict(read_report(ray.get(ref, timeout=self.spec.budget.trial_timeout_s)))
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
            log.warning("re-measurement abandoned: %s", type(exc).__name__)
            self.replace(worker)
            return None

    # results -------------------------------------------------------------------
    def poll(self, timeout_s: float) -> list[Outcome] | None:
        """Wait up to ``timeout_s`` (less when a trial's deadline comes first) for results, then settle
        timeouts. Returns the trials that ended, or None when there is nothing to wait for."""
        import ray

        refs = list(self.inflight) + [w.ready_ref for w in self.workers if not w.ready]
        if not refs:
            return None
        # One at a time: the loop commits, tells and refills that trial's slot before it takes the next
        # result (others already done come back at once on the next poll), so a result waits on one
        # trial's bookkeeping, not on a batch's.
        ready, _ = ray.wait(refs, num_returns=1, timeout=self._wait_timeout(timeout_s))
        outcomes: list[Outcome] = []
        for ref in ready:
            self._handle_ready(ref, outcomes)
        self._check_timeouts(outcomes)
        return outcomes

    def _wait_timeout(self, timeout_s: float) -> float:
        now = time.monotonic()
        for worker in self.workers:
            if worker.queue:
                timeout_s = min(timeout_s, max(0.0, self._deadline(worker) - now))
        return timeout_s

    def _deadline(self, worker: Worker) -> float:
        head = worker.queue[0]
        return max(head.dispatched_at, worker.last_done_at) + self.spec.budget.trial_timeout_s

    def _handle_ready(self, ref: Any, outcomes: list[Outcome]) -> None:
        import ray

        starting = next((w for w in self.workers if not w.ready and w.ready_ref == ref), None)
        if starting is not None:
            self._await_ready(starting, timeout=1.0)
            return
        work = self.inflight.get(ref)
        if work is None:  # already settled with its worker's loss
            return
        try:
            result = dict(read_report(ray.get(ref)))
        except ray.exceptions.RayActorError as exc:
            self._worker_lost(work.worker, str(exc).splitlines()[0] if str(exc) else type(exc).__name__, outcomes)
            return
        except ray.exceptions.RayError as exc:
            result = {"status": TrialStatus.RUNTIME_ERROR.value, "metrics": {}, "error": str(exc)[-4000:]}
        worker = work.worker
        assert worker is not None
        del self.inflight[ref]
        if work in worker.queue:
            worker.queue.remove(work)
        worker.last_done_at = time.monotonic()
        outcomes.append(Outcome(work, result, worker.label, worker.info.get("fingerprint")))
        if result.get("replace_worker"):
            self._requeue_all(worker)
            self.replace(worker)

    def _check_timeouts(self, outcomes: list[Outcome]) -> None:
        now = time.monotonic()
        timeout_s = self.spec.budget.trial_timeout_s
        for worker in list(self.workers):
            if worker.ready and worker.queue and now >= self._deadline(worker):
                head = worker.queue.popleft()
                del self.inflight[head.ref]
                self._requeue_all(worker)
                self.replace(worker)
                error = f"no result within {timeout_s:g} s; worker killed"
                result = {"status": TrialStatus.TIMEOUT.value, "metrics": {}, "error": error}
                outcomes.append(Outcome(head, result, worker.label, worker.info.get("fingerprint")))

    def _worker_lost(self, worker: Worker | None, reason: str, outcomes: list[Outcome]) -> None:
        assert worker is not None
        head = worker.queue.popleft()
        del self.inflight[head.ref]
        self._requeue_all(worker)
        self.replace(worker)
        if head.attempt < MAX_ATTEMPTS:
            log.warning("worker %s lost during trial %d (%s); retrying", worker.label, head.number, reason)
            head.attempt += 1
            self.redispatch.appendleft(head)
        else:
            error = f"worker died during the trial on each of {head.attempt} attempts: {reason}"
            result = {"status": TrialStatus.WORKER_LOST.value, "metrics": {}, "error": error}
            outcomes.append(Outcome(head, result, worker.label, worker.info.get("fingerprint")))

    def _requeue_all(self, worker: Worker) -> None:
        """Trials queued behind a killed worker's current one go back to the front, same attempt."""
        while worker.queue:
            work = worker.queue.pop()
            self.inflight.pop(work.ref, None)
            self.redispatch.appendleft(work)
