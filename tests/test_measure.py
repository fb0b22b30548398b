"""The stopwatch (tuner/workloads/measure.py): adaptive repetition, its statistics, and the CUDA-graph mode on a GPU."""

from __future__ import annotations

import itertools
import os

import pytest

from tuner.workloads.base import DeviceInfo
from tuner.workloads.measure import Timing, median_ci95, rel_ci_half_width, step_intervals_ms, time_fn, timed_steps

CPU = DeviceInfo()


class FakeClock:
    """Stands in for ``time.perf_counter`` in tuner.workloads.measure: only the timed function advances it,
    so the samples are exactly the durations it is given, however loaded the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    import tuner.workloads.measure

    fake = FakeClock()
    monkeypatch.setattr(tuner.workloads.measure, "time", fake)
    return fake


def _sleeper(durations_ms: list[float], clock: FakeClock):
    cycle = itertools.cycle(durations_ms)

    def fn() -> None:
        clock.now += next(cycle) / 1e3

    return fn


def test_fixed_repetitions_take_no_extra_rounds(clock: FakeClock) -> None:
    timing = time_fn(_sleeper([1.0], clock), CPU, warmup_ms=0, rep_ms=0, min_reps=4, max_reps=4)
    assert timing.reps == 4 and "converged" not in timing.extra and timing.extra["mode"] == "cpu"


def test_a_steady_function_converges_in_the_first_round(clock: FakeClock) -> None:
    timing = time_fn(
        _sleeper([2.0, 2.02], clock), CPU, warmup_ms=0, rep_ms=0, min_reps=10, max_reps=200, target_rel_ci=0.2
    )
    assert timing.reps == 10 and timing.extra["converged"] is True
    assert timing.extra["rel_ci"] <= 0.2 and timing.median_ms == pytest.approx(2.01)


def test_a_noisy_function_gets_more_rounds_until_the_cap(clock: FakeClock) -> None:
    # Half the calls take 1 ms, half 6 ms: the median's interval straddles both and never narrows.
    timing = time_fn(
        _sleeper([1.0, 6.0], clock),
        CPU,
        warmup_ms=0,
        rep_ms=0,
        min_reps=6,
        max_reps=40,
        target_rel_ci=0.01,
        max_time_ms=1e9,
    )
    assert timing.reps == 40 and timing.extra["converged"] is False and timing.extra["rel_ci"] > 0.01
    assert timing.to_dict()["converged"] is False and timing.to_dict()["reps"] == 40


def test_the_time_cap_stops_adaptive_rounds(clock: FakeClock) -> None:
    timing = time_fn(
        _sleeper([1.0, 6.0], clock),
        CPU,
        warmup_ms=0,
        rep_ms=0,
        min_reps=6,
        max_reps=10_000,
        target_rel_ci=0.01,
        max_time_ms=60,
    )
    # Rounds of 6, 6 and 12 samples (3.5 ms each on average): 84 ms of timed calls, past the 60 ms cap.
    assert timing.reps == 24 and timing.extra["converged"] is False


def test_timed_steps_mark_each_step_and_give_one_interval_per_step(clock: FakeClock) -> None:
    calls = []
    step = _sleeper([3.0, 5.0, 7.0], clock)
    marks = timed_steps(lambda: calls.append(step()), 3, cuda=False)
    assert len(calls) == 3 and len(marks) == 4
    assert step_intervals_ms(marks, cuda=False) == pytest.approx([3.0, 5.0, 7.0])
    assert step_intervals_ms(marks[:1], cuda=False) == []


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="min_reps"):
        time_fn(lambda: None, CPU, min_reps=5, max_reps=2)
    with pytest.raises(ValueError, match="target_rel_ci"):
        time_fn(lambda: None, CPU, target_rel_ci=0)


def test_statistics_of_known_samples() -> None:
    samples = [float(v) for v in range(1, 101)]
    timing = Timing.from_samples(samples)
    assert timing.median_ms == 50.5 and timing.iqr_ms == pytest.approx(49.5)
    lo, hi = median_ci95(sorted(samples))
    assert lo == 40 and hi == 61  # ranks 50 -/+ 9.8, rounded outward
    assert rel_ci_half_width(timing) == pytest.approx((61 - 40) / 2 / 50.5)


torch = pytest.importorskip("torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiled kernels, not the interpreter")
def test_cuda_graph_mode_removes_launch_overhead_of_a_tiny_kernel() -> None:
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    x = torch.zeros(1024, device="cuda")
    events = time_fn(lambda: x.add_(1), device, min_reps=50, max_reps=50, flush_l2=False)
    graph = time_fn(lambda: x.add_(1), device, min_reps=50, max_reps=50, flush_l2=False, cuda_graph=True)
    assert graph.extra["mode"] == "cuda_graph" and graph.extra["graph_calls"] >= 10
    assert events.extra["mode"] == "eager"
    # A 4 KB add is a few microseconds of launch; replayed from a graph it is well under that.
    assert graph.median_ms < events.median_ms
    # Eager, the call's time is the larger of its GPU time and its host time: the host's, here.
    assert events.median_ms >= events.extra["host_ms"] * 0.9 and events.extra["gpu_ms"] < events.median_ms
    adaptive = time_fn(lambda: x.add_(1), device, target_rel_ci=0.02, flush_l2=False)
    assert "converged" in adaptive.extra and adaptive.reps >= 5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiled kernels, not the interpreter")
def test_eager_latency_holds_a_slow_launchers_host_time() -> None:
    """A launcher that spends 300 us on the host before a 4 KB kernel: the GPU's own time stays a few microseconds,
    the call's latency is the host's 300 us (what the user's loop of such calls gets), and a CUDA graph of the call
    leaves the host out."""
    import time as clock

    from tuner.workloads.fingerprint import device_info

    x = torch.zeros(1024, device="cuda")

    def slow_launch() -> None:
        until = clock.perf_counter() + 300e-6
        while clock.perf_counter() < until:
            pass
        x.add_(1)

    eager = time_fn(slow_launch, device_info(), min_reps=30, max_reps=30)
    assert eager.extra["mode"] == "eager" and eager.extra["l2"] == "flushed"
    assert eager.extra["host_ms"] >= 0.3 and eager.median_ms >= 0.3
    assert eager.extra["gpu_ms"] < 0.1, eager.extra  # the spin ahead hid the host's launch from the events
