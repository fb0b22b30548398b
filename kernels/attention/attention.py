"""Fused attention forward (flash-style, online softmax) in Triton, with a torch reference.

The kernel follows the forward pass of Triton's fused-attention tutorial
(``06-fused-attention.py``): one program computes ``BLOCK_M`` query rows of
one (batch, head). Its Q tile is loaded once; a loop over ``BLOCK_N``-wide
blocks of keys computes the scores ``Q K^T`` with ``tl.dot``, keeps the
softmax online (running row maximum ``m_i`` and row sum ``l_i``, in base 2:
``exp2`` with ``sm_scale * log2(e)`` folded into one multiplier), and
accumulates ``P V`` in fp32; the epilogue divides by ``l_i`` and stores the
output in the inputs' dtype.

Causal attention splits the key loop in two (the tutorial's off-band /
on-band stages): the key blocks wholly left of the query block's first row
need no mask; the band that crosses the diagonal is masked; the blocks above
the diagonal are never visited, so the causal case does about half the work.
Causal programs take their query blocks in reverse order (the longest rows
first) so that the last wave of the grid is made of short ones.

Layout: ``q``, ``k``, ``v`` and ``out`` are ``[B, H, S, D]`` contiguous, all
bf16 or all fp16, ``D`` a power of two in [16, 256] (the workload uses 64 and
128). Any ``S`` works: the query rows and the key blocks past ``S`` are
masked (scores set to -1e6 before the exponential, loads and stores
masked); when ``S`` is a multiple of both block sizes no mask is compiled
in outside the causal band.

With ``use_tma`` the Q/K/V tiles are loaded through host-side tensor
descriptors (TMA on Hopper) over the ``[B*H*S, D]`` view; tiles that run past
the end of a head read the next head's rows (or zeros past the tensor),
which the key mask discards, and the output is stored with masked pointer
stores so no row of another head is written. :func:`tma_available` says
whether this Triton has host-side descriptors.

Under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors; fp16 is
computed correctly there, bf16 ``tl.dot`` is not (Triton 3.9), so bf16
numerics are checked on a GPU only.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.gemm.gemm import raise_if_over_shared_memory
from kernels.launch import Descriptors, Plan, PlanCache, layout_key
from kernels.runtime import interpreter_active

PRECISIONS: tuple[str, ...] = ("bf16", "fp16")
#: dtype of Q, K, V and the output, per precision.
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: ``log2(e)``: ``exp(x) == exp2(x * LOG2E)``, folded into the score scale.
LOG2E = 1.4426950408889634
#: Elements of the fp32 score matrix the reference materializes at once (1 GiB).
REFERENCE_CHUNK_ELEMENTS = 2**28


def tma_available() -> bool:
    """Whether this Triton has host-side tensor descriptors (``triton.tools.tensor_descriptor``)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


@triton.jit
def online_softmax_step(qk, l_i, m_i, offs_m, keys, qk_scale, SEQ_LEN: tl.constexpr, MASKED: tl.constexpr,
                        CAUSAL: tl.constexpr, EVEN_N: tl.constexpr):  # fmt: skip
    """One key block of the online softmax in base 2: the block's weights ``p``, the factor ``alpha``
    that rescales the running accumulator, and the new row sums and maxima (``l_i``, ``m_ij``).

    ``qk`` holds the unscaled fp32 scores; ``MASKED`` applies the causal mask (``CAUSAL``) and, unless
    ``EVEN_N``, the ``key < SEQ_LEN`` mask.
    """
    if MASKED:
        if CAUSAL:
            mask = offs_m[:, None] >= keys[None, :]
            if not EVEN_N:
                mask = mask & (keys[None, :] < SEQ_LEN)
        else:
            mask = keys[None, :] < SEQ_LEN
        # A large finite negative, not -inf: a row whose block is wholly masked stays finite
        # (its weights vanish once a real key raises the row maximum, alpha = exp2(-1e6) = 0).
        qk = qk * qk_scale + tl.where(mask, 0.0, -1.0e6)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_ij[:, None]
    else:
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_ij[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_ij)
    return p, alpha, l_i * alpha + tl.sum(p, 1), m_ij


@triton.jit
def _attn_fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    k_ptrs,
    v_ptrs,
    desc_k,
    desc_v,
    kv_row,
    lo,
    hi,
    offs_m,
    offs_n,
    qk_scale,
    SEQ_LEN: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN_N: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Fold the key blocks starting at ``lo, lo + BLOCK_N, ... < hi`` into (acc, l_i, m_i).

    ``lo`` is a multiple of BLOCK_N. ``MASKED``: apply the causal mask (``CAUSAL``) and, unless
    ``EVEN_N``, the key < SEQ_LEN mask; unmasked calls only see blocks wholly inside both.
    """
    if not USE_TMA:
        k_ptrs += lo * HEAD_DIM
        v_ptrs += lo * HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + offs_n
        # -- scores S = Q K^T (fp32) --
        if USE_TMA:
            k = desc_k.load([(kv_row + start_n).to(tl.int32), 0])
        elif MASKED and not EVEN_N:
            k = tl.load(k_ptrs, mask=keys[:, None] < SEQ_LEN, other=0.0)
        else:
            k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k))
        p, alpha, l_i, m_ij = online_softmax_step(qk, l_i, m_i, offs_m, keys, qk_scale, SEQ_LEN, MASKED, CAUSAL, EVEN_N)
        acc = acc * alpha[:, None]
        # -- acc += P V, P rounded to the inputs' dtype, fp32 accumulation --
        if USE_TMA:
            v = desc_v.load([(kv_row + start_n).to(tl.int32), 0])
        elif MASKED and not EVEN_N:
            v = tl.load(v_ptrs, mask=keys[:, None] < SEQ_LEN, other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
        if not USE_TMA:
            k_ptrs += BLOCK_N * HEAD_DIM
            v_ptrs += BLOCK_N * HEAD_DIM
    return acc, l_i, m_i


@triton.jit
def _load_q(Q, desc_q, row0, start_m, offs_m, offs_d, SEQ_LEN: tl.constexpr, HEAD_DIM: tl.constexpr,
            BLOCK_M: tl.constexpr, EVEN_M: tl.constexpr, USE_TMA: tl.constexpr):  # fmt: skip
    """The program's BLOCK_M query rows (rows past SEQ_LEN read as zeros)."""
    if USE_TMA:
        q = desc_q.load([(row0 + start_m * BLOCK_M).to(tl.int32), 0])
    else:
        q_ptrs = Q + row0 * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        if EVEN_M:
            q = tl.load(q_ptrs)
        else:
            q = tl.load(q_ptrs, mask=offs_m[:, None] < SEQ_LEN, other=0.0)
    return q


@triton.jit
def _store_out(Out, o, row0, offs_m, offs_d, SEQ_LEN: tl.constexpr, HEAD_DIM: tl.constexpr, EVEN_M: tl.constexpr):
    """The program's normalized output rows, in Out's dtype (rows past SEQ_LEN not stored)."""
    o_ptrs = Out + row0 * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    if EVEN_M:
        tl.store(o_ptrs, o.to(Out.dtype.element_ty))
    else:
        tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=offs_m[:, None] < SEQ_LEN)


@triton.jit
def attention_fwd_kernel(
    Q,
    K,
    V,
    Out,
    Lse,
    desc_q,
    desc_k,
    desc_v,
    sm_scale,
    SEQ_LEN: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    USE_TMA: tl.constexpr,
    STORE_LSE: tl.constexpr,
):
    """One program: BLOCK_M query rows of one (batch, head); grid = (cdiv(SEQ_LEN, BLOCK_M), B * H).

    ``STORE_LSE``: also store each row's log-sum-exp of the scaled scores, in base 2
    (``m_i + log2(l_i)``), into ``Lse`` ``[B*H*S]`` fp32, for the backward pass.
    """
    if CAUSAL:
        # Longest rows first: the grid's last wave is made of the short ones.
        start_m = (SEQ_LEN + BLOCK_M - 1) // BLOCK_M - 1 - tl.program_id(0)
    else:
        start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    row0 = off_hz.to(tl.int64) * SEQ_LEN  # row of (batch, head, 0) in the [B*H*S, D] view
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))

    # Q is loaded once and stays on chip for the whole loop.
    q = _load_q(Q, desc_q, row0, start_m, offs_m, offs_d, SEQ_LEN, HEAD_DIM, BLOCK_M, EVEN_M, USE_TMA)
    k_ptrs = K + row0 * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    v_ptrs = V + row0 * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    kv_row = row0

    if CAUSAL:
        # Off-band: key blocks wholly left of this block's first row, no mask.
        band_lo = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, kv_row, 0, band_lo, offs_m, offs_n, qk_scale,
            SEQ_LEN, HEAD_DIM, BLOCK_N, False, True, EVEN_N, USE_TMA,
        )  # fmt: skip
        # On-band: the blocks crossing the diagonal, masked; nothing above it is visited.
        if EVEN_M:
            band_hi = (start_m + 1) * BLOCK_M
        else:
            band_hi = tl.minimum((start_m + 1) * BLOCK_M, SEQ_LEN)
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, kv_row, band_lo, band_hi, offs_m, offs_n, qk_scale,
            SEQ_LEN, HEAD_DIM, BLOCK_N, True, True, EVEN_N, USE_TMA,
        )  # fmt: skip
    else:
        full_hi = SEQ_LEN // BLOCK_N * BLOCK_N  # a constexpr: the key blocks wholly inside SEQ_LEN
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, kv_row, 0, full_hi, offs_m, offs_n, qk_scale,
            SEQ_LEN, HEAD_DIM, BLOCK_N, False, False, EVEN_N, USE_TMA,
        )  # fmt: skip
        if not EVEN_N:
            # The last, partial key block: keys >= SEQ_LEN masked.
            acc, l_i, m_i = _attn_fwd_inner(
                acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, kv_row, full_hi, SEQ_LEN, offs_m, offs_n,
                qk_scale, SEQ_LEN, HEAD_DIM, BLOCK_N, True, False, EVEN_N, USE_TMA,
            )  # fmt: skip

    if STORE_LSE:
        tl.store(Lse + row0 + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < SEQ_LEN)
    _store_out(Out, acc / l_i[:, None], row0, offs_m, offs_d, SEQ_LEN, HEAD_DIM, EVEN_M)


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def _grid(batch: int, heads: int, seq_len: int, block_m: int) -> tuple[int, int]:
    return (triton.cdiv(seq_len, block_m), batch * heads)


def _meta_args(
    seq_len: int,
    head_dim: int,
    causal: bool,
    use_tma: bool,
    BLOCK_M: int,
    BLOCK_N: int,
    num_warps: int,
    num_stages: int,
    store_lse: bool = False,
) -> dict[str, Any]:
    """The kernel's constexpr and launch arguments for one config (shared by launch and warm-up)."""
    return {
        "SEQ_LEN": seq_len,
        "HEAD_DIM": head_dim,
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": BLOCK_N,
        "CAUSAL": bool(causal),
        "EVEN_M": seq_len % BLOCK_M == 0,
        "EVEN_N": seq_len % BLOCK_N == 0,
        "USE_TMA": bool(use_tma),
        "STORE_LSE": bool(store_lse),
        "num_warps": num_warps,
        "num_stages": num_stages,
    }


def _descriptors(q: Any, k: Any, v: Any, rows: int, head_dim: int, block_m: int, block_n: int) -> tuple[Any, Any, Any]:
    """Host-side tensor descriptors of Q, K, V over their ``[rows, head_dim]`` views."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    shape, strides = [rows, head_dim], [head_dim, 1]
    return (
        TensorDescriptor(q, shape, strides, [block_m, head_dim]),
        TensorDescriptor(k, shape, strides, [block_n, head_dim]),
        TensorDescriptor(v, shape, strides, [block_n, head_dim]),
    )


def row_descriptors(descriptors: Any, q: Any, k: Any, v: Any, rows: int, head_dim: int, *boxes: Any) -> Any:
    """``descriptors`` (a kernel's ``_descriptors``) of Q, K and V viewed as ``[rows, head_dim]``."""
    return descriptors(q.view(rows, head_dim), k.view(rows, head_dim), v.view(rows, head_dim), rows, head_dim, *boxes)


def check_operands(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None, lse: torch.Tensor | None
) -> torch.Tensor:
    """Raise ValueError unless Q, K, V, ``out`` and ``lse`` are what the forward kernels read and write
    (see :func:`attention`); returns ``out``, allocated when None."""
    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        shapes = ", ".join(str(tuple(t.shape)) for t in (q, k, v))
        raise ValueError(f"q, k, v must be [B, H, S, D] of one shape, got {shapes}")
    if q.dtype not in DTYPES.values() or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must all be bfloat16 or float16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        raise ValueError("q, k, v must be contiguous [B, H, S, D]")
    head_dim = q.shape[3]
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two in [16, 256], got {head_dim}")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    if lse is not None and (lse.shape != q.shape[:3] or lse.dtype != torch.float32 or not lse.is_contiguous()):
        raise ValueError(f"lse must be contiguous {tuple(q.shape[:3])} float32, got {tuple(lse.shape)} {lse.dtype}")
    return out


def check_block(name: str, value: int) -> None:
    if value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {value}")


#: :func:`attention`'s launch plans.
_PLANS = PlanCache()


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    BLOCK_M: int,
    BLOCK_N: int,
    num_warps: int,
    num_stages: int,
    use_tma: bool = False,
    sm_scale: float | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """``softmax(Q K^T * sm_scale [+ causal mask]) V`` with one tile config.

    ``q``, ``k``, ``v``: ``[B, H, S, D]`` contiguous, one dtype (bf16 or fp16),
    D a power of two in [16, 256]. ``sm_scale`` defaults to ``1/sqrt(D)``;
    ``out`` (same shape and dtype) is written in place when given; ``lse``
    (``[B, H, S]`` fp32, contiguous) receives each row's base-2 log-sum-exp of the
    scaled scores when given (what :mod:`kernels.attention.attention_grad` needs). The causal
    mask keeps key j for query i when ``j <= i`` (SDPA's ``is_causal``).
    Returns the output; launches asynchronously on the current stream.
    """
    key = (layout_key(q, k, v, out, lse), q.device, causal, BLOCK_M, BLOCK_N, num_warps, num_stages, use_tma)
    plan = _PLANS.get(key)
    if plan is None:
        check_block("BLOCK_M", BLOCK_M)
        check_block("BLOCK_N", BLOCK_N)
        out = check_operands(q, k, v, out, lse)
        batch, heads, seq_len, head_dim = q.shape
        if use_tma and not tma_available():
            raise ValueError("use_tma needs triton.tools.tensor_descriptor (Triton >= 3.3)")
        meta = _meta_args(seq_len, head_dim, causal, use_tma, BLOCK_M, BLOCK_N, num_warps, num_stages, lse is not None)
        plan = _PLANS.put(key, Plan(attention_fwd_kernel, _grid(batch, heads, seq_len, BLOCK_M), meta,
                                    scale=1.0 / math.sqrt(head_dim), descs=Descriptors() if use_tma else None,
                                    box=(batch * heads * seq_len, head_dim, BLOCK_M, BLOCK_N)))  # fmt: skip
    elif out is None:
        out = torch.empty_like(q)
    state = plan.state
    scale = state["scale"] if sm_scale is None else float(sm_scale)
    if use_tma:
        desc_q, desc_k, desc_v = state["descs"].get((q.data_ptr(), k.data_ptr(), v.data_ptr()), row_descriptors,
                                                    _descriptors, q, k, v, *state["box"])  # fmt: skip
        plan.launch(q, k, v, out, lse, desc_q, desc_k, desc_v, scale)
    else:
        plan.launch(q, k, v, out, lse, None, None, None, scale)
    return out


def compile_only(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    *,
    causal: bool,
    precision: str,
    BLOCK_M: int,
    BLOCK_N: int,
    num_warps: int,
    num_stages: int,
    use_tma: bool = False,
) -> Any | None:
    """Compile the kernel :func:`attention` launches for this shape, without launching it.

    Calls ``JITFunction.warmup(..., grid=...)`` on placeholder tensors (dtype
    and shape, no memory), so the later launch finds the binary in Triton's
    in-process cache; it may run on a thread while another kernel is timed.
    Raises ``OutOfResources`` when the binary needs more shared memory than
    the device allows (read from the compiled metadata), and Triton's
    compilation errors as they are. Returns the compiled kernel, or None under
    the interpreter or on a Triton without ``warmup``.
    """
    _check_precision(precision)
    if interpreter_active():
        return None
    warmup = getattr(attention_fwd_kernel, "warmup", None)
    if warmup is None:
        return None
    from triton.runtime.jit import MockTensor

    dtype = DTYPES[precision]
    shape = [batch, heads, seq_len, head_dim]
    q, k, v, out = (MockTensor(dtype, shape) for _ in range(4))
    desc_q = desc_k = desc_v = None
    if use_tma:
        rows = batch * heads * seq_len
        flat = [MockTensor(dtype, [rows, head_dim]) for _ in range(3)]
        desc_q, desc_k, desc_v = _descriptors(*flat, rows, head_dim, BLOCK_M, BLOCK_N)
    kernel = warmup(
        q,
        k,
        v,
        out,
        None,
        desc_q,
        desc_k,
        desc_v,
        1.0 / math.sqrt(head_dim),
        **_meta_args(seq_len, head_dim, causal, use_tma, BLOCK_M, BLOCK_N, num_warps, num_stages),
        grid=_grid(batch, heads, seq_len, BLOCK_M),
    )
    raise_if_over_shared_memory(kernel)
    return kernel


def compile_for_target(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    *,
    causal: bool,
    precision: str,
    BLOCK_M: int,
    BLOCK_N: int,
    num_warps: int,
    num_stages: int,
    use_tma: bool = False,
    capability: int = 90,
) -> Any:
    """Compile the kernel :func:`attention` would launch for this shape for a CUDA target, with no GPU.

    For checking configs ahead of time on a machine without a GPU (the CPU
    tests compile the default space's seeds for sm_90 and compare their shared
    memory with the workload's estimate). Binds placeholder tensors and
    descriptors with the runtime's own argument binder, so the signature and the
    divisibility specializations are those of a launch, then calls
    ``triton.compile`` for ``GPUTarget("cuda", capability, 32)``. Returns the
    ``CompiledKernel``: ``metadata.shared`` (bytes of dynamic shared memory),
    ``asm["ptx"]``, ``asm["cubin"]``. Relies on Triton runtime internals (as in
    Triton 3.9); raises ``NotImplementedError`` where they are missing or when
    the kernel is interpreted (``TRITON_INTERPRET=1``); compile errors are
    raised as they are.
    """
    _check_precision(precision)
    MockTensor = mock_tensor_class()
    dtype = DTYPES[precision]
    shape = [batch, heads, seq_len, head_dim]
    q, k, v, out = (MockTensor(dtype, shape) for _ in range(4))
    desc_q = desc_k = desc_v = None
    if use_tma:
        rows = batch * heads * seq_len
        flat = [MockTensor(dtype, [rows, head_dim]) for _ in range(3)]
        desc_q, desc_k, desc_v = _descriptors(*flat, rows, head_dim, BLOCK_M, BLOCK_N)
    kwargs = _meta_args(seq_len, head_dim, causal, use_tma, BLOCK_M, BLOCK_N, num_warps, num_stages)
    args = (q, k, v, out, None, desc_q, desc_k, desc_v, 1 / math.sqrt(head_dim))
    return compile_jit_for_target(attention_fwd_kernel, args, kwargs, capability)


def mock_tensor_class() -> Any:
    """Triton's placeholder tensor (dtype and shape, no memory) for ahead-of-time compiles."""
    try:
        from triton.runtime.jit import MockTensor
    except ImportError as exc:
        raise NotImplementedError(f"this Triton has no MockTensor: {exc}") from None
    return MockTensor


def compile_jit_for_target(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any], capability: int = 90) -> Any:
    """``triton.compile`` of a ``@triton.jit`` kernel for ``GPUTarget("cuda", capability, 32)``, no GPU needed.

    ``args`` and ``kwargs`` are those of a launch (placeholder ``MockTensor``s for tensors; constexprs
    and ``num_warps``/``num_stages`` in ``kwargs``), bound with the runtime's own argument binder so
    the signature and the divisibility specializations are those of a launch. Relies on Triton runtime
    internals (as in Triton 3.9): raises ``NotImplementedError`` where they are missing or when the
    kernel is interpreted (``TRITON_INTERPRET=1``); compile errors are raised as they are.
    """
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import create_function_from_signature
    except ImportError as exc:
        raise NotImplementedError(f"this Triton lacks the ahead-of-time compile internals: {exc}") from None
    if not isinstance(kernel, triton.runtime.JITFunction) or not hasattr(kernel, "_pack_args"):
        raise NotImplementedError("the kernel is interpreted (TRITON_INTERPRET=1) or this Triton has no _pack_args")
    target = GPUTarget("cuda", capability, 32)
    kwargs = {**kwargs, "debug": False}
    try:
        backend = make_backend(target)
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as exc:  # other internals
        raise NotImplementedError(f"cannot bind the kernel's arguments in this Triton: {exc!r}") from None
    source = ASTSource
    if getattr(kernel, "is_gluon", lambda: False)():  # a @gluon.jit kernel: its own front end
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton.compile(source(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


# --------------------------------------------------------------------------- inputs and reference


def make_masters(
    batch: int, heads: int, seq_len: int, head_dim: int, device: str | torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 master Q, K, V ``[B, H, S, D]``, standard normal, deterministic per (device, seed)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, heads, seq_len, head_dim)
    return tuple(  # type: ignore[return-value]
        torch.randn(shape, device=device, dtype=torch.float32, generator=generator) for _ in range(3)
    )


def quantize(
    masters: tuple[torch.Tensor, torch.Tensor, torch.Tensor], precision: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The masters rounded to the precision's dtype (contiguous)."""
    _check_precision(precision)
    return tuple(t.to(DTYPES[precision]).contiguous() for t in masters)  # type: ignore[return-value]


@contextlib.contextmanager
def _ieee_fp32() -> Iterator[None]:
    """fp32 matmuls without TF32 for the duration (a no-op for CPU tensors)."""
    matmul_flags = torch.backends.cuda.matmul
    if hasattr(matmul_flags, "fp32_precision"):
        saved = matmul_flags.fp32_precision
        matmul_flags.fp32_precision = "ieee"
        try:
            yield
        finally:
            matmul_flags.fp32_precision = saved
        return
    saved_tf32 = matmul_flags.allow_tf32
    matmul_flags.allow_tf32 = False
    try:
        yield
    finally:
        matmul_flags.allow_tf32 = saved_tf32


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """``scaled_dot_product_attention`` in fp32 (math backend, IEEE fp32 products): the numerics reference.

    Inputs are converted to fp32; the (batch, head) pairs are processed in
    chunks so that at most :data:`REFERENCE_CHUNK_ELEMENTS` scores exist at once.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, heads, seq_len, head_dim = q.shape
    flat = [t.to(torch.float32).reshape(batch * heads, seq_len, head_dim) for t in (q, k, v)]
    out = torch.empty_like(flat[0])
    chunk = max(1, REFERENCE_CHUNK_ELEMENTS // (seq_len * seq_len))
    with sdpa_kernel(SDPBackend.MATH), _ieee_fp32():
        for start in range(0, batch * heads, chunk):
            part = slice(start, start + chunk)
            out[part] = torch.nn.functional.scaled_dot_product_attention(
                flat[0][part], flat[1][part], flat[2][part], is_causal=causal
            )
    return out.reshape(batch, heads, seq_len, head_dim)


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool) -> float:
    """FLOPs of one forward: two S x S x D products per (batch, head), ``4*B*H*S*S*D``; half when causal."""
    flops = 4.0 * batch * heads * seq_len * seq_len * head_dim
    return flops / 2 if causal else flops
