"""Persistent fused attention forward with TMA loads (Hopper): a causal-balanced tile order, optional
warp specialization and two query sub-tiles per program.

The same online-softmax algorithm as :mod:`kernels.attention.attention` (base-2 exponentials, scores
masked with a large finite negative, causal off-band / on-band split), scheduled the way
FlashAttention-3 schedules it on Hopper, as far as Triton expresses it:

- **Persistent, causal-balanced**: ``NUM_PROGRAMS`` programs (one per SM) walk the
  (query block, batch*head) tiles ``pid, pid + NUM_PROGRAMS, ...``, query-block major: every
  wave of programs takes the same query block of different heads, so the waves do equal work,
  and with ``causal`` the longest query blocks come first (longest-processing-time order), so
  the last wave is made of the short ones.
- **TMA**: Q, K and V tiles through host-side tensor descriptors over the ``[B*H*S, D]`` views.
  Tiles that run past the end of a head read the next head's rows (or zeros past the tensor);
  the key mask discards them and the output is stored with masked pointer stores, so any
  ``seq_len`` works.
- ``WARP_SPECIALIZE``: Triton splits the key loop into a producer (TMA loads of K/V) and
  consumer warps (``tl.range(..., warp_specialize=True)``).
- ``SPLIT_M``: the program's BLOCK_M query rows are two independent BLOCK_M/2 sub-tiles with their
  own accumulators and statistics over the same K/V tiles: two chains of wgmma and softmax the
  scheduler can interleave (FA3's ping-pong of two warpgroups), at one K/V load for both.

``Lse`` (``[B*H*S]`` fp32, base-2 log-sum-exp of the scaled scores) is stored when asked, as the
backward of :mod:`kernels.attention.attention_grad` needs it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.attention.attention import (
    DTYPES,
    PRECISIONS,
    check_block,
    check_operands,
    compile_jit_for_target,
    mock_tensor_class,
    online_softmax_step,
    row_descriptors,
    tma_available,
)
from kernels.gemm.gemm import device_sms, raise_if_over_shared_memory
from kernels.launch import Descriptors, Plan, PlanCache, layout_key
from kernels.runtime import interpreter_active


@triton.jit
def _softmax_update(qk, acc, l_i, m_i, v, offs_m, keys, qk_scale, SEQ_LEN: tl.constexpr, MASKED: tl.constexpr,
                    CAUSAL: tl.constexpr, EVEN_N: tl.constexpr):  # fmt: skip
    """Fold one block of scores ``qk`` (fp32, unscaled) and its values ``v`` into (acc, l_i, m_i)."""
    p, alpha, l_i, m_ij = online_softmax_step(qk, l_i, m_i, offs_m, keys, qk_scale, SEQ_LEN, MASKED, CAUSAL, EVEN_N)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_ij


@triton.jit
def _key_loop(acc0, l0, m0, q0, offs_m0, acc1, l1, m1, q1, offs_m1, desc_k, desc_v, kv_row, lo, hi, offs_n,
              qk_scale, SEQ_LEN: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              EVEN_N: tl.constexpr, SPLIT_M: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):  # fmt: skip
    """Fold the key blocks ``lo, lo + BLOCK_N, ... < hi`` into one or (``SPLIT_M``) two query sub-tiles."""
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + offs_n
        k = desc_k.load([(kv_row + start_n).to(tl.int32), 0])
        v = desc_v.load([(kv_row + start_n).to(tl.int32), 0])
        kt = tl.trans(k)
        qk0 = tl.dot(q0, kt)
        acc0, l0, m0 = _softmax_update(qk0, acc0, l0, m0, v, offs_m0, keys, qk_scale, SEQ_LEN, MASKED, CAUSAL, EVEN_N)
        if SPLIT_M:
            qk1 = tl.dot(q1, kt)
            acc1, l1, m1 = _softmax_update(
                qk1, acc1, l1, m1, v, offs_m1, keys, qk_scale, SEQ_LEN, MASKED, CAUSAL, EVEN_N
            )
    return acc0, l0, m0, acc1, l1, m1


@triton.jit
def _store_rows(Out, Lse, acc, l_i, m_i, row0, offs_m, offs_d, SEQ_LEN: tl.constexpr, HEAD_DIM: tl.constexpr,
                EVEN_M: tl.constexpr, STORE_LSE: tl.constexpr):  # fmt: skip
    """Normalise and store one query sub-tile's output rows (and their log-sum-exp), masked past SEQ_LEN."""
    if STORE_LSE:
        tl.store(Lse + row0 + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < SEQ_LEN)
    acc = acc / l_i[:, None]
    o_ptrs = Out + row0 * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    if EVEN_M:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty))
    else:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < SEQ_LEN)


@triton.jit
def attention_fwd_persistent_kernel(
    Out,
    Lse,
    desc_q,
    desc_k,
    desc_v,
    sm_scale,
    BH,
    SEQ_LEN: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    SPLIT_M: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    STORE_LSE: tl.constexpr,
):
    """Programs ``0 .. NUM_PROGRAMS-1`` each take the tiles ``pid, pid + NUM_PROGRAMS, ...`` of the
    ``cdiv(SEQ_LEN, BLOCK_M) * BH`` (query block, batch*head) tiles, query-block major."""
    SUB_M: tl.constexpr = BLOCK_M // 2 if SPLIT_M else BLOCK_M
    num_m = (SEQ_LEN + BLOCK_M - 1) // BLOCK_M
    num_tiles = num_m * BH
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for tile in range(tl.program_id(0), num_tiles, NUM_PROGRAMS):
        m_block = tile // BH
        off_hz = tile % BH
        if CAUSAL:
            start_m = num_m - 1 - m_block  # longest rows first
        else:
            start_m = m_block
        row0 = off_hz.to(tl.int64) * SEQ_LEN
        offs_m0 = start_m * BLOCK_M + tl.arange(0, SUB_M)
        offs_m1 = offs_m0 + SUB_M
        q0 = desc_q.load([(row0 + start_m * BLOCK_M).to(tl.int32), 0])
        if SPLIT_M:
            q1 = desc_q.load([(row0 + start_m * BLOCK_M + SUB_M).to(tl.int32), 0])
        else:
            q1 = q0
        acc0 = tl.zeros([SUB_M, HEAD_DIM], dtype=tl.float32)
        acc1 = tl.zeros([SUB_M, HEAD_DIM], dtype=tl.float32)
        l0 = tl.zeros([SUB_M], dtype=tl.float32)
        l1 = tl.zeros([SUB_M], dtype=tl.float32)
        m0 = tl.zeros([SUB_M], dtype=tl.float32) - float("inf")
        m1 = tl.zeros([SUB_M], dtype=tl.float32) - float("inf")
        if CAUSAL:
            # Off-band: key blocks wholly left of the block's first row, unmasked; then the band.
            band_lo = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N
            acc0, l0, m0, acc1, l1, m1 = _key_loop(
                acc0, l0, m0, q0, offs_m0, acc1, l1, m1, q1, offs_m1, desc_k, desc_v, row0, 0, band_lo, offs_n,
                qk_scale, SEQ_LEN, BLOCK_N, False, True, EVEN_N, SPLIT_M, WARP_SPECIALIZE,
            )  # fmt: skip
            band_hi = tl.minimum((start_m + 1) * BLOCK_M, SEQ_LEN)
            acc0, l0, m0, acc1, l1, m1 = _key_loop(
                acc0, l0, m0, q0, offs_m0, acc1, l1, m1, q1, offs_m1, desc_k, desc_v, row0, band_lo, band_hi,
                offs_n, qk_scale, SEQ_LEN, BLOCK_N, True, True, EVEN_N, SPLIT_M, WARP_SPECIALIZE,
            )  # fmt: skip
        else:
            full_hi = SEQ_LEN // BLOCK_N * BLOCK_N
            acc0, l0, m0, acc1, l1, m1 = _key_loop(
                acc0, l0, m0, q0, offs_m0, acc1, l1, m1, q1, offs_m1, desc_k, desc_v, row0, 0, full_hi, offs_n,
                qk_scale, SEQ_LEN, BLOCK_N, False, False, EVEN_N, SPLIT_M, WARP_SPECIALIZE,
            )  # fmt: skip
            if not EVEN_N:
                acc0, l0, m0, acc1, l1, m1 = _key_loop(
                    acc0, l0, m0, q0, offs_m0, acc1, l1, m1, q1, offs_m1, desc_k, desc_v, row0, full_hi, SEQ_LEN,
                    offs_n, qk_scale, SEQ_LEN, BLOCK_N, True, False, EVEN_N, SPLIT_M, False,
                )  # fmt: skip
        _store_rows(Out, Lse, acc0, l0, m0, row0, offs_m0, offs_d, SEQ_LEN, HEAD_DIM, EVEN_M, STORE_LSE)
        if SPLIT_M:
            _store_rows(Out, Lse, acc1, l1, m1, row0, offs_m1, offs_d, SEQ_LEN, HEAD_DIM, EVEN_M, STORE_LSE)


def _descriptors(q: Any, k: Any, v: Any, rows: int, head_dim: int, block_m: int, block_n: int, split_m: bool) -> Any:
    from triton.tools.tensor_descriptor import TensorDescriptor

    shape, strides = [rows, head_dim], [head_dim, 1]
    sub_m = block_m // 2 if split_m else block_m
    return (
        TensorDescriptor(q, shape, strides, [sub_m, head_dim]),
        TensorDescriptor(k, shape, strides, [block_n, head_dim]),
        TensorDescriptor(v, shape, strides, [block_n, head_dim]),
    )


def num_programs(batch: int, heads: int, seq_len: int, block_m: int, num_sms: int) -> int:
    """Programs launched: one per SM, or fewer when there are fewer tiles."""
    return max(1, min(num_sms, triton.cdiv(seq_len, block_m) * batch * heads))


def _meta_args(seq_len: int, head_dim: int, causal: bool, tile: dict[str, Any], grid: int, store_lse: bool) -> dict:
    return {
        "SEQ_LEN": seq_len,
        "HEAD_DIM": head_dim,
        "BLOCK_M": tile["BLOCK_M"],
        "BLOCK_N": tile["BLOCK_N"],
        "CAUSAL": bool(causal),
        # With SPLIT_M each sub-tile is BLOCK_M/2 rows: the store needs no mask when those divide S.
        "EVEN_M": seq_len % tile["BLOCK_M"] == 0,
        "EVEN_N": seq_len % tile["BLOCK_N"] == 0,
        "NUM_PROGRAMS": grid,
        "SPLIT_M": bool(tile.get("split_m", False)),
        "WARP_SPECIALIZE": bool(tile.get("warp_specialize", False)),
        "STORE_LSE": bool(store_lse),
        "num_warps": tile["num_warps"],
        "num_stages": tile["num_stages"],
    }


def check_tile(block_m: int, block_n: int, split_m: bool) -> None:
    check_block("BLOCK_M", block_m)
    check_block("BLOCK_N", block_n)
    if split_m and block_m < 32:
        raise ValueError(f"split_m needs BLOCK_M >= 32 (two sub-tiles of >= 16 rows), got {block_m}")


#: :func:`attention_persistent`'s launch plans.
_PLANS = PlanCache()


def attention_persistent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    BLOCK_M: int,
    BLOCK_N: int,
    num_warps: int,
    num_stages: int,
    num_sms: int | None = None,
    split_m: bool = False,
    warp_specialize: bool = False,
    sm_scale: float | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """``softmax(Q K^T * sm_scale [+ causal mask]) V`` with the persistent TMA kernel.

    Inputs and outputs as :func:`kernels.attention.attention.attention` (``[B, H, S, D]`` contiguous bf16 or
    fp16, ``lse`` ``[B, H, S]`` fp32 when given); ``num_sms`` programs are launched (default: the
    device's multiprocessor count, :func:`kernels.gemm.gemm.device_sms`). Launches asynchronously on the current
    stream.
    """
    num_sms = device_sms(q.device) if num_sms is None else num_sms
    key = (layout_key(q, k, v, out, lse), q.device, causal, BLOCK_M, BLOCK_N, num_warps, num_stages, num_sms,
           split_m, warp_specialize)  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        out = check_operands(q, k, v, out, lse)
        if not tma_available():
            raise ValueError("the persistent attention kernel needs triton.tools.tensor_descriptor (Triton >= 3.3)")
        batch, heads, seq_len, head_dim = q.shape
        check_tile(BLOCK_M, BLOCK_N, split_m)
        tile = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "num_warps": num_warps, "num_stages": num_stages,
                "split_m": split_m, "warp_specialize": warp_specialize}  # fmt: skip
        grid = num_programs(batch, heads, seq_len, BLOCK_M, num_sms)
        meta = _meta_args(seq_len, head_dim, causal, tile, grid, lse is not None)
        plan = _PLANS.put(key, Plan(attention_fwd_persistent_kernel, (grid,), meta, scale=1.0 / math.sqrt(head_dim),
                                    bh=batch * heads, descs=Descriptors(),
                                    box=(batch * heads * seq_len, head_dim, BLOCK_M, BLOCK_N, split_m)))  # fmt: skip
    elif out is None:
        out = torch.empty_like(q)
    state = plan.state
    descs = state["descs"].get((q.data_ptr(), k.data_ptr(), v.data_ptr()), row_descriptors, _descriptors, q, k, v,
                               *state["box"])  # fmt: skip
    scale = state["scale"] if sm_scale is None else float(sm_scale)
    plan.launch(out, lse, *descs, scale, state["bh"])
    return out


def _mock_args(batch: int, heads: int, seq_len: int, head_dim: int, precision: str, tile: dict[str, Any]) -> tuple:
    MockTensor = mock_tensor_class()
    dtype = DTYPES[precision]
    rows = batch * heads * seq_len
    out = MockTensor(dtype, [batch, heads, seq_len, head_dim])
    flat = [MockTensor(dtype, [rows, head_dim]) for _ in range(3)]
    descs = _descriptors(*flat, rows, head_dim, tile["BLOCK_M"], tile["BLOCK_N"], tile.get("split_m", False))
    return (out, None, *descs, 1.0 / math.sqrt(head_dim), batch * heads)


def compile_only(
    batch: int, heads: int, seq_len: int, head_dim: int, *, causal: bool, precision: str, num_sms: int, **tile: Any
) -> Any | None:
    """Compile the kernel :func:`attention_persistent` launches, without launching it (None when interpreted)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if interpreter_active():
        return None
    grid = num_programs(batch, heads, seq_len, tile["BLOCK_M"], num_sms)
    args = _mock_args(batch, heads, seq_len, head_dim, precision, tile)
    kernel = attention_fwd_persistent_kernel.warmup(
        *args, **_meta_args(seq_len, head_dim, causal, tile, grid, False), grid=(grid,)
    )
    raise_if_over_shared_memory(kernel)
    return kernel


def compile_for_target(
    batch: int, heads: int, seq_len: int, head_dim: int, *, causal: bool, precision: str, num_sms: int = 132,
    capability: int = 90, **tile: Any,
) -> Any:  # fmt: skip
    """``triton.compile`` for ``GPUTarget("cuda", capability, 32)`` with no GPU (shared memory, registers)."""
    grid = num_programs(batch, heads, seq_len, tile["BLOCK_M"], num_sms)
    args = _mock_args(batch, heads, seq_len, head_dim, precision, tile)
    kwargs = _meta_args(seq_len, head_dim, causal, tile, grid, False)
    return compile_jit_for_target(attention_fwd_persistent_kernel, args, kwargs, capability)
