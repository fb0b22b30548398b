"""The ``train_step`` workload: whole optimizer steps of the GPT in ``models/gpt.py`` (forward, backward, AdamW).

Knobs (``search_spaces/train_step.yaml``): ``micro_batch`` (sequences per forward/backward pass),
``grad_accum`` (micro-batches per optimizer step; a knob only when the ``global_batch`` arg is
null, else ``global_batch / micro_batch``), ``precision`` (fp32 IEEE, tf32, bf16 autocast, fp16
autocast with ``torch.amp.GradScaler``, fp8 block Linears through ``torch._scaled_mm`` with bf16
backward -- :class:`models.gpt.Fp8Linear`), ``checkpoint`` (activation checkpointing of every k-th
block, 0 = none), ``compile`` (``torch.compile`` mode or "off"), ``attention`` (SDPA with torch's
pick, SDPA with one forced backend, the explicit "math" softmax, or "triton": the project's flash
kernel with its backward, ``kernels/attention/attention_grad.py``) and ``optimizer`` (AdamW with
``foreach=True`` or ``fused=True``).

One trial: a fresh model from ``seed`` and its optimizer; ``warmup_steps`` untimed steps (they
compile under ``torch.compile``), then ``steps`` timed steps in :meth:`TrainStep._launch`. Step
``n`` (0-based over warm-up and timed steps) trains on ``synthetic_batch(cfg, global_batch,
seed + 1 + n)``, cut into ``grad_accum`` micro-batches, so the data do not depend on the split.
Metrics:

- ``tokens_per_s`` = ``global_batch * seq_len`` / median step time; ``step_ms`` the median step time.
- ``mfu`` = ``model_flops_per_token(training=True) * tokens_per_s`` / the dense peak of the GPU for
  the precision (``tuner.workloads.roofline.PEAK_TFLOPS``). fp8 runs a third of its FLOPs in fp8 (the block
  Linears' forward) and the rest in bf16, so its peak is the harmonic mix
  ``1 / (1/(3 P_fp8) + 2/(3 P_bf16))``. 0.0 where no peak is known (a CPU, an unknown GPU).
- ``peak_mem_gb`` (1e9 bytes): on a GPU ``torch.cuda.max_memory_allocated()`` over the timed steps
  (the counter is reset after warm-up, so compile-time autotuning buffers do not count) minus what
  the process held before the trial; on a CPU an analytical estimate (:func:`estimate_peak_bytes`).
- ``loss_delta`` = this run's loss at step ``reference_steps`` minus the loss of an fp32 reference
  run (IEEE fp32, every block checkpointed, foreach AdamW, the same seed and data) at the same step.
  Signed, as asked: a run that happens to end lower scores below 0. The reference runs once per
  global batch and device and is cached in the workload (one per worker).
- ``loss_error`` = ``|loss_delta|``: the accuracy objective to minimize. A run that ends below the
  reference has not trained better, it has drifted from it (after a few steps on synthetic data the
  sign is noise), so minimizing the signed delta would reward the drift.

Timing: a training step changes the model, so the stopwatch repetitions of
:func:`tuner.workloads.measure.time_fn` (adaptive count, L2 flushes) do not fit; instead the ``steps`` timed
steps run back to back, with a CUDA event recorded between consecutive steps (``time.perf_counter``
on a CPU) and one synchronization at the end: ``samples_ms`` holds the per-step times.

Failures: NaN/inf in any step's loss is ``numerics_fail`` (``run`` sets the case's final loss to
NaN before ``_launch``, so a ``_launch`` that does nothing fails too). A CUDA out-of-memory error is
``oom`` (the trial template's ``reported_failures``). After every trial its tensors are freed
(``gc.collect``, ``torch.cuda.empty_cache``) and when the allocator does not return to what it held
before the trial (within :data:`LEAK_TOLERANCE_BYTES`) the result asks for a fresh worker
(``extra["replace_worker"]``). ``memory_limit_gb`` simulates a
smaller card: a trial whose peak exceeds it is ``oom`` (on a CPU by the estimate); on a GPU a config
whose estimate exceeds it by more than 10% is refused before it runs (``infeasible_static``).
``torch.compile``/Triton failures are ``compile_error``/``out_of_resources``.

torch is imported inside the methods: the registry, ``__init__`` and ``static_check`` stay light.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from models.config import PRESETS, GPTConfig, model_flops_per_token, resolve_config
from objectives.train_export import trainer_source
from tuner.workloads.base import DeviceInfo, MetricSpec, TrialContext, TrialStatus, missing_params
from tuner.workloads.measure import Timing, step_intervals_ms, timed_steps
from tuner.workloads.template import Checked, MeasuredWorkload

PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")
#: attention knob -> (GPT attention mode, forced SDPA backend name or None for torch's pick)
ATTENTION: dict[str, tuple[str, str | None]] = {
    "sdpa": ("sdpa", None),
    "sdpa_flash": ("sdpa", "FLASH_ATTENTION"),
    "sdpa_cudnn": ("sdpa", "CUDNN_ATTENTION"),
    "sdpa_efficient": ("sdpa", "EFFICIENT_ATTENTION"),
    "math": ("math", None),
    "triton": ("triton", None),
}
COMPILE_MODES: tuple[str, ...] = ("off", "default", "max-autotune-no-cudagraphs")
OPTIMIZERS: tuple[str, ...] = ("adamw_foreach", "adamw_fused")
KNOBS: tuple[str, ...] = ("micro_batch", "precision", "checkpoint", "compile", "attention", "optimizer")
#: Compute capability each precision needs on a GPU (bf16/TF32 tensor cores: Ampere; fp8: Ada/Hopper).
MIN_CAPABILITY: dict[str, tuple[int, int]] = {"tf32": (8, 0), "bf16": (8, 0), "fp8": (8, 9)}
#: SDPA backends that need Ampere (FlashAttention-2 and cuDNN fused attention in torch).
MIN_CAPABILITY_ATTENTION: dict[str, tuple[int, int]] = {"sdpa_flash": (8, 0), "sdpa_cudnn": (8, 0), "triton": (8, 0)}
#: Micro-batch of the fp32 reference run (or the largest power of two dividing the global batch below it).
REFERENCE_MICRO_BATCH = 4
#: Bytes the allocator may still hold after a trial was freed before the worker is declared leaky
#: (cuBLAS/cuDNN workspaces allocated on their first use stay allocated).
LEAK_TOLERANCE_BYTES = 64 * 2**20
#: Activation values a block keeps for backward per token, in units of d_model (the CPU memory estimate):
#: x, the two norm outputs, q/k/v, the attention output and its softmax statistics, the MLP input, plus
#: 2 * d_ff for the MLP hidden before and after GELU.
ACTIVATION_VALUES_PER_TOKEN_D = 10
#: With ``memory_limit_gb`` on a GPU, configs whose estimated peak exceeds the limit by more than this
#: fraction are refused before they run; the others run and the allocator's peak decides (on a CPU the
#: estimate is the measurement, so every config runs).
ESTIMATE_MARGIN = 0.1


def _int_arg(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def fp8_mixed_peak(peaks: dict[str, float]) -> float | None:
    """Peak TFLOP/s of an fp8 training step: a third of its FLOPs (forward Linears) at the fp8 peak,
    two thirds (backward) at the bf16 peak; None without an fp8 peak."""
    if "fp8" not in peaks or "bf16" not in peaks:
        return None
    return 1.0 / (1.0 / (3 * peaks["fp8"]) + 2.0 / (3 * peaks["bf16"]))


def estimate_peak_bytes(cfg: GPTConfig, micro_batch: int, precision: str, checkpoint_every: int) -> float:
    """Rough peak bytes of one training step (used on a CPU, where no allocator counts them).

    Parameters, gradients and AdamW's two moments in fp32 (16 bytes per parameter); the 16-bit (fp8:
    8-bit) copies of the block weights that autocast makes and the backward pass keeps; per layer the
    activations a backward pass keeps, ``(10 * d_model + 2 * d_ff)`` values per token in the compute
    dtype (4 bytes fp32/tf32, else 2) plus the fp32 residual stream; a checkpointed block keeps only its
    input (fp32), and one block is recomputed at a time; the logits in the compute dtype plus their fp32
    copy and gradient.
    """
    tokens = micro_batch * cfg.seq_len
    act_bytes = 4 if precision in ("fp32", "tf32") else 2
    states = 16 * cfg.n_params()
    full_layer = tokens * ((ACTIVATION_VALUES_PER_TOKEN_D * cfg.d_model + 2 * cfg.ff) * act_bytes + 2 * cfg.d_model * 4)
    if checkpoint_every:
        checkpointed = len(range(0, cfg.n_layers, checkpoint_every))
        layers = checkpointed * tokens * cfg.d_model * 4 + (cfg.n_layers - checkpointed + 1) * full_layer
    else:
        layers = cfg.n_layers * full_layer
    logits = tokens * cfg.vocab_size * (act_bytes + 4 + 4)
    casts = {"bf16": 2, "fp16": 2, "fp8": 1}.get(precision, 0) * cfg.n_params(embedding=False)
    return float(states + casts + layers + logits)


@dataclass
class _Case:
    """One trial's model, optimizer, data and step bookkeeping (built fresh per trial)."""

    model: Any
    forward: Any  # the model, or its torch.compile wrapper
    optimizer: Any
    scaler: Any | None
    batches: list[tuple[Any, Any]]
    micro_batch: int
    grad_accum: int
    autocast_dtype: Any | None
    sdpa_backend: Any | None
    device: Any
    step: int = 0
    losses: list[Any] = field(default_factory=list)
    marks: list[Any] = field(default_factory=list)  # CUDA events or perf_counter values around timed steps
    final_loss: Any = math.nan
    info: DeviceInfo | None = None  # the device of the trial (the MFU's peak)
    before_bytes: int = 0  # allocated before the case was built
    reference: list[float] = field(default_factory=list)  # the fp32 reference's per-step losses
    samples_ms: list[float] = field(default_factory=list)


class TrainStep(MeasuredWorkload):
    """Optimizer steps of a GPT (``models/gpt.py``) under one config of the training knobs.

    Args: ``model`` (preset name of ``models.config.PRESETS`` or a dict of ``GPTConfig`` fields),
    ``global_batch`` (sequences per optimizer step, or null to make ``grad_accum`` a knob), ``steps``
    (timed optimizer steps, default 5), ``warmup_steps`` (untimed steps first, default 2),
    ``seed`` (model init and data, default 0), ``reference_steps`` (the step whose loss is compared with
    the fp32 reference; default ``warmup_steps + steps``, at most that), ``memory_limit_gb`` (simulate a
    card with this many GB: a larger peak is ``oom``; default null) and ``lr`` (AdamW learning rate,
    default 1e-3; AdamW's other settings are torch's defaults).
    """

    name = "train_step"
    shape_args = ("model", "global_batch")
    unkeyed_args = ("seed", "steps", "warmup_steps", "reference_steps", "lr")
    space_file = "train_step.yaml"
    metrics = (
        MetricSpec("tokens_per_s", "maximize", "tokens/s", "global_batch * seq_len / median step time"),
        MetricSpec(
            "mfu",
            "maximize",
            "",
            "model FLOPs/s (PaLM: 6N + 12*L*S*d per token) / dense peak of the precision; 0 when unknown",
        ),
        MetricSpec("peak_mem_gb", "minimize", "GB", "peak allocated bytes of the timed steps / 1e9 (CPU: estimate)"),
        MetricSpec(
            "loss_delta",
            "minimize",
            "nats",
            "loss at step reference_steps minus the fp32 reference's loss at that step (same seed and data)",
        ),
        MetricSpec("loss_error", "minimize", "nats", "|loss_delta|: the drift from the fp32 reference either way"),
        MetricSpec("step_ms", "minimize", "ms", "median time of one optimizer step (grad_accum micro-batches)"),
    )
    #: Out of memory is a result of the config here (a larger micro-batch), not of a broken worker.
    reported_failures = frozenset({TrialStatus.COMPILE_ERROR, TrialStatus.OUT_OF_RESOURCES, TrialStatus.OOM})
    description = (
        "Whole training step of a GPT (models/gpt.py): micro-batch, grad accumulation, precision "
        "fp32/tf32/bf16/fp16/fp8, activation checkpointing, torch.compile, SDPA backend, AdamW fused/foreach"
    )

    def __init__(
        self,
        model: str | dict[str, Any] = "tiny",
        global_batch: int | None = None,
        steps: int = 5,
        warmup_steps: int = 2,
        seed: int = 0,
        reference_steps: int | None = None,
        memory_limit_gb: float | None = None,
        lr: float = 1e-3,
    ) -> None:
        super().__init__()
        if isinstance(model, str) and model not in PRESETS:
            raise ValueError(f"model must be a preset ({', '.join(PRESETS)}) or a dict of GPTConfig fields")
        self.cfg = resolve_config(model)  # ValueError naming "model" or the field
        self.model_arg = model if isinstance(model, str) else self.cfg.to_dict()
        self.global_batch = None if global_batch is None else _int_arg("global_batch", global_batch, 1)
        self.steps = _int_arg("steps", steps, 1)
        self.warmup_steps = _int_arg("warmup_steps", warmup_steps, 0)
        self.seed = _int_arg("seed", seed, 0)
        total = self.warmup_steps + self.steps
        if reference_steps is None:
            reference_steps = total
        self.reference_steps = _int_arg("reference_steps", reference_steps, 1)
        if self.reference_steps > total:
            raise ValueError(f"reference_steps must be <= warmup_steps + steps = {total}, got {reference_steps}")
        if memory_limit_gb is not None and (
            isinstance(memory_limit_gb, bool) or not isinstance(memory_limit_gb, (int, float)) or memory_limit_gb <= 0
        ):
            raise ValueError(f"memory_limit_gb must be a positive number or null, got {memory_limit_gb!r}")
        self.memory_limit_gb = None if memory_limit_gb is None else float(memory_limit_gb)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
            raise ValueError(f"lr must be a number in (0, 1), got {lr!r}")
        self.lr = float(lr)
        # fp32 reference losses per (device type, global batch), computed once per worker.
        self._references: dict[tuple[str, int], list[float]] = {}

    # ------------------------------------------------------------------ space

    def space_document(self) -> dict[str, Any]:
        """The YAML space; with a fixed ``global_batch``, without ``grad_accum`` (it follows from the
        micro-batch) and with the seeds whose micro-batch divides the global batch."""
        document = super().space_document()
        if self.global_batch is None:
            return document
        document = dict(document)
        document["params"] = {k: v for k, v in document["params"].items() if k != "grad_accum"}
        seeds, seen = [], set()
        for seed in document.get("seeds") or []:
            seed = {k: v for k, v in seed.items() if k != "grad_accum"}
            key = tuple(sorted((k, str(v)) for k, v in seed.items()))
            if self.global_batch % int(seed["micro_batch"]) == 0 and key not in seen:
                seen.add(key)
                seeds.append(seed)
        document["seeds"] = seeds
        return document

    # ------------------------------------------------------------------ static feasibility

    def _batching(self, config: dict[str, Any]) -> tuple[int, int] | str:
        """``(micro_batch, grad_accum)`` of a config, or why it has none."""
        micro = config.get("micro_batch")
        if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
            return f"micro_batch must be an int >= 1, got {micro!r}"
        accum = config.get("grad_accum")
        if self.global_batch is None:
            if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
                return f"grad_accum must be an int >= 1 when global_batch is null, got {accum!r}"
            return micro, accum
        if self.global_batch % micro:
            return f"micro_batch={micro} does not divide global_batch={self.global_batch}"
        derived = self.global_batch // micro
        if accum is not None and accum != derived:
            return f"grad_accum={accum} contradicts global_batch={self.global_batch} / micro_batch={micro} = {derived}"
        return micro, derived

    def static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        reason = missing_params(config, KNOBS)
        if reason:
            return reason
        batching = self._batching(config)
        if isinstance(batching, str):
            return batching
        micro, _ = batching
        precision, attention, mode = config["precision"], config["attention"], config["compile"]
        if precision not in PRECISIONS:
            return f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        if attention not in ATTENTION:
            return f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}"
        if mode not in COMPILE_MODES:
            return f"compile must be one of {', '.join(COMPILE_MODES)}, got {mode!r}"
        if config["optimizer"] not in OPTIMIZERS:
            return f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {config['optimizer']!r}"
        every = config["checkpoint"]
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            return f"checkpoint must be an int >= 0 (checkpoint every k-th block), got {every!r}"
        if mode != "off" and self.warmup_steps < 1:
            return "torch.compile needs warmup_steps >= 1, or the compilation would be timed"
        head_dim = self.cfg.head_dim
        if attention == "triton" and not (16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0):
            return f"attention 'triton' needs a head_dim that is a power of two in [16, 256], the model has {head_dim}"
        if not device.is_gpu:
            if mode != "off":
                return "torch.compile is refused off the GPU (a CPU compile costs minutes and is not what is tuned)"
            if precision in ("tf32", "fp8"):
                return f"{precision} is a GPU tensor-core mode: refused on {device.name}"
            if attention in ("sdpa_cudnn", "sdpa_efficient"):
                return f"{attention} is a CUDA SDPA backend: refused on {device.name}"
            if attention == "triton":
                return f"attention 'triton' runs compiled Triton kernels on a CUDA GPU: refused on {device.name}"
        else:
            if attention in ("sdpa_flash", "sdpa_cudnn", "triton") and precision in ("fp32", "tf32"):
                return f"{attention} takes fp16/bf16 inputs only, precision {precision} gives fp32 attention"
            cc = tuple(device.compute_capability) if device.compute_capability else None
            needs = [(precision, MIN_CAPABILITY.get(precision)), (attention, MIN_CAPABILITY_ATTENTION.get(attention))]
            for what, needed in needs:
                if cc is not None and needed is not None and cc < needed:
                    return (
                        f"{what} needs compute capability >= {needed[0]}.{needed[1]}, {device.name} has {cc[0]}.{cc[1]}"
                    )
        if self.memory_limit_gb is not None and device.is_gpu:
            estimate = estimate_peak_bytes(self.cfg, micro, precision, every) / 1e9
            if estimate > self.memory_limit_gb * (1 + ESTIMATE_MARGIN):
                return (
                    f"estimated peak {estimate:.1f} GB exceeds memory_limit_gb={self.memory_limit_gb:g} by more "
                    f"than {ESTIMATE_MARGIN:.0%} (estimate_peak_bytes; simulates a smaller card)"
                )
        if precision == "fp8":
            cfg = self.cfg
            if cfg.d_model % 16 or cfg.ff % 16 or (micro * cfg.seq_len) % 16:
                return (
                    "fp8 (torch._scaled_mm) needs d_model, d_ff and micro_batch * seq_len divisible by 16, got "
                    f"{cfg.d_model}, {cfg.ff}, {micro * cfg.seq_len}"
                )
        return None

    # ------------------------------------------------------------------ one trial

    @contextlib.contextmanager
    def _scope(self, config: dict[str, Any], device: DeviceInfo, ctx: TrialContext) -> Iterator[dict[str, Any]]:
        """The fp32 reference first (cached per worker), the config's matmul precision around the trial, and
        after it everything freed: leaked memory above :data:`LEAK_TOLERANCE_BYTES` asks for a fresh worker."""
        import torch

        on_gpu = device.is_gpu
        torch_device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        self._reference_losses(self._global_batch(config), torch_device)
        before = self._allocated(on_gpu)
        notes: dict[str, Any] = {}
        try:
            with _float32_matmul(config["precision"]):
                yield notes
        finally:
            leaked = self._free(on_gpu, config["compile"] != "off", before)
            if on_gpu and leaked > LEAK_TOLERANCE_BYTES:
                notes.update(replace_worker=True, leaked_bytes=leaked)

    def _global_batch(self, config: dict[str, Any]) -> int:
        batching = self._batching(config)
        assert not isinstance(batching, str)
        return batching[0] * batching[1]

    def _case(self, config: dict[str, Any], device: DeviceInfo) -> _Case:
        """A fresh model after ``warmup_steps`` untimed steps, the GPU's peak-memory counter reset after them."""
        import torch

        batching = self._batching(config)
        assert not isinstance(batching, str)
        micro, accum = batching
        on_gpu = device.is_gpu
        torch_device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        before = self._allocated(on_gpu)
        case = self._build(config, micro, accum, torch_device)
        case.info, case.before_bytes = device, before
        case.reference = self._reference_losses(micro * accum, torch_device)
        for _ in range(self.warmup_steps):
            case.losses.append(self._step(case))
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        return case

    def _poison(self, case: _Case) -> None:
        case.final_loss = math.nan

    def _check(self, config: dict[str, Any], case: _Case) -> Checked:
        """Finite losses at every step, the peak within ``memory_limit_gb``, and the drift from the fp32 reference."""
        import torch

        on_gpu = case.device.type == "cuda"
        case.samples_ms = step_intervals_ms(case.marks, on_gpu)
        losses = [float(x) for x in torch.stack([t.float() for t in case.losses]).tolist()] if case.losses else []
        final = float(case.final_loss)
        if on_gpu:
            peak_bytes = float(torch.cuda.max_memory_allocated() - case.before_bytes)
        else:
            peak_bytes = estimate_peak_bytes(self.cfg, case.micro_batch, config["precision"], config["checkpoint"])
        global_batch = case.micro_batch * case.grad_accum
        extra: dict[str, Any] = {
            "global_batch": global_batch,
            "grad_accum": case.grad_accum,
            "tokens_per_step": global_batch * self.cfg.seq_len,
            "losses": losses,
            "reference_losses": case.reference,
            "peak_mem_source": "max_memory_allocated" if on_gpu else "estimate",
        }
        peak = {"peak_mem_gb": peak_bytes / 1e9}
        if not math.isfinite(final) or not losses or not all(math.isfinite(x) for x in losses):
            return Checked(peak, failure=f"loss is NaN/inf (final {final}, per step {losses})", extra=extra)
        if self.memory_limit_gb is not None and peak["peak_mem_gb"] > self.memory_limit_gb:
            failure = (
                f"peak {peak['peak_mem_gb']:.3f} GB exceeds memory_limit_gb={self.memory_limit_gb:g} "
                "(simulates a smaller card)"
            )
            return Checked(peak, failure=failure, extra=extra, status=TrialStatus.OOM)
        index = self.reference_steps - 1
        delta = losses[index] - case.reference[index]
        return Checked({**peak, "loss_delta": delta, "loss_error": abs(delta)}, extra=extra)

    def _time(self, config: dict[str, Any], case: _Case, device: DeviceInfo, comparable: bool) -> Timing:
        """The intervals between the checked launch's step marks (the launch is the timed run)."""
        return Timing.from_samples(case.samples_ms, warmup_calls=self.warmup_steps)

    def _metrics(self, config: dict[str, Any], case: _Case, median_ms: float) -> dict[str, float]:
        tokens_per_s = (
            case.micro_batch * case.grad_accum * self.cfg.seq_len / (median_ms * 1e-3) if median_ms > 0 else math.inf
        )
        assert case.info is not None
        return {
            "tokens_per_s": tokens_per_s,
            "mfu": self._mfu(tokens_per_s, config["precision"], case.info),
            "step_ms": median_ms,
            # not declared: the key the worker's roofline position reads (with work())
            "latency_ms": median_ms,
        }

    def _launch(self, config: dict[str, Any], case: _Case) -> None:
        """The ``steps`` timed optimizer steps, back to back, with a timing mark between consecutive steps;
        writes the last step's loss into ``case.final_loss``. The only place ``run`` times training."""
        case.marks = timed_steps(lambda: case.losses.append(self._step(case)), self.steps, case.device.type == "cuda")
        case.final_loss = case.losses[-1]

    # ------------------------------------------------------------------ exports and work

    def work(self, config: dict[str, Any]) -> tuple[float, float, str | None]:
        """Model FLOPs of one optimizer step and a lower bound of its device-memory traffic.

        Bytes: per micro-batch the fp32 master weights are read three times (forward, input
        gradient, weight gradient) and the fp32 gradients read and written once (accumulation);
        per step AdamW reads parameter, gradient and two moments and writes parameter and moments
        (28 bytes per parameter). Activations are left out (a lower bound). The roof of fp8 is the
        bf16 one: two thirds of its FLOPs (the backward pass) and attention run in bf16.
        """
        batching = self._batching(config)
        micro, accum = batching if not isinstance(batching, str) else (1, 1)
        tokens = micro * accum * self.cfg.seq_len
        flops = model_flops_per_token(self.cfg, training=True) * tokens
        params = self.cfg.n_params()
        moved = params * (accum * (3 * 4 + 8) + 28)
        precision = config.get("precision", "fp32")
        return float(flops), float(moved), "bf16" if precision == "fp8" else precision

    def export_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The knobs with the derived batching, as a training script consumes them."""
        batching = self._batching(config)
        micro, accum = batching if not isinstance(batching, str) else (config.get("micro_batch"), None)
        out = {k: config[k] for k in KNOBS if k in config}
        out.update({"micro_batch": micro, "grad_accum": accum, "model": self.model_arg})
        out["global_batch"] = micro * accum if accum is not None and micro is not None else None
        return out

    def export_python(self, config: dict[str, Any]) -> str:
        """A ``configure(model)`` function applying the config to a torch training loop."""
        exported = self.export_config(config)
        return trainer_source(exported, *ATTENTION.get(exported.get("attention", "sdpa"), ("sdpa", None)))

    # ------------------------------------------------------------------ helpers

    def _mfu(self, tokens_per_s: float, precision: str, device: DeviceInfo) -> float:
        from tuner.workloads.roofline import peaks_for

        peaks = peaks_for(device.name) if device.is_gpu else None
        if not peaks:
            return 0.0
        peak = fp8_mixed_peak(peaks) if precision == "fp8" else peaks.get(precision)
        if not peak:
            return 0.0
        return model_flops_per_token(self.cfg, training=True) * tokens_per_s / (peak * 1e12)

    @staticmethod
    def _allocated(on_gpu: bool) -> int:
        if not on_gpu:
            return 0
        import torch

        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    @staticmethod
    def _free(on_gpu: bool, compiled: bool, before: int) -> int:
        """Drop what the trial left (compiled graphs, cached blocks); the bytes still allocated above ``before``
        (0 when CUDA itself fails here: the worker checks the context after a failed trial)."""
        import torch

        if compiled:
            torch._dynamo.reset()
        gc.collect()
        if not on_gpu:
            return 0
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            return max(0, torch.cuda.memory_allocated() - before)
        except Exception:
            return 0

    def _build(self, config: dict[str, Any], micro: int, accum: int, device: Any) -> _Case:
        """A fresh seeded model, its optimizer and the data of every step, for ``config``."""
        import torch

        from models.gpt import Fp8Linear, make_model, synthetic_batch

        precision = config["precision"]
        mode, backend = ATTENTION[config["attention"]]
        model = make_model(
            self.cfg,
            self.seed,
            device,
            attention=mode,
            checkpoint_every=int(config["checkpoint"]),
            linear_factory=Fp8Linear if precision == "fp8" else None,
        )
        model.train()
        fused = config["optimizer"] == "adamw_fused"
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.lr, fused=fused, foreach=None if fused else True)
        forward = model
        if config["compile"] != "off":
            torch._dynamo.reset()  # fresh caches: the recompile limit counts every earlier trial's model
            forward = torch.compile(model, mode=config["compile"])
        scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}.get(precision)
        sdpa_backend = None
        if backend is not None:
            from torch.nn.attention import SDPBackend

            sdpa_backend = getattr(SDPBackend, backend)
        global_batch = micro * accum
        batches = [
            synthetic_batch(self.cfg, global_batch, self.seed + 1 + n, device)
            for n in range(self.warmup_steps + self.steps)
        ]
        return _Case(model, forward, optimizer, scaler, batches, micro, accum, autocast_dtype, sdpa_backend, device)

    @staticmethod
    def _step(case: _Case) -> Any:
        """One optimizer step over ``grad_accum`` micro-batches; returns the step's mean loss (0-dim, on device)."""
        import torch

        from models.gpt import lm_loss

        tokens, targets = case.batches[case.step % len(case.batches)]
        case.step += 1
        case.optimizer.zero_grad(set_to_none=True)
        total = None
        attention: Any = contextlib.nullcontext()
        if case.sdpa_backend is not None:
            from torch.nn.attention import sdpa_kernel

            attention = sdpa_kernel([case.sdpa_backend])
        with attention:
            for i in range(case.grad_accum):
                rows = slice(i * case.micro_batch, (i + 1) * case.micro_batch)
                autocast: Any = contextlib.nullcontext()
                if case.autocast_dtype is not None:
                    # No weight-cast cache: every weight is used once per forward, so the cache saves no
                    # cast and would hold a 16-bit copy of all weights until the forward ends.
                    autocast = torch.autocast(case.device.type, dtype=case.autocast_dtype, cache_enabled=False)
                with autocast:
                    logits = case.forward(tokens[rows])
                loss = lm_loss(logits, targets[rows]) / case.grad_accum
                del logits
                (case.scaler.scale(loss) if case.scaler is not None else loss).backward()
                total = loss.detach() if total is None else total + loss.detach()
                del loss
        if case.scaler is not None:
            case.scaler.step(case.optimizer)
            case.scaler.update()
        else:
            case.optimizer.step()
        return total

    def _reference_losses(self, global_batch: int, device: Any) -> list[float]:
        """Per-step losses of the fp32 reference run for ``global_batch`` (cached per device type)."""
        key = (device.type, global_batch)
        cached = self._references.get(key)
        if cached is not None:
            return cached
        import torch

        micro = REFERENCE_MICRO_BATCH
        while global_batch % micro:
            micro //= 2
        config = {
            "precision": "fp32",
            "attention": "sdpa",
            "checkpoint": 1,
            "compile": "off",
            "optimizer": "adamw_foreach",
        }
        case: _Case | None = None
        try:
            with _float32_matmul("fp32"):
                case = self._build(config, micro, global_batch // micro, device)
                for _ in range(self.reference_steps):
                    case.losses.append(self._step(case))
                losses = [float(x) for x in torch.stack(case.losses).tolist()]
        finally:
            case = None
            self._free(device.type == "cuda", False, 0)
        self._references[key] = losses
        return losses


@contextlib.contextmanager
def _float32_matmul(precision: str) -> Iterator[None]:
    """fp32 matmuls in IEEE fp32 (``"highest"``), or TF32 (``"high"``) for the tf32 precision; restored after.

    Only the legacy ``torch.set_float32_matmul_precision`` is used: torch (2.9+) refuses to read it
    once the new per-backend ``fp32_precision`` API has been written, and inductor reads it.
    """
    import torch

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)
