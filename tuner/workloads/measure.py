"""The stopwatch workloads share: warm-up, repetitions, L2 flush, raw samples, robust statistics.

On a CUDA device each repetition is timed with a pair of CUDA events around
the call, after writing a buffer larger than L2 so that every repetition
starts with a cold cache (as ``triton.testing.do_bench`` does). On a CPU
(and under the Triton interpreter) each call is timed with
``time.perf_counter``; such timings are only good for comparing with each
other, never with GPU timings.

torch is imported inside the functions so that importing this module is cheap.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuner.workloads.base import DeviceInfo

#: Bytes written between repetitions to evict L2 (H100/H200 have 50-60 MB of L2).
L2_FLUSH_BYTES = 256 * 1024 * 1024

_flush_buffers: dict[Any, Any] = {}


@dataclass
class Timing:
    """Timing of repeated calls of one function.

    ``samples_ms``: one wall time per repetition, in milliseconds, in the order
    measured. ``median_ms`` and ``iqr_ms`` (75th minus 25th percentile) summarise
    them; ``ci95_ms`` is a distribution-free ~95% confidence interval of the
    median from order statistics of the samples (with 10 samples or fewer it
    is their full range). ``warmup_calls`` counts the untimed calls made first.
    """

    samples_ms: list[float]
    median_ms: float
    iqr_ms: float
    ci95_ms: tuple[float, float]
    warmup_calls: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def reps(self) -> int:
        return len(self.samples_ms)

    @classmethod
    def from_samples(cls, samples_ms: list[float], warmup_calls: int = 0) -> Timing:
        """Summarise raw samples (milliseconds); needs at least one sample."""
        if not samples_ms:
            raise ValueError("Timing needs at least one sample")
        ordered = sorted(samples_ms)
        return cls(
            samples_ms=list(samples_ms),
            median_ms=statistics.median(ordered),
            iqr_ms=_quantile(ordered, 0.75) - _quantile(ordered, 0.25),
            ci95_ms=median_ci95(ordered),
            warmup_calls=warmup_calls,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_ms": self.median_ms,
            "iqr_ms": self.iqr_ms,
            "ci95_ms": list(self.ci95_ms),
            "reps": self.reps,
            "warmup_calls": self.warmup_calls,
            **self.extra,
        }


def _quantile(ordered: list[float], q: float) -> float:
    """Linear-interpolation quantile of sorted values (numpy's default)."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median_ci95(ordered: list[float]) -> tuple[float, float]:
    """~95% confidence interval of the median of sorted samples, from order statistics.

    The number of samples below the median is Binomial(n, 1/2); with the normal
    approximation the interval runs from the ``n/2 - 0.98*sqrt(n)``-th to the
    ``n/2 + 0.98*sqrt(n)``-th smallest sample (1-based, rounded outward, clamped).
    """
    n = len(ordered)
    half_width = 0.98 * math.sqrt(n)
    lo_rank = max(1, math.floor(n / 2 - half_width))
    hi_rank = min(n, math.ceil(n / 2 + half_width) + 1)
    return ordered[lo_rank - 1], ordered[hi_rank - 1]


def _rep_count(estimate_ms: float, rep_ms: float, min_reps: int, max_reps: int) -> int:
    wanted = int(rep_ms / estimate_ms) if estimate_ms > 0 else max_reps
    return max(min_reps, min(max_reps, wanted))


#: Timing under the Triton interpreter or on a CPU: one warm-up call and three timed calls, as the
#: numbers only show that the path runs.
CPU_TIMING: dict[str, Any] = {"warmup_ms": 0.0, "rep_ms": 0.0, "min_reps": 3, "max_reps": 3}
#: Timing on a GPU: 25 ms of warm-up, then repetitions worth 100 ms (at least 10), repeated in
#: growing rounds until the 95% interval of the median is within 1% of it (or 1000 repetitions,
#: or 2 s of timed work).
GPU_TIMING: dict[str, Any] = {
    "warmup_ms": 25.0,
    "rep_ms": 100.0,
    "min_reps": 10,
    "max_reps": 1000,
    "target_rel_ci": 0.01,
    "max_time_ms": 2000.0,
}


def timed_steps(step: Callable[[], Any], steps: int, cuda: bool) -> list[Any]:
    """Call ``step`` ``steps`` times back to back with a timing mark before the first call and after each.

    Marks are CUDA events recorded on the current stream when ``cuda`` (read them after a
    synchronize), ``time.perf_counter`` values otherwise; :func:`step_intervals_ms` turns them into
    one sample per step. For workloads whose unit of work is a whole step (training, DDP), timed in
    place rather than by :func:`time_fn`.
    """
    if cuda:
        import torch

        marks: list[Any] = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        marks[0].record()
        for i in range(steps):
            step()
            marks[i + 1].record()
        return marks
    marks = [time.perf_counter()]
    for _ in range(steps):
        step()
        marks.append(time.perf_counter())
    return marks


def step_intervals_ms(marks: list[Any], cuda: bool) -> list[float]:
    """Milliseconds between consecutive marks of :func:`timed_steps` (empty with fewer than two)."""
    if cuda:
        return [marks[i].elapsed_time(marks[i + 1]) for i in range(len(marks) - 1)]
    return [(marks[i + 1] - marks[i]) * 1e3 for i in range(len(marks) - 1)]


def timing_options(comparable: bool) -> dict[str, Any]:
    """The :func:`time_fn` options workloads use: ``GPU_TIMING`` on a real GPU, ``CPU_TIMING`` otherwise."""
    return dict(GPU_TIMING if comparable else CPU_TIMING)


def rel_ci_half_width(timing: Timing) -> float:
    """Half the width of the median's 95% interval, relative to the median (inf for a zero median)."""
    lo, hi = timing.ci95_ms
    return (hi - lo) / 2 / timing.median_ms if timing.median_ms > 0 else math.inf


def time_fn(
    fn: Callable[[], Any],
    device: DeviceInfo,
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_reps: int = 5,
    max_reps: int = 1000,
    flush_l2: bool = True,
    target_rel_ci: float | None = None,
    max_time_ms: float = 2000.0,
    cuda_graph: bool = False,
    graph_calls: int | None = None,
) -> Timing:
    """Time ``fn()`` on ``device`` and return every sample in milliseconds.

    ``fn`` is called at least once untimed (compile, caches), then untimed
    until ``warmup_ms`` milliseconds have been spent; the first round of timed
    repetitions is ``rep_ms`` divided by the per-call estimate from warm-up,
    clamped to ``[min_reps, max_reps]`` (so ``min_reps == max_reps`` fixes it).

    Adaptive repetition: with ``target_rel_ci`` set, further rounds (each as
    large as all before it) are timed until the half-width of the median's
    95% interval is at most ``target_rel_ci`` times the median, or
    ``max_reps`` samples or ``max_time_ms`` of timed calls are reached;
    ``extra`` records ``rel_ci`` and ``converged``.

    On CUDA, repetitions are timed with CUDA events on the current stream, and
    when ``flush_l2`` a 256 MiB buffer (allocated once per device) is zeroed
    before each one, outside the timed interval. With ``cuda_graph`` the call
    is captured ``graph_calls`` times into one CUDA graph (by default enough
    calls for ~1 ms) and each sample is one replay divided by that count: the
    launch overhead that dominates microsecond kernels is gone, as in a
    graph-captured decode loop, and only the first call of a replay starts
    from a flushed L2. On CPU, ``time.perf_counter`` times each call and
    nothing is flushed (``cuda_graph`` is ignored).
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got min_reps={min_reps}, max_reps={max_reps}")
    if target_rel_ci is not None and not target_rel_ci > 0:
        raise ValueError(f"target_rel_ci must be > 0, got {target_rel_ci}")
    if device.is_gpu:
        timer = _CudaTimer(fn, flush_l2, cuda_graph, graph_calls)
    else:
        timer = _CpuTimer(fn)
    warmup_calls, estimate_ms = timer.warm_up(warmup_ms, max_reps)
    reps = _rep_count(estimate_ms, rep_ms, min_reps, max_reps)
    samples_ms = timer.sample(reps)
    timing = Timing.from_samples(samples_ms, warmup_calls)
    if target_rel_ci is not None:
        timing = _until_converged(timer, samples_ms, warmup_calls, estimate_ms, target_rel_ci, max_reps, max_time_ms)
    timing.extra.update(timer.describe())
    return timing


def _until_converged(
    timer: Any,
    samples_ms: list[float],
    warmup_calls: int,
    estimate_ms: float,
    target_rel_ci: float,
    max_reps: int,
    max_time_ms: float,
) -> Timing:
    """More rounds (each as large as all before it) until the median's 95% interval is narrow enough, or
    ``max_reps`` samples or ``max_time_ms`` of timed calls; ``samples_ms`` grows in place."""
    timing = Timing.from_samples(samples_ms, warmup_calls)
    spent_ms = sum(samples_ms)
    while rel_ci_half_width(timing) > target_rel_ci and len(samples_ms) < max_reps and spent_ms < max_time_ms:
        more = min(len(samples_ms), max_reps - len(samples_ms))
        if estimate_ms > 0:
            more = max(1, min(more, int((max_time_ms - spent_ms) / estimate_ms)))
        new = timer.sample(more)
        samples_ms.extend(new)
        spent_ms += sum(new)
        timing = Timing.from_samples(samples_ms, warmup_calls)
    timing.extra["rel_ci"] = rel_ci_half_width(timing)
    timing.extra["converged"] = timing.extra["rel_ci"] <= target_rel_ci
    return timing


class _CpuTimer:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def warm_up(self, warmup_ms: float, max_calls: int) -> tuple[int, float]:
        calls = 0
        spent_ms = 0.0
        while calls == 0 or (spent_ms < warmup_ms and calls < max_calls):
            start = time.perf_counter()
            self.fn()
            spent_ms += (time.perf_counter() - start) * 1e3
            calls += 1
        return calls, spent_ms / calls

    def sample(self, reps: int) -> list[float]:
        samples_ms = []
        for _ in range(reps):
            start = time.perf_counter()
            self.fn()
            samples_ms.append((time.perf_counter() - start) * 1e3)
        return samples_ms

    def describe(self) -> dict[str, Any]:
        return {"mode": "cpu", "l2": "warm"}


def _flush_buffer(torch: Any) -> Any:
    key = torch.cuda.current_device()
    buffer = _flush_buffers.get(key)
    if buffer is None:
        buffer = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        _flush_buffers[key] = buffer
    return buffer


class _CudaTimer:
    """CUDA-event timing of ``fn`` (or of a CUDA graph of ``graph_calls`` calls of it), with the host's time a call.

    Eager, each repetition is one call as the user makes it: L2 flushed before it, a spin kernel queued ahead so
    that the GPU is still busy while the host launches (the events then hold the GPU's work alone: ``gpu``), the
    host's launch timed on its own clock (``host``); the sample is the larger of the two, what the call costs
    when the host is slower than the GPU. Under a graph, a sample is one replay over its calls (``gpu``) and the
    host's time a replay over its calls (``host``)."""

    def __init__(self, fn: Callable[[], Any], flush_l2: bool, cuda_graph: bool, graph_calls: int | None) -> None:
        import torch

        self.torch = torch
        self.fn = fn
        self.flush = _flush_buffer(torch) if flush_l2 else None
        self.cuda_graph = cuda_graph
        self.graph_calls = graph_calls
        self.graph: Any = None
        self.spin_cycles = 0
        self.gpu_ms: list[float] = []
        self.host_ms: list[float] = []
        self.eager_host_ms = 0.0

    def _estimate(self, call: Callable[[], Any], calls: int) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            call()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / calls

    def _host_estimate(self, calls: int = 5) -> float:
        """The host's milliseconds a call (median of ``calls``, no synchronization in between)."""
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            self.fn()
            times.append((time.perf_counter() - start) * 1e3)
        self.torch.cuda.synchronize()
        return statistics.median(times)

    def warm_up(self, warmup_ms: float, max_calls: int) -> tuple[int, float]:
        torch = self.torch
        # First call outside any timing: compiles and loads the kernel.
        self.fn()
        torch.cuda.synchronize()
        self.eager_host_ms = self._host_estimate()
        # The spin ahead of each eager repetition outlasts the host's launch by 20 us (at <= 2 GHz: cycles / 2000
        # is at least that many microseconds), capped at 2 ms.
        self.spin_cycles = int(min(2000.0, self.eager_host_ms * 1e3 * 1.5 + 20.0) * 2000)
        estimate_ms = self._estimate(self.fn, 5)
        calls = 11
        if self.cuda_graph:
            if self.graph_calls is None:
                self.graph_calls = max(1, min(1000, int(1.0 / estimate_ms) if estimate_ms > 0 else 1000))
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.fn()  # a call on the side stream before capture, as torch.cuda.graphs asks
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: other threads of the worker compile (prepare) while this one captures,
            # and their CUDA calls must not invalidate the capture.
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                for _ in range(self.graph_calls):
                    self.fn()
            torch.cuda.synchronize()
            calls += 1
            estimate_ms = self._estimate(self.graph.replay, 3) / self.graph_calls
        extra = int(warmup_ms / estimate_ms) if estimate_ms > 0 else 0
        extra = min(extra, max_calls)
        if self.graph is not None:
            extra = min(extra // self.graph_calls, max_calls)
        for _ in range(extra):
            if self.flush is not None:
                self.flush.zero_()
            self._call()
        return calls + extra * (self.graph_calls or 1), max(estimate_ms, self.eager_host_ms)

    def _call(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.fn()

    def sample(self, reps: int) -> list[float]:
        torch = self.torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        host_ms = []
        spin = self.spin_cycles if self.graph is None else 0
        for i in range(reps):
            if self.flush is not None:
                self.flush.zero_()
            if spin:
                torch.cuda._sleep(spin)
            starts[i].record()
            begin = time.perf_counter()
            self._call()
            host_ms.append((time.perf_counter() - begin) * 1e3)
            ends[i].record()
        torch.cuda.synchronize()
        per = self.graph_calls if self.graph is not None else 1
        gpu_ms = [s.elapsed_time(e) / per for s, e in zip(starts, ends, strict=True)]
        host_ms = [h / per for h in host_ms]
        self.gpu_ms.extend(gpu_ms)
        self.host_ms.extend(host_ms)
        if self.graph is not None:
            return gpu_ms
        return [max(g, h) for g, h in zip(gpu_ms, host_ms, strict=True)]

    def describe(self) -> dict[str, Any]:
        facts = {
            "l2": "flushed" if self.flush is not None else "warm",
            "gpu_ms": statistics.median(self.gpu_ms) if self.gpu_ms else None,
            "host_ms": statistics.median(self.host_ms) if self.host_ms else None,
            "eager_host_ms": self.eager_host_ms,
        }
        if self.graph is not None:
            return {"mode": "cuda_graph", "graph_calls": self.graph_calls, **facts}
        return {"mode": "eager", **facts}
