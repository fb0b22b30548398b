"""The ``quant_gemm`` workload: weight-only quantized ``Y = X @ dequant(W)`` with ``kernels/quant/quant_gemm.py``.

Knobs: weight ``bits`` (int4 / int8), ``group_size`` (K rows per scale), the
activation ``precision`` (bf16 / fp16), BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K,
num_warps, num_stages and, for ``tl.dot`` tiles, ``SWAP_AB`` (compute ``Y^T = W^T X^T`` so that the
decoded weights feed the MMA from registers; optional, off when absent). Metrics: effective
TFLOP/s (``2*M*N*K`` over the latency), latency, the bytes of packed weights plus scales, and the maximum
relative error against the 16-bit product of the unquantized weights, so
quantization error trades against speed and memory.

Every output is checked twice: against the unquantized product (a loose,
per-bit-width tolerance that holds the quantization error) and against the
exact product of the dequantized weights (a tight, per-precision tolerance),
so a kernel bug cannot hide inside the quantization error.

Timing: as every kernel workload's (``timing`` arg): one eager call by default, the launcher's host time
included where it exceeds the kernel's (a decode-sized product takes microseconds, so a slow launcher shows);
``timing: cuda_graph`` for a caller that replays CUDA graphs. The launches
rotate over identical copies of the weights (at least ``ROTATION_BYTES`` in
all) so that every launch reads its weights from HBM, as a decode step that
goes through a model's layers does, never from a warm L2.

torch and triton are imported inside the methods: listing workloads and
``static_check`` stay fast and never touch a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kernels.quant.quant_rules import shared_memory_bytes
from tuner.workloads.base import (
    DeviceInfo,
    MetricSpec,
    interpreter_active,
    is_pow2,
    missing_params,
    not_pow2,
    timing_comparable,
    triton_configs_python,
)
from tuner.workloads.kernel import (
    LATENCY_METRIC,
    TIMING_METRICS,
    Checked,
    KernelWorkload,
    NumericsCheck,
    Reference,
    check_timing,
)
from tuner.workloads.kernel import check_numerics as shared_check_numerics
from tuner.workloads.measure import L2_FLUSH_BYTES

PRECISIONS: tuple[str, ...] = ("bf16", "fp16")
#: Kernel variants: ``tiled`` is kernels/quant/quant_gemm.py (byte-packed weights, BLOCK_K tiles, SWAP_AB),
#: ``packed`` kernels/quant/quant_gemm_packed.py (K-interleaved int32 words, inline-PTX int4 decode, split-K
#: reduced in the kernel, BLOCK_M 1 = GEMV), ``ws`` kernels/quant/quant_gemm_ws.py (the packed words; Gluon, a TMA
#: loader warp and a decoding warpgroup on the tensor cores, Hopper only). A config without ``kernel`` is
#: ``tiled`` (older studies).
KERNELS: tuple[str, ...] = ("tiled", "packed", "ws")
#: The ``ws`` kernel's params: BLOCK_M (1 means its 8-row tile), BLOCK_N, num_stages (its ring) and programs per
#: SM, with SCALE_ACC, SWIZZLE and SLICE_WAIT optional (off when absent).
WS_PARAMS: tuple[str, ...] = ("BLOCK_M", "BLOCK_N", "num_stages", "PROGRAMS_PER_SM")
WS_FLAGS: tuple[str, ...] = ("SCALE_ACC", "SWIZZLE", "SLICE_WAIT")
PACKED_PARAMS: tuple[str, ...] = ("BLOCK_M", "BLOCK_N", "SPLIT_K", "num_warps", "num_stages")
#: The packed layout's K span per bit width and its smallest tensor-core BLOCK_M (kernels/quant/quant_gemm_packed.py
#: ``span`` and ``DOT_MIN_M``; a test keeps them equal).
PACKED_SPAN: dict[int, int] = {4: 128, 8: 64}
PACKED_DOT_MIN_M = 16
BITS: tuple[int, ...] = (4, 8)
TILE_PARAMS: tuple[str, ...] = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages")
QUANT_PARAMS: tuple[str, ...] = ("bits", "group_size", "precision")
PARAMS: tuple[str, ...] = (*QUANT_PARAMS, *TILE_PARAMS)
#: Most rows for which the space's GEMV seeds (BLOCK_M = 1, one program per row) come first.
GEMV_MAX_M = 8

#: Largest ``max|Y - Y_ref| / max|Y_ref|`` accepted, Y_ref = fp32 product of the 16-bit activations and the
#: 16-bit unquantized weights (standard-normal masters). It is the quantization error: measured with torch on
#: CPU over 60 seeds and group sizes 32/64/128, median / max: int8 0.007 / 0.018, int4 0.12 / 0.24 with
#: >= 48 outputs (0.36 with 16 outputs, M=1 N=16 K=128); with thousands of outputs (M=1..64, N >= 512,
#: K=8192) int8 <= 0.0075 and int4 <= 0.13. The kernel itself adds < 0.5% (next table).
TOLERANCE_VS_UNQUANTIZED: dict[int, float] = {8: 0.04, 4: 0.4}
#: Largest error against the fp32 product of the dequantized weights the kernel reads (no quantization error
#: left): output rounding (unit roundoff 2^-8 for bf16, 2^-11 for fp16) and, when BLOCK_K > group_size, the
#: dequantized weights rounded to 16 bits. Emulated worst case over shapes from 1x16x128 to 64x512x8192:
#: bf16 4.2e-3, fp16 6.1e-4; the interpreter gives <= 4e-4 for fp16.
TOLERANCE_VS_DEQUANTIZED: dict[str, float] = {"bf16": 1e-2, "fp16": 2e-3}
#: Smallest BLOCK_K per bit width (``tl.dot`` needs K >= 16; int4 splits a tile into even and odd K rows).
MIN_BLOCK_K: dict[int, int] = {4: 32, 8: 16}
#: Launches rotate over copies of the weights worth at least this many bytes (the stopwatch's L2 flush
#: size), so none is still in L2 (50 MiB on an H200) when it is read again; at most ``MAX_WEIGHT_COPIES``.
ROTATION_BYTES = L2_FLUSH_BYTES
MAX_WEIGHT_COPIES = 16


def _precision_reason(precision: str, device: DeviceInfo) -> str | None:
    if precision == "bf16" and (not device.is_gpu or interpreter_active()):
        return "bf16 is not checked under the Triton interpreter (it computes bf16 products wrongly)"
    if device.is_gpu and precision == "bf16" and device.compute_capability is not None:
        if tuple(device.compute_capability) < (8, 0):
            return f"bf16 needs compute capability >= 8.0, {device.name} has {device.compute_capability}"
    return None


def packed_shared_memory_bytes(values: dict[str, int]) -> int:
    """Upper bound on the packed kernel's shared memory: per stage an X span (16-bit) and a (16, BLOCK_N)
    tile of int32 words, plus the accumulator's layout conversion (4 bytes per element). Compiled for sm_90
    with Triton 3.6: 73,728 bytes at 64x128, 3 stages (bound 106,496); 16,384 at 16x128 (bound 41,984)."""
    pack = 32 // values["bits"]
    stages = max(1, values["num_stages"])
    return (
        stages * (values["BLOCK_M"] * 16 * pack * 2 + 16 * values["BLOCK_N"] * 4)
        + 4 * values["BLOCK_M"] * values["BLOCK_N"]
    )


def check_numerics(out: Any, ref: Any, dequant_ref: Any, bits: int, precision: str) -> NumericsCheck:
    """Compare the kernel's ``out`` with the unquantized and the dequantized references
    (:func:`tuner.workloads.kernel.check_numerics`; errors relative to ``max|ref|``)."""
    from kernels.gemm.gemm import max_rel_error

    references = (
        Reference(
            "max_rel_error",
            ref,
            TOLERANCE_VS_UNQUANTIZED[bits],
            f"the unquantized {precision} product",
            f"the int{bits} tolerance ",
        ),
        Reference(
            "dequant_rel_error",
            dequant_ref,
            TOLERANCE_VS_DEQUANTIZED[precision],
            "the fp32 product of the dequantized weights",
            blame=": the kernel, not the quantization, is wrong",
        ),
    )
    return shared_check_numerics(out, references, max_rel_error)


@dataclass
class _Case:
    """Operands, references and output buffers of one (bits, group_size, precision) on one device."""

    x: Any  # (M, K) activations
    weights: list[Any]  # identical kernels.quant.quant_gemm.QuantizedWeights copies; launches rotate over them
    ref: Any  # fp32 product with the unquantized 16-bit weights
    dequant_ref: Any  # fp32 product with the dequantized weights
    out: Any  # (M, N) in the activation dtype
    workspace: Any  # (M, N) float32, for SPLIT_K > 1
    weight_bytes: int
    next_copy: int = field(default=0)


class QuantGemm(KernelWorkload):
    """Y = X @ dequant(W), int4/int8 weights with per-group scales, checked twice, then timed.

    Args: ``m``, ``n``, ``k`` (positive ints; ``k`` a multiple of 128 so that every group size of the space
    and every BLOCK_K up to 128 divide it; any ``m`` and ``n``: edges are masked) and ``seed`` (int, default
    0) for the fp32 master inputs X (M, K) and W (K, N), standard normal.
    """

    name = "quant_gemm"
    shape_args = ("m", "n", "k")
    key_knobs = ("precision",)
    space_file = "quant_gemm.yaml"
    metrics = (
        MetricSpec("tflops", "maximize", "TFLOP/s", "effective: 2*M*N*K / median latency"),
        LATENCY_METRIC,
        *TIMING_METRICS,
        MetricSpec("weight_bytes", "minimize", "B", "packed weights plus scales (one copy)"),
        MetricSpec(
            "max_rel_error",
            "minimize",
            "",
            "max|Y - Y_ref| / max|Y_ref|, Y_ref = fp32 product of the 16-bit activations and unquantized weights",
        ),
    )
    description = "Weight-only int4/int8 GEMM (kernels/quant/quant_gemm.py): group size, tiles, split-K, warps, stages"

    def __init__(self, m: int, n: int, k: int, seed: int = 0, timing: str = "eager") -> None:
        for arg, value in (("m", m), ("n", n), ("k", k)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        if k % 128:
            raise ValueError(f"k must be a multiple of 128 (every group size and BLOCK_K <= 128 divide it), got {k}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        super().__init__()
        self.timing = check_timing(timing)
        self.m, self.n, self.k, self.seed = m, n, k, seed

        self._masters: dict[str, tuple[Any, Any]] = {}
        self._refs: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._cases: dict[tuple[int, int, str, str], _Case] = {}

    def space_document(self) -> dict[str, Any]:
        """The space file, its GEMV seeds (``BLOCK_M: 1``) first for up to :data:`GEMV_MAX_M` rows and
        dropped above: one row per program pays off for a few rows only."""
        document = super().space_document()
        seeds = document.get("seeds") or []
        gemv = [seed for seed in seeds if seed.get("BLOCK_M") == 1]
        mma = [seed for seed in seeds if seed.get("BLOCK_M") != 1]
        document["seeds"] = gemv + mma if self.m <= GEMV_MAX_M else mma
        return document

    @property
    def flops(self) -> int:
        """Floating-point operations of one product: 2*M*N*K."""
        return 2 * self.m * self.n * self.k

    # ------------------------------------------------------------------ static feasibility

    def static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        kernel = config.get("kernel", "tiled")
        if kernel not in KERNELS:
            return f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}"
        if kernel == "packed":
            return self._packed_static_check(config, device)
        if kernel == "ws":
            return self._ws_static_check(config, device)
        reason = missing_params(config, PARAMS)
        if reason:
            return reason
        precision = config["precision"]
        if precision not in PRECISIONS:
            return f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        try:
            values = {p: int(config[p]) for p in (*TILE_PARAMS, "bits", "group_size")}
        except (TypeError, ValueError):
            return f"bits, group_size and tile parameters must be ints, got {[config[p] for p in PARAMS]}"
        bits, group = values["bits"], values["group_size"]
        if bits not in BITS:
            return f"bits must be 4 or 8, got {bits}"
        if not is_pow2(group) or group < 16 or self.k % group:
            return f"group_size={group} must be a power of two >= 16 dividing k={self.k}"
        reason = not_pow2(values, ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps"))
        if reason:
            return reason
        if (values["BLOCK_M"] != 1 and values["BLOCK_M"] < 16) or values["BLOCK_N"] < 16:
            return (
                "BLOCK_M must be 1 (the GEMV kernel) or >= 16 (tl.dot), and BLOCK_N >= 16, got "
                f"{values['BLOCK_M']} and {values['BLOCK_N']}"
            )
        swap = config.get("SWAP_AB")
        if swap is not None and not (isinstance(swap, bool) or swap in (0, 1)):
            return f"SWAP_AB must be 0/1 or a bool, got {swap!r}"
        if swap and values["BLOCK_M"] == 1:
            return "SWAP_AB applies to tl.dot tiles (BLOCK_M >= 16), not the GEMV kernel (BLOCK_M = 1)"
        if values["BLOCK_K"] < MIN_BLOCK_K[bits]:
            return f"int{bits} needs BLOCK_K >= {MIN_BLOCK_K[bits]}, got {values['BLOCK_K']}"
        if values["SPLIT_K"] < 1 or values["num_stages"] < 1 or values["num_warps"] > 32:
            return f"need SPLIT_K >= 1, num_stages >= 1 and num_warps <= 32, got {values}"
        if self.k % (values["SPLIT_K"] * values["BLOCK_K"]):
            return f"SPLIT_K * BLOCK_K = {values['SPLIT_K']} * {values['BLOCK_K']} does not divide k={self.k}"
        reason = _precision_reason(precision, device)
        if reason:
            return reason
        smem = shared_memory_bytes({**config, **values})
        if device.smem_per_block_bytes is not None and smem > device.smem_per_block_bytes:
            return f"needs ~{smem} bytes of shared memory, {device.name} allows {device.smem_per_block_bytes}"
        return None

    def _packed_static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        """The packed kernel's rules: BLOCK_M 1 or >= 16, K a multiple of SPLIT_K spans, shared memory.
        (Pure Python: importing the kernel module here would fix Triton's interpreter mode too early.)"""
        reason = missing_params(config, (*QUANT_PARAMS, *PACKED_PARAMS))
        if reason:
            return reason
        try:
            values = {p: int(config[p]) for p in (*PACKED_PARAMS, "bits", "group_size")}
        except (TypeError, ValueError):
            return f"bits, group_size and tile parameters must be ints, got { {p: config[p] for p in PACKED_PARAMS} }"
        bits, group, block_m = values["bits"], values["group_size"], values["BLOCK_M"]
        if bits not in BITS:
            return f"bits must be 4 or 8, got {bits}"
        if not is_pow2(group) or group < 16 or self.k % group:
            return f"group_size={group} must be a power of two >= 16 dividing k={self.k}"
        reason = not_pow2(values, ("BLOCK_M", "BLOCK_N", "num_warps"))
        if reason:
            return reason
        if 1 < block_m < PACKED_DOT_MIN_M or values["BLOCK_N"] < 16:
            return f"BLOCK_M must be 1 (GEMV) or >= {PACKED_DOT_MIN_M} (tensor cores), BLOCK_N >= 16, got {block_m}"
        span = PACKED_SPAN[bits]
        if values["SPLIT_K"] < 1 or self.k % (values["SPLIT_K"] * span):
            return f"SPLIT_K * {span} (the int{bits} span) = {values['SPLIT_K'] * span} must divide k={self.k}"
        for flag in ("PREFETCH", "SWAP_AB"):
            if config.get(flag, 0) not in (0, 1, False, True, None):
                return f"{flag} must be 0 or 1, got {config.get(flag)!r}"
        if config.get("TMA", 0) not in (0, 1, 2, False, True, None):
            return f"TMA must be 0, 1 (the words by tensor copies) or 2 (X too), got {config.get('TMA')!r}"
        if config.get("TMA") == 2 and not (config.get("SWAP_AB") and config.get("SPAN_DOT") and group >= span):
            got = f"SWAP_AB={config.get('SWAP_AB')!r}, SPAN_DOT={config.get('SPAN_DOT')!r}, group_size={group}"
            return (f"TMA=2 (X by tensor copies) needs a span-wide swapped tile: SWAP_AB 1, SPAN_DOT >= 1 and "
                    f"group_size >= {span}, got {got}")  # fmt: skip
        if config.get("SWAP_AB") and block_m == 1:
            return "SWAP_AB applies to tensor-core tiles (BLOCK_M >= 16), not the GEMV (BLOCK_M = 1)"
        if config.get("SPAN_DOT", 0) not in (0, 1, 2, None):
            return f"SPAN_DOT must be 0, 1 or 2, got {config.get('SPAN_DOT')!r}"
        if config.get("SPAN_DOT") and not config.get("SWAP_AB"):
            return "SPAN_DOT applies to swapped tiles (SWAP_AB = 1)"
        stream = config.get("STREAM") or 0
        if not isinstance(stream, int) or isinstance(stream, bool) or stream < 0:
            return f"STREAM (programs per multiprocessor) must be an int >= 0, got {stream!r}"
        if stream and values["SPLIT_K"] != 1:
            split = values["SPLIT_K"]
            return f"STREAM shares each tile's K spans among the programs itself: SPLIT_K must be 1, got {split}"
        if config.get("TMA"):
            if (self.n * 4) % 16:
                return f"TMA needs n a multiple of 4 (16-byte rows of int32 words), got n={self.n}"
            cc = device.compute_capability
            if device.is_gpu and cc is not None and tuple(cc) < (9, 0):
                return f"TMA needs compute capability >= 9.0 (Hopper), {device.name} has {cc}"
        reason = _precision_reason(config["precision"], device)
        if reason:
            return reason
        smem = packed_shared_memory_bytes(values)
        if device.smem_per_block_bytes is not None and smem > device.smem_per_block_bytes:
            return f"needs ~{smem} bytes of shared memory, {device.name} allows {device.smem_per_block_bytes}"
        return None

    def _ws_static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        """The Gluon kernel's rules (:func:`kernels.quant.quant_ws_rules.check_config`, pure Python) and its device: a
        Hopper GPU, compiled (Gluon has no interpreter)."""
        reason = missing_params(config, (*QUANT_PARAMS, *WS_PARAMS))
        if reason:
            return reason
        try:
            knobs = self._ws_knobs(config)
            bits, group = int(config["bits"]), int(config["group_size"])
        except (TypeError, ValueError):
            return f"bits, group_size and the ws params must be ints, got { {p: config.get(p) for p in WS_PARAMS} }"
        if config["BLOCK_M"] not in (1, 8, 16, 32, 64):
            return f"the ws kernel's BLOCK_M must be 1 (its 8-row tile), 8, 16, 32 or 64, got {config['BLOCK_M']!r}"
        cc = device.compute_capability
        if not device.is_gpu or interpreter_active() or cc is None or tuple(cc) < (9, 0):
            return f"kernel ws (Gluon, wgmma and TMA) runs only compiled on a Hopper GPU (sm_90), not on {device.name}"
        from kernels.quant.quant_ws_rules import check_config

        reason = check_config(self.m, self.n, self.k, bits, group, **knobs)
        if reason:
            return reason
        return _precision_reason(config["precision"], device)

    # ------------------------------------------------------------------ compile ahead

    def _compile(self, config: dict[str, Any], device: DeviceInfo) -> None:
        """Compile for the calling thread's current CUDA device without launching (``compile_only``)."""
        if config.get("kernel") == "ws":
            from kernels.quant.quant_gemm import ACT_DTYPES
            from kernels.quant.quant_gemm_ws import compile_only as compile_ws

            compile_ws(self.m, self.n, self.k, bits=int(config["bits"]), group_size=int(config["group_size"]),
                       precision=ACT_DTYPES[config["precision"]], **self._ws_knobs(config))  # fmt: skip
            return
        if config.get("kernel") == "packed":
            from kernels.quant.quant_gemm_packed import compile_only as compile_packed

            compile_packed(self.m, self.n, self.k, precision=config["precision"], bits=int(config["bits"]),
                           group_size=int(config["group_size"]), **self._packed_tile(config))  # fmt: skip
            return
        from kernels.quant.quant_gemm import compile_only

        compile_only(
            self.m,
            self.n,
            self.k,
            precision=config["precision"],
            bits=int(config["bits"]),
            group_size=int(config["group_size"]),
            **self._tile(config),
        )

    # ------------------------------------------------------------------ one trial

    def _launch(self, config: dict[str, Any], case: _Case) -> None:
        """One product into ``case.out``, reading the next copy of the weights (the only launch path)."""
        weights = case.weights[case.next_copy]
        case.next_copy = (case.next_copy + 1) % len(case.weights)
        if config.get("kernel") == "packed":
            from kernels.quant.quant_gemm_packed import packed_matmul

            packed_matmul(case.x, weights, out=case.out, **self._packed_tile(config))
            return
        if config.get("kernel") == "ws":
            from kernels.quant.quant_gemm_ws import ws_quant_matmul

            ws_quant_matmul(case.x, weights, out=case.out, **self._ws_knobs(config))
            return
        from kernels.quant.quant_gemm import quant_matmul

        quant_matmul(
            case.x,
            weights.qweight,
            weights.scales,
            bits=weights.bits,
            group_size=weights.group_size,
            out=case.out,
            workspace=case.workspace,
            **self._tile(config),
        )

    def _outputs(self, case: _Case) -> list[Any]:
        return [case.out]

    def _check(self, config: dict[str, Any], case: _Case) -> Checked:
        check = check_numerics(case.out, case.ref, case.dequant_ref, int(config["bits"]), config["precision"])
        checked = check.checked(weight_bytes=float(case.weight_bytes))
        return Checked(checked.metrics, checked.failure, {"weight_copies": len(case.weights), **checked.extra})

    def _metrics(self, config: dict[str, Any], case: _Case, median_ms: float) -> dict[str, float]:
        latency_s = median_ms * 1e-3
        return {"tflops": self.flops / latency_s / 1e12 if latency_s > 0 else math.inf, "latency_ms": median_ms}

    def work(self, config: dict[str, Any]) -> tuple[float, float, str | None]:
        """2mnk FLOPs; X and Y in 16 bits, the packed weights and the 16-bit scales, each moved once."""
        bits, group = int(config["bits"]), int(config["group_size"])
        moved = 2 * self.m * self.k + self.k * self.n * bits // 8 + (self.k // group) * self.n * 2 + 2 * self.m * self.n
        return float(self.flops), float(moved), config["precision"]

    def export_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """Tile kwargs and launch options as ``triton.Config`` takes them, plus the quantization it assumes
        and the function they configure (``ws``: the keyword arguments of its launcher)."""
        if config.get("kernel") == "ws":
            knobs = self._ws_knobs(config)
            return {
                "kernel": "ws",
                "function": "kernels.quant.quant_gemm_ws.ws_quant_matmul",
                "kwargs": knobs,
                "num_warps": 4,
                "num_stages": knobs["NUM_STAGES"],
                "bits": int(config["bits"]),
                "group_size": int(config["group_size"]),
                "precision": config["precision"],
            }
        if config.get("kernel") == "packed":
            tile = self._packed_tile(config)
            return {
                "kernel": "packed",
                "function": "kernels.quant.quant_gemm_packed.packed_matmul",
                "kwargs": {p: tile[p] for p in ("BLOCK_M", "BLOCK_N", "SPLIT_K", "PREFETCH", "TMA", "SWAP", "STREAM")},
                "num_warps": tile["num_warps"],
                "num_stages": tile["num_stages"],
                "bits": int(config["bits"]),
                "group_size": int(config["group_size"]),
                "precision": config["precision"],
            }
        tile = self._tile(config)
        return {
            "kernel": "tiled",
            "function": "kernels.quant.quant_gemm.quant_matmul",
            "kwargs": {p: tile[p] for p in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "SWAP_AB") if p in tile},
            "num_warps": tile["num_warps"],
            "num_stages": tile["num_stages"],
            "bits": int(config["bits"]),
            "group_size": int(config["group_size"]),
            "precision": config["precision"],
        }

    def launch_call(self, config: dict[str, Any]) -> dict[str, Any]:
        """The variant's function and its keyword arguments: ``quant_matmul(x, qweight, scales, **kwargs)``
        for the tiled kernel, ``fn(x, weights, **kwargs)`` (``kernels.quant.quant_layout`` packed weights) else."""
        kernel = config.get("kernel")
        if kernel in ("ws", "packed"):
            kwargs = self._ws_knobs(config) if kernel == "ws" else self._packed_tile(config)
            return {"function": self.export_config(config)["function"], "kwargs": kwargs}
        kwargs = {"bits": int(config["bits"]), "group_size": int(config["group_size"]), **self._tile(config)}
        return {"function": "kernels.quant.quant_gemm.quant_matmul", "kwargs": kwargs}

    def export_python(self, config: dict[str, Any]) -> str:
        """The quantization settings and a ``triton.Config`` list for ``kernels.quant.quant_gemm.quant_matmul``."""
        exported = self.export_config(config)
        quant = {key: exported[key] for key in ("bits", "group_size", "precision")}
        comment = (
            f"{self.m}x{self.n}x{self.k}: int{exported['bits']} weights, group {exported['group_size']}, "
            f"{exported['precision']} activations, for {exported['function']}"
        )
        if exported["kernel"] == "ws":  # a launcher's keyword arguments, not a triton.Config
            return (
                f"# {comment}\n"
                f"quantization = {quant!r}\n"
                "# weights = kernels.quant.quant_layout.quantize_packed(w, bits, group_size, scale_dtype=x.dtype)\n"
                "# y = kernels.quant.quant_gemm_ws.ws_quant_matmul(x, weights, **kwargs)\n"
                f"kwargs = {exported['kwargs']!r}\n"
            )
        return triton_configs_python(comment, exported, preamble=f"quantization = {quant!r}\n")

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _tile(config: dict[str, Any]) -> dict[str, int]:
        """The kernel's tile kwargs; ``SWAP_AB`` (tl.dot tiles only) is optional and off when absent."""
        tile = {p: int(config[p]) for p in TILE_PARAMS}
        if config.get("SWAP_AB") is not None:
            tile["SWAP_AB"] = int(config["SWAP_AB"])
        return tile

    @staticmethod
    def _ws_knobs(config: dict[str, Any]) -> dict[str, int]:
        """The Gluon kernel's knobs: BLOCK_M 1 is its 8-row tile, the ring ``num_stages`` deep, the loader's
        registers 24 at three or more programs an SM (else 40), the optional flags off when absent."""
        from kernels.quant.quant_ws_rules import loader_regs

        programs = int(config["PROGRAMS_PER_SM"])
        return {
            "BLOCK_M": max(8, int(config["BLOCK_M"])),
            "BLOCK_N": int(config["BLOCK_N"]),
            "NUM_STAGES": int(config["num_stages"]),
            "PROGRAMS_PER_SM": programs,
            "LOADER_REGS": loader_regs(programs),
            **{flag: int(config.get(flag) or 0) for flag in WS_FLAGS},
        }

    @staticmethod
    def _packed_tile(config: dict[str, Any]) -> dict[str, int]:
        """The packed kernel's tile kwargs; ``PREFETCH`` is on when absent, ``TMA``, ``SWAP`` and ``STREAM`` off. The
        kernel's ``SWAP`` is the space's ``SWAP_AB`` (Y's tile transposed, the decoded weights as the MMA's register
        operand) plus ``SPAN_DOT`` (0 slices, 1 one product per span, 2 with the scales folded in)."""
        tile = {p: int(config[p]) for p in PACKED_PARAMS}
        swapped = tile["BLOCK_M"] > 1 and bool(config.get("SWAP_AB"))
        return {
            **tile,
            "PREFETCH": int(config.get("PREFETCH", 1)),
            "TMA": int(config.get("TMA") or 0),
            "SWAP": 1 + int(config.get("SPAN_DOT") or 0) if swapped else 0,
            "STREAM": int(config.get("STREAM") or 0),
        }

    def _case(self, config: dict[str, Any], device: DeviceInfo) -> _Case:
        """Operands, references and buffers for the config's quantization, precision and kernel's weight
        layout, built on first use."""
        bits, group, precision = int(config["bits"]), int(config["group_size"]), config["precision"]
        torch_device = "cuda" if device.is_gpu else "cpu"
        layout = "packed" if config.get("kernel") in ("packed", "ws") else "tiled"  # ws reads the packed words
        key = (bits, group, precision, torch_device, layout)
        case = self._cases.get(key)
        if case is not None:
            return case
        import torch

        from kernels.gemm.gemm import reference_matmul
        from kernels.quant.quant_gemm import ACT_DTYPES, quantize_weights, reference_quant_matmul

        dtype = ACT_DTYPES[precision]
        masters = self._masters.get(torch_device)
        if masters is None:
            generator = torch.Generator(device=torch_device).manual_seed(self.seed)
            x_master = torch.randn((self.m, self.k), device=torch_device, generator=generator)
            w_master = torch.randn((self.k, self.n), device=torch_device, generator=generator)
            masters = self._masters[torch_device] = (x_master, w_master)
        x_master, w_master = masters
        x = x_master.to(dtype)
        refs = self._refs.get((precision, torch_device))
        if refs is None:
            ref = reference_matmul(x.to(torch.float32), w_master.to(dtype).to(torch.float32))
            refs = self._refs[(precision, torch_device)] = (x, ref)
        x, ref = refs
        weights = quantize_weights(w_master, bits, group, scale_dtype=dtype)
        dequant_ref = reference_quant_matmul(x, weights)
        if layout == "packed":
            from kernels.quant.quant_gemm_packed import repack

            weights = repack(weights.qweight, weights.scales, bits, group)  # the same values and scales
        copies = 1
        if timing_comparable(device):
            copies = max(1, min(MAX_WEIGHT_COPIES, math.ceil(ROTATION_BYTES / weights.nbytes)))
        case = _Case(
            x=x,
            weights=[weights, *(weights.clone() for _ in range(copies - 1))],
            ref=ref,
            dequant_ref=dequant_ref,
            out=torch.empty((self.m, self.n), device=torch_device, dtype=dtype),
            workspace=torch.zeros((self.m, self.n), device=torch_device, dtype=torch.float32),
            weight_bytes=weights.nbytes,
        )
        self._cases[key] = case
        return case
