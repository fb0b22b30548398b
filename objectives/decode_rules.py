"""The ``decode_step`` workload's knob values, its optional knobs' defaults and its static rules.

Torch-free, as :class:`objectives.decode_step.DecodeStep`'s ``__init__`` and ``static_check`` are: a study's
configs are checked in the server before any worker imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from models.config import GPTConfig
from tuner.workloads.base import DeviceInfo, interpreter_active, missing_params

WEIGHT_BITS: tuple[int, ...] = (16, 8, 4)
KV_DTYPES: tuple[str, ...] = ("bf16", "fp8_e4m3")
ATTENTION: tuple[str, ...] = ("sdpa", "math", "flash_decode")
PARAMS: tuple[str, ...] = ("weight_bits", "kv_dtype", "attention", "cuda_graphs")
QUANTIZERS: tuple[str, ...] = ("rtn", "gptq")
#: The weight-only GEMM a quantized Linear runs on the GPU (models/quant_linear.py): ``tiled``
#: (kernels/quant/quant_gemm.py) or ``packed`` (kernels/quant/quant_gemm_packed.py, one launch per product).
QUANT_KERNELS: tuple[str, ...] = ("tiled", "packed")
COMPILE_MODES: tuple[str, ...] = ("off", "default")
#: Where a packed split-K tile's partial products are summed: in the kernel (atomics, the last program writes Y)
#: or by the next operation of the compiled step (``PARTIALS`` tiles, :func:`models.quant_tiles.partial_candidates`),
#: the partials in fp32 (``fused``) or in the activations' 16-bit dtype (``fused16``: half the bytes); each
#: value's ``PARTIALS`` store (:func:`models.quant_linear.autotune_tiles`' ``partials``).
PARTIALS_STORE: dict[str, int] = {"kernel": 0, "fused": 1, "fused16": 2}
#: The ``split_sums`` values.
SPLIT_SUMS: tuple[str, ...] = tuple(PARTIALS_STORE)


# ------------------------------------------------------------------------------------------ optional knobs


def int8_first_blocks(config: dict[str, Any]) -> int:
    """The config's ``int8_first_blocks`` (optional: 0 when absent), once ``static_check`` accepted it."""
    return int(config.get("int8_first_blocks") or 0)


def compile_mode(config: dict[str, Any]) -> str:
    """The config's ``compile`` (optional: ``off`` when absent)."""
    return str(config.get("compile") or "off")


def split_sums(config: dict[str, Any]) -> str:
    """The config's ``split_sums`` (optional: ``kernel`` when absent)."""
    return str(config.get("split_sums") or "kernel")


def partials_store(config: dict[str, Any]) -> int:
    """The ``PARTIALS`` value the config's split-K tiles may take: 0 (sums in the kernel), 1 (fp32 partials summed
    by the next operation) or 2 (partials in the activations' dtype)."""
    return PARTIALS_STORE[split_sums(config)]


def pdl(config: dict[str, Any]) -> bool:
    """The config's ``pdl`` (optional: false when absent): the compiled step's kernels launched as programmatic
    dependents of the kernel before them (Inductor's, and with the packed kernel the warp-specialized int4/int8
    tiles', which copy their first words before waiting)."""
    return bool(config.get("pdl"))


def quant_kernel(config: dict[str, Any]) -> str | None:
    """The config's ``quant_kernel`` (optional: ``tiled`` when absent); None for bf16 weights."""
    if int(config["weight_bits"]) == 16:
        return None
    return str(config.get("quant_kernel") or "tiled")


def lm_head_bits(config: dict[str, Any]) -> int:
    """The config's ``lm_head_bits`` (optional: 16 when absent): the tied LM head as it is (16) or a weight-only
    quantized copy of the embedding (8, 4; quantized configs only)."""
    return int(config.get("lm_head_bits") or 16)


def fuse_gelu(config: dict[str, Any]) -> bool:
    """The config's ``fuse_gelu`` (optional: false when absent): the MLP's GELU applied in the epilogue of its
    ``fc`` product (packed kernel), not by a kernel of its own."""
    return bool(config.get("fuse_gelu"))


def quantizer(config: dict[str, Any]) -> str | None:
    """The config's ``quantizer`` (optional: ``rtn`` when absent); None for bf16 weights."""
    if int(config["weight_bits"]) == 16:
        return None
    return str(config.get("quantizer") or "rtn")


# ------------------------------------------------------------------------------------------ static rules


def static_violation(
    config: dict[str, Any],
    device: DeviceInfo,
    cfg: GPTConfig,
    fixed_batch: int | None,
    memory_estimate: Callable[[dict[str, Any]], int],
) -> str | None:
    """Why ``config`` cannot run on ``device`` (None when it can), for the model ``cfg`` with the batch fixed by the
    workload's args (``fixed_batch``, None when it is a knob); ``memory_estimate`` gives a config's bytes."""
    required = ("batch", *PARAMS) if fixed_batch is None else PARAMS
    reason = missing_params(config, required) or _batch_reason(config, fixed_batch)
    if reason:
        return reason
    bits = config["weight_bits"]
    if bits not in WEIGHT_BITS:
        return f"weight_bits must be one of {WEIGHT_BITS}, got {bits!r}"
    reason = _weights_reason(config, bits, cfg)
    if reason:
        return reason
    if config["kv_dtype"] not in KV_DTYPES:
        return f"kv_dtype must be one of {KV_DTYPES}, got {config['kv_dtype']!r}"
    return (
        _attention_reason(config, device, cfg)
        or _compile_reason(config, device)
        or _device_reason(config, device, memory_estimate)
    )


def _batch_reason(config: dict[str, Any], fixed_batch: int | None) -> str | None:
    """The batch: the args' one when they fix it, else a knob in [1, 1024]."""
    if fixed_batch is not None and "batch" in config and config["batch"] != fixed_batch:
        return f"batch is fixed to {fixed_batch} by the workload's args, config asks for {config['batch']!r}"
    batch = config.get("batch", fixed_batch)
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 1024:
        return f"batch must be an int in [1, 1024], got {batch!r}"
    return None


def _weights_reason(config: dict[str, Any], bits: int, cfg: GPTConfig) -> str | None:
    """The quantized weights' knobs: group size, int8 first blocks, quantizer, kernel, LM head bits, fused GELU."""
    group = config.get("group_size")
    if bits == 16 and group is not None:
        return "group_size applies to quantized weights only (weight_bits < 16)"
    if bits < 16:
        if not isinstance(group, int) or isinstance(group, bool) or group < 32 or group & (group - 1):
            return f"group_size must be a power of two >= 32 for int{bits} weights, got {group!r}"
        for name, k in (("d_model", cfg.d_model), ("d_ff", cfg.ff)):
            if k % group:
                return f"group_size={group} does not divide {name}={k} (the K of a quantized Linear)"
    keep = config.get("int8_first_blocks") or 0
    if isinstance(keep, bool) or not isinstance(keep, int) or not 0 <= keep <= cfg.n_layers:
        return f"int8_first_blocks must be an int in [0, {cfg.n_layers}] (the model's blocks), got {keep!r}"
    if keep and bits != 4:
        return f"int8_first_blocks applies to int4 weights, weight_bits is {bits}"
    quantizer = config.get("quantizer")
    if quantizer is not None and quantizer not in QUANTIZERS:
        return f"quantizer must be one of {QUANTIZERS}, got {quantizer!r}"
    if quantizer is not None and bits == 16:
        return "quantizer applies to quantized weights only (weight_bits < 16)"
    reason = _quant_kernel_reason(config.get("quant_kernel"), bits, cfg)
    if reason:
        return reason
    head = config.get("lm_head_bits")
    if head is not None and (isinstance(head, bool) or head not in WEIGHT_BITS):
        return f"lm_head_bits must be one of {WEIGHT_BITS}, got {head!r}"
    if head is not None and head != 16 and bits == 16:
        return "lm_head_bits < 16 quantizes the LM head of a quantized model: it needs weight_bits < 16"
    if head is not None and head != 16 and quant_kernel(config) == "packed" and cfg.d_model % (16 * 32 // head):
        return (f"lm_head_bits={head} with quant_kernel=packed needs d_model={cfg.d_model} to be a multiple of "
                f"{16 * 32 // head} (the int{head} span: the head's K is d_model)")  # fmt: skip
    if config.get("fuse_gelu") is not None and not isinstance(config["fuse_gelu"], bool):
        return f"fuse_gelu must be true or false, got {config['fuse_gelu']!r}"
    if fuse_gelu(config) and quant_kernel(config) != "packed":
        return "fuse_gelu applies the MLP's GELU in the packed kernel's epilogue: it needs quant_kernel=packed"
    return None


def _attention_reason(config: dict[str, Any], device: DeviceInfo, cfg: GPTConfig) -> str | None:
    """The attention kernel of one query over the cache."""
    attention = config["attention"]
    if attention == "triton":
        return "attention='triton': the flash kernel cannot attend one query over a masked cache (decode_step)"
    if attention not in ATTENTION:
        return f"attention must be one of {ATTENTION}, got {attention!r}"
    if attention == "flash_decode":
        d = cfg.head_dim
        if d & (d - 1) or not 16 <= d <= 256:
            return f"attention=flash_decode needs a head_dim that is a power of two in [16, 256], the model has {d}"
        if not device.is_gpu and not interpreter_active():
            return ("attention=flash_decode runs a Triton kernel (kernels/attention/decode_attention.py): "
                    "on a CPU only under the interpreter (TRITON_INTERPRET=1)")  # fmt: skip
    return None


def _compile_reason(config: dict[str, Any], device: DeviceInfo) -> str | None:
    """torch.compile and what needs it: split-K sums left to the next operation, programmatic dependent launch."""
    if config.get("compile") is not None and config["compile"] not in COMPILE_MODES:
        return f"compile must be one of {COMPILE_MODES}, got {config['compile']!r}"
    sums = config.get("split_sums")
    if sums is not None and sums not in SPLIT_SUMS:
        return f"split_sums must be one of {SPLIT_SUMS}, got {sums!r}"
    if partials_store(config) and (compile_mode(config) == "off" or quant_kernel(config) != "packed"):
        return (
            f"split_sums={sums} leaves split-K's sums to the next operation, which only torch.compile fuses them "
            "into: it needs compile=default and quant_kernel=packed"
        )
    if config.get("pdl") is not None and not isinstance(config["pdl"], bool):
        return f"pdl must be true or false, got {config['pdl']!r}"
    if pdl(config) and compile_mode(config) == "off":
        return (
            "pdl launches the compiled step's kernels (Inductor's, and the packed layers' warp-specialized tiles) "
            "as programmatic dependents: it needs compile=default"
        )
    if pdl(config) and device.is_gpu and device.compute_capability is not None and (
        tuple(device.compute_capability) < (9, 0)
    ):
        return f"pdl (programmatic dependent launch) needs compute capability >= 9.0, {device.name} has " + (
            f"{device.compute_capability}"
        )
    return None


def _device_reason(
    config: dict[str, Any], device: DeviceInfo, memory_estimate: Callable[[dict[str, Any]], int]
) -> str | None:
    """CUDA graphs, the compute capability and the memory the config needs on ``device``."""
    if not isinstance(config["cuda_graphs"], bool):
        return f"cuda_graphs must be true or false, got {config['cuda_graphs']!r}"
    if config["cuda_graphs"] and not device.is_gpu:
        return "cuda_graphs needs a CUDA device (torch.cuda.graph); this trial runs on a CPU"
    if device.is_gpu and device.compute_capability is not None and tuple(device.compute_capability) < (8, 0):
        return f"the bf16 model needs compute capability >= 8.0, {device.name} has {device.compute_capability}"
    if device.total_memory_bytes:
        needed = memory_estimate(config)
        if needed > 0.9 * device.total_memory_bytes:
            return f"needs ~{needed / 1e9:.1f} GB (weights, KV cache, reference), {device.name} has " + (
                f"{device.total_memory_bytes / 1e9:.1f} GB"
            )
    return None


def _quant_kernel_reason(kernel: Any, bits: int, cfg: GPTConfig) -> str | None:
    if kernel is None:
        return None
    if kernel not in QUANT_KERNELS:
        return f"quant_kernel must be one of {QUANT_KERNELS}, got {kernel!r}"
    if bits == 16:
        return "quant_kernel applies to quantized weights only (weight_bits < 16)"
    span = 16 * 32 // bits  # the packed layout's K span (kernels/quant/quant_gemm_packed.py)
    if kernel == "packed":
        for name, k in (("d_model", cfg.d_model), ("d_ff", cfg.ff)):
            if k % span:
                return f"quant_kernel=packed needs {name}={k} to be a multiple of {span} (its int{bits} span)"
    return None
