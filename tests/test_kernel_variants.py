"""The Hopper kernel variants: persistent TMA GEMM (``kernels/gemm/gemm_tma.py``) and persistent attention
(``kernels/attention/attention_persistent.py``), selected by the ``kernel`` knob of ``triton_gemm`` /
``flash_attention``.

On the CPU the kernels run under the Triton interpreter (numerics at small ragged shapes, through the
workloads' trial), compile ahead of time for sm_90 in a child process (shared memory against the space's
rule, wgmma and TMA in the PTX), and their static checks and exports are checked. GPU tests check numerics
at two shapes each, ragged edges included.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import compiled_gpu

from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus

CPU = DeviceInfo(kind="cpu", name="cpu")
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
A100 = DeviceInfo(kind="cuda", name="NVIDIA A100", compute_capability=(8, 0), smem_per_block_bytes=166912, sm_count=108)


def _gemm(kernel: str, precision: str, subtile: bool, tile: tuple[int, int, int] = (32, 32, 32), **extra: Any) -> dict:
    block_m, block_n, block_k = tile
    config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": 2, "num_warps": 4,
              "num_stages": 2, "precision": precision, "pad_k": False, "kernel": kernel}  # fmt: skip
    if kernel != "tutorial":
        config["EPILOGUE_SUBTILE"] = subtile
        if precision == "fp8":
            config["FP8_FAST_ACCUM"] = extra.get("fast", True)
    return {**config, **{k: v for k, v in extra.items() if k != "fast"}}


def _attention(kernel: str, precision: str, split_m: bool, block_m: int = 32, block_n: int = 16, **extra: Any) -> dict:
    tile = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": extra.get("num_warps", 4)}
    return {**tile, "num_stages": extra.get("num_stages", 2), "precision": precision, "kernel": kernel,
            "SPLIT_M": split_m}  # fmt: skip


# --------------------------------------------------------------------------- numerics under the interpreter


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kernel", ["persistent_tma", "persistent_tma_ws"])
@pytest.mark.parametrize("precision", ["fp16", "fp8"])
@pytest.mark.parametrize("shape", [(48, 80, 64), (33, 40, 96)], ids=lambda s: "x".join(map(str, s)))
def test_persistent_gemm_trial_is_ok_on_ragged_shapes(
    interpreter: None, kernel: str, precision: str, shape: tuple[int, int, int]
) -> None:
    """M and N not multiples of the tiles (TMA clips the edges); more tiles than programs (persistence);
    with STREAM_K at 33x40x96 the fourth tile of three programs is split by K over all three."""
    from objectives.triton_gemm import TritonGemm

    m, n, k = shape
    workload = TritonGemm(m=m, n=n, k=k, seed=3)
    for subtile, stream_k in ((False, False), (True, True)):
        config = _gemm(kernel, precision, subtile, STREAM_K=stream_k)
        result = workload.run(config, CPU, TrialContext(trial_number=1))
        assert result.status is TrialStatus.OK, result.error
        assert result.metrics["max_rel_error"] < (0.05 if precision == "fp8" else 2e-3), result.metrics
        assert result.extra["operand_rel_error"] < (0.02 if precision == "fp8" else 5e-3), result.extra


@pytest.mark.timeout(120)
def test_stream_k_tail_sums_the_partials_of_every_program_sharing_a_tile(interpreter: None) -> None:
    """4 programs, 6 tiles of 32x32, 7 K iterations each: 4 tiles in the full wave, then 14 iterations in
    shares of 4. Tile 4 is owned by rank 0 with rank 1's partial; tile 5 by rank 1 (its second segment)
    with the partials of ranks 2 and 3. A missing or doubled partial is off by a whole segment's sum."""
    import torch

    from kernels.gemm.gemm_tma import matmul_persistent, stream_k_buffers

    gen = torch.Generator().manual_seed(7)
    a = torch.randn(80, 224, generator=gen).half()
    b = torch.randn(224, 48, generator=gen).half()
    tile = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
    expected = a.float() @ b.float()
    out = matmul_persistent(a, b, precision="fp16", num_sms=4, stream_k=True, **tile)
    assert (out.float() - expected).abs().max() / expected.abs().max() < 2e-3
    _, flags = stream_k_buffers(a.device, 4, 32, 32)
    assert flags.tolist() == [0, 0, 0, 0], "every published partial's flag is consumed (and reset) by its owner"
    again = matmul_persistent(a, b, precision="fp16", num_sms=4, stream_k=True, **tile)
    assert torch.equal(again, out), "a second launch finds the flags reset and gives the same result"


@pytest.mark.timeout(60)
def test_persistent_gemm_refuses_unaligned_rows_and_tutorial_only_precisions() -> None:
    from objectives.triton_gemm import TritonGemm

    unaligned = TritonGemm(m=64, n=64, k=8191)
    reason = unaligned.static_check(_gemm("persistent_tma", "fp16", False), H200)
    assert reason is not None and "16-byte" in reason
    assert unaligned.static_check(_gemm("persistent_tma", "fp16", False, pad_k=True), H200) is None
    aligned = TritonGemm(m=64, n=64, k=64)
    assert "precision" in (aligned.static_check(_gemm("persistent_tma", "fp32", False), H200) or "")
    assert "compute capability" in (aligned.static_check(_gemm("persistent_tma_ws", "fp16", False), A100) or "")
    assert "kernel" in (aligned.static_check(_gemm("cublas", "fp16", False), H200) or "")
    assert "EPILOGUE_SUBTILE" in (aligned.static_check(_gemm("persistent_tma", "fp16", "yes"), H200) or "")
    assert "STREAM_K" in (aligned.static_check(_gemm("persistent_tma", "fp16", False, STREAM_K=1), H200) or "")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_persistent_attention_trial_is_ok_on_a_ragged_sequence(interpreter: None, causal: bool) -> None:
    """seq_len 80: query rows and key blocks past the end of a head (masks, not the next head's rows)."""
    from objectives.flash_attention import FlashAttention

    workload = FlashAttention(batch=1, heads=2, seq_len=80, head_dim=64, causal=causal, seed=2)
    for kernel, split_m, block_n in (("persistent_tma", False, 16), ("persistent_tma_ws", True, 32)):
        result = workload.run(_attention(kernel, "fp16", split_m, block_n=block_n), CPU, TrialContext(trial_number=1))
        assert result.status is TrialStatus.OK, result.error
        assert result.metrics["max_rel_error"] < 2e-3, result.metrics


@pytest.mark.timeout(120)
def test_persistent_attention_stores_the_log_sum_exp_the_backward_reads(interpreter: None) -> None:
    import torch

    from kernels.attention.attention import LOG2E, make_masters, quantize
    from kernels.attention.attention_persistent import attention_persistent

    q, k, v = quantize(make_masters(1, 2, 48, 64, "cpu", 5), "fp16")
    lse = torch.empty(1, 2, 48)
    attention_persistent(q, k, v, causal=True, BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=2, num_sms=2,
                         split_m=True, lse=lse)  # fmt: skip
    scores = q.float() @ k.float().transpose(-1, -2) / 8.0
    scores = scores.masked_fill(torch.ones(48, 48, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.logsumexp(scores, dim=-1) * LOG2E
    assert torch.allclose(lse, expected, atol=2e-3), (lse - expected).abs().max()


@pytest.mark.timeout(60)
def test_persistent_attention_static_checks() -> None:
    from objectives.flash_attention import FlashAttention

    workload = FlashAttention(batch=1, heads=2, seq_len=1024, head_dim=128)
    assert workload.static_check(_attention("persistent_tma", "fp16", True, 128, 64), H200) is None
    assert "compute capability" in (workload.static_check(_attention("persistent_tma", "fp16", False, 128, 64), A100)
                                    or "")  # fmt: skip
    assert "use_tma" in (workload.static_check({**_attention("persistent_tma", "fp16", False, 128, 64),
                                                "use_tma": True}, H200) or "")  # fmt: skip
    assert "SPLIT_M" in (workload.static_check(_attention("persistent_tma", "fp16", True, 16, 64), H200) or "")
    assert "shared memory" in (workload.static_check(_attention("persistent_tma", "fp16", False, 256, 256,
                                                                num_warps=16, num_stages=4), H200) or "")  # fmt: skip


# --------------------------------------------------------------------------- exports


@pytest.mark.timeout(30)
def test_gemm_python_export_of_a_persistent_variant_names_its_function_and_runs() -> None:
    from objectives.triton_gemm import TritonGemm

    config = _gemm("persistent_tma_ws", "fp8", True, (128, 256, 128), fast=False, STREAM_K=True)
    workload = TritonGemm(m=8192, n=8192, k=8192)
    exported = workload.export_config(config)
    assert exported["function"] == "kernels.gemm.gemm_tma.matmul_persistent"
    assert exported["kernel"] == "persistent_tma_ws"
    assert exported["kwargs"]["WARP_SPECIALIZE"] is True and exported["kwargs"]["FP8_FAST_ACCUM"] is False
    source = workload.export_python(config)
    assert "kernels.gemm.gemm_tma.matmul_persistent" in source
    namespace: dict = {}
    exec(compile(source, "<export>", "exec"), namespace)
    assert namespace["GEMM_CONFIG"] == {
        "precision": "fp8", "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 2, "num_warps": 4,
        "num_stages": 2, "epilogue_subtile": True, "warp_specialize": True, "fp8_fast_accum": False,
        "stream_k": True,
    }  # fmt: skip
    assert callable(namespace["matmul_persistent"])
    json.dumps(exported)


@pytest.mark.timeout(30)
def test_attention_python_export_of_the_persistent_variant_runs() -> None:
    from objectives.flash_attention import FlashAttention

    workload = FlashAttention(batch=2, heads=4, seq_len=1024, head_dim=64, causal=True)
    config = _attention("persistent_tma_ws", "bf16", True, 128, 64)
    source = workload.export_python(config)
    assert "from kernels.attention.attention_persistent import attention_persistent" in source
    namespace: dict = {}
    exec(compile(source, "<export>", "exec"), namespace)
    assert namespace["ATTENTION_CONFIG"]["split_m"] is True and namespace["ATTENTION_CONFIG"]["warp_specialize"]
    assert "num_sms=" in source


# --------------------------------------------------------------------------- ahead-of-time sm_90 compiles

#: Child process (kernels compile, not interpret): each job compiles one config for sm_90 and prints its
#: shared memory and whether the PTX has wgmma and TMA copies.
_AOT_SCRIPT = """
import json, sys
jobs = json.loads(sys.argv[1])
for job in jobs:
    if job["family"] == "gemm":
        from kernels.gemm.gemm_tma import compile_for_target
    else:
        from kernels.attention.attention_persistent import compile_for_target
    kernel = compile_or_skip(lambda: compile_for_target(*job["shape"], **job["config"], capability=90))
    ptx = kernel.asm["ptx"]
    print(json.dumps({**job, "shared": kernel.metadata.shared, "wgmma": "wgmma.mma_async" in ptx,
                      "tma": "cp.async.bulk.tensor" in ptx}), flush=True)
"""


def _gemm_kwargs(seed: dict[str, Any]) -> dict[str, Any]:
    return {
        "precision": seed["precision"],
        **{p: seed[p] for p in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")},
        "num_sms": 132,
        "epilogue_subtile": seed["EPILOGUE_SUBTILE"],
        "warp_specialize": seed["kernel"] == "persistent_tma_ws",
        "fp8_fast_accum": seed.get("FP8_FAST_ACCUM", True),
        "stream_k": seed.get("STREAM_K", False),
    }


@pytest.mark.timeout(180)
def test_persistent_seeds_compile_for_sm90_within_the_shared_memory_rule(aot_child: Any) -> None:
    """The GEMM space's persistent seeds and a few attention tiles: wgmma + TMA, shared memory within the
    rule's estimate (and the estimate tight: at most 1024 bytes of barriers and alignment above the tiles)."""
    from objectives.flash_attention import smem_estimate_bytes
    from tuner.study.space import compile_space, load_space_file

    space = compile_space(load_space_file("gemm.yaml"))
    seeds = [s for s in space.seeds if s["kernel"] != "tutorial"]
    assert seeds, "the GEMM space has persistent seeds"
    jobs: list[dict[str, Any]] = [
        {"family": "gemm", "shape": [8192, 8192, 8192], "config": _gemm_kwargs(s), "seed": s} for s in seeds
    ]
    if not any(s.get("STREAM_K") for s in seeds):  # the stream-K tail compiles too (wgmma + TMA in both loops)
        streamed = {**seeds[0], "STREAM_K": True}
        jobs.append({"family": "gemm", "shape": [8192, 4096, 4096], "config": _gemm_kwargs(streamed), "seed": streamed})
    for split_m, warps in ((False, 4), (True, 8)):
        config = {"precision": "bf16", "BLOCK_M": 128 * (1 + split_m), "BLOCK_N": 64, "num_warps": warps,
                  "num_stages": 2, "split_m": split_m, "warp_specialize": False}  # fmt: skip
        jobs.append({"family": "attention", "shape": [4, 16, 4096, 128], "config": {**config, "causal": True}})
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=170)
    assert len(lines) == len(jobs), lines
    for result in lines:
        assert result["wgmma"] and result["tma"], result
        assert result["shared"] <= H200.smem_per_block_bytes, result
        if result["family"] == "gemm":
            seed = result["seed"]
            violation = space.static_violation(seed, {**H200.to_dict(), "smem_per_block_bytes": result["shared"]})
            assert violation is not None, ("the rule must not undercount", result)  # rule adds 1024 of slack
            assert space.static_violation(seed, H200.to_dict()) is None, result
        else:
            config = result["config"]
            estimate = smem_estimate_bytes(config["BLOCK_M"], config["BLOCK_N"], config["num_stages"], 128,
                                           use_tma=True)  # fmt: skip
            assert estimate - 1024 <= result["shared"] <= estimate, (result, estimate)


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp8"])
@pytest.mark.parametrize(
    "shape", [(1000, 1032, 528), (4096, 4096, 4096), (2000, 3000, 1008)], ids=lambda s: "x".join(map(str, s))
)
def test_gpu_persistent_gemm_numerics(precision: str, shape: tuple[int, int, int]) -> None:
    """With STREAM_K, 4096^3 (512 tiles) leaves 116 tiles to share out; 2000x3000x1008 (192 tiles, ragged M, N
    and K) 60 tiles of 16 K iterations, each split between two programs."""
    from objectives.triton_gemm import TritonGemm
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    m, n, k = shape
    workload = TritonGemm(m=m, n=n, k=k, seed=4)
    block_k = 128 if precision == "fp8" else 64
    for kernel in ("persistent_tma", "persistent_tma_ws"):
        for stream_k in (False, True):
            config = {**_gemm(kernel, precision, True, (128, 256, block_k), STREAM_K=stream_k), "num_warps": 8,
                      "num_stages": 3}  # fmt: skip
            result = workload.run(config, device, TrialContext(trial_number=1))
            assert result.status is TrialStatus.OK, (config, result.error)


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 3, 1000, 128), (2, 4, 2048, 64)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_persistent_attention_numerics(shape: tuple[int, int, int, int], causal: bool) -> None:
    from objectives.flash_attention import FlashAttention
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    batch, heads, seq_len, head_dim = shape
    workload = FlashAttention(batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim, causal=causal)
    for kernel, split_m, block_m in (("persistent_tma", False, 128), ("persistent_tma_ws", True, 256)):
        config = _attention(kernel, "bf16", split_m, block_m, 64, num_warps=8, num_stages=2)
        result = workload.run(config, device, TrialContext(trial_number=1))
        assert result.status is TrialStatus.OK, (config, result.error)
