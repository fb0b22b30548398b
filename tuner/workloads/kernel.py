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
5. :func:`tuner.workloads.measure.time_fn` times the launch, and the workload turns the timing into its metrics.

What a trial's time means is the ``timing`` arg of every kernel workload (:data:`TIMING_MODES`): ``eager`` (the
default) is one call as the user makes it -- L2 flushed, launched from Python, the larger of the kernel's GPU time
and the launcher's host time -- and ``cuda_graph`` the time a call inside a CUDA graph of many calls (true only for
a caller that replays graphs). ``latency_ms`` is that time; ``gpu_us`` and ``host_us`` beside it are the kernel's
own GPU time and the launcher's host time a call, so a launch-bound config shows as one.

torch is imported inside the methods, so ``static_check`` and the registry stay light.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

from tuner.workloads.base import MetricSpec
from tuner.workloads.template import Checked, MeasuredWorkload, NumericsCheck, Reference, check_numerics

__all__ = [
    "LATENCY_METRIC",
    "TIMING_METRICS",
    "TIMING_MODES",
    "Checked",
    "KernelWorkload",
    "NumericsCheck",
    "Reference",
    "check_numerics",
    "check_timing",
]

#: How a kernel workload's trial is timed (its ``timing`` arg): one eager call, or a call inside a CUDA graph.
TIMING_MODES: tuple[str, ...] = ("eager", "cuda_graph")
#: The latency every kernel workload reports, defined once.
LATENCY_METRIC = MetricSpec(
    "latency_ms",
    "minimize",
    "ms",
    "one call as timed by the `timing` arg: eager (default) = max(GPU time, host launch time) a call, L2 flushed, "
    "median; cuda_graph = a call inside a CUDA graph of many calls",
)
#: The two parts of a call's time, beside ``latency_ms``.
TIMING_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("gpu_us", "minimize", "us", "the kernel's own GPU time a call (CUDA events, L2 flushed), median"),
    MetricSpec("host_us", "minimize", "us", "the launcher's host time a call (Python to the launch), median"),
)


def check_timing(timing: str) -> str:
    """``timing`` if it is one of :data:`TIMING_MODES`; else ValueError naming the arg and the modes."""
    if timing not in TIMING_MODES:
        raise ValueError(f"timing must be one of {', '.join(TIMING_MODES)}, got {timing!r}")
    return timing


class KernelWorkload(MeasuredWorkload):
    """Base of the Triton kernel workloads: subclasses implement the hooks, not ``run``."""

    #: While one config is timed, three more compile ahead on the worker's threads.
    trials_in_flight: ClassVar[int] = 4
    launch_before_check: ClassVar[bool] = True
    #: How trials are timed (:data:`TIMING_MODES`); subclasses take it as their ``timing`` arg.
    timing: str = "eager"

    def _timing(self, config: dict[str, Any], case: Any, comparable: bool) -> dict[str, Any]:
        """The stopwatch's options: eager calls, or (``timing: cuda_graph``) a CUDA graph of calls, on a GPU."""
        from tuner.workloads.measure import timing_options

        return {**timing_options(comparable), "cuda_graph": comparable and self.timing == "cuda_graph"}

    def _timing_metrics(self, timing: Any) -> dict[str, float]:
        """``gpu_us`` and ``host_us`` of the timing (on a CPU the clock's time a call stands for both: not comparable
        with a GPU's, as every CPU figure)."""
        facts = timing.extra
        if facts.get("gpu_ms") is None:
            return {"gpu_us": timing.median_ms * 1e3, "host_us": timing.median_ms * 1e3}
        return {"gpu_us": facts["gpu_ms"] * 1e3, "host_us": facts["host_ms"] * 1e3}

    @abstractmethod
    def _outputs(self, case: Any) -> Iterable[Any]:
        """The tensors the kernel must write, NaN-filled before the checked launch."""
