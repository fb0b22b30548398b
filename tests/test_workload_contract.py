"""The contract every kernel workload keeps (tuner/workloads/base.py), checked the same way for each of them.

On the CPU under the Triton interpreter, with small shapes: args validated naming the
arg; the default space compiles and its seeds pass static_check on an H200; statically
infeasible configs never launch; every precision the interpreter computes correctly runs
OK with all declared metrics; a kernel that writes nothing is ``numerics_fail``; Triton's
compile failures become statuses; ``static_check`` needs neither torch nor triton; the
exports are usable; ``work`` gives a roofline position.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from tuner.study.space import compile_space
from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus, Workload
from tuner.workloads.registry import workload_class, workload_names

CPU = DeviceInfo()
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
ROOFLINE_PRECISIONS = {"fp32", "tf32", "bf16", "fp16", "fp8"}


@dataclass
class Case:
    """One kernel workload in the contract suite: small CPU args and the configs to try."""

    workload: str
    args: dict[str, Any]
    bad_args: dict[str, Any]  # arg -> a value that must be refused, naming the arg
    ok_configs: list[dict[str, Any]]  # one per precision the interpreter computes correctly
    infeasible: dict[str, Any]  # statically infeasible
    seed_args: dict[str, Any] = field(default_factory=dict)  # a real shape for the seeds (default: args)


GEMM_TILE = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 2}
QUANT_TILE = {"precision": "fp16", "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}
NORM_TILE = {"BLOCK": 512, "ROWS_PER_PROGRAM": 4, "num_warps": 4, "num_stages": 1}
TRAIN = {"checkpoint": 0, "compile": "off", "attention": "sdpa", "optimizer": "adamw_foreach"}
CASES = [
    Case(
        "axpy",  # the README's example of a new workload
        {"n": 1000, "alpha": 1.5},
        {"n": 0, "alpha": "x", "seed": 1.5},
        [{"BLOCK": 256, "num_warps": 4, "precision": p} for p in ("fp32", "fp16", "bf16")],
        {"BLOCK": 384, "num_warps": 4, "precision": "fp32"},
        seed_args={"n": 1 << 24},
    ),
    Case(
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
    Case(
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
    Case(
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
        Case(
            name,
            {"rows": 37, "cols": 300, "seed": 3},
            {"rows": 0, "cols": -5},
            [{**NORM_TILE, "precision": p} for p in ("fp32", "fp16", "bf16")],
            {**NORM_TILE, "BLOCK": 384, "precision": "bf16"},
            seed_args={"rows": 8192, "cols": 8192},
        )
        for name in ("rmsnorm", "softmax")
    ),
    Case(
        "train_step",
        {"model": "tiny", "global_batch": 4, "steps": 2, "warmup_steps": 1},
        {"global_batch": 0, "steps": 0, "model": "huge"},
        [{**TRAIN, "micro_batch": 2, "precision": p} for p in ("fp32", "bf16", "fp16")],  # torch autocast on CPU
        {**TRAIN, "micro_batch": 2, "precision": "fp32", "attention": "triton"},  # the Triton kernel has no backward
        seed_args={"model": "1b", "global_batch": 8},
    ),
    Case(
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
    Case(
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
    Case(
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


def _ids(cases: list[Case]) -> list[str]:
    return [case.workload for case in cases]


def _make(case: Case) -> Workload:
    return workload_class(case.workload)(**case.args)


def test_every_registered_kernel_workload_is_in_the_suite() -> None:
    """A new workload in the registry must join the suite (noop and replay have suites of their own).
    The whole-step workloads (train_step, decode_step) keep the same contract with a step as the kernel."""
    assert set(workload_names()) - {"noop", "replay"} == KERNEL_WORKLOADS


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_args_are_validated_naming_the_arg(case: Case) -> None:
    cls = workload_class(case.workload)
    for arg, value in case.bad_args.items():
        with pytest.raises(ValueError, match=arg):
            cls(**{**case.args, arg: value})
    with pytest.raises(TypeError):
        cls(**{**case.args, "no_such_arg": 1})


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_default_space_compiles_and_its_seeds_pass_static_check_on_an_h200(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # as on the H200, where kernels compile
    workload = workload_class(case.workload)(**(case.seed_args or case.args))
    space = compile_space(workload.space_document())
    assert space.params and space.seeds, "a kernel workload ships known-good seeds"
    for seed in space.seeds:
        assert space.static_violation(seed, H200.to_dict()) is None, seed
        assert workload.static_check(seed, H200) is None, seed
    assert {m.name for m in workload.metric_specs()} and all(
        m.direction in ("maximize", "minimize") for m in workload.metric_specs()
    )


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_static_check_needs_neither_torch_nor_triton(case: Case) -> None:
    code = (
        "import json, sys\n"
        "from tuner.workloads.registry import workload_class\n"
        "from tuner.workloads.base import DeviceInfo\n"
        f"w = workload_class({case.workload!r})(**json.loads({json.dumps(case.args)!r}))\n"
        f"config = json.loads({json.dumps(case.ok_configs[0])!r})\n"
        "w.static_check(config, DeviceInfo(kind='cuda', name='NVIDIA H200', compute_capability=(9, 0),"
        " smem_per_block_bytes=232448, sm_count=132))\n"
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_statically_infeasible_configs_are_never_launched(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    workload = _make(case)
    assert isinstance(workload.static_check(case.infeasible, CPU), str)

    def must_not_launch(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("launched a statically infeasible config")

    monkeypatch.setattr(workload, "_launch", must_not_launch)
    result = workload.run(case.infeasible, CPU, TrialContext())
    assert result.status == TrialStatus.INFEASIBLE_STATIC and result.error


@pytest.mark.parametrize(
    ("case", "config"),
    [(case, config) for case in CASES for config in case.ok_configs],
    ids=[
        f"{case.workload}-{i}-{config.get('precision')}" for case in CASES for i, config in enumerate(case.ok_configs)
    ],
)
def test_runs_ok_on_the_interpreter_with_every_metric(case: Case, config: dict[str, Any], interpreter: None) -> None:
    workload = _make(case)
    assert workload.static_check(config, CPU) is None
    result = workload.run(config, CPU, TrialContext())
    assert result.status == TrialStatus.OK, result.error
    for metric in workload.metric_specs():
        assert metric.name in result.metrics and math.isfinite(result.metrics[metric.name]), metric.name
    assert result.samples_ms and all(s > 0 for s in result.samples_ms)
    assert result.timing_comparable is False
    flops, moved, precision = workload.work(config)
    assert flops > 0 and moved > 0 and precision in ROOFLINE_PRECISIONS
    json.dumps(workload.export_config(config))
    compile(workload.export_python(config), "<export>", "exec")
    assert all(isinstance(v, str) for v in workload.export_env(config).values())


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_a_kernel_that_writes_nothing_is_numerics_fail(
    case: Case, interpreter: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload = _make(case)
    monkeypatch.setattr(workload, "_launch", lambda config, case: None)
    result = workload.run(case.ok_configs[0], CPU, TrialContext())
    assert result.status == TrialStatus.NUMERICS_FAIL and result.error


class OutOfResources(Exception):
    """Named like Triton's: the status comes from the exception's name."""


class CompilationError(Exception):
    pass


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_triton_compile_failures_become_statuses(
    case: Case, interpreter: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for exc, status in (
        (
            OutOfResources("out of resource: shared memory, Required: 262144, Hardware limit: 232448"),
            TrialStatus.OUT_OF_RESOURCES,
        ),
        (CompilationError("at 12:4: invalid block shape"), TrialStatus.COMPILE_ERROR),
    ):
        workload = _make(case)

        def fail(config: dict[str, Any], case: Any, exc: Exception = exc) -> None:
            raise exc

        monkeypatch.setattr(workload, "_launch", fail)
        result = workload.run(case.ok_configs[0], CPU, TrialContext())
        assert result.status == status and type(exc).__name__ in (result.error or "")
