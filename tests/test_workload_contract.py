"""The workload contract (``tuner.workloads.contract.WorkloadContract``) applied to every registered workload.

Each case gives small CPU args, args that must be refused, one config per precision the interpreter computes
correctly and one statically infeasible config; the suite's checks are in the contract module's docstring.
"""

from __future__ import annotations

import pytest

from tuner.workloads.contract import ContractCase, WorkloadContract, require_interpreter
from tuner.workloads.registry import workload_names

GEMM_TILE = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 2}
QUANT_TILE = {"precision": "fp16", "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}
NORM_TILE = {"BLOCK": 512, "ROWS_PER_PROGRAM": 4, "num_warps": 4, "num_stages": 1}
TRAIN = {"checkpoint": 0, "compile": "off", "attention": "sdpa", "optimizer": "adamw_foreach"}
CASES = [
    ContractCase(
        "axpy",  # the README's example of a new workload
        {"n": 1000, "alpha": 1.5},
        {"n": 0, "alpha": "x", "seed": 1.5},
        [{"BLOCK": 256, "num_warps": 4, "precision": p} for p in ("fp32", "fp16", "bf16")],
        {"BLOCK": 384, "num_warps": 4, "precision": "fp32"},
        seed_args={"n": 1 << 24},
    ),
    ContractCase(
        "triton_gemm",
        {"m": 48, "n": 40, "k": 64},
        {"m": 0, "k": -3, "seed": "x"},
        [{**GEMM_TILE, "precision": p} for p in ("fp32", "tf32", "fp16", "fp8")]
        + [  # the persistent TMA variants
            {**GEMM_TILE, "precision": "fp16", "kernel": "persistent_tma", "EPILOGUE_SUBTILE": True},
            {**GEMM_TILE, "precision": "fp8", "kernel": "persistent_tma_ws", "EPILOGUE_SUBTILE": False,
             "FP8_FAST_ACCUM": False},
        ],
        {**GEMM_TILE, "BLOCK_M": 24, "precision": "fp16"},
    ),
    ContractCase(
        "flash_attention",
        {"batch": 1, "heads": 2, "seq_len": 80, "head_dim": 64, "causal": True},
        {"batch": 0, "head_dim": 96, "seq_len": -1},
        [
            {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2, "precision": "fp16", "use_tma": False},
            {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2, "precision": "fp16",
             "kernel": "persistent_tma_ws", "SPLIT_M": True},
        ],
        {"BLOCK_M": 48, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "precision": "fp16", "use_tma": False},
        seed_args={"batch": 4, "heads": 16, "seq_len": 4096, "head_dim": 128},
    ),
    ContractCase(
        "quant_gemm",
        {"m": 20, "n": 48, "k": 256},
        {"m": 0, "k": 100},
        [
            {**QUANT_TILE, "bits": 4, "group_size": 128, "SPLIT_K": 1},
            {**QUANT_TILE, "bits": 8, "group_size": 32, "SPLIT_K": 2},
            # the packed variant: tensor-core tiles, split-K reduced in the kernel
            {"kernel": "packed", "precision": "fp16", "bits": 4, "group_size": 64, "BLOCK_M": 16, "BLOCK_N": 32,
             "SPLIT_K": 2, "num_warps": 4, "num_stages": 1, "PREFETCH": 1},
        ],
        {**QUANT_TILE, "bits": 4, "group_size": 128, "SPLIT_K": 1, "BLOCK_K": 16},
        seed_args={"m": 16, "n": 8192, "k": 8192},
    ),
    *(
        ContractCase(
            name,
            {"rows": 37, "cols": 300, "seed": 3},
            {"rows": 0, "cols": -5},
            [{**NORM_TILE, "precision": p} for p in ("fp32", "fp16", "bf16")],
            {**NORM_TILE, "BLOCK": 384, "precision": "bf16"},
            seed_args={"rows": 8192, "cols": 8192},
        )
        for name in ("rmsnorm", "softmax")
    ),
    ContractCase(
        "train_step",
        {"model": "tiny", "global_batch": 4, "steps": 2, "warmup_steps": 1},
        {"global_batch": 0, "steps": 0, "model": "huge"},
        [{**TRAIN, "micro_batch": 2, "precision": p} for p in ("fp32", "bf16", "fp16")],  # torch autocast on CPU
        {**TRAIN, "micro_batch": 2, "precision": "fp32", "attention": "triton"},  # the Triton kernel has no backward
        seed_args={"model": "1b", "global_batch": 8},
    ),
    ContractCase(
        "decode_step",
        {"model": "tiny", "prompt_len": 8, "gen_tokens": 4, "batch": 2},
        {"model": "nope", "prompt_len": 0, "gen_tokens": 40, "batch": 0},
        [
            {"weight_bits": 16, "kv_dtype": "bf16", "attention": "sdpa", "cuda_graphs": False},
            {"weight_bits": 8, "group_size": 32, "kv_dtype": "fp8_e4m3", "attention": "math", "cuda_graphs": False},
            {"weight_bits": 4, "group_size": 64, "kv_dtype": "bf16", "attention": "sdpa", "cuda_graphs": False},
        ],
        {"weight_bits": 16, "kv_dtype": "bf16", "attention": "sdpa", "cuda_graphs": True},  # no CUDA graphs on a CPU
        seed_args={"model": "1b", "prompt_len": 512, "gen_tokens": 32},
    ),
    ContractCase(
        "collective",  # one rank in this process (a one-rank gloo group); gangs: tests/test_gang.py
        {"op": "all_reduce", "size_bytes": 4096, "dtype": "fp32", "world_size": 1, "iters": 3, "warmup_iters": 1},
        {"op": "broadcast", "size_bytes": 0, "dtype": "int8", "world_size": 0},
        [
            {"NCCL_ALGO": "default", "NCCL_PROTO": "default"},
            {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128", "NCCL_MIN_NCHANNELS": 2, "NCCL_MAX_NCHANNELS": 8},
        ],
        {"NCCL_ALGO": "NVLS", "NCCL_PROTO": "Simple"},  # NVLink multicast stays off
        seed_args={"op": "all_reduce", "size_bytes": 2**30, "dtype": "bf16", "world_size": 2},
    ),
    ContractCase(
        "ddp_step",
        {"model": "tiny", "world_size": 1, "steps": 2, "warmup_steps": 1},
        {"model": "huge", "batch_per_rank": 0, "world_size": 0, "precision": "fp8"},
        [
            {"bucket_cap_mb": 1, "gradient_as_bucket_view": False, "static_graph": False, "comm_hook": "none"},
            {"bucket_cap_mb": 25, "gradient_as_bucket_view": True, "static_graph": True, "comm_hook": "fp16"},
        ],
        {"bucket_cap_mb": 25, "gradient_as_bucket_view": True, "static_graph": True, "comm_hook": "bf16"},  # gloo
        seed_args={"model": "125m", "world_size": 2, "batch_per_rank": 8},
    ),
]
KERNEL_WORKLOADS = {case.workload for case in CASES}


def test_every_registered_kernel_workload_is_in_the_suite() -> None:
    """A new workload in the registry must join the suite (noop and replay have suites of their own).
    The whole-step workloads (train_step, decode_step) keep the same contract with a step as the kernel."""
    assert set(workload_names()) - {"noop", "replay"} == KERNEL_WORKLOADS


@pytest.fixture(params=CASES, ids=[case.workload for case in CASES])
def case(request: pytest.FixtureRequest) -> ContractCase:
    return request.param


class TestWorkloadContract(WorkloadContract):
    """Every check of the contract, once per registered workload."""

    def require_interpreter(self) -> None:
        from kernels.gemm.gemm import matmul_kernel

        require_interpreter(matmul_kernel)
