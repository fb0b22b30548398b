"""The device functions of :mod:`kernels.quant.quant_gemm_packed`'s kernel: a span's decode and product (GEMV, tensor
cores, swapped), a tile's offsets, and its store (to Y, as one of split-K's parts reduced in the kernel, or as an
fp32 partial). The layout, the paths and the knobs are described there; this module holds only ``@triton.jit``
helpers, so the kernel module keeps the kernel, its launch and its checks.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.quant.quant_decode import (
    PAIR_F32_HI_BIAS,
    PAIR_F32_LO_BIAS,
    slot,
    slot_pair_asm,
    slot_pair_f32,
    span_decoded_t,
)


@triton.jit
def _span_fp32_pairs(words, x_ptrs, stride_xk, part):
    """One int4 span of the GEMV with :func:`~kernels.quant.quant_decode.slot_pair_f32`: ``part`` (16, BLOCK_N) plus X
    times the span's values, less the biases times X (one (16,) correction per span, not one per weight)."""
    corr = tl.zeros((16,), dtype=tl.float32)
    for p in tl.static_range(4):
        v_lo, v_hi = slot_pair_f32(words, p)
        x_lo = tl.load(x_ptrs + p * 16 * stride_xk).to(tl.float32)
        x_hi = tl.load(x_ptrs + (p + 4) * 16 * stride_xk).to(tl.float32)
        part += x_lo[:, None] * v_lo  # two accumulations: one FMA per weight
        part += x_hi[:, None] * v_hi
        corr += x_lo * PAIR_F32_LO_BIAS + x_hi * PAIR_F32_HI_BIAS
    return part - corr[:, None]


@triton.jit
def _through_registers(x, COMPILED: tl.constexpr):
    """``x`` as it is, passed through one register move when compiled: the swapped product's X then reaches the
    wgmma through a shared-memory store that Triton fences for the async proxy. Left to the pipeliner, X's slices
    go by ``cp.async`` straight into the buffers the wgmma reads, with no proxy fence between, and the product
    read stale X in up to 44% of launches (bench/results/int4-roofline-swap-ptxas-h200.json)."""
    if COMPILED:
        x = tl.inline_asm_elementwise("mov.b16 $0, $1;", "=h,h", [x], dtype=x.dtype, is_pure=True, pack=1)
    return x


@triton.jit
def _slice_product(q, x_ptrs, part, acc, s_ptrs, stride_sg, k0, dtype: tl.constexpr, USE_DOT: tl.constexpr,
                   ONE_SCALE: tl.constexpr, GROUP_SIZE: tl.constexpr, SWAP: tl.constexpr,
                   COMPILED: tl.constexpr):  # fmt: skip
    """Multiply one decoded 16-row slice (K rows k0 .. k0 + 16) into the span's partial, or, when the span
    holds several groups, scale it by its group's scales into the accumulator; returns (part, acc).
    ``SWAP``: the transposed product (BLOCK_N, BLOCK_M) += q^T x^T, the weights as the A operand."""
    x = tl.load(x_ptrs)
    if SWAP:
        product = tl.dot(tl.trans(q.to(dtype)), tl.trans(_through_registers(x, COMPILED)))
    elif USE_DOT:
        product = tl.dot(x, q.to(dtype))
    else:
        product = x.to(tl.float32)[:, None] * q.to(tl.float32)
    if ONE_SCALE:
        part += product
    elif SWAP:
        acc += product * tl.load(s_ptrs + (k0 // GROUP_SIZE) * stride_sg).to(tl.float32)[:, None]
    else:
        acc += product * tl.load(s_ptrs + (k0 // GROUP_SIZE) * stride_sg).to(tl.float32)[None, :]
    return part, acc


@triton.jit
def _activate(y, ACT: tl.constexpr):
    """The epilogue's activation of an fp32 tile, this kernel's and the Gluon kernel's
    (:mod:`kernels.quant.quant_gemm_ws`):
    ``ACT`` 0 none, 1 GELU's tanh approximation (GPT-2's, as ``F.gelu(approximate="tanh")``), written
    ``y * sigmoid(2u)`` with ``u = sqrt(2 / pi) * (y + 0.044715 y^3)``."""
    if ACT == 1:
        u = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        y = y / (1.0 + tl.exp2(tl.minimum(-2.8853900817779268 * u, 126.0)))  # 2 * log2(e) * u, finite
    return y


@triton.jit
def _reduce_split(acc, y_ptrs, ws_ptrs, cnt_ptr, tile, mask, parts, COMPILED: tl.constexpr, ACT: tl.constexpr = 0):
    """Add this part's partial tile; the last of the tile's ``parts`` to arrive writes Y (through ``ACT``) and
    re-zeroes."""
    tl.atomic_add(ws_ptrs, acc, mask=mask, sem="relaxed")
    # Every thread's partial is issued before the arrival is counted. Compiled, the CTA barrier is written as PTX:
    # the pipeliner leaves a loop that holds tl.debug_barrier unpipelined, and STREAM's loop holds this reduction.
    if COMPILED:
        # One line, no escapes: torch.compile re-emits a user kernel's source inside a string, and torch 2.11
        # leaves a backslash escape there to become a newline inside this literal (a SyntaxError at compile).
        tile = tl.inline_asm_elementwise("bar.sync 0; mov.b32 $0, $1;", "=r,r", [tile], dtype=tl.int32,
                                         is_pure=False, pack=1)  # fmt: skip
    else:
        tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
    if arrived == parts - 1:
        total = tl.load(ws_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(y_ptrs, _activate(total, ACT).to(y_ptrs.dtype.element_ty), mask=mask)
        # The zeros are made from the sums read, so each goes out from the thread that read its element (or
        # through a layout conversion, which has a barrier) after the read. Plain zeros may take the partials'
        # layout, other threads, and clear an element before its reader has read it: Y then held zeros in part of
        # a tile in up to half of the launches (bench/results/int4-roofline-reduce-zero-race-h200.json).
        tl.store(ws_ptrs, tl.where(mask, 0.0, total), mask=mask, cache_modifier=".cg")
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed")


@triton.jit
def _span_product(words, x_ptrs, s_ptrs, acc, k0, stride_xk, stride_sg, dtype: tl.constexpr, BITS: tl.constexpr,
                  GROUP_SIZE: tl.constexpr, FAST_DECODE: tl.constexpr, USE_DOT: tl.constexpr,
                  ONE_SCALE: tl.constexpr, WIDE: tl.constexpr, FOLD: tl.constexpr, SWAP: tl.constexpr,
                  COMPILED: tl.constexpr, x_tile=None):  # fmt: skip
    """Fold one span (K rows ``k0 .. k0 + 16 * PACK``, its words already loaded) into the accumulator;
    ``x_tile``: the span's (BLOCK_M, SPAN) X slice already in shared memory (``TMA`` 2), else X is read here."""
    PACK: tl.constexpr = 32 // BITS
    if ONE_SCALE:  # issued before the decode, so that its latency hides behind it
        scale = tl.load(s_ptrs + (k0 // GROUP_SIZE) * stride_sg)
        if not FOLD:
            scale = scale.to(tl.float32)
    if WIDE:
        if x_tile is None:
            x_t = tl.trans(_through_registers(tl.load(x_ptrs), COMPILED))
        else:  # written by the tensor copy, read by the wgmma: both in the async proxy, no register pass
            x_t = tl.trans(x_tile)
    if FOLD:  # the scaled weights straight into the accumulator: no per-span partial
        weights_t = span_decoded_t(words, dtype, BITS, FAST_DECODE) * scale.to(dtype)[:, None]
        acc = tl.dot(weights_t, x_t, acc)
    else:
        part = tl.zeros_like(acc)
        if WIDE:
            part = tl.dot(span_decoded_t(words, dtype, BITS, FAST_DECODE), x_t)
        elif FAST_DECODE == 2:  # GEMV, int4, one scale per span: raw fp32 values, offsets removed once per span
            part = _span_fp32_pairs(words, x_ptrs, stride_xk, part)
        else:
            for p in tl.static_range(PACK // 2):
                # Slots p and p + PACK / 2 of every word: K rows 16 p and 16 (p + PACK / 2) of the span.
                if FAST_DECODE:
                    q_lo, q_hi = slot_pair_asm(words, p, dtype)
                else:
                    q_lo = slot(words, p, BITS)
                    q_hi = slot(words, p + PACK // 2, BITS)
                part, acc = _slice_product(q_lo, x_ptrs + p * 16 * stride_xk, part, acc, s_ptrs, stride_sg,
                                           k0 + p * 16, dtype, USE_DOT, ONE_SCALE, GROUP_SIZE, SWAP,
                                           COMPILED)  # fmt: skip
                part, acc = _slice_product(q_hi, x_ptrs + (p + PACK // 2) * 16 * stride_xk, part, acc, s_ptrs,
                                           stride_sg, k0 + (p + PACK // 2) * 16, dtype, USE_DOT, ONE_SCALE,
                                           GROUP_SIZE, SWAP, COMPILED)  # fmt: skip
        if ONE_SCALE and SWAP:  # part is (BLOCK_N, BLOCK_M): one scale per row
            acc += part * scale[:, None]
        elif ONE_SCALE:
            acc += part * scale[None, :]
    return acc


@triton.jit
def _tile_offsets(tile, M, N, k0, x_ptr, s_ptr, stride_xm, stride_xk, stride_sn, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, SPAN: tl.constexpr, USE_DOT: tl.constexpr, WIDE: tl.constexpr):  # fmt: skip
    """Tile ``tile``'s rows and columns and its X and scale pointers at K row ``k0`` (M tiles fastest)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid_m = tile % num_pid_m  # M tiles fastest: the programs reading one weight tile run together
    pid_n = tile // num_pid_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if WIDE:
        x_ptrs = x_ptr + (offs_m % M)[:, None] * stride_xm + (k0 + tl.arange(0, SPAN))[None, :] * stride_xk
    elif USE_DOT:
        x_ptrs = x_ptr + (offs_m % M)[:, None] * stride_xm + (k0 + tl.arange(0, 16))[None, :] * stride_xk
    else:
        x_ptrs = x_ptr + pid_m * stride_xm + (k0 + tl.arange(0, 16)) * stride_xk
    return pid_m, pid_n, offs_m, offs_n, x_ptrs, s_ptr + (offs_n % N) * stride_sn


@triton.jit
def _store_tile(acc, pid_m, offs_m, offs_n, M, N, y_ptr, ws_ptr, cnt_ptr, tile, parts, stride_ym, stride_yn,
                USE_DOT: tl.constexpr, SWAP: tl.constexpr, COMPILED: tl.constexpr, PARTIALS: tl.constexpr = False,
                part=0, ACT: tl.constexpr = 0):  # fmt: skip
    """Write the tile's accumulator to Y (``parts == 1``) or add it as one of ``parts`` partial sums; with
    ``PARTIALS`` store it as partial ``part`` of the (parts, M, N) partials at ``ws_ptr`` instead (fp32, or X's
    16-bit dtype: the buffer's type decides). ``ACT``:
    Y goes through :func:`_activate` (never the partials)."""
    if USE_DOT:
        out = acc
        rows = offs_m
    else:
        out = tl.sum(acc, axis=0)[None, :]
        rows = pid_m + tl.arange(0, 1)
    if SWAP:  # out is (BLOCK_N, BLOCK_M): Y's tile transposed
        mask = (rows[None, :] < M) & (offs_n[:, None] < N)
        y_ptrs = y_ptr + rows[None, :] * stride_ym + offs_n[:, None] * stride_yn
        ws_ptrs = ws_ptr + rows[None, :] * N + offs_n[:, None]
    else:
        mask = (rows[:, None] < M) & (offs_n[None, :] < N)
        y_ptrs = y_ptr + rows[:, None] * stride_ym + offs_n[None, :] * stride_yn
        ws_ptrs = ws_ptr + rows[:, None] * N + offs_n[None, :]
    if PARTIALS:
        tl.store(ws_ptrs + part * M * N, out.to(ws_ptr.dtype.element_ty), mask=mask)
    elif parts == 1:
        tl.store(y_ptrs, _activate(out, ACT).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        _reduce_split(out, y_ptrs, ws_ptrs, cnt_ptr, tile, mask, parts, COMPILED, ACT)
