"""GPU-only checks (skipped on CPU machines): the GEMM kernel's numerics compiled for a real GPU,
bf16 included, which the Triton interpreter computes wrongly."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiled kernels, not the interpreter"),
]

CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16", "fp8"])
@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (1000, 777, 513)])
def test_gemm_numerics_on_gpu(precision: str, shape: tuple[int, int, int]) -> None:
    from objectives.triton_gemm import TritonGemm
    from tuner.workloads.base import TrialContext, TrialStatus
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    workload = TritonGemm(m=shape[0], n=shape[1], k=shape[2])
    config = {**CONFIG, "precision": precision}
    if workload.static_check(config, device):
        pytest.skip(f"{precision} not supported on {device.name}")
    workload.prepare(config, device)
    result = workload.run(config, device, TrialContext())
    assert result.status == TrialStatus.OK, result.error
    assert result.timing_comparable
    bound = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-3, "bf16": 2e-2, "fp8": 0.1}[precision]
    assert 0 <= result.metrics["max_rel_error"] < bound
    assert result.metrics["tflops"] > 0 and len(result.samples_ms) >= 10


def test_worker_reports_roofline_position_and_clocks() -> None:
    from tuner.run.worker import TrialWorker

    worker = TrialWorker("triton_gemm", {"m": 4096, "n": 4096, "k": 4096}, "w-test")
    info = worker.describe()
    assert info["roofline"]["bandwidth_gbps"] > 100 and info["roofline"]["peaks_tflops"]["bf16"] > 0
    result = worker.run_trial({**CONFIG, "precision": "bf16"}, trial_number=0, attempt=1, seq=0)
    assert result["status"] == "ok", result["error"]
    metrics = result["metrics"]
    assert metrics["arithmetic_intensity"] == pytest.approx(2 * 4096 / 6)
    assert 0 < metrics["roofline_fraction"] < 1.2
    assert metrics["sm_clock_mhz"] > 100 and metrics["gpu_temp_c"] > 0
