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

from tuner.workload import DeviceInfo

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


def time_fn(
    fn: Callable[[], Any],
    device: DeviceInfo,
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_reps: int = 5,
    max_reps: int = 1000,
    flush_l2: bool = True,
) -> Timing:
    """Time ``fn()`` on ``device`` and return every sample in milliseconds.

    ``fn`` is called at least once untimed (compile, caches), then untimed
    until ``warmup_ms`` milliseconds have been spent; the number of timed
    repetitions is ``rep_ms`` divided by the per-call estimate from warm-up,
    clamped to ``[min_reps, max_reps]`` (so ``min_reps == max_reps`` fixes it).
    On CUDA, repetitions are timed with CUDA events on the current stream, and
    when ``flush_l2`` a 256 MiB buffer (allocated once per device) is zeroed
    before each one, outside the timed interval. On CPU, ``time.perf_counter``
    times each call and nothing is flushed.
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got min_reps={min_reps}, max_reps={max_reps}")
    if device.is_gpu:
        return _time_cuda(fn, warmup_ms, rep_ms, min_reps, max_reps, flush_l2)
    return _time_cpu(fn, warmup_ms, rep_ms, min_reps, max_reps)


def _time_cpu(fn: Callable[[], Any], warmup_ms: float, rep_ms: float, min_reps: int, max_reps: int) -> Timing:
    warmup_calls = 0
    spent_ms = 0.0
    while warmup_calls == 0 or spent_ms < warmup_ms:
        start = time.perf_counter()
        fn()
        spent_ms += (time.perf_counter() - start) * 1e3
        warmup_calls += 1
    reps = _rep_count(spent_ms / warmup_calls, rep_ms, min_reps, max_reps)
    samples_ms = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples_ms.append((time.perf_counter() - start) * 1e3)
    return Timing.from_samples(samples_ms, warmup_calls)


def _flush_buffer(torch: Any) -> Any:
    key = torch.cuda.current_device()
    buffer = _flush_buffers.get(key)
    if buffer is None:
        buffer = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        _flush_buffers[key] = buffer
    return buffer


def _time_cuda(
    fn: Callable[[], Any], warmup_ms: float, rep_ms: float, min_reps: int, max_reps: int, flush_l2: bool
) -> Timing:
    import torch

    flush = _flush_buffer(torch) if flush_l2 else None
    # First call outside any timing: compiles and loads the kernel.
    fn()
    torch.cuda.synchronize()

    # Estimate the per-call time (flush included in neither) from a few calls.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = start.elapsed_time(end) / 5
    warmup_calls = 6
    extra_warmup = int(warmup_ms / estimate_ms) if estimate_ms > 0 else 0
    for _ in range(min(extra_warmup, max_reps)):
        if flush is not None:
            flush.zero_()
        fn()
    warmup_calls += min(extra_warmup, max_reps)

    reps = _rep_count(estimate_ms, rep_ms, min_reps, max_reps)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    samples_ms = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return Timing.from_samples(samples_ms, warmup_calls)
