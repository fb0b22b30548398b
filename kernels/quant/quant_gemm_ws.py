"""Weight-only int4/int8 GEMM in Gluon for Hopper: a TMA loader warp feeding one decoding warpgroup that
multiplies on the tensor cores, several such programs per SM, split-K as one even stream.

``Y = X @ dequant(W)`` on :mod:`kernels.quant.quant_layout`'s packed words (the layout of
:mod:`kernels.quant.quant_gemm_packed`; the same weights run on either kernel). Each program computes tiles of
``Y^T = dequant(W)^T X^T`` (swapped: the decoded weights are wgmma's register operand, X its shared-memory
operand; the tile's BLOCK_M columns of Y are the MMA's N, 8 to 64).

- **Work**: all (tile, span) steps of the product, spans fastest, cut into one equal run per program
  (``PROGRAMS_PER_SM`` x SMs programs): every program streams the same share of the weights, with no tail wave
  and no fill and drain per tile. A tile whose spans are split between programs is summed in an fp32
  workspace with atomics; the program that adds the tile's last span writes Y and zeroes the workspace and
  the arrival counter again (:func:`kernels.quant.quant_gemm_packed.scratch`'s, left zeroed by every launch).
- **Loader** (one warp): per step, TMA copies of the span's (16, BLOCK_N) words, its row of scales and the
  ``PACK`` (BLOCK_M, 16) slices of X (``WIDE_X``: its (BLOCK_M, 64) boxes, 128-byte swizzled, the slices 16-column
  views of them) into a ring of ``NUM_STAGES`` stages (a ``ready`` and an ``empty``
  barrier each), so the weights' HBM stream never waits on the decode. ``SWIZZLE`` copies the words as
  128-byte swizzled boxes (no shared-memory bank conflicts when the consumer reads them); ``STAGGER`` issues
  the deeper stages only once the first has landed.
- **Consumer** (one warpgroup): per step, the words go from shared memory straight into the wgmma operand
  layout (word row j is K column j of every slice, so slot i of the words *is* slice i, with no value moving
  between threads); each slice is decoded (int4: one PTX call turns byte b of two words, K rows j and j + 1,
  into the K pairs of slices 2b and 2b + 1; int8: one call turns bytes 2h and 2h + 1 into slices 2h and
  2h + 1), scaled, and multiplied, asynchronously, while the next slice decodes. ``SCALE_ACC`` decodes exact q
  instead and scales the span's fp32 product once per output element (fewer instructions where BLOCK_M is
  small: the fastest at M <= 16 on an H200). ``SLICE_WAIT`` waits for the wgmmas a slice pair at a time, so
  only two pairs' decoded registers are live (else ptxas serializes the wgmmas of wide tiles where a span's
  registers do not fit). ``UNSWAPPED`` (int4, 64-row tiles) is the other orientation: the span decoded into
  shared memory as two (64, BLOCK_N) B operands beside X's two (64, 64) boxes as A, one half decoding while the
  other multiplies.
- ``PDL`` (a programmatic dependent launch): the loader copies the ring's first lap of words and scales before
  ``griddepcontrol.wait`` (no kernel writes them), X only after it, and lets the next kernel launch once its copies
  are issued, so a short product's words stream under the previous kernel's tail.
- **Registers**: ``maxnreg`` is set so that ``PROGRAMS_PER_SM`` programs of 8 warps fit the SM (the loader's
  warpgroup is padded), and ``setmaxnreg`` moves the loader's surplus (``LOADER_REGS``) to the consumer.

X and Y bf16 or fp16 (X row-major with K contiguous), scales in X's dtype, one scale row per ``group_size``
rows, ``group_size`` a multiple of the span (128 rows for int4, 64 for int8). TMA needs N a multiple of 8.
"""

from __future__ import annotations

from typing import Any

import torch
import triton

from kernels.launch import Descriptors, Plan, PlanCache, layout_key, sm_count
from kernels.quant.quant_gemm_packed import scratch
from kernels.quant.quant_layout import SLICE, PackedWeights, pack_factor, span
from kernels.quant.quant_packed_steps import _activate  # the epilogue's GELU, shared with the packed kernel
from kernels.quant.quant_ws_ptx import (  # the decode's inline PTX, one constant per slot pair and type
    _BYTES_BF16_0,
    _BYTES_BF16_1,
    _BYTES_FP16_0,
    _BYTES_FP16_1,
    _Q_BF16_0,
    _Q_BF16_1,
    _Q_BF16_2,
    _Q_BF16_3,
    _Q_FP16_0,
    _Q_FP16_1,
    _Q_FP16_2,
    _Q_FP16_3,
    _QB_BF16_0,
    _QB_BF16_1,
    _QB_FP16_0,
    _QB_FP16_1,
    _SLOTS_BF16_0,
    _SLOTS_BF16_1,
    _SLOTS_BF16_2,
    _SLOTS_BF16_3,
    _SLOTS_FP16_0,
    _SLOTS_FP16_1,
    _SLOTS_FP16_2,
    _SLOTS_FP16_3,
)

# The knobs and static rules live in a module without Triton (a workload's static check reads them); re-exported.
from kernels.quant.quant_ws_rules import BLOCK_MS, BLOCK_NS, KNOBS, SMEM_BYTES, check_config, shared_memory_bytes  # noqa: F401
from kernels.runtime import interpreter_active

try:  # Gluon (Triton >= 3.6); the kernel is defined only where it exists
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from kernels.gluon_compat import tma_load, warps_barrier
except ImportError:  # pragma: no cover - older Triton
    gluon = None

#: K rows of one decoded slice, as a kernel constant.
_SLICE = triton.language.constexpr(SLICE)


def available() -> bool:
    """Whether this Triton has Gluon's Hopper API (the kernel compiles only then, and only for sm_90)."""
    return gluon is not None and not interpreter_active()


if gluon is not None:

    @gluon.jit
    def _as_plain_36(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return buf._reinterpret(dtype, shape, layout)

    @gluon.jit
    def _as_plain_39(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return buf.reinterpret(dtype, shape, layout)

    #: The same shared memory under another layout (Triton 3.6 names it _reinterpret, later releases reinterpret).
    _as_plain = _as_plain_36 if hasattr(gl.shared_memory_descriptor, "_reinterpret") else _as_plain_39

    @gluon.jit
    def _share(M, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SPAN: gl.constexpr):
        """This program's run [start, end) of the (tile, span) steps, the spans per tile and tiles along M."""
        spans = K // SPAN
        m_tiles = gl.cdiv(M, BLOCK_M)
        steps = m_tiles * gl.cdiv(N, BLOCK_N) * spans
        pid = gl.program_id(0)
        programs = gl.num_programs(0)
        start = (pid.to(gl.int64) * steps // programs).to(gl.int32)
        end = ((pid + 1).to(gl.int64) * steps // programs).to(gl.int32)
        return start, end, spans, m_tiles

    @gluon.jit
    def _grid_dependency(WAIT: gl.constexpr):
        """``griddepcontrol``: wait for the kernel this one was launched as a programmatic dependent of (its writes
        visible after), or let this kernel's own dependents launch. Both are no-ops in a plain launch."""
        if WAIT:
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        else:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)  # fmt: skip

    @gluon.jit
    def _load_weights(w_desc, s_desc, w_smem, s_smem, bar, step, stage, spans, m_tiles, nbytes: gl.constexpr,
                      BLOCK_N: gl.constexpr, SPAN: gl.constexpr, GROUP_SIZE: gl.constexpr):  # fmt: skip
        """A step's words and row of scales into a stage, whose barrier expects ``nbytes`` (X's boxes included)."""
        s = step % spans
        n0 = (step // spans // m_tiles) * BLOCK_N
        mbarrier.expect(bar, nbytes)
        tma_load(w_desc, [s * _SLICE, n0], bar, w_smem.index(stage))
        tma_load(s_desc, [(s * SPAN) // GROUP_SIZE, n0], bar, s_smem.index(stage))

    @gluon.jit
    def _load_x(x_desc, x_smem, bar, step, stage, spans, m_tiles, BLOCK_M: gl.constexpr, SPAN: gl.constexpr,
                X_BOXES: gl.constexpr):  # fmt: skip
        """A step's span of X (``X_BOXES`` boxes) into a stage."""
        m0 = (step // spans % m_tiles) * BLOCK_M
        s = step % spans
        for j in gl.static_range(X_BOXES):
            tma_load(x_desc, [m0, s * SPAN + j * (SPAN // X_BOXES)], bar, x_smem.index(stage * X_BOXES + j))

    @gluon.jit
    def _loader(x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, ready, empty, M, N, K, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, SPAN: gl.constexpr, X_BOXES: gl.constexpr, GROUP_SIZE: gl.constexpr,
                NUM_STAGES: gl.constexpr, STAGGER: gl.constexpr, PDL: gl.constexpr):  # fmt: skip
        """One warp: every step's words, scales and X's span (``X_BOXES`` boxes) into the ring, in order.
        ``STAGGER``: the first step's copies land before the others are issued, so that every program's first span
        comes from HBM ahead of the ring's deeper stages (at launch all programs ask at once) and its decode starts
        sooner. ``PDL`` (a programmatic dependent launch): the first ``NUM_STAGES`` steps' words and scales, which
        no kernel writes, are copied before the wait for the kernel before this one, and only X after it; once
        every copy is issued, this kernel's dependents may launch."""
        start, end, spans, m_tiles = _share(M, N, K, BLOCK_M, BLOCK_N, SPAN)
        nbytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes + X_BOXES * x_desc.block_type.nbytes
        first = start
        if PDL:
            ahead = end - start
            if ahead > NUM_STAGES:
                ahead = NUM_STAGES
            for i in range(0, ahead):  # the ring's first lap: every stage free
                _load_weights(w_desc, s_desc, w_smem, s_smem, ready.index(i), start + i, i, spans, m_tiles, nbytes,
                              BLOCK_N, SPAN, GROUP_SIZE)  # fmt: skip
            _grid_dependency(True)
            for i in range(0, ahead):
                _load_x(x_desc, x_smem, ready.index(i), start + i, i, spans, m_tiles, BLOCK_M, SPAN, X_BOXES)
            first = start + ahead
        for step in range(first, end):
            i = step - start
            stage = i % NUM_STAGES
            # A fresh barrier's "previous phase" (parity 1) counts as complete: the first lap does not wait.
            mbarrier.wait(empty.index(stage), ((i // NUM_STAGES) & 1) ^ 1)
            if STAGGER:
                if i == 1:
                    mbarrier.wait(ready.index(0), 0)
            bar = ready.index(stage)
            _load_weights(w_desc, s_desc, w_smem, s_smem, bar, step, stage, spans, m_tiles, nbytes, BLOCK_N, SPAN,
                          GROUP_SIZE)  # fmt: skip
            _load_x(x_desc, x_smem, bar, step, stage, spans, m_tiles, BLOCK_M, SPAN, X_BOXES)
        if PDL:
            _grid_dependency(False)

    @gluon.jit
    def _slots(words, scale2, b: gl.constexpr, IS_BF16: gl.constexpr):
        """Slots 2b and 2b + 1 of int4 words, decoded and scaled, as wgmma's K pairs (PTX, two words a call)."""
        if IS_BF16:
            if b == 0:
                asm: gl.constexpr = _SLOTS_BF16_0
            elif b == 1:
                asm: gl.constexpr = _SLOTS_BF16_1
            elif b == 2:
                asm: gl.constexpr = _SLOTS_BF16_2
            else:
                asm: gl.constexpr = _SLOTS_BF16_3
            return gl.inline_asm_elementwise(asm, "=r,=r,r,r,r,r", [words, scale2], dtype=(gl.bfloat16, gl.bfloat16),
                                             is_pure=True, pack=2)  # fmt: skip
        else:
            if b == 0:
                asm: gl.constexpr = _SLOTS_FP16_0
            elif b == 1:
                asm: gl.constexpr = _SLOTS_FP16_1
            elif b == 2:
                asm: gl.constexpr = _SLOTS_FP16_2
            else:
                asm: gl.constexpr = _SLOTS_FP16_3
            return gl.inline_asm_elementwise(asm, "=r,=r,r,r,r,r", [words, scale2], dtype=(gl.float16, gl.float16),
                                             is_pure=True, pack=2)  # fmt: skip

    @gluon.jit
    def _slots_q(words, b: gl.constexpr, IS_BF16: gl.constexpr):
        """Slots 2b and 2b + 1 of int4 words as exact q, wgmma's K pairs (no scale)."""
        if IS_BF16:
            if b == 0:
                asm: gl.constexpr = _Q_BF16_0
            elif b == 1:
                asm: gl.constexpr = _Q_BF16_1
            elif b == 2:
                asm: gl.constexpr = _Q_BF16_2
            else:
                asm: gl.constexpr = _Q_BF16_3
            return gl.inline_asm_elementwise(asm, "=r,=r,r,r", [words], dtype=(gl.bfloat16, gl.bfloat16),
                                             is_pure=True, pack=2)  # fmt: skip
        else:
            if b == 0:
                asm: gl.constexpr = _Q_FP16_0
            elif b == 1:
                asm: gl.constexpr = _Q_FP16_1
            elif b == 2:
                asm: gl.constexpr = _Q_FP16_2
            else:
                asm: gl.constexpr = _Q_FP16_3
            return gl.inline_asm_elementwise(asm, "=r,=r,r,r", [words], dtype=(gl.float16, gl.float16),
                                             is_pure=True, pack=2)  # fmt: skip

    @gluon.jit
    def _packed_scale(scale):
        """Each 16-bit scale twice in one 32-bit register (the second operand of a packed multiply)."""
        return gl.inline_asm_elementwise("mov.b32 $0, {$1, $1};", "=r,h", [scale], dtype=gl.int32, is_pure=True,
                                         pack=1)  # fmt: skip

    @gluon.jit
    def _bytes(words, scale2, h: gl.constexpr, IS_BF16: gl.constexpr):
        """Slots 2h and 2h + 1 of int8 words, decoded and scaled, as wgmma's K pairs (PTX, two words a call)."""
        if IS_BF16:
            asm: gl.constexpr = _BYTES_BF16_0 if h == 0 else _BYTES_BF16_1
            return gl.inline_asm_elementwise(asm, "=r,=r,r,r,r,r", [words, scale2], dtype=(gl.bfloat16, gl.bfloat16),
                                             is_pure=True, pack=2)  # fmt: skip
        else:
            asm: gl.constexpr = _BYTES_FP16_0 if h == 0 else _BYTES_FP16_1
            return gl.inline_asm_elementwise(asm, "=r,=r,r,r,r,r", [words, scale2], dtype=(gl.float16, gl.float16),
                                             is_pure=True, pack=2)  # fmt: skip

    @gluon.jit
    def _bytes_q(words, h: gl.constexpr, IS_BF16: gl.constexpr):
        """Slots 2h and 2h + 1 of int8 words as exact q, wgmma's K pairs (no scale)."""
        if IS_BF16:
            asm: gl.constexpr = _QB_BF16_0 if h == 0 else _QB_BF16_1
            return gl.inline_asm_elementwise(asm, "=r,=r,r,r", [words], dtype=(gl.bfloat16, gl.bfloat16),
                                             is_pure=True, pack=2)  # fmt: skip
        else:
            asm: gl.constexpr = _QB_FP16_0 if h == 0 else _QB_FP16_1
            return gl.inline_asm_elementwise(asm, "=r,=r,r,r", [words], dtype=(gl.float16, gl.float16),
                                             is_pure=True, pack=2)  # fmt: skip

    @gluon.jit
    def _pair(words, scale2, p: gl.constexpr, BITS: gl.constexpr, IS_BF16: gl.constexpr):
        """Slots 2p and 2p + 1 of the words, decoded and scaled: int4's two nibbles of byte p, int8's bytes."""
        if BITS == 4:
            return _slots(words, scale2, p, IS_BF16)
        else:
            return _bytes(words, scale2, p, IS_BF16)

    @gluon.jit
    def _pair_q(words, p: gl.constexpr, BITS: gl.constexpr, IS_BF16: gl.constexpr):
        """Slots 2p and 2p + 1 of the words as exact q (no scale)."""
        if BITS == 4:
            return _slots_q(words, p, IS_BF16)
        else:
            return _bytes_q(words, p, IS_BF16)

    @gluon.jit
    def _words_and_scales(w_smem, s_smem, stage, BLOCK_N: gl.constexpr, SWIZZLE: gl.constexpr):
        """A stage's (16, BLOCK_N) words and its row of scales, as shared buffers in the layouts TMA wrote."""
        if SWIZZLE:  # 128-byte swizzled boxes: the layout TMA wrote, so read as it is (no bank conflicts)
            w_buf = w_smem.index(stage)
        else:  # TMA wrote the boxes unswizzled, row-major: read them as that (an NVMMA layout of swizzle 0 is
            # read as the MMA's 8-row core matrices, a different order).
            w_buf = _as_plain(
                w_smem.index(stage), gl.int32, [_SLICE, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
            )
        s_buf = _as_plain(s_smem.index(stage), s_smem.dtype, [BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        return w_buf, s_buf

    @gluon.jit
    def _finish(acc, tile, parts, spans, m0, n0, M, N, y_ptr, ws_ptr, cnt_ptr, stride_ym, stride_yn,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, DIAG: gl.constexpr, ACT: gl.constexpr = 0):  # fmt: skip
        """Store a tile's sum over ``parts`` of its spans: straight to Y when it is all of them, else added to
        the workspace, and the program that brings the tile's count to ``spans`` writes Y and re-zeroes; Y goes
        through ``ACT`` (:func:`_activate`)."""
        layout: gl.constexpr = acc.type.layout
        offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
        offs_m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, layout))
        mask = (gl.expand_dims(offs_n, 1) < N) & (gl.expand_dims(offs_m, 0) < M)
        y_ptrs = y_ptr + gl.expand_dims(offs_m, 0) * stride_ym + gl.expand_dims(offs_n, 1) * stride_yn
        if parts == spans:
            gl.store(y_ptrs, _activate(acc, ACT).to(y_ptr.dtype.element_ty), mask=mask)
        else:
            ws_ptrs = ws_ptr + gl.expand_dims(offs_m, 0) * N + gl.expand_dims(offs_n, 1)
            gl.atomic_add(ws_ptrs, acc, mask=mask, sem="relaxed")
            if DIAG == 2:  # the partials' atomics alone: no arrival count, no last program's sum
                return
            warps_barrier()  # every thread's partial is issued before the arrival is counted
            arrived = gl.atomic_add(cnt_ptr + tile, parts, sem="acq_rel")
            if arrived + parts == spans:
                total = gl.load(ws_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
                gl.store(y_ptrs, _activate(total, ACT).to(y_ptr.dtype.element_ty), mask=mask)
                # Zeros made from the sums read: each goes out from the thread that read its element.
                gl.store(ws_ptrs, gl.where(mask, 0.0, total), mask=mask, cache_modifier=".cg")
                gl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed")

    @gluon.jit
    def _x_slice(x_smem, stage, j: gl.constexpr, PACK: gl.constexpr):
        """X's (BLOCK_M, 16) slice j of a stage's span: a box of its own, or (``WIDE_X``) 16 columns of a 64-column
        box (128-byte swizzled: two TMA copies a span instead of eight)."""
        WIDTH: gl.constexpr = x_smem.shape[2]
        if WIDTH == _SLICE:
            return x_smem.index(stage * PACK + j)
        else:
            BOXES: gl.constexpr = PACK * _SLICE // WIDTH
            return x_smem.index(stage * BOXES + j * _SLICE // WIDTH).slice(j * _SLICE % WIDTH, _SLICE, dim=1)

    @gluon.jit
    def _span_scaled(acc, words, s_buf, x_smem, stage, a_layout: gl.constexpr, dtype: gl.constexpr,
                     PACK: gl.constexpr, BITS: gl.constexpr, SLICE_WAIT: gl.constexpr):  # fmt: skip
        """One span's weights decoded and scaled into wgmma's register operand, multiplied into acc."""
        scale = s_buf.load(gl.SliceLayout(1, a_layout))
        scale2 = gl.broadcast(gl.expand_dims(_packed_scale(scale), 1), words)[0]
        for p in gl.static_range(PACK // 2):
            even, odd = _pair(words, scale2, p, BITS, dtype == gl.bfloat16)
            acc = warpgroup_mma(even, _x_slice(x_smem, stage, 2 * p, PACK).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma(odd, _x_slice(x_smem, stage, 2 * p + 1, PACK).permute((1, 0)), acc, is_async=True)
            if SLICE_WAIT:  # the pair before this one done: its decoded registers free again
                acc = warpgroup_mma_wait(2, deps=(acc,))
        return warpgroup_mma_wait(0, deps=(acc,))

    @gluon.jit
    def _span(acc, w_smem, s_smem, x_smem, empty, stage, acc_layout: gl.constexpr, a_layout: gl.constexpr,
              dtype: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, PACK: gl.constexpr,
              BITS: gl.constexpr, SCALE_ACC: gl.constexpr, SWIZZLE: gl.constexpr,
              SLICE_WAIT: gl.constexpr):  # fmt: skip
        """One step's span: words decoded into wgmma's register operand and multiplied into acc; the stage is
        released once the product has read it."""
        w_buf, s_buf = _words_and_scales(w_smem, s_smem, stage, BLOCK_N, SWIZZLE)
        words = w_buf.permute((1, 0)).load(a_layout)  # (BLOCK_N, 16): word row j is K column j
        if SCALE_ACC:  # the span's product of exact q, scaled once per output element
            scale_acc = gl.expand_dims(s_buf.load(gl.SliceLayout(1, acc_layout)).to(gl.float32), 1)
            part = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_layout)
            for p in gl.static_range(PACK // 2):
                even, odd = _pair_q(words, p, BITS, dtype == gl.bfloat16)
                part = warpgroup_mma(even, _x_slice(x_smem, stage, 2 * p, PACK).permute((1, 0)), part,
                                     use_acc=p > 0, is_async=True)  # fmt: skip
                part = warpgroup_mma(odd, _x_slice(x_smem, stage, 2 * p + 1, PACK).permute((1, 0)), part,
                                     is_async=True)  # fmt: skip
                if SLICE_WAIT:  # the pair before this one done: its decoded registers free again
                    part = warpgroup_mma_wait(2, deps=(part,))
            part = warpgroup_mma_wait(0, deps=(part,))
            mbarrier.arrive(empty.index(stage), count=1)
            acc = acc + part * scale_acc
        else:
            acc = _span_scaled(acc, words, s_buf, x_smem, stage, a_layout, dtype, PACK, BITS, SLICE_WAIT)
            mbarrier.arrive(empty.index(stage), count=1)
        return acc

    @gluon.jit
    def _consumer(y_ptr, ws_ptr, cnt_ptr, x_smem, w_smem, s_smem, ready, empty, M, N, K, stride_ym, stride_yn,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SPAN: gl.constexpr, PACK: gl.constexpr,
                  BITS: gl.constexpr, NUM_STAGES: gl.constexpr, SCALE_ACC: gl.constexpr, SWIZZLE: gl.constexpr,
                  SLICE_WAIT: gl.constexpr, DIAG: gl.constexpr, ACT: gl.constexpr):  # fmt: skip
        """One warpgroup: decode each step's span slice by slice into wgmma's register operand."""
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BLOCK_M, 16])  # fmt: skip
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        dtype: gl.constexpr = y_ptr.dtype.element_ty
        start, end, spans, m_tiles = _share(M, N, K, BLOCK_M, BLOCK_N, SPAN)
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_layout)
        first = start % spans  # the first span of the current tile's part
        for step in range(start, end):
            i = step - start
            stage = i % NUM_STAGES
            mbarrier.wait(ready.index(stage), (i // NUM_STAGES) & 1)
            if DIAG == 1:  # the loader's stream alone
                mbarrier.arrive(empty.index(stage), count=1)
            else:
                acc = _span(acc, w_smem, s_smem, x_smem, empty, stage, acc_layout, a_layout, dtype, BLOCK_N, BLOCK_M,
                            PACK, BITS, SCALE_ACC, SWIZZLE, SLICE_WAIT)  # fmt: skip
                s = step % spans
                if (s == spans - 1) | (step == end - 1):  # the tile's part ends here
                    tile = step // spans
                    _finish(acc, tile, s - first + 1, spans, (tile % m_tiles) * BLOCK_M, (tile // m_tiles) * BLOCK_N,
                            M, N, y_ptr, ws_ptr, cnt_ptr, stride_ym, stride_yn, BLOCK_M, BLOCK_N, DIAG,
                            ACT)  # fmt: skip
                    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_layout)
                    first = 0

    @gluon.jit
    def _decode_half(words, scale, b_smem, h: gl.constexpr, IS_BF16: gl.constexpr):
        """Slices 4h..4h + 3 of the span (bytes 2h and 2h + 1 of the words), scaled, into half h of the decoded
        span: its (64, BLOCK_N) B operand, visible to the wgmma once every thread is past it."""
        e0, o0 = _slots_q(words, 2 * h, IS_BF16)
        e1, o1 = _slots_q(words, 2 * h + 1, IS_BF16)
        # the four (16, BLOCK_N) slices stacked along K in registers (no data moves), so that one store writes the
        # half: separate stores into one buffer each get a CTA barrier (the barrier pass sees one allocation)
        four = gl.join(gl.join(e0 * scale, o0 * scale), gl.join(e1 * scale, o1 * scale))  # (16, BLOCK_N, 2, 2)
        half = gl.reshape(gl.permute(four, (3, 2, 0, 1)), [4 * _SLICE, words.shape[1]])
        b_smem.index(h).store(half)
        fence_async_shared()
        warps_barrier()  # every thread's slices are in shared memory before the wgmma reads them

    @gluon.jit
    def _consumer_unswapped(y_ptr, ws_ptr, cnt_ptr, x_smem, w_smem, s_smem, b_smem, ready, empty, M, N, K, stride_ym,
                            stride_yn, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SPAN: gl.constexpr,
                            NUM_STAGES: gl.constexpr, SWIZZLE: gl.constexpr, ACT: gl.constexpr):  # fmt: skip
        """``UNSWAPPED`` (int4, 64-row tiles): each span's weights decoded into shared memory as two (64, BLOCK_N)
        B operands, beside X's two (64, 64) boxes as A, so one wgmma of K = 64 covers all BLOCK_N columns of 64 rows
        (the swapped tile's wgmmas are 64 weight columns by BLOCK_M rows). Pipelined by halves: half h + 1 decodes
        while half h multiplies, and a stage is released once the next span's first wgmma is issued (its X's second
        box is read by then). Words are read 8 columns a thread; the PTX decode pairs neighbouring columns."""
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BLOCK_N, 16])  # fmt: skip
        TPW_N: gl.constexpr = BLOCK_N // 8 if BLOCK_N < 256 else 32
        w_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPW_N, TPW_N], [4, 1], [1, 0])
        is_bf16: gl.constexpr = y_ptr.dtype.element_ty == gl.bfloat16
        start, end, spans, m_tiles = _share(M, N, K, BLOCK_M, BLOCK_N, SPAN)
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
        first = start % spans
        held = -1  # the stage whose X the last wgmma issued still reads (-1: none)
        for step in range(start, end):
            i = step - start
            stage = i % NUM_STAGES
            mbarrier.wait(ready.index(stage), (i // NUM_STAGES) & 1)
            w_buf, s_buf = _words_and_scales(w_smem, s_smem, stage, BLOCK_N, SWIZZLE)
            words = w_buf.load(w_layout)  # (16, BLOCK_N): row j is K column j of every slice
            scale = gl.expand_dims(s_buf.load(gl.SliceLayout(0, w_layout)), 0)
            _decode_half(words, scale, b_smem, 0, is_bf16)  # the last span's second half multiplies meanwhile
            acc = warpgroup_mma(x_smem.index(2 * stage), b_smem.index(0), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc,))  # the last span's second half done: its stage is free
            if held >= 0:
                mbarrier.arrive(empty.index(held), count=1)
            _decode_half(words, scale, b_smem, 1, is_bf16)  # while the first half multiplies
            acc = warpgroup_mma(x_smem.index(2 * stage + 1), b_smem.index(1), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc,))  # the first half done: its rows of b_smem are free again
            held = stage
            s = step % spans
            if (s == spans - 1) | (step == end - 1):
                acc = warpgroup_mma_wait(0, deps=(acc,))
                mbarrier.arrive(empty.index(stage), count=1)
                held = -1
                tile = step // spans
                _finish(gl.permute(acc, (1, 0)), tile, s - first + 1, spans, (tile % m_tiles) * BLOCK_M,
                        (tile // m_tiles) * BLOCK_N, M, N, y_ptr, ws_ptr, cnt_ptr, stride_ym, stride_yn, BLOCK_M,
                        BLOCK_N, 0, ACT)  # fmt: skip
                acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
                first = 0

    @gluon.jit
    def ws_quant_kernel(x_desc, w_desc, s_desc, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_ym, stride_yn,
                        BITS: gl.constexpr, GROUP_SIZE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        NUM_STAGES: gl.constexpr, LOADER_REGS: gl.constexpr, SCALE_ACC: gl.constexpr,
                        SWIZZLE: gl.constexpr, SLICE_WAIT: gl.constexpr, STAGGER: gl.constexpr,
                        UNSWAPPED: gl.constexpr, WIDE_X: gl.constexpr, PDL: gl.constexpr, B_LAYOUT: gl.constexpr,
                        ACT: gl.constexpr, DIAG: gl.constexpr):  # fmt: skip
        """A persistent program: one loader warp and one consumer warpgroup over an equal run of steps."""
        PACK: gl.constexpr = 32 // BITS
        SPAN: gl.constexpr = 16 * PACK
        # X's span as PACK (BLOCK_M, 16) slices, or (WIDE_X, UNSWAPPED's A operands) 64-column boxes, 128-byte swizzled
        X_BOXES: gl.constexpr = SPAN // 64 if (UNSWAPPED or WIDE_X) else PACK
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [NUM_STAGES * X_BOXES, BLOCK_M, SPAN // X_BOXES],
                                           x_desc.layout)  # fmt: skip
        w_smem = gl.allocate_shared_memory(gl.int32, [NUM_STAGES, _SLICE, BLOCK_N], w_desc.layout)
        s_smem = gl.allocate_shared_memory(s_desc.dtype, [NUM_STAGES, 1, BLOCK_N], s_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        if UNSWAPPED:
            b_smem = gl.allocate_shared_memory(x_desc.dtype, [2, SPAN // 2, BLOCK_N], B_LAYOUT)
            gl.warp_specialize(
                [
                    (_consumer_unswapped, (y_ptr, ws_ptr, cnt_ptr, x_smem, w_smem, s_smem, b_smem, ready, empty, M, N,
                                           K, stride_ym, stride_yn, BLOCK_M, BLOCK_N, SPAN, NUM_STAGES, SWIZZLE,
                                           ACT)),
                    (_loader, (x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, ready, empty, M, N, K, BLOCK_M,
                               BLOCK_N, SPAN, X_BOXES, GROUP_SIZE, NUM_STAGES, STAGGER, PDL)),
                ],
                [1],
                [LOADER_REGS],
            )  # fmt: skip
        else:
            gl.warp_specialize(
                [
                    (_consumer, (y_ptr, ws_ptr, cnt_ptr, x_smem, w_smem, s_smem, ready, empty, M, N, K, stride_ym,
                                 stride_yn, BLOCK_M, BLOCK_N, SPAN, PACK, BITS, NUM_STAGES, SCALE_ACC, SWIZZLE,
                                 SLICE_WAIT, DIAG, ACT)),
                    (_loader, (x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, ready, empty, M, N, K, BLOCK_M,
                               BLOCK_N, SPAN, X_BOXES, GROUP_SIZE, NUM_STAGES, STAGGER, PDL)),
                ],
                [1],
                [LOADER_REGS],
            )  # fmt: skip


def _meta(m: int, n: int, k: int, bits: int, group_size: int, knobs: dict[str, Any],
          dtype: torch.dtype) -> dict[str, Any]:  # fmt: skip
    unknown = set(knobs) - set(KNOBS)
    if unknown:
        raise ValueError(f"unknown knobs of the warp-specialized int{bits} GEMM: {sorted(unknown)}")
    merged = {**KNOBS, **{name: int(value) for name, value in knobs.items()}}
    reason = check_config(m, n, k, bits, group_size, **merged)
    if reason:
        raise ValueError(reason)
    # Registers a thread at launch, so that PROGRAMS_PER_SM programs of 8 warps (the loader's warpgroup is
    # padded) fit the SM's 65,536; setmaxnreg then moves the loader's surplus to the consumer.
    maxnreg = min(256, 65536 // (256 * merged.pop("PROGRAMS_PER_SM")) // 8 * 8)
    # UNSWAPPED's decoded span: two (SPAN / 2, BLOCK_N) B operands, N contiguous (a constexpr of every compile).
    element = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    b_layout = gl.NVMMASharedLayout.get_default_for([span(bits) // 2, merged["BLOCK_N"]], element)
    launch = {"launch_pdl": True} if merged["PDL"] else {}  # a programmatic dependent of the kernel before
    return {"BITS": bits, "GROUP_SIZE": group_size, **merged, "B_LAYOUT": b_layout, "num_warps": 4, "maxnreg": maxnreg,
            **launch}  # fmt: skip


def _steps(m: int, n: int, k: int, bits: int, meta: dict[str, Any]) -> tuple[int, int]:
    """(all (tile, span) steps, tiles)."""
    tiles = triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"])
    return tiles * (k // span(bits)), tiles


def _descriptors(x: Any, qweight: Any, scales: Any, m: int, n: int, k: int, bits: int, meta: dict[str, Any]) -> tuple:
    dtype = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    bm, bn = meta["BLOCK_M"], meta["BLOCK_N"]
    x_box = [bm, 64 if meta["UNSWAPPED"] or meta["WIDE_X"] else SLICE]  # X's span in 64-column boxes or 16-column
    words = gl.NVMMASharedLayout(swizzle_byte_width=128 if meta["SWIZZLE"] else 0, element_bitwidth=32, rank=2)
    plain16 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    rows = k // pack_factor(bits)
    groups = k // meta["GROUP_SIZE"]
    return (
        TensorDescriptor(x, [m, k], [k, 1], x_box, gl.NVMMASharedLayout.get_default_for(x_box, dtype)),
        TensorDescriptor(qweight, [rows, n], [n, 1], [SLICE, bn], words),
        TensorDescriptor(scales, [groups, n], [n, 1], [1, bn], plain16),
    )


#: :func:`ws_quant_matmul`'s launch plans.
_PLANS = PlanCache()


def ws_quant_matmul(
    x: torch.Tensor,
    weights: PackedWeights,
    *,
    out: torch.Tensor | None = None,
    num_sms: int | None = None,
    **knobs: Any,
) -> torch.Tensor:
    """``Y = X @ dequant(weights)``, one launch on the current stream: ``x`` (M, K) bf16/fp16 row-major,
    ``weights`` in the packed layout with scales in x's dtype, ``out`` (M, N) contiguous in x's dtype.
    ``knobs``: those of :data:`KNOBS`. ``num_sms``: the SMs to spread over (default: the device's)."""
    qweight, scales = weights.qweight, weights.scales
    key = (layout_key(x, qweight, scales, out), x.device, weights.bits, weights.group_size, num_sms,
           tuple(knobs.items()))  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        if not available():
            raise ValueError("the warp-specialized quantized GEMM needs Gluon (Triton >= 3.6) on an sm_90 GPU")
        if x.dtype not in (torch.bfloat16, torch.float16) or x.ndim != 2 or x.stride(1) != 1 or (x.shape[1] * 2) % 16:
            raise ValueError(f"x must be 2-D bf16/fp16 with contiguous rows of 16-byte multiples, got {x.dtype} "
                             f"{tuple(x.shape)} strides {x.stride()}")  # fmt: skip
        bits, group_size = weights.bits, weights.group_size
        m, k = x.shape
        n = qweight.shape[1]
        if qweight.dtype != torch.int32 or not qweight.is_contiguous() or qweight.shape[0] * pack_factor(bits) != k:
            raise ValueError(f"qweight must be contiguous int32 ({k // pack_factor(bits)}, {n}), got {qweight.dtype} "
                             f"{tuple(qweight.shape)}")  # fmt: skip
        if scales.dtype != x.dtype or not scales.is_contiguous() or tuple(scales.shape) != (k // group_size, n):
            raise ValueError(f"scales must be contiguous {x.dtype} ({k // group_size}, {n}), got {scales.dtype} "
                             f"{tuple(scales.shape)}")  # fmt: skip
        meta = _meta(m, n, k, bits, group_size, knobs, x.dtype)
        if out is None:
            out = torch.empty((m, n), device=x.device, dtype=x.dtype)
        elif tuple(out.shape) != (m, n) or out.dtype != x.dtype:
            raise ValueError(f"out must be ({m}, {n}) {x.dtype}, got {tuple(out.shape)} {out.dtype}")
        steps, tiles = _steps(m, n, k, bits, meta)
        programs = min(steps, (sm_count(x.device) if num_sms is None else num_sms) * int(
            {**KNOBS, **knobs}["PROGRAMS_PER_SM"]))  # fmt: skip
        ints = (m, n, k, out.stride(0), out.stride(1))
        plan = _PLANS.put(key, Plan(ws_quant_kernel, (programs,), meta, ints=ints, scratch=(m * n, tiles),
                                    descs=Descriptors(), box=(m, n, k, bits, meta)))  # fmt: skip
    elif out is None:
        out = torch.empty(plan.state["ints"][:2], device=x.device, dtype=x.dtype)
    state = plan.state
    # split-K's scratch is looked up at every call: a larger product may have replaced it since
    ws, cnt = scratch(x.device, *state["scratch"])
    descs = state["descs"].get((x.data_ptr(), qweight.data_ptr(), scales.data_ptr()), _descriptors, x, qweight,
                               scales, *state["box"])  # fmt: skip
    plan.launch(*descs, out, ws, cnt, *state["ints"])
    return out


def _mock_args(m: int, n: int, k: int, bits: int, precision: torch.dtype, meta: dict[str, Any]) -> tuple[Any, ...]:
    from kernels.attention.attention import mock_tensor_class

    MockTensor = mock_tensor_class()
    x = MockTensor(precision, [m, k])
    qweight = MockTensor(torch.int32, [k // pack_factor(bits), n])
    scales = MockTensor(precision, [k // meta["GROUP_SIZE"], n])
    y, ws, cnt = MockTensor(precision, [m, n]), MockTensor(torch.float32, [m * n]), MockTensor(torch.int32, [64])
    return (*_descriptors(x, qweight, scales, m, n, k, bits, meta), y, ws, cnt, m, n, k, n, 1)


def compile_only(m: int, n: int, k: int, *, bits: int = 4, group_size: int = 128,
                 precision: torch.dtype = torch.bfloat16, num_sms: int | None = None,
                 **knobs: Any) -> Any | None:  # fmt: skip
    """Compile the kernel :func:`ws_quant_matmul` launches for the current GPU, without launching it (None when
    Gluon is missing or the kernels are interpreted): a process pool can fill the cache ahead."""
    if not available():
        return None
    meta = _meta(m, n, k, bits, group_size, knobs, precision)
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    programs = min(_steps(m, n, k, bits, meta)[0], num_sms * int({**KNOBS, **knobs}["PROGRAMS_PER_SM"]))
    args = _mock_args(m, n, k, bits, precision, meta)
    return ws_quant_kernel.warmup(*args, **meta, grid=(programs,))


def compile_for_target(m: int, n: int, k: int, *, bits: int = 4, group_size: int = 128,
                       precision: torch.dtype = torch.bfloat16, capability: int = 90, **knobs: Any) -> Any:  # fmt: skip
    """``triton.compile`` for ``GPUTarget("cuda", capability, 32)`` with no GPU (PTX, registers, shared memory)."""
    from kernels.attention.attention import compile_jit_for_target

    meta = _meta(m, n, k, bits, group_size, knobs, precision)
    return compile_jit_for_target(ws_quant_kernel, _mock_args(m, n, k, bits, precision, meta), meta, capability)
