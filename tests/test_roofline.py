"""Roofline position of a trial: intensity, roof and achieved fraction."""

from __future__ import annotations

import pytest

from objectives.triton_gemm import TritonGemm
from tuner.workloads.roofline import describe_roofline, peaks_for, roofline_metrics

pytestmark = pytest.mark.timeout(30)


def test_compute_bound_gemm_on_an_h200() -> None:
    flops, moved, precision = TritonGemm(m=8192, n=8192, k=8192).work({"precision": "bf16"})
    assert flops == 2 * 8192**3 and moved == 3 * 8192 * 8192 * 2 and precision == "bf16"
    peaks = peaks_for("NVIDIA H200")
    # 8192^3 bf16 at 1.6 ms = 687 TFLOP/s; intensity 2730 FLOP/byte >> ridge (989.4e12 / 4.8e12 = 206)
    out = roofline_metrics(flops, moved, 1.6, peaks["bf16"], 4800.0)
    assert out["arithmetic_intensity"] == pytest.approx(2 * 8192 / 6)
    assert out["roof_tflops"] == pytest.approx(989.4)  # compute-bound: the roof is the peak
    assert out["roofline_fraction"] == pytest.approx(2 * 8192**3 / 1.6e-3 / 1e12 / 989.4)


def test_memory_bound_case_and_unknown_limits() -> None:
    # a skinny product: 1 x 8192 x 8192 fp16 moves the whole B for 2 FLOPs per element
    flops, moved, _ = TritonGemm(m=1, n=8192, k=8192).work({"precision": "fp16"})
    out = roofline_metrics(flops, moved, 0.05, 989.4, 4000.0)
    assert out["arithmetic_intensity"] < 1.1
    assert out["roof_tflops"] == pytest.approx(out["arithmetic_intensity"] * 4.0)  # memory-bound roof
    assert 0 < out["roofline_fraction"] < 1
    assert out["achieved_tflops"] == pytest.approx(flops / 0.05e-3 / 1e12)  # what the dashboard plots
    assert set(roofline_metrics(flops, moved, 0.05, None, None)) == {"arithmetic_intensity", "achieved_tflops"}
    assert roofline_metrics(0, moved, 0.05, 1.0, 1.0) == {}


def test_peak_tables() -> None:
    assert peaks_for("NVIDIA H100 80GB HBM3")["fp8"] == pytest.approx(1978.9)
    assert peaks_for("cpu") is None
    described = describe_roofline("NVIDIA H200", 4700.0)
    assert described["peak_tflops"] == pytest.approx(1978.9) and described["bandwidth_gbps"] == 4700.0
    assert describe_roofline("NVIDIA H200", None) is None
