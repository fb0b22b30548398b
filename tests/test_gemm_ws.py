"""The Gluon ping-pong GEMM (``kernels/gemm/gemm_ws.py``): its static rules on the CPU, an ahead-of-time sm_90 compile
(wgmma, TMA loads and stores, the partitions' register budgets, shared memory against the rule), and numerics
on a GPU with several tiles per program, so both consumers take turns over the ring (the case that once read a
stage two phases early)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import compiled_gpu


def test_check_config_names_what_the_kernel_refuses() -> None:
    from kernels.gemm.gemm_ws import check_config, shared_memory_bytes

    assert check_config("bf16", 128, 128, 64, 4, 240) is None
    assert "precision" in (check_config("fp8", 128, 128, 64, 4, 240) or "")
    assert "BLOCK_N" in (check_config("bf16", 128, 96, 64, 4, 240) or "")
    assert "registers" in (check_config("fp16", 128, 256, 64, 3, 240) or "")  # 256 fp32 accumulators a thread
    assert "shared memory" in (check_config("bf16", 128, 128, 64, 6, 240) or "")
    assert shared_memory_bytes(128, 128, 64, 5) <= 227 * 1024 < shared_memory_bytes(128, 128, 64, 6)


_AOT_SCRIPT = """
import json, re, sys
from kernels.gemm import gemm_ws
if not gemm_ws.available():
    print(json.dumps({"skip": "this Triton has no Gluon Hopper API"}))
    sys.exit(0)
for job in json.loads(sys.argv[1]):
    kernel = compile_or_skip(
        lambda: gemm_ws.compile_for_target(8192, 4096, 4096, precision=job["precision"], **job["knobs"]))
    ptx = kernel.asm["ptx"]
    budgets = re.findall(r"setmaxnreg\\.\\w+\\.sync\\.aligned\\.u32\\s+(\\d+)", ptx)
    print(json.dumps({**job, "shared": kernel.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                      "tma_load": "cp.async.bulk.tensor.2d.shared" in ptx,
                      "tma_store": "cp.async.bulk.tensor.2d.global" in ptx,
                      "setmaxnreg": sorted(set(int(n) for n in budgets))}), flush=True)
"""


@pytest.mark.timeout(240)
def test_kernel_compiles_for_sm90_with_wgmma_tma_and_partition_registers(aot_child: Any) -> None:
    from kernels.gemm.gemm_ws import shared_memory_bytes

    jobs = [
        {"precision": "bf16", "knobs": {}},
        {"precision": "fp16", "knobs": {"NUM_STAGES": 5, "GROUP_M": 16}},
        {"precision": "bf16", "knobs": {"BLOCK_M": 64, "BLOCK_N": 256}},
    ]
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=230)
    assert len(lines) == len(jobs), lines
    for result in lines:
        assert result["wgmma"] > 0 and result["tma_load"] and result["tma_store"], result
        assert {24, 240} <= set(result["setmaxnreg"]), result  # the loader's budget and the consumers'
        knobs = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "NUM_STAGES": 4, **result["knobs"]}
        knobs.pop("GROUP_M", None)
        estimate = shared_memory_bytes(**knobs)
        assert estimate - 1024 <= result["shared"] <= estimate, (result, estimate)


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_gpu_pingpong_numerics_with_many_tiles_per_program(precision: str) -> None:
    """Ragged M, N and K; 1, 3 and 7 programs (each consumer takes several tiles in turn), and a full grid."""
    import torch

    from kernels.gemm.gemm_ws import DTYPES, matmul_pingpong

    dtype = DTYPES[precision]
    gen = torch.Generator(device="cuda").manual_seed(3)
    for (m, n, k), programs, knobs in (
        ((256, 256, 256), 1, {}),
        ((1000, 1032, 528), 3, {"NUM_STAGES": 5}),
        ((2000, 3000, 1008), 7, {"BLOCK_M": 64, "BLOCK_N": 256, "GROUP_M": 4}),
        ((4096, 4096, 4096), None, {}),
    ):
        a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        b = torch.randn(k, n, device="cuda", generator=gen).to(dtype)
        out = matmul_pingpong(a, b, num_sms=programs, **knobs)
        torch.cuda.synchronize()
        reference = a.float() @ b.float()
        error = ((out.float() - reference).abs().max() / reference.abs().max()).item()
        assert error < (1e-2 if precision == "bf16" else 2e-3), ((m, n, k), programs, knobs, error)
