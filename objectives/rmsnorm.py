"""The ``rmsnorm`` workload: RMSNorm over the last dim of a rows x cols tensor (``kernels/norms/rmsnorm.py``).

Also home of :class:`RowWiseWorkload`, the base shared with ``softmax`` (``objectives/softmax.py``):
both are memory-bound row-wise kernels with the same knobs (BLOCK columns per step, num_warps,
ROWS_PER_PROGRAM, num_stages, precision of input/output fp32/fp16/bf16 with fp32 math inside),
the same metrics (GB/s moved, latency, max relative error) and the same numerics check.

Metrics: ``gbps`` = the fewest bytes the op must move (x read once, y written once, plus the
weight for RMSNorm) / median latency; ``latency_ms``; ``max_rel_error`` = max over rows of
``max|y - y_ref| / max|y_ref|`` (per row), y_ref = the fp32 op on the fp32 masters, so the error
includes input quantization and precision trades against speed.

torch and triton are imported inside the methods: listing workloads and ``static_check`` stay
fast and never touch a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from tuner.workloads.base import DeviceInfo, MetricSpec, missing_params, not_pow2, triton_configs_python
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

PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp32")
TILE_PARAMS: tuple[str, ...] = ("BLOCK", "ROWS_PER_PROGRAM", "num_warps", "num_stages")
BYTES_PER_ELEMENT: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
#: Largest number of elements of one Triton tensor (``TRITON_MAX_TENSOR_NUMEL``); a bigger tile never compiles.
MAX_TILE_ELEMENTS = 1 << 20

#: Largest per-row error ``max|y - y_ref| / max|y_ref|`` against the fp32 op on the fp32 masters; above
#: it a config is a NUMERICS_FAIL. It includes input quantization: x rounded to bf16 moves exp(x) by up
#: to |x| * 2^-9, and the output rounding adds up to 2^-8 (bf16) / 2^-11 (fp16). Measured on torch
#: emulations (fp32 math on rounded inputs, rounded output; 8192x8192, 64x65536, 4096x128, 2048x1000,
#: standard-normal x): rmsnorm bf16 <= 8.9e-3, fp16 <= 1.2e-3; softmax bf16 <= 1.9e-2 (2.2e-2 with the
#: interpreter's truncating bf16 store), fp16 <= 2.4e-3; fp32 <= 3.2e-7 in the interpreter, while the
#: GPU's approximate exp2/rsqrt add ~1e-6. Each tolerance is 2-30x the worst seen.
TOLERANCE_VS_FP32: dict[str, float] = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}
#: Largest per-row error against the fp32 op on the very inputs the kernel reads (rounded to the
#: precision): only the output rounding is left, at most half an ulp, 2^-11 = 4.9e-4 (fp16) and
#: 2^-8 = 3.9e-3 (bf16; a whole ulp, 7.8e-3, under the interpreter, whose bf16 store truncates).
#: It catches a kernel that is wrong by less than the tolerance above. fp32 reads the masters,
#: so the first check covers it.
TOLERANCE_VS_OPERANDS: dict[str, float] = {"fp16": 2e-3, "bf16": 1e-2}


@dataclass
class _Case:
    """Inputs, references and output buffer of one precision on one device, reused across trials.

    ``inputs`` are the tensors the kernel reads (in the precision's dtype); ``ref`` is the fp32 op
    on the fp32 masters; ``operand_ref`` the fp32 op on ``inputs`` (None for fp32).
    """

    inputs: tuple[Any, ...]
    ref: Any
    operand_ref: Any | None
    out: Any


def check_numerics(out: Any, ref: Any, operand_ref: Any | None, precision: str) -> NumericsCheck:
    """Compare the kernel's ``out`` with the fp32 reference(s) (:func:`tuner.workloads.kernel.check_numerics`).

    Errors are ``max over rows of max|out - ref| / max|ref|`` within the row.
    """
    from kernels.norms.rmsnorm import row_rel_error

    references = (
        Reference("max_rel_error", ref, TOLERANCE_VS_FP32[precision], "fp32 reference", f"{precision} tolerance "),
        Reference(
            "operand_rel_error",
            operand_ref,
            TOLERANCE_VS_OPERANDS.get(precision, math.inf),  # fp32: no operands reference
            f"the fp32 op on the {precision} inputs",
            blame=": the kernel, not the input rounding, is wrong",
        ),
    )
    return shared_check_numerics(out, references, row_rel_error)


def _positive_int(arg: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{arg} must be a positive int, got {value!r}")
    return value


class RowWiseWorkload(KernelWorkload):
    """A memory-bound op applied to each row of a (rows, cols) tensor; subclasses give the kernel.

    Args: ``rows``, ``cols`` (positive ints) and ``seed`` (int, default 0) for the fp32 masters.
    Subclasses implement ``_build_case``, ``_launch``, ``_compile`` and set ``kernel_name``,
    ``flops_per_element`` and ``extra_bytes``.
    """

    metrics = (
        MetricSpec("gbps", "maximize", "GB/s", "bytes the op must move (x read, y written, + weight) / median latency"),
LATENCY_METRIC,
        *TIMING_METRICS,
        MetricSpec(
            "max_rel_error",
            "minimize",
            "",
            "max over rows of max|y - y_ref| / max|y_ref|, y_ref = the op in fp32 on the fp32 master inputs",
        ),
    )
    #: The op's name in exported code, e.g. "rmsnorm".
    kernel_name: ClassVar[str] = ""
    shape_args: ClassVar[tuple[str, ...]] = ("rows", "cols")
    key_knobs: ClassVar[tuple[str, ...]] = ("precision",)
    #: Nominal FLOPs per element of x (for the roofline position).
    flops_per_element: ClassVar[int] = 1

    def __init__(self, rows: int, cols: int, seed: int = 0, timing: str = "eager") -> None:
        self.rows = _positive_int("rows", rows)
        self.cols = _positive_int("cols", cols)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        super().__init__()
        self.timing = check_timing(timing)
        self.seed = seed
        self._cases: dict[tuple[str, str], _Case] = {}

    # ------------------------------------------------------------------ sizes

    def extra_bytes(self, precision: str) -> int:
        """Bytes read besides x (e.g. RMSNorm's weight)."""
        return 0

    def bytes_moved(self, precision: str) -> int:
        """The fewest bytes one call moves through device memory: x read once, y written once, + extras."""
        return 2 * self.rows * self.cols * BYTES_PER_ELEMENT[precision] + self.extra_bytes(precision)

    def work(self, config: dict[str, Any]) -> tuple[float, float, str | None]:
        """A few FLOPs per element (``flops_per_element``) and :meth:`bytes_moved`, at the config's precision."""
        precision = config["precision"]
        return float(self.flops_per_element * self.rows * self.cols), float(self.bytes_moved(precision)), precision

    # ------------------------------------------------------------------ static feasibility

    def static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        reason = missing_params(config, (*TILE_PARAMS, "precision"))
        if reason:
            return reason
        precision = config["precision"]
        if precision not in PRECISIONS:
            return f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        values = [config[p] for p in TILE_PARAMS]
        if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            return f"{', '.join(TILE_PARAMS)} must be ints, got {values}"
        tile = self._tile(config)
        reason = not_pow2(tile, ("BLOCK", "ROWS_PER_PROGRAM", "num_warps"))
        if reason:
            return reason
        if tile["num_warps"] > 32:
            return f"num_warps={tile['num_warps']} exceeds 32 (1024 threads per block)"
        if tile["num_stages"] < 1:
            return f"num_stages must be >= 1, got {tile['num_stages']}"
        elements = tile["BLOCK"] * tile["ROWS_PER_PROGRAM"]
        if elements > MAX_TILE_ELEMENTS:
            return f"BLOCK * ROWS_PER_PROGRAM = {elements} exceeds Triton's {MAX_TILE_ELEMENTS} elements per tensor"
        return None

    # ------------------------------------------------------------------ the trial's parts (KernelWorkload.run)

    def _outputs(self, case: _Case) -> list[Any]:
        return [case.out]

    def _check(self, config: dict[str, Any], case: _Case) -> Checked:
        return check_numerics(case.out, case.ref, case.operand_ref, config["precision"]).checked()

    def _metrics(self, config: dict[str, Any], case: _Case, median_ms: float) -> dict[str, float]:
        latency_s = median_ms * 1e-3
        moved = self.bytes_moved(config["precision"])
        return {"gbps": moved / latency_s / 1e9 if latency_s > 0 else math.inf, "latency_ms": median_ms}

    # ------------------------------------------------------------------ export

    def export_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config as ``triton.Config(kwargs, num_warps=..., num_stages=...)`` takes it, plus precision."""
        tile = self._tile(config)
        return {
            "kwargs": {"BLOCK": tile["BLOCK"], "ROWS_PER_PROGRAM": tile["ROWS_PER_PROGRAM"]},
            "num_warps": tile["num_warps"],
            "num_stages": tile["num_stages"],
            "precision": config["precision"],
        }

    def launch_call(self, config: dict[str, Any]) -> dict[str, Any]:
        """``kernels.norms.<kernel_name>.<kernel_name>`` and its keyword arguments (precision, tile, launch options)."""
        return {**super().launch_call(config), "function": f"kernels.norms.{self.kernel_name}.{self.kernel_name}"}

    def export_python(self, config: dict[str, Any]) -> str:
        """A ``triton.Config`` list ready to paste into ``@triton.autotune(configs=...)``."""
        exported = self.export_config(config)
        comment = f"{self.kernel_name} over {self.rows}x{self.cols}, input/output in {exported['precision']}"
        return triton_configs_python(comment, exported)

    # ------------------------------------------------------------------ subclass hooks

    def _build_case(self, precision: str, torch_device: str) -> _Case:
        raise NotImplementedError

    def _launch(self, config: dict[str, Any], case: _Case) -> None:
        """Launch the kernel once with ``config`` on ``case.inputs``, writing ``case.out``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _tile(config: dict[str, Any]) -> dict[str, int]:
        return {p: int(config[p]) for p in TILE_PARAMS}

    def _case(self, config: dict[str, Any], device: DeviceInfo) -> _Case:
        """Inputs, references and output buffer for the config's precision, built on first use."""
        precision = config["precision"]
        torch_device = "cuda" if device.is_gpu else "cpu"
        key = (precision, torch_device)
        case = self._cases.get(key)
        if case is None:
            case = self._build_case(precision, torch_device)
            self._cases[key] = case
        return case


class RMSNorm(RowWiseWorkload):
    """``y = x / sqrt(mean(x^2, -1) + eps) * w`` with the Triton kernel of ``kernels/norms/rmsnorm.py``.

    Args: ``rows``, ``cols`` (positive ints), ``eps`` (finite float >= 0, default 1e-6) and
    ``seed`` (int, default 0) for the fp32 masters: x standard normal, w = 1 + 0.5 * N(0, 1).
    """

    name = "rmsnorm"
    space_file = "rmsnorm.yaml"
    description = (
        "Triton RMSNorm over the last dim (kernels/norms/rmsnorm.py): BLOCK, rows per program, warps, precision"
    )
    kernel_name = "rmsnorm"
    #: x*x, the sum's add, the scale by rstd and by the weight.
    flops_per_element = 4

    def __init__(self, rows: int, cols: int, eps: float = 1e-6, seed: int = 0, timing: str = "eager") -> None:
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
            raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
        super().__init__(rows=rows, cols=cols, seed=seed, timing=timing)
        self.eps = float(eps)

    def extra_bytes(self, precision: str) -> int:
        """The weight vector, read once."""
        return self.cols * BYTES_PER_ELEMENT[precision]

    def _build_case(self, precision: str, torch_device: str) -> _Case:
        import torch

        from kernels.norms.rmsnorm import DTYPES, make_masters, reference_rmsnorm

        x_master, w_master = make_masters(self.rows, self.cols, torch_device, self.seed)
        ref = reference_rmsnorm(x_master, w_master, self.eps)
        x, w = x_master.to(DTYPES[precision]), w_master.to(DTYPES[precision])
        operand_ref = reference_rmsnorm(x, w, self.eps) if precision in TOLERANCE_VS_OPERANDS else None
        out = torch.empty_like(x)
        return _Case((x, w), ref, operand_ref, out)

    def launch_call(self, config: dict[str, Any]) -> dict[str, Any]:
        """``kernels.norms.rmsnorm.rmsnorm(x, weight, **kwargs)``: the row-wise call with the study's ``eps``."""
        call = super().launch_call(config)
        return {**call, "kwargs": {**call["kwargs"], "eps": self.eps}}

    def _launch(self, config: dict[str, Any], case: _Case) -> None:
        from kernels.norms.rmsnorm import rmsnorm

        x, w = case.inputs
        rmsnorm(x, w, precision=config["precision"], eps=self.eps, out=case.out, **self._tile(config))

    def _compile(self, config: dict[str, Any], device: DeviceInfo) -> None:
        from kernels.norms.rmsnorm import compile_only

        compile_only(self.rows, self.cols, precision=config["precision"], eps=self.eps, **self._tile(config))
