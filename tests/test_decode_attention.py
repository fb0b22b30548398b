"""The split decode-attention kernel (``kernels/attention/decode_attention.py``): numerics and the fused cache write
under
the Triton interpreter (bf16, fp32 and fp8 caches; one split and several; ``pos`` at the ends and at chunk
boundaries), its split plan, its operand checks, ``torch.compile`` calling it in place, sm_90 compiles in a child
process, and on a GPU its CUDA-graph replay against SDPA."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from conftest import compiled_gpu

torch = pytest.importorskip("torch")


def _reference(qkv: Any, k_cache: Any, v_cache: Any, k_scale: Any, v_scale: Any, pos: int, heads: int) -> tuple:
    """fp32 math of one decode step: the step's k and v stored at ``pos`` as the cache stores them (fp8: scaled,
    clamped, rounded), softmax over positions ``0..pos``. Returns (output [B, 1, H, D], k_cache, v_cache) with the
    caches as they must be after the step."""
    batch, _, _, d = k_cache.shape
    q, k, v = qkv.float().view(batch, 1, 3, heads, d).permute(2, 0, 3, 1, 4)
    k_after, v_after = k_cache.clone(), v_cache.clone()
    for cache, new, scale in ((k_after, k, k_scale), (v_after, v, v_scale)):
        if cache.dtype == torch.float8_e4m3fn:
            cache[:, :, pos] = (new[:, :, 0] / scale).clamp(-448, 448).to(cache.dtype)
        else:
            cache[:, :, pos] = new[:, :, 0].to(cache.dtype)
    keys, values = k_after.float() * k_scale, v_after.float() * v_scale
    scores = (q @ keys.transpose(-1, -2)) / math.sqrt(d)
    scores[..., pos + 1 :] = -math.inf
    out = (torch.softmax(scores, -1) @ values).transpose(1, 2)  # [B, 1, H, D]
    return out, k_after, v_after


def _case(batch: int, heads: int, max_len: int, d: int, cache_dtype: Any, seed: int, on_grid: bool = False) -> tuple:
    """qkv, caches and scales of one step. ``on_grid`` (fp8): the step's k and v are e4m3 values times their
    (power-of-two) scales, so storing them rounds nothing: Triton 3.9's interpreter rounds fp32 to e4m3 wrongly
    where the rounding carries into the exponent (31.5 -> 16, not 32); the GPU's ``cvt`` does not."""
    gen = torch.Generator().manual_seed(seed)
    act = torch.float32 if cache_dtype == torch.float32 else torch.bfloat16
    qkv = torch.randn(batch, 1, 3 * heads * d, generator=gen)
    fp8 = cache_dtype == torch.float8_e4m3fn
    k_scale, v_scale = (torch.tensor(2.0**-6), torch.tensor(2.0**-5)) if fp8 else (torch.tensor(1.0), torch.tensor(1.0))
    if fp8 and on_grid:
        for part, scale in ((1, k_scale), (2, v_scale)):
            piece = qkv[..., part * heads * d : (part + 1) * heads * d]
            piece.copy_((piece / scale).clamp(-448, 448).to(cache_dtype).float() * scale)
    qkv = qkv.to(act)
    caches = []
    for scale in (k_scale, v_scale):
        values = torch.randn(batch, heads, max_len, d, generator=gen)
        caches.append((values / scale).clamp(-448, 448).to(cache_dtype) if fp8 else values.to(cache_dtype))
    return qkv, caches[0], caches[1], k_scale, v_scale


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16", "float8_e4m3fn"])
def test_decode_attention_matches_fp32_math_and_writes_only_its_row(cache_dtype: str) -> None:
    """Against fp32 math over the same cache, with several splits and one (batch 1 and 16 on the interpreter's 8
    "SMs"), ``pos`` first, last, at a chunk's first and last position and inside: the output, and the cache equal
    to the old one except row ``pos``, which holds the step's k and v as the cache stores them (fp8: on e4m3's
    grid, see :func:`_case`)."""
    from kernels.attention.decode_attention import decode_attention, split_plan

    dtype = getattr(torch, cache_dtype)
    tolerance = {"float32": 1e-5, "bfloat16": 1e-2, "float8_e4m3fn": 1e-2}[cache_dtype]
    for batch, heads, max_len, d in ((1, 4, 200, 64), (16, 2, 70, 32)):
        splits, chunk = split_plan(batch * heads, max_len, 8)
        assert (splits > 1) == (batch == 1), (splits, chunk)
        for pos in sorted({p for p in (0, max_len - 1, chunk - 1, chunk, 2 * chunk + 5, 37) if p < max_len}):
            qkv, k_cache, v_cache, k_scale, v_scale = _case(batch, heads, max_len, d, dtype, seed=pos, on_grid=True)
            want, k_after, v_after = _reference(qkv, k_cache, v_cache, k_scale, v_scale, pos, heads)
            got = decode_attention(qkv, k_cache, v_cache, k_scale, v_scale, torch.tensor([pos]), heads)
            assert got.shape == (batch, 1, heads, d) and got.dtype == qkv.dtype
            error = ((got.float() - want).abs().max() / want.abs().max()).item()
            assert error < tolerance, (batch, pos, error)
            for cache, after in ((k_cache, k_after), (v_cache, v_after)):
                assert torch.equal(cache.view(torch.uint8), after.view(torch.uint8)), (batch, pos)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("parts_dtype", ["float32", "bfloat16"])
def test_split_k_partials_of_qkv_are_summed_as_the_product_would_be(parts_dtype: str) -> None:
    """qkv given as P split-K partials ``[P, B, 1, 3 * H * D]`` (a packed ``PARTIALS`` product, fp32 or 16-bit):
    the kernel sums them in fp32 and rounds to ``out_dtype``, so the output and the cache (bf16 and fp8) are those of
    the summed bf16 projection, bit for bit, with several splits of the cache and one. The partials are multiples
    of 1/16 under 2, so their sum is exact in bf16: the interpreter rounds fp32 to bf16 toward zero, the GPU (and
    torch) to nearest."""
    from kernels.attention.decode_attention import decode_attention

    for cache_dtype in (torch.bfloat16, torch.float8_e4m3fn):
        for batch, heads, max_len, d in ((1, 4, 200, 64), (16, 2, 70, 32)):
            _, k_cache, v_cache, k_scale, v_scale = _case(batch, heads, max_len, d, cache_dtype, seed=batch)
            gen = torch.Generator().manual_seed(batch + 1)
            grid = torch.randint(-31, 32, (3, batch, 1, 3 * heads * d), generator=gen) / 16
            parts = grid.to(getattr(torch, parts_dtype))
            summed = parts.float().sum(0).to(torch.bfloat16)
            assert torch.equal(summed.float(), parts.float().sum(0))  # exact: no rounding on either side
            index = torch.tensor([37])
            caches = (k_cache.clone(), v_cache.clone())
            want = decode_attention(summed, k_cache, v_cache, k_scale, v_scale, index, heads)
            got = decode_attention(parts, *caches, k_scale, v_scale, index, heads, out_dtype=torch.bfloat16)
            assert got.dtype == torch.bfloat16 and torch.equal(got, want), (cache_dtype, batch)
            for cache, after in zip(caches, (k_cache, v_cache), strict=True):
                assert torch.equal(cache.view(torch.uint8), after.view(torch.uint8)), (cache_dtype, batch)
            wrong = decode_attention(parts[:2].contiguous(), *caches, k_scale, v_scale, index, heads,
                                     out_dtype=torch.bfloat16)  # fmt: skip
            assert not torch.equal(wrong, want)  # a partial left out shows


def test_split_plan_covers_the_cache_with_about_two_programs_an_sm() -> None:
    """Chunks are whole blocks of 32 positions and cover ``max_len`` with no empty split; the programs come to
    about two an SM where the cache has blocks enough, one split per (batch, head) where there are as many."""
    from kernels.attention.decode_attention import BLOCK_N, split_plan

    for batch_heads in (1, 16, 128, 1024):
        for max_len in (1, 31, 32, 576, 2048):
            splits, chunk = split_plan(batch_heads, max_len, 132)
            assert chunk % BLOCK_N == 0 and (splits - 1) * chunk < max_len <= splits * chunk, (batch_heads, max_len)
    assert split_plan(16, 576, 132) == (9, 64)  # 144 programs at batch 1 of the 1B model
    assert split_plan(128, 576, 132) == (3, 192)
    assert split_plan(1024, 576, 132) == (1, 576)


def test_operand_checks_name_what_is_wrong() -> None:
    from kernels.attention.decode_attention import check_operands, decode_attention

    qkv, k_cache, v_cache, k_scale, v_scale = _case(2, 4, 64, 32, torch.bfloat16, seed=0)
    assert check_operands(qkv, k_cache, v_cache, 4) is None
    assert "contiguous [B, 1, 3 * H * D]" in check_operands(qkv.transpose(0, 1), k_cache, v_cache, 4)
    assert check_operands(torch.stack([qkv, qkv]), k_cache, v_cache, 4) is None  # two split-K partials
    assert "does not match" in check_operands(torch.stack([qkv, qkv])[:, :1].contiguous(), k_cache, v_cache, 4)
    assert "does not match" in check_operands(qkv, k_cache, v_cache, 2)
    assert "one shape" in check_operands(qkv, k_cache, v_cache[:, :, :32].contiguous(), 4)
    narrow = torch.zeros(2, 4, 64, 24, dtype=torch.bfloat16)
    assert "power of two" in check_operands(torch.zeros(2, 1, 3 * 4 * 24), narrow, narrow, 4)
    wide = torch.zeros(2, 4, 64, 32, dtype=torch.float64)
    assert "bf16, fp16, fp32 or float8_e4m3fn" in check_operands(qkv, wide, wide, 4)
    with pytest.raises(ValueError, match="does not match"):
        decode_attention(qkv, k_cache, v_cache, k_scale, v_scale, torch.tensor([3]), 3)


@pytest.mark.timeout(300)
def test_compiled_step_calls_the_kernel_on_the_cache_in_place() -> None:
    """``torch.compile`` (Inductor's CPU backend) of a step that projects qkv and calls the operator: the cache is
    written in place (the caller's tensors hold each step's row, no copy of them taken) and the output is the
    eager one."""
    from kernels.attention.decode_attention import decode_attention

    batch, heads, max_len, d = 2, 2, 64, 16
    proj = torch.nn.Linear(8, 3 * heads * d)
    caches = [torch.zeros(batch, heads, max_len, d) for _ in range(4)]
    ones = torch.ones(())

    def step(x: Any, index: Any, k_cache: Any, v_cache: Any) -> Any:
        return decode_attention(proj(x), k_cache, v_cache, ones, ones, index, heads).view(batch, 1, heads * d).sum(-1)

    compiled = torch.compile(step)
    x = torch.randn(batch, 1, 8)
    with torch.no_grad():
        for p in range(3):
            index = torch.tensor([p])
            eager = step(x + p, index, caches[0], caches[1])
            torch.testing.assert_close(compiled(x + p, index, caches[2], caches[3]), eager, rtol=1e-5, atol=1e-5)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[2][:, :, :3].abs().sum() > 0 and caches[2][:, :, 3:].abs().sum() == 0


_AOT_SCRIPT = """
import json, sys
import torch
from kernels.attention.decode_attention import compile_for_target, split_plan
for batch, dtype, pdl in json.loads(sys.argv[1]):
    kernels = compile_or_skip(lambda: compile_for_target(batch, 16, 576, 128, cache_dtype=getattr(torch, dtype),
                                                         pdl=pdl))
    ptx = kernels[0].asm["ptx"]
    wait = ptx.find("griddepcontrol.wait")
    print(json.dumps({"batch": batch, "dtype": dtype, "pdl": pdl, "kernels": len(kernels),
                      "splits": split_plan(batch * 16, 576, 132),
                      "wide_loads": ptx.count("ld.global.v4"), "fp8_cvt": ptx.count("cvt.rn.satfinite.e4m3x2"),
                      "loads_before_wait": ptx.count("ld.global", 0, wait) if wait >= 0 else None,
                      "launch_dependents": ["griddepcontrol.launch_dependents" in k.asm["ptx"] for k in kernels],
                      "launch_pdl": [bool(getattr(k.metadata, "launch_pdl", False)) for k in kernels],
                      "shared": [k.metadata.shared for k in kernels]}), flush=True)
"""


@pytest.mark.timeout(300)
def test_kernels_compile_for_sm90_with_vector_loads(aot_child: Any) -> None:
    """sm_90 compiles at the 1B model's decode shapes (16 heads of 128, a 576-position cache): a combine kernel
    only where the cache is split (batches 1 and 8, not 64), 16-byte loads of the cache rows, and for an fp8 cache
    the step's k and v converted to e4m3 in the kernel. With ``pdl`` both kernels are programmatic dependents that
    let the next kernel launch, and the split kernel reads its first block of cache rows (16-byte loads of K and V)
    before waiting for the kernel before; without it neither kernel waits."""
    jobs = [[1, "bfloat16", False], [8, "bfloat16", False], [64, "bfloat16", False], [1, "float8_e4m3fn", False],
            [64, "float8_e4m3fn", False], [1, "bfloat16", True], [64, "float8_e4m3fn", True]]  # fmt: skip
    lines = aot_child(_AOT_SCRIPT, json.dumps(jobs), timeout=280)
    assert [line["kernels"] for line in lines] == [2, 2, 1, 2, 1, 2, 1], lines
    for line in lines:
        assert line["wide_loads"] > 0, line
        assert (line["fp8_cvt"] > 0) == (line["dtype"] == "float8_e4m3fn"), line
        if line["pdl"]:
            assert line["loads_before_wait"] >= 2 and all(line["launch_dependents"]) and all(line["launch_pdl"]), line
        else:
            assert line["loads_before_wait"] is None and not any(line["launch_pdl"]), line


_PARTS_SCRIPT = """
import json, sys
import torch
from kernels.attention.decode_attention import compile_for_target
for parts, dtype in json.loads(sys.argv[1]):
    kernels = compile_or_skip(lambda: compile_for_target(64, 16, 576, 128, cache_dtype=torch.bfloat16, parts=parts,
                                                         parts_dtype=getattr(torch, dtype), pdl=True))
    ptx = kernels[0].asm["ptx"]
    wait = ptx.find("griddepcontrol.wait")
    print(json.dumps({"parts": parts, "dtype": dtype, "kernels": len(kernels),
                      "loads_after_wait": ptx.count("ld.global", wait)}), flush=True)
"""


@pytest.mark.timeout(200)
def test_kernel_with_qkv_partials_compiles_for_sm90(aot_child: Any) -> None:
    """sm_90 compiles of the split kernel at batch 64 (one split: no combine kernel) taking qkv as 4 split-K
    partials, fp32 and bf16: it loads more after its wait for the product than with the summed qkv (4 rows of q,
    k and v instead of one)."""
    jobs = [[0, "bfloat16"], [4, "float32"], [4, "bfloat16"]]
    summed, wide, half = aot_child(_PARTS_SCRIPT, json.dumps(jobs), timeout=190)
    assert summed["kernels"] == wide["kernels"] == half["kernels"] == 1, (summed, wide, half)
    assert wide["loads_after_wait"] > summed["loads_after_wait"], (summed, wide)
    assert half["loads_after_wait"] > summed["loads_after_wait"], (summed, half)


@pytest.mark.gpu
@compiled_gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cache_dtype", ["bfloat16", "float8_e4m3fn"])
def test_gpu_decode_attention_replays_in_a_graph_and_matches_fp32_math(cache_dtype: str) -> None:
    """On the GPU at the 1B model's decode shapes (batches 1, 8 and 64; 16 heads of 128, 576 positions): one
    captured call replayed at advancing positions, each against fp32 math over the cache as it stood."""
    from kernels.attention.decode_attention import decode_attention

    dtype = getattr(torch, cache_dtype)
    for batch in (1, 8, 64):
        qkv, k_cache, v_cache, k_scale, v_scale = (t.cuda() for t in _case(batch, 16, 576, 128, dtype, seed=batch))
        index = torch.tensor([500], device="cuda")
        decode_attention(qkv, k_cache.clone(), v_cache.clone(), k_scale, v_scale, index, 16)  # compile outside
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = decode_attention(qkv, k_cache, v_cache, k_scale, v_scale, index, 16)
        for pos in (500, 501, 575, 0):
            before_k, before_v = k_cache.clone(), v_cache.clone()
            index.fill_(pos)
            graph.replay()
            torch.cuda.synchronize()
            want, k_after, v_after = _reference(qkv, before_k, before_v, k_scale, v_scale, pos, 16)
            error = ((out.float() - want).abs().max() / want.abs().max()).item()
            assert error < 1e-2, (batch, pos, error)
            for cache, after in ((k_cache, k_after), (v_cache, v_after)):
                assert torch.equal(cache.view(torch.uint8), after.view(torch.uint8)), (batch, pos)
