"""The ``softmax`` workload: numerically stable softmax over the last dim (``kernels/norms/softmax.py``).

Knobs, metrics and numerics check are those of :class:`objectives.rmsnorm.RowWiseWorkload`: BLOCK,
ROWS_PER_PROGRAM, num_warps, num_stages and precision (fp32/fp16/bf16 input and output, fp32 math);
``gbps`` counts x read once and y written once.
"""

from __future__ import annotations

from typing import Any

from objectives.rmsnorm import TOLERANCE_VS_OPERANDS, RowWiseWorkload, _Case
from tuner.workloads.base import DeviceInfo


class Softmax(RowWiseWorkload):
    """``y = softmax(x, dim=-1)`` (row max subtracted) with the Triton kernel of ``kernels/norms/softmax.py``.

    Args: ``rows``, ``cols`` (positive ints) and ``seed`` (int, default 0) for the fp32 master x
    (standard normal).
    """

    name = "softmax"
    space_file = "softmax.yaml"
    description = (
        "Triton softmax over the last dim (kernels/norms/softmax.py): BLOCK, rows per program, warps, precision"
    )
    kernel_name = "softmax"
    #: The max's compare, x - max, exp, the sum's add and the scale by 1/sum.
    flops_per_element = 5

    def _build_case(self, precision: str, torch_device: str) -> _Case:
        import torch

        from kernels.norms.softmax import DTYPES, make_input, reference_softmax

        x_master = make_input(self.rows, self.cols, torch_device, self.seed)
        ref = reference_softmax(x_master)
        x = x_master.to(DTYPES[precision])
        operand_ref = reference_softmax(x) if precision in TOLERANCE_VS_OPERANDS else None
        return _Case((x,), ref, operand_ref, torch.empty_like(x))

    def _launch(self, config: dict[str, Any], case: _Case) -> None:
        from kernels.norms.softmax import softmax

        (x,) = case.inputs
        softmax(x, precision=config["precision"], out=case.out, **self._tile(config))

    def _compile(self, config: dict[str, Any], device: DeviceInfo) -> None:
        from kernels.norms.softmax import compile_only

        compile_only(self.rows, self.cols, precision=config["precision"], **self._tile(config))
