"""The ``axpy`` workload: ``out = alpha * x + y`` over ``n`` elements (``kernels/elementwise/axpy.py``).

The README's example of a new workload: one class on the trial template (``KernelWorkload``) and
one space file (``search_spaces/axpy.yaml``). Knobs: ``BLOCK`` (elements per program),
``num_warps`` and ``precision`` of x, y and out (fp32, fp16, bf16; fp32 math). Metrics: ``gbps``
(x and y read, out written, once each / median latency), ``latency_ms`` and ``max_rel_error``
(``max|out - ref| / max|ref|``, ref = the fp32 axpy of the very inputs the kernel reads: only the
output rounding is left).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from tuner.workloads.base import DeviceInfo, MetricSpec, missing_params, not_pow2
from tuner.workloads.kernel import LATENCY_METRIC, TIMING_METRICS, Checked, KernelWorkload, check_timing

BYTES_PER_ELEMENT: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
#: Largest ``max_rel_error`` per precision: half an ulp of the output (a whole ulp for bf16, whose
#: store the interpreter truncates), with room.
TOLERANCE: dict[str, float] = {"fp32": 1e-6, "fp16": 2e-3, "bf16": 1.6e-2}


@dataclass
class _Case:
    x: Any
    y: Any
    ref: Any
    out: Any


class Axpy(KernelWorkload):
    """``out = alpha * x + y`` over ``n`` elements; args ``n`` (>= 1), ``alpha`` (float), ``seed`` (int)."""

    name: ClassVar[str] = "axpy"
    shape_args: ClassVar[tuple[str, ...]] = ("n",)
    key_knobs: ClassVar[tuple[str, ...]] = ("precision",)
    space_file: ClassVar[str] = "axpy.yaml"
    description: ClassVar[str] = "Triton axpy (out = alpha * x + y): BLOCK, num_warps, precision; memory-bound"
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("gbps", "maximize", "GB/s", "bytes read and written (x, y, out once each) / median latency"),
        LATENCY_METRIC,
        *TIMING_METRICS,
        MetricSpec("max_rel_error", "minimize", "", "max|out - ref| / max|ref|, ref = fp32 axpy of the inputs"),
    )

    def __init__(self, n: int = 1 << 24, alpha: float = 2.0, seed: int = 0, timing: str = "eager") -> None:
        super().__init__()
        self.timing = check_timing(timing)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise ValueError(f"alpha must be a finite number, got {alpha!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.n, self.alpha, self.seed = n, float(alpha), seed
        self._cases: dict[tuple[str, str], _Case] = {}

    def static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        reason = missing_params(config, ("BLOCK", "num_warps", "precision"))
        if reason is None and config["precision"] not in TOLERANCE:
            reason = f"precision must be one of {', '.join(TOLERANCE)}, got {config['precision']!r}"
        return reason or not_pow2(config, ("BLOCK", "num_warps"))

    def work(self, config: dict[str, Any]) -> tuple[float, float, str | None]:
        """Two FLOPs per element; x and y read, out written."""
        return 2.0 * self.n, 3.0 * self.n * BYTES_PER_ELEMENT[config["precision"]], config["precision"]

    # ------------------------------------------------------------------ the template's hooks

    def _case(self, config: dict[str, Any], device: DeviceInfo) -> _Case:
        """x, y (standard normal, rounded to the precision), the fp32 reference and out; built once per precision."""
        import torch

        from kernels.elementwise.axpy import DTYPES, reference_axpy

        key = (config["precision"], "cuda" if device.is_gpu else "cpu")
        if key not in self._cases:
            generator = torch.Generator().manual_seed(self.seed)
            x, y = (torch.randn(self.n, generator=generator).to(key[1], DTYPES[key[0]]) for _ in range(2))
            self._cases[key] = _Case(x, y, reference_axpy(x, y, self.alpha), torch.empty_like(x))
        return self._cases[key]

    def _outputs(self, case: _Case) -> list[Any]:
        return [case.out]

    def launch_call(self, config: dict[str, Any]) -> dict[str, Any]:
        """``kernels.elementwise.axpy.axpy(x, y, alpha, out, **kwargs)``: the block and warps (x, y, out in the
        precision)."""
        return {
            "function": "kernels.elementwise.axpy.axpy",
            "kwargs": {"BLOCK": int(config["BLOCK"]), "num_warps": int(config["num_warps"])},
        }

    def _launch(self, config: dict[str, Any], case: _Case) -> None:
        from kernels.elementwise.axpy import axpy

        axpy(case.x, case.y, self.alpha, case.out, BLOCK=config["BLOCK"], num_warps=config["num_warps"])

    def _compile(self, config: dict[str, Any], device: DeviceInfo) -> None:
        from kernels.elementwise.axpy import compile_only

        compile_only(self.n, precision=config["precision"], BLOCK=config["BLOCK"], num_warps=config["num_warps"])

    def _check(self, config: dict[str, Any], case: _Case) -> Checked:
        out = case.out.float()
        error = float((out - case.ref).abs().max() / case.ref.abs().max().clamp_min(1e-30))
        if not math.isfinite(error) or error > TOLERANCE[config["precision"]]:
            return Checked({"max_rel_error": error}, f"max_rel_error {error:.3g} (NaN: an element never written)")
        return Checked({"max_rel_error": error})

    def _metrics(self, config: dict[str, Any], case: _Case, median_ms: float) -> dict[str, float]:
        moved = 3 * self.n * BYTES_PER_ELEMENT[config["precision"]]
        return {"gbps": moved / (median_ms * 1e-3) / 1e9 if median_ms > 0 else math.inf, "latency_ms": median_ms}
