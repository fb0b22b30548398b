"""Multi-GPU trials: a gang worker that runs each trial as k fresh rank processes in one process group.

The orchestrator spawns :class:`GangWorker` (a Ray actor holding ``resources.gpus_per_trial = k``
GPUs of one node, or a CPU slot) when k > 1, with one trial in flight per gang. For each trial
:func:`run_gang` starts k processes (``python -m tuner.run.gang_rank``, :mod:`tuner.run.gang_rank`), each in
a session of its own, with the trial's environment:

- the workload's ``trial_env(config)`` (the NCCL knobs: NCCL reads them when the communicator is
  created, several only once per process, so a fresh process per trial is the honest way); a knob
  left at "default" is removed from the inherited environment. The variables that keep NVLink
  multicast off (``objectives.collective.PROTECTED_ENV``) are inherited and never touched;
- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1`` and a free ``MASTER_PORT``;
- the actor's ``CUDA_VISIBLE_DEVICES`` (Ray's k GPUs) and rank r binds GPU r of them (NCCL
  backend); on a CPU the gloo backend, where the NCCL knobs are recorded but inert.

Each rank checks its own numerics and writes its result; rank 0's result is the trial's, unless a
rank failed. Faults:

- a hung collective ends by the process-group timeout (``timeout_s`` arg of the workload, else 0.4 x
  ``budget.trial_timeout_s`` within [5, 60] s): the rank stuck in it reports ``timeout``; any rank
  still running :data:`GRACE_S` after another one failed is killed (its process group, SIGKILL);
- a rank that exits non-zero without a result (a crash, ``os._exit``) makes the trial
  ``worker_lost``: the rank process is this trial's worker, and it died (``timeout`` when its log
  shows the NCCL watchdog's collective timeout, which aborts the process);
- past :func:`gang_deadline_s` (before the orchestrator's own trial timeout) every rank is killed
  and the trial is ``timeout``.

The gang worker itself holds no communicator and no trial state: after any of these it takes the
next trial, and its GPUs are free again once the rank processes are gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuner.run.supervisor import without_secrets
from tuner.run.worker import DispatchOrder
from tuner.workloads.base import RESULT_VERSION, DeviceInfo, TrialReport, TrialStatus, Workload
from tuner.workloads.failures import short_error
from tuner.workloads.registry import workload_class

#: Seconds the other ranks get to finish after one rank failed, before they are killed.
GRACE_S = 1.5
#: Poll period of the rank processes (seconds).
POLL_S = 0.02
#: Variables a trial never sets (NVLink multicast stays off); kept in step with objectives.collective.
PROTECTED_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRIAL_TIMEOUT_S = 300.0


def pg_timeout_s(workload: Workload, trial_timeout_s: float) -> float:
    """The process-group timeout of a trial: the workload's ``timeout_s``, else 0.4 x the trial timeout in [5, 60]."""
    explicit = workload.timeout_s
    if explicit:
        return float(explicit)
    return min(60.0, max(5.0, 0.4 * trial_timeout_s))


def gang_deadline_s(trial_timeout_s: float) -> float:
    """How long the gang lets a trial's ranks run: a little under the orchestrator's trial timeout,
    so that the gang ends the ranks itself and reports ``timeout`` while the actor stays alive."""
    return max(1.0, min(0.9 * trial_timeout_s, trial_timeout_s - 2.0))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_env(
    base: dict[str, str], trial_env: dict[str, str | None], rank: int, world_size: int, port: int
) -> dict[str, str]:
    """The environment of rank ``rank``: ``base`` with the trial's variables (None = unset) and the
    rendezvous; the protected NVLink-multicast variables are kept as inherited whatever the trial says."""
    env = dict(base)
    for key, value in trial_env.items():
        if key in PROTECTED_ENV:
            continue
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), base.get("PYTHONPATH", "")) if p),
        }
    )
    return env


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-chars:]


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_gang(
    workload_name: str,
    args: dict[str, Any],
    config: dict[str, Any],
    world_size: int,
    *,
    backend: str,
    trial_number: int = -1,
    attempt: int = 1,
    trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S,
    workload: Workload | None = None,
) -> TrialReport:
    """Run one trial as ``world_size`` rank processes; the trial's result dict (``worker.result_to_dict``
    keys plus ``ranks``: each rank's status). Usable without Ray (the benchmark scripts re-measure with it)."""
    if workload is None:
        workload = workload_class(workload_name)(**args)
    trial_env = workload.trial_env(config)
    timeout_s = pg_timeout_s(workload, trial_timeout_s)
    deadline_s = gang_deadline_s(trial_timeout_s)
    folder = Path(tempfile.mkdtemp(prefix="tuner-gang-"))
    job = {
        "workload": workload_name,
        "args": args,
        "config": config,
        "trial_number": trial_number,
        "attempt": attempt,
        "backend": backend,
        "timeout_s": timeout_s,
    }
    job_path = folder / "job.json"
    job_path.write_text(json.dumps(job, default=str))
    procs: list[subprocess.Popen] = []
    logs = [folder / f"rank{r}.log" for r in range(world_size)]
    results_paths = [folder / f"rank{r}.json" for r in range(world_size)]
    try:
        _spawn_ranks(procs, job_path, trial_env, world_size, logs)
        killed, timed_out = _watch(procs, results_paths, time.monotonic(), deadline_s)
        results = [_read_result(path) for path in results_paths]
        codes = [p.returncode for p in procs]
        return _merge(results, codes, killed, timed_out, deadline_s, timeout_s, logs)
    finally:
        for p in procs:
            _kill(p)
        shutil.rmtree(folder, ignore_errors=True)


def _spawn_ranks(
    procs: list[subprocess.Popen], job_path: Path, trial_env: dict[str, str | None], world_size: int, logs: list[Path]
) -> None:
    """Start the rank processes (appended to ``procs`` as they start, so the caller can kill them all)."""
    port = free_port()
    base = without_secrets(dict(os.environ))
    for rank in range(world_size):
        with open(logs[rank], "wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tuner.run.gang_rank", str(job_path)],
                    env=rank_env(base, trial_env, rank, world_size, port),
                    cwd=str(REPO_ROOT),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )


def _watch(
    procs: list[subprocess.Popen], results_paths: list[Path], started: float, deadline_s: float
) -> tuple[set[int], bool]:
    """Wait for every rank to exit; once one has failed, the rest get ``GRACE_S`` to exit on their own, and
    none outlives the deadline. Returns the ranks killed and whether the deadline passed."""
    killed: set[int] = set()
    first_failure: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return killed, False
        now = time.monotonic()
        if first_failure is None and _a_rank_failed(codes, results_paths):
            first_failure = now
        graced = first_failure is not None and now - first_failure > GRACE_S
        overdue = now - started > deadline_s
        if graced or overdue:
            for rank, p in enumerate(procs):
                if p.poll() is None:
                    killed.add(rank)
                    _kill(p)
            return killed, overdue and not graced  # a failure past its grace is that failure, not a timeout
        time.sleep(POLL_S)


def _a_rank_failed(codes: list[int | None], results_paths: list[Path]) -> bool:
    for rank, code in enumerate(codes):
        if code is None:
            continue
        result = _read_result(results_paths[rank])
        if code != 0 or result is None or result.get("status") != TrialStatus.OK.value:
            return True
    return False


def _merge(
    results: list[dict[str, Any] | None],
    codes: list[int | None],
    killed: set[int],
    timed_out: bool,
    deadline_s: float,
    timeout_s: float,
    logs: list[Path],
) -> TrialReport:
    """One trial result from the ranks' results and exit codes (see the module docstring)."""
    ranks = [
        {"rank": r, "status": (res or {}).get("status"), "exit_code": codes[r], "killed": r in killed}
        for r, res in enumerate(results)
    ]

    def failed(status: str, error: str, base: dict[str, Any] | None = None) -> TrialReport:
        out = no_result(status, error)
        if base:
            out.update({k: base[k] for k in ("metrics", "samples_ms", "timing_comparable", "extra") if k in base})
        out["ranks"] = ranks
        return out

    if timed_out:
        running = sorted(killed)
        return failed(
            TrialStatus.TIMEOUT.value,
            f"no result within {deadline_s:g} s: ranks {running} still running were killed "
            f"(process-group timeout {timeout_s:g} s)\n" + _tail(logs[running[0]] if running else logs[0]),
        )
    # A rank that died without a result is the cause; the others' errors follow from it.
    for r, res in enumerate(results):
        if res is None and r not in killed:
            log = _tail(logs[r])
            code = codes[r]
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            if any(t in log.lower() for t in ("watchdog caught collective", "collective operation timeout")):
                return failed(TrialStatus.TIMEOUT.value, f"rank {r} aborted by the NCCL watchdog ({how})\n{log}")
            return failed(TrialStatus.WORKER_LOST.value, f"rank {r} died during the trial ({how})\n{log}")
    failures = [(r, res) for r, res in enumerate(results) if res is not None and res["status"] != TrialStatus.OK.value]
    if failures:
        timeouts = [(r, res) for r, res in failures if res["status"] == TrialStatus.TIMEOUT.value]
        rank, res = (timeouts or failures)[0]
        note = f"; ranks {sorted(killed)} killed after it" if killed else ""
        return failed(res["status"], f"rank {rank}: {res.get('error') or res['status']}{note}", res)
    if any(res is None for res in results):  # killed without any rank failing: cannot happen, kept safe
        return failed(TrialStatus.WORKER_LOST.value, f"ranks {sorted(killed)} gave no result")
    out = dict(results[0] or {})
    out.pop("rank", None)
    out["ranks"] = ranks
    return out  # type: ignore[return-value]


def no_result(status: str, error: str) -> TrialReport:
    """The report of a multi-GPU trial that ended without a rank's measurement."""
    return {
        "version": RESULT_VERSION,
        "status": status,
        "metrics": {},
        "samples_ms": [],
        "error": short_error(error),
        "timing_comparable": None,
        "extra": {},
    }


class GangWorker:
    """A multi-GPU trial worker with :class:`tuner.run.worker.TrialWorker`'s interface. Plain class; the
    orchestrator wraps it with ``ray.remote(num_gpus=k)``. One trial at a time, in dispatch order."""

    def __init__(
        self, workload: str, args: dict[str, Any], label: str, world_size: int = 2, trial_timeout_s: float | None = None
    ) -> None:
        from tuner.workloads.fingerprint import device_info, fingerprint

        self.label = label
        self.workload_name = workload
        self.args = dict(args)
        self.workload = workload_class(workload)(**args)
        self.world_size = int(world_size)
        self.trial_timeout_s = float(trial_timeout_s or DEFAULT_TRIAL_TIMEOUT_S)
        self.device: DeviceInfo = device_info()
        self.backend = "nccl" if self.device.is_gpu else "gloo"
        if self.device.is_gpu:
            import torch

            visible = torch.cuda.device_count()
            if visible < self.world_size:
                raise RuntimeError(f"gang of {self.world_size} ranks sees {visible} GPU(s)")
        self.fingerprint = {**fingerprint(), "world_size": self.world_size, "backend": self.backend}
        self._order = DispatchOrder()

    def describe(self) -> dict[str, Any]:
        note = None
        if self.backend == "gloo":
            note = "gloo backend on CPU: the NCCL_* knobs are recorded but inert"
        return {
            "label": self.label,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "device": self.device.to_dict(),
            "fingerprint": self.fingerprint,
            "roofline": None,
            "gang": {"world_size": self.world_size, "backend": self.backend, "note": note},
        }

    def reset_sequence(self, next_seq: int) -> None:
        self._order.reset(next_seq)

    def run_trial(self, config: dict[str, Any], trial_number: int, attempt: int, seq: int) -> TrialReport:
        started = time.time()
        with self._order.turn(seq):
            reason = self.workload.static_check(config, self.device)
            if reason is not None:
                out = no_result(TrialStatus.INFEASIBLE_STATIC.value, reason)
            else:
                out = run_gang(
                    self.workload_name,
                    self.args,
                    config,
                    self.world_size,
                    backend=self.backend,
                    trial_number=trial_number,
                    attempt=attempt,
                    trial_timeout_s=self.trial_timeout_s,
                    workload=self.workload,
                )
        out["worker"] = self.label
        out["duration_s"] = time.time() - started
        out["replace_worker"] = False  # the ranks were fresh processes; nothing of the trial stays here
        return out
