"""The packed weight-only GEMM (kernels/quant/quant_gemm_packed.py): layout round trips, numerics under the
interpreter at ragged shapes (GEMV and tensor-core paths, split-K reduced in the kernel), argument
checks, and ahead-of-time sm_90 compiles (inline-PTX decode included) in a child process."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from conftest import compiled_gpu

from kernels.quant.quant_gemm import quantize_weights
from kernels.quant.quant_gemm_packed import (
    PackedWeights,
    pack_weights,
    packed_matmul,
    quantize_packed,
    repack,
    scratch,
    span,
    unpack_weights,
)

_PASTE_SCRIPT = """
import ast, importlib, json
from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code as closure
for name in ("quant_gemm_packed.packed_quant_kernel", "quant_gemm.quant_matmul_kernel", "quant_gemm.quant_gemv_kernel"):
    module, kernel = name.rsplit(".", 1)
    source = closure(getattr(importlib.import_module("kernels.quant." + module), kernel))
    pasted = ast.literal_eval("'''" + source.replace("'''", "\\\\'\\\\'\\\\'") + "'''")  # as torch 2.11 pastes it
    try:
        ast.parse(pasted)
        error = None
    except SyntaxError as exc:
        error = f"{exc.msg} at line {exc.lineno}: {pasted.splitlines()[exc.lineno - 1].strip()}"
    print(json.dumps({"kernel": name, "error": error}), flush=True)
"""


@pytest.mark.timeout(120)
def test_kernel_sources_survive_torch_compile_re_emitting_them(aot_child: Any) -> None:
    """``compile: default`` decode steps run these kernels under torch.compile, which pastes a user kernel's
    source (and the helpers it calls) into a generated module inside a ``'''`` string. torch 2.11 pastes
    it unescaped, so a backslash escape in the source (an inline-PTX string with ``\\n``) became a newline
    inside a one-line literal and every compiled int4 trial failed with a SyntaxError. In a child process:
    under the interpreter the kernels are not JIT functions with a source to paste."""
    results = aot_child(_PASTE_SCRIPT, timeout=100)
    assert [r["kernel"] for r in results] == [
        "quant_gemm_packed.packed_quant_kernel", "quant_gemm.quant_matmul_kernel", "quant_gemm.quant_gemv_kernel"
    ]  # fmt: skip
    assert [r for r in results if r["error"]] == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bits", [4, 8])
def test_layout_puts_slot_i_of_word_j_at_k_row_16i_plus_j(bits: int) -> None:
    """Word [16 s + j, n], slot i, holds q[SPAN s + 16 i + j, n] + offset; pack and unpack are inverse."""
    gen = torch.Generator().manual_seed(bits)
    qmax = 7 if bits == 4 else 127
    k, n = 2 * span(bits), 5
    q = torch.randint(-qmax, qmax + 1, (k, n), generator=gen, dtype=torch.int8)
    words = pack_weights(q, bits)
    assert words.dtype == torch.int32 and tuple(words.shape) == (k * bits // 32, n)
    offset = 8 if bits == 4 else 128
    for s, i, j, col in ((0, 0, 0, 0), (1, 3, 7, 2), (0, 32 // bits - 1, 15, 4), (1, 1, 15, 1)):
        word = int(words[16 * s + j, col]) & 0xFFFFFFFF
        stored = (word >> (bits * i)) & ((1 << bits) - 1)
        assert stored == int(q[span(bits) * s + 16 * i + j, col]) + offset
    assert torch.equal(unpack_weights(words, bits), q)


@pytest.mark.timeout(10)
def test_the_workload_knows_the_layout_without_importing_the_kernel() -> None:
    from kernels.quant.quant_gemm_packed import DOT_MIN_M
    from objectives.quant_gemm import PACKED_DOT_MIN_M, PACKED_SPAN

    assert PACKED_SPAN == {bits: span(bits) for bits in (4, 8)} and PACKED_DOT_MIN_M == DOT_MIN_M


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bits", [4, 8])
def test_repack_keeps_the_values_and_scales_of_the_tiled_layout(bits: int) -> None:
    w = torch.randn(256, 24, generator=torch.Generator().manual_seed(1))
    tiled = quantize_weights(w, bits, 64, torch.float16)
    packed = repack(tiled.qweight, tiled.scales, bits, 64)
    assert torch.equal(packed.values(), tiled.values())
    assert torch.equal(packed.dequantize(), tiled.dequantize())
    direct = quantize_packed(w, bits, 64, torch.float16)
    assert torch.equal(direct.qweight, packed.qweight) and torch.equal(direct.scales, tiled.scales)
    assert direct.nbytes == packed.qweight.numel() * 4 + tiled.scales.numel() * 2


def _operands(
    m: int, k: int, n: int, bits: int, group: int, seed: int
) -> tuple[PackedWeights, torch.Tensor, torch.Tensor]:
    """Packed fp16 weights (K, N), X (M, K) fp16 and the fp32 product of X with the dequantized weights."""
    gen = torch.Generator().manual_seed(seed)
    weights = quantize_packed(torch.randn(k, n, generator=gen), bits, group, torch.float16)
    x = torch.randn(m, k, generator=gen).to(torch.float16)
    return weights, x, x.float() @ weights.dequantize()


def _relative_error(y: torch.Tensor, reference: torch.Tensor) -> float:
    return float((y.float() - reference).abs().max() / reference.abs().max())


#: (M, BLOCK_M, BLOCK_N, SPLIT_K, group): GEMV and tensor-core paths, ragged M and N, one and several groups
#: per span (group 32 < the span), groups spanning several spans (256), split-K reduced in the kernel.
CASES = [
    (1, 1, 32, 1, 128),
    (3, 1, 16, 2, 64),
    (2, 1, 32, 4, 32),
    (17, 16, 32, 2, 128),
    (20, 16, 16, 1, 16),
    (33, 32, 32, 2, 256),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-bm{c[1]}-bn{c[2]}-sk{c[3]}-g{c[4]}" for c in CASES])
def test_kernel_matches_dequantized_reference(interpreter: None, bits: int, case: tuple[int, ...]) -> None:
    m, block_m, block_n, split_k, group = case
    k, n = 512, 40  # N ragged against every BLOCK_N
    weights, x, reference = _operands(m, k, n, bits, group, seed=m * 7 + bits)
    config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "SPLIT_K": split_k, "num_warps": 4}
    y = packed_matmul(x, weights, **config)
    assert y.dtype == torch.float16 and tuple(y.shape) == (m, n)
    error = _relative_error(y, reference)
    assert error < 2e-3, error
    # Split-K leaves its scratch zeroed, so a second call (no zeroing kernel in between) is exact again; PDL (a
    # launch option and a wait of compiled kernels) changes nothing the interpreter runs.
    again = packed_matmul(x, weights, **config, PREFETCH=0, PDL=1)
    assert torch.equal(again, y)
    workspace, counters = scratch(x.device, 1, 1)
    assert not workspace.any() and not counters.any()


#: (M, BLOCK_M, BLOCK_N, SPLIT_K, group, TMA, SWAP): the words by tensor descriptor on both paths, and the
#: transposed tensor-core product (weights as the A operand) with one and several groups per span, split-K;
#: SWAP 2 multiplies a whole span at once, SWAP 3 also folds the scales into the weights (several groups per
#: span: 16-row slices, as SWAP 1); TMA 2 reads X's span slices by tensor copies too (rows past M read zeros).
VARIANT_CASES = [
    (1, 1, 32, 2, 128, 1, 0),
    (20, 16, 32, 2, 128, 1, 0),
    (17, 16, 32, 2, 128, 1, 1),
    (5, 16, 16, 1, 32, 0, 1),
    (64, 64, 32, 1, 128, 1, 1),
    (37, 32, 32, 2, 128, 1, 2),
    (16, 16, 64, 1, 256, 0, 2),
    (9, 16, 32, 2, 32, 1, 2),
    (64, 64, 32, 2, 128, 1, 3),
    (21, 16, 16, 1, 32, 1, 3),
    (37, 32, 32, 2, 128, 2, 2),
    (20, 16, 16, 1, 128, 2, 3),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(
    "case", VARIANT_CASES, ids=[f"m{c[0]}-bm{c[1]}-bn{c[2]}-sk{c[3]}-g{c[4]}-tma{c[5]}-sw{c[6]}" for c in VARIANT_CASES]
)
def test_tma_and_swapped_variants_match_the_reference(interpreter: None, bits: int, case: tuple[int, ...]) -> None:
    """``TMA`` (words by bulk tensor copies; columns past N read as zeros) and ``SWAP`` (Y's tile computed
    transposed and stored back) give the dequantized product at ragged M and N, split-K included."""
    m, block_m, block_n, split_k, group, tma, swap = case
    k, n = 512, 40
    weights, x, reference = _operands(m, k, n, bits, group, seed=m * 11 + bits)
    y = packed_matmul(x, weights, BLOCK_M=block_m, BLOCK_N=block_n, SPLIT_K=split_k, num_warps=4, num_stages=3,
                      TMA=tma, SWAP=swap)  # fmt: skip
    assert tuple(y.shape) == (m, n)
    error = _relative_error(y, reference)
    assert error < 2e-3, error


#: (M, BLOCK_M, BLOCK_N, programs per SM, group, TMA, SWAP): the streamed grid (8 "SMs" under the interpreter),
#: where shares start and end inside tiles (a tile summed from 2-3 programs, or written by one) on the GEMV and
#: tensor-core paths, swapped, with several groups per span; more programs than tiles' spans included.
STREAM_CASES = [
    (1, 1, 16, 1, 128, 0, 0),
    (3, 1, 32, 2, 64, 1, 0),
    (17, 16, 32, 1, 128, 1, 1),
    (20, 16, 16, 3, 32, 0, 0),
    (37, 32, 32, 2, 128, 1, 2),
    (64, 64, 32, 1, 128, 1, 3),
    (2, 1, 16, 8, 128, 0, 0),
    (37, 32, 32, 2, 128, 2, 3),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(
    "case", STREAM_CASES, ids=[f"m{c[0]}-bm{c[1]}-bn{c[2]}-st{c[3]}-g{c[4]}-tma{c[5]}-sw{c[6]}" for c in STREAM_CASES]
)
def test_streamed_shares_match_the_reference(interpreter: None, bits: int, case: tuple[int, ...]) -> None:
    """``STREAM``: each program takes an equal run of (tile, span) steps, so tiles are cut between programs at any
    span; the partial sums meet in the kernel and the scratch is left zeroed."""
    m, block_m, block_n, stream, group, tma, swap = case
    k, n = 768, 40  # 6 int4 or 12 int8 spans per tile: shares of 8 * stream programs end inside tiles
    weights, x, reference = _operands(m, k, n, bits, group, seed=m * 13 + bits + stream)
    tile = {"BLOCK_M": block_m, "BLOCK_N": block_n, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}
    y = packed_matmul(x, weights, **tile, PREFETCH=0, TMA=tma, SWAP=swap, STREAM=stream)
    error = _relative_error(y, reference)
    assert error < 2e-3, error
    workspace, counters = scratch(x.device, 1, 1)
    assert not workspace.any() and not counters.any()
    assert torch.equal(packed_matmul(x, weights, **tile, PREFETCH=0, TMA=tma, SWAP=swap, STREAM=stream), y)


#: (M, BLOCK_M, BLOCK_N, SPLIT_K, group, SWAP): split-K tiles whose partials are left unsummed, GEMV and tensor-core
#: paths, swapped, ragged M and N, a span holding several groups.
PARTIAL_CASES = [(1, 1, 32, 4, 128, 0), (3, 1, 16, 2, 32, 0), (17, 16, 32, 2, 128, 0), (20, 16, 16, 4, 128, 2)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(
    "case", PARTIAL_CASES, ids=[f"m{c[0]}-bm{c[1]}-bn{c[2]}-sk{c[3]}-g{c[4]}-sw{c[5]}" for c in PARTIAL_CASES]
)
def test_partials_sum_to_the_product(interpreter: None, bits: int, case: tuple[int, ...]) -> None:
    """``PARTIALS``: one fp32 partial product per K split, each the product over its own K rows, summing to Y; the
    split-K scratch is not touched."""
    m, block_m, block_n, split_k, group, swap = case
    k, n = 512, 40
    weights, x, reference = _operands(m, k, n, bits, group, seed=m * 5 + bits + split_k)
    tile = {"BLOCK_M": block_m, "BLOCK_N": block_n, "SPLIT_K": split_k, "num_warps": 4, "PREFETCH": 0, "SWAP": swap}
    out = torch.full((split_k, m, n), float("nan"))
    partials = packed_matmul(x, weights, **tile, PARTIALS=1, out=out)
    assert partials is out and partials.dtype == torch.float32 and not partials.isnan().any()
    assert _relative_error(partials.sum(0), reference) < 1e-4
    dequantized, rows = weights.dequantize(), k // split_k
    first = x[:, :rows].float() @ dequantized[:rows]  # split 0: the first K / SPLIT_K rows only
    assert _relative_error(partials[0], first) < 1e-4
    assert _relative_error(packed_matmul(x, weights, **tile), reference) < 2e-3
    workspace, counters = scratch(x.device, 1, 1)
    assert not workspace.any() and not counters.any()
    with pytest.raises(ValueError, match=rf"out must be contiguous \(2, {m}, 40\) torch.float32"):
        packed_matmul(x, weights, **{**tile, "SPLIT_K": 2}, PARTIALS=1, out=torch.empty(m, 40))
    with pytest.raises(ValueError, match="PARTIALS stores one partial per K split"):
        packed_matmul(x, weights, **{**tile, "SPLIT_K": 1}, STREAM=2, PARTIALS=1)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("case", [PARTIAL_CASES[1], PARTIAL_CASES[3]], ids=["gemv", "swapped"])
def test_16bit_partials_are_the_fp32_ones_rounded_once(interpreter: None, bits: int, case: tuple[int, ...]) -> None:
    """``PARTIALS=2``: each split's partial product stored in X's dtype, the fp32 partial of ``PARTIALS=1`` rounded
    once to it (the same accumulation, bit for bit), whose fp32 sum is Y within X's rounding."""
    m, block_m, block_n, split_k, group, swap = case
    k, n = 512, 40
    weights, x, reference = _operands(m, k, n, bits, group, seed=m * 7 + bits)
    tile = {"BLOCK_M": block_m, "BLOCK_N": block_n, "SPLIT_K": split_k, "num_warps": 4, "PREFETCH": 0, "SWAP": swap}
    wide = packed_matmul(x, weights, **tile, PARTIALS=1)
    half = packed_matmul(x, weights, **tile, PARTIALS=2)
    assert half.dtype == x.dtype and tuple(half.shape) == (split_k, m, n)
    assert torch.equal(half, wide.to(x.dtype))
    assert _relative_error(half.sum(0, dtype=torch.float32), reference) < 2e-3
    with pytest.raises(ValueError, match=rf"out must be contiguous \({split_k}, {m}, 40\) torch.float16"):
        packed_matmul(x, weights, **tile, PARTIALS=2, out=wide)
    with pytest.raises(ValueError, match="PARTIALS must be 0"):
        packed_matmul(x, weights, **tile, PARTIALS=3)


#: (M, BLOCK_M, BLOCK_N, SPLIT_K, STREAM, SWAP): the activation where Y is stored straight (one split), by the last
#: of a tile's splits, and by the last program of a streamed share; GEMV and tensor-core paths, swapped.
ACT_CASES = [(1, 1, 32, 1, 0, 0), (3, 1, 16, 4, 0, 0), (17, 16, 32, 2, 0, 2), (5, 16, 16, 1, 2, 0)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", ACT_CASES, ids=[f"m{c[0]}-bm{c[1]}-sk{c[3]}-st{c[4]}-sw{c[5]}" for c in ACT_CASES])
def test_epilogue_activation_stores_gelu_of_the_sum(interpreter: None, case: tuple[int, ...]) -> None:
    """``ACT=1``: Y is GELU (tanh approximation) of the product, applied once to the fp32 sum in every store path
    (one split, the last of a tile's splits, a streamed share's last program), against ``F.gelu`` of the fp32
    product; refused with ``PARTIALS``, whose sum is the caller's."""
    m, block_m, block_n, split_k, stream, swap = case
    weights, x, reference = _operands(m, 512, 40, 4, 128, seed=m + split_k + stream)
    tile = {"BLOCK_M": block_m, "BLOCK_N": block_n, "SPLIT_K": split_k, "num_warps": 4, "PREFETCH": 0,
            "SWAP": swap, "STREAM": stream}  # fmt: skip
    y = packed_matmul(x, weights, **tile, ACT=1)
    want = torch.nn.functional.gelu(reference, approximate="tanh")
    assert _relative_error(y, want) < 2e-3
    assert _relative_error(y, reference) > 1e-2  # the activation did apply
    workspace, counters = scratch(x.device, 1, 1)
    assert not workspace.any() and not counters.any()
    with pytest.raises(ValueError, match="PARTIALS leaves the sum"):
        packed_matmul(x, weights, **{**tile, "STREAM": 0, "SPLIT_K": 2}, PARTIALS=1, ACT=1)
    with pytest.raises(ValueError, match="ACT"):
        packed_matmul(x, weights, **tile, ACT=2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "case", [(1, 32, 1, 128), (2, 16, 4, 256), (1, 32, 2, 64)], ids=["sk1-g128", "sk4-g256", "g64-fallback"]
)
def test_fp32_pair_decode_matches_the_reference(interpreter: None, case: tuple[int, ...]) -> None:
    """FAST_DECODE=2 (GEMV, int4: raw fp32 values q + bias, biases removed once per span) gives the product
    of the plain decode; with groups smaller than the span it falls back to the per-slice decode."""
    m, block_n, split_k, group = case
    gen = torch.Generator().manual_seed(11 + m)
    weights = quantize_packed(torch.randn(1024, 40, generator=gen), 4, group, torch.bfloat16)
    x = (torch.randn(m, 1024, generator=gen) * 4).to(torch.bfloat16)
    reference = x.float() @ weights.dequantize()
    tile = {"BLOCK_M": 1, "BLOCK_N": block_n, "SPLIT_K": split_k, "num_warps": 4, "PREFETCH": 0}
    y = packed_matmul(x, weights, **tile, FAST_DECODE=2)
    plain = packed_matmul(x, weights, **tile, FAST_DECODE=0)
    # bf16 output: its rounding (2**-9 relative) bounds both
    assert float((y.float() - reference).abs().max() / reference.abs().max()) < 8e-3
    assert float((y.float() - plain.float()).abs().max() / reference.abs().max()) < 8e-3


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", [(1, 4096, 1000), (3, 2048, 4104)], ids=["m1-n1000", "m3-n4104"])
def test_gpu_decodes_and_pipelines_agree(shape: tuple[int, int, int]) -> None:
    """On the GPU every int4 decode (fp32, inline-PTX 16-bit pairs, fp32 pairs) and pipeline (prefetch in
    registers, ``num_stages`` 1-4 through shared memory) gives the dequantized product at ragged N."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(k + n)
    weights = quantize_packed(torch.randn(k, n, generator=gen) * 0.02, 4, 128, torch.bfloat16)
    weights = type(weights)(weights.qweight.cuda(), weights.scales.cuda(), 4, 128)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).cuda()
    reference = x.float() @ weights.dequantize()
    for decode in (0, 1, 2):
        for prefetch, stages in ((1, 1), (0, 1), (0, 2), (0, 4)):
            for block_n, split_k in ((64, 4), (32, 16)):
                y = packed_matmul(x, weights, BLOCK_M=1, BLOCK_N=block_n, SPLIT_K=split_k, num_warps=4,
                                  num_stages=stages, PREFETCH=prefetch, FAST_DECODE=decode)  # fmt: skip
                error = float((y.float() - reference).abs().max() / reference.abs().max())
                assert error < 4e-3, (decode, prefetch, stages, block_n, split_k, error)
        for stream, stages in ((1, 3), (3, 4)):  # STREAM with per-thread loads (cp.async)
            y = packed_matmul(x, weights, BLOCK_M=1, BLOCK_N=64, SPLIT_K=1, num_warps=4, num_stages=stages,
                              PREFETCH=0, FAST_DECODE=decode, STREAM=stream)  # fmt: skip
            error = float((y.float() - reference).abs().max() / reference.abs().max())
            assert error < 4e-3, (decode, stream, stages, error)
    y = packed_matmul(x, weights, BLOCK_M=16, BLOCK_N=256, SPLIT_K=4, num_warps=4, num_stages=3, PREFETCH=0)
    assert float((y.float() - reference).abs().max() / reference.abs().max()) < 4e-3


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", [(1, 4096, 1000), (37, 2048, 4104), (64, 4096, 1024)], ids=["m1", "m37", "m64"])
def test_gpu_tma_and_swapped_tiles_agree(shape: tuple[int, int, int]) -> None:
    """On the GPU the TMA word loads (GEMV and tensor cores) and the swapped wgmma tiles (weights in registers
    as the A operand; X's slices by tensor copies or not) give the dequantized product at ragged M and N, int4
    and int8."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(k + n + m)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).cuda()
    for bits in (4, 8):
        weights = quantize_packed(torch.randn(k, n, generator=gen) * 0.02, bits, 128, torch.bfloat16)
        weights = type(weights)(weights.qweight.cuda(), weights.scales.cuda(), bits, 128)
        reference = x.float() @ weights.dequantize()
        tiles = [
            {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3, "SWAP": 1},
            {"BLOCK_M": 32, "BLOCK_N": 128, "SPLIT_K": 2, "num_warps": 8, "num_stages": 4, "SWAP": 1},
            {"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3, "SWAP": 1},
            {"BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 2, "num_warps": 4, "num_stages": 4, "SWAP": 2},
            {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3, "SWAP": 2},
            {"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_K": 2, "num_warps": 4, "num_stages": 4, "SWAP": 3},
            {"BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4, "SWAP": 0},
        ]
        streamed = [  # STREAM: programs per SM sharing every tile's spans (tiles summed across programs)
            {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4, "SWAP": 1, "STREAM": 1},
            {"BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 1, "num_warps": 8, "num_stages": 3, "SWAP": 2, "STREAM": 2},
            {"BLOCK_M": 32, "BLOCK_N": 64, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4, "SWAP": 3, "STREAM": 3},
        ]
        tiles += streamed
        if m == 1:
            tiles.append({"BLOCK_M": 1, "BLOCK_N": 64, "SPLIT_K": 8, "num_warps": 4, "num_stages": 4, "SWAP": 0})
            tiles.append({"BLOCK_M": 1, "BLOCK_N": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4, "STREAM": 2})
        for tile in tiles:
            for tma in (1, 2) if tile.get("SWAP", 0) >= 2 else (1,):  # TMA 2: X's span slices by tensor copies
                y = packed_matmul(x, weights, **tile, PREFETCH=0, TMA=tma)
                error = float((y.float() - reference).abs().max() / reference.abs().max())
                assert error < 4e-3, (bits, tile, tma, error)
        workspace, counters = scratch(x.device, 1, 1)
        assert not workspace.any() and not counters.any()


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", [(1, 2048, 2048), (1, 8192, 2040), (64, 2048, 6144)], ids=["m1", "m1-k8192", "m64"])
def test_gpu_partials_sum_to_the_product(shape: tuple[int, int, int]) -> None:
    """On the GPU, ``PARTIALS`` tiles (GEMV, swapped and unswapped tensor-core tiles, TMA or not) leave partial
    products, NaN-filled beforehand, that sum to the dequantized product at the decode step's shapes; with
    ``PARTIALS=2`` the same partials rounded to bf16."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(k + n + m)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).cuda()
    weights = quantize_packed(torch.randn(k, n, generator=gen) * 0.02, 4, 128, torch.bfloat16)
    weights = type(weights)(weights.qweight.cuda(), weights.scales.cuda(), 4, 128)
    reference = x.float() @ weights.dequantize()
    if m == 1:
        tiles = [{"BLOCK_M": 1, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": 4, "num_stages": 1, "PREFETCH": pf}
                 for bn, sk, pf in ((64, 16, 1), (32, 16, 0), (128, 8, 0))]  # fmt: skip
    else:
        tiles = [{"BLOCK_M": 32, "BLOCK_N": 64, "SPLIT_K": 2, "num_warps": 4, "num_stages": 3, "TMA": 1, "SWAP": 2},
                 {"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3, "TMA": 1, "SWAP": 3},
                 {"BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 2, "num_warps": 4, "num_stages": 3}]  # fmt: skip
    for tile in tiles:
        split = tile["SPLIT_K"]
        out = torch.full((split, m, n), float("nan"), device="cuda")
        partials = packed_matmul(x, weights, **tile, PARTIALS=1, out=out)
        error = float((partials.sum(0) - reference).abs().max() / reference.abs().max())
        assert error < 4e-3, (tile, error)  # SWAP=3 rounds the scaled weights to bf16
        half = packed_matmul(x, weights, **tile, PARTIALS=2, out=out.to(torch.bfloat16))
        assert half.dtype == torch.bfloat16, tile
        # each partial rounded once to bf16 (2**-9 relative; 2**-8 leaves room for another compile's fp32 order)
        assert bool(((half.float() - partials).abs() <= partials.abs() * 2**-8 + 1e-30).all()), tile


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
def test_gpu_tiles_stay_right_over_repeated_launches() -> None:
    """Every stress case (GEMV, unswapped and swapped tensor-core tiles, split-K, STREAM) is right in every one
    of 300 launches on fresh X, a third of them beside a matmul on a second stream. Before X reached the swapped
    wgmma fenced and the split-K zeros were ordered after the reads, a streamed swapped tile was wrong in 302 of
    1000 launches beside the second stream (bench/results/int4-roofline-reduce-stress-offered-h200.json)."""
    from bench.quant_reduce_stress import CASES, stress

    for case in CASES:
        result = stress(case, 300)
        assert result["wrong"] == 0, result


@pytest.mark.timeout(30)
def test_bad_operands_and_tiles_are_rejected_naming_the_argument(interpreter: None) -> None:
    weights = quantize_packed(torch.randn(256, 32), 4, 128, torch.float16)
    x = torch.randn(2, 256).to(torch.float16)
    tile = {"BLOCK_M": 1, "BLOCK_N": 32, "SPLIT_K": 1, "num_warps": 4}
    with pytest.raises(ValueError, match="BLOCK_M must be 1"):
        packed_matmul(x, weights, **{**tile, "BLOCK_M": 8})
    with pytest.raises(ValueError, match="SPLIT_K"):
        packed_matmul(x, weights, **{**tile, "SPLIT_K": 4})  # 4 * 128 does not divide 256
    with pytest.raises(ValueError, match="x must be bfloat16 or float16"):
        packed_matmul(x.float(), weights, **tile)
    with pytest.raises(ValueError, match="qweight must be int32"):
        packed_matmul(torch.randn(2, 128).to(torch.float16), weights, **tile)
    with pytest.raises(ValueError, match="group_size"):
        quantize_packed(torch.randn(256, 32), 4, 8)
    with pytest.raises(ValueError, match="multiple of 128"):
        pack_weights(torch.zeros(64, 4, dtype=torch.int8), 4)
    odd = quantize_packed(torch.randn(256, 30), 4, 128, torch.float16)
    with pytest.raises(ValueError, match="TMA needs N a multiple of 4"):
        packed_matmul(x, odd, **tile, TMA=1)
    with pytest.raises(ValueError, match="SPLIT_K must be 1"):
        packed_matmul(x, weights, **{**tile, "SPLIT_K": 2}, STREAM=1)
    wide = {**tile, "BLOCK_M": 16, "PREFETCH": 0}
    with pytest.raises(ValueError, match=r"TMA=2 .* needs SWAP >= 2"):
        packed_matmul(x, weights, **wide, TMA=2, SWAP=1)
    with pytest.raises(ValueError, match="TMA must be 0"):
        packed_matmul(x, weights, **wide, TMA=3, SWAP=2)
    with pytest.raises(ValueError, match="unit stride along K"):
        packed_matmul(x.t().contiguous().t(), weights, **wide, TMA=2, SWAP=2)


@pytest.mark.timeout(120)
def test_packed_product_hands_a_tma2_tile_a_contiguous_x(interpreter: None) -> None:
    """The quantized layers' dispatch (:func:`models.quant_tiles.packed_product`) copies an X that tensor copies
    cannot read (K not the unit stride) before a ``TMA=2`` tile, where ``packed_matmul`` itself refuses it."""
    from models.quant_tiles import packed_product

    weights, x, reference = _operands(20, 256, 32, 4, 128, seed=7)
    strided = x.t().contiguous().t()
    tile = {"BLOCK_M": 16, "BLOCK_N": 32, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2, "PREFETCH": 0, "TMA": 2,
            "SWAP": 2}  # fmt: skip
    with pytest.raises(ValueError, match="unit stride along K"):
        packed_matmul(strided, weights, **tile)
    assert _relative_error(packed_product(strided, weights, tile), reference) < 2e-3


_AOT_SCRIPT = """
import json, sys
from kernels.quant.quant_gemm_packed import compile_for_target
for job in json.loads(sys.argv[1]):
    kernel = compile_or_skip(lambda: compile_for_target(*job["shape"], **job["config"], capability=90))
    ptx = kernel.asm["ptx"]
    print(json.dumps({**job, "shared": kernel.metadata.shared, "lop3": "0x000F000F" in ptx,
                      "mma": "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else None,
                      "vector_loads": "ld.global.v4" in ptx or "cp.async" in ptx,
                      "cp_async": "cp.async.cg.shared.global" in ptx, "tma": "cp.async.bulk.tensor" in ptx,
                      "waits": ptx.count("wgmma.wait_group"), "gdc_waits": ptx.count("griddepcontrol.wait"),
                      "launch_pdl": bool(kernel.metadata.launch_pdl)}), flush=True)
"""


@pytest.mark.timeout(240)
def test_tiles_compile_for_sm90_with_the_inline_ptx_decode(aot_child: Any) -> None:
    """GEMV and tensor-core tiles compile for an H200: the int4 decode is the packed lop3 + fma PTX, the
    weights load as 16-byte vectors, M = 64 tiles use wgmma, ``num_stages`` > 1 pipelines the GEMV's weight
    loads through shared memory (one (16, BLOCK_N) word tile per stage ahead), ``STREAM``'s loop too, and shared
    memory fits; ``PDL`` waits once for the kernel before and sets the launch option."""
    base = {"precision": "bf16", "group_size": 128, "num_warps": 4}
    jobs = [
        {"shape": [1, 4096, 14336],
         "config": {**base, "bits": 4, "BLOCK_M": 1, "BLOCK_N": 64, "SPLIT_K": 8, "FAST_DECODE": 1}},
        {"shape": [1, 4096, 14336], "config": {**base, "bits": 8, "BLOCK_M": 1, "BLOCK_N": 64, "SPLIT_K": 8}},
        {"shape": [16, 4096, 14336],
         "config": {**base, "bits": 4, "BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 8, "PREFETCH": 0, "num_stages": 3}},
        {"shape": [64, 14336, 4096],
         "config": {**base, "bits": 4, "BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 2, "precision": "fp16"}},
        {"shape": [1, 14336, 4096], "config": {**base, "bits": 4, "BLOCK_M": 1, "BLOCK_N": 64, "SPLIT_K": 4,
                                               "PREFETCH": 0, "num_stages": 4}},
        {"shape": [1, 14336, 4096], "config": {**base, "bits": 4, "BLOCK_M": 1, "BLOCK_N": 64, "SPLIT_K": 4,
                                               "PREFETCH": 1, "num_stages": 1}},
        {"shape": [64, 4096, 14336], "config": {**base, "bits": 4, "BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 2,
                                                "PREFETCH": 0, "num_stages": 4, "TMA": 1, "SWAP": 1}},
        {"shape": [64, 4096, 14336], "config": {**base, "bits": 4, "BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 2,
                                                "PREFETCH": 0, "num_stages": 4, "TMA": 1, "SWAP": 2}},
        {"shape": [1, 4096, 14336], "config": {**base, "bits": 4, "BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 1,
                                               "PREFETCH": 0, "num_stages": 4, "TMA": 1, "SWAP": 1, "STREAM": 2}},
        {"shape": [64, 4096, 14336], "config": {**base, "bits": 4, "BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 2,
                                                "PREFETCH": 0, "num_stages": 4, "TMA": 2, "SWAP": 2}},
        {"shape": [8, 6144, 2048], "config": {**base, "bits": 4, "BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 8,
                                              "PREFETCH": 0, "num_stages": 3, "TMA": 2, "SWAP": 2, "PDL": 1}},
    ]  # fmt: skip
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=230)
    assert len(lines) == len(jobs), lines
    gemv4, gemv8, dot16, dot64, piped, prefetched, swapped, wide, streamed, x_tma, dependent = lines
    # PDL: a programmatic dependent launch whose programs wait once for the kernel before; none without it
    assert dependent["gdc_waits"] == 1 and dependent["launch_pdl"], dependent
    assert all(line["gdc_waits"] == 0 and not line["launch_pdl"] for line in lines[:-1]), lines
    assert gemv4["lop3"] and gemv4["mma"] is None and gemv4["vector_loads"], gemv4
    assert not gemv8["lop3"] and gemv8["vector_loads"], gemv8
    assert dot16["lop3"] and dot16["mma"] is not None, dot16
    assert dot64["lop3"] and dot64["mma"] == "wgmma", dot64
    assert piped["cp_async"] and piped["shared"] >= 3 * 16 * 64 * 4, piped  # 3 word tiles in flight
    assert not prefetched["cp_async"] and prefetched["vector_loads"], prefetched  # one span ahead, in registers
    # the words by bulk tensor copies (X by cp.async), decoded into wgmma's register A operand
    assert swapped["tma"] and swapped["mma"] == "wgmma" and swapped["lop3"], swapped
    # a whole span per product: one wgmma chain (one wait) per span instead of one per 16-row slice
    assert wide["tma"] and wide["mma"] == "wgmma" and wide["waits"] * 4 <= swapped["waits"], (wide, swapped)
    # STREAM's one loop over (tile, span) steps, with the split-K reduction inside it, is still pipelined: three
    # (16, 256) word boxes in flight (a CTA barrier in the loop as tl.debug_barrier would leave it unpipelined)
    assert streamed["tma"] and streamed["mma"] == "wgmma" and streamed["shared"] >= 3 * 16 * 256 * 4, streamed
    # TMA 2: X's span slices by tensor copies as well: no cp.async left, the wgmma reads them where they land
    assert wide["cp_async"] and x_tma["tma"] and not x_tma["cp_async"] and x_tma["mma"] == "wgmma", (wide, x_tma)
    assert all(line["shared"] <= 227 * 1024 for line in lines), lines


_STORE_SCRIPT = """
import json, re, sys
from kernels.quant.quant_gemm_packed import compile_for_target
for job in json.loads(sys.argv[1]):
    ptx = compile_or_skip(lambda: compile_for_target(*job["shape"], **job["config"], capability=90)).asm["ptx"]
    print(json.dumps({**job, "stores": re.findall(r"st\\.global[.\\w]*", ptx)}), flush=True)
"""


@pytest.mark.timeout(120)
def test_sm90_16bit_partials_store_half_the_vectors(aot_child: Any) -> None:
    """The batch-64 qkv tile of the 1B step (64 rows, swapped, X by tensor copies, 4 splits) with ``PARTIALS=2``
    stores its partial tile in 16-byte vectors as with fp32 partials, half as many of them."""
    config = {"precision": "bf16", "group_size": 128, "num_warps": 4, "bits": 4, "BLOCK_M": 64, "BLOCK_N": 64,
              "SPLIT_K": 4, "PREFETCH": 0, "num_stages": 3, "TMA": 2, "SWAP": 2}  # fmt: skip
    jobs = [{"shape": [64, 6144, 2048], "config": {**config, "PARTIALS": store}} for store in (1, 2)]
    wide, half = (line["stores"] for line in aot_child(_STORE_SCRIPT, json.dumps(jobs), timeout=110))
    assert set(wide) == set(half) == {"st.global.v4.b32"}, (wide, half)
    assert len(half) * 2 == len(wide), (wide, half)


_SASS_SCRIPT = """
import json, re, sys
from kernels.quant.quant_gemm_packed import compile_for_target
for job in json.loads(sys.argv[1]):
    sass = sass_or_skip(compile_or_skip(lambda: compile_for_target(*job["shape"], **job["config"], capability=90)))
    print(json.dumps({"hgmma": len(re.findall(r"HGMMA\\.", sass)),
                      "waits": len(re.findall(r"WARPGROUP\\.DEPBAR", sass))}), flush=True)
"""


@pytest.mark.timeout(180)
def test_sm90_split_k_span_wgmmas_are_not_serialized(aot_child: Any) -> None:
    """The 64-row winners at K = 8192 and 14336 (two warpgroups, whole spans with the scales folded in, 4 and 8
    splits) keep a span's 8 wgmmas in flight in the sm_90 SASS: 3 waits in all, not one after each wgmma (8 with
    K at run time: why, in ``packed_quant_kernel``'s docstring)."""
    config = {"precision": "bf16", "group_size": 128, "num_warps": 8, "bits": 4, "BLOCK_M": 64, "BLOCK_N": 128,
              "PREFETCH": 0, "num_stages": 3, "TMA": 2, "SWAP": 3}  # fmt: skip
    jobs = [{"shape": [64, 8192, 8192], "config": {**config, "SPLIT_K": 4}},
            {"shape": [64, 4096, 14336], "config": {**config, "SPLIT_K": 8}}]  # fmt: skip
    for line in aot_child(_SASS_SCRIPT, json.dumps(jobs), timeout=170):
        assert line["hgmma"] == 8 and line["waits"] == 3, line


_ORDER_SCRIPT = """
import json, re, sys
from kernels.quant.quant_gemm_packed import compile_for_target
for job in json.loads(sys.argv[1]):
    ptx = compile_or_skip(lambda: compile_for_target(*job["shape"], **job["config"], capability=90)).asm["ptx"]
    out = {**job, "fences": ptx.count("fence.proxy.async"), "groups": ptx.count("wgmma.commit_group")}
    if "acq_rel.add.u32" in ptx:  # the last program of a tile: read the sums, write Y, re-zero
        start = ptx.index("acq_rel.add.u32")
        block = ptx[start:ptx.index("relaxed.exch", start)].splitlines()
        reads = [i for i, line in enumerate(block) if "ld.global.cg" in line]
        zeros = [i for i, line in enumerate(block) if "st.global.cg" in line]
        address = lambda i: re.search(r"\\[\\s*(%rd\\d+)", block[i]).group(1)
        out["same_threads"] = {address(i) for i in zeros} <= {address(i) for i in reads}
        out["barrier_between"] = any("bar.sync" in line for line in block[max(reads) + 1:min(zeros)])
    print(json.dumps(out), flush=True)
"""


@pytest.mark.timeout(240)
def test_sm90_ptx_fences_x_for_the_wgmma_and_rezeroes_after_the_reads(aot_child: Any) -> None:
    """Two races the GPU stress found, checked in the sm_90 PTX (no GPU needed): every swapped wgmma group reads
    X after a proxy fence (Triton 3.6's pipeliner left it out when it staged X by cp.async), and the last program
    of a split tile re-zeroes the workspace after its reads: from the threads that read (the GEMV) or after a
    barrier (tensor-core tiles, whose zeros took the partials' layout and other threads: Y held zeros)."""
    base = {"precision": "bf16", "group_size": 128, "num_warps": 4, "PREFETCH": 0, "TMA": 1, "num_stages": 3}
    jobs = [
        {"shape": [1, 4096, 14336], "config": {**base, "bits": 4, "BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 1,
                                               "SWAP": 1, "STREAM": 2}},
        {"shape": [64, 14336, 4096], "config": {**base, "bits": 4, "BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_K": 1,
                                                "SWAP": 2}},
        {"shape": [1, 4096, 14336], "config": {**base, "bits": 8, "BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 16,
                                               "SWAP": 2}},
        {"shape": [64, 4096, 14336], "config": {**base, "bits": 4, "BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 4}},
        {"shape": [1, 4096, 14336], "config": {**base, "bits": 4, "BLOCK_M": 1, "BLOCK_N": 64, "SPLIT_K": 8,
                                               "TMA": 0}},
    ]  # fmt: skip
    rows = aot_child(_ORDER_SCRIPT, json.dumps(jobs), timeout=220)
    assert len(rows) == len(jobs)
    for row in rows:
        assert row["fences"] >= row["groups"], row
        if row["config"]["SPLIT_K"] > 1 or row["config"].get("STREAM"):
            assert row["same_threads"] or row["barrier_between"], row
    assert rows[3]["groups"] > 0 and not rows[3]["same_threads"]  # a tile whose zeros do change threads


def test_scratch_that_a_larger_product_replaces_stays_allocated_for_the_graphs_captured_with_it() -> None:
    """A CUDA graph keeps the addresses of the split-K workspace and counters it was captured with. When a larger
    product grows the scratch, the old pair must stay allocated (and zeroed): freed, its memory would go to other
    tensors that the old graph's atomics then overwrite (on an H200: all-NaN logits at the old graph's replay)."""
    import gc
    import weakref

    import torch

    from kernels.quant import quant_gemm_packed as packed

    device = torch.device("cpu")
    held, _ = packed._scratch.get((device.type, device.index), (torch.empty(0), None))
    ws, cnt = packed.scratch(device, held.numel() + 64, 8)
    old_ws, old_cnt = weakref.ref(ws), weakref.ref(cnt)
    assert packed.scratch(device, 16, 4)[0] is ws  # a smaller product takes the same pair
    grown, grown_cnt = packed.scratch(device, ws.numel() + 64, cnt.numel() + 8)
    assert grown.numel() >= ws.numel() + 64 and grown_cnt.numel() >= cnt.numel() + 8
    del ws, cnt
    gc.collect()
    assert old_ws() is not None and old_cnt() is not None, "the replaced scratch was freed"
    assert not old_ws().any() and not old_cnt().any()


@pytest.mark.timeout(120)
def test_the_tile_tuner_never_times_a_tile_whose_product_is_wrong(interpreter: None) -> None:
    """:func:`models.quant_tiles.right_tiles` keeps the kernel's real tiles (a GEMV tile and a split-K tile summed in
    the kernel, run here) and drops a tile whose product comes back wrong in one column, one that comes back NaN,
    and one whose launch raises: the tuner measures only tiles that compute the product."""
    from models.quant_tiles import packed_product, right_tiles

    weights, x, _ = _operands(1, 256, 48, 4, 128, seed=11)
    gemv = {"BLOCK_M": 1, "BLOCK_N": 16, "SPLIT_K": 1, "num_warps": 4, "PREFETCH": 0}
    split = {"BLOCK_M": 1, "BLOCK_N": 32, "SPLIT_K": 2, "num_warps": 4, "PREFETCH": 0}
    wrong, nan, raises = ({**gemv, "case": case} for case in (1, 2, 3))

    def product(x: torch.Tensor, weights: PackedWeights, tile: dict[str, int], **kw: Any) -> torch.Tensor:
        case = tile.get("case", 0)
        if case == 3:
            raise RuntimeError("launch refused")
        y = packed_product(x, weights, {k: v for k, v in tile.items() if k != "case"}, **kw).clone()
        if case == 1:
            y[:, 5] = -y[:, 5]
        if case == 2:
            y[0, 0] = float("nan")
        return y

    assert right_tiles(x, weights, [gemv, wrong, split, nan, raises], product) == [gemv, split]
