"""Backward pass of the fused attention (``kernels/attention/attention.py``), and the autograd function that trains
with it.

FlashAttention-2's backward, without atomics: the forward stores each query row's base-2
log-sum-exp ``lse`` of the scaled scores, so a backward program recomputes any block of
probabilities as ``P = exp2(Q K^T * sm_scale * log2(e) - lse)`` without a softmax pass. With
``delta_i = sum_d dO_i O_i`` (one torch reduction) and ``dS = P * (dO V^T - delta)``:

- :func:`_attn_bwd_dkdv`: one program per ``BLOCK_N`` keys of one (batch, head) keeps its K and V
  tiles on chip and loops over the query blocks that see them (in the causal case only those at or
  below the diagonal), accumulating ``dV += P^T dO`` and ``dK += dS^T Q`` in fp32;
- :func:`_attn_bwd_dq`: one program per ``BLOCK_M`` queries loops over the key blocks they see,
  accumulating ``dQ += dS K``.

``dQ`` and ``dK`` carry the ``sm_scale`` of the scores. Every block is masked (rows and keys past
``S``, the causal triangle): simpler than the forward's split loops, at some speed. Layout and
dtypes are the forward's: ``[B, H, S, D]`` contiguous, bf16 or fp16.

:func:`flash_attention` is differentiable: ``models.gpt`` uses it for ``attention="triton"`` when
a gradient is needed, so ``train_step`` can tune the project's kernel against the SDPA backends.
Under ``TRITON_INTERPRET=1`` it runs on CPU tensors (fp16 only: bf16 ``tl.dot`` is wrong in the
interpreter, see ``kernels/attention/attention.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.attention.attention import LOG2E, attention

#: Tiles of the backward kernels per head dimension (fits the shared memory of sm_80 and newer).
BACKWARD_TILES: dict[int, dict[str, int]] = {
    16: {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    32: {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    64: {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    128: {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
    256: {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 8, "num_stages": 1},
}


@triton.jit
def _load_query_rows(Q, DO, Lse, Delta, row0, offs_m, offs_d, m_valid, HEAD_DIM: tl.constexpr):
    """Q and dO rows ``offs_m`` of one (batch, head), and their log-sum-exp and delta (zeros past S)."""
    offsets = (row0 + offs_m[:, None]) * HEAD_DIM + offs_d[None, :]
    q = tl.load(Q + offsets, mask=m_valid[:, None], other=0.0)
    do = tl.load(DO + offsets, mask=m_valid[:, None], other=0.0)
    lse = tl.load(Lse + row0 + offs_m, mask=m_valid, other=0.0)
    delta = tl.load(Delta + row0 + offs_m, mask=m_valid, other=0.0)
    return q, do, lse, delta


@triton.jit
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,
    DK,
    DV,
    sm_scale,
    qk_scale,
    SEQ_LEN: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """One program: ``BLOCK_N`` keys of one (batch, head); grid = (cdiv(SEQ_LEN, BLOCK_N), B * H)."""
    start_n = tl.program_id(0) * BLOCK_N
    row0 = tl.program_id(1).to(tl.int64) * SEQ_LEN
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    n_valid = offs_n < SEQ_LEN
    kv_offsets = (row0 + offs_n[:, None]) * HEAD_DIM + offs_d[None, :]
    k = tl.load(K + kv_offsets, mask=n_valid[:, None], other=0.0)
    v = tl.load(V + kv_offsets, mask=n_valid[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    lo = 0
    if CAUSAL:
        lo = start_n // BLOCK_M * BLOCK_M  # query blocks above the diagonal see none of these keys
    for start_m in range(lo, SEQ_LEN, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_valid = offs_m < SEQ_LEN
        q, do, lse, delta = _load_query_rows(Q, DO, Lse, Delta, row0, offs_m, offs_d, m_valid, HEAD_DIM)
        # Transposed blocks [BLOCK_N, BLOCK_M]: the keys are this program's rows.
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])
        keep = n_valid[:, None] & m_valid[None, :]
        if CAUSAL:
            keep = keep & (offs_m[None, :] >= offs_n[:, None])
        p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    dk = dk * sm_scale
    tl.store(DK + kv_offsets, dk.to(DK.dtype.element_ty), mask=n_valid[:, None])
    tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty), mask=n_valid[:, None])


@triton.jit
def _attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,
    DQ,
    sm_scale,
    qk_scale,
    SEQ_LEN: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """One program: ``BLOCK_M`` queries of one (batch, head); grid = (cdiv(SEQ_LEN, BLOCK_M), B * H)."""
    start_m = tl.program_id(0) * BLOCK_M
    row0 = tl.program_id(1).to(tl.int64) * SEQ_LEN
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_valid = offs_m < SEQ_LEN
    q, do, lse, delta = _load_query_rows(Q, DO, Lse, Delta, row0, offs_m, offs_d, m_valid, HEAD_DIM)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    hi = SEQ_LEN
    if CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M, SEQ_LEN)  # keys right of the block's last row are masked
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < SEQ_LEN
        kv_offsets = (row0 + offs_n[:, None]) * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv_offsets, mask=n_valid[:, None], other=0.0)
        v = tl.load(V + kv_offsets, mask=n_valid[:, None], other=0.0)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None])
        keep = m_valid[:, None] & n_valid[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        p = tl.where(keep, p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    dq = dq * sm_scale
    q_offsets = (row0 + offs_m[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + q_offsets, dq.to(DQ.dtype.element_ty), mask=m_valid[:, None])


def _backward_meta(seq_len: int, head_dim: int, causal: bool, tiles: dict[str, int] | None) -> dict[str, Any]:
    """The backward kernels' constexprs and launch options: ``tiles`` or :data:`BACKWARD_TILES` for ``D``."""
    return {
        "SEQ_LEN": seq_len,
        "HEAD_DIM": head_dim,
        "CAUSAL": bool(causal),
        **(tiles or BACKWARD_TILES[head_dim]),
    }


def attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    causal: bool,
    sm_scale: float | None = None,
    tiles: dict[str, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of :func:`kernels.attention.attention.attention` given its output, ``lse`` and ``grad_out``.

    All ``[B, H, S, D]`` contiguous in one dtype except ``lse`` (``[B, H, S]`` fp32, from the forward).
    ``tiles`` (BLOCK_M, BLOCK_N, num_warps, num_stages) default to :data:`BACKWARD_TILES` for ``D``.
    """
    batch, heads, seq_len, head_dim = q.shape
    for name, t in (("k", k), ("v", v), ("out", out), ("grad_out", grad_out)):
        if t.shape != q.shape or t.dtype != q.dtype or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous {tuple(q.shape)} {q.dtype}, got {tuple(t.shape)} {t.dtype}")
    if lse.shape != q.shape[:3] or lse.dtype != torch.float32:
        raise ValueError(f"lse must be {tuple(q.shape[:3])} float32, got {tuple(lse.shape)} {lse.dtype}")
    meta = _backward_meta(seq_len, head_dim, causal, tiles)
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    delta = (out.to(torch.float32) * grad_out.to(torch.float32)).sum(dim=-1).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    lse = lse.contiguous()
    _attn_bwd_dkdv[(triton.cdiv(seq_len, meta["BLOCK_N"]), batch * heads)](
        q, k, v, grad_out, lse, delta, dk, dv, scale, scale * LOG2E, **meta
    )
    _attn_bwd_dq[(triton.cdiv(seq_len, meta["BLOCK_M"]), batch * heads)](
        q, k, v, grad_out, lse, delta, dq, scale, scale * LOG2E, **meta
    )
    return dq, dk, dv


# The forward and backward as torch custom ops: opaque to torch.compile (no tracing into the Triton
# launchers), with fake implementations for its shape propagation and the autograd formula below.
@torch.library.custom_op("gpu_tuner::flash_attention_fwd", mutates_args=())
def _flash_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    out = attention(
        q, k, v, causal=causal, lse=lse, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages
    )
    return out, lse


@_flash_fwd.register_fake
def _fake_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, *tiles: int
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("gpu_tuner::flash_attention_bwd", mutates_args=())
def _flash_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return attention_backward(q, k, v, out, lse, grad_out.contiguous(), causal=causal)


@_flash_bwd.register_fake
def _fake_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *rest: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _save_for_backward(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, causal = inputs[:4]
    ctx.save_for_backward(q, k, v, *output)
    ctx.causal = causal


def _flash_grad(ctx: Any, grad_out: torch.Tensor, _grad_lse: torch.Tensor | None) -> tuple[Any, ...]:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _flash_bwd(q, k, v, out, lse, grad_out, ctx.causal)
    return dq, dk, dv, None, None, None, None, None


_flash_fwd.register_autograd(_flash_grad, setup_context=_save_for_backward)


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    BLOCK_M: int,
    BLOCK_N: int,
    num_warps: int,
    num_stages: int,
) -> torch.Tensor:
    """Differentiable :func:`kernels.attention.attention.attention` (forward tiles as given; backward
    :func:`attention_backward` with :data:`BACKWARD_TILES`). Inputs as the forward's. A torch custom
    op (``torch.ops.gpu_tuner.flash_attention_fwd``), so ``torch.compile`` keeps it whole."""
    out, _ = _flash_fwd(q.contiguous(), k.contiguous(), v.contiguous(), causal, BLOCK_M, BLOCK_N, num_warps, num_stages)
    return out


def reference_attention_grads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, causal: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, dq, dk, dv)`` of SDPA's math backend in IEEE fp32 on the same inputs: the numerics
    reference of the backward (as :func:`kernels.attention.attention.reference_attention` is the forward's)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.attention.attention import _ieee_fp32

    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH), _ieee_fp32():
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
        out.backward(grad_out.float())
    return (out.detach(), *(t.grad for t in leaves))


def compile_backward_for_target(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    *,
    causal: bool,
    precision: str,
    tiles: dict[str, int] | None = None,
    capability: int = 90,
) -> dict[str, Any]:
    """Both backward kernels compiled for a CUDA target with no GPU (see
    :func:`kernels.attention.attention.compile_jit_for_target`): ``{"dkdv": CompiledKernel, "dq": CompiledKernel}``."""
    from kernels.attention.attention import DTYPES, compile_jit_for_target, mock_tensor_class

    MockTensor = mock_tensor_class()
    shape, rows = [batch, heads, seq_len, head_dim], [batch, heads, seq_len]
    dtype = DTYPES[precision]
    q, k, v, do, dq, dk, dv = (MockTensor(dtype, shape) for _ in range(7))
    lse, delta = MockTensor(torch.float32, rows), MockTensor(torch.float32, rows)
    scale = 1.0 / math.sqrt(head_dim)
    meta = _backward_meta(seq_len, head_dim, causal, tiles)
    dkdv_args = (q, k, v, do, lse, delta, dk, dv, scale, scale * LOG2E)
    dq_args = (q, k, v, do, lse, delta, dq, scale, scale * LOG2E)
    return {
        "dkdv": compile_jit_for_target(_attn_bwd_dkdv, dkdv_args, meta, capability),
        "dq": compile_jit_for_target(_attn_bwd_dq, dq_args, meta, capability),
    }
