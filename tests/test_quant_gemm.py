"""The weight-only quantized GEMM: quantizer and packing, the Triton kernel, the ``quant_gemm`` workload.

CPU tests run the kernel under the Triton interpreter (fp16 only: the interpreter computes bf16 products
wrongly); the tests marked ``gpu`` compile it for a real GPU, bf16 included, at decode shapes.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus

CPU = DeviceInfo(kind="cpu", name="cpu")
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
T4 = DeviceInfo(kind="cuda", name="Tesla T4", compute_capability=(7, 5), smem_per_block_bytes=65536)

#: Small CPU shape: M and N not multiples of the tiles (wrapped loads, masked stores), K = 2 * 128.
ARGS = {"m": 20, "n": 48, "k": 256}


def _config(bits: int = 4, group_size: int = 128, precision: str = "fp16", **tile: int) -> dict:
    base = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2}
    return {"bits": bits, "group_size": group_size, "precision": precision, **base, **tile}


@pytest.fixture
def interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1 before triton is imported)")
    from kernels.quant.quant_gemm import quant_matmul_kernel

    if type(quant_matmul_kernel).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: kernels compile, not interpret")


# --------------------------------------------------------------------------- quantizer and layout


@pytest.mark.timeout(30)
def test_int4_packing_layout_and_round_trip() -> None:
    import torch

    from kernels.quant.quant_gemm import pack_int4, unpack_int4

    q = torch.tensor([[-7, 7], [3, -8], [0, 1], [5, -1]], dtype=torch.int8)  # (K=4, N=2)
    packed = pack_int4(q)
    assert packed.shape == (2, 2) and packed.dtype == torch.int8
    # Row r: low nibble q[2r] + 8, high nibble q[2r + 1] + 8 (offset binary).
    expected = [[(1 | 11 << 4), (15 | 0 << 4)], [(8 | 13 << 4), (9 | 7 << 4)]]
    assert packed.view(torch.uint8).tolist() == expected
    assert torch.equal(unpack_int4(packed), q)
    every = torch.arange(-8, 8, dtype=torch.int8).repeat(4).reshape(-1, 2)
    assert torch.equal(unpack_int4(pack_int4(every)), every)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_weights_is_symmetric_per_group_and_nearest(bits: int) -> None:
    import torch

    from kernels.quant.quant_gemm import QMAX, quantize_weights

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(256, 24, generator=gen)
    w[64:96, 5] = 0.0  # an all-zero group
    qw = quantize_weights(w, bits, 32, scale_dtype=torch.float16)
    assert qw.shape == (256, 24) and qw.scales.shape == (8, 24) and qw.scales.dtype == torch.float16
    assert qw.qweight.shape == (256 * bits // 8, 24)
    assert qw.nbytes == 256 * 24 * bits // 8 + 8 * 24 * 2
    q = qw.values()
    assert int(q.abs().max()) == QMAX[bits]  # the group maximum maps to +-QMAX
    scales = qw.scales.float().repeat_interleave(32, dim=0)
    error = (qw.dequantize() - w).abs()
    assert bool((error <= scales / 2 * (1 + 1e-3) + 1e-6).all())  # nearest representable value
    assert torch.equal(qw.dequantize()[64:96, 5], torch.zeros(32))
    group_max = w.abs().reshape(8, 32, 24).amax(dim=1)
    expected = (group_max / QMAX[bits]).clamp(min=torch.finfo(torch.float16).tiny)  # the zero group: smallest normal
    assert torch.allclose(qw.scales.float(), expected, rtol=1e-3, atol=0)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bits", [4, 8])
def test_clip_search_lowers_the_error_of_every_group(bits: int) -> None:
    import torch

    from kernels.quant.quant_gemm import CLIP_RATIOS, QMAX, quantize_weights

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(512, 64, generator=gen) * torch.rand(1, 64, generator=gen)  # columns of varied scale
    w[::37] *= 6  # outliers: the case clipping exists for
    plain = quantize_weights(w, bits, 64)
    clipped = quantize_weights(w, bits, 64, clip_search=True)

    def group_error(qw):  # squared error per (group, column)
        return ((qw.dequantize() - w) ** 2).reshape(8, 64, 64).sum(dim=1)

    assert bool((group_error(clipped) <= group_error(plain) * (1 + 1e-6)).all())
    if bits == 4:  # 15 levels: clipping pays (-10% here, -19% on plain Gaussian weights); int8 rarely gains
        assert float(group_error(clipped).sum()) < 0.95 * float(group_error(plain).sum())
    # Every scale is one of the candidate ratios of the group's max (up to the bf16 rounding of the scale).
    amax = w.abs().reshape(8, 64, 64).amax(dim=1)
    ratios = clipped.scales.float() * QMAX[bits] / amax
    nearest = torch.tensor(CLIP_RATIOS)[(ratios[..., None] - torch.tensor(CLIP_RATIOS)).abs().argmin(dim=-1)]
    assert torch.allclose(ratios, nearest, rtol=1e-2)
    assert int(clipped.values().abs().max()) <= QMAX[bits]


@pytest.mark.timeout(30)
def test_quantize_weights_rejects_bad_arguments() -> None:
    import torch

    from kernels.quant.quant_gemm import quantize_weights

    w = torch.zeros(128, 8)
    with pytest.raises(ValueError, match="bits"):
        quantize_weights(w, 3, 32)
    with pytest.raises(ValueError, match="group_size"):
        quantize_weights(w, 4, 48)
    with pytest.raises(ValueError, match="group_size"):
        quantize_weights(torch.zeros(96, 8), 4, 64)
    with pytest.raises(ValueError, match="scale_dtype"):
        quantize_weights(w, 8, 32, scale_dtype=torch.float32)


# --------------------------------------------------------------------------- the kernel


@pytest.mark.timeout(120)
@pytest.mark.parametrize("swap_ab", [0, 1], ids=["x-times-w", "swapped"])
@pytest.mark.parametrize("bits", [4, 8])
def test_kernel_matches_dequantized_reference(interpreter: None, bits: int, swap_ab: int) -> None:
    import torch

    from kernels.gemm.gemm import max_rel_error
    from kernels.quant.quant_gemm import quant_matmul, quantize_weights, reference_quant_matmul
    from objectives.quant_gemm import TOLERANCE_VS_DEQUANTIZED

    gen = torch.Generator().manual_seed(1)
    m, n, k = 20, 48, 256
    x = torch.randn(m, k, generator=gen).to(torch.float16)
    w = torch.randn(k, n, generator=gen)
    # (group, BLOCK_K, SPLIT_K): one group per tile (scaled after the dot) and several (dequantized first),
    # with and without split-K; BLOCK_N=32 leaves a partial last column tile, BLOCK_M=16 a wrapped row tile.
    cases = [(128, 64, 1), (128, 32, 2), (32, 64, 1), (32, 128, 2), (64, 64, 4)]
    for group, block_k, split_k in cases:
        qw = quantize_weights(w, bits, group, scale_dtype=torch.float16)
        ref = reference_quant_matmul(x, qw)
        out = torch.full((m, n), float("nan"), dtype=torch.float16)
        result = quant_matmul(
            x, qw.qweight, qw.scales, bits=bits, group_size=group, BLOCK_M=16, BLOCK_N=32, BLOCK_K=block_k,
            SPLIT_K=split_k, num_warps=4, num_stages=2, SWAP_AB=swap_ab, out=out,
        )  # fmt: skip
        assert result is out and not out.isnan().any()
        error = max_rel_error(out, ref)
        assert error <= TOLERANCE_VS_DEQUANTIZED["fp16"] / 2, (group, block_k, split_k, error)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bits", [4, 8])
def test_gemv_kernel_matches_dequantized_reference(interpreter: None, bits: int) -> None:
    """BLOCK_M = 1 launches the GEMV kernel (no tl.dot): one row per program, bf16 too (no dot to get wrong)."""
    import torch

    from kernels.gemm.gemm import max_rel_error
    from kernels.quant.quant_gemm import quant_matmul, quantize_weights, reference_quant_matmul
    from objectives.quant_gemm import TOLERANCE_VS_DEQUANTIZED

    gen = torch.Generator().manual_seed(2)
    n, k = 48, 512
    w = torch.randn(k, n, generator=gen)
    # (rows, group, BLOCK_K, SPLIT_K, dtype): a K tile inside a group and spanning several, split-K,
    # 1 and 3 rows (programs of one weight tile side by side), BLOCK_N=32 with a partial last tile.
    cases = [
        (1, 128, 64, 1, torch.float16),
        (3, 32, 256, 2, torch.float16),
        (1, 128, 128, 4, torch.bfloat16),
        (2, 64, 256, 1, torch.bfloat16),
    ]
    for rows, group, block_k, split_k, dtype in cases:
        x = torch.randn(rows, k, generator=gen).to(dtype)
        qw = quantize_weights(w, bits, group, scale_dtype=dtype)
        ref = reference_quant_matmul(x, qw)
        out = torch.full((rows, n), float("nan"), dtype=dtype)
        quant_matmul(
            x, qw.qweight, qw.scales, bits=bits, group_size=group, BLOCK_M=1, BLOCK_N=32, BLOCK_K=block_k,
            SPLIT_K=split_k, num_warps=4, num_stages=2, out=out,
        )  # fmt: skip
        assert not out.isnan().any()
        precision = "fp16" if dtype == torch.float16 else "bf16"
        error = max_rel_error(out, ref)
        assert error <= TOLERANCE_VS_DEQUANTIZED[precision] / 2, (rows, group, block_k, split_k, dtype, error)


@pytest.mark.timeout(60)
def test_kernel_single_row_and_stale_workspace(interpreter: None) -> None:
    import torch

    from kernels.gemm.gemm import max_rel_error
    from kernels.quant.quant_gemm import quant_matmul, quantize_weights, reference_quant_matmul

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 128, generator=gen).to(torch.float16)  # decode: M = 1
    qw = quantize_weights(torch.randn(128, 64, generator=gen), 4, 64, scale_dtype=torch.bfloat16)  # bf16 scales
    workspace = torch.full((1, 64), 123.0)  # garbage from an earlier call: quant_matmul zeroes it
    out = quant_matmul(
        x, qw.qweight, qw.scales, bits=4, group_size=64, BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, SPLIT_K=4,
        num_warps=2, num_stages=2, workspace=workspace,
    )  # fmt: skip
    assert out.shape == (1, 64) and out.dtype == torch.float16
    assert max_rel_error(out, reference_quant_matmul(x, qw)) <= 1e-3


@pytest.mark.timeout(30)
def test_quant_matmul_rejects_bad_operands(interpreter: None) -> None:
    import torch

    from kernels.quant.quant_gemm import quant_matmul, quantize_weights

    qw = quantize_weights(torch.randn(128, 32), 4, 32, scale_dtype=torch.float16)
    x = torch.zeros(4, 128, dtype=torch.float16)
    tile = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2}
    with pytest.raises(ValueError, match="x must be"):
        quant_matmul(x.float(), qw.qweight, qw.scales, bits=4, group_size=32, **tile)
    with pytest.raises(ValueError, match="qweight"):
        quant_matmul(x, qw.qweight, qw.scales, bits=8, group_size=32, **tile)
    with pytest.raises(ValueError, match="scales"):
        quant_matmul(x, qw.qweight, qw.scales, bits=4, group_size=64, **tile)
    with pytest.raises(ValueError, match="BLOCK_K"):
        quant_matmul(x, qw.qweight, qw.scales, bits=4, group_size=32, **{**tile, "BLOCK_K": 16})
    with pytest.raises(ValueError, match="SPLIT_K"):
        quant_matmul(x, qw.qweight, qw.scales, bits=4, group_size=32, **{**tile, "SPLIT_K": 8})


@pytest.mark.timeout(30)
def test_compile_only_is_a_no_op_under_the_interpreter(interpreter: None) -> None:
    from kernels.quant.quant_gemm import compile_only

    tile = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 2, "num_warps": 4, "num_stages": 4}
    assert compile_only(16, 8192, 8192, precision="bf16", bits=4, group_size=128, **tile) is None
    with pytest.raises(ValueError, match="precision"):
        compile_only(16, 8192, 8192, precision="fp32", bits=4, group_size=128, **tile)


# --------------------------------------------------------------------------- static feasibility and space


@pytest.mark.timeout(10)
def test_args_are_validated_naming_the_arg() -> None:
    from objectives.quant_gemm import QuantGemm

    for bad, name in (
        ({"m": 0, "n": 8, "k": 128}, "m"),
        ({"m": 1, "n": -8, "k": 128}, "n"),
        ({"m": 1, "n": 8, "k": "128"}, "k"),
        ({"m": 1, "n": 8, "k": 192}, "k"),  # not a multiple of 128
    ):
        with pytest.raises(ValueError, match=f"^{name} "):
            QuantGemm(**bad)
    with pytest.raises(ValueError, match=r"^seed "):
        QuantGemm(m=1, n=8, k=128, seed=0.5)


@pytest.mark.timeout(10)
def test_static_check_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    from objectives.quant_gemm import QuantGemm

    workload = QuantGemm(**ARGS)
    assert workload.static_check(_config(), CPU) is None
    reason = workload.static_check(_config(precision="bf16"), CPU)
    assert reason is not None and "bf16" in reason and "interpreter" in reason
    expected = {
        "BLOCK_K": _config(BLOCK_K=16),  # int4 needs 32
        "power of two": _config(BLOCK_M=24),
        "GEMV": _config(BLOCK_M=8),  # 1 (GEMV) or >= 16 (tl.dot)
        "does not divide": _config(BLOCK_K=64, SPLIT_K=8),  # 8 * 64 > 256
        "group_size": _config(group_size=48),
        "bits": _config(bits=2),
        "precision": _config(precision="fp32"),
        "lacks": {"bits": 4},
    }
    for needle, config in expected.items():
        reason = workload.static_check(config, CPU)
        assert reason is not None and needle in reason, (needle, reason)
    assert workload.static_check(_config(bits=8, BLOCK_K=16), CPU) is None
    assert workload.static_check(_config(BLOCK_M=1), CPU) is None

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a GPU worker does not interpret
    assert workload.static_check(_config(precision="bf16"), H200) is None
    assert "compute capability" in (workload.static_check(_config(precision="bf16"), T4) or "")
    big = _config(bits=8, BLOCK_M=128, BLOCK_N=256, BLOCK_K=256, SPLIT_K=1, num_warps=8, num_stages=6)
    assert "shared memory" in (QuantGemm(m=128, n=256, k=256).static_check(big, H200) or "")


@pytest.mark.timeout(30)
def test_default_space_loads_and_matches_static_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from objectives.quant_gemm import PARAMS, WS_FLAGS, WS_PARAMS, QuantGemm, shared_memory_bytes
    from tuner.study.space import compile_space, load_space_file

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    raw = load_space_file(QuantGemm.space_file)
    assert raw["workloads"] == [QuantGemm.name]
    assert set(raw["params"]) == {*PARAMS, "SWAP_AB", "kernel", "PREFETCH", "TMA", "SPAN_DOT", "STREAM", *WS_PARAMS,
                                  *WS_FLAGS}  # fmt: skip
    space = compile_space(raw)
    assert len(space.seeds) == len(raw["seeds"])  # every seed is a point of the space
    device = H200.to_dict()
    workload = QuantGemm(m=16, n=8192, k=8192)
    for seed in space.seeds:
        assert workload.static_check(seed, H200) is None, seed
        assert space.static_violation(seed, device) is None, seed
    # The YAML shared-memory rule and shared_memory_bytes() agree on every point of the tiled kernel.
    # (num_stages 2-6 keeps the grid the size it had before the packed kernel's one-stage tiles joined it).
    # STREAM (packed only, so inactive here) and its rule are left out: it would quadruple the grid's bound.
    params = {**{p: v for p, v in raw["params"].items() if p != "STREAM"},
              "kernel": {"type": "categorical", "choices": ["tiled"]},
              "num_stages": {"type": "int", "low": 2, "high": 6}}  # fmt: skip
    tiled = {**raw, "params": params, "rules": [r for r in raw["rules"] if "STREAM" not in r["expr"]], "seeds": []}
    rule = next(r for r in space.rules if r.name == "shared_memory")
    for config in compile_space(tiled).grid(limit=3_000_000)[::13]:  # bound 2.7M (packed knobs counted), 202,500 points
        assert bool(rule.expression.evaluate(config, device)) == (shared_memory_bytes(config) <= 232448), config


@pytest.mark.timeout(30)
def test_benchmark_specs_load_and_keep_matching_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.quant_gemm_study import TARGETS, make_spec
    from tuner.study.spec import load_spec

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert sorted(TARGETS.values()) == [(m, bits) for m in (1, 16, 64) for bits in (4, 8)]
    for m, bits in TARGETS.values():
        compiled = load_spec(make_spec(m, bits, trials=30, minutes=1.0, seed=0))
        assert compiled.space.params["bits"].choices == (bits,)
        assert compiled.space.params["BLOCK_M"].choices == {1: (1, 16), 16: (16,), 64: (16, 32, 64)}[m]
        seeds = compiled.space.seeds
        # GEMV seeds first for a single row; none for 16 rows and more.
        assert (seeds[0]["BLOCK_M"] == 1) == (m == 1) and (m == 1 or all(s["BLOCK_M"] > 1 for s in seeds))
        assert seeds and all(s["bits"] == bits and s["precision"] == "bf16" for s in seeds)
        workload = compiled.workload_cls(**compiled.spec.args)
        assert all(workload.static_check(s, H200) is None for s in seeds)


@pytest.mark.timeout(10)
def test_work_and_exports() -> None:
    from objectives.quant_gemm import QuantGemm

    workload = QuantGemm(m=16, n=8192, k=8192)
    config = _config(bits=4, group_size=128, precision="bf16", BLOCK_K=128, SPLIT_K=2)
    flops, moved, precision = workload.work(config)
    assert flops == 2 * 16 * 8192 * 8192 and precision == "bf16"
    assert moved == 16 * 8192 * 2 + 8192 * 8192 // 2 + 64 * 8192 * 2 + 16 * 8192 * 2
    assert workload.work({**config, "bits": 8})[1] == moved + 8192 * 8192 // 2
    exported = workload.export_config(config)
    assert json.loads(json.dumps(exported)) == exported
    assert exported["kwargs"] == {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 2}
    assert (exported["num_warps"], exported["num_stages"], exported["bits"]) == (4, 2, 4)
    source = workload.export_python(config)
    compile(source, "<export>", "exec")
    assert "triton.Config" in source and "'group_size': 128" in source


@pytest.mark.timeout(30)
def test_ws_kernel_is_refused_off_hopper_checked_by_its_rules_and_exported_as_kwargs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``kernel: ws`` (the Gluon kernel): refused on a CPU and before sm_90 naming the device, its tile rules
    (kernels/quant/quant_ws_rules.py) applied on an H200, BLOCK_M 1 run as its 8-row tile, and the export the launcher's
    keyword arguments (a runnable Python snippet, not a triton.Config)."""
    from objectives.quant_gemm import QuantGemm
    from tuner.workloads.base import DeviceInfo

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    workload = QuantGemm(m=1, n=4096, k=14336)
    ws = {"kernel": "ws", "bits": 4, "group_size": 128, "precision": "bf16", "BLOCK_M": 1, "BLOCK_N": 256,
          "num_stages": 2, "PROGRAMS_PER_SM": 2, "SCALE_ACC": 1, "SWIZZLE": 1, "SLICE_WAIT": 1}  # fmt: skip
    assert workload.static_check(ws, H200) is None
    cpu = DeviceInfo(kind="cpu", name="cpu")
    assert "Hopper" in (workload.static_check(ws, cpu) or "") and "cpu" in workload.static_check(ws, cpu)
    assert "T4" in (workload.static_check(ws, T4) or "")
    assert "BLOCK_N" in (workload.static_check({**ws, "BLOCK_N": 32}, H200) or "")
    assert "BLOCK_M" in (workload.static_check({**ws, "BLOCK_M": 128}, H200) or "")
    assert "NUM_STAGES" in (workload.static_check({**ws, "num_stages": 1}, H200) or "")
    assert "shared memory" in (workload.static_check({**ws, "num_stages": 6, "PROGRAMS_PER_SM": 3}, H200) or "")
    assert "PROGRAMS_PER_SM" in (workload.static_check({k: v for k, v in ws.items() if k != "PROGRAMS_PER_SM"},
                                                       H200) or "")  # fmt: skip
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "Hopper" in (workload.static_check(ws, H200) or "")  # Gluon has no interpreter
    exported = workload.export_config(ws)
    assert exported["function"] == "kernels.quant.quant_gemm_ws.ws_quant_matmul"
    assert exported["kwargs"] == {"BLOCK_M": 8, "BLOCK_N": 256, "NUM_STAGES": 2, "PROGRAMS_PER_SM": 2,
                                  "LOADER_REGS": 40, "SCALE_ACC": 1, "SWIZZLE": 1, "SLICE_WAIT": 1}  # fmt: skip
    assert workload.export_config({**ws, "PROGRAMS_PER_SM": 3})["kwargs"]["LOADER_REGS"] == 24
    namespace: dict = {}
    exec(workload.export_python(ws), namespace)  # the export is meant to be pasted and run
    assert namespace["kwargs"] == exported["kwargs"] and namespace["quantization"]["bits"] == 4
    from kernels.quant.quant_ws_rules import check_config

    assert check_config(1, 4096, 14336, 4, 128, **namespace["kwargs"]) is None


@pytest.mark.timeout(10)
def test_registered() -> None:
    from objectives.quant_gemm import QuantGemm
    from tuner.workloads.registry import workload_class

    assert workload_class("quant_gemm") is QuantGemm


# --------------------------------------------------------------------------- the workload, end to end


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bits", [4, 8])
def test_run_on_cpu_returns_ok_with_all_metrics(interpreter: None, bits: int) -> None:
    from objectives.quant_gemm import TOLERANCE_VS_UNQUANTIZED, QuantGemm

    workload = QuantGemm(**ARGS, seed=3)
    config = _config(bits=bits, group_size=32, BLOCK_K=64, SPLIT_K=2)  # several groups per tile, split-K
    workload.prepare(config, CPU)  # a no-op on CPU
    result = workload.run(config, CPU, TrialContext(trial_number=0))
    assert result.status == TrialStatus.OK, result.error
    assert set(result.metrics) == {m.name for m in QuantGemm.metrics}
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert result.metrics["tflops"] > 0 and result.metrics["latency_ms"] > 0
    assert result.metrics["weight_bytes"] == 256 * 48 * bits // 8 + 8 * 48 * 2
    # The quantization error is there (int4 > int8) and within the bit width's tolerance.
    assert (0.05 if bits == 4 else 1e-3) < result.metrics["max_rel_error"] <= TOLERANCE_VS_UNQUANTIZED[bits]
    assert 0 <= result.extra["dequant_rel_error"] <= 1e-3
    assert result.timing_comparable is False and result.extra["weight_copies"] == 1
    assert len(result.samples_ms) == 3 and all(s > 0 for s in result.samples_ms)
    cached = workload._cases[(bits, 32, "fp16", "cpu", "tiled")]
    assert workload.run(_config(bits=bits, group_size=32, BLOCK_K=32), CPU, TrialContext(trial_number=1)).ok
    assert workload._cases[(bits, 32, "fp16", "cpu", "tiled")] is cached


@pytest.mark.timeout(300)
@pytest.mark.parametrize("bits", [4, 8])
def test_packed_kernel_runs_as_a_variant_with_the_same_checks(interpreter: None, bits: int) -> None:
    """``kernel: packed`` (GEMV and tensor-core tiles, split-K in the kernel) passes both numerics checks on
    the same operands as the tiled kernel, refuses tiles it cannot run, and exports its function."""
    from objectives.quant_gemm import QuantGemm

    workload = QuantGemm(m=3, n=48, k=256, seed=3)  # the GEMV runs one program per row: few rows
    base = {"kernel": "packed", "bits": bits, "group_size": 64, "precision": "fp16", "BLOCK_N": 32,
            "num_warps": 4, "num_stages": 1, "PREFETCH": 1}  # fmt: skip
    for tile in ({"BLOCK_M": 1, "SPLIT_K": 2}, {"BLOCK_M": 16, "SPLIT_K": 1},
                 {"BLOCK_M": 16, "SPLIT_K": 2, "TMA": 1, "SWAP_AB": 1, "num_stages": 3},
                 {"BLOCK_M": 16, "SPLIT_K": 1, "TMA": 1, "SWAP_AB": 1, "SPAN_DOT": 1, "num_stages": 3},
                 {"BLOCK_M": 1, "SPLIT_K": 1, "num_stages": 3, "PREFETCH": 0, "STREAM": 2},
                 {"BLOCK_M": 16, "SPLIT_K": 1, "TMA": 1, "SWAP_AB": 1, "num_stages": 3, "STREAM": 3}):  # fmt: skip
        result = workload.run({**base, **tile}, CPU, TrialContext(trial_number=0))
        assert result.status == TrialStatus.OK, result.error
        assert 0 <= result.extra["dequant_rel_error"] <= 1e-3
    assert "BLOCK_M must be 1" in (workload.static_check({**base, "BLOCK_M": 8, "SPLIT_K": 1}, H200) or "")
    assert "span" in (workload.static_check({**base, "BLOCK_M": 1, "SPLIT_K": 8}, H200) or "")
    assert "SWAP_AB applies" in (workload.static_check({**base, "BLOCK_M": 1, "SPLIT_K": 1, "SWAP_AB": 1}, H200) or "")
    assert "Hopper" in (workload.static_check({**base, "BLOCK_M": 16, "SPLIT_K": 1, "TMA": 1}, T4) or "")
    assert "multiple of 4" in (QuantGemm(m=3, n=46, k=256).static_check({**base, "BLOCK_M": 1, "SPLIT_K": 1, "TMA": 1},
                                                                        H200) or "")  # fmt: skip
    assert "SPLIT_K must be 1" in (workload.static_check({**base, "BLOCK_M": 1, "SPLIT_K": 2, "STREAM": 2}, H200) or "")
    assert "STREAM" in (workload.static_check({**base, "BLOCK_M": 1, "SPLIT_K": 1, "STREAM": -1}, H200) or "")
    swapped = workload.export_config({**base, "BLOCK_M": 16, "SPLIT_K": 2, "TMA": 1, "SWAP_AB": 1})
    assert swapped["kwargs"] == {"BLOCK_M": 16, "BLOCK_N": 32, "SPLIT_K": 2, "PREFETCH": 1, "TMA": 1, "SWAP": 1,
                                 "STREAM": 0}  # fmt: skip
    streamed = workload.export_config({**base, "BLOCK_M": 16, "SPLIT_K": 1, "TMA": 1, "SWAP_AB": 1, "STREAM": 2})
    assert streamed["kwargs"]["STREAM"] == 2 and streamed["kwargs"]["SPLIT_K"] == 1
    wide = workload.export_config({**base, "BLOCK_M": 16, "SPLIT_K": 2, "TMA": 1, "SWAP_AB": 1, "SPAN_DOT": 2})
    assert wide["kwargs"]["SWAP"] == 3
    unswapped = {**base, "BLOCK_M": 16, "SPLIT_K": 1, "SPAN_DOT": 1}
    assert "SPAN_DOT applies" in (workload.static_check(unswapped, H200) or "")
    # TMA 2: X's span slices by tensor copies too, for span-wide swapped tiles with a scale row per span
    x_tma = {**base, "group_size": 128, "BLOCK_M": 16, "SPLIT_K": 1, "TMA": 2, "SWAP_AB": 1, "SPAN_DOT": 2,
             "num_stages": 3}  # fmt: skip
    result = workload.run(x_tma, CPU, TrialContext(trial_number=0))
    assert result.status == TrialStatus.OK and result.extra["dequant_rel_error"] <= 1e-3, result.error
    assert workload.export_config(x_tma)["kwargs"]["TMA"] == 2
    assert "span-wide swapped" in (workload.static_check({**x_tma, "SPAN_DOT": 0}, H200) or "")
    assert "span-wide swapped" in (workload.static_check({**x_tma, "group_size": 32}, H200) or "")
    assert "TMA must be 0, 1" in (workload.static_check({**x_tma, "TMA": 3}, H200) or "")
    exported = workload.export_config({**base, "BLOCK_M": 1, "SPLIT_K": 2})
    assert exported["function"] == "kernels.quant.quant_gemm_packed.packed_matmul"
    assert exported["kwargs"] == {"BLOCK_M": 1, "BLOCK_N": 32, "SPLIT_K": 2, "PREFETCH": 1, "TMA": 0, "SWAP": 0,
                                  "STREAM": 0}  # fmt: skip
    assert "packed_matmul" in workload.export_python({**base, "BLOCK_M": 1, "SPLIT_K": 2})


@pytest.mark.timeout(30)
def test_run_refuses_statically_infeasible_configs_without_computing() -> None:
    from objectives.quant_gemm import QuantGemm

    workload = QuantGemm(**ARGS)
    for config in (_config(precision="bf16"), _config(BLOCK_K=16)):
        result = workload.run(config, CPU, TrialContext())
        assert result.status == TrialStatus.INFEASIBLE_STATIC and result.error
    assert not workload._cases


@pytest.mark.timeout(60)
def test_wrong_results_are_numerics_fail(interpreter: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from objectives.quant_gemm import QuantGemm

    real_launch = QuantGemm._launch
    config = _config(bits=8, group_size=128, BLOCK_K=64)

    def writes_nothing(self, config, case):
        pass

    def zeros(self, config, case):
        case.out.zero_()

    def off_by_one_percent(self, config, case):
        # Within the int8 quantization tolerance: only the check against the dequantized product catches it.
        real_launch(self, config, case)
        case.out.mul_(1.01)

    expected = {writes_nothing: "NaN", zeros: "exceeds the int8", off_by_one_percent: "the kernel"}
    for fake, message in expected.items():
        monkeypatch.setattr(QuantGemm, "_launch", fake)
        result = QuantGemm(**ARGS).run(config, CPU, TrialContext())
        assert result.status == TrialStatus.NUMERICS_FAIL, fake.__name__
        assert message in (result.error or ""), result.error
        assert "max_rel_error" in result.metrics and not result.samples_ms
    monkeypatch.setattr(QuantGemm, "_launch", real_launch)
    assert QuantGemm(**ARGS).run(config, CPU, TrialContext()).ok


@pytest.mark.timeout(60)
def test_launches_rotate_over_weight_copies(interpreter: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import objectives.quant_gemm as quant_gemm
    from kernels.gemm.gemm import max_rel_error

    monkeypatch.setattr(quant_gemm, "timing_comparable", lambda device: True)  # as on a GPU
    workload = quant_gemm.QuantGemm(**ARGS)
    case = workload._case({"bits": 4, "group_size": 64, "precision": "fp16"}, CPU)
    assert len(case.weights) == quant_gemm.MAX_WEIGHT_COPIES  # tiny weights: the cap
    first = case.weights[0]
    for copy in case.weights[1:]:
        assert copy.qweight.data_ptr() != first.qweight.data_ptr()
        assert torch.equal(copy.qweight, first.qweight) and torch.equal(copy.scales, first.scales)
    config = _config(group_size=64)
    for turn in range(3):
        assert case.next_copy == turn
        case.out.fill_(float("nan"))
        workload._launch(config, case)
        assert max_rel_error(case.out, case.dequant_ref) <= 1e-3


@pytest.mark.timeout(30)
def test_compile_failures_become_statuses(monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime.errors import OutOfResources

    import kernels.quant.quant_gemm
    import objectives.quant_gemm as quant_gemm

    class CompilationError(Exception):  # matched by name, like triton.compiler.errors.CompilationError
        pass

    config = _config()

    def raise_oor(*args, **kwargs):
        raise OutOfResources(245760, 232448, "shared memory")

    def raise_compile(*args, **kwargs):
        raise CompilationError("at 12:8: unsupported layout")

    for fake, status in ((raise_oor, TrialStatus.OUT_OF_RESOURCES), (raise_compile, TrialStatus.COMPILE_ERROR)):
        monkeypatch.setattr(kernels.quant.quant_gemm, "quant_matmul", fake)
        result = quant_gemm.QuantGemm(**ARGS).run(config, CPU, TrialContext())
        assert result.status == status and result.error

    # prepare() on a GPU keeps the failure; run() reports it without launching.
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # as on a GPU (the kernels stay interpreted)
    monkeypatch.setattr(kernels.quant.quant_gemm, "compile_only", raise_oor)
    workload = quant_gemm.QuantGemm(**ARGS)
    workload.prepare(config, H200)
    result = workload.run(config, H200, TrialContext())
    assert result.status == TrialStatus.OUT_OF_RESOURCES and "shared memory" in (result.error or "")
    assert not workload._cases


# --------------------------------------------------------------------------- on a GPU


def gpu_test(fn):
    """Mark a test GPU-only: compiled kernels (not the interpreter) on a CUDA device (checked by ``_cuda``)."""
    marks = (
        pytest.mark.gpu,
        pytest.mark.timeout(600),
        pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiled kernels, not the interpreter"),
    )
    for mark in marks:
        fn = mark(fn)
    return fn


def _cuda() -> DeviceInfo:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tuner.workloads.fingerprint import device_info

    return device_info()


@gpu_test
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shape", [(1, 4096, 4096), (37, 1000, 1024)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(
    "tile",
    [
        {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4},
        {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2},
        {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3, "SWAP_AB": 1},
        {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2, "SWAP_AB": 1},
    ],
    ids=["splitk-scale-after-dot", "dequant-in-tile", "swapped-splitk", "swapped-dequant-in-tile"],
)
def test_numerics_on_gpu(precision: str, bits: int, shape: tuple[int, int, int], tile: dict) -> None:
    from objectives.quant_gemm import TOLERANCE_VS_DEQUANTIZED, TOLERANCE_VS_UNQUANTIZED, QuantGemm

    device = _cuda()
    workload = QuantGemm(m=shape[0], n=shape[1], k=shape[2])
    config = {"bits": bits, "group_size": 128, "precision": precision, **tile}
    assert workload.static_check(config, device) is None
    workload.prepare(config, device)
    assert not workload._prepare_failures
    result = workload.run(config, device, TrialContext())
    assert result.status == TrialStatus.OK, result.error
    assert result.timing_comparable and result.extra["timing"]["mode"] == "cuda_graph"
    assert result.extra["weight_copies"] > 1
    assert result.metrics["max_rel_error"] <= TOLERANCE_VS_UNQUANTIZED[bits]
    assert result.extra["dequant_rel_error"] <= TOLERANCE_VS_DEQUANTIZED[precision] / 2
    assert result.metrics["tflops"] > 0 and len(result.samples_ms) >= 10


@gpu_test
@pytest.mark.parametrize("bits", [4, 8])
def test_seeds_run_on_gpu_at_the_benchmark_shape(bits: int) -> None:
    from objectives.quant_gemm import QuantGemm
    from tuner.study.space import compile_space, load_space_file

    device = _cuda()
    workload = QuantGemm(m=16, n=8192, k=8192)
    seeds = [s for s in compile_space(load_space_file("quant_gemm.yaml")).seeds if s["bits"] == bits]
    for seed in seeds:
        workload.prepare(seed, device)
        result = workload.run(seed, device, TrialContext())
        assert result.status == TrialStatus.OK, (seed, result.error)
        print(seed, f"{result.metrics['latency_ms'] * 1e3:.1f} us", f"{result.metrics['tflops']:.1f} TFLOP/s")


@gpu_test
def test_compile_only_reports_out_of_shared_memory_on_gpu() -> None:
    _cuda()
    from triton.runtime.errors import OutOfResources

    from kernels.quant.quant_gemm import compile_only

    tile = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 8, "num_stages": 6}
    with pytest.raises(OutOfResources):
        compile_only(128, 4096, 4096, precision="bf16", bits=8, group_size=128, **tile)
