"""The ``ddp_step`` workload: a data-parallel training step of the GPT in ``models/gpt.py`` over a multi-GPU trial.

Each of the ``world_size`` ranks (processes started by :mod:`tuner.run.gang`, one per GPU) holds the model
wrapped in ``torch.nn.parallel.DistributedDataParallel`` and trains on its shard of the global batch
(``batch_per_rank`` sequences each); DDP all-reduces the gradients in buckets while backward runs.
Knobs (``search_spaces/ddp_step.yaml``): ``bucket_cap_mb`` (MB of gradients per all-reduce bucket),
``gradient_as_bucket_view`` (gradients are views into the buckets: no copy, less memory),
``static_graph`` (DDP caches the graph's used parameters and bucket order after the first step),
``comm_hook`` (``none``, or bf16 / fp16 compression of the gradients before the all-reduce:
``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``) and the NCCL knobs of the
``collective`` workload (environment variables set before the communicator is created; inert on
the gloo backend of a CPU). The NVLink-multicast variables are never set (``objectives.collective``).

One trial: a fresh model from ``seed`` on every rank (identical replicas), AdamW; ``warmup_steps``
untimed steps, then ``steps`` timed ones in :meth:`DDPStep._launch`. Step ``n`` trains on rows
``[rank * batch_per_rank, (rank + 1) * batch_per_rank)`` of ``synthetic_batch(cfg, world_size *
batch_per_rank, seed + 1 + n)``. Metrics:

- ``step_ms``: median step time on the slowest rank (CUDA events between steps, ``perf_counter`` on a
  CPU; a MAX all-reduce over the ranks); ``tokens_per_s`` = ``world_size * batch_per_rank * seq_len``
  / step time.
- ``loss_delta``: the final step's loss (mean over the ranks) minus that of the same run without a
  comm hook (same seed, data and knobs), run in the same trial when a hook is set; 0 without a hook.

Numerics: NaN/inf in the final loss on any rank is ``numerics_fail`` (``run`` sets it to NaN before
``_launch``, so a ``_launch`` that does nothing fails); so is a replica that differs from the others
after the steps (a parameter checksum compared by MIN/MAX all-reduces: DDP keeps replicas equal).
Faults (``faults`` arg, on rank 1): ``hang`` never joins the first step's gradient all-reduce,
``die`` exits at once, as in ``objectives/collective.py``.

torch is imported inside the methods: the registry, ``__init__`` and ``static_check`` stay light.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from models.config import PRESETS, model_flops_per_token, resolve_config
from objectives.collective import (
    inject_fault,
    nccl_env,
    nccl_static_check,
    parse_faults,
    set_nccl_env,
)
from tuner.workloads.base import DeviceInfo, MetricSpec, missing_params
from tuner.workloads.measure import Timing, step_intervals_ms, timed_steps
from tuner.workloads.rank import RankWorkload, agree_on_failure, slowest
from tuner.workloads.template import Checked

COMM_HOOKS: tuple[str, ...] = ("none", "bf16", "fp16")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
DDP_KNOBS: tuple[str, ...] = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "comm_hook")


def _int_arg(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


@dataclass
class _Case:
    """One rank's replica, optimizer, data shards and step bookkeeping (fresh per trial)."""

    ddp: Any
    optimizer: Any
    batches: list[tuple[Any, Any]]
    device: Any
    autocast_dtype: Any | None
    step: int = 0
    losses: list[Any] = field(default_factory=list)
    marks: list[Any] = field(default_factory=list)
    final_loss: Any = math.nan
    rank: int = 0
    world_size: int = 1
    samples_ms: list[float] = field(default_factory=list)


class DDPStep(RankWorkload):
    """Data-parallel training steps of a GPT under one setting of the DDP and NCCL knobs."""

    name: ClassVar[str] = "ddp_step"
    shape_args: ClassVar[tuple[str, ...]] = ("model", "batch_per_rank", "world_size")
    shape_exact: ClassVar[tuple[str, ...]] = ("world_size",)
    unkeyed_args: ClassVar[tuple[str, ...]] = ("seed", "steps", "warmup_steps", "lr", "timeout_s", "faults")
    space_file: ClassVar[str] = "ddp_step.yaml"
    description: ClassVar[str] = (
        "Data-parallel (DDP) training step of the GPT over a multi-GPU trial: bucket size, gradient as bucket "
        "view, static graph, bf16/fp16 gradient compression, NCCL knobs"
    )
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("step_ms", "minimize", "ms", "median optimizer step time on the slowest rank"),
        MetricSpec("tokens_per_s", "maximize", "tokens/s", "world_size * batch_per_rank * seq_len / step_ms"),
        MetricSpec(
            "loss_delta",
            "minimize",
            "nats",
            "final loss (mean over ranks) minus that of the same run without a comm hook; 0 without a hook",
        ),
    )

    def __init__(
        self,
        model: str | dict[str, Any] = "tiny",
        batch_per_rank: int = 2,
        steps: int = 5,
        warmup_steps: int = 2,
        world_size: int = 2,
        precision: str = "fp32",
        seed: int = 0,
        lr: float = 1e-3,
        timeout_s: float | None = None,
        faults: dict[str | int, str] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(model, str) and model not in PRESETS:
            raise ValueError(f"model must be a preset ({', '.join(PRESETS)}) or a dict of GPTConfig fields")
        self.cfg = resolve_config(model)
        self.model_arg = model if isinstance(model, str) else self.cfg.to_dict()
        self.batch_per_rank = _int_arg("batch_per_rank", batch_per_rank, 1)
        self.steps = _int_arg("steps", steps, 1)
        self.warmup_steps = _int_arg("warmup_steps", warmup_steps, 0)
        self.world_size = _int_arg("world_size", world_size, 1)
        if self.world_size > 8:
            raise ValueError(f"world_size must be <= 8 (the GPUs of one node), got {world_size}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (bf16 = autocast), got {precision!r}")
        self.precision = precision
        self.seed = _int_arg("seed", seed, 0)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
            raise ValueError(f"lr must be a number in (0, 1), got {lr!r}")
        self.lr = float(lr)
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 3600
        ):
            raise ValueError(f"timeout_s must be a number in (0, 3600] or null, got {timeout_s!r}")
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self.faults = parse_faults(faults)

    # ------------------------------------------------------------------ static feasibility

    def static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        reason = missing_params(config, DDP_KNOBS)
        if reason:
            return reason
        bucket = config["bucket_cap_mb"]
        if isinstance(bucket, bool) or not isinstance(bucket, (int, float)) or not 0 < bucket <= 1024:
            return f"bucket_cap_mb must be a number in (0, 1024], got {bucket!r}"
        for key in ("gradient_as_bucket_view", "static_graph"):
            if not isinstance(config[key], bool):
                return f"{key} must be true or false, got {config[key]!r}"
        if config["comm_hook"] not in COMM_HOOKS:
            return f"comm_hook must be one of {', '.join(COMM_HOOKS)}, got {config['comm_hook']!r}"
        if config["comm_hook"] == "bf16" and not device.is_gpu:
            return "comm_hook bf16: torch's bf16_compress_hook needs the NCCL backend (CUDA 11+, NCCL 2.10+)"
        if config.get("NCCL_ALGO") == "Tree":
            # Seen on the H200 pair (NCCL 2.28.9): "no algorithm/protocol available for function AllGather
            # with datatype ncclInt8. NCCL_ALGO was set to Tree" when DDP is built.
            return (
                "NCCL_ALGO=Tree: DDP also broadcasts and all-gathers (at construction), which Tree does not implement"
            )
        return nccl_static_check(config, "all_reduce")

    def trial_env(self, config: dict[str, Any]) -> dict[str, str | None]:
        """The NCCL knobs of ``config`` for the rank processes (None = unset: NCCL decides)."""
        return nccl_env(config)

    # ------------------------------------------------------------------ one trial (the template's hooks)

    def _case(self, config: dict[str, Any], device: DeviceInfo) -> _Case:
        """This rank's fresh replica, after an injected fault and the untimed warm-up steps."""
        import torch
        import torch.distributed as dist

        rank, n = dist.get_rank(), dist.get_world_size()
        torch_device = torch.device("cuda", torch.cuda.current_device()) if device.is_gpu else torch.device("cpu")
        case = self._replica(config, rank, n, torch_device)
        inject_fault(self.faults.get(self.trial_ctx.trial_number) if rank == 1 else None)
        for _ in range(self.warmup_steps):
            case.losses.append(self._step(case))
        return case

    def _poison(self, case: _Case) -> None:
        case.final_loss = math.nan

    def _check(self, config: dict[str, Any], case: _Case) -> Checked:
        """A finite final loss on every rank and equal replicas; then, with a comm hook, the loss of the same
        run without it (the replica is dropped first: the reference builds its own)."""
        import torch.distributed as dist

        case.samples_ms = step_intervals_ms(case.marks, case.device.type == "cuda") or [math.nan]
        final = float(case.final_loss)
        checksum = self._checksum(case)
        case.ddp = case.optimizer = None
        device = case.device
        local_bad = not math.isfinite(final)
        any_bad = agree_on_failure(local_bad, device)
        mean_loss = _mean_over_ranks(final if not local_bad else 0.0, device)
        lo, hi = -slowest(-checksum, device), slowest(checksum, device)
        if any_bad:
            return Checked(
                {}, failure=f"rank {case.rank}: final loss {final}" if local_bad else "another rank's loss is NaN/inf"
            )
        if not math.isclose(lo, hi, rel_tol=1e-6, abs_tol=1e-9):
            return Checked({}, failure=f"replicas diverged: parameter checksums from {lo!r} to {hi!r} over the ranks")
        reference = None
        if config["comm_hook"] != "none":
            reference = self._reference_loss({**config, "comm_hook": "none"}, case.rank, case.world_size, device)
        return Checked(
            {"loss_delta": 0.0 if reference is None else mean_loss - reference},
            extra={
                "final_loss": mean_loss,
                "reference_loss": reference,
                "world_size": case.world_size,
                "backend": dist.get_backend(),
            },
        )

    def _time(self, config: dict[str, Any], case: _Case, device: DeviceInfo, comparable: bool) -> Timing:
        """The intervals between the checked launch's step marks (the launch is the timed run)."""
        return Timing.from_samples(case.samples_ms, warmup_calls=self.warmup_steps)

    def _metrics(self, config: dict[str, Any], case: _Case, median_ms: float) -> dict[str, float]:
        step_ms = slowest(median_ms, case.device)
        tokens = case.world_size * self.batch_per_rank * self.cfg.seq_len
        return {
            "step_ms": step_ms,
            "tokens_per_s": tokens / (step_ms * 1e-3) if step_ms > 0 else math.inf,
            "latency_ms": step_ms,
        }

    def _replica(self, config: dict[str, Any], rank: int, n: int, device: Any) -> _Case:
        """A fresh seeded replica in DDP with the config's knobs, its optimizer and this rank's data shards."""
        import torch
        from torch.nn.parallel import DistributedDataParallel

        from models.gpt import make_model, synthetic_batch

        model = make_model(self.cfg, self.seed, device)
        model.train()
        ddp = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=float(config["bucket_cap_mb"]),
            gradient_as_bucket_view=bool(config["gradient_as_bucket_view"]),
            static_graph=bool(config["static_graph"]),
        )
        hook = config["comm_hook"]
        if hook != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            fn = default_hooks.bf16_compress_hook if hook == "bf16" else default_hooks.fp16_compress_hook
            ddp.register_comm_hook(None, fn)
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=self.lr, foreach=True)
        rows = slice(rank * self.batch_per_rank, (rank + 1) * self.batch_per_rank)
        batches = []
        for step in range(self.warmup_steps + self.steps):
            tokens, targets = synthetic_batch(self.cfg, n * self.batch_per_rank, self.seed + 1 + step, device)
            batches.append((tokens[rows], targets[rows]))
        autocast_dtype = torch.bfloat16 if self.precision == "bf16" else None
        return _Case(ddp, optimizer, batches, device, autocast_dtype, rank=rank, world_size=n)

    @staticmethod
    def _step(case: _Case) -> Any:
        """One optimizer step: forward, backward (DDP all-reduces the gradient buckets), AdamW."""
        import torch

        from models.gpt import lm_loss

        tokens, targets = case.batches[case.step % len(case.batches)]
        case.step += 1
        case.optimizer.zero_grad(set_to_none=True)
        autocast: Any = contextlib.nullcontext()
        if case.autocast_dtype is not None:
            autocast = torch.autocast(case.device.type, dtype=case.autocast_dtype)
        with autocast:
            logits = case.ddp(tokens)
        loss = lm_loss(logits, targets)
        loss.backward()
        case.optimizer.step()
        return loss.detach()

    def _launch(self, config: dict[str, Any], case: _Case) -> None:
        """The ``steps`` timed steps, back to back, with a timing mark between consecutive steps; writes the
        last step's loss into ``case.final_loss``. The only place ``run`` times training."""
        case.marks = timed_steps(lambda: case.losses.append(self._step(case)), self.steps, case.device.type == "cuda")
        case.final_loss = case.losses[-1]

    @staticmethod
    def _checksum(case: _Case) -> float:
        import torch

        with torch.no_grad():
            return float(sum(p.detach().double().abs().sum() for p in case.ddp.parameters()))

    def _reference_loss(self, config: dict[str, Any], rank: int, n: int, device: Any) -> float:
        """The final loss (mean over the ranks) of the same run without a comm hook."""
        case = self._replica(config, rank, n, device)
        for _ in range(self.warmup_steps + self.steps):
            case.losses.append(self._step(case))
        return _mean_over_ranks(float(case.losses[-1]), device)

    # ------------------------------------------------------------------ exports and work

    def work(self, config: dict[str, Any]) -> tuple[float, float, str | None]:
        """Model FLOPs of one rank's step and a lower bound of its memory traffic: the fp32 weights read three
        times, the gradients written and read once, AdamW's 28 bytes per parameter."""
        tokens = self.batch_per_rank * self.cfg.seq_len
        flops = model_flops_per_token(self.cfg, training=True) * tokens
        moved = self.cfg.n_params() * (3 * 4 + 8 + 28)
        return float(flops), float(moved), self.precision

    def export_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The DDP keyword arguments, the comm hook and the NCCL environment, as a training script consumes them."""
        return {
            "ddp": {
                "bucket_cap_mb": config.get("bucket_cap_mb"),
                "gradient_as_bucket_view": config.get("gradient_as_bucket_view"),
                "static_graph": config.get("static_graph"),
            },
            "comm_hook": config.get("comm_hook"),
            "env": set_nccl_env(config),
        }

    def export_env(self, config: dict[str, Any]) -> dict[str, str]:
        """Only the NCCL variables the config sets (the DDP knobs are not environment variables)."""
        return set_nccl_env(config)

    def export_python(self, config: dict[str, Any]) -> str:
        exported = self.export_config(config)
        hook = exported["comm_hook"]
        lines = [
            "import os",
            "",
            "from torch.nn.parallel import DistributedDataParallel",
            "",
            "# before torch.distributed.init_process_group: NCCL reads them when the communicator is created",
            f"os.environ.update({exported['env']!r})",
            "",
            "",
            "def wrap(model, device_ids=None):",
            f"    ddp = DistributedDataParallel(model, device_ids=device_ids, **{exported['ddp']!r})",
        ]
        if hook in ("bf16", "fp16"):
            lines += [
                "    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks",
                "",
                f"    ddp.register_comm_hook(None, default_hooks.{hook}_compress_hook)",
            ]
        lines.append("    return ddp")
        return "\n".join(lines) + "\n"


def _mean_over_ranks(value: float, device: Any) -> float:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([float(value)], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(tensor)
    return float(tensor.item()) / dist.get_world_size()
