"""The one trial template: static check -> prepare -> launch -> classify -> numerics -> time.

Every workload that measures something -- a Triton kernel (:class:`tuner.workloads.kernel.KernelWorkload`),
a whole step (``objectives/train_step.py``, ``decode_step.py``), a multi-GPU trial
(:class:`tuner.workloads.rank.RankWorkload`) -- subclasses :class:`MeasuredWorkload` and supplies the
parts that differ as hooks; :meth:`MeasuredWorkload.run` is then the same for all of them:

1. **static check**: a statically infeasible config returns ``infeasible_static`` without launching;
2. **prepare**: a compile failure that ``prepare`` found ahead is returned without compiling again;
   inside the trial's scope (``_scope``: a process group, a matmul precision, memory accounting),
   ``_case`` builds the inputs, references and outputs (and warms up);
3. **launch**: ``_poison`` marks the outputs unwritten (NaN) and the config is launched once
   (``_launch``): an output it never writes fails the numerics check;
4. **classify**: an exception anywhere in 2-6 is classified (:func:`tuner.workloads.failures.classify_exception`);
   the statuses a workload reports itself (``reported_failures``: compile errors and out of
   resources, for a training step also out of memory) become its result, anything else goes on to
   the worker, which checks the device after it;
5. **numerics**: ``_check`` compares the outputs with the references before any timing; a failure is
   ``numerics_fail`` (or the status the check names);
6. **time**: ``_time`` times the launch (default: :func:`tuner.workloads.measure.time_fn` with ``_timing``'s
   options: CUDA events, L2 flush, adaptive repetitions) -- or summarises the step marks the checked
   launch recorded -- and ``_metrics`` turns the median into the metrics.

The result keeps the check's ``extra`` and the timing's summary (``extra["timing"]``: median,
interval, repetitions, convergence), which reach the database with the trial.

torch is imported inside the methods, so ``static_check`` and the registry stay light.
"""

from __future__ import annotations

import contextlib
import json
import math
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from tuner.workloads.base import (
    DeviceInfo,
    TrialContext,
    TrialResult,
    TrialStatus,
    Workload,
    interpreter_active,
    timing_comparable,
)
from tuner.workloads.failures import TrialFailure, classify_exception, failure_result

if TYPE_CHECKING:
    from tuner.workloads.measure import Timing


@dataclass
class Checked:
    """What a numerics check found: error metrics, the failure (None when correct), facts for ``extra``,
    and the status of a failure (``numerics_fail`` unless the check knows better, e.g. a simulated OOM)."""

    metrics: dict[str, float]
    failure: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    status: TrialStatus = TrialStatus.NUMERICS_FAIL


@dataclass(frozen=True)
class Reference:
    """One reference a kernel's output is compared with, and how a miss reads:
    ``"<error> vs <against> exceeds <bound><tolerance><blame>"`` (``max_rel_error`` for the first reference,
    ``error`` for the later ones). A reference whose ``tensor`` is None is skipped."""

    key: str  # the error's name: the first is the metric ``max_rel_error``, later ones go to ``extra``
    tensor: Any
    tolerance: float
    against: str  # e.g. "fp32 reference"
    bound: str = ""  # e.g. "fp16 tolerance "
    blame: str = ""  # e.g. ": the kernel, not the input rounding, is wrong"


@dataclass(frozen=True)
class NumericsCheck:
    """Outcome of comparing one output with its references: each reference's error (in checking order, the
    first is ``max_rel_error``) and the failure, None when correct."""

    errors: dict[str, float]
    failure: str | None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def max_rel_error(self) -> float:
        return next(iter(self.errors.values()))

    def checked(self, **metrics: float) -> Checked:
        """As the template's :class:`Checked`: the first error (and ``metrics``) as metrics, the rest as extra."""
        (first, error), *rest = self.errors.items()
        return Checked({first: error, **metrics}, self.failure, dict(rest))


def check_numerics(out: Any, references: Iterable[Reference], error: Callable[[Any, Any], float]) -> NumericsCheck:
    """Compare a kernel's ``out`` with each reference in turn by ``error(out, ref)``; NaN/inf anywhere fails.

    ``out`` was filled with NaN before the launch (``_poison``), so an element the kernel never wrote shows
    up here as NaN. The first reference that misses its tolerance is the failure.
    """
    import torch

    non_finite = int((~torch.isfinite(out)).sum())
    if non_finite:
        message = f"{non_finite} of {out.numel()} output elements are NaN/inf (unwritten or overflowed)"
        return NumericsCheck({"max_rel_error": math.inf}, message)
    errors: dict[str, float] = {}
    for i, ref in enumerate(r for r in references if r.tensor is not None):
        errors[ref.key] = value = error(out, ref.tensor)
        if not value <= ref.tolerance:
            label = "max_rel_error" if i == 0 else "error"
            failure = f"{label} {value:.3g} vs {ref.against} exceeds {ref.bound}{ref.tolerance:g}{ref.blame}"
            return NumericsCheck(errors, failure)
    return NumericsCheck(errors, None)


class MeasuredWorkload(Workload):
    """A workload whose ``run`` is the trial template (module docstring); subclasses implement the hooks."""

    #: Statuses of exceptions this workload's trial reports as its own result; others reach the worker.
    reported_failures: ClassVar[frozenset[TrialStatus]] = frozenset(
        {TrialStatus.COMPILE_ERROR, TrialStatus.OUT_OF_RESOURCES}
    )

    #: Launch once before the checked launch on a GPU, so that the check sees the path the timing takes (a kernel
    #: launcher's later calls go straight to the compiled kernel: ``kernels/launch.py``).
    launch_before_check: ClassVar[bool] = False

    def __init__(self, **args: Any) -> None:
        super().__init__(**args)
        # Compile failures found by prepare(), reported by run() of the same config.
        self._prepare_failures: dict[str, BaseException] = {}

    # ------------------------------------------------------------------ hooks

    @abstractmethod
    def _case(self, config: dict[str, Any], device: DeviceInfo) -> Any:
        """Inputs, references and output buffers for ``config`` on ``device`` (may be built once and reused)."""

    def _outputs(self, case: Any) -> Iterable[Any]:
        """The tensors the launch must write, NaN-filled before it (default: none)."""
        return ()

    def _poison(self, case: Any) -> None:
        """Mark what the launch must write as unwritten: NaN in every ``_outputs`` tensor."""
        for out in self._outputs(case):
            out.fill_(float("nan"))

    @abstractmethod
    def _launch(self, config: dict[str, Any], case: Any) -> None:
        """One launch of the config into the case's outputs: the only way ``run`` calls the workload's code."""

    @abstractmethod
    def _check(self, config: dict[str, Any], case: Any) -> Checked:
        """Compare the outputs with the references (NaN/inf anywhere is a failure)."""

    @abstractmethod
    def _metrics(self, config: dict[str, Any], case: Any, median_ms: float) -> dict[str, float]:
        """The performance metrics of a median latency in milliseconds."""

    def _compile(self, config: dict[str, Any], device: DeviceInfo) -> None:
        """Compile the config's kernel without launching it (GPU only; default: nothing ahead)."""

    def _timing(self, config: dict[str, Any], case: Any, comparable: bool) -> dict[str, Any]:
        """Options of :func:`tuner.workloads.measure.time_fn` (default: ``timing_options(comparable)``)."""
        from tuner.workloads.measure import timing_options

        return timing_options(comparable)

    def _timing_metrics(self, timing: Timing) -> dict[str, float]:
        """Metrics of the timing itself beside ``_metrics``' (kernel workloads: GPU and host time; default: none)."""
        return {}

    def _time(self, config: dict[str, Any], case: Any, device: DeviceInfo, comparable: bool) -> Timing:
        """The timing of the launch (default: :func:`tuner.workloads.measure.time_fn` of ``_launch``)."""
        from tuner.workloads.measure import time_fn

        return time_fn(lambda: self._launch(config, case), device, **self._timing(config, case, comparable))

    @contextlib.contextmanager
    def _scope(self, config: dict[str, Any], device: DeviceInfo, ctx: TrialContext) -> Iterator[dict[str, Any]]:
        """What surrounds one trial from its case to its metrics (a process group, a precision setting,
        memory accounting); yields a dict whose entries join the result's ``extra``. It may raise
        :class:`tuner.workloads.failures.TrialFailure` to end the trial with a status. Default: nothing."""
        yield {}

    # ------------------------------------------------------------------ the contract

    def prepare(self, config: dict[str, Any], device: DeviceInfo) -> None:
        """Compile ahead on a GPU (no-op on a CPU or under the interpreter). Never raises: failures this
        workload reports are kept and returned by ``run`` of the same config; others are left for the launch."""
        if not device.is_gpu or interpreter_active() or self.static_check(config, device) is not None:
            return
        try:
            self._compile(config, device)
        except Exception as exc:
            if classify_exception(exc) in self.reported_failures:
                self._prepare_failures[_config_key(config)] = exc

    def run(self, config: dict[str, Any], device: DeviceInfo, ctx: TrialContext) -> TrialResult:
        """The template (module docstring). Raises only what ``reported_failures`` leaves to the worker."""
        comparable = timing_comparable(device)
        reason = self.static_check(config, device)
        if reason is not None:
            return TrialResult(TrialStatus.INFEASIBLE_STATIC, error=reason, timing_comparable=comparable)
        ahead = self._prepare_failures.pop(_config_key(config), None)
        if ahead is not None:
            return failure_result(ahead, classify_exception(ahead, prepare=True), comparable)
        try:
            with self._scope(config, device, ctx) as notes:
                result = self._attempt(config, device, comparable)
        except TrialFailure as exc:
            return failure_result(exc, exc.status, comparable)
        result.extra.update(notes)
        return result

    def _attempt(self, config: dict[str, Any], device: DeviceInfo, comparable: bool) -> TrialResult:
        """Steps 2-6 with their exceptions classified. The case lives in ``_measure``'s frame only, so it
        is gone when this returns (the scope's memory accounting sees what the trial left behind)."""
        try:
            return self._measure(config, device, comparable)
        except Exception as exc:
            status = classify_exception(exc)
            if not isinstance(exc, TrialFailure) and status not in self.reported_failures:
                raise
            return failure_result(exc, status, comparable)

    def _measure(self, config: dict[str, Any], device: DeviceInfo, comparable: bool) -> TrialResult:
        case = self._case(config, device)
        if self.launch_before_check and device.is_gpu:
            self._launch(config, case)  # a launch plan's first call: the checked launch below takes the timed path
        self._poison(case)
        self._launch(config, case)
        if device.is_gpu:
            import torch

            torch.cuda.synchronize()
        checked = self._check(config, case)
        if checked.failure is not None:
            return TrialResult(
                checked.status,
                metrics=checked.metrics,
                error=checked.failure,
                timing_comparable=comparable,
                extra=checked.extra,
            )
        timing = self._time(config, case, device, comparable)
        metrics = {**self._metrics(config, case, timing.median_ms), **self._timing_metrics(timing)}
        return TrialResult(
            TrialStatus.OK,
            metrics={**metrics, **checked.metrics},
            samples_ms=list(timing.samples_ms),
            timing_comparable=comparable,
            extra={**checked.extra, "timing": timing.to_dict()},
        )


def _config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)
