"""The Triton GEMM kernel, the ``triton_gemm`` workload, the stopwatch and the fingerprint, on a CPU.

Kernels run under the Triton interpreter: ``TRITON_INTERPRET`` must be set
before triton is imported (the test command and ``conftest.py`` set it on
machines without a GPU), and the kernel modules are imported inside the tests.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus

CPU = DeviceInfo(kind="cpu", name="cpu")
H100 = DeviceInfo(kind="cuda", name="NVIDIA H100", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
A100 = DeviceInfo(kind="cuda", name="NVIDIA A100", compute_capability=(8, 0), smem_per_block_bytes=166912)
T4 = DeviceInfo(kind="cuda", name="Tesla T4", compute_capability=(7, 5), smem_per_block_bytes=65536)

SHAPES = [(48, 80, 64), (33, 47, 29)]
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages): small tiles keep the interpreter fast.
TILES = [(16, 16, 32, 1, 4, 2), (32, 16, 32, 4, 2, 3)]


def _config(tile: tuple[int, ...], precision: str) -> dict:
    names = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
    return {**dict(zip(names, tile, strict=True)), "precision": precision}


@pytest.fixture
def interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1 before triton is imported)")
    from kernels.gemm.gemm import matmul_kernel

    if type(matmul_kernel).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: kernels compile, not interpret")


# --------------------------------------------------------------------------- the kernel


@pytest.mark.timeout(120)
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "fp8"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernel_matches_torch_reference(interpreter: None, precision: str, shape: tuple[int, int, int]) -> None:
    from kernels.gemm import gemm
    from objectives.triton_gemm import TOLERANCE_VS_FP32, TOLERANCE_VS_OPERANDS

    m, n, k = shape
    inputs = gemm.prepare_inputs(m, n, k, precision, "cpu", seed=1)
    assert inputs.a.dtype == gemm.INPUT_DTYPES[precision] and inputs.a.shape == (m, k)
    assert inputs.b.dtype == gemm.INPUT_DTYPES[precision] and inputs.b.shape == (k, n)
    ref = gemm.reference_matmul(inputs.a_master, inputs.b_master)
    operand_ref = gemm.torch_matmul(inputs)
    for tile in TILES:
        out = gemm.matmul(
            inputs.a,
            inputs.b,
            scale_a=inputs.scale_a,
            scale_b=inputs.scale_b,
            **_config(tile, precision),
        )
        assert out.shape == (m, n) and out.dtype == gemm.OUTPUT_DTYPES[precision]
        assert not out.isnan().any()
        assert gemm.max_rel_error(out, ref) <= TOLERANCE_VS_FP32[precision], tile
        # Against the operands' own product only accumulation order and output rounding remain.
        assert gemm.max_rel_error(out, operand_ref) <= TOLERANCE_VS_OPERANDS.get(precision, 1e-5), tile


@pytest.mark.timeout(60)
def test_kernel_writes_into_out_and_handles_k_multiple_of_block(interpreter: None) -> None:
    import torch

    from kernels.gemm import gemm

    inputs = gemm.prepare_inputs(32, 48, 64, "fp32", "cpu", seed=2)  # EVEN_K path: no K mask
    out = torch.full((32, 48), float("nan"))
    result = gemm.matmul(inputs.a, inputs.b, out=out, **_config((16, 16, 32, 8, 4, 2), "fp32"))
    assert result is out
    assert gemm.max_rel_error(out, gemm.reference_matmul(inputs.a_master, inputs.b_master)) <= 1e-5


@pytest.mark.timeout(30)
def test_matmul_rejects_wrong_dtypes_and_shapes(interpreter: None) -> None:
    import torch

    from kernels.gemm import gemm

    tile = _config((16, 16, 16, 1, 4, 2), "fp16")
    a = torch.zeros(16, 16)
    with pytest.raises(ValueError, match="float16"):
        gemm.matmul(a, a, **tile)
    with pytest.raises(ValueError, match="incompatible shapes"):
        gemm.matmul(torch.zeros(16, 8, dtype=torch.float16), torch.zeros(16, 8, dtype=torch.float16), **tile)
    with pytest.raises(ValueError, match="precision"):
        gemm.matmul(a, a, **{**tile, "precision": "fp64"})


@pytest.mark.timeout(30)
def test_compile_only_is_a_no_op_under_the_interpreter(interpreter: None) -> None:
    from kernels.gemm import gemm

    kwargs = _config((16, 16, 32, 1, 4, 2), "fp8")
    assert gemm.compile_only(48, 80, 64, **kwargs) is None
    assert gemm.operand_strides(48, 80, 64, "fp8")["b"] == (1, 64)  # K-major B, as quantize_inputs makes it
    assert gemm.prepare_inputs(48, 80, 64, "fp8", "cpu", 0).b.stride() == (1, 64)
    fp16_b = gemm.prepare_inputs(48, 80, 64, "fp16", "cpu", 0).b
    assert fp16_b.stride() == gemm.operand_strides(48, 80, 64, "fp16")["b"]


# --------------------------------------------------------------------------- static feasibility


@pytest.mark.timeout(10)
def test_static_check_refuses_bf16_on_cpu_and_precisions_the_gpu_lacks() -> None:
    from objectives.triton_gemm import TritonGemm

    workload = TritonGemm(m=48, n=80, k=64)
    tile = (64, 64, 32, 8, 4, 3)
    reason = workload.static_check(_config(tile, "bf16"), CPU)
    assert reason is not None and "bf16" in reason and "interpreter" in reason
    assert workload.static_check(_config(tile, "fp16"), CPU) is None
    assert workload.static_check(_config(tile, "fp8"), CPU) is None

    assert "fp8" in (workload.static_check(_config(tile, "fp8"), A100) or "")
    assert "tf32" in (workload.static_check(_config(tile, "tf32"), T4) or "")
    assert workload.static_check(_config(tile, "tf32"), A100) is None
    assert workload.static_check(_config((64, 64, 16, 8, 4, 3), "fp8"), CPU) is not None  # BLOCK_K < 32
    assert workload.static_check(_config((48, 64, 32, 8, 4, 3), "fp16"), CPU) is not None  # not a power of 2
    assert workload.static_check({"BLOCK_M": 64}, CPU) is not None
    assert workload.static_check(_config(tile, "int4"), CPU) is not None


@pytest.mark.timeout(10)
def test_static_check_accepts_bf16_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from objectives.triton_gemm import TritonGemm

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a GPU worker does not interpret
    workload = TritonGemm(m=4096, n=4096, k=4096)
    assert workload.static_check(_config((128, 256, 64, 8, 8, 3), "bf16"), H100) is None


@pytest.mark.timeout(10)
def test_args_are_validated_naming_the_arg() -> None:
    from objectives.triton_gemm import TritonGemm

    for bad in ({"m": 0, "n": 1, "k": 1}, {"m": 1, "n": -3, "k": 1}, {"m": 1, "n": 1, "k": "8"}):
        name = next(arg for arg, value in bad.items() if value != 1)
        with pytest.raises(ValueError, match=f"^{name} "):
            TritonGemm(**bad)
    with pytest.raises(ValueError, match="seed"):
        TritonGemm(m=1, n=1, k=1, seed=1.5)


@pytest.mark.timeout(10)
def test_export_config_is_ready_for_triton_config() -> None:
    from objectives.triton_gemm import TritonGemm

    exported = TritonGemm(m=8, n=8, k=8).export_config(_config((128, 256, 64, 8, 8, 3), "bf16"))
    assert exported == {
        "kwargs": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8},
        "num_warps": 8,
        "num_stages": 3,
        "precision": "bf16",
        "pad_k": False,
        "kernel": "tutorial",
        "function": "kernels.gemm.gemm.matmul",
    }


@pytest.mark.timeout(10)
def test_default_space_seeds_pass_static_check() -> None:
    yaml = pytest.importorskip("yaml")
    from objectives.triton_gemm import TILE_PARAMS, TritonGemm

    space_file = Path(__file__).resolve().parents[1] / "search_spaces" / TritonGemm.space_file
    space = yaml.safe_load(space_file.read_text())
    assert space["workloads"] == [TritonGemm.name]
    assert set(space["params"]) == {
        *TILE_PARAMS, "precision", "pad_k", "kernel", "EPILOGUE_SUBTILE", "FP8_FAST_ACCUM", "STREAM_K"
    }  # fmt: skip
    workload = TritonGemm(m=4096, n=4096, k=4096)
    for seed in space["seeds"]:
        persistent = {"EPILOGUE_SUBTILE", "STREAM_K"} | ({"FP8_FAST_ACCUM"} if seed["precision"] == "fp8" else set())
        expected = {*TILE_PARAMS, "precision", "pad_k", "kernel"}
        expected |= persistent if seed["kernel"] != "tutorial" else set()
        assert set(seed) == expected, seed
        reason = workload.static_check(seed, H100)
        # bf16 is refused only because this process runs the interpreter.
        assert reason is None or (seed["precision"] == "bf16" and "interpreter" in reason), seed


# --------------------------------------------------------------------------- the workload, end to end


@pytest.mark.timeout(120)
@pytest.mark.parametrize("precision", ["fp32", "fp16", "fp8"])
def test_run_on_cpu_returns_ok_with_all_metrics(interpreter: None, precision: str) -> None:
    from objectives.triton_gemm import TritonGemm

    workload = TritonGemm(m=48, n=80, k=64, seed=3)
    config = _config((32, 32, 32, 4, 4, 2), precision)
    workload.prepare(config, CPU)  # a no-op on CPU
    result = workload.run(config, CPU, TrialContext(trial_number=0))
    assert result.status == TrialStatus.OK, result.error
    assert set(result.metrics) >= {"tflops", "max_rel_error", "latency_ms"}
    assert result.metrics["tflops"] > 0 and result.metrics["latency_ms"] > 0
    assert 0 <= result.metrics["max_rel_error"] < 0.15
    assert result.timing_comparable is False
    assert len(result.samples_ms) == 3 and all(s > 0 for s in result.samples_ms)
    assert result.extra["timing"]["median_ms"] == result.metrics["latency_ms"]
    # A second trial of the same precision reuses the cached inputs and reference.
    cached = workload._cases[(precision, "cpu")]
    assert workload.run(config, CPU, TrialContext(trial_number=1)).ok
    assert workload._cases[(precision, "cpu")] is cached


@pytest.mark.timeout(30)
def test_run_refuses_bf16_on_cpu_without_computing() -> None:
    from objectives.triton_gemm import TritonGemm

    workload = TritonGemm(m=48, n=80, k=64)
    result = workload.run(_config((32, 32, 32, 4, 4, 2), "bf16"), CPU, TrialContext())
    assert result.status == TrialStatus.INFEASIBLE_STATIC and "bf16" in (result.error or "")
    assert not workload._cases


@pytest.mark.timeout(60)
def test_wrong_results_are_numerics_fail(interpreter: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import kernels.gemm.gemm
    from objectives.triton_gemm import TritonGemm

    real_matmul = kernels.gemm.gemm.matmul
    config = _config((32, 32, 32, 4, 4, 2), "fp16")

    def zeros(a, b, *, out, **kwargs):
        out.zero_()
        return out

    def writes_nothing(a, b, *, out, **kwargs):
        return out

    def off_by_one_percent(a, b, *, out, **kwargs):
        # Within the fp16-vs-fp32 tolerance: only the check against the operands' product catches it.
        real_matmul(a, b, out=out, **kwargs)
        return out.mul_(1.01)

    expected = {zeros: "exceeds", writes_nothing: "NaN", off_by_one_percent: "the kernel"}
    for fake, message in expected.items():
        monkeypatch.setattr(kernels.gemm.gemm, "matmul", fake)
        result = TritonGemm(m=48, n=80, k=64).run(config, CPU, TrialContext())
        assert result.status == TrialStatus.NUMERICS_FAIL, fake.__name__
        assert message in (result.error or ""), result.error
        assert "max_rel_error" in result.metrics and not result.samples_ms
    monkeypatch.setattr(kernels.gemm.gemm, "matmul", real_matmul)
    assert TritonGemm(m=48, n=80, k=64).run(config, CPU, TrialContext()).ok


@pytest.mark.timeout(30)
def test_check_numerics_directly() -> None:
    import torch

    from objectives.triton_gemm import check_numerics

    ref = torch.arange(12, dtype=torch.float32).reshape(3, 4) + 1
    assert check_numerics(ref.clone(), ref, None, "fp32", k=16).ok
    bad = check_numerics(ref * 1.5, ref, None, "fp32", k=16)
    assert not bad.ok and bad.max_rel_error == pytest.approx(0.5)
    poisoned = ref.clone()
    poisoned[1, 2] = float("nan")
    unwritten = check_numerics(poisoned, ref, None, "fp32", k=16)
    assert not unwritten.ok and math.isinf(unwritten.max_rel_error) and "1 of 12" in (unwritten.failure or "")


@pytest.mark.timeout(30)
def test_compile_failures_become_statuses(monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime.errors import OutOfResources

    import kernels.gemm.gemm
    import objectives.triton_gemm as triton_gemm

    class CompilationError(Exception):  # matched by name, like triton.compiler.errors.CompilationError
        pass

    config = _config((32, 32, 32, 4, 4, 2), "fp16")

    def raise_oor(*args, **kwargs):
        raise OutOfResources(245760, 232448, "shared memory")

    def raise_compile(*args, **kwargs):
        raise CompilationError("at 12:8: unsupported layout")

    for fake, status in (
        (raise_oor, TrialStatus.OUT_OF_RESOURCES),
        (raise_compile, TrialStatus.COMPILE_ERROR),
    ):
        monkeypatch.setattr(kernels.gemm.gemm, "matmul", fake)
        result = triton_gemm.TritonGemm(m=48, n=80, k=64).run(config, CPU, TrialContext())
        assert result.status == status and result.error

    # prepare() on a GPU keeps the failure, and run() reports it without compiling again.
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # as on a GPU (the kernels stay interpreted: nothing launches)
    monkeypatch.setattr(kernels.gemm.gemm, "compile_only", raise_oor)
    workload = triton_gemm.TritonGemm(m=4096, n=4096, k=4096)
    workload.prepare(config, H100)  # must not raise
    result = workload.run(config, H100, TrialContext())
    assert result.status == TrialStatus.OUT_OF_RESOURCES and "shared memory" in (result.error or "")
    assert result.timing_comparable is True


# --------------------------------------------------------------------------- stopwatch and fingerprint


@pytest.mark.timeout(30)
def test_time_fn_on_cpu_returns_requested_samples() -> None:
    from tuner.workloads.measure import time_fn

    calls = []
    timing = time_fn(lambda: calls.append(1), CPU, warmup_ms=0, rep_ms=0, min_reps=7, max_reps=7)
    assert len(timing.samples_ms) == 7 and timing.reps == 7
    assert len(calls) == 7 + timing.warmup_calls and timing.warmup_calls >= 1
    lo, hi = timing.ci95_ms
    assert min(timing.samples_ms) <= lo <= timing.median_ms <= hi <= max(timing.samples_ms)
    assert timing.iqr_ms >= 0

    slept = time_fn(lambda: time.sleep(0.002), CPU, warmup_ms=4, rep_ms=20, min_reps=3, max_reps=50)
    assert 3 <= slept.reps <= 10  # ~20 ms budget / >= 2 ms per call
    assert slept.median_ms >= 2.0


@pytest.mark.timeout(10)
def test_timing_statistics() -> None:
    from tuner.workloads.measure import Timing, median_ci95, time_fn

    timing = Timing.from_samples([float(x) for x in range(10, 0, -1)])
    assert timing.median_ms == 5.5 and timing.iqr_ms == pytest.approx(4.5)
    assert timing.ci95_ms == (1.0, 10.0)  # 10 samples: the full range
    assert median_ci95([float(x) for x in range(1, 101)]) == (40.0, 61.0)
    assert timing.to_dict()["reps"] == 10
    with pytest.raises(ValueError):
        Timing.from_samples([])
    with pytest.raises(ValueError, match="min_reps"):
        time_fn(lambda: None, CPU, min_reps=5, max_reps=2)


@pytest.mark.timeout(60)
def test_fingerprint_and_device_info_on_cpu() -> None:
    import torch

    from tuner.workloads.fingerprint import device_info, fingerprint

    if torch.cuda.is_available():
        pytest.skip("checks the CPU fingerprint; this machine has a GPU")
    fp = fingerprint()
    for key in (
        "hostname",
        "python",
        "torch",
        "triton",
        "cuda",
        "driver",
        "nccl",
        "gpu_names",
        "gpu_count",
        "device_kind",
        "triton_interpret",
    ):
        assert key in fp, key
    assert fp["device_kind"] == "cpu" and fp["gpu_count"] == 0 and fp["gpu_names"] == []
    assert fp["torch"] == torch.__version__ and fp["triton"]
    assert fp["triton_interpret"] is (os.environ.get("TRITON_INTERPRET") == "1")
    assert fp["nccl"] is None

    info = device_info()
    assert info.kind == "cpu" and not info.is_gpu and info.name
    assert info.compute_capability is None and info.smem_per_block_bytes is None


@pytest.mark.parametrize("precision", ["fp16", "fp8", "tf32"])
def test_pad_k_copies_into_aligned_zero_padded_operands(interpreter: None, precision: str) -> None:
    """K=50 padded to 128: same numerics as unpadded (zeros add nothing), both layouts of B."""
    from objectives import triton_gemm

    workload = triton_gemm.TritonGemm(m=40, n=24, k=50)
    config = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 2}
    plain = workload.run({**config, "precision": precision, "pad_k": False}, CPU, TrialContext())
    padded = workload.run({**config, "precision": precision, "pad_k": True}, CPU, TrialContext())
    assert plain.status == padded.status == TrialStatus.OK, (plain.error, padded.error)
    assert padded.metrics["max_rel_error"] == pytest.approx(plain.metrics["max_rel_error"], rel=0.05, abs=1e-6)
    case = workload._cases[(precision, "cpu")]
    a_pad, b_pad = case.padded
    assert a_pad.shape == (40, 128) and b_pad.shape == (128, 24)
    assert b_pad.stride() == ((1, 128) if precision in ("fp8", "tf32") else (24, 1))
    assert a_pad[:, 50:].float().abs().sum() == 0 and b_pad[50:].float().abs().sum() == 0
    export = workload.export_config({**config, "precision": precision, "pad_k": True})
    assert export["pad_k"] is True and "zero-padded" in workload.export_python(
        {**config, "precision": precision, "pad_k": True}
    )


def test_pad_k_is_refused_where_k_is_aligned_already() -> None:
    from objectives import triton_gemm

    config = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 2}
    aligned = triton_gemm.TritonGemm(m=40, n=24, k=256)
    assert "multiple of 128" in aligned.static_check({**config, "precision": "fp16", "pad_k": True}, CPU)
    assert aligned.static_check({**config, "precision": "fp16", "pad_k": False}, CPU) is None
    assert "true or false" in aligned.static_check({**config, "precision": "fp16", "pad_k": 1}, CPU)
