"""The ``triton_gemm`` workload: one M x N x K product with the Triton kernel of ``kernels/gemm/gemm.py``.

Knobs: ``kernel`` (the variant: ``tutorial``, the tile-per-program kernel of
``kernels/gemm/gemm.py``; ``persistent_tma`` and ``persistent_tma_ws``, the persistent TMA
kernel of ``kernels/gemm/gemm_tma.py`` without and with warp specialization), BLOCK_M,
BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages, precision (fp32, tf32, bf16, fp16,
fp8), and for the persistent variants EPILOGUE_SUBTILE, FP8_FAST_ACCUM and STREAM_K (the last partial
wave of tiles split by K iterations over every SM). Metrics: TFLOP/s, latency and the
maximum relative error against an fp32 reference of the fp32 master inputs,
so the error includes input quantization and precision trades against speed.

torch and triton are imported inside the methods: listing workloads and
``static_check`` stay fast and never touch a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tuner.workloads.base import (
    DeviceInfo,
    MetricSpec,
    interpreter_active,
    missing_params,
    not_pow2,
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

PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")
TILE_PARAMS: tuple[str, ...] = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
#: The kernel variants (the ``kernel`` knob; a config without it is ``tutorial``) and the function each configures.
KERNELS: dict[str, str] = {
    "tutorial": "kernels.gemm.gemm.matmul",
    "persistent_tma": "kernels.gemm.gemm_tma.matmul_persistent",
    "persistent_tma_ws": "kernels.gemm.gemm_tma.matmul_persistent",
}
#: Precisions of the persistent TMA variants.
TMA_PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8")
#: Programs of a persistent kernel under the interpreter (no SMs to count): several, so tiles are shared.
INTERPRETER_PROGRAMS = 3

#: Largest ``max|out - ref| / max|ref|`` accepted, ref = fp32 (IEEE) product of the fp32 masters.
#: It includes input quantization: a config above it is a NUMERICS_FAIL. Measured on an H200
#: (K from 29 to 131072, standard-normal inputs): fp32 <= 6.3e-7, tf32 <= 1.1e-3,
#: fp16 <= 6e-4, bf16 <= 4.4e-3, fp8 <= 0.048; the interpreter gives the same or less.
TOLERANCE_VS_FP32: dict[str, float] = {"fp32": 1e-4, "tf32": 2e-2, "fp16": 2e-2, "bf16": 5e-2, "fp8": 0.15}
#: Largest error against the fp32 product of the very operands the kernel reads (no quantization
#: error left): catches a kernel that is wrong by less than the tolerance above. Output rounding
#: alone gives up to 2^-8 (bf16) and 2^-11 (fp16); fp32/tf32 read the masters themselves, so the
#: first check already covers them. fp8 on Hopper accumulates with reduced precision (Triton's
#: default max_num_imprecise_acc), an error that grows like sqrt(K): measured 9e-5 * sqrt(K),
#: see :func:`operand_tolerance`.
TOLERANCE_VS_OPERANDS: dict[str, float] = {"fp16": 5e-3, "bf16": 1e-2, "fp8": 2e-2}
#: With ``pad_k``, K is rounded up to a multiple of this (the largest BLOCK_K of the space), the
#: operands are copied into zero-padded buffers inside the timed call, and the kernel runs on
#: aligned rows with no K tail. Unaligned K (e.g. 8191: rows of 16382 bytes) defeats vectorized
#: and TMA loads; cuBLAS bf16 at 8192x8192 falls from 678 TFLOP/s at K=8192 to 147 at K=8191.
PAD_K_MULTIPLE = 128
#: Smallest BLOCK_K ``tl.dot`` accepts on NVIDIA GPUs (8-bit operands need K >= 32).
MIN_BLOCK_K: dict[str, int] = {"fp32": 16, "tf32": 16, "bf16": 16, "fp16": 16, "fp8": 32}
#: Compute capability each precision needs on a GPU (tensor-core tf32/bf16: Ampere; fp8: Ada/Hopper).
MIN_CAPABILITY: dict[str, tuple[int, int]] = {"tf32": (8, 0), "bf16": (8, 0), "fp8": (8, 9)}


@dataclass
class _Case:
    """Inputs, references and output buffer of one precision on one device, reused across trials."""

    inputs: Any  # kernels.gemm.gemm.GemmInputs
    ref: Any  # fp32 product of the masters
    operand_ref: Any | None  # fp32 product of the dequantized operands (None for fp32/tf32)
    out: Any
    padded: tuple[Any, Any] | None = None  # zero-padded A and B for pad_k, built on first use
    device: DeviceInfo = field(default_factory=DeviceInfo)  # where it lives (the persistent kernels' SM count)


def tma_rows_aligned(m: int, n: int, k: int, precision: str) -> bool:
    """Whether every row stride of the persistent kernels' TMA descriptors is a multiple of 16 bytes: A (and
    fp8's K-major B) rows of K elements, 16-bit B rows and C rows of N. The same rule as
    ``kernels.gemm.gemm_tma.tma_strides_aligned``, here without importing torch or triton (static checks stay light)."""
    in_bytes = 1 if precision == "fp8" else 2
    b_row = k * in_bytes if precision == "fp8" else n * in_bytes
    return all(stride % 16 == 0 for stride in (k * in_bytes, b_row, n * 2))


def operand_tolerance(precision: str, k: int) -> float:
    """Tolerance of the error against the operands' own product, for a K-deep product."""
    tolerance = TOLERANCE_VS_OPERANDS[precision]
    if precision == "fp8":
        tolerance = max(tolerance, 2e-4 * math.sqrt(k))
    return tolerance


def check_numerics(out: Any, ref: Any, operand_ref: Any | None, precision: str, k: int) -> NumericsCheck:
    """Compare the kernel's ``out`` with the fp32 reference and, for a rounded precision, with the fp32 product
    of its operands (:func:`tuner.workloads.kernel.check_numerics`; errors relative to ``max|ref|``)."""
    from kernels.gemm.gemm import max_rel_error

    references = (
        Reference("max_rel_error", ref, TOLERANCE_VS_FP32[precision], "fp32 reference", f"{precision} tolerance "),
        Reference(
            "operand_rel_error",
            operand_ref,
            math.inf if operand_ref is None else operand_tolerance(precision, k),
            f"the fp32 product of the {precision} operands",
            blame=": the kernel, not the input rounding, is wrong",
        ),
    )
    return shared_check_numerics(out, references, max_rel_error)


class TritonGemm(KernelWorkload):
    """C = A @ B with the tutorial-style Triton GEMM, checked against an fp32 reference, then timed.

    Args: ``m``, ``n``, ``k`` (positive ints, the product's shape) and ``seed``
    (int, default 0) for the fp32 master inputs (standard normal).
    """

    name = "triton_gemm"
    shape_args = ("m", "n", "k")
    key_knobs = ("precision",)
    space_file = "gemm.yaml"
    metrics = (
        MetricSpec("tflops", "maximize", "TFLOP/s", "2*M*N*K / median latency"),
        MetricSpec(
            "max_rel_error",
            "minimize",
            "",
            "max|C - C_ref| / max|C_ref|, C_ref = fp32 (IEEE) product of the fp32 master inputs",
        ),
        LATENCY_METRIC,
        *TIMING_METRICS,
    )
    description = "Triton GEMM (kernels/gemm/gemm.py): tiles, warps, stages and precision fp32/tf32/bf16/fp16/fp8"

    def __init__(self, m: int, n: int, k: int, seed: int = 0, timing: str = "eager") -> None:
        for arg, value in (("m", m), ("n", n), ("k", k)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        super().__init__()
        self.timing = check_timing(timing)
        self.m, self.n, self.k, self.seed = m, n, k, seed
        self._masters: dict[str, tuple[Any, Any, Any]] = {}
        self._cases: dict[tuple[str, str], _Case] = {}

    @property
    def flops(self) -> int:
        """Floating-point operations of one product: 2*M*N*K."""
        return 2 * self.m * self.n * self.k

    # ------------------------------------------------------------------ static feasibility

    def static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        reason = missing_params(config, (*TILE_PARAMS, "precision"))
        if reason:
            return reason
        precision = config["precision"]
        if precision not in PRECISIONS:
            return f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        try:
            tile = {p: int(config[p]) for p in TILE_PARAMS}
        except (TypeError, ValueError):
            return f"tile parameters must be ints, got {[config[p] for p in TILE_PARAMS]}"
        reason = not_pow2(tile, ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps"))
        if reason:
            return reason
        if tile["BLOCK_M"] < 16 or tile["BLOCK_N"] < 16:
            return f"BLOCK_M and BLOCK_N must be >= 16, got {tile['BLOCK_M']} and {tile['BLOCK_N']}"
        if tile["BLOCK_K"] < MIN_BLOCK_K[precision]:
            return f"{precision} needs BLOCK_K >= {MIN_BLOCK_K[precision]} for tl.dot, got {tile['BLOCK_K']}"
        if tile["GROUP_M"] < 1 or tile["num_stages"] < 1 or tile["num_warps"] > 32:
            return f"need GROUP_M >= 1, num_stages >= 1 and num_warps <= 32, got {tile}"
        pad_k = config.get("pad_k", False)
        if not isinstance(pad_k, bool):
            return f"pad_k must be true or false, got {pad_k!r}"
        if pad_k and self.k % PAD_K_MULTIPLE == 0:
            return f"K={self.k} is a multiple of {PAD_K_MULTIPLE} already: pad_k would change nothing"
        if precision == "bf16" and (not device.is_gpu or interpreter_active()):
            # Measured with Triton 3.9: max relative error ~3e9 on 48x80x64, whatever the tiles.
            return "bf16 is not checked under the Triton interpreter (it computes bf16 products wrongly)"
        if device.is_gpu and precision in MIN_CAPABILITY and device.compute_capability is not None:
            needed = MIN_CAPABILITY[precision]
            if tuple(device.compute_capability) < needed:
                return (
                    f"{precision} needs compute capability >= {needed[0]}.{needed[1]}, "
                    f"{device.name} has {device.compute_capability[0]}.{device.compute_capability[1]}"
                )
        return self._variant_check(config, device)

    def _variant_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        """What the persistent TMA variants need beyond the tile rules: precision, alignment, Hopper."""
        kernel = config.get("kernel", "tutorial")
        if kernel not in KERNELS:
            return f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}"
        for flag in ("EPILOGUE_SUBTILE", "FP8_FAST_ACCUM", "STREAM_K"):
            if not isinstance(config.get(flag, False), bool):
                return f"{flag} must be true or false, got {config[flag]!r}"
        if kernel == "tutorial":
            return None
        precision = config["precision"]
        if precision not in TMA_PRECISIONS:
            return f"kernel {kernel} takes precision {', '.join(TMA_PRECISIONS)}, got {precision!r}"
        if config.get("EPILOGUE_SUBTILE", False) and int(config["BLOCK_N"]) < 32:
            return "EPILOGUE_SUBTILE needs BLOCK_N >= 32 (two halves of >= 16 columns)"
        if not tma_rows_aligned(self.m, self.n, self._k_run(config), precision):
            return (
                f"kernel {kernel} needs 16-byte aligned rows (TMA): {self.m}x{self.n}x{self._k_run(config)} in "
                f"{precision} is not; use pad_k or the tutorial kernel"
            )
        if device.is_gpu and device.compute_capability is not None and tuple(device.compute_capability) < (9, 0):
            return f"kernel {kernel} needs TMA (compute capability >= 9.0), {device.name} has less"
        return None

    # ------------------------------------------------------------------ the trial's parts (KernelWorkload.run)

    def _compile(self, config: dict[str, Any], device: DeviceInfo) -> None:
        """Compile for the calling thread's current CUDA device without launching (the kernel's ``compile_only``)."""
        if config.get("kernel", "tutorial") == "tutorial":
            from kernels.gemm.gemm import compile_only
        else:
            from kernels.gemm.gemm_tma import compile_only  # type: ignore[assignment]
        compile_only(
            self.m, self.n, self._k_run(config), precision=config["precision"], **self._kernel_kwargs(config, device)
        )

    def _outputs(self, case: _Case) -> list[Any]:
        return [case.out]

    def _check(self, config: dict[str, Any], case: _Case) -> Checked:
        return check_numerics(case.out, case.ref, case.operand_ref, config["precision"], self.k).checked()

    def _metrics(self, config: dict[str, Any], case: _Case, median_ms: float) -> dict[str, float]:
        latency_s = median_ms * 1e-3
        return {"tflops": self.flops / latency_s / 1e12 if latency_s > 0 else math.inf, "latency_ms": median_ms}

    def export_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config as ``triton.Config(kwargs, num_warps=..., num_stages=...)`` takes it, plus precision,
        the kernel variant and the function it configures (``function``); the persistent variants add their
        constexprs to ``kwargs`` (``NUM_SMS`` is the device's multiprocessor count at run time)."""
        tile = self._tile(config)
        kernel = config.get("kernel", "tutorial")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
        kwargs: dict[str, Any] = {p: tile[p] for p in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
        if kernel != "tutorial":
            kwargs.update(
                EPILOGUE_SUBTILE=bool(config.get("EPILOGUE_SUBTILE", False)),
                WARP_SPECIALIZE=kernel == "persistent_tma_ws",
                FP8_FAST_ACCUM=bool(config.get("FP8_FAST_ACCUM", True)),
                STREAM_K=bool(config.get("STREAM_K", False)),
            )
        return {
            "kwargs": kwargs,
            "num_warps": tile["num_warps"],
            "num_stages": tile["num_stages"],
            "precision": config["precision"],
            "pad_k": bool(config.get("pad_k", False)),
            "kernel": kernel,
            "function": KERNELS[kernel],
        }

    def launch_call(self, config: dict[str, Any]) -> dict[str, Any]:
        """The variant's function (:data:`KERNELS`) and its keyword arguments: ``fn(a, b, **kwargs)``, with
        ``a`` and ``b`` in the precision's dtypes (``kernels.gemm.gemm.quantize_inputs``; fp8 adds the scales)."""
        kernel = self.export_config(config)["kernel"]
        kwargs = {"precision": config["precision"], **self._kernel_kwargs(config, None)}
        return {"function": KERNELS[kernel], "kwargs": kwargs}

    def work(self, config: dict[str, Any]) -> tuple[float, float, str | None]:
        """2mnk FLOPs; A and B read once and C written once, at the precision's element sizes."""
        precision = config["precision"]
        in_bytes = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}[precision]
        out_bytes = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}[precision]  # fp8 writes bf16
        moved = (self.m * self.k + self.k * self.n) * in_bytes + self.m * self.n * out_bytes
        return float(self.flops), float(moved), precision

    def export_python(self, config: dict[str, Any]) -> str:
        """A ``triton.Config`` list ready to paste into ``@triton.autotune(configs=...)``."""
        exported = self.export_config(config)
        padding = f", K zero-padded to a multiple of {PAD_K_MULTIPLE}" if exported["pad_k"] else ""
        comment = (
            f"{self.m}x{self.n}x{self.k}, operands in {exported['precision']}{padding}; kernel variant "
            f"{exported['kernel']!r}, the config of {exported['function']}"
        )
        source = triton_configs_python(comment, exported)
        if exported["kernel"] == "tutorial":
            return source
        kw = exported["kwargs"]
        module, function = exported["function"].rsplit(".", 1)
        call = {
            "precision": exported["precision"],
            **{p: kw[p] for p in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
            "num_warps": exported["num_warps"],
            "num_stages": exported["num_stages"],
            "epilogue_subtile": kw["EPILOGUE_SUBTILE"],
            "warp_specialize": kw["WARP_SPECIALIZE"],
            "fp8_fast_accum": kw["FP8_FAST_ACCUM"],
            "stream_k": kw["STREAM_K"],
        }
        lines = "".join(f"    {name}={value!r},\n" for name, value in call.items())
        return (
            f"{source}\n"
            f"# The persistent kernel takes the config as keyword arguments of {function}; num_sms is the\n"
            "# device's multiprocessor count (one program per SM).\n"
            f"from {module} import {function}  # noqa: E402\n\n"
            f"GEMM_CONFIG = dict(\n{lines})\n"
            f"# c = {function}(a, b, num_sms=torch.cuda.get_device_properties(0).multi_processor_count,\n"
            "#     **GEMM_CONFIG)\n"
        )

    # ------------------------------------------------------------------ helpers

    def _launch(self, config: dict[str, Any], case: _Case) -> None:
        """One launch of the config's kernel, writing ``case.out``: the only way ``run`` calls the kernel."""
        from kernels.gemm.gemm import matmul

        inputs = case.inputs
        a, b = inputs.a, inputs.b
        if config.get("pad_k", False):
            a_pad, b_pad = self._padded(case)
            a_pad[:, : self.k].copy_(a)
            b_pad[: self.k].copy_(b)
            a, b = a_pad, b_pad
        if config.get("kernel", "tutorial") != "tutorial":
            from kernels.gemm.gemm_tma import matmul_persistent as matmul  # type: ignore[assignment]
        matmul(
            a,
            b,
            precision=config["precision"],
            scale_a=inputs.scale_a,
            scale_b=inputs.scale_b,
            out=case.out,
            **self._kernel_kwargs(config, case.device),
        )

    def _k_run(self, config: dict[str, Any]) -> int:
        """The K the kernel runs with: K, or K rounded up to :data:`PAD_K_MULTIPLE` with ``pad_k``."""
        if config.get("pad_k", False):
            return -(-self.k // PAD_K_MULTIPLE) * PAD_K_MULTIPLE
        return self.k

    def _padded(self, case: _Case) -> tuple[Any, Any]:
        """Zero-filled operand buffers with K rounded up, laid out as the unpadded ones (built once per case)."""
        if case.padded is None:
            import torch

            a, b = case.inputs.a, case.inputs.b
            k_pad = self._k_run({"pad_k": True})
            a_pad = torch.zeros((self.m, k_pad), dtype=a.dtype, device=a.device)
            if b.stride(0) == 1 and b.shape[1] > 1:  # K-major B: an (N, K) buffer viewed as (K, N)
                b_pad = torch.zeros((self.n, k_pad), dtype=b.dtype, device=b.device).t()
            else:
                b_pad = torch.zeros((k_pad, self.n), dtype=b.dtype, device=b.device)
            case.padded = (a_pad, b_pad)
        return case.padded

    @staticmethod
    def _tile(config: dict[str, Any]) -> dict[str, int]:
        return {p: int(config[p]) for p in TILE_PARAMS}

    @classmethod
    def _kernel_kwargs(cls, config: dict[str, Any], device: DeviceInfo | None) -> dict[str, Any]:
        """The tile, plus the persistent variants' arguments (one program per SM, their flags); with no
        ``device``, no ``num_sms`` (the kernel's default: the multiprocessor count of the tensors' device)."""
        kwargs: dict[str, Any] = cls._tile(config)
        kernel = config.get("kernel", "tutorial")
        if kernel != "tutorial":
            if device is not None:
                kwargs["num_sms"] = device.sm_count if device.is_gpu and device.sm_count else INTERPRETER_PROGRAMS
            kwargs.update(
                epilogue_subtile=bool(config.get("EPILOGUE_SUBTILE", False)),
                warp_specialize=kernel == "persistent_tma_ws",
                fp8_fast_accum=bool(config.get("FP8_FAST_ACCUM", True)),
                stream_k=bool(config.get("STREAM_K", False)),
            )
        return kwargs

    def _case(self, config: dict[str, Any], device: DeviceInfo) -> _Case:
        """Inputs, references and output buffer for the config's precision, built on first use."""
        precision = config["precision"]
        torch_device = "cuda" if device.is_gpu else "cpu"
        key = (precision, torch_device)
        case = self._cases.get(key)
        if case is not None:
            return case
        import torch

        from kernels.gemm.gemm import OUTPUT_DTYPES, make_masters, quantize_inputs, reference_matmul, torch_matmul

        masters = self._masters.get(torch_device)
        if masters is None:
            a_master, b_master = make_masters(self.m, self.n, self.k, torch_device, self.seed)
            masters = (a_master, b_master, reference_matmul(a_master, b_master))
            self._masters[torch_device] = masters
        a_master, b_master, ref = masters
        inputs = quantize_inputs(a_master, b_master, precision)
        operand_ref = torch_matmul(inputs) if precision in TOLERANCE_VS_OPERANDS else None
        out = torch.empty((self.m, self.n), device=torch_device, dtype=OUTPUT_DTYPES[precision])
        case = _Case(inputs, ref, operand_ref, out, device=device)
        self._cases[key] = case
        return case
