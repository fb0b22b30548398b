"""The Triton RMSNorm and softmax kernels and their ``rmsnorm`` / ``softmax`` workloads.

On a CPU the kernels run under the Triton interpreter (``conftest.py`` sets ``TRITON_INTERPRET=1``
before triton is imported; the kernel modules are imported inside the tests). The tests marked
``gpu`` compile the kernels for a real GPU, bf16 output rounding and the CUDA-graph timing included.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus

CPU = DeviceInfo(kind="cpu", name="cpu")
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
PRECISIONS = ["fp32", "fp16", "bf16"]
WORKLOADS = ["rmsnorm", "softmax"]
# (rows, cols): a masked column tail and a partial last program; an exact fit.
SHAPES = [(37, 300), (16, 256)]
# (BLOCK, ROWS_PER_PROGRAM, num_warps, num_stages): single pass (BLOCK >= cols), two passes with a
# masked tail at 300 columns and an exact one at 256.
TILES = [(512, 4, 4, 1), (128, 4, 2, 2)]
SMALL = {"rows": 37, "cols": 300, "seed": 3}


def _config(tile: tuple[int, int, int, int], precision: str) -> dict:
    names = ("BLOCK", "ROWS_PER_PROGRAM", "num_warps", "num_stages")
    return {**dict(zip(names, tile, strict=True)), "precision": precision}


def _workload(name: str, **args):
    from tuner.workloads.registry import workload_class

    return workload_class(name)(**args)


@pytest.fixture
def interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1 before triton is imported)")
    from kernels.norms.rmsnorm import rmsnorm_kernel

    if type(rmsnorm_kernel).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: kernels compile, not interpret")


def _run_kernel(name: str, inputs: tuple, config: dict, out=None):
    from kernels.norms.rmsnorm import rmsnorm
    from kernels.norms.softmax import softmax

    if name == "rmsnorm":
        return rmsnorm(*inputs, eps=1e-6, out=out, **config)
    return softmax(*inputs, out=out, **config)


def _masters_and_refs(name: str, rows: int, cols: int, precision: str, seed: int = 1):
    """(inputs in the precision, fp32 ref of the masters, fp32 ref of the rounded inputs)."""
    from kernels.norms import rmsnorm, softmax

    x, w = rmsnorm.make_masters(rows, cols, "cpu", seed)
    dtype = rmsnorm.DTYPES[precision]
    if name == "rmsnorm":
        inputs = (x.to(dtype), w.to(dtype))
        return inputs, rmsnorm.reference_rmsnorm(x, w), rmsnorm.reference_rmsnorm(*inputs)
    return (x.to(dtype),), softmax.reference_softmax(x), softmax.reference_softmax(x.to(dtype))


# --------------------------------------------------------------------------- the kernels


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", WORKLOADS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_kernels_match_the_torch_reference(interpreter: None, name: str, precision: str) -> None:
    from kernels.norms.rmsnorm import DTYPES, row_rel_error
    from objectives.rmsnorm import TOLERANCE_VS_FP32, TOLERANCE_VS_OPERANDS

    for rows, cols in SHAPES:
        inputs, ref, operand_ref = _masters_and_refs(name, rows, cols, precision)
        for tile in TILES:
            y = _run_kernel(name, inputs, _config(tile, precision))
            assert y.shape == (rows, cols) and y.dtype == DTYPES[precision]
            assert y.isfinite().all()
            assert row_rel_error(y, ref) <= TOLERANCE_VS_FP32[precision], (rows, cols, tile)
            # Against the op on the rounded inputs only the output rounding is left.
            assert row_rel_error(y, operand_ref) <= TOLERANCE_VS_OPERANDS.get(precision, 1e-6), (rows, cols, tile)


@pytest.mark.timeout(60)
def test_softmax_is_stable_where_exp_overflows_and_the_running_max_grows(interpreter: None) -> None:
    import torch

    from kernels.norms.softmax import softmax

    # exp(x) overflows fp32 past 88.7; the rows rise, so every block of the two-pass loop raises the
    # running max and the sum so far must be rescaled.
    x = torch.linspace(0, 300, 300).repeat(6, 1) + 100 * torch.arange(6.0)[:, None]
    x[1] = x[1].flip(0)  # the max in the first block: no rescale at all
    ref = torch.softmax(x.double(), dim=-1).float()
    for tile in ((512, 2, 4, 1), (64, 2, 2, 2)):
        y = softmax(x, **_config(tile, "fp32"))
        assert y.isfinite().all()
        torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-30)
        torch.testing.assert_close(y.sum(dim=-1), torch.ones(6), rtol=1e-5, atol=0)


@pytest.mark.timeout(60)
def test_rmsnorm_formula_eps_and_in_place_output(interpreter: None) -> None:
    import torch

    from kernels.norms.rmsnorm import rmsnorm

    x = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1.0, -1.0]])
    w = torch.tensor([2.0, 0.5])
    out = torch.full_like(x, float("nan"))
    result = rmsnorm(x, w, eps=0.5, out=out, **_config((2, 1, 1, 1), "fp32"))
    assert result is out
    # mean of squares: 12.5, 0, 1 -> scale 1 / sqrt(ms + 0.5)
    expected = x / torch.tensor([[13.0], [0.5], [1.5]]).sqrt() * w
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.timeout(30)
def test_launchers_reject_wrong_dtypes_shapes_and_knobs(interpreter: None) -> None:
    import torch

    from kernels.norms.rmsnorm import rmsnorm
    from kernels.norms.softmax import softmax

    tile = _config((64, 1, 2, 1), "fp16")
    x = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="float16"):
        softmax(x, **tile)
    with pytest.raises(ValueError, match="2-D"):
        softmax(torch.zeros(8, dtype=torch.float16), **tile)
    with pytest.raises(ValueError, match=r"^weight"):
        rmsnorm(x, torch.zeros(7), **{**tile, "precision": "fp32"})
    with pytest.raises(ValueError, match=r"^precision"):
        softmax(x, **{**tile, "precision": "fp64"})
    with pytest.raises(ValueError, match=r"^BLOCK"):
        softmax(x, **{**tile, "precision": "fp32", "BLOCK": 48})
    with pytest.raises(ValueError, match=r"^out"):
        softmax(x, out=torch.zeros(4, 9), **{**tile, "precision": "fp32"})


@pytest.mark.timeout(30)
def test_compile_only_is_a_no_op_under_the_interpreter(interpreter: None) -> None:
    from kernels.norms import rmsnorm, softmax

    tile = {"BLOCK": 8192, "ROWS_PER_PROGRAM": 1, "num_warps": 16, "num_stages": 1}
    assert rmsnorm.compile_only(8192, 8192, precision="bf16", **tile) is None
    assert softmax.compile_only(8192, 8192, precision="bf16", **tile) is None
    with pytest.raises(ValueError, match=r"^BLOCK"):
        softmax.compile_only(8, 8, precision="bf16", **{**tile, "BLOCK": 3})


# --------------------------------------------------------------------------- static feasibility and space


@pytest.mark.timeout(10)
@pytest.mark.parametrize("name", WORKLOADS)
def test_default_space_loads_and_seeds_pass_static_check(name: str) -> None:
    from tuner.study.space import compile_space, load_space_file

    workload = _workload(name, **SMALL)
    raw = load_space_file(workload.space_file)
    assert raw["workloads"] == [name]
    space = compile_space(raw)
    assert set(space.params) == {"BLOCK", "ROWS_PER_PROGRAM", "num_warps", "num_stages", "precision"}
    assert len(space.seeds) == len(raw["seeds"]) >= 4  # every seed is a point of the space
    for seed in space.seeds:
        assert workload.static_check(seed, H200) is None, seed
        assert space.static_violation(seed, H200.to_dict()) is None, seed
    # The rules: a spilling tile, idle threads, a pipelined tile past shared memory.
    base = {"BLOCK": 8192, "ROWS_PER_PROGRAM": 1, "num_warps": 8, "num_stages": 1, "precision": "bf16"}
    assert "registers" in (space.static_violation({**base, "ROWS_PER_PROGRAM": 8}, H200.to_dict()) or "")
    assert "lanes" in (space.static_violation({**base, "BLOCK": 128, "num_warps": 8}, H200.to_dict()) or "")
    big = {**base, "ROWS_PER_PROGRAM": 4, "num_warps": 32, "num_stages": 3, "precision": "fp32"}
    assert "shared_memory" in (space.static_violation(big, H200.to_dict()) or "")
    assert space.static_violation({**big, "num_stages": 1}, H200.to_dict()) is None


@pytest.mark.timeout(10)
@pytest.mark.parametrize("name", WORKLOADS)
def test_static_check_refuses_what_cannot_compile(name: str) -> None:
    workload = _workload(name, **SMALL)
    ok = {"BLOCK": 512, "ROWS_PER_PROGRAM": 4, "num_warps": 4, "num_stages": 1, "precision": "fp16"}
    assert workload.static_check(ok, CPU) is None
    assert workload.static_check({**ok, "precision": "bf16"}, CPU) is None  # bf16 element-wise works interpreted
    refused = {
        "BLOCK": {**ok, "BLOCK": 384},
        "ROWS_PER_PROGRAM": {**ok, "ROWS_PER_PROGRAM": 3},
        "num_warps": {**ok, "num_warps": 64},
        "num_stages": {**ok, "num_stages": 0},
        "precision": {**ok, "precision": "fp8"},
        "exceeds Triton": {**ok, "BLOCK": 1 << 18, "ROWS_PER_PROGRAM": 8},
        "lacks": {"BLOCK": 512},
        "ints": {**ok, "BLOCK": "512"},
    }
    for word, config in refused.items():
        reason = workload.static_check(config, H200)
        assert reason is not None and word in reason, (word, reason)
    result = workload.run(refused["precision"], CPU, TrialContext())
    assert result.status == TrialStatus.INFEASIBLE_STATIC and not workload._cases  # nothing built or launched


@pytest.mark.timeout(10)
def test_args_are_validated_naming_the_arg() -> None:
    for name in WORKLOADS:
        for arg, value in (("rows", 0), ("cols", -3), ("rows", 2.0), ("cols", True), ("seed", 1.5)):
            with pytest.raises(ValueError, match=f"^{arg} "):
                _workload(name, **{**SMALL, arg: value})
    for bad in (-1e-6, math.nan, "1e-6"):
        with pytest.raises(ValueError, match=r"^eps "):
            _workload("rmsnorm", **SMALL, eps=bad)
    with pytest.raises(TypeError):
        _workload("softmax", **SMALL, eps=1e-6)  # softmax has no eps


@pytest.mark.timeout(10)
def test_work_bytes_timing_mode_and_exports() -> None:
    from tuner.workloads.registry import workload_class

    big = workload_class("rmsnorm")(rows=8192, cols=8192)
    config = {"BLOCK": 8192, "ROWS_PER_PROGRAM": 1, "num_warps": 16, "num_stages": 1, "precision": "bf16"}
    flops, moved, precision = big.work(config)
    assert moved == 2 * 8192 * 8192 * 2 + 8192 * 2 and flops == 4 * 8192 * 8192 and precision == "bf16"
    soft = workload_class("softmax")(rows=8192, cols=8192)
    assert soft.work({**config, "precision": "fp32"}) == (5.0 * 8192 * 8192, 2.0 * 8192 * 8192 * 4, "fp32")
    # Trials are one eager call unless the spec asks for the graph time (the ``timing`` arg).
    assert soft.timing == "eager"
    assert workload_class("softmax")(rows=1024, cols=1024, timing="cuda_graph").timing == "cuda_graph"
    with pytest.raises(ValueError, match="timing must be one of eager, cuda_graph"):
        workload_class("softmax")(rows=1024, cols=1024, timing="graph")

    exported = big.export_config(config)
    assert exported == {
        "kwargs": {"BLOCK": 8192, "ROWS_PER_PROGRAM": 1},
        "num_warps": 16,
        "num_stages": 1,
        "precision": "bf16",
    }
    json.dumps(exported)
    source = big.export_python(config)
    compile(source, "<export>", "exec")
    assert "triton.Config({'BLOCK': 8192, 'ROWS_PER_PROGRAM': 1}, num_warps=16, num_stages=1)" in source
    assert big.export_env(config)["ROWS_PER_PROGRAM"] == "1"


@pytest.mark.timeout(10)
def test_registry_and_objective_import_stay_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from tuner.workloads.registry import workload_class; "
        "[workload_class(n) for n in ('rmsnorm', 'softmax')]; "
        "print('torch' in sys.modules, 'triton' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.stdout.split() == ["False", "False"]


# --------------------------------------------------------------------------- the workloads, end to end


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", WORKLOADS)
def test_run_on_cpu_returns_ok_with_all_metrics(interpreter: None, name: str) -> None:
    workload = _workload(name, **SMALL)
    for precision in PRECISIONS:
        config = _config((512, 4, 4, 1), precision)
        workload.prepare(config, CPU)  # a no-op on CPU
        result = workload.run(config, CPU, TrialContext(trial_number=0))
        assert result.status == TrialStatus.OK, result.error
        assert {m.name for m in workload.metrics} == set(result.metrics) == {
            "gbps", "latency_ms", "gpu_us", "host_us", "max_rel_error"
        }
        assert all(math.isfinite(v) for v in result.metrics.values()), result.metrics
        assert result.metrics["gbps"] > 0 and result.metrics["latency_ms"] > 0
        assert 0 <= result.metrics["max_rel_error"] <= {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}[precision]
        assert result.timing_comparable is False
        assert len(result.samples_ms) == 3 and result.extra["timing"]["median_ms"] == result.metrics["latency_ms"]
        expected_gbps = workload.bytes_moved(precision) / (result.metrics["latency_ms"] * 1e-3) / 1e9
        assert result.metrics["gbps"] == pytest.approx(expected_gbps)
    cached = workload._cases[("fp16", "cpu")]
    assert workload.run(_config((128, 4, 2, 2), "fp16"), CPU, TrialContext(trial_number=1)).ok  # two passes
    assert workload._cases[("fp16", "cpu")] is cached


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", WORKLOADS)
def test_wrong_results_are_numerics_fail(interpreter: None, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    workload_cls = type(_workload(name, **SMALL))
    real_launch = workload_cls._launch
    config = _config((512, 4, 4, 1), "fp16")

    def writes_nothing(self, config, case):
        return None

    def zeros(self, config, case):
        case.out.zero_()

    def off_by_half_a_percent(self, config, case):
        # Within the fp16 tolerance vs the fp32 masters: only the check against the rounded inputs catches it.
        real_launch(self, config, case)
        case.out.mul_(1.005)

    for fake, message in (
        (writes_nothing, "NaN"),
        (zeros, "exceeds fp16 tolerance"),
        (off_by_half_a_percent, "kernel"),
    ):
        monkeypatch.setattr(workload_cls, "_launch", fake)
        result = workload_cls(**SMALL).run(config, CPU, TrialContext())
        assert result.status == TrialStatus.NUMERICS_FAIL, fake.__name__
        assert message in (result.error or ""), result.error
        assert "max_rel_error" in result.metrics and not result.samples_ms
    monkeypatch.setattr(workload_cls, "_launch", real_launch)
    assert workload_cls(**SMALL).run(config, CPU, TrialContext()).ok


@pytest.mark.timeout(30)
def test_check_numerics_directly() -> None:
    import torch

    from objectives.rmsnorm import check_numerics

    ref = torch.tensor([[1.0, 2.0, 4.0], [0.001, 0.002, 0.004]])
    assert check_numerics(ref.clone(), ref, None, "fp32").ok
    # The small row is judged against its own max, not the tensor's: 25% off there is a failure.
    small_row_off = ref.clone()
    small_row_off[1, 2] = 0.005
    bad = check_numerics(small_row_off, ref, None, "fp16")
    assert not bad.ok and bad.max_rel_error == pytest.approx(0.25)
    poisoned = ref.clone()
    poisoned[0, 1] = float("inf")
    unwritten = check_numerics(poisoned, ref, None, "fp32")
    assert not unwritten.ok and math.isinf(unwritten.max_rel_error) and "1 of 6" in (unwritten.failure or "")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", WORKLOADS)
def test_compile_failures_become_statuses(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime.errors import OutOfResources

    workload_cls = type(_workload(name, **SMALL))
    config = _config((512, 4, 4, 1), "fp16")

    class CompilationError(Exception):  # matched by name, like triton.compiler.errors.CompilationError
        pass

    def raise_oor(*args, **kwargs):
        raise OutOfResources(262144, 232448, "shared memory")

    def raise_compile(*args, **kwargs):
        raise CompilationError("at 7:4: unsupported layout")

    for fake, status in ((raise_oor, TrialStatus.OUT_OF_RESOURCES), (raise_compile, TrialStatus.COMPILE_ERROR)):
        monkeypatch.setattr(workload_cls, "_launch", fake)
        result = workload_cls(**SMALL).run(config, CPU, TrialContext())
        assert result.status == status and result.error

    # prepare() on a GPU keeps the failure, and run() reports it without building inputs or launching.
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # as on a GPU (the kernels stay interpreted)
    monkeypatch.setattr(workload_cls, "_compile", raise_oor)
    workload = workload_cls(rows=8192, cols=8192)
    workload.prepare(config, H200)  # must not raise
    result = workload.run(config, H200, TrialContext())
    assert result.status == TrialStatus.OUT_OF_RESOURCES and "shared memory" in (result.error or "")
    assert not workload._cases


# --------------------------------------------------------------------------- on a GPU


def _gpu_or_skip() -> DeviceInfo:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("compiled kernels, not the interpreter")
    from tuner.workloads.fingerprint import device_info

    return device_info()


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", WORKLOADS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_numerics_and_timing_on_gpu(name: str, precision: str) -> None:
    device = _gpu_or_skip()
    # (shape, tile): single pass with a masked tail; two passes, exact fit; rows per program with a
    # partial last program; the 8192-wide bf16 rows of the benchmark.
    cases = [
        ((1000, 777), (1024, 1, 4, 1)),
        ((512, 4096), (1024, 2, 8, 2)),
        ((999, 128), (128, 8, 4, 1)),
        ((2048, 8192), (8192, 1, 16, 1)),
        ((2048, 8192), (2048, 1, 8, 3)),
    ]
    bound = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}[precision]
    for (rows, cols), tile in cases:
        workload = _workload(name, rows=rows, cols=cols)
        config = _config(tile, precision)
        assert workload.static_check(config, device) is None
        workload.prepare(config, device)
        result = workload.run(config, device, TrialContext())
        assert result.status == TrialStatus.OK, (rows, cols, tile, result.error)
        assert result.timing_comparable and len(result.samples_ms) >= 10
        assert 0 <= result.metrics["max_rel_error"] < bound
        if precision in ("fp16", "bf16"):
            # On a GPU the store rounds to nearest: at most half an ulp against the rounded inputs.
            assert result.extra["operand_rel_error"] <= {"fp16": 2**-11, "bf16": 2**-8}[precision] * 1.1
        assert 0 < result.metrics["gbps"] < 10_000
        assert result.extra["timing"]["mode"] == "eager"
        assert result.metrics["gpu_us"] > 0 and result.metrics["host_us"] > 0


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", WORKLOADS)
def test_seeds_run_on_gpu_at_the_benchmark_shape(name: str) -> None:
    device = _gpu_or_skip()
    from tuner.study.space import compile_space, load_space_file

    workload = _workload(name, rows=8192, cols=8192)
    space = compile_space(load_space_file(workload.space_file))
    for seed in space.seeds:
        workload.prepare(seed, device)
        result = workload.run(seed, device, TrialContext())
        assert result.status == TrialStatus.OK, (seed, result.error)
        # A memory-bound kernel at 268+ MB: well above 1 TB/s on any recent data-center GPU.
        assert result.metrics["gbps"] > 1000, (seed, result.metrics)


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", WORKLOADS)
def test_compile_only_fits_the_shared_memory_rule_on_gpu(name: str) -> None:
    _gpu_or_skip()
    import importlib

    from tuner.study import expr
    from tuner.study.space import compile_space, load_space_file

    kernels = importlib.import_module(f"kernels.norms.{name}")
    rule = next(r for r in compile_space(load_space_file(f"{name}.yaml")).rules if r.name == "shared_memory")
    # The rule's left-hand side: the bytes it expects the compiled kernel to take at most.
    estimate = expr.parse(rule.expression.text.split("<=")[0].strip())
    for tile in ((2048, 1, 8, 3), (1024, 2, 4, 3), (8192, 1, 16, 1)):
        for precision in ("bf16", "fp32"):
            config = _config(tile, precision)
            kernel = kernels.compile_only(8192, 8192, **config)
            assert kernel is not None, "warmup returned nothing: prepare() would not compile ahead"
            assert kernel.metadata.shared <= estimate.evaluate(config), (tile, precision, kernel.metadata.shared)
