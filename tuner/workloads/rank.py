"""Multi-GPU workloads: a trial that runs as ``world_size`` rank processes in one process group.

:class:`RankWorkload` is the trial template (:mod:`tuner.workloads.template`) run by every rank alike
(``objectives/collective.py``, ``ddp_step.py``): the gang worker (:mod:`tuner.run.gang`) starts the
ranks with the trial's environment (``trial_env``: NCCL reads its knobs when the communicator is
created), each rank joins the process group (:mod:`tuner.run.gang_rank`), and the template's scope is
that group -- or, for a standalone one-rank run (a test, a script), a group of one that it creates
and destroys. Every rank checks its own numerics; hooks that call collectives (:func:`agree_on_failure`,
:func:`slowest`) must be reached by all ranks in the same order, which the template guarantees as
long as the ranks take the same branches (decide them on all-reduced values).

torch is imported inside the functions: the registry, ``__init__`` and ``static_check`` stay light.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus
from tuner.workloads.failures import TrialFailure
from tuner.workloads.template import MeasuredWorkload


class RankWorkload(MeasuredWorkload):
    """A workload whose trial runs as ``world_size`` rank processes in one process group.

    ``world_size`` (and ``timeout_s``, the process-group timeout) are args of the subclass, set in its
    ``__init__``; ``trial_env`` gives the ranks' environment. While a trial runs, ``trial_ctx`` is its
    context (a rank process runs one trial at a time).
    """

    multi_gpu: ClassVar[bool] = True

    def __init__(self, **args: Any) -> None:
        super().__init__(**args)
        self.trial_ctx = TrialContext()

    @contextlib.contextmanager
    def _scope(self, config: dict[str, Any], device: DeviceInfo, ctx: TrialContext) -> Iterator[dict[str, Any]]:
        """The trial's process group (the gang's, or a group of one); a world the process cannot
        provide is a ``runtime_error`` naming ``resources.gpus_per_trial``, not a hang."""
        with process_group(self.world_size, device) as error:
            if error is not None:
                raise TrialFailure(TrialStatus.RUNTIME_ERROR, error)
            self.trial_ctx = ctx
            try:
                yield {}
            finally:
                self.trial_ctx = TrialContext()


class process_group:  # a context manager named like a function
    """Use the process group of a gang rank, or create a one-rank group for a standalone run.

    Yields None, or an error string when ``world_size`` ranks are needed but this process is alone
    (or in a group of another size). A group this context created is destroyed on exit.
    """

    def __init__(self, world_size: int, device: DeviceInfo) -> None:
        self.world_size = world_size
        self.device = device
        self.owned = False

    def __enter__(self) -> str | None:
        import torch.distributed as dist

        if dist.is_initialized():
            size = dist.get_world_size()
            if size != self.world_size:
                return f"args.world_size={self.world_size} but the process group has {size} ranks"
            return None
        if self.world_size != 1:
            return (
                f"world_size={self.world_size} needs a process group of {self.world_size} ranks: run the study "
                f"with resources.gpus_per_trial: {self.world_size} (the gang worker starts the ranks)"
            )
        backend = "nccl" if self.device.is_gpu else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        self.owned = True
        return None

    def __exit__(self, *exc: Any) -> None:
        if self.owned:
            import torch.distributed as dist

            dist.destroy_process_group()


def agree_on_failure(failed: bool, device: Any) -> bool:
    """Whether any rank failed (a MAX all-reduce of the flag), so that no rank times collectives alone."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if failed else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def slowest(value: float, device: Any) -> float:
    """The largest ``value`` over the ranks (a MAX all-reduce)."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([float(value)], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())
