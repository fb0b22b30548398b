"""The trial worker: a long-lived process (a Ray actor) that owns one GPU, or a CPU slot.

The orchestrator sends it configs with a dispatch sequence number. Several
trials may be in flight on one worker so that compilation (``prepare``) runs
on the worker's threads while another trial is timed, but the measured part
(``run``) takes the device in strict dispatch order, one trial at a time: a
trial never shares the GPU while it is being timed, and the orchestrator
knows which trial holds the device if the worker hangs or dies.

Exceptions a workload lets through become statuses here (:func:`tuner.workloads.failures.classify_exception`);
a worker whose CUDA context is unusable after a trial says so (``replace_worker``) and the
orchestrator replaces it. What it returns is a :class:`tuner.workloads.base.TrialReport`: the versioned
wire form of the result, ``extra`` included, plus where and how long it ran.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

from tuner.workloads.base import DeviceInfo, TrialContext, TrialReport, TrialResult, TrialStatus
from tuner.workloads.failures import MAX_ERROR_CHARS, classify_exception, short_error
from tuner.workloads.registry import workload_class

__all__ = ["MAX_ERROR_CHARS", "DispatchOrder", "TrialWorker", "result_to_dict"]


class DispatchOrder:
    """Lets a worker's trials run in the order the orchestrator numbered them (``seq``), whichever order
    their threads arrive in: a trial waits for its turn, and its turn passes on when it ends, raise or not."""

    def __init__(self) -> None:
        self._turn = threading.Condition()
        self._next_seq = 0

    def reset(self, next_seq: int) -> None:
        """The next turn is ``next_seq`` (a new orchestrator numbers from there)."""
        with self._turn:
            self._next_seq = next_seq
            self._turn.notify_all()

    @contextlib.contextmanager
    def turn(self, seq: int) -> Iterator[None]:
        with self._turn:
            while self._next_seq != seq:
                self._turn.wait()
        try:
            yield
        finally:
            self.reset(seq + 1)


class TrialWorker:
    """Runs trials of one workload. Plain class; the orchestrator wraps it with ``ray.remote``."""

    def __init__(self, workload: str, args: dict[str, Any], label: str) -> None:
        from tuner.workloads.fingerprint import device_info, fingerprint

        self.label = label
        self.workload = workload_class(workload)(**args)
        self.device: DeviceInfo = device_info()
        self.fingerprint = self.workload.trial_fingerprint(fingerprint())
        self.roofline = None
        if self.device.is_gpu:
            from tuner.workloads.roofline import describe_roofline, measure_copy_bandwidth_gbps

            self.roofline = describe_roofline(self.device.name, measure_copy_bandwidth_gbps())
        self._order = DispatchOrder()

    def describe(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "device": self.device.to_dict(),
            "fingerprint": self.fingerprint,
            "roofline": self.roofline,
            "gpu_ids": _ray_gpu_ids(),  # which GPU(s) Ray gave this actor: studies of one runner share them
        }

    def reset_sequence(self, next_seq: int) -> None:
        self._order.reset(next_seq)

    def run_trial(self, config: dict[str, Any], trial_number: int, attempt: int, seq: int) -> TrialReport:
        """Prepare (concurrently), then run in dispatch order. Returns the trial's report (``result_to_dict``)."""
        started = time.time()
        prepare_error: BaseException | None = None
        prepare_tb = ""
        try:
            self.workload.prepare(config, self.device)
        except Exception as exc:
            prepare_error, prepare_tb = exc, traceback.format_exc()
        with self._order.turn(seq):
            if prepare_error is not None:
                status = classify_exception(prepare_error, prepare=True)
                result = TrialResult(status=status, error=short_error(prepare_tb))
            else:
                result = self._run(config, TrialContext(trial_number=trial_number, attempt=attempt))
        if result.ok and self.device.is_gpu:
            result.metrics.update(self._position(config, result.metrics))
        out = result_to_dict(result)
        out["worker"] = self.label
        out["duration_s"] = time.time() - started
        out["replace_worker"] = bool(result.extra.get("replace_worker", False))
        return out

    def _position(self, config: dict[str, Any], metrics: dict[str, float]) -> dict[str, float]:
        """The trial's roofline position and the GPU's SM clock and temperature right after it."""
        from tuner.workloads.roofline import gpu_clock_and_temperature, roofline_metrics

        extra = gpu_clock_and_temperature()
        work = self.workload.work(config)
        latency_ms = metrics.get("latency_ms")
        if work is not None and latency_ms:
            flops, moved, precision = work
            peaks = (self.roofline or {}).get("peaks_tflops") or {}
            bandwidth = (self.roofline or {}).get("bandwidth_gbps")
            extra.update(roofline_metrics(flops, moved, latency_ms, peaks.get(precision or ""), bandwidth))
        return extra

    def _run(self, config: dict[str, Any], ctx: TrialContext) -> TrialResult:
        try:
            return self.workload.run(config, self.device, ctx)
        except Exception as exc:
            result = TrialResult(status=classify_exception(exc), error=short_error(traceback.format_exc()))
            if self.device.is_gpu:
                result.extra["replace_worker"] = not _cuda_usable(result.status)
            return result


def _cuda_usable(status: TrialStatus) -> bool:
    """After a failed trial: free cached memory and check the CUDA context still works."""
    try:
        import torch

        if status == TrialStatus.OOM:
            torch.cuda.empty_cache()
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:
        return False


def result_to_dict(result: TrialResult) -> TrialReport:
    """The report of a result: its wire form (:meth:`TrialResult.to_wire`), which keeps ``extra``."""
    return result.to_wire()  # type: ignore[return-value]


def _ray_gpu_ids() -> list[str]:
    try:
        import ray

        return [str(g) for g in ray.get_gpu_ids()]
    except Exception:  # not in a Ray worker
        return []
