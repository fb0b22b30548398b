"""The fused attention kernel and the ``flash_attention`` workload, on a CPU (and on a GPU when there is one).

Kernels run under the Triton interpreter: ``TRITON_INTERPRET`` must be set
before triton is imported (``conftest.py`` sets it on machines without a
GPU), and the kernel modules are imported inside the tests. bf16 numerics are
checked only by the GPU tests at the end (the interpreter's bf16 ``tl.dot``
is wrong).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pytest
from conftest import compiled_gpu

from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus

CPU = DeviceInfo(kind="cpu", name="cpu")
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
A100 = DeviceInfo(kind="cuda", name="NVIDIA A100", compute_capability=(8, 0), smem_per_block_bytes=166912)
T4 = DeviceInfo(kind="cuda", name="Tesla T4", compute_capability=(7, 5), smem_per_block_bytes=65536)

#: Small shapes for the interpreter: (batch, heads, seq_len, head_dim); 80 and 40 are not multiples
#: of the blocks, 64 is.
SMALL = {"batch": 1, "heads": 2, "seq_len": 80, "head_dim": 64}


def _config(block_m: int, block_n: int, precision: str = "fp16", use_tma: bool = False, **extra: int) -> dict:
    return {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "num_warps": extra.get("num_warps", 4),
        "num_stages": extra.get("num_stages", 2),
        "precision": precision,
        "use_tma": use_tma,
    }


def _shape_id(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


@pytest.fixture
def interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1 before triton is imported)")
    from kernels.attention.attention import attention_fwd_kernel

    if type(attention_fwd_kernel).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: kernels compile, not interpret")


# --------------------------------------------------------------------------- the kernel


@pytest.mark.timeout(120)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 2, 80, 64), (2, 1, 64, 128), (1, 1, 40, 64)], ids=_shape_id)
def test_kernel_matches_sdpa(interpreter: None, shape: tuple[int, int, int, int], causal: bool) -> None:
    import torch

    from kernels.attention import attention as attn
    from kernels.gemm.gemm import max_rel_error
    from objectives.flash_attention import TOLERANCE_VS_FP32

    masters = attn.make_masters(*shape, "cpu", seed=1)
    q, k, v = attn.quantize(masters, "fp16")
    assert q.dtype == torch.float16 and q.shape == shape and q.is_contiguous()
    ref = attn.reference_attention(*masters, causal)
    # SDPA of the very fp16 operands: only the kernel's own rounding (P, output) remains.
    operand_ref = attn.reference_attention(q, k, v, causal)
    torch_ref = torch.nn.functional.scaled_dot_product_attention(*(t.float() for t in (q, k, v)), is_causal=causal)
    assert max_rel_error(operand_ref, torch_ref) < 1e-5
    # Tiles smaller than, equal to and larger than the other dimension; TMA and plain loads.
    for block_m, block_n, use_tma in ((16, 16, False), (32, 16, True), (16, 64, False), (64, 32, True)):
        out = attn.attention(
            q, k, v, causal=causal, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, num_stages=2, use_tma=use_tma
        )
        assert out.shape == shape and out.dtype == torch.float16 and torch.isfinite(out).all()
        tile = (block_m, block_n, use_tma)
        assert max_rel_error(out, ref) <= TOLERANCE_VS_FP32["fp16"], tile
        assert max_rel_error(out, operand_ref) <= 2e-3, tile


@pytest.mark.timeout(60)
def test_causal_mask_and_scale_matter(interpreter: None) -> None:
    """The tolerance is tight enough to see a missing mask or a wrong scale (the errors a kernel makes)."""
    from kernels.attention import attention as attn
    from kernels.gemm.gemm import max_rel_error
    from objectives.flash_attention import TOLERANCE_VS_FP32

    masters = attn.make_masters(1, 1, 64, 64, "cpu", seed=2)
    q, k, v = attn.quantize(masters, "fp16")
    tile = {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    causal_ref = attn.reference_attention(*masters, True)
    assert max_rel_error(attn.attention(q, k, v, causal=True, **tile), causal_ref) <= TOLERANCE_VS_FP32["fp16"]
    unmasked = attn.attention(q, k, v, causal=False, **tile)
    assert max_rel_error(unmasked, causal_ref) > 0.1
    rescaled = attn.attention(q, k, v, causal=True, sm_scale=0.9 / math.sqrt(64), **tile)
    assert max_rel_error(rescaled, causal_ref) > TOLERANCE_VS_FP32["bf16"]


@pytest.mark.timeout(60)
def test_kernel_writes_into_out(interpreter: None) -> None:
    import torch

    from kernels.attention import attention as attn
    from kernels.gemm.gemm import max_rel_error

    masters = attn.make_masters(1, 2, 48, 64, "cpu", seed=3)
    q, k, v = attn.quantize(masters, "fp16")
    out = torch.full_like(q, float("nan"))
    result = attn.attention(q, k, v, causal=True, BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=2, out=out)
    assert result is out and torch.isfinite(out).all()
    assert max_rel_error(out, attn.reference_attention(*masters, True)) <= 5e-3


@pytest.mark.timeout(30)
def test_attention_rejects_bad_inputs(interpreter: None) -> None:
    import torch

    from kernels.attention import attention as attn

    tile = {"causal": False, "BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
    x = torch.zeros(1, 1, 16, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        attn.attention(x.float(), x.float(), x.float(), **tile)
    with pytest.raises(ValueError, match="one shape"):
        attn.attention(x, x, torch.zeros(1, 1, 32, 64, dtype=torch.float16), **tile)
    with pytest.raises(ValueError, match="contiguous"):
        y = torch.zeros(1, 16, 2, 64, dtype=torch.float16).transpose(1, 2)
        attn.attention(y, y, y, **tile)
    with pytest.raises(ValueError, match="head_dim"):
        z = torch.zeros(1, 1, 16, 48, dtype=torch.float16)
        attn.attention(z, z, z, **tile)
    with pytest.raises(ValueError, match="BLOCK_N"):
        attn.attention(x, x, x, **{**tile, "BLOCK_N": 24})
    with pytest.raises(ValueError, match="precision"):
        attn.quantize((x, x, x), "fp8")


@pytest.mark.timeout(30)
def test_compile_only_is_a_no_op_under_the_interpreter(interpreter: None) -> None:
    from kernels.attention import attention as attn

    assert attn.tma_available()
    assert attn.compile_only(1, 2, 80, 64, causal=True, precision="fp16", **_tile((128, 64))) is None
    with pytest.raises(ValueError, match="precision"):
        attn.compile_only(1, 2, 80, 64, causal=True, precision="fp32", **_tile((128, 64)))


def _tile(blocks: tuple[int, int]) -> dict:
    return {"BLOCK_M": blocks[0], "BLOCK_N": blocks[1], "num_warps": 4, "num_stages": 3}


@pytest.mark.timeout(10)
def test_flops_count() -> None:
    from kernels.attention.attention import attention_flops
    from objectives.flash_attention import FlashAttention

    assert attention_flops(2, 16, 8192, 128, False) == 4 * 2 * 16 * 8192 * 8192 * 128
    assert attention_flops(2, 16, 8192, 128, True) == 2 * 2 * 16 * 8192 * 8192 * 128
    workload = FlashAttention(batch=2, heads=16, seq_len=8192, head_dim=128, causal=True)
    assert workload.flops == attention_flops(2, 16, 8192, 128, True)
    flops, moved, precision = workload.work(_config(128, 64, "bf16"))
    assert flops == workload.flops and precision == "bf16"
    assert moved == 4 * 2 * 16 * 8192 * 128 * 2  # Q, K, V read once and O written once, 2 bytes each


# --------------------------------------------------------------------------- static feasibility


@pytest.mark.timeout(10)
def test_static_check_refusals() -> None:
    from objectives.flash_attention import FlashAttention

    workload = FlashAttention(**SMALL)
    assert workload.static_check(_config(32, 32), CPU) is None
    reason = workload.static_check(_config(32, 32, "bf16"), CPU)
    assert reason is not None and "bf16" in reason and "interpreter" in reason
    assert "power of two" in (workload.static_check(_config(48, 32), CPU) or "")
    assert "power of two" in (workload.static_check(_config(32, 8), CPU) or "")
    assert "num_warps" in (workload.static_check(_config(32, 32, num_warps=3), CPU) or "")
    assert "num_stages" in (workload.static_check(_config(32, 32, num_stages=0), CPU) or "")
    assert "seq_len" in (workload.static_check(_config(256, 32), CPU) or "")  # 80 rounds up to 128
    assert "precision" in (workload.static_check(_config(32, 32, "fp32"), CPU) or "")
    assert "lacks" in (workload.static_check({"BLOCK_M": 32}, CPU) or "")
    assert "use_tma" in (workload.static_check({**_config(32, 32), "use_tma": "yes"}, CPU) or "")
    assert workload.static_check({**_config(32, 32), "BLOCK_M": "x"}, CPU) is not None


@pytest.mark.timeout(10)
def test_static_check_on_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import objectives.flash_attention as fa

    monkeypatch.setattr(fa, "interpreter_active", lambda: False)  # a GPU worker does not interpret
    long_128 = fa.FlashAttention(batch=2, heads=16, seq_len=8192, head_dim=128)
    long_64 = fa.FlashAttention(batch=2, heads=32, seq_len=8192, head_dim=64)
    assert long_128.static_check(_config(128, 64, "bf16", True, num_stages=3), H200) is None
    # TMA needs Hopper, bf16 needs Ampere.
    assert "use_tma" in (long_128.static_check(_config(128, 64, "bf16", True), A100) or "")
    assert long_128.static_check(_config(128, 64, "bf16", False), A100) is None
    assert "bf16" in (long_128.static_check(_config(64, 32, "bf16"), T4) or "")
    # Shared memory depends on head_dim: 128x128 tiles with 4 stages fit at D=64, not at D=128.
    big = _config(128, 128, "bf16", num_warps=8, num_stages=4)
    assert long_64.static_check(big, H200) is None
    assert "shared memory" in (long_128.static_check(big, H200) or "")
    # Registers: 128x128 fp32 scores plus a 128x128 accumulator on 4 warps spill; on 8 they fit.
    assert "registers" in (long_128.static_check(_config(128, 128, "bf16", num_warps=4), H200) or "")
    assert long_128.static_check(_config(128, 128, "bf16", num_warps=8), H200) is None
    # TMA takes up to 1024 bytes more: 128x128 tiles with 3 stages at D=128 need 229376 bytes.
    tight = DeviceInfo(kind="cuda", name="tight", compute_capability=(9, 0), smem_per_block_bytes=229376 + 512)
    assert long_128.static_check(_config(128, 128, "bf16", False, num_warps=8, num_stages=3), tight) is None
    reason = long_128.static_check(_config(128, 128, "bf16", True, num_warps=8, num_stages=3), tight) or ""
    assert "230400 bytes" in reason and "TMA" in reason
    # BLOCK_N 256 spills when seq_len is not a multiple of it (the masked last key block).
    wide = _config(64, 256, "bf16", num_warps=8, num_stages=2)
    assert long_64.static_check(wide, H200) is None
    uneven = fa.FlashAttention(batch=2, heads=32, seq_len=8000, head_dim=64)
    assert "spill" in (uneven.static_check(wide, H200) or "")
    assert uneven.static_check(_config(64, 128, "bf16", num_warps=8, num_stages=2), H200) is None


@pytest.mark.timeout(120)  # about 20 s: every point of the 96,480-point grid through the rules and two checks
def test_default_space_seeds_and_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    import objectives.flash_attention as fa
    from tuner.study.space import compile_space, load_space_file

    raw = load_space_file(fa.FlashAttention.space_file)
    assert raw["workloads"] == [fa.FlashAttention.name]
    space = compile_space(raw)
    gluon_knobs = {"OVERLAP", "PERSISTENT", "PINGPONG", "CONSUMERS", "ONE_LOOP", "EPILOGUE", "RELEASE_K", "SUM_MMA",
                   "HALF_DIAG", "LPT_HEADS"}
    assert set(space.params) == {*fa.TILE_PARAMS, "precision", "use_tma", "kernel", "SPLIT_M", *gluon_knobs}
    assert len(space.seeds) == len(raw["seeds"]) >= 4  # every seed is a point of the space
    device = H200.to_dict()
    for args in (SMALL, {"batch": 2, "heads": 16, "seq_len": 8192, "head_dim": 128}):
        workload = fa.FlashAttention(**args)
        for seed in space.seeds:
            assert space.static_violation(seed, device) is None, seed
            reason = workload.static_check(seed, H200)
            # bf16 is refused only because this process may run the interpreter; 256-row tiles only on
            # sequences shorter than that.
            assert (
                reason is None
                or (seed["precision"] == "bf16" and "interpreter" in reason)
                or (seed["BLOCK_M"] > args["seq_len"] and "exceeds seq_len" in reason)
            ), (seed, reason)
    # The space's rules take head_dim at 64: for D=64 they say exactly what static_check says about
    # shared memory and registers, and every config static_check accepts at D=128 passes them.
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # as on a GPU (the kernels stay interpreted)
    d64 = fa.FlashAttention(batch=1, heads=1, seq_len=8192, head_dim=64)
    d128 = fa.FlashAttention(batch=1, heads=1, seq_len=8192, head_dim=128)
    grid = space.grid()
    for config in grid:
        by_rules = space.static_violation(config, device) is None
        assert by_rules == (d64.static_check(config, H200) is None), config
        if d128.static_check(config, H200) is None:
            assert by_rules, config
    assert sum(d128.static_check(c, H200) is None for c in grid) < sum(d64.static_check(c, H200) is None for c in grid)


#: Run in a child process without TRITON_INTERPRET (this one interprets the kernels): compiles each
#: seed for sm_90 with kernels.attention.attention.compile_for_target and prints one JSON line per compile, or
#: {"skip": reason} when this Triton cannot compile ahead of time.
_AOT_SCRIPT = """
import json, sys
from kernels.attention.attention import compile_for_target
jobs = json.loads(sys.argv[1])
for job in jobs:
    shape, config = job["shape"], dict(job["config"])
    if config.pop("kernel", "tutorial") != "tutorial":
        continue  # the persistent variants have their own compile test
    try:
        kernel = compile_or_skip(lambda: compile_for_target(*shape, causal=job["causal"], **config, capability=90))
    except Exception as exc:  # a compile error of this config, reported as its line
        print(json.dumps({**job, "error": f"{type(exc).__name__}: {exc}"[:2000]}))
        continue
    ptx = kernel.asm["ptx"]
    print(json.dumps({**job, "shared": kernel.metadata.shared, "wgmma": "wgmma.mma_async" in ptx,
                      "tma": "cp.async.bulk.tensor" in ptx}), flush=True)
"""


@pytest.mark.timeout(90)
def test_seeds_compile_for_sm90_within_the_shared_memory_estimate(aot_child: Any) -> None:
    """Compile every seed for an H200 (sm_90) ahead of time and compare its shared memory with the estimate.

    At D=128 (the largest tiles) causal (two key loops: the most TMA barriers) and at D=64 with a
    ragged seq_len (the masked last key block). The estimate must bound the compiled kernel and be
    tight (the seeds use wgmma with >= 2 stages, where it is exact up to TMA's 1024 bytes); the
    seeds must use Hopper's wgmma, and TMA exactly when they ask for it.
    """
    from objectives.flash_attention import TMA_SHARED_OVERHEAD_BYTES, FlashAttention, smem_estimate_bytes
    from tuner.study.space import compile_space, load_space_file

    seeds = compile_space(load_space_file(FlashAttention.space_file)).seeds
    shapes = (((2, 16, 4096, 128), True), ((2, 16, 1000, 64), False))
    seeds = [seed for seed in seeds if seed["kernel"] == "tutorial"]
    jobs = [{"shape": list(shape), "causal": causal, "config": seed} for shape, causal in shapes for seed in seeds]
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=85)
    assert len(lines) == len(jobs), lines
    for result in lines:
        assert "error" not in result, result
        config, head_dim = result["config"], result["shape"][3]
        estimate = smem_estimate_bytes(
            config["BLOCK_M"], config["BLOCK_N"], config["num_stages"], head_dim, use_tma=config["use_tma"]
        )
        slack = TMA_SHARED_OVERHEAD_BYTES if config["use_tma"] else 0
        assert estimate - slack <= result["shared"] <= estimate, (result, estimate)
        assert result["shared"] <= H200.smem_per_block_bytes, result
        assert result["wgmma"], result
        assert result["tma"] == config["use_tma"], result


@pytest.mark.timeout(10)
def test_args_are_validated_naming_the_arg() -> None:
    from objectives.flash_attention import FlashAttention

    for arg, value in (("batch", 0), ("heads", -1), ("seq_len", "80"), ("head_dim", 96), ("head_dim", True)):
        with pytest.raises(ValueError, match=rf"^{arg} "):
            FlashAttention(**{**SMALL, arg: value})
    with pytest.raises(ValueError, match=r"^causal "):
        FlashAttention(**SMALL, causal=1)
    with pytest.raises(ValueError, match=r"^seed "):
        FlashAttention(**SMALL, seed=1.5)
    with pytest.raises(ValueError, match="seq_len"):
        FlashAttention(batch=1024, heads=128, seq_len=65536, head_dim=128)


@pytest.mark.timeout(10)
def test_exports() -> None:
    from objectives.flash_attention import FlashAttention

    workload = FlashAttention(**SMALL, causal=True)
    config = _config(128, 64, "bf16", True, num_stages=3)
    exported = workload.export_config(config)
    assert exported == {
        "kwargs": {"BLOCK_M": 128, "BLOCK_N": 64},
        "num_warps": 4,
        "num_stages": 3,
        "precision": "bf16",
        "use_tma": True,
        "kernel": "tutorial",
        "function": "kernels.attention.attention.attention",
    }
    json.dumps(exported)
    source = workload.export_python(config)
    compile(source, "<export>", "exec")
    namespace: dict = {}
    source = source.replace("from kernels.attention.attention import attention\n", "")
    exec(compile(source, "<export>", "exec"), namespace)
    assert namespace["ATTENTION_CONFIG"] == {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3,
                                             "use_tma": True}  # fmt: skip
    assert workload.export_env(config)["USE_TMA"] == "1"  # booleans as shell flags


@pytest.mark.timeout(30)
def test_spec_with_bf16_only_space() -> None:
    from tuner.study.spec import load_spec
    from tuner.workloads.registry import workload_class

    assert workload_class("flash_attention").__name__ == "FlashAttention"
    compiled = load_spec(
        {
            "name": "attention-smoke",
            "workload": "flash_attention",
            "args": {**SMALL, "causal": True},
            "space": {"precision": {"choices": ["bf16"]}},
            "objectives": [{"metric": "tflops"}],
            "budget": {"trials": 4},
        }
    )
    assert compiled.space.params["precision"].values() == ["bf16"]
    assert compiled.space.seeds and all(s["precision"] == "bf16" for s in compiled.space.seeds)
    assert compiled.objectives == [("tflops", "maximize")]


# --------------------------------------------------------------------------- the workload, end to end


@pytest.mark.timeout(120)
@pytest.mark.parametrize("use_tma", [False, True], ids=["pointers", "tma"])
def test_run_on_cpu_returns_ok_with_all_metrics(interpreter: None, use_tma: bool) -> None:
    from objectives.flash_attention import TOLERANCE_VS_FP32, FlashAttention

    workload = FlashAttention(**SMALL, causal=True, seed=3)
    config = _config(32, 16, "fp16", use_tma)
    workload.prepare(config, CPU)  # a no-op on CPU
    result = workload.run(config, CPU, TrialContext(trial_number=0))
    assert result.status == TrialStatus.OK, result.error
    assert set(result.metrics) == {m.name for m in FlashAttention.metrics}
    assert all(math.isfinite(value) for value in result.metrics.values())
    assert result.metrics["tflops"] > 0 and result.metrics["latency_ms"] > 0
    assert 0 < result.metrics["max_rel_error"] <= TOLERANCE_VS_FP32["fp16"]
    assert result.timing_comparable is False
    assert len(result.samples_ms) == 3 and all(s > 0 for s in result.samples_ms)
    assert result.extra["timing"]["median_ms"] == result.metrics["latency_ms"]
    expected_tflops = workload.flops / (result.metrics["latency_ms"] * 1e-3) / 1e12
    assert result.metrics["tflops"] == pytest.approx(expected_tflops)
    # A second trial of the same precision reuses the cached inputs and reference.
    cached = workload._cases[("fp16", "cpu")]
    assert workload.run(_config(64, 32, "fp16", use_tma), CPU, TrialContext(trial_number=1)).ok
    assert workload._cases[("fp16", "cpu")] is cached


@pytest.mark.timeout(30)
def test_run_refuses_infeasible_configs_without_computing() -> None:
    from objectives.flash_attention import FlashAttention

    workload = FlashAttention(**SMALL)
    for config in (_config(32, 32, "bf16"), _config(256, 32)):
        result = workload.run(config, CPU, TrialContext())
        assert result.status == TrialStatus.INFEASIBLE_STATIC and result.error
    assert not workload._cases


@pytest.mark.timeout(60)
def test_wrong_results_are_numerics_fail(interpreter: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from objectives.flash_attention import FlashAttention

    config = _config(32, 32)

    def writes_nothing(self, config, case):
        return None

    def zeros(self, config, case):
        case.out.zero_()

    def non_causal(self, config, case):
        # The kernel run without the mask the workload asked for.
        from kernels.attention.attention import attention

        attention(case.q, case.k, case.v, causal=False, out=case.out, **self._tile(config))

    expected = {writes_nothing: "NaN", zeros: "exceeds", non_causal: "exceeds"}
    for fake, message in expected.items():
        monkeypatch.setattr(FlashAttention, "_launch", fake)
        result = FlashAttention(**SMALL, causal=True).run(config, CPU, TrialContext())
        assert result.status == TrialStatus.NUMERICS_FAIL, fake.__name__
        assert message in (result.error or ""), result.error
        assert "max_rel_error" in result.metrics and not result.samples_ms
    monkeypatch.undo()
    assert FlashAttention(**SMALL, causal=True).run(config, CPU, TrialContext()).ok


@pytest.mark.timeout(30)
def test_compile_failures_become_statuses(monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime.errors import OutOfResources

    import kernels.attention.attention
    import objectives.flash_attention as fa

    class CompilationError(Exception):  # matched by name, like triton.compiler.errors.CompilationError
        pass

    config = _config(32, 32)

    def raise_oor(*args, **kwargs):
        raise OutOfResources(245760, 232448, "shared memory")

    def raise_compile(*args, **kwargs):
        raise CompilationError("at 12:8: unsupported layout")

    for fake, status in ((raise_oor, TrialStatus.OUT_OF_RESOURCES), (raise_compile, TrialStatus.COMPILE_ERROR)):
        monkeypatch.setattr(kernels.attention.attention, "attention", fake)
        result = fa.FlashAttention(**SMALL).run(config, CPU, TrialContext())
        assert result.status == status and result.error

    # prepare() on a GPU keeps the failure, and run() reports it without compiling again.
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # as on a GPU (the kernels stay interpreted)
    monkeypatch.setattr(kernels.attention.attention, "compile_only", raise_oor)
    workload = fa.FlashAttention(batch=2, heads=16, seq_len=8192, head_dim=128)
    gpu_config = _config(128, 64, "bf16", True, num_stages=3)
    workload.prepare(gpu_config, H200)  # must not raise
    result = workload.run(gpu_config, H200, TrialContext())
    assert result.status == TrialStatus.OUT_OF_RESOURCES and "shared memory" in (result.error or "")
    assert result.timing_comparable is True
    assert not workload._cases  # nothing was allocated


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 4, 1024, 64), (1, 3, 1000, 128)], ids=_shape_id)
def test_gpu_numerics_against_sdpa(shape: tuple[int, int, int, int], causal: bool, precision: str) -> None:
    import torch

    from kernels.attention import attention as attn
    from kernels.gemm.gemm import max_rel_error
    from objectives.flash_attention import TOLERANCE_VS_FP32

    masters = attn.make_masters(*shape, "cuda", seed=4)
    q, k, v = attn.quantize(masters, precision)
    ref = attn.reference_attention(*masters, causal)
    operand_ref = attn.reference_attention(q, k, v, causal)
    use_tma_choices = (False, True) if torch.cuda.get_device_capability() >= (9, 0) else (False,)
    for use_tma in use_tma_choices:
        for block_m, block_n, warps, stages in ((128, 64, 4, 3), (64, 32, 4, 2), (128, 128, 8, 2), (64, 128, 4, 2)):
            out = torch.full_like(q, float("nan"))
            attn.attention(
                q, k, v, causal=causal, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages,
                use_tma=use_tma, out=out,
            )  # fmt: skip
            torch.cuda.synchronize()
            tile = (block_m, block_n, warps, stages, use_tma)
            assert torch.isfinite(out).all(), tile
            assert max_rel_error(out, ref) <= TOLERANCE_VS_FP32[precision], tile
            assert max_rel_error(out, operand_ref) <= {"bf16": 1.5e-2, "fp16": 2e-3}[precision], tile


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("use_tma", [False, True], ids=["pointers", "tma"])
def test_gpu_workload_prepare_then_run(use_tma: bool) -> None:
    from objectives.flash_attention import FlashAttention
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    workload = FlashAttention(batch=2, heads=16, seq_len=2048, head_dim=128, causal=True)
    config = _config(128, 64, "bf16", use_tma, num_warps=4, num_stages=3)
    if workload.static_check(config, device):
        pytest.skip(workload.static_check(config, device))
    workload.prepare(config, device)
    assert not workload._prepare_failures, workload._prepare_failures
    result = workload.run(config, device, TrialContext())
    assert result.status == TrialStatus.OK, result.error
    assert result.timing_comparable and len(result.samples_ms) >= 10
    assert result.metrics["tflops"] > 50  # an H200 runs this shape at hundreds of TFLOP/s
    assert 0 < result.metrics["max_rel_error"] < 3e-2
