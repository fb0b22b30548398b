"""The base of the Triton kernel workloads: the trial template (:mod:`tuner.workloads.template`) with compile-ahead.

A kernel workload (``objectives/triton_gemm.py``, ``flash_attention``, ``quant_gemm``,
``rmsnorm``, ``softmax``, ``axpy``) subclasses :class:`KernelWorkload` and supplies the parts that
differ -- its inputs and references (``_case``), its output buffers (``_outputs``), the one
launch (``_launch``), the numerics check (``_check``), the metrics of a timing
(``_metrics``) and, on a GPU, compile-ahead (``_compile``). ``run`` is the template's:

1. a statically infeasible config returns ``infeasible_static`` without launching;
2. a compile failure that ``prepare`` found is returned as ``compile_error`` /
   ``out_of_resources`` without compiling again;
3. the outputs are filled with NaN and the kernel launched once: an element it never
   writes shows up as NaN, so a kernel that writes nothing is ``numerics_fail``;
4. numerics are checked against the reference before any timing;
5. :func:`tuner.workloads.measure.time_fn` times the launch (CUDA events, L2 flush, adaptive
   repetitions; CUDA graphs where the workload asks), and the workload turns the
   timing into its metrics.

torch is imported inside the methods, so ``static_check`` and the registry stay light.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

from tuner.workloads.template import Checked, MeasuredWorkload

__all__ = ["Checked", "KernelWorkload"]


class KernelWorkload(MeasuredWorkload):
    """Base of the Triton kernel workloads: subclasses implement the hooks, not ``run``."""

    #: While one config is timed, three more compile ahead on the worker's threads.
    trials_in_flight: ClassVar[int] = 4

    @abstractmethod
    def _outputs(self, case: Any) -> Iterable[Any]:
        """The tensors the kernel must write, NaN-filled before the checked launch."""
