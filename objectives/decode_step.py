"""The ``decode_step`` workload: greedy token-by-token decoding of the shared GPT (``models/gpt.py``) with a KV cache.

Knobs (``search_spaces/decode_step.yaml``): ``batch`` (sequences decoded together; a knob unless
the ``batch`` arg fixes it), ``weight_bits`` (16: bf16 ``nn.Linear``; 8 / 4: weight-only
quantized :class:`models.quant_linear.QuantLinear` with ``group_size`` 32 / 64 / 128;
with int4, ``int8_first_blocks`` keeps the first 0 / 1 / 2 blocks in int8, optional, 0 when absent;
``quantizer``: ``rtn`` rounds each weight to nearest with a clipped per-group scale, ``gptq``
runs :mod:`models.gptq` on synthetic calibration tokens, optional, ``rtn`` when absent; ``lm_head_bits``: the
tied LM head as it is (16) or a round-to-nearest int8 / int4 copy of the embedding with the config's group size,
the step's largest product at 1B (32000 x 2048), optional, 16 when absent; ``fuse_gelu``, packed only: the MLP's
GELU in the epilogue of its first product instead of a kernel of its own, optional, false when absent, outside the
default space until measured),
``kv_dtype`` (``bf16`` or ``fp8_e4m3`` with one scale per layer and tensor, calibrated by the
prefill), ``attention`` (``sdpa``, ``math`` or ``flash_decode``), ``cuda_graphs`` (replay one captured decode
step instead of launching its kernels one by one; GPU only) and ``compile`` (``off`` or
``default``: the decode step through ``torch.compile``, which fuses its norms, residual adds and
cache writes into fewer kernels; captured in the same CUDA graph; optional, ``off`` when absent) and, compiled
with the packed kernel, ``split_sums`` (``kernel``: split-K tiles sum their parts in the kernel; ``fused``: from 32
rows the tiles may leave their fp32 partial products to the next operation, which Inductor sums them in;
``fused16``: the same with the partials stored in the activations' 16-bit dtype, half the bytes; optional,
``kernel`` when absent) and ``pdl`` (Hopper: the step's kernels launched as programmatic dependents of the ones
before them, Inductor's through its PDL code, the warp-specialized tiles copying their first words before they wait,
and with ``flash_decode`` its kernels reading their first cache rows before they wait; optional, false when absent).

Why ``compile``: a 1B-parameter step at batch 1 launches ~300 kernels (bf16) or ~440 (int4, whose
Linears are Triton kernels with their own set-up), and on an H200 it takes 1.39 ms where its 2 GB of
weights need 0.41 ms at HBM speed: the step is bound by kernel count, not bytes. Compiled, it ran
224 / 300 kernels and 1.25 / 1.34 x faster (bf16 / int4 group 128; ``bench/decode_overhead_probe.py``,
``bench/results/decode-overhead-h200.json``). The first compiled step takes 10-25 s.

Why no ``attention: triton``: the project's flash kernel (``kernels/attention/attention.py``) takes query
and key blocks of one length with the causal diagonal at their start; a decode step has one query
over a cache of ``max_len`` positions masked at a device-side ``pos`` (static shapes for CUDA
graphs), which it cannot express, and ``GPT.decode`` runs ``attention="triton"`` through SDPA
anyway. ``attention: flash_decode`` is the decode step's own kernel (:mod:`kernels.attention.decode_attention`):
the cache split over the SMs, positions past ``pos`` never read, the step's key and value written into
the cache by the same kernel, an fp8 cache read as fp8 (half the bytes; the SDPA path dequantizes the
layer's whole cache to bf16 first). Outside the default space until measured on a GPU.

One trial: the bf16 model (``make_model``, seeded, built once per worker and attention mode) is
copied with its block Linears quantized per config (:func:`models.quant_linear.quantize_linears`,
cached per (attention, bits, group), other tensors shared); a synthetic prompt of ``prompt_len``
tokens is prefilled into the config's cache (kept across trials of the same config); then
``gen_tokens`` decode steps run **teacher-forced**:
step ``t`` is fed the token the bf16 reference (bf16 weights, bf16 cache, sdpa, eager) chose
greedily at that point, so differences in the logits never compound through different tokens.
``_launch`` is that decode loop: it writes every step's logits (``[gen_tokens, batch, vocab]``,
fp32) into the case's output buffer, which ``run`` fills with NaN first. A step also reads its
input token from the teacher buffer and writes its logits with device-indexed copies and advances
a device ``pos``, so a captured step replays without host work.

``prepare`` does nothing: building and quantizing models launches GPU work, which must not overlap
another trial's timing; Triton compiles happen in ``run``'s untimed warm-up step.

Metrics: ``tokens_per_s`` (batch x gen_tokens over ``latency_ms``, the median time of the decode loop),
``ms_per_token`` (median time of one decode step, which yields one token per sequence),
``peak_mem_gb`` (parameter bytes of the config's model, KV cache bytes and the peak transient
allocation of one eager decode step; on a CPU the transient is not measured), ``max_logit_error``
and ``mean_logit_error`` (``|logits - ref|``, absolute, in logit units, over every step, sequence
and vocabulary entry) and ``top1_agreement`` (fraction of (step, sequence) positions whose argmax
is a token the reference ranks first; where the reference's top logits tie exactly, any of them
counts: bf16 logits are 1/16 apart at magnitude 8-16, the pretrained 1B model's greedy steps tie at
the top in over 5% of positions, and the reference's argmax takes the lowest index of a tie, which
a bf16 run with other kernels need not; ``extra["top1_same_index"]`` is the plain index match).
NaN/inf logits are NUMERICS_FAIL, and so is a ``top1_agreement`` below the ``min_top1_agreement``
arg (default :data:`MIN_TOP1_AGREEMENT`): a model whose greedy choice mostly differs from the bf16
model's is broken, not merely quantized (chance is 1/vocab).
Measured on the CPU with the tiny preset (batch 4, 8 + 8 or 16 tokens): int8 agrees 100%, int4
g32/g64 90-97%, fp8 KV cache 100%. With ``kv_dtype: fp8_e4m3`` the model's decode step dequantizes
each layer's whole cache to bf16 before attention: it saves cache memory, not bandwidth.

The model's shape comes from the ``model`` arg (a preset name of ``models.config.PRESETS`` or a dict of
``GPTConfig`` fields), resolved by the torch-free ``models.config``: ``__init__`` and ``static_check``
never import torch.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from models.config import GPTConfig, model_flops_per_token, resolve_config
from objectives import decode_rules as rules
from objectives.decode_models import DecodeModels, _Reference
from objectives.decode_weights import gptq_model
from tuner.workloads.base import DeviceInfo, MetricSpec
from tuner.workloads.template import Checked, MeasuredWorkload

#: Default floor of ``top1_agreement`` below which a config is a NUMERICS_FAIL (see the module docstring).
MIN_TOP1_AGREEMENT = 0.5
#: Bytes per KV-cache element per ``kv_dtype``.
KV_BYTES: dict[str, int] = {"bf16": 2, "fp8_e4m3": 1}
#: torch dtype name per ``kv_dtype`` (``getattr(torch, name)``).
KV_TORCH_DTYPES: dict[str, str] = {"bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn"}
#: Cases (KV cache, buffers, captured graph of one config) kept per worker: four, so that a benchmark
#: alternating up to four configs (bf16, bf16 compiled, int4, the pick) does not rebuild them, and
#: recompile them, every time. On a GPU the oldest are freed sooner when a new case would not fit.
MAX_CASES = 4


# ------------------------------------------------------------------------------------------ model shape


def resolve_model(model: Any) -> GPTConfig:
    """``models.config.resolve_config`` (torch-free), every error a ValueError that names the ``model`` arg."""
    try:
        return resolve_config(model)
    except ValueError as exc:
        if str(exc).startswith("model"):
            raise
        raise ValueError(f"model: {exc}") from None


def compile_options(mode: str, pdl: bool) -> dict[str, Any]:
    """``torch.compile``'s keyword arguments for the decode step: the ``mode``, or, with ``pdl``, that mode's
    Inductor options plus ``triton.enable_pdl`` (Inductor's kernels launched as programmatic dependents; a mode
    and options cannot both be given)."""
    if not pdl:
        return {"mode": mode}
    import torch._inductor

    if not hasattr(torch._inductor.config.triton, "enable_pdl"):
        raise ValueError("pdl: this torch's Inductor has no programmatic dependent launch (triton.enable_pdl)")
    return {"options": {**torch._inductor.list_mode_options(mode), "triton.enable_pdl": True}}


def compile_decode(decode: Any, mode: str, pdl: bool) -> Any:
    """``torch.compile`` of a model's decode step with static shapes (one graph, no recompiles across steps)."""
    import torch

    return torch.compile(decode, dynamic=False, **compile_options(mode, pdl))


# ------------------------------------------------------------------------------------------ per-trial state


@dataclass
class _Case:
    """Model variant, cache, buffers and (with ``cuda_graphs``) the captured step of one config."""

    key: tuple[Any, ...]
    batch: int
    model: Any  # models.gpt.GPT
    decode: Any  # model.decode, or its torch.compile
    cache: Any  # models.gpt.KVCache
    ref: _Reference
    pos: Any  # 0-dim long device tensor: the next decode position
    out: Any  # [G, B, V] fp32, written by _launch
    model_bytes: int
    graph: Any = None  # torch.cuda.CUDAGraph of one step
    transient_bytes: int = 0


class DecodeStep(MeasuredWorkload):
    """Greedy KV-cache decoding of a GPT: weight bits, KV dtype, attention, CUDA graphs and batch, vs bf16.

    Args: ``model`` (preset name of ``models.config.PRESETS`` or dict of GPTConfig fields, default
    ``"1b"``), ``prompt_len`` (tokens prefilled, >= 1), ``gen_tokens`` (timed decode steps, >= 1;
    ``prompt_len + gen_tokens <= seq_len``), ``batch`` (int 1..1024 fixes it; None leaves it a
    knob), ``seed`` (int: weights and prompt), ``min_top1_agreement`` (float in [0, 1]) and
    ``train_steps`` (int >= 0: train the seeded model this many steps on the synthetic task first, see
    :func:`objectives.decode_weights.pretrained_state`; 0 decodes the random model).
    """

    name = "decode_step"
    shape_args = ("model", "batch")
    unkeyed_args = ("seed", "gen_tokens", "min_top1_agreement", "train_steps")
    space_file = "decode_step.yaml"
    metrics = (
        MetricSpec("tokens_per_s", "maximize", "tokens/s", "batch * gen_tokens / median time of the decode loop"),
        MetricSpec("ms_per_token", "minimize", "ms", "median time of one decode step (one token per sequence)"),
        MetricSpec(
            "peak_mem_gb", "minimize", "GB", "model parameters + KV cache + peak transient of one eager step (1e9 B)"
        ),
        MetricSpec(
            "max_logit_error", "minimize", "logits", "max |logits - bf16 reference|, teacher-forced decode steps"
        ),
        MetricSpec(
            "mean_logit_error", "minimize", "logits", "mean |logits - bf16 reference| over steps x batch x vocab"
        ),
        MetricSpec(
            "top1_agreement",
            "maximize",
            "",
            "fraction of (step, sequence) whose argmax is a top-1 token of the reference (ties count)",
        ),
        MetricSpec("latency_ms", "minimize", "ms", "median time of the whole decode loop (what work() counts)"),
    )
    description = "GPT decode step (models/gpt.py): batch, int8/int4 weights, fp8 KV cache, attention, CUDA graphs"

    def __init__(
        self,
        model: str | dict[str, Any] = "1b",
        prompt_len: int = 128,
        gen_tokens: int = 32,
        batch: int | None = None,
        seed: int = 0,
        min_top1_agreement: float = MIN_TOP1_AGREEMENT,
        train_steps: int = 0,
    ) -> None:
        super().__init__()
        self.cfg = resolve_model(model)
        self.model_arg = model if not isinstance(model, GPTConfig) else model.to_dict()
        for arg, value in (("prompt_len", prompt_len), ("gen_tokens", gen_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        if prompt_len + gen_tokens > self.cfg.seq_len:
            raise ValueError(
                f"prompt_len + gen_tokens = {prompt_len + gen_tokens} exceeds the model's seq_len {self.cfg.seq_len}"
            )
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 1024):
            raise ValueError(f"batch must be null (a knob) or an int in [1, 1024], got {batch!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if isinstance(min_top1_agreement, bool) or not isinstance(min_top1_agreement, int | float):
            raise ValueError(f"min_top1_agreement must be a number in [0, 1], got {min_top1_agreement!r}")
        if not 0.0 <= min_top1_agreement <= 1.0:
            raise ValueError(f"min_top1_agreement must be in [0, 1], got {min_top1_agreement!r}")
        self.prompt_len, self.gen_tokens, self.batch, self.seed = prompt_len, gen_tokens, batch, seed
        self.min_top1_agreement = float(min_top1_agreement)
        if isinstance(train_steps, bool) or not isinstance(train_steps, int) or not 0 <= train_steps <= 100_000:
            raise ValueError(f"train_steps must be an int in [0, 100000], got {train_steps!r}")
        self.train_steps = train_steps
        self.models = DecodeModels(self.cfg, seed, train_steps, prompt_len, gen_tokens)
        self._cases: OrderedDict[tuple[Any, ...], _Case] = OrderedDict()

    @property
    def pretrain_losses(self) -> list[float]:
        """The losses of the pretraining run the weights came from (empty with ``train_steps`` 0 or cached)."""
        return self.models.pretrain_losses

    @property
    def max_len(self) -> int:
        """Cache positions: the prompt plus every decoded token."""
        return self.prompt_len + self.gen_tokens

    # ------------------------------------------------------------------ space

    def space_document(self) -> dict[str, Any]:
        """The space file; with the ``batch`` arg set, without the ``batch`` param (and seeds deduplicated)."""
        from tuner.study.space import load_space_file

        document = load_space_file(self.space_file)
        if self.batch is None:
            return document
        document = dict(document)
        document["params"] = {k: v for k, v in document["params"].items() if k != "batch"}
        seeds: list[dict[str, Any]] = []
        for seed in document.get("seeds") or []:
            stripped = {k: v for k, v in seed.items() if k != "batch"}
            if stripped not in seeds:
                seeds.append(stripped)
        document["seeds"] = seeds
        return document

    def _batch(self, config: dict[str, Any]) -> int:
        return self.batch if self.batch is not None else int(config["batch"])

    # ------------------------------------------------------------------ static feasibility

    def static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        return rules.static_violation(config, device, self.cfg, self.batch, self.memory_estimate)

    # ------------------------------------------------------------------ sizes

    def _linear_elements(self) -> int:
        """Weights of the block Linears (qkv, out proj, MLP up and down) of all layers."""
        d, ff = self.cfg.d_model, self.cfg.ff
        return self.cfg.n_layers * (4 * d * d + 2 * d * ff)

    def weight_bytes(self, config: dict[str, Any]) -> int:
        """Bytes of the block Linears as stored: 2 per weight in bf16, bits/8 plus a bf16 scale per group."""
        n = self._linear_elements()
        bits = int(config["weight_bits"])
        if bits == 16:
            return 2 * n
        scales = 2 * n // int(config["group_size"])
        int8 = n * rules.int8_first_blocks(config) // self.cfg.n_layers
        return (n - int8) * bits // 8 + int8 + scales

    def head_bytes(self, config: dict[str, Any]) -> int:
        """Bytes the LM head reads a step: the tied ``vocab x d_model`` bf16 embedding, or with ``lm_head_bits``
        8 / 4 its quantized copy (bits/8 a weight plus a bf16 scale per group)."""
        n = self.cfg.vocab_size * self.cfg.d_model
        bits = rules.lm_head_bits(config)
        return 2 * n if bits == 16 else n * bits // 8 + 2 * n // int(config["group_size"])

    def kv_bytes(self, config: dict[str, Any]) -> int:
        """Bytes of the whole KV cache (k and v of every layer, ``max_len`` positions)."""
        c = self.cfg
        return 2 * c.n_layers * self._batch(config) * self.max_len * c.d_model * KV_BYTES[config["kv_dtype"]]

    def memory_estimate(self, config: dict[str, Any]) -> int:
        """Rough device bytes of a trial: bf16 reference and variant, both caches, logits buffers."""
        c = self.cfg
        others = 2 * (c.vocab_size + c.seq_len) * c.d_model
        logits = 3 * self._logits_bytes(config)
        ref_cache = self.kv_bytes({**config, "kv_dtype": "bf16"})
        return (
            2 * self._linear_elements()
            + others
            + self.weight_bytes(config)
            + (self.head_bytes(config) if rules.lm_head_bits(config) != 16 else 0)  # beside the bf16 embedding
            + ref_cache
            + self.kv_bytes(config)
            + (logits)
        )

    def work(self, config: dict[str, Any]) -> tuple[float, float, str | None]:
        """FLOPs and fewest bytes of the timed loop (``gen_tokens`` steps), bf16 compute.

        FLOPs: ``batch * gen_tokens`` tokens at ``models.gpt.model_flops_per_token(training=False)`` with the
        mean context of the steps (``prompt_len + (gen_tokens + 1) / 2`` positions). Bytes per step: the
        block Linears as stored, the LM head as stored (:meth:`head_bytes`) and the cache positions attended (k
        and v of the mean context).
        """
        c = self.cfg
        batch = self._batch(config)
        context = self.prompt_len + (self.gen_tokens + 1) / 2
        flops = batch * self.gen_tokens * model_flops_per_token(c, training=False, context_len=context)  # type: ignore[arg-type]
        kv_step = 2 * c.n_layers * batch * context * c.d_model * KV_BYTES[config["kv_dtype"]]
        per_step = self.weight_bytes(config) + self.head_bytes(config) + kv_step
        return float(flops), float(per_step * self.gen_tokens), "bf16"

    # ------------------------------------------------------------------ one trial

    def _case(self, config: dict[str, Any], device: DeviceInfo) -> _Case:
        """The config's case (kept per worker), its prompt prefilled and one eager step (and graph capture) done."""
        import torch

        case = self._get_case(config, device)
        with torch.no_grad():
            case.model.prefill(case.ref.prompt, case.cache)
            self._warm_up(config, case, device)
        return case

    def _outputs(self, case: _Case) -> list[Any]:
        return [case.out]

    def _check(self, config: dict[str, Any], case: _Case) -> Checked:
        check = self._logit_errors(case)
        extra: dict[str, Any] = {
            "ref_logit_std": check["ref_logit_std"],
            "top1_same_index": check.get("top1_same_index"),
            "model_bytes": case.model_bytes,
            "kv_cache_bytes": case.cache.nbytes(),
            "transient_bytes": case.transient_bytes,
            "batch": case.batch,
        }
        errors = {k: check[k] for k in ("max_logit_error", "mean_logit_error", "top1_agreement")}
        return Checked(errors, failure=check["failure"], extra=extra)

    def _metrics(self, config: dict[str, Any], case: _Case, median_ms: float) -> dict[str, float]:
        loop_s = median_ms * 1e-3
        peak = case.model_bytes + case.cache.nbytes() + case.transient_bytes
        return {
            "tokens_per_s": case.batch * self.gen_tokens / loop_s if loop_s > 0 else math.inf,
            "ms_per_token": median_ms / self.gen_tokens,
            "peak_mem_gb": peak / 1e9,
            "latency_ms": median_ms,
        }

    def _launch(self, config: dict[str, Any], case: _Case) -> None:
        """The timed decode loop: ``gen_tokens`` teacher-forced steps from ``pos = prompt_len``, logits into
        ``case.out``; each step is the captured graph's replay with ``cuda_graphs``, else eager launches."""
        import torch

        with torch.no_grad():
            case.pos.fill_(self.prompt_len)
            for _ in range(self.gen_tokens):
                if case.graph is not None:
                    case.graph.replay()
                else:
                    self._step(case)

    def _step(self, case: _Case) -> None:
        """One decode step at ``case.pos``: teacher token in, logits to ``case.out[pos - prompt_len]``, pos += 1.

        Every index is a device tensor, so the step holds no host synchronization and can be captured.
        """
        index = case.pos.view(1) - self.prompt_len
        tokens = case.ref.teacher.index_select(0, index).view(case.batch, 1)
        logits = case.decode(tokens, case.cache, case.pos)
        case.out.index_copy_(0, index, logits.view(1, case.batch, -1).float())
        case.pos.add_(1)

    def _warm_up(self, config: dict[str, Any], case: _Case, device: DeviceInfo) -> None:
        """One eager step (compiles Triton kernels; its transient memory is measured on a GPU), then the
        CUDA graph capture of one step when ``cuda_graphs`` and none is held yet."""
        import torch

        case.pos.fill_(self.prompt_len)
        if not device.is_gpu:
            self._step(case)
            return
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        self._step(case)
        torch.cuda.synchronize()
        case.transient_bytes = max(0, torch.cuda.max_memory_allocated() - before)
        if config["cuda_graphs"] and case.graph is None:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up on a side stream before capture, as torch.cuda.graphs asks
                    case.pos.fill_(self.prompt_len)
                    self._step(case)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            case.pos.fill_(self.prompt_len)
            # thread_local: other threads of the worker may compile (prepare) while this one captures.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._step(case)
            torch.cuda.synchronize()
            case.graph = graph

    def _logit_errors(self, case: _Case) -> dict[str, Any]:
        """Errors of ``case.out`` against the reference, one step at a time (no [G, B, V] temporaries)."""
        import torch

        out, ref = case.out, case.ref
        non_finite = int((~torch.isfinite(out)).sum())
        result: dict[str, Any] = {"ref_logit_std": float(ref.logits.std())}
        if non_finite:
            result.update(max_logit_error=math.inf, mean_logit_error=math.inf, top1_agreement=0.0)
            result["failure"] = f"{non_finite} of {out.numel()} logits are NaN/inf (unwritten or overflowed)"
            return result
        max_error, total_error, agree, same_index = 0.0, 0.0, 0, 0
        for t in range(self.gen_tokens):
            diff = (out[t] - ref.logits[t]).abs()
            max_error = max(max_error, float(diff.max()))
            total_error += float(diff.sum(dtype=torch.float64))
            chosen = out[t].argmax(dim=-1)
            # A token the reference ties for first (bf16 logits are 1/16 apart at magnitude 8-16, and
            # the reference's own argmax takes the lowest index of a tie) is the reference's choice too.
            best = ref.logits[t].gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
            agree += int((best >= ref.logits[t].amax(dim=-1)).sum())
            same_index += int((chosen == ref.top1[t]).sum())
        positions = self.gen_tokens * case.batch
        top1 = agree / positions
        result.update(
            max_logit_error=max_error,
            mean_logit_error=total_error / out.numel(),
            top1_agreement=top1,
            top1_same_index=same_index / positions,
            failure=None,
        )
        if top1 < self.min_top1_agreement:
            result["failure"] = (
                f"top1_agreement {top1:.3f} with the bf16 model is below min_top1_agreement "
                f"{self.min_top1_agreement:g}: the decode is wrong, not merely quantized"
            )
        return result

    # ------------------------------------------------------------------ cases (models and references: DecodeModels)

    def prepare_weights(self, config: dict[str, Any], device: DeviceInfo) -> float:
        """Quantize a GPTQ config's weights now, outside any trial, and return the seconds it took.

        The layers go to the disk cache of :func:`gptq_model`, so the trials that use them load them
        instead of spending their study's budget on GPTQ. Other configs have nothing to prepare (0.0).
        """
        import time

        if rules.quantizer(config) != "gptq":
            return 0.0
        start = time.perf_counter()
        torch_device = "cuda" if device.is_gpu else "cpu"
        base = self.models.base(config["attention"], torch_device)
        bits, group = int(config["weight_bits"]), int(config["group_size"])
        gptq_model(base, self.cfg, self.seed, self.train_steps, bits, group, rules.int8_first_blocks(config))
        return time.perf_counter() - start

    def reference_tokens(self, batch: int, device: DeviceInfo) -> dict[str, Any]:
        """:meth:`DecodeModels.reference_stats` on this device."""
        return self.models.reference_stats(batch, "cuda" if device.is_gpu else "cpu")

    def _logits_bytes(self, config: dict[str, Any]) -> int:
        """Bytes of one logits buffer of the decode loop: ``[gen_tokens, batch, vocab]`` fp32."""
        return 4 * self.gen_tokens * self._batch(config) * self.cfg.vocab_size

    def _case_bytes(self, config: dict[str, Any]) -> int:
        """Device bytes a new case allocates: its KV cache and its logits buffer."""
        return self.kv_bytes(config) + self._logits_bytes(config)

    def _make_room(self, config: dict[str, Any], device: DeviceInfo) -> None:
        """Free the oldest cases (cache, buffers, graph) until fewer than :data:`MAX_CASES` remain and, on a
        GPU, until twice the new case's bytes are free (the rest of a step's transients fit in that)."""
        import torch

        def short_of_memory() -> bool:
            if not device.is_gpu:
                return False
            free, _ = torch.cuda.mem_get_info()
            return free < 2 * self._case_bytes(config)

        while self._cases and (len(self._cases) >= MAX_CASES or short_of_memory()):
            self._cases.popitem(last=False)
            if device.is_gpu:
                torch.cuda.empty_cache()

    def _get_case(self, config: dict[str, Any], device: DeviceInfo) -> _Case:
        """The config's case: one of the last :data:`MAX_CASES` configs' cases, or built (the oldest freed first)."""
        import torch

        torch_device = "cuda" if device.is_gpu else "cpu"
        batch = self._batch(config)
        bits, group = int(config["weight_bits"]), config.get("group_size")
        keep = rules.int8_first_blocks(config)
        quantizer, quant_kernel = rules.quantizer(config), rules.quant_kernel(config)
        key = (
            torch_device,
            batch,
            bits,
            group,
            keep,
            quantizer,
            quant_kernel,
            rules.lm_head_bits(config),
            rules.fuse_gelu(config),
            rules.split_sums(config),
            rules.pdl(config),
            config["kv_dtype"],
            config["attention"],
            bool(config["cuda_graphs"]),
            rules.compile_mode(config),
        )
        case = self._cases.get(key)
        if case is not None:
            self._cases.move_to_end(key)
            return case
        self._make_room(config, device)
        ref = self.models.reference(batch, torch_device)
        model, model_bytes = self.models.variant(
            config["attention"], bits, group, torch_device, keep, quantizer, quant_kernel or "tiled",
            rules.lm_head_bits(config), rules.fuse_gelu(config),
            rules.pdl(config) and config["attention"] == "flash_decode",
        )
        if bits != 16 and device.is_gpu:
            from models.quant_linear import autotune_tiles

            # measured kernel tiles for this batch, before any graph capture; with split_sums=fused(16) the split-K
            # tiles may leave their partial products to the next operation (Inductor sums them there)
            autotune_tiles(model, batch, partials=rules.partials_store(config), pdl=rules.pdl(config))
        kv = model.init_cache(batch, self.max_len, getattr(torch, KV_TORCH_DTYPES[config["kv_dtype"]]), torch_device)
        decode = model.decode
        if rules.compile_mode(config) != "off":
            # Fresh dynamo caches: every model's decode shares one code object, whose recompile limit
            # would otherwise count every earlier case (then fall back to eager without a word). Cases
            # compiled before recompile in their untimed warm-up step; captured graphs are unaffected.
            torch._dynamo.reset()
            # static shapes (the position is a device tensor): one graph, no recompiles across steps
            decode = compile_decode(model.decode, rules.compile_mode(config), rules.pdl(config))
        case = _Case(
            key=key,
            batch=batch,
            model=model,
            decode=decode,
            cache=kv,
            ref=ref,
            pos=torch.full((), self.prompt_len, dtype=torch.long, device=torch_device),
            out=torch.empty_like(ref.logits),
            model_bytes=model_bytes,
        )
        self._cases[key] = case
        return case

    # ------------------------------------------------------------------ exports

    def export_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """What a serving loop needs: batch, weight quantization, KV dtype (torch name), attention, graphs."""
        bits = int(config["weight_bits"])
        return {
            "model": self.model_arg,
            "batch": self._batch(config),
            "weight_bits": bits,
            "group_size": None if bits == 16 else int(config["group_size"]),
            "int8_first_blocks": rules.int8_first_blocks(config),
            "quantizer": rules.quantizer(config),
            "quant_kernel": rules.quant_kernel(config),
            "lm_head_bits": rules.lm_head_bits(config),
            "fuse_gelu": rules.fuse_gelu(config),
            "kv_cache_dtype": f"torch.{KV_TORCH_DTYPES[config['kv_dtype']]}",
            "attention": config["attention"],
            "cuda_graphs": bool(config["cuda_graphs"]),
            "compile": rules.compile_mode(config),
            "split_sums": rules.split_sums(config),
            "pdl": rules.pdl(config),
        }

    def export_python(self, config: dict[str, Any]) -> str:
        """Python that builds the tuned decoder with ``models.gpt``, ``models.quant_linear`` (and ``models.gptq``)."""
        from objectives.decode_export import decoder_source

        return decoder_source(self.export_config(config))
