"""Launch plans (:mod:`kernels.launch`) and the launchers that keep them: a plan's first call goes through
``kernel[grid]``, its runner takes the runtime arguments and then the constexprs in signature order, and each
exported launcher keys one plan per shape, layout, alignment and config, reused by other tensors of that key."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
from conftest import compiled_gpu

from kernels import launch
from kernels.launch import Descriptors, Plan, PlanCache, layout_key


@triton.jit
def _axpby_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, NEGATE: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    result = alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
    if NEGATE:
        result = -result
    tl.store(out_ptr + offs, result, mask=mask)


def _axpby(cache: PlanCache, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, alpha: float) -> None:
    """A launcher in the pattern of the project's: the plan keyed by the tensors' layout, the size in its state."""
    key = (layout_key(x, y, out), x.device)
    plan = cache.get(key)
    if plan is None:
        plan = cache.put(key, Plan(_axpby_kernel, (triton.cdiv(x.numel(), 32),), {"BLOCK": 32}, n=x.numel()))
    plan.launch(x, y, out, plan.state["n"], alpha)


def test_a_plan_launches_a_real_kernel_and_serves_other_tensors_of_its_key(interpreter: None) -> None:
    cache = PlanCache()
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        x, y = torch.randn(100, generator=gen), torch.randn(100, generator=gen)
        out = torch.full((100,), float("nan"))
        _axpby(cache, x, y, out, 0.5)
        assert len(cache) == 1
        torch.testing.assert_close(out, 0.5 * x + y)
    x = torch.randn(40)
    out = torch.full((40,), float("nan"))
    _axpby(cache, x, x, out, 2.0)  # another size: another plan
    assert len(cache) == 2
    torch.testing.assert_close(out, 3.0 * x)


@dataclass
class _Compiled:
    """Stands in for Triton's compiled kernel (which a CPU cannot have): its runner records what it is given;
    ``refuse`` makes it refuse calls of more than that many arguments with a TypeError, as an older runner does."""

    refuse: int | None = None
    grids: list[tuple[int, ...]] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        self.grids.append(grid)

        def runner(*args: Any) -> None:
            if self.refuse is not None and len(args) > self.refuse:
                raise TypeError(f"takes {self.refuse} arguments, got {len(args)}")
            self.calls.append(args)

        return runner


def test_the_runner_takes_the_runtime_arguments_then_the_constexprs_in_signature_order_defaults_filled() -> None:
    args = ("x", "y", "out", 100, 0.5)
    plan = Plan(_axpby_kernel, (4,), {"BLOCK": 32, "num_warps": 2})
    compiled = _Compiled()
    plan._keep(compiled, len(args))
    assert compiled.grids == [(4, 1, 1)], "the compiled runner reads three grid dimensions"
    assert plan.consts == (32, False)  # BLOCK from the meta, NEGATE's default; launch options are not arguments
    plan.launch(*args)
    plan.launch(*args)
    assert compiled.calls == [(*args, 32, False)] * 2
    negated = Plan(_axpby_kernel, (4, 2), {"NEGATE": True, "BLOCK": 64})
    compiled = _Compiled()
    negated._keep(compiled, len(args))
    negated.launch(*args)
    assert compiled.grids == [(4, 2, 1)] and compiled.calls == [(*args, 64, True)]
    unbound = Plan(_axpby_kernel, (4,), {})  # BLOCK has neither a value nor a default: left to Triton's path
    unbound._keep(_Compiled(), len(args))
    assert unbound.runner is None


def test_a_runner_that_refuses_the_constexprs_on_its_first_call_gets_runtime_arguments_only() -> None:
    args = ("x", "y", "out", 100, 0.5)
    plan = Plan(_axpby_kernel, (4,), {"BLOCK": 32})
    compiled = _Compiled(refuse=len(args))
    plan._keep(compiled, len(args))
    plan.launch(*args)
    plan.launch(*args)
    assert compiled.calls == [args, args] and plan.values is False
    # once a runner has taken the constexprs, a TypeError is the caller's: raised, not retried
    proven = Plan(_axpby_kernel, (4,), {"BLOCK": 32})
    compiled = _Compiled()
    proven._keep(compiled, len(args))
    proven.launch(*args)
    compiled.refuse = len(args)
    with pytest.raises(TypeError, match="takes 5 arguments"):
        proven.launch(*args)


def test_a_plan_cache_drops_the_least_recently_used_and_keeps_no_unhashable_key() -> None:
    cache = PlanCache(maxsize=2)
    plans = [Plan(_axpby_kernel, (1,), {"BLOCK": 32}) for _ in range(3)]
    cache.put("a", plans[0])
    cache.put("b", plans[1])
    assert cache.get("a") is plans[0]  # "b" is now the least recently used
    cache.put("c", plans[2])
    assert cache.get("b") is None and cache.get("a") is plans[0] and cache.get("c") is plans[2]
    assert cache.get(("knob", [1])) is None and cache.put(("knob", [1]), plans[0]) is plans[0] and len(cache) == 2


def test_descriptor_sets_are_kept_per_data_pointers_and_the_oldest_dropped() -> None:
    built: list[int] = []
    sets = Descriptors(maxsize=2)

    def build(tag: int) -> tuple[int]:
        built.append(tag)
        return (tag,)

    assert sets.get((16, 32), build, 1) == (1,)
    assert sets.get((16, 32), build, 2) == (1,), "the same pointers: the set built first"
    sets.get((48, 32), build, 3)
    sets.get((64, 32), build, 4)  # a third set: (16, 32), the oldest, is dropped
    assert len(sets) == 2 and sets.get((16, 32), build, 5) == (5,)
    assert built == [1, 3, 4, 5]


# --------------------------------------------------------------------------- the exported launchers


def _tensors(seed: int, *shapes: tuple[int, ...], dtype: torch.dtype = torch.float16, device: str = "cpu",
             offset: bool = False) -> list[torch.Tensor]:  # fmt: skip
    """Standard normal tensors; with ``offset`` the first is a view one element into its buffer (misaligned)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    for i, shape in enumerate(shapes):
        numel = 1
        for size in shape:
            numel *= size
        start = 1 if offset and i == 0 else 0
        flat = torch.randn(numel + start, generator=gen, device=device).to(dtype)
        out.append(flat[start:].view(shape))
    return out


def _nan(shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=like.device, dtype=dtype or like.dtype)


#: (output, reference, largest relative error)
Result = tuple[torch.Tensor, torch.Tensor, float]

GEMM_TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
PERSISTENT_TILE = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
ATTENTION_TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
QUANT_TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2}
PACKED_TILE = {"BLOCK_M": 1, "BLOCK_N": 16, "SPLIT_K": 1, "num_warps": 4}


def _matmul(seed: int, m: int, knobs: dict[str, Any], offset: bool, device: str = "cpu") -> Result:
    from kernels.gemm.gemm import matmul

    a, b = _tensors(seed, (m, 32), (32, 24), device=device, offset=offset)
    out = _nan((m, 24), a)
    matmul(a, b, precision="fp16", out=out, **{**GEMM_TILE, **knobs})
    return out, a.float() @ b.float(), 2e-3


def _matmul_persistent(seed: int, m: int, knobs: dict[str, Any], offset: bool, device: str = "cpu") -> Result:
    from kernels.gemm.gemm_tma import matmul_persistent

    a, b = _tensors(seed, (m, 64), (64, 32), device=device, offset=offset)
    out = _nan((m, 32), a)
    matmul_persistent(a, b, precision="fp16", num_sms=2, out=out, **{**PERSISTENT_TILE, **knobs})
    return out, a.float() @ b.float(), 2e-3


def _qkv(seed: int, seq_len: int, device: str, offset: bool, head_dim: int = 16) -> list[torch.Tensor]:
    return _tensors(seed, *[(1, 2, seq_len, head_dim)] * 3, device=device, offset=offset)


def _attention(seed: int, seq_len: int, knobs: dict[str, Any], offset: bool, device: str = "cpu") -> Result:
    from kernels.attention.attention import attention, reference_attention

    q, k, v = _qkv(seed, seq_len, device, offset)
    out = _nan(tuple(q.shape), q)
    attention(q, k, v, causal=True, out=out, **{**ATTENTION_TILE, **knobs})
    return out, reference_attention(q, k, v, True), 2e-3


def _attention_persistent(seed: int, seq_len: int, knobs: dict[str, Any], offset: bool,
                          device: str = "cpu") -> Result:  # fmt: skip
    from kernels.attention.attention import reference_attention
    from kernels.attention.attention_persistent import attention_persistent

    q, k, v = _qkv(seed, seq_len, device, offset)
    out = _nan(tuple(q.shape), q)
    tile = {**ATTENTION_TILE, "BLOCK_M": 32, **knobs}
    attention_persistent(q, k, v, causal=True, num_sms=2, out=out, **tile)
    return out, reference_attention(q, k, v, True), 2e-3


def _quant_matmul(seed: int, m: int, knobs: dict[str, Any], offset: bool, device: str = "cpu") -> Result:
    from kernels.quant.quant_gemm import quant_matmul, quantize_weights, reference_quant_matmul

    x, w = _tensors(seed, (m, 64), (64, 40), device=device, offset=offset)
    weights = quantize_weights(w.float(), 4, 32, scale_dtype=torch.float16)
    out = _nan((m, 40), x)
    quant_matmul(x, weights.qweight, weights.scales, bits=4, group_size=32, out=out, **{**QUANT_TILE, **knobs})
    return out, reference_quant_matmul(x, weights), 2e-3


def _packed_matmul(seed: int, m: int, knobs: dict[str, Any], offset: bool, device: str = "cpu") -> Result:
    from kernels.quant.quant_gemm_packed import packed_matmul
    from kernels.quant.quant_layout import quantize_packed

    x, w = _tensors(seed, (m, 256), (256, 40), device=device, offset=offset)
    weights = quantize_packed(w.float(), 4, 32, torch.float16)
    out = _nan((m, 40), x)
    packed_matmul(x, weights, out=out, **{**PACKED_TILE, **knobs})
    return out, x.float() @ weights.dequantize(), 2e-3


@dataclass(frozen=True)
class Launcher:
    """One exported launcher under test: ``run(seed, size, knobs, offset)`` calls it on fresh operands."""

    name: str  # module:function
    run: Callable[..., Result]
    sizes: tuple[int, int]  # the size of the first calls, then a changed one
    knob: dict[str, Any]  # a changed knob
    misaligned: bool  # the launcher takes a first operand that is not 16-byte aligned


CPU_LAUNCHERS = {
    "matmul": Launcher("kernels.gemm.gemm:matmul", _matmul, (24, 40), {"BLOCK_N": 32}, True),
    "matmul_persistent": Launcher("kernels.gemm.gemm_tma:matmul_persistent", _matmul_persistent, (48, 80),
                                  {"stream_k": True}, False),
    "attention": Launcher("kernels.attention.attention:attention", _attention, (32, 40), {"BLOCK_N": 32}, True),
    "attention_persistent": Launcher("kernels.attention.attention_persistent:attention_persistent",
                                     _attention_persistent, (48, 40), {"split_m": True}, False),
    "quant_matmul": Launcher("kernels.quant.quant_gemm:quant_matmul", _quant_matmul, (20, 3), {"SPLIT_K": 2}, True),
    "packed_matmul": Launcher("kernels.quant.quant_gemm_packed:packed_matmul", _packed_matmul, (1, 3), {"TMA": 1},
                              True),
}  # fmt: skip


def _check(result: Result) -> None:
    out, reference, tolerance = result
    assert not out.isnan().any(), "every element written"
    error = float((out.float() - reference).abs().max() / reference.abs().max())
    assert error < tolerance, error


def _plans(launcher: Launcher) -> PlanCache:
    return importlib.import_module(launcher.name.split(":")[0])._PLANS


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(CPU_LAUNCHERS))
def test_a_launcher_keeps_one_plan_per_shape_config_and_alignment(interpreter: None, name: str) -> None:
    launcher = CPU_LAUNCHERS[name]
    plans = _plans(launcher)
    plans.clear()
    size, other_size = launcher.sizes
    for seed in (1, 2):  # other operand tensors of one shape: one plan, right both times
        _check(launcher.run(seed, size, {}, False))
        assert len(plans) == 1
    _check(launcher.run(3, other_size, {}, False))
    assert len(plans) == 2, "a changed shape is another plan"
    _check(launcher.run(4, size, launcher.knob, False))
    assert len(plans) == 3, "a changed knob is another plan"
    _check(launcher.run(5, size, launcher.knob, False))
    assert len(plans) == 3
    if launcher.misaligned:
        _check(launcher.run(6, size, {}, True))
        assert len(plans) == 4, "a misaligned operand is another specialization: another plan"


def test_a_bad_config_raises_its_message_on_every_call_and_keeps_no_plan(interpreter: None) -> None:
    from kernels.gemm.gemm import matmul

    plans = _plans(CPU_LAUNCHERS["matmul"])
    plans.clear()
    a, b = _tensors(1, (16, 32), (32, 16))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"precision 'bf16' needs torch\.bfloat16 operands"):
            matmul(a, b, precision="bf16", **GEMM_TILE)
    with pytest.raises(ValueError, match="out must be"):
        matmul(a, b, precision="fp16", out=torch.empty(16, 8, dtype=torch.float16), **GEMM_TILE)
    assert len(plans) == 0


# --------------------------------------------------------------------------- on a GPU


def _gemm_ws(seed: int, m: int, knobs: dict[str, Any], offset: bool, device: str = "cuda") -> Result:
    from kernels.gemm.gemm_ws import matmul_pingpong

    a, b = _tensors(seed, (m, 256), (256, 256), dtype=torch.bfloat16, device=device)
    out = _nan((m, 256), a)
    matmul_pingpong(a, b, out=out, **knobs)
    return out, a.float() @ b.float(), 1e-2


def _attention_ws(seed: int, seq_len: int, knobs: dict[str, Any], offset: bool, device: str = "cuda") -> Result:
    from kernels.attention.attention import reference_attention
    from kernels.attention.attention_ws import attention_ws

    q, k, v = _tensors(seed, *[(1, 4, seq_len, 64)] * 3, dtype=torch.bfloat16, device=device)
    out = _nan(tuple(q.shape), q)
    attention_ws(q, k, v, causal=True, out=out, **knobs)
    return out, reference_attention(q, k, v, True), 1e-2


def _ws_quant_matmul(seed: int, m: int, knobs: dict[str, Any], offset: bool, device: str = "cuda") -> Result:
    from kernels.quant.quant_gemm_ws import ws_quant_matmul
    from kernels.quant.quant_layout import quantize_packed

    x, w = _tensors(seed, (m, 1024), (1024, 512), dtype=torch.bfloat16, device=device)
    weights = quantize_packed(w.float() * 0.05, 4, 128, scale_dtype=torch.bfloat16)
    out = _nan((m, 512), x)
    ws_quant_matmul(x, weights, out=out, num_sms=2, **knobs)  # a tile a program: no split tile, one sum order
    return out, x.float() @ weights.dequantize(), 1e-2


GPU_LAUNCHERS = {
    **CPU_LAUNCHERS,
    "attention": Launcher("kernels.attention.attention:attention", _attention, (32, 40), {"use_tma": True}, True),
    "matmul_pingpong": Launcher("kernels.gemm.gemm_ws:matmul_pingpong", _gemm_ws, (256, 384), {"BLOCK_N": 64}, False),
    "attention_ws": Launcher("kernels.attention.attention_ws:attention_ws", _attention_ws, (256, 384),
                             {"PERSISTENT": True}, False),
    "ws_quant_matmul": Launcher("kernels.quant.quant_gemm_ws:ws_quant_matmul", _ws_quant_matmul, (16, 5),
                                {"BLOCK_N": 64}, False),
}  # fmt: skip

@pytest.mark.parametrize("name", list(GPU_LAUNCHERS))
@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
def test_on_a_gpu_a_launcher_keeps_one_plan_per_shape_config_and_alignment(name: str) -> None:
    launcher = GPU_LAUNCHERS[name]
    plans = _plans(launcher)
    plans.clear()
    size, other_size = launcher.sizes
    for seed in (1, 2, 3):
        _check(launcher.run(seed, size, {}, False, "cuda"))
        assert len(plans) == 1
    plan = next(iter(plans._plans.values()))
    assert plan.runner is not None and plan.proven, "later calls go to the compiled kernel's runner"
    _check(launcher.run(4, other_size, {}, False, "cuda"))
    _check(launcher.run(5, size, launcher.knob, False, "cuda"))
    assert len(plans) == 3
    if launcher.misaligned:
        _check(launcher.run(6, size, {}, True, "cuda"))
        assert len(plans) == 4


@pytest.mark.parametrize("name", list(GPU_LAUNCHERS))
@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
def test_on_a_gpu_the_runner_launch_equals_the_slow_launch_bit_for_bit(name: str, monkeypatch: Any) -> None:
    launcher = GPU_LAUNCHERS[name]
    size = launcher.sizes[0]
    for knobs in ({}, launcher.knob):
        _plans(launcher).clear()
        launcher.run(1, size, knobs, False, "cuda")  # the plan's first call: Triton's launch path
        fast = launcher.run(2, size, knobs, False, "cuda")[0]  # the runner
        assert next(iter(_plans(launcher)._plans.values())).runner is not None
        monkeypatch.setattr(launch, "SLOW", True)  # what KERNELS_SLOW_LAUNCH=1 does: kernel[grid] every call
        _plans(launcher).clear()
        launcher.run(2, size, knobs, False, "cuda")
        slow = launcher.run(2, size, knobs, False, "cuda")[0]
        assert next(iter(_plans(launcher)._plans.values())).runner is None
        monkeypatch.setattr(launch, "SLOW", False)
        torch.cuda.synchronize()
        assert torch.equal(fast, slow), (name, knobs)


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
def test_on_a_gpu_host_time_per_call(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Host microseconds a call of each launcher (output buffer given, calls back to back, no sync), through the
    plans and through ``kernel[grid]`` every call; printed, not asserted (a CPU's speed is no test's business)."""
    lines = []
    for name, launcher in GPU_LAUNCHERS.items():
        times = {}
        for slow in (False, True):
            monkeypatch.setattr(launch, "SLOW", slow)
            _plans(launcher).clear()
            times[slow] = _host_us(launcher)
        monkeypatch.setattr(launch, "SLOW", False)
        lines.append(f"{name:22s} host_us plan {times[False]:7.1f}   kernel[grid] {times[True]:7.1f}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def _host_us(launcher: Launcher, calls: int = 200) -> float:
    """Median over 5 rounds of the host time a call, the launcher's arguments built once beforehand."""
    captured: dict[str, Any] = {}
    module_name, function = launcher.name.split(":")
    module = importlib.import_module(module_name)
    real = getattr(module, function)

    def record(*args: Any, **kwargs: Any) -> Any:
        captured["args"], captured["kwargs"] = args, kwargs
        return real(*args, **kwargs)

    setattr(module, function, record)  # the run's call, its operands and output kept
    try:
        launcher.run(1, launcher.sizes[0], {}, False, "cuda")
    finally:
        setattr(module, function, real)
    args, kwargs = captured["args"], captured["kwargs"]
    for _ in range(3):
        real(*args, **kwargs)
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            real(*args, **kwargs)
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return sorted(rounds)[2]
