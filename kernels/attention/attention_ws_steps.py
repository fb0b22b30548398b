"""The consumer side of :mod:`kernels.attention.attention_ws`, in Gluon: the work items a program takes, the masks and
the
base-2 online softmax, the consumer warpgroups' key-block loops (plain, ``OVERLAP``, ``CHAIN``) and the epilogue.

Device functions, and the host side of ``WARP_ARRIVE`` (the K/V empty barriers' shared-memory offset, read from a
first compile's PTX); the partitions, the loader, the kernel and its launch live in
:mod:`kernels.attention.attention_ws`.
"""

from __future__ import annotations

import re
from typing import Any

import triton

from kernels.attention.attention_ws_rules import EXP_PACK

try:  # Gluon (Triton >= 3.6); the functions are defined only where it exists
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
except ImportError:  # pragma: no cover - older Triton
    gluon = None

MASKED_SCORE = triton.language.constexpr(-1.0e30)  # finite: a fully masked block cannot make NaN
# How a consumer frees a K/V slot (the kernel's ARRIVE_AT; >= 0: one lane a warp, at that byte offset): see _release.
ARRIVE_ONE_THREAD = triton.language.constexpr(-1)
ARRIVE_EVERY_THREAD = triton.language.constexpr(-2)
ARRIVE_WARPS_UNPLACED = triton.language.constexpr(-3)


#: ``EXP_POLY``: 2^f on [-0.5, 0.5], degree 3, minimax in relative error (7.5e-5: a bf16 probability rounds at
#: 3.9e-3), lowest power first. Rounded to fp32, they are the immediates of the PTX below.
EXP2_POLY_COEFFS = (0.99992807, 0.69326099, 0.24261114, 0.05517167)
#: The fewest scores ``EXP_POLY`` lets the exponential unit take: x < this is raised to it (2^-125, still a normal
#: fp32, so that adding the integer part to the exponent field cannot wrap; masked scores land here, not at 0).
EXP2_POLY_FLOOR = -125.0


def _f32_hex(value: float) -> str:
    """A PTX fp32 immediate (``0f`` and the eight hex digits of the rounded value)."""
    import struct

    return "0f" + struct.pack(">f", value).hex().upper()


def exp2_asm(poly: int) -> str:
    """PTX for ``2^x`` of ``EXP_PACK`` scores ($EXP_PACK.. in, $0.. out): the first ``EXP_PACK - poly`` on the
    multi-function unit (``ex2.approx.ftz``, 16 a clock an SM on sm_90), the last ``poly`` on the FMA pipe (128 a
    clock): FlashAttention-4's exponential, split between the two units. x is raised to
    :data:`EXP2_POLY_FLOOR`, rounded to an integer j by adding 1.5 * 2^23 (the sum's low mantissa bits are j), the
    polynomial :data:`EXP2_POLY_COEFFS` evaluated at f = x - j in [-0.5, 0.5] by Horner (three FMAs), and j added
    to its exponent field (the sum's bits shifted left by 23)."""
    c0, c1, c2, c3 = map(_f32_hex, EXP2_POLY_COEFFS)
    magic, floor = _f32_hex(1.5 * 2**23), _f32_hex(EXP2_POLY_FLOOR)
    lines = ["{", ".reg .f32 x, t, j, f, p;", ".reg .b32 e, b;"]
    for i in range(EXP_PACK):
        out, arg = f"${i}", f"${EXP_PACK + i}"
        if i < EXP_PACK - poly:
            lines.append(f"ex2.approx.ftz.f32 {out}, {arg};")
            continue
        lines += [
            f"max.ftz.f32 x, {arg}, {floor};",
            f"add.rn.ftz.f32 t, x, {magic};",
            f"sub.rn.ftz.f32 j, t, {magic};",
            "sub.rn.ftz.f32 f, x, j;",
            f"fma.rn.ftz.f32 p, f, {c3}, {c2};",
            f"fma.rn.ftz.f32 p, p, f, {c1};",
            f"fma.rn.ftz.f32 p, p, f, {c0};",
            "mov.b32 e, t;",
            "shl.b32 e, e, 23;",
            "mov.b32 b, p;",
            "add.s32 b, b, e;",
            f"mov.b32 {out}, b;",
        ]
    return " ".join([*lines, "}"])


_EXP2_ASM_1 = triton.language.constexpr(exp2_asm(1))
_EXP2_ASM_2 = triton.language.constexpr(exp2_asm(2))
_EXP2_ASM_3 = triton.language.constexpr(exp2_asm(3))
_EXP2_ASM_4 = triton.language.constexpr(exp2_asm(4))
_EXP_PACK = triton.language.constexpr(EXP_PACK)
_EXP2_CONSTRAINTS = triton.language.constexpr(",".join(["=f"] * EXP_PACK + ["f"] * EXP_PACK))

#: kv_empty's byte offset in shared memory, per kernel specialization (WARP_ARRIVE's inline PTX needs it).
_EMPTY_OFFSETS: dict[tuple, int] = {}


def empty_barrier_offsets(ptx: str, count: int) -> list[int]:
    """Byte offsets (from ``global_smem``) of the mbarriers the kernel's PTX initializes with arrival count
    ``count``, in order; the offsets are read from the ``add.s32 %r, %base, imm`` that forms each address."""
    base = re.search(r"mov\.(?:b32|u32)\s+(%r\d+), global_smem;", ptx)
    if base is None:
        return []
    adds = dict(re.findall(rf"add\.s32\s+(%r\d+), {re.escape(base.group(1))}, (\d+);", ptx))
    inits = re.findall(rf"mbarrier\.init\.shared(?:::cta)?\.b64\s+\[(%r\d+)\], {count};", ptx)
    return [int(adds[reg]) for reg in inits if reg in adds]


def _place_warp_arrivals(meta: dict[str, Any], compile_with: Any, target: tuple) -> dict[str, Any]:
    """``meta`` with ``ARRIVE_AT`` set to kv_empty's shared-memory offset for WARP_ARRIVE. The first compile
    (``compile_with(meta)``, arrivals still by Triton's op) places the allocations; its PTX initializes kv_empty's
    barriers with the count no other barrier has (4 a consumer), which gives the offset. The second compile, with
    the offset, must place kv_empty at the same offset: checked, so a Triton whose allocation moves fails loudly.
    Offsets are kept per ``target`` (the operands' dtype and the compute capability compiled for) and ``meta``."""
    key = (tuple(map(str, target)), tuple(sorted(meta.items())))
    if key not in _EMPTY_OFFSETS:
        count = 4 * meta["CONSUMERS"]
        slots = meta["NUM_BUFFERS"] * (2 if meta["RELEASE_K"] else 1)
        offsets = empty_barrier_offsets(compile_with(meta).asm["ptx"], count)
        if len(offsets) != slots or offsets != [offsets[0] + 8 * i for i in range(slots)]:
            raise RuntimeError(f"WARP_ARRIVE: cannot read the K/V empty barriers' offsets from the PTX ({offsets})")
        placed = {**meta, "ARRIVE_AT": offsets[0]}
        again = empty_barrier_offsets(compile_with(placed).asm["ptx"], count)
        if again != offsets:
            raise RuntimeError(f"WARP_ARRIVE: the K/V empty barriers moved between compiles ({offsets} -> {again})")
        _EMPTY_OFFSETS[key] = offsets[0]
    return {**meta, "ARRIVE_AT": _EMPTY_OFFSETS[key]}

if gluon is not None:

    @gluon.jit
    def _tile_extent(start_m, SEQ_LEN, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr):
        """(key blocks wholly left of the tile's first row, key blocks the tile reads) for query block start_m."""
        if CAUSAL:
            n_full = (start_m * (64 * CONSUMERS)) // BLOCK_N
            n_blocks = gl.cdiv(gl.minimum((start_m + 1) * (64 * CONSUMERS), SEQ_LEN), BLOCK_N)
        else:
            n_full = SEQ_LEN // BLOCK_N
            n_blocks = gl.cdiv(SEQ_LEN, BLOCK_N)
        return n_full, n_blocks

    @gluon.jit
    def _program_tile(SEQ_LEN, CAUSAL: gl.constexpr, HEAD_MAJOR: gl.constexpr, CONSUMERS: gl.constexpr):
        """(batch*head, query block) of a program of the one-tile grid; causal query blocks longest first."""
        if HEAD_MAJOR:
            off_hz = gl.program_id(1)
            m_index = gl.program_id(0)
        else:
            off_hz = gl.program_id(0)
            m_index = gl.program_id(1)
        if CAUSAL:
            m_index = gl.cdiv(SEQ_LEN, 64 * CONSUMERS) - 1 - m_index
        return off_hz, m_index

    @gluon.jit
    def _work_item(item, num_m, CAUSAL: gl.constexpr):
        """(batch*head, first query block, second, tiles) of work item ``item`` of the persistent grid.

        Items run head-major (the tiles of one head together, its K/V shared in L2). Full attention: one tile
        per item. Causal: query block num_m-1-k with block k (the longest with the shortest) in one item, so
        every item reads num_m+1 query blocks' worth of keys and programs striding over the items get equal work
        (the middle block of an odd num_m alone).
        """
        if CAUSAL:
            per_head = (num_m + 1) // 2
            off_hz = item // per_head
            k = item % per_head
            first = num_m - 1 - k
            second = k
            tiles = gl.where(first == second, 1, 2)
        else:
            off_hz = item // num_m
            first = item % num_m
            second = first
            tiles = 1
        return off_hz, first, second, tiles

    @gluon.jit
    def _num_items(num_m, BH, CAUSAL: gl.constexpr):
        if CAUSAL:
            return BH * ((num_m + 1) // 2)
        else:
            return BH * num_m

    @gluon.jit
    def _masked(s, keys, rows, SEQ_LEN, mask_now, MASK: gl.constexpr, CAUSAL: gl.constexpr):
        """Raw scores, masked where ``MASK`` and ``mask_now`` (a runtime flag: the block may cross the diagonal or
        the end): keys past SEQ_LEN, and with CAUSAL keys past the row."""
        if MASK:
            if mask_now:
                valid = gl.expand_dims(keys, 0) < SEQ_LEN
                if CAUSAL:
                    valid = valid & (gl.expand_dims(keys, 0) <= gl.expand_dims(rows, 1))
                s = gl.where(valid, s, MASKED_SCORE)
        return s

    @gluon.jit
    def _exp2(x, EXP_POLY: gl.constexpr):
        """``2^x`` elementwise (x <= 0 here), ``EXP_POLY`` of every ``EXP_PACK`` values by a polynomial on the FMA
        pipe and the rest on the multi-function unit (:func:`exp2_asm`); 0: all on the unit (``gl.exp2``)."""
        if EXP_POLY == 0:
            return gl.exp2(x)
        if EXP_POLY == 1:
            asm: gl.constexpr = _EXP2_ASM_1
        elif EXP_POLY == 2:
            asm: gl.constexpr = _EXP2_ASM_2
        elif EXP_POLY == 3:
            asm: gl.constexpr = _EXP2_ASM_3
        else:
            asm: gl.constexpr = _EXP2_ASM_4
        return gl.inline_asm_elementwise(asm, _EXP2_CONSTRAINTS, [x], dtype=gl.float32, is_pure=True, pack=_EXP_PACK)

    @gluon.jit
    def _online_softmax(s, m_i, l_i, keys, rows, qk_scale, SEQ_LEN, mask_now, MASK: gl.constexpr,
                        CAUSAL: gl.constexpr, EXP_POLY: gl.constexpr = 0, SUM_MMA: gl.constexpr = False):  # fmt: skip
        """One block's step of the online softmax: P, the rescale of what came before, the new max and sum.

        The row maximum is taken over the raw scores and scaled once per row (``qk_scale > 0``), so each score
        costs one fused multiply-add before its ``exp2`` instead of a multiply and a subtraction. ``EXP_POLY``:
        how many of every ``EXP_PACK`` scores' exponentials a polynomial computes (:func:`_exp2`). ``SUM_MMA``:
        the sum is the tensor cores' (:func:`_pv`), so ``l_i`` comes back untouched."""
        s = _masked(s, keys, rows, SEQ_LEN, mask_now, MASK, CAUSAL)
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        p = _exp2(s * qk_scale - gl.expand_dims(m_new, 1), EXP_POLY)
        if not SUM_MMA:
            l_i = l_i * alpha + gl.sum(p, 1)
        return p, alpha, m_new, l_i

    @gluon.constexpr_function
    def _sum_layout():
        """``SUM_MMA``'s accumulator of the rows' sums: a 64 x 8 wgmma tile (every column the same sum)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 16])

    @gluon.jit
    def _pv(p_op, v, acc, l_i, ones_t, SUM_MMA: gl.constexpr):
        """Issue acc += P V and, with ``SUM_MMA``, l_i += P 1 (``ones_t``: a BLOCK_N x 8 block of ones in shared
        memory), both asynchronous: the tensor cores add up each row's probabilities, which otherwise cost every
        thread an add a score and a shuffle reduction a block. The sums are of P as rounded for P V."""
        acc = warpgroup_mma(p_op, v, acc, is_async=True)
        if SUM_MMA:
            l_i = warpgroup_mma(p_op, ones_t, l_i, is_async=True)
        return acc, l_i

    @gluon.jit
    def _pv_wait(acc, l_i, p_op, v, SUM_MMA: gl.constexpr):
        """Wait for :func:`_pv`'s wgmmas (and all before them)."""
        if SUM_MMA:
            acc, l_i, p_op, v = warpgroup_mma_wait(0, deps=(acc, l_i, p_op, v))
        else:
            acc, p_op, v = warpgroup_mma_wait(0, deps=(acc, p_op, v))
        return acc, l_i, p_op, v

    @gluon.jit
    def _rescale(acc, l_i, alpha, SUM_MMA: gl.constexpr):
        """The accumulator (and ``SUM_MMA``'s row sums; else the softmax rescaled them) times the rows' alpha."""
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout)), 1)
        if SUM_MMA:
            l_i = l_i * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, l_i.type.layout)), 1)
        return acc, l_i

    @gluon.jit
    def _row_sums(l_i, row_layout: gl.constexpr, SUM_MMA: gl.constexpr):
        """The rows' sums as a vector in ``row_layout``: ``SUM_MMA``'s 64 x 8 tile has the sum in every column."""
        if SUM_MMA:
            sums = gl.convert_layout(gl.max(l_i, 1), row_layout)
        else:
            sums = gl.convert_layout(l_i, row_layout)
        return sums

    @gluon.jit
    def _release(kv_empty, slot, ARRIVE_AT: gl.constexpr):
        """A consumer frees K/V ring slot ``slot`` (an index into ``kv_empty``), as ``ARRIVE_AT`` says:

        - ``ARRIVE_ONE_THREAD`` (and ``ARRIVE_WARPS_UNPLACED``, the first compile of a warp-arrival kernel, which only
          places the allocations): one arrival by thread 0, which Triton brackets with warpgroup barriers, as it
          must for an arrival that stands for every thread's shared-memory reads;
        - ``ARRIVE_EVERY_THREAD``: one arrival by every thread (``cp.async.mbarrier.arrive.noinc``, 128 a
          consumer), which Triton does not bracket;
        - an offset >= 0 (``kv_empty``'s byte offset in shared memory): one arrival by lane 0 of each warp (4 a
          consumer) in inline PTX, which Triton neither sees nor brackets.

        The slots are read only by wgmma, whose reads are complete once each warp's wait returns, so no thread
        needs to wait for the others before its arrival."""
        if ARRIVE_AT >= 0:
            gl.inline_asm_elementwise(
                "{ .reg .pred p; .reg .b32 l, a; mov.u32 l, %laneid; setp.eq.u32 p, l, 0; mov.u32 a, global_smem; "
                "add.u32 a, a, $1; @p mbarrier.arrive.shared::cta.b64 _, [a]; mov.u32 $0, 0; }",
                "=r,r", [ARRIVE_AT + slot * 8], dtype=gl.int32, is_pure=False, pack=1,
            )  # fmt: skip
        elif ARRIVE_AT == ARRIVE_EVERY_THREAD:
            async_copy.mbarrier_arrive(kv_empty.index(slot), increment_count=False)
        else:
            mbarrier.arrive(kv_empty.index(slot), count=1)

    @gluon.jit
    def _consume(q, k_smem, v_smem, k_ready, v_ready, kv_empty, acc, m_i, l_i, rows, lo, hi, base, qk_scale,
                 SEQ_LEN, mask_from, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, MASK: gl.constexpr,
                 CAUSAL: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                 ARRIVE_AT: gl.constexpr = ARRIVE_ONE_THREAD, EXP_POLY: gl.constexpr = 0, ones_t=None,
                 SUM_MMA: gl.constexpr = False):  # fmt: skip
        """Fold key blocks ``lo .. hi-1`` into (acc, m_i, l_i): S = Q K^T, online softmax, acc += P V; with
        ``MASK`` the blocks from ``mask_from`` on are masked.

        Key block j sits in ring slot ``base + j`` (stage ``% NUM_BUFFERS``, phase from the lap): ``base`` is
        the number of blocks the program consumed in its earlier tiles (0 unless persistent)."""
        V_EMPTY: gl.constexpr = kv_empty.shape[0] - NUM_BUFFERS  # RELEASE_K: V's empty barriers' offset
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        zero = gl.zeros([64, BLOCK_N], gl.float32, s_layout)
        for j in range(lo, hi):
            stage = (base + j) % NUM_BUFFERS
            phase = ((base + j) // NUM_BUFFERS) & 1
            mbarrier.wait(k_ready.index(stage), phase)
            k_t = k_smem.index(stage).permute((1, 0))
            s = warpgroup_mma(q, k_t, zero, use_acc=False, is_async=True)
            s, q, k_t = warpgroup_mma_wait(0, deps=(s, q, k_t))
            if V_EMPTY > 0:
                _release(kv_empty, stage, ARRIVE_AT)
            p, alpha, m_new, l_i = _online_softmax(s, m_i, l_i, j * BLOCK_N + offs_n, rows, qk_scale, SEQ_LEN,
                                                   j >= mask_from, MASK, CAUSAL, EXP_POLY, SUM_MMA)  # fmt: skip
            acc, l_i = _rescale(acc, l_i, alpha, SUM_MMA)
            p_op = gl.convert_layout(p.to(k_smem.dtype), p_layout)
            mbarrier.wait(v_ready.index(stage), phase)
            v = v_smem.index(stage)
            acc, l_i = _pv(p_op, v, acc, l_i, ones_t, SUM_MMA)
            # Wait before the next block: the in-flight wgmma reads P from registers.
            acc, l_i, p_op, v = _pv_wait(acc, l_i, p_op, v, SUM_MMA)
            _release(kv_empty, V_EMPTY + stage, ARRIVE_AT)
            m_i = m_new
        return acc, m_i, l_i

    @gluon.jit
    def _consume_overlap(q, k_smem, v_smem, k_ready, v_ready, kv_empty, acc, m_i, l_i, rows, lo, hi, base, qk_scale,
                         SEQ_LEN, mask_from, q_free, release_q, my_turn, their_turn, turns, BLOCK_N: gl.constexpr,
                         NUM_BUFFERS: gl.constexpr, MASK: gl.constexpr, CAUSAL: gl.constexpr, s_layout: gl.constexpr,
                         p_layout: gl.constexpr, c: gl.constexpr, PINGPONG: gl.constexpr,
                         ARRIVE_AT: gl.constexpr = ARRIVE_ONE_THREAD, EXP_POLY: gl.constexpr = 0, ones_t=None,
                         SUM_MMA: gl.constexpr = False):  # fmt: skip
        """As :func:`_consume` (blocks from ``mask_from`` on masked with ``MASK``), with the scores of block j+1 in
        flight while P_j V_j and the softmax of j+1 run.

        Per step: issue S_{j+1} = Q K_{j+1}^T and acc += P_j V_j (both async; with ``SUM_MMA`` also the row
        sums' wgmma), wait for S_{j+1} only (P_j's wgmmas left in flight), compute P_{j+1} while P_j V_j runs,
        then wait for it, release stage j and rescale. Needs ``hi > lo``.
        """
        V_EMPTY: gl.constexpr = kv_empty.shape[0] - NUM_BUFFERS  # RELEASE_K: V's empty barriers' offset
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        zero = gl.zeros([64, BLOCK_N], gl.float32, s_layout)
        stage = (base + lo) % NUM_BUFFERS
        phase = ((base + lo) // NUM_BUFFERS) & 1
        mbarrier.wait(k_ready.index(stage), phase)
        k_t = k_smem.index(stage).permute((1, 0))
        s = warpgroup_mma(q, k_t, zero, use_acc=False, is_async=True)
        s, q, k_t = warpgroup_mma_wait(0, deps=(s, q, k_t))
        if V_EMPTY > 0:
            _release(kv_empty, stage, ARRIVE_AT)
        p, alpha, m_new, l_i = _online_softmax(s, m_i, l_i, lo * BLOCK_N + offs_n, rows, qk_scale, SEQ_LEN,
                                               lo >= mask_from, MASK, CAUSAL, EXP_POLY, SUM_MMA)  # fmt: skip
        acc, l_i = _rescale(acc, l_i, alpha, SUM_MMA)
        p_op = gl.convert_layout(p.to(k_smem.dtype), p_layout)
        m_i = m_new
        for j in range(lo + 1, hi):
            nstage = (base + j) % NUM_BUFFERS
            nphase = ((base + j) // NUM_BUFFERS) & 1
            mbarrier.wait(k_ready.index(nstage), nphase)
            mbarrier.wait(v_ready.index(stage), phase)
            if PINGPONG:  # consumer 0 takes the first turn: its first wait is on a fresh barrier's parity 1
                mbarrier.wait(my_turn, (turns & 1) ^ (1 if c == 0 else 0))
            k_t = k_smem.index(nstage).permute((1, 0))
            s = warpgroup_mma(q, k_t, zero, use_acc=False, is_async=True)
            v = v_smem.index(stage)
            acc, l_i = _pv(p_op, v, acc, l_i, ones_t, SUM_MMA)
            if PINGPONG:
                mbarrier.arrive(their_turn, count=1)
                turns += 1
            if SUM_MMA:  # P_j's two wgmmas stay in flight
                s, q, k_t = warpgroup_mma_wait(2, deps=(s, q, k_t))
            else:
                s, q, k_t = warpgroup_mma_wait(1, deps=(s, q, k_t))
            if V_EMPTY > 0:
                _release(kv_empty, nstage, ARRIVE_AT)
            p, alpha, m_new, l_i = _online_softmax(s, m_i, l_i, j * BLOCK_N + offs_n, rows, qk_scale, SEQ_LEN,
                                                   j >= mask_from, MASK, CAUSAL, EXP_POLY, SUM_MMA)  # fmt: skip
            acc, l_i, p_op, v = _pv_wait(acc, l_i, p_op, v, SUM_MMA)
            _release(kv_empty, V_EMPTY + stage, ARRIVE_AT)
            acc, l_i = _rescale(acc, l_i, alpha, SUM_MMA)
            p_op = gl.convert_layout(p.to(k_smem.dtype), p_layout)
            m_i = m_new
            stage = nstage
            phase = nphase
        if release_q:
            mbarrier.arrive(q_free, count=1)
        mbarrier.wait(v_ready.index(stage), phase)
        v = v_smem.index(stage)
        acc, l_i = _pv(p_op, v, acc, l_i, ones_t, SUM_MMA)
        acc, l_i, p_op, v = _pv_wait(acc, l_i, p_op, v, SUM_MMA)
        _release(kv_empty, V_EMPTY + stage, ARRIVE_AT)
        return acc, m_i, l_i, turns

    @gluon.jit
    def _consume_half(q, k_smem, v_smem, k_ready, v_ready, kv_empty, acc, m_i, l_i, rows, j, base, qk_scale, SEQ_LEN,
                      q_free, NUM_BUFFERS: gl.constexpr, CAUSAL: gl.constexpr, p_layout: gl.constexpr,
                      ARRIVE_AT: gl.constexpr = ARRIVE_ONE_THREAD, EXP_POLY: gl.constexpr = 0,
                      SUM_MMA: gl.constexpr = False):  # fmt: skip
        """Fold the first 64 keys of key block ``j`` (128 keys) into (acc, m_i, l_i), masked: the diagonal block of
        the first consumer of a causal 128-row tile, whose rows see none of the block's last 64 keys (``HALF_DIAG``).
        The scores are a 64 x 64 wgmma on the first half of the K slot, P V one on the first half of the V slot; Q is
        freed after the scores, the slot's K and V after their wgmmas, as the full blocks do."""
        V_EMPTY: gl.constexpr = kv_empty.shape[0] - NUM_BUFFERS  # RELEASE_K: V's empty barriers' offset
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, 64, 16])  # fmt: skip
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        stage = (base + j) % NUM_BUFFERS
        phase = ((base + j) // NUM_BUFFERS) & 1
        mbarrier.wait(k_ready.index(stage), phase)
        k_t = k_smem.index(stage).slice(0, 64, dim=0).permute((1, 0))
        s = warpgroup_mma(q, k_t, gl.zeros([64, 64], gl.float32, s_layout), use_acc=False, is_async=True)
        s, q, k_t = warpgroup_mma_wait(0, deps=(s, q, k_t))
        mbarrier.arrive(q_free, count=1)
        if V_EMPTY > 0:
            _release(kv_empty, stage, ARRIVE_AT)
        keys = j * k_smem.shape[1] + gl.arange(0, 64, layout=gl.SliceLayout(0, s_layout))
        # SUM_MMA: this half block's sums by the threads (from 0: P's row sums), added to the tensor cores' tile
        if SUM_MMA:
            l_row = gl.zeros([64], gl.float32, row_layout)
        else:
            l_row = gl.convert_layout(l_i, row_layout)
        p, alpha, m_new, l_new = _online_softmax(s, gl.convert_layout(m_i, row_layout), l_row, keys,
                                                 gl.convert_layout(rows, row_layout), qk_scale, SEQ_LEN, True, True,
                                                 CAUSAL, EXP_POLY)  # fmt: skip
        acc, l_i = _rescale(acc, l_i, alpha, SUM_MMA)
        if SUM_MMA:
            l_new = l_i + gl.expand_dims(gl.convert_layout(l_new, gl.SliceLayout(1, l_i.type.layout)), 1)
        else:
            l_new = gl.convert_layout(l_new, l_i.type.layout)
        p_op = gl.convert_layout(p.to(k_smem.dtype), p_layout)
        mbarrier.wait(v_ready.index(stage), phase)
        v = v_smem.index(stage).slice(0, 64, dim=0)
        acc = warpgroup_mma(p_op, v, acc, is_async=True)
        acc, p_op, v = warpgroup_mma_wait(0, deps=(acc, p_op, v))
        _release(kv_empty, V_EMPTY + stage, ARRIVE_AT)
        return acc, gl.convert_layout(m_new, m_i.type.layout), l_new

    @gluon.constexpr_function
    def _quad_vector_layout(head_dim):
        """The wgmma accumulator's layout of a 64 x ``head_dim`` tile (4 warps; a thread holds columns 2t, 2t + 1
        of every 8-column group, t its lane in the row's quad, for rows r and r + 8) with each quad's pieces
        transposed: lane t of a quad holds columns 8t .. 8t + 7 of every 32-column group. Only registers and lanes
        within a warp change places (Triton 3.6 and 3.9 exchange them through 512 bytes of shared memory a warp,
        16-byte stores and ``ldmatrix``, with no barrier across warps)."""
        wide = [[0, 32 << i] for i in range((head_dim // 32).bit_length() - 1)]
        return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0], *wide],
                                          lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
                                          warp_bases=[[16, 0], [32, 0]], block_bases=[],
                                          shape=[64, head_dim])  # fmt: skip

    @gluon.jit
    def _store_tile(Out, Lse, acc, m_i, l_i, rows, row0, SEQ_LEN, HEAD_DIM: gl.constexpr, STORE_LSE: gl.constexpr,
                    EPILOGUE: gl.constexpr = 0):  # fmt: skip
        """A consumer's epilogue: O = acc / l for its rows inside the sequence (and the base-2 log-sum-exp).
        ``EPILOGUE`` 0 stores from the wgmma accumulator's layout (4-byte pieces, two per thread and 8-column
        group); 1 first moves O (in Out's dtype) to a row-major layout, 8 columns a thread, so each thread stores
        16-byte vectors and a warp whole rows (through the compiler's shared-memory scratch); 2 exchanges the
        pieces among each row's four lanes (:func:`_quad_vector_layout`: 512 bytes of scratch a warp) so each
        thread holds 8 adjacent columns and stores 16-byte vectors, a warp 64-byte row segments."""
        o_layout: gl.constexpr = acc.type.layout
        if STORE_LSE:
            gl.store(Lse + row0 + rows, m_i + gl.log2(l_i), mask=rows < SEQ_LEN)
        acc = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
        if EPILOGUE == 1:
            store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [256 // HEAD_DIM, HEAD_DIM // 8], [4, 1], [1, 0])
        elif EPILOGUE == 2:
            store_layout: gl.constexpr = _quad_vector_layout(HEAD_DIM)
        else:
            store_layout: gl.constexpr = o_layout
        o = gl.convert_layout(acc.to(Out.dtype.element_ty), store_layout)
        o_rows = gl.convert_layout(rows, gl.SliceLayout(1, store_layout))
        offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))
        ptrs = Out + (row0 + gl.expand_dims(o_rows, 1)) * HEAD_DIM + gl.expand_dims(offs_d, 0)
        gl.store(ptrs, o, mask=gl.expand_dims(o_rows < SEQ_LEN, 1))

    @gluon.jit
    def _consume_chained(Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, qk_scale,
                         c: gl.constexpr, SEQ_LEN, BH, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                         NUM_BUFFERS: gl.constexpr, CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr,
                         CONSUMERS: gl.constexpr, EPILOGUE: gl.constexpr = 0,
                         ARRIVE_AT: gl.constexpr = ARRIVE_ONE_THREAD, EXP_POLY: gl.constexpr = 0):  # fmt: skip
        """Consumer ``c`` of the persistent grid with ``CHAIN``: all its tiles' key blocks as one overlapped
        stream, so a tile's first scores and softmax run under the previous tile's last P V.

        Step g (block j of tile t): issue S_g = Q_t K_g^T and acc += P_{g-1} V_{g-1} (the previous block's, of
        this tile or the last), wait for S_g, softmax of g while P_{g-1} V_{g-1} runs, wait for it; at j = 0 the
        finished accumulator is tile t-1's output: stored, then the rescale by alpha = 0 (a fresh row maximum)
        clears it. The consumer's first step multiplies zeros by V_0 (finite: its load is awaited) so that every
        step issues the same two wgmmas and nothing in flight crosses a branch. Q is released after a tile's last
        Q K^T. As ``OVERLAP`` with ``ONE_LOOP`` (the masked blocks behind a runtime branch)."""
        BLOCK_M: gl.constexpr = 64 * CONSUMERS
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        dtype: gl.constexpr = k_smem.dtype
        V_EMPTY: gl.constexpr = kv_empty.shape[0] - NUM_BUFFERS  # RELEASE_K: V's empty barriers' offset
        offs_m = c * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        zero = gl.zeros([64, BLOCK_N], gl.float32, s_layout)
        acc = gl.zeros([64, HEAD_DIM], gl.float32, o_layout)
        p_op = gl.zeros([64, BLOCK_N], dtype, p_layout)
        m_i = gl.full([64], MASKED_SCORE, gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.full([64], 0.0, gl.float32, gl.SliceLayout(1, s_layout))
        num_m = gl.cdiv(SEQ_LEN, BLOCK_M)
        base = 0  # key blocks this consumer has taken so far: ring slot of the next
        i = 0  # tiles so far: the phase of the Q barriers
        prev_start_m = 0
        prev_row0 = 0
        pstage = 0  # ring slot of the block whose P V is pending (block 0 at the start: the zero product)
        pphase = 0
        for item in range(gl.program_id(0), _num_items(num_m, BH, CAUSAL), gl.num_programs(0)):
            off_hz, first, second, tiles = _work_item(item, num_m, CAUSAL)
            for h in range(tiles):
                start_m = first + h * (second - first)
                n_full, n_blocks = _tile_extent(start_m, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
                rows = start_m * BLOCK_M + offs_m
                mbarrier.wait(q_bar.index(c), i & 1)
                q = q_smem.index(c)
                for j in range(n_blocks):
                    stage = (base + j) % NUM_BUFFERS
                    phase = ((base + j) // NUM_BUFFERS) & 1
                    mbarrier.wait(k_ready.index(stage), phase)
                    mbarrier.wait(v_ready.index(pstage), pphase)
                    k_t = k_smem.index(stage).permute((1, 0))
                    s = warpgroup_mma(q, k_t, zero, use_acc=False, is_async=True)
                    v = v_smem.index(pstage)
                    acc = warpgroup_mma(p_op, v, acc, is_async=True)
                    s, q, k_t = warpgroup_mma_wait(1, deps=(s, q, k_t))
                    if V_EMPTY > 0:
                        _release(kv_empty, stage, ARRIVE_AT)
                    if j == n_blocks - 1:
                        mbarrier.arrive(q_empty.index(c), count=1)
                    fresh = j == 0  # a new tile: the running max and sum start over
                    p, alpha, m_new, l_new = _online_softmax(
                        s, gl.where(fresh, MASKED_SCORE, m_i), gl.where(fresh, 0.0, l_i), j * BLOCK_N + offs_n,
                        rows, qk_scale, SEQ_LEN, j >= n_full, True, CAUSAL, EXP_POLY,
                    )  # fmt: skip
                    acc, p_op, v = warpgroup_mma_wait(0, deps=(acc, p_op, v))
                    if base + j > 0:
                        _release(kv_empty, V_EMPTY + pstage, ARRIVE_AT)
                        if fresh:
                            _store_tile(Out, Lse, acc, m_i, l_i, prev_start_m * BLOCK_M + offs_m, prev_row0,
                                        SEQ_LEN, HEAD_DIM, STORE_LSE, EPILOGUE)  # fmt: skip
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
                    p_op = gl.convert_layout(p.to(dtype), p_layout)
                    m_i = m_new
                    l_i = l_new
                    pstage = stage
                    pphase = phase
                base += n_blocks
                i += 1
                prev_start_m = start_m
                prev_row0 = off_hz * SEQ_LEN
        if base > 0:  # the last tile's last P V, and its output
            mbarrier.wait(v_ready.index(pstage), pphase)
            v = v_smem.index(pstage)
            acc = warpgroup_mma(p_op, v, acc, is_async=True)
            acc, p_op, v = warpgroup_mma_wait(0, deps=(acc, p_op, v))
            _release(kv_empty, V_EMPTY + pstage, ARRIVE_AT)
            _store_tile(Out, Lse, acc, m_i, l_i, prev_start_m * BLOCK_M + offs_m, prev_row0, SEQ_LEN, HEAD_DIM,
                        STORE_LSE, EPILOGUE)  # fmt: skip
