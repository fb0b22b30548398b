"""The trial every kernel workload runs, written once: check, compile, one checked launch, then the stopwatch.

A kernel workload (``objectives/triton_gemm.py``, ``flash_attention``, ``quant_gemm``,
``rmsnorm``, ``softmax``) subclasses :class:`KernelWorkload` and supplies the parts that
differ -- its inputs and references (``_case``), its output buffers (``_outputs``), the one
launch (``_launch``), the numerics check (``_check``), the metrics of a timing
(``_metrics``) and, on a GPU, compile-ahead (``_compile``). :meth:`KernelWorkload.run` is
then the same for all of them:

1. a statically infeasible config returns ``infeasible_static`` without launching;
2. a compile failure that ``prepare`` found is returned as ``compile_error`` /
   ``out_of_resources`` without compiling again;
3. the outputs are filled with NaN and the kernel launched once: an element it never
   writes shows up as NaN, so a kernel that writes nothing is ``numerics_fail``;
4. numerics are checked against the reference before any timing;
5. :func:`tuner.measure.time_fn` times the launch (CUDA events, L2 flush, adaptive
   repetitions; CUDA graphs where the workload asks), and the workload turns the
   timing into its metrics.

torch is imported inside the methods, so ``static_check`` and the registry stay light.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tuner.workload import (
    DeviceInfo,
    TrialContext,
    TrialResult,
    TrialStatus,
    Workload,
    compile_failure_result,
    compile_failure_status,
    interpreter_active,
    timing_comparable,
)


@dataclass
class Checked:
    """What a numerics check found: error metrics, the failure (None when correct) and facts for ``extra``."""

    metrics: dict[str, float]
    failure: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class KernelWorkload(Workload):
    """Base of the Triton kernel workloads: subclasses implement the hooks below, not ``run``."""

    #: While one config is timed, three more compile ahead on the worker's threads.
    trials_in_flight = 4

    def __init__(self) -> None:
        # Triton compile failures found by prepare(), reported by run() of the same config.
        self._prepare_failures: dict[str, BaseException] = {}

    # ------------------------------------------------------------------ hooks

    def _case(self, config: dict[str, Any], device: DeviceInfo) -> Any:
        """Inputs, references and output buffers for ``config`` on ``device`` (build once, reuse)."""
        raise NotImplementedError

    def _outputs(self, case: Any) -> Iterable[Any]:
        """The tensors the kernel must write, NaN-filled before the checked launch."""
        raise NotImplementedError

    def _launch(self, config: dict[str, Any], case: Any) -> None:
        """One launch of the config's kernel into the case's outputs: the only way ``run`` calls it."""
        raise NotImplementedError

    def _check(self, config: dict[str, Any], case: Any) -> Checked:
        """Compare the outputs with the references (NaN/inf anywhere is a failure)."""
        raise NotImplementedError

    def _metrics(self, config: dict[str, Any], case: Any, median_ms: float) -> dict[str, float]:
        """The performance metrics of a median latency in milliseconds."""
        raise NotImplementedError

    def _compile(self, config: dict[str, Any], device: DeviceInfo) -> None:
        """Compile the config's kernel without launching it (GPU only; default: nothing ahead)."""

    def _timing(self, config: dict[str, Any], case: Any, comparable: bool) -> dict[str, Any]:
        """Options of :func:`tuner.measure.time_fn` (default: ``timing_options(comparable)``)."""
        from tuner.measure import timing_options

        return timing_options(comparable)

    # ------------------------------------------------------------------ the contract

    def prepare(self, config: dict[str, Any], device: DeviceInfo) -> None:
        """Compile ahead on a GPU (no-op on a CPU or under the interpreter). Never raises: Triton's compile
        failures are kept and returned by ``run`` of the same config; anything else is left for the launch."""
        if not device.is_gpu or interpreter_active() or self.static_check(config, device) is not None:
            return
        try:
            self._compile(config, device)
        except Exception as exc:
            if compile_failure_status(exc) is not None:
                self._prepare_failures[_config_key(config)] = exc

    def run(self, config: dict[str, Any], device: DeviceInfo, ctx: TrialContext) -> TrialResult:
        comparable = timing_comparable(device)
        reason = self.static_check(config, device)
        if reason is not None:
            return TrialResult(TrialStatus.INFEASIBLE_STATIC, error=reason, timing_comparable=comparable)
        failure = self._prepare_failures.pop(_config_key(config), None)
        if failure is not None:
            return compile_failure_result(failure, comparable)

        from tuner.measure import time_fn

        case = self._case(config, device)
        for out in self._outputs(case):
            out.fill_(float("nan"))
        try:
            self._launch(config, case)
            if device.is_gpu:
                import torch

                torch.cuda.synchronize()
        except Exception as exc:
            if compile_failure_status(exc) is None:
                raise
            return compile_failure_result(exc, comparable)

        checked = self._check(config, case)
        if checked.failure is not None:
            return TrialResult(
                TrialStatus.NUMERICS_FAIL,
                metrics=checked.metrics,
                error=checked.failure,
                timing_comparable=comparable,
                extra=checked.extra,
            )
        timing = time_fn(lambda: self._launch(config, case), device, **self._timing(config, case, comparable))
        return TrialResult(
            TrialStatus.OK,
            metrics={**self._metrics(config, case, timing.median_ms), **checked.metrics},
            samples_ms=timing.samples_ms,
            timing_comparable=comparable,
            extra={**checked.extra, "timing": timing.to_dict()},
        )


def _config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)
