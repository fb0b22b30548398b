"""``noop``: a cheap, deterministic workload for testing and benchmarking the engine.

Its ``score`` has a known optimum (x = 0.7, tile = 64, stages = 3, mode =
"balanced"), ``cost`` trades against it, and ``latency_ms`` is the time the
trial slept (``sleep_ms``). Faults can be injected into real workers by trial
number through the ``faults`` arg, e.g. ``{faults: {"3": hang, "5": exit}}``:

- ``hang``: sleep forever (the orchestrator's timeout kills the worker)
- ``exit``: ``os._exit(3)`` on every attempt; ``exit_once``: on the first attempt only
- ``segfault``: a null-pointer read in the trial's own thread (a real SIGSEGV)
- ``raise``: a RuntimeError; ``oom``: a MemoryError-like "out of memory" error
- ``out_of_resources``: an error named OutOfResources
- ``wrong``: a wrong result, caught by the numerics check

``drift`` (default 0) lowers every measured ``score`` by that much after the numerics check: the same
config measuring worse, as a slower driver or library would make it (what the registry's regression
watch is tested with).
"""

from __future__ import annotations

import ctypes
import math
import os
import time
from typing import Any, ClassVar

from tuner.workloads.base import DeviceInfo, MetricSpec, TrialContext, TrialResult, TrialStatus, Workload

FAULTS = ("hang", "exit", "exit_once", "segfault", "raise", "oom", "out_of_resources", "wrong")


class OutOfResources(RuntimeError):
    """Stands in for Triton's error of the same name."""


class NoOp(Workload):
    name: ClassVar[str] = "noop"
    unkeyed_args: ClassVar[tuple[str, ...]] = ("sleep_ms", "faults", "drift")
    space_file: ClassVar[str] = "noop.yaml"
    description: ClassVar[str] = "Deterministic synthetic objective for engine tests and overhead benchmarks."
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("score", "maximize", "", "synthetic figure of merit, best 1.0"),
        MetricSpec("cost", "minimize", "", "synthetic cost that trades against score"),
        MetricSpec("latency_ms", "minimize", "ms", "time the trial slept"),
    )

    def __init__(
        self, sleep_ms: float = 0.0, faults: dict[str | int, str] | None = None, drift: float = 0.0
    ) -> None:
        if isinstance(sleep_ms, bool) or not isinstance(sleep_ms, (int, float)) or not 0 <= sleep_ms < math.inf:
            raise ValueError(f"args.sleep_ms must be a finite number >= 0, got {sleep_ms!r}")
        if isinstance(drift, bool) or not isinstance(drift, (int, float)) or not math.isfinite(drift):
            raise ValueError(f"args.drift must be a finite number, got {drift!r}")
        self.sleep_ms = float(sleep_ms)
        self.drift = float(drift)
        self.faults: dict[int, str] = {}
        if faults is not None and not isinstance(faults, dict):
            raise ValueError(f'args.faults must map trial numbers to faults, e.g. {{"3": "hang"}}, got {faults!r:.80}')
        for key, kind in (faults or {}).items():
            if not isinstance(kind, str) or kind not in FAULTS:
                raise ValueError(f"args.faults.{key}: unknown fault {kind!r}; known: {', '.join(FAULTS)}")
            try:
                self.faults[int(key)] = kind
            except ValueError:
                raise ValueError(f"args.faults.{key}: keys are trial numbers") from None

    @staticmethod
    def reference(config: dict[str, Any]) -> float:
        x = float(config["x"])
        tile_term = (math.log2(config["tile"]) - 6) ** 2 / 8
        stage_term = (config["stages"] - 3) ** 2 / 9
        mode_term = {"fast": 0.15, "balanced": 0.0, "exact": 0.05 + (config.get("depth", 8) - 8) / 560}[config["mode"]]
        return 1.0 - (x - 0.7) ** 2 - tile_term - stage_term - mode_term

    def run(self, config: dict[str, Any], device: DeviceInfo, ctx: TrialContext) -> TrialResult:
        fault = self.faults.get(ctx.trial_number)
        if fault == "hang":
            while True:
                time.sleep(3600)
        if fault == "exit" or (fault == "exit_once" and ctx.attempt == 1):
            os._exit(3)
        if fault == "segfault":
            ctypes.string_at(0)
        if fault == "raise":
            raise RuntimeError(f"injected failure in trial {ctx.trial_number}")
        if fault == "oom":
            raise RuntimeError("CUDA out of memory (injected)")
        if fault == "out_of_resources":
            raise OutOfResources("out of resource: shared memory (injected)")
        start = time.perf_counter()
        if self.sleep_ms:
            time.sleep(self.sleep_ms / 1000)
        latency_ms = (time.perf_counter() - start) * 1000
        score = self.reference(config)
        if fault == "wrong":
            score += 0.5
        if abs(score - self.reference(config)) > 1e-9:
            return TrialResult(
                status=TrialStatus.NUMERICS_FAIL,
                metrics={"score": score},
                error="score differs from the reference",
                timing_comparable=False,
            )
        cost = float(config["x"]) + config["stages"] / 6 + math.log2(config["tile"]) / 8
        return TrialResult(
            status=TrialStatus.OK,
            metrics={"score": score - self.drift, "cost": cost, "latency_ms": latency_ms},
            samples_ms=[latency_ms],
            timing_comparable=False,
        )
