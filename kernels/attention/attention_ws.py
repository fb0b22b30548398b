"""Attention forward in Gluon for Hopper: a TMA producer warp and two consumer warpgroups (FlashAttention-3's
schedule, as far as this kernel goes).

Triton's ``tl.dot`` kernels (:mod:`kernels.attention.attention`, :mod:`kernels.attention.attention_persistent`) leave
the
schedule to the compiler; this one writes it out with Gluon's explicit layouts, shared memory,
barriers and warp partitions (``triton.experimental.gluon``, Triton >= 3.6, sm_90):

- **Partitions**: each program owns ``CONSUMERS * 64`` query rows of one (batch, head). A one-warp *loader*
  issues TMA loads of the program's Q tiles, then of K and V tiles into a ring of ``NUM_BUFFERS``
  stages (K and V with their own ready barriers, so the scores of a stage start before its V has
  landed). Two (or three, ``CONSUMERS``) *consumer* warpgroups (4 warps each) take 64 query rows apiece and
  share every K/V stage; a stage is released (its ``empty`` barrier, one arrival per consumer) when all have
  finished with it. Three consumers give each SM sub-partition three warps to interleave (FA3's 192-row tile
  at D=64) but leave 160 registers a thread: D = 64 only.
  By default the consumers never wait for each other, and the warp schedulers interleave one's softmax with
  the other's wgmma; ``PINGPONG`` (with ``OVERLAP``) forces FA3's ping-pong: the consumers take turns, through
  two mbarriers, to issue a step's wgmmas, so one's softmax runs while the other's wgmmas do (on an H200:
  1-5% on causal D=128, none elsewhere).
- **Registers**: the loader gets 24 registers a thread, the consumers the rest (up to 240 with two, 160 with
  three), which holds a 64 x D fp32 accumulator, a 64 x BLOCK_N score tile and the bf16 probabilities.
- **Softmax**: base-2 online softmax (scores scaled by ``sm_scale * log2(e)``), masked with a large
  finite negative; P is converted in registers to the wgmma A-operand layout (no shared memory).
- ``OVERLAP``: FA3's intra-warpgroup overlap: the scores of block j+1 are issued before P_j V_j has
  finished, so the tensor cores run while the same warpgroup computes a softmax.
- **Grid order**: head-major by default (grid (query block, batch*head)): the programs of one head run
  together and read its K/V from L2, which on an H200 gave 4-17% over one query block of every head at a
  time (``HEAD_MAJOR=False``); causal programs take a head's longest query blocks first.
- ``ONE_LOOP``: a tile's key blocks in one loop, those that cross the causal diagonal or the sequence's end
  masked behind a runtime branch, instead of a second loop after the unmasked ones: one pipeline drain a tile
  instead of two and about a third less code (the three-consumer kernel's instruction fetch stalls).
- ``PERSISTENT``: a grid of at most one program per SM, each striding over work items (head-major; a causal
  item pairs the longest query block of a head with its shortest, so every item is the same work). The K/V
  ring and the Q buffers carry over from tile to tile: a consumer frees its Q buffer after its last wgmma of
  a tile, so the next tile's Q and first K/V stages load while it normalizes and stores. On an H200 this
  gave up to 1.2x at short sequences (S = 1024, 2048), where one program per tile waits for its first
  loads and its stores every few key blocks.
- The other knobs (``CONSUMERS=1`` with ``CTAS_PER_SM=2``, ``EPILOGUE``, ``RELEASE_K``, ``CHAIN``, the arrival
  modes, ``HALF_DIAG``, ``EXP_POLY``, ``SUM_MMA``, ``STREAM_KV``, ``Q_BUFFERS``), what each does and what it
  measured, are described in :mod:`kernels.attention.attention_ws_rules` beside their defaults.

The consumers' device functions (work items, masks, online softmax, the key-block loops, the epilogue) are in
:mod:`kernels.attention.attention_ws_steps`, the loader warp and the persistent programs' walk over their tiles in
:mod:`kernels.attention.attention_ws_loader`, ``STREAM_KV``'s schedule and merge in
:mod:`kernels.attention.attention_ws_stream`; this
module holds the consumer partitions, the kernel and its launch.

Rows past ``SEQ_LEN`` (a ragged last block) read the next head's rows through the 2-D descriptors and
are never stored; keys past it are masked. ``Lse`` (base-2 log-sum-exp, ``[B*H*S]`` fp32) is stored
when asked, for :mod:`kernels.attention.attention_grad`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from kernels.attention.attention import DTYPES, check_operands, mock_tensor_class
from kernels.attention.attention_ws_rules import (
    KNOBS,
    SUB_M,
    _maxnreg,
    check_knobs,
    consumer_regs_limit,
    lpt_schedule,
    query_tiles,
    stream_slot_floats,
    work_items,
)
from kernels.attention.attention_ws_steps import (
    ARRIVE_EVERY_THREAD,
    ARRIVE_ONE_THREAD,
    ARRIVE_WARPS_UNPLACED,
    MASKED_SCORE,
    _place_warp_arrivals,
)
from kernels.launch import Descriptors, Plan, PlanCache, layout_key, sm_count
from kernels.runtime import interpreter_active

try:  # Gluon (Triton >= 3.6); the kernel is defined only where it exists
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    gluon = None

def available() -> bool:
    """Whether this Triton has Gluon's Hopper API (the kernel compiles only then, and only for sm_90)."""
    return gluon is not None and not interpreter_active()


if gluon is not None:
    from kernels.attention.attention_ws_loader import _entry, _loader, _program_items, _scheduled_item
    from kernels.attention.attention_ws_steps import (
        _consume,
        _consume_chained,
        _consume_half,
        _consume_overlap,
        _program_tile,
        _row_sums,
        _store_tile,
        _sum_layout,
        _tile_extent,
    )
    from kernels.attention.attention_ws_stream import _merge, _publish, _tail_part, _tail_share

    @gluon.jit
    def _attend_tile(Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, turn, start_m,
                     row0, n_full, n_blocks, base, q_phase, turns, qk_scale, c: gl.constexpr, SEQ_LEN,
                     HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, CAUSAL: gl.constexpr,
                     OVERLAP: gl.constexpr, STORE_LSE: gl.constexpr, PINGPONG: gl.constexpr,
                     CONSUMERS: gl.constexpr, ONE_LOOP: gl.constexpr, EPILOGUE: gl.constexpr,
                     ARRIVE_AT: gl.constexpr, HALF_DIAG: gl.constexpr, EXP_POLY: gl.constexpr, ones_t,
                     SUM_MMA: gl.constexpr, Partials=None, Flags=None, BH=0, lo=0, hi=0, tile_end=0,
                     STREAM_KV: gl.constexpr = False, qb=0):  # fmt: skip
        """Consumer ``c`` on one tile: query rows ``start_m * 64 * CONSUMERS + c * 64 + [0, 64)`` over all its key
        blocks (``HALF_DIAG``, causal: the first consumer takes only the first 64 keys of the diagonal block, the
        rest of which its rows never see).

        Frees its Q buffer (``q_empty``) as soon as the last wgmma that reads it is done (with ``OVERLAP`` before
        the last P V), so the loader fetches the next tile's Q while this one finishes and stores. The key blocks
        that cross the diagonal (causal) or the end run in a loop of their own after the others, or with
        ``ONE_LOOP`` in the same loop, masked behind a branch (one pipeline drain a tile, and half the code).

        ``STREAM_KV`` (with ``OVERLAP`` and ``ONE_LOOP``): only key blocks ``lo .. hi-1``, the tile's blocks ending at
        block ``tile_end`` of all tiles' (:mod:`kernels.attention.attention_ws_stream`). A part that starts inside the
        tile is
        published for the program that holds the tile's first blocks, which merges every such part before it stores.

        ``qb``: the consumer's Q buffer the tile's Q is in (``Q_BUFFERS``; ``q_phase`` its phase)."""
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        rows = start_m * (64 * CONSUMERS) + c * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([64, HEAD_DIM], gl.float32, o_layout)
        m_i = gl.full([64], MASKED_SCORE, gl.float32, gl.SliceLayout(1, s_layout))
        if SUM_MMA:  # the rows' sums in a 64 x 8 wgmma accumulator (steps._pv)
            l_i = gl.zeros([64, 8], gl.float32, _sum_layout())
        else:
            l_i = gl.full([64], 0.0, gl.float32, gl.SliceLayout(1, s_layout))
        qs = qb * CONSUMERS + c
        mbarrier.wait(q_bar.index(qs), q_phase)
        q = q_smem.index(qs)
        their_turn = turn.index((c + 1) % CONSUMERS)  # with PINGPONG the consumers take turns round the program
        # ONE_LOOP: every key block in the first loop, masked from n_full on; else the masked ones in a second.
        first_hi = n_blocks if ONE_LOOP else n_full
        if STREAM_KV:  # key blocks lo .. hi-1; ring slots counted from lo
            acc, m_i, l_i, turns = _consume_overlap(
                q, k_smem, v_smem, k_ready, v_ready, kv_empty, acc, m_i, l_i, rows, lo, hi, base - lo, qk_scale,
                SEQ_LEN, n_full, q_empty.index(qs), True, turn.index(c), their_turn, turns, BLOCK_N, NUM_BUFFERS,
                True, CAUSAL, s_layout, p_layout, c, PINGPONG, ARRIVE_AT, EXP_POLY, ones_t, SUM_MMA,
            )  # fmt: skip
        elif HALF_DIAG and CAUSAL and c == 0:  # 128-row tiles, 128-key blocks: the diagonal block is block n_full
            if n_full > 0:
                acc, m_i, l_i, turns = _consume_overlap(
                    q, k_smem, v_smem, k_ready, v_ready, kv_empty, acc, m_i, l_i, rows, 0, n_full, base, qk_scale,
                    SEQ_LEN, n_full, q_empty.index(qs), False, turn.index(c), their_turn, turns, BLOCK_N, NUM_BUFFERS,
                    False, CAUSAL, s_layout, p_layout, c, PINGPONG, ARRIVE_AT, EXP_POLY, ones_t, SUM_MMA,
                )  # fmt: skip
            acc, m_i, l_i = _consume_half(q, k_smem, v_smem, k_ready, v_ready, kv_empty, acc, m_i, l_i, rows, n_full,
                                          base, qk_scale, SEQ_LEN, q_empty.index(qs), NUM_BUFFERS, CAUSAL, p_layout,
                                          ARRIVE_AT, EXP_POLY, SUM_MMA)  # fmt: skip
        elif OVERLAP:
            if ONE_LOOP or first_hi > 0:  # ONE_LOOP: n_blocks >= 1
                acc, m_i, l_i, turns = _consume_overlap(
                    q, k_smem, v_smem, k_ready, v_ready, kv_empty, acc, m_i, l_i, rows, 0, first_hi, base, qk_scale,
                    SEQ_LEN, n_full, q_empty.index(qs), n_blocks == first_hi, turn.index(c), their_turn, turns,
                    BLOCK_N, NUM_BUFFERS, ONE_LOOP, CAUSAL, s_layout, p_layout, c, PINGPONG, ARRIVE_AT, EXP_POLY,
                    ones_t, SUM_MMA,
                )  # fmt: skip
            if not ONE_LOOP and n_blocks > n_full:
                acc, m_i, l_i, turns = _consume_overlap(
                    q, k_smem, v_smem, k_ready, v_ready, kv_empty, acc, m_i, l_i, rows, n_full, n_blocks, base,
                    qk_scale, SEQ_LEN, n_full, q_empty.index(qs), True, turn.index(c), their_turn, turns, BLOCK_N,
                    NUM_BUFFERS, True, CAUSAL, s_layout, p_layout, c, PINGPONG, ARRIVE_AT, EXP_POLY, ones_t, SUM_MMA,
                )  # fmt: skip
        else:
            acc, m_i, l_i = _consume(
                q, k_smem, v_smem, k_ready, v_ready, kv_empty, acc, m_i, l_i, rows, 0, first_hi, base, qk_scale,
                SEQ_LEN, n_full, BLOCK_N, NUM_BUFFERS, ONE_LOOP, CAUSAL, s_layout, p_layout, ARRIVE_AT, EXP_POLY,
                ones_t, SUM_MMA,
            )  # fmt: skip
            if not ONE_LOOP:
                acc, m_i, l_i = _consume(
                    q, k_smem, v_smem, k_ready, v_ready, kv_empty, acc, m_i, l_i, rows, n_full, n_blocks, base,
                    qk_scale, SEQ_LEN, n_full, BLOCK_N, NUM_BUFFERS, True, CAUSAL, s_layout, p_layout, ARRIVE_AT,
                    EXP_POLY, ones_t, SUM_MMA,
                )  # fmt: skip
            mbarrier.arrive(q_empty.index(qs), count=1)
        l_i = _row_sums(l_i, gl.SliceLayout(1, s_layout), SUM_MMA)
        if STREAM_KV:
            if lo > 0:  # the tile's later blocks: the program with its first blocks finishes it
                _publish(Partials, Flags, gl.program_id(0), acc, m_i, l_i, c, CONSUMERS, HEAD_DIM)
            else:
                if hi < n_blocks:  # the programs whose shares start inside the tile hold its other blocks
                    num_m = gl.cdiv(SEQ_LEN, 64 * CONSUMERS)
                    rank = gl.program_id(0) + 1
                    start, end = _tail_share(rank, num_m, BH, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
                    while (rank < gl.num_programs(0)) & (start < tile_end):
                        if end > start:
                            acc, m_i, l_i = _merge(Partials, Flags, rank, acc, m_i, l_i, c, CONSUMERS, HEAD_DIM)
                        rank += 1
                        start, end = _tail_share(rank, num_m, BH, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
                _store_tile(Out, Lse, acc, m_i, l_i, rows, row0, SEQ_LEN, HEAD_DIM, STORE_LSE, EPILOGUE)
        else:
            _store_tile(Out, Lse, acc, m_i, l_i, rows, row0, SEQ_LEN, HEAD_DIM, STORE_LSE, EPILOGUE)
        return turns

    @gluon.jit
    def _consumer(Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, turn, qk_scale,
                  c: gl.constexpr, SEQ_LEN, BH, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                  NUM_BUFFERS: gl.constexpr, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, STORE_LSE: gl.constexpr,
                  HEAD_MAJOR: gl.constexpr, PERSISTENT: gl.constexpr, PINGPONG: gl.constexpr,
                  CONSUMERS: gl.constexpr, ONE_LOOP: gl.constexpr, CHAIN: gl.constexpr,
                  EPILOGUE: gl.constexpr, ARRIVE_AT: gl.constexpr, HALF_DIAG: gl.constexpr,
                  EXP_POLY: gl.constexpr, ones_smem, ones_bar, SUM_MMA: gl.constexpr, Partials, Flags,
                  STREAM_KV: gl.constexpr, Sched, LPT: gl.constexpr):  # fmt: skip
        """Consumer ``c`` (one warpgroup): the program's tile, or, persistent, each of its tiles in turn (its work
        items, or with ``LPT`` its list in ``Sched``; with ``STREAM_KV`` those of the whole rounds, then its share of
        the last round's key blocks)."""
        QB: gl.constexpr = q_smem.shape[0] // CONSUMERS  # Q_BUFFERS: tile i's Q in buffer i % QB
        if SUM_MMA:  # the block of ones (8 x BLOCK_N), as the row sums' B operand (BLOCK_N x 8)
            mbarrier.wait(ones_bar.index(0), 0)
            ones_t = ones_smem.permute((1, 0))
        else:
            ones_t = ones_smem
        if CHAIN:
            _consume_chained(Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, qk_scale,
                             c, SEQ_LEN, BH, HEAD_DIM, BLOCK_N, NUM_BUFFERS, CAUSAL, STORE_LSE,
                             CONSUMERS, EPILOGUE, ARRIVE_AT, EXP_POLY)  # fmt: skip
        elif PERSISTENT:
            num_m = gl.cdiv(SEQ_LEN, 64 * CONSUMERS)
            base = 0
            i = 0
            turns = gl.program_id(0) * 0  # a tensor: the loop carries it
            first_item, end, step = _program_items(Sched, num_m, BH, CAUSAL, STREAM_KV, LPT)
            code = _entry(Sched, first_item, end, LPT)
            for item in range(first_item, end, step):
                upcoming = _entry(Sched, item + 1, end, LPT)  # LPT: the next tile's entry, loaded a tile ahead
                off_hz, first, second, tiles = _scheduled_item(item, code, num_m, CAUSAL, LPT)
                for h in range(tiles):
                    start_m = first + h * (second - first)
                    n_full, n_blocks = _tile_extent(start_m, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
                    turns = _attend_tile(Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready,
                                         kv_empty, turn, start_m, off_hz * SEQ_LEN, n_full, n_blocks, base,
                                         (i // QB) & 1, turns, qk_scale, c, SEQ_LEN, HEAD_DIM, BLOCK_N, NUM_BUFFERS,
                                         CAUSAL, OVERLAP, STORE_LSE, PINGPONG, CONSUMERS, ONE_LOOP, EPILOGUE,
                                         ARRIVE_AT, HALF_DIAG, EXP_POLY, ones_t, SUM_MMA, qb=i % QB)  # fmt: skip
                    base += n_blocks
                    i += 1
                code = upcoming
            if STREAM_KV:
                g, g_end = _tail_share(gl.program_id(0), num_m, BH, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
                while g < g_end:
                    off_hz, start_m, n_full, n_blocks, kb, hi = _tail_part(g, g_end, num_m, SEQ_LEN, BLOCK_N, CAUSAL,
                                                                          CONSUMERS)  # fmt: skip
                    turns = _attend_tile(Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready,
                                         kv_empty, turn, start_m, off_hz * SEQ_LEN, n_full, n_blocks, base,
                                         (i // QB) & 1, turns, qk_scale, c, SEQ_LEN, HEAD_DIM, BLOCK_N, NUM_BUFFERS,
                                         CAUSAL, OVERLAP, STORE_LSE, PINGPONG, CONSUMERS, ONE_LOOP, EPILOGUE,
                                         ARRIVE_AT, HALF_DIAG, EXP_POLY, ones_t, SUM_MMA, Partials, Flags, BH, kb,
                                         hi, g - kb + n_blocks, STREAM_KV, i % QB)  # fmt: skip
                    base += hi - kb
                    g += hi - kb
                    i += 1
        else:
            off_hz, start_m = _program_tile(SEQ_LEN, CAUSAL, HEAD_MAJOR, CONSUMERS)
            n_full, n_blocks = _tile_extent(start_m, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
            _attend_tile(Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, turn, start_m,
                         off_hz * SEQ_LEN, n_full, n_blocks, 0, 0, gl.program_id(0) * 0, qk_scale, c, SEQ_LEN,
                         HEAD_DIM, BLOCK_N, NUM_BUFFERS, CAUSAL, OVERLAP, STORE_LSE, PINGPONG, CONSUMERS,
                         ONE_LOOP, EPILOGUE, ARRIVE_AT, HALF_DIAG, EXP_POLY, ones_t, SUM_MMA)  # fmt: skip

    @gluon.jit
    def attention_fwd_ws_kernel(Out, Lse, Partials, Flags, Sched, desc_q, desc_k, desc_v, desc_ones, sm_scale, SEQ_LEN,
                                BH,
                                HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr,
                                CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, STORE_LSE: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr, HEAD_MAJOR: gl.constexpr,
                                PERSISTENT: gl.constexpr, PINGPONG: gl.constexpr, CONSUMERS: gl.constexpr,
                                ONE_LOOP: gl.constexpr, CHAIN: gl.constexpr, CTAS_PER_SM: gl.constexpr,
                                EPILOGUE: gl.constexpr, RELEASE_K: gl.constexpr, HALF_DIAG: gl.constexpr,
                                EXP_POLY: gl.constexpr, SUM_MMA: gl.constexpr, STREAM_KV: gl.constexpr,
                                Q_BUFFERS: gl.constexpr, LPT: gl.constexpr, ARRIVE_AT: gl.constexpr):  # fmt: skip
        """One tile of ``64 * CONSUMERS`` query rows per program (grid (batch*head, query block), or with
        ``HEAD_MAJOR`` (query block, batch*head) so that the programs of one head run together and share its K/V
        in L2), or, ``PERSISTENT``, a grid of at most one program per SM striding over work items
        (:func:`_work_item`) with the K/V ring and the Q buffers carried from tile to tile."""
        qk_scale = sm_scale * 1.4426950408889634  # log2(e)
        dtype: gl.constexpr = desc_q.dtype
        # Q_BUFFERS buffers a consumer, buffer-major (buffer b of consumer c at b * CONSUMERS + c)
        q_smem = gl.allocate_shared_memory(dtype, [Q_BUFFERS * CONSUMERS, 64, HEAD_DIM], desc_q.layout)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_BUFFERS, BLOCK_N, HEAD_DIM], desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_BUFFERS, BLOCK_N, HEAD_DIM], desc_v.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS * CONSUMERS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFFERS * CONSUMERS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUFFERS, 1], mbarrier.MBarrierLayout())
        # RELEASE_K: a K slot's empty barrier and, after them, a V slot's (a consumer frees K after its scores)
        EMPTIES: gl.constexpr = NUM_BUFFERS * (2 if RELEASE_K else 1)
        kv_empty = gl.allocate_shared_memory(gl.int64, [EMPTIES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(turn.index(c), count=1)
        for b in gl.static_range(Q_BUFFERS * CONSUMERS):
            mbarrier.init(q_bar.index(b), count=1)
            mbarrier.init(q_empty.index(b), count=1)
        for i in gl.static_range(NUM_BUFFERS):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
        # arrivals a consumer on a K/V empty barrier: one (thread 0), 128 (every thread) or 4 (lane 0 of each warp)
        ARRIVALS: gl.constexpr = 1 if ARRIVE_AT == ARRIVE_ONE_THREAD else (
            128 if ARRIVE_AT == ARRIVE_EVERY_THREAD else 4)
        for i in gl.static_range(EMPTIES):
            mbarrier.init(kv_empty.index(i), count=CONSUMERS * ARRIVALS)
        if SUM_MMA:  # 8 x BLOCK_N ones, loaded once (desc_ones), and their barrier
            ones_smem = gl.allocate_shared_memory(dtype, [8, BLOCK_N], desc_ones.layout)
            ones_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
            mbarrier.init(ones_bar.index(0), count=1)
        else:  # not read
            ones_smem = q_smem
            ones_bar = q_bar

        if CONSUMERS == 1:
            gl.warp_specialize(
                [
                    (_consumer, (Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, turn,
                                 qk_scale, 0, SEQ_LEN, BH, HEAD_DIM, BLOCK_N, NUM_BUFFERS, CAUSAL, OVERLAP, STORE_LSE,
                                 HEAD_MAJOR, PERSISTENT, PINGPONG, CONSUMERS, ONE_LOOP, CHAIN, EPILOGUE,
                                 ARRIVE_AT, HALF_DIAG, EXP_POLY, ones_smem, ones_bar, SUM_MMA, Partials,
                                 Flags, STREAM_KV, Sched, LPT)),
                    (_loader, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready,
                               kv_empty, SEQ_LEN, BH, BLOCK_N, NUM_BUFFERS, CAUSAL, HEAD_MAJOR, PERSISTENT,
                               CONSUMERS, desc_ones, ones_smem, ones_bar, SUM_MMA, STREAM_KV, Sched, LPT)),
                ],
                [1],
                [24],
            )  # fmt: skip
        elif CONSUMERS == 3:
            gl.warp_specialize(
                [
                    (_consumer, (Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, turn,
                                 qk_scale, 0, SEQ_LEN, BH, HEAD_DIM, BLOCK_N, NUM_BUFFERS, CAUSAL, OVERLAP, STORE_LSE,
                                 HEAD_MAJOR, PERSISTENT, PINGPONG, CONSUMERS, ONE_LOOP, CHAIN, EPILOGUE,
                                 ARRIVE_AT, HALF_DIAG, EXP_POLY, ones_smem, ones_bar, SUM_MMA, Partials,
                                 Flags, STREAM_KV, Sched, LPT)),
                    (_consumer, (Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, turn,
                                 qk_scale, 1, SEQ_LEN, BH, HEAD_DIM, BLOCK_N, NUM_BUFFERS, CAUSAL, OVERLAP, STORE_LSE,
                                 HEAD_MAJOR, PERSISTENT, PINGPONG, CONSUMERS, ONE_LOOP, CHAIN, EPILOGUE,
                                 ARRIVE_AT, HALF_DIAG, EXP_POLY, ones_smem, ones_bar, SUM_MMA, Partials,
                                 Flags, STREAM_KV, Sched, LPT)),
                    (_consumer, (Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, turn,
                                 qk_scale, 2, SEQ_LEN, BH, HEAD_DIM, BLOCK_N, NUM_BUFFERS, CAUSAL, OVERLAP, STORE_LSE,
                                 HEAD_MAJOR, PERSISTENT, PINGPONG, CONSUMERS, ONE_LOOP, CHAIN, EPILOGUE,
                                 ARRIVE_AT, HALF_DIAG, EXP_POLY, ones_smem, ones_bar, SUM_MMA, Partials,
                                 Flags, STREAM_KV, Sched, LPT)),
                    (_loader, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready,
                               kv_empty, SEQ_LEN, BH, BLOCK_N, NUM_BUFFERS, CAUSAL, HEAD_MAJOR, PERSISTENT,
                               CONSUMERS, desc_ones, ones_smem, ones_bar, SUM_MMA, STREAM_KV, Sched, LPT)),
                ],
                [4, 4, 1],
                [CONSUMER_REGS, CONSUMER_REGS, 24],
            )  # fmt: skip
        else:
            gl.warp_specialize(
                [
                    (_consumer, (Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, turn,
                                 qk_scale, 0, SEQ_LEN, BH, HEAD_DIM, BLOCK_N, NUM_BUFFERS, CAUSAL, OVERLAP, STORE_LSE,
                                 HEAD_MAJOR, PERSISTENT, PINGPONG, CONSUMERS, ONE_LOOP, CHAIN, EPILOGUE,
                                 ARRIVE_AT, HALF_DIAG, EXP_POLY, ones_smem, ones_bar, SUM_MMA, Partials,
                                 Flags, STREAM_KV, Sched, LPT)),
                    (_consumer, (Out, Lse, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, turn,
                                 qk_scale, 1, SEQ_LEN, BH, HEAD_DIM, BLOCK_N, NUM_BUFFERS, CAUSAL, OVERLAP, STORE_LSE,
                                 HEAD_MAJOR, PERSISTENT, PINGPONG, CONSUMERS, ONE_LOOP, CHAIN, EPILOGUE,
                                 ARRIVE_AT, HALF_DIAG, EXP_POLY, ones_smem, ones_bar, SUM_MMA, Partials,
                                 Flags, STREAM_KV, Sched, LPT)),
                    (_loader, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready,
                               kv_empty, SEQ_LEN, BH, BLOCK_N, NUM_BUFFERS, CAUSAL, HEAD_MAJOR, PERSISTENT,
                               CONSUMERS, desc_ones, ones_smem, ones_bar, SUM_MMA, STREAM_KV, Sched, LPT)),
                ],
                [4, 1],
                [CONSUMER_REGS, 24],
            )  # fmt: skip


@functools.cache
def _shared_layout(rows: int, cols: int, dtype: torch.dtype) -> Any:
    """The NVMMA shared layout of a ``[rows, cols]`` TMA box, worked out once (about 15 us a call on the host)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)


def _descriptors(q: Any, k: Any, v: Any, ones: Any, rows: int, head_dim: int,
                 block_n: int) -> tuple[Any, Any, Any, Any]:  # fmt: skip
    """TMA descriptors of Q, K and V (``[rows, head_dim]``) and of ``ones`` (``[8, block_n]``, ``SUM_MMA``'s B; None
    without ``SUM_MMA``: Q's descriptor stands in for it, which the kernel then never reads)."""
    q_layout, kv_layout = _shared_layout(SUB_M, head_dim, q.dtype), _shared_layout(block_n, head_dim, q.dtype)
    shape, strides = [rows, head_dim], [head_dim, 1]
    desc_q = TensorDescriptor(q, shape, strides, [SUB_M, head_dim], q_layout)
    if ones is None:
        desc_ones = desc_q
    else:
        ones_layout = _shared_layout(8, block_n, q.dtype)
        desc_ones = TensorDescriptor(ones, [8, block_n], [block_n, 1], [8, block_n], ones_layout)
    return (
        desc_q,
        TensorDescriptor(k, shape, strides, [block_n, head_dim], kv_layout),
        TensorDescriptor(v, shape, strides, [block_n, head_dim], kv_layout),
        desc_ones,
    )


def _plan_descriptors(q: Any, k: Any, v: Any, ones: Any, rows: int, head_dim: int,
                      block_n: int) -> tuple[Any, Any, Any, Any]:  # fmt: skip
    """:func:`_descriptors` of ``[B, H, S, D]`` Q, K and V viewed as ``[rows, head_dim]``."""
    return _descriptors(q.view(rows, head_dim), k.view(rows, head_dim), v.view(rows, head_dim), ones, rows, head_dim,
                        block_n)  # fmt: skip


_ONES: dict[tuple[Any, torch.dtype, int], torch.Tensor] = {}


def _ones(device: torch.device, dtype: torch.dtype, block_n: int) -> torch.Tensor:
    """The ``[8, block_n]`` ones ``SUM_MMA``'s row-sum wgmmas multiply P by, one per device, dtype and width."""
    key = (device, dtype, block_n)
    if key not in _ONES:
        _ONES[key] = torch.ones(8, block_n, dtype=dtype, device=device)
    return _ONES[key]


def _meta(head_dim: int, causal: bool, store_lse: bool, **knobs: Any) -> dict[str, Any]:
    """The kernel's constexprs and launch options: ``knobs`` (checked by :func:`_check`) over :data:`KNOBS`;
    ``CONSUMER_REGS`` defaults to the most the consumers can take."""
    merged = {**KNOBS, **knobs}
    if merged["CONSUMER_REGS"] is None:
        merged["CONSUMER_REGS"] = consumer_regs_limit(merged["CONSUMERS"], merged["CTAS_PER_SM"])
    flags = {name: bool(value) if isinstance(KNOBS[name], bool) else value for name, value in merged.items()}
    thread_arrive, warp_arrive = flags.pop("THREAD_ARRIVE"), flags.pop("WARP_ARRIVE")
    flags["LPT"] = bool(flags.pop("LPT_HEADS"))  # the kernel reads the table; the group size only shapes it
    # WARP_ARRIVE's offset is known after a first compile places the allocations (_place_warp_arrivals)
    arrive_at = ARRIVE_EVERY_THREAD if thread_arrive else ARRIVE_WARPS_UNPLACED if warp_arrive else ARRIVE_ONE_THREAD
    return {
        "HEAD_DIM": head_dim,
        "CAUSAL": bool(causal),
        "STORE_LSE": bool(store_lse),
        **flags,
        "ARRIVE_AT": int(arrive_at),
        "num_warps": 4,
        # Registers per thread over all warps (with two consumers 12 warps: 65,536 / 384 = 170): the partitions'
        # budgets are carved from it (``setmaxnreg``): the loader keeps 24, the consumers take what that frees.
        "maxnreg": _maxnreg(merged["CONSUMERS"], merged["CTAS_PER_SM"]),
    }


def _grid(bh: int, seq_len: int, meta: dict[str, Any], num_sms: int) -> tuple[int, ...]:
    if meta.get("STREAM_KV"):  # every SM: the last round's key blocks go to all of them
        return (num_sms * meta.get("CTAS_PER_SM", 1),)
    if meta["PERSISTENT"]:
        items = bh * query_tiles(seq_len, meta["CONSUMERS"]) if meta.get("LPT") else work_items(
            bh, seq_len, meta["CONSUMERS"], meta["CAUSAL"])
        return (min(items, num_sms * meta.get("CTAS_PER_SM", 1)),)
    tiles = query_tiles(seq_len, meta["CONSUMERS"])
    return (tiles, bh) if meta["HEAD_MAJOR"] else (bh, tiles)


#: (device, programs, consumers, head_dim) -> ``STREAM_KV``'s fp32 slots and int32 flags (left zero by launches).
_STREAM_BUFFERS: dict[tuple[Any, int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def stream_buffers(device: torch.device, programs: int, consumers: int,
                   head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``STREAM_KV``'s partial slots (one a program) and their flags, cached per device and shape: a launch leaves
    every flag zero, so launches on one device must not overlap."""
    key = (device, programs, consumers, head_dim)
    if key not in _STREAM_BUFFERS:
        slots = torch.empty(programs * stream_slot_floats(consumers, head_dim), device=device, dtype=torch.float32)
        _STREAM_BUFFERS[key] = (slots, torch.zeros(programs * consumers, device=device, dtype=torch.int32))
    return _STREAM_BUFFERS[key]


#: (device, lpt_schedule's arguments) -> ``LPT_HEADS``' table on the device.
_SCHEDULES: dict[tuple[Any, ...], torch.Tensor] = {}


def schedule_table(device: torch.device, bh: int, seq_len: int, consumers: int, block_n: int, causal: bool,
                   programs: int, group_heads: int) -> torch.Tensor:  # fmt: skip
    """``LPT_HEADS``' tile lists (:func:`kernels.attention.attention_ws_rules.lpt_schedule`) as int32 on ``device``,
    built
    once per shape and cached (a few KiB: one entry a query tile)."""
    key = (device, bh, seq_len, consumers, block_n, causal, programs, group_heads)
    if key not in _SCHEDULES:
        table = lpt_schedule(bh, seq_len, consumers, block_n, causal, programs, group_heads)
        _SCHEDULES[key] = torch.tensor(table, dtype=torch.int32, device=device)
    return _SCHEDULES[key]


def _check(head_dim: int, precision: str, knobs: dict[str, Any]) -> None:
    reason = check_knobs(head_dim, precision, knobs)
    if reason:
        raise ValueError(reason)


_CHECKED_META: dict[tuple, dict[str, Any]] = {}


def _checked_meta(head_dim: int, precision: str, causal: bool, store_lse: bool,
                  knobs: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """:func:`_check`, then :func:`_meta`, done once per config: a launch reuses the rules' verdict and the
    constexprs (tens of microseconds of host time a call otherwise). A config the rules refuse raises every time;
    one with an unhashable knob value is checked every time. The dict returned is shared: not to be changed."""
    try:
        # each value with its type: 1 and True (or 2 and 2.0) are equal keys, but not the same constexpr
        knob_key = tuple(sorted((name, type(value).__name__, value) for name, value in knobs.items()))
        key = (head_dim, precision, bool(causal), bool(store_lse), knob_key)
        meta = _CHECKED_META.get(key)
    except TypeError:
        _check(head_dim, precision, knobs)
        return _meta(head_dim, causal, store_lse, **knobs)
    if meta is None:
        _check(head_dim, precision, knobs)
        meta = _CHECKED_META[key] = _meta(head_dim, causal, store_lse, **knobs)
    return meta


#: :func:`attention_ws`'s launch plans (each holds the checked constexprs of :func:`_checked_meta`).
_PLANS = PlanCache()


def attention_ws(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    sm_scale: float | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    **knobs: Any,
) -> torch.Tensor:
    """``softmax(Q K^T * sm_scale [+ causal mask]) V`` with the warp-specialized Gluon kernel (sm_90).

    Inputs and outputs as :func:`kernels.attention.attention.attention` (``[B, H, S, D]`` contiguous bf16 or fp16,
    ``lse`` ``[B, H, S]`` fp32 when given). ``knobs``: those of :data:`KNOBS` (``BLOCK_N``, ``NUM_BUFFERS``,
    ``OVERLAP``, ``CONSUMER_REGS``, ``HEAD_MAJOR``, ``PERSISTENT``: one program per SM over all
    tiles, ``PINGPONG``: the consumers take turns to issue their wgmmas, with ``OVERLAP``; ``CONSUMERS``: 2, or 3
    at D = 64, or 1; ``ONE_LOOP``: a tile's key blocks in one loop; ``CTAS_PER_SM``: programs an SM, 2 with one
    consumer; ``EPILOGUE``: 1 and 2 store the output in 16-byte vectors; ``RELEASE_K``: a consumer frees a key
    block's K slot once its scores are done, not with its V after P V; ``THREAD_ARRIVE``: every consumer thread
    arrives on the slots' empty barriers; ``WARP_ARRIVE``: one lane a warp, in inline PTX; ``HALF_DIAG``: causal, the
    first consumer takes half the diagonal block; ``EXP_POLY``: 0-4 of every 8 exponentials by a polynomial on the
    FMA pipe; ``SUM_MMA``: the rows' sums of P by a wgmma; ``STREAM_KV``: the persistent grid's last round dealt out
    by key blocks, with partial slots and flags cached per device (:func:`stream_buffers`); ``Q_BUFFERS``: 1 or 2 Q
    buffers a consumer; ``LPT_HEADS``: the persistent programs' tiles from a table, longest first by groups of that
    many heads, cached per device and shape (:func:`schedule_table`)). Launches asynchronously on the current
    stream.
    """
    key = (layout_key(q, k, v, out, lse), q.device, causal, tuple(knobs.items()), tuple(map(type, knobs.values())))
    plan = _PLANS.get(key)
    if plan is None:
        out = check_operands(q, k, v, out, lse)
        batch, heads, seq_len, head_dim = q.shape
        if not available():
            raise ValueError("the warp-specialized attention kernel needs Gluon (Triton >= 3.6) on an sm_90 GPU")
        precision = next(name for name, dtype in DTYPES.items() if dtype == q.dtype)
        meta = _checked_meta(head_dim, precision, causal, lse is not None, knobs)
        rows = batch * heads * seq_len
        ones = _ones(q.device, q.dtype, meta["BLOCK_N"]) if meta["SUM_MMA"] else None
        box = (ones, rows, head_dim, meta["BLOCK_N"])
        descriptors = Descriptors()
        descs = descriptors.get((q.data_ptr(), k.data_ptr(), v.data_ptr()), _plan_descriptors, q, k, v, *box)
        scale = 1.0 / math.sqrt(head_dim)
        grid = _grid(batch * heads, seq_len, meta, sm_count(q.device))
        slots, flags = stream_buffers(q.device, grid[0], meta["CONSUMERS"], head_dim) if meta["STREAM_KV"] else (
            None, None)
        sched = schedule_table(q.device, batch * heads, seq_len, meta["CONSUMERS"], meta["BLOCK_N"], causal, grid[0],
                               knobs.get("LPT_HEADS", KNOBS["LPT_HEADS"])) if meta["LPT"] else None  # fmt: skip
        args = (out, lse, slots, flags, sched, *descs, scale, seq_len, batch * heads)
        if meta["ARRIVE_AT"] == ARRIVE_WARPS_UNPLACED:
            target = (q.dtype, torch.cuda.get_device_capability(q.device))
            meta = _place_warp_arrivals(meta, lambda m: attention_fwd_ws_kernel.warmup(*args, grid=grid, **m), target)
        plan = _PLANS.put(key, Plan(attention_fwd_ws_kernel, grid, meta, scale=scale, buffers=(slots, flags, sched),
                                    sizes=(seq_len, batch * heads), descs=descriptors, box=box))  # fmt: skip
    elif out is None:
        out = torch.empty_like(q)
    state = plan.state
    descs = state["descs"].get((q.data_ptr(), k.data_ptr(), v.data_ptr()), _plan_descriptors, q, k, v, *state["box"])
    scale = state["scale"] if sm_scale is None else float(sm_scale)
    plan.launch(out, lse, *state["buffers"], *descs, scale, *state["sizes"])
    return out


def _mock_args(batch: int, heads: int, seq_len: int, head_dim: int, precision: str, block_n: int,
               sum_mma: bool = False, stream_kv: bool = False, lpt: bool = False) -> tuple:  # fmt: skip
    MockTensor = mock_tensor_class()
    dtype = DTYPES[precision]
    rows = batch * heads * seq_len
    flat = [MockTensor(dtype, [rows, head_dim]) for _ in range(3)]
    out = MockTensor(dtype, [batch, heads, seq_len, head_dim])
    descs = _descriptors(*flat, MockTensor(dtype, [8, block_n]) if sum_mma else None, rows, head_dim, block_n)
    slots, flags = (MockTensor(torch.float32, [1]), MockTensor(torch.int32, [1])) if stream_kv else (None, None)
    sched = MockTensor(torch.int32, [1]) if lpt else None
    return (out, None, slots, flags, sched, *descs, 1.0 / math.sqrt(head_dim), seq_len, batch * heads)


def compile_only(
    batch: int, heads: int, seq_len: int, head_dim: int, *, causal: bool, precision: str, **knobs: Any
) -> Any | None:
    """Compile the kernel :func:`attention_ws` launches for the current GPU, without launching it (None when
    Gluon is missing or the kernels are interpreted)."""
    if not available():
        return None
    _check(head_dim, precision, knobs)
    meta = _meta(head_dim, causal, False, **knobs)
    args = _mock_args(batch, heads, seq_len, head_dim, precision, meta["BLOCK_N"], meta["SUM_MMA"], meta["STREAM_KV"],
                      meta["LPT"])
    num_sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return attention_fwd_ws_kernel.warmup(*args, **meta, grid=_grid(batch * heads, seq_len, meta, num_sms))


def compile_for_target(
    batch: int, heads: int, seq_len: int, head_dim: int, *, causal: bool, precision: str, capability: int = 90,
    **knobs: Any,
) -> Any:  # fmt: skip
    """``triton.compile`` for ``GPUTarget("cuda", capability, 32)`` with no GPU (shared memory, registers)."""
    from kernels.attention.attention import compile_jit_for_target

    _check(head_dim, precision, knobs)
    kwargs = _meta(head_dim, causal, False, **knobs)
    args = _mock_args(batch, heads, seq_len, head_dim, precision, kwargs["BLOCK_N"], kwargs["SUM_MMA"],
                      kwargs["STREAM_KV"], kwargs["LPT"])
    if kwargs["ARRIVE_AT"] == ARRIVE_WARPS_UNPLACED:
        kwargs = _place_warp_arrivals(kwargs, lambda m: compile_jit_for_target(attention_fwd_ws_kernel, args, m,
                                                                                capability),
                                      (precision, capability))  # fmt: skip
    return compile_jit_for_target(attention_fwd_ws_kernel, args, kwargs, capability)
