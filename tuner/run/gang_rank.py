"""One rank of a multi-GPU trial: ``python -m tuner.run.gang_rank JOB.json``, started by :mod:`tuner.run.gang`.

The process reads the job (workload, args, config, trial number, backend, process-group timeout),
joins the trial's process group (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` from its
environment, which also holds the config's NCCL variables: NCCL reads them when the communicator is
created), binds GPU ``LOCAL_RANK`` on the NCCL backend, runs the workload's ``run`` and writes its
result as JSON to ``rank<RANK>.json`` beside the job file. Exceptions become statuses here (a
process-group timeout is ``timeout``). It then leaves with ``os._exit(0)`` so that no teardown of a
broken communicator can hang, and it kills itself when the gang worker that started it dies.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from tuner.run.worker import result_to_dict
from tuner.workloads.base import TrialContext, TrialResult
from tuner.workloads.failures import classify_exception, short_error

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """End this rank when the gang worker's process goes (SIGKILL from the kernel, or a watch thread)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(PR_SET_PDEATHSIG, 9)
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def run_rank(job: dict[str, Any], rank: int, world_size: int, local_rank: int) -> TrialResult:
    """Join the group, run the workload on this rank's device, return its result (never raises)."""
    try:
        import torch
        import torch.distributed as dist

        from tuner.workloads.fingerprint import device_info
        from tuner.workloads.registry import workload_class

        backend = job["backend"]
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=dt.timedelta(seconds=float(job["timeout_s"]))
        )
        workload = workload_class(job["workload"])(**job["args"])
        ctx = TrialContext(trial_number=int(job["trial_number"]), attempt=int(job["attempt"]))
        return workload.run(job["config"], device_info(), ctx)
    except Exception as exc:
        return TrialResult(
            status=classify_exception(exc, process_group=True), error=short_error(traceback.format_exc())
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job_path = Path(argv[0])
    _die_with_parent()
    job = json.loads(job_path.read_text())
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    result = run_rank(job, rank, world_size, local_rank)
    out = result_to_dict(result)
    out["rank"] = rank
    out["replace_worker"] = bool(result.extra.get("replace_worker", False))
    target = job_path.parent / f"rank{rank}.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, default=str))
    os.replace(tmp, target)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
