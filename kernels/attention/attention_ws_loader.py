"""The loader warp of :mod:`kernels.attention.attention_ws` (TMA loads of each tile's Q and of its K/V blocks into the
ring),
and the persistent programs' walk over their tiles, which the loader and every consumer take in the same order:
the work items in turn (a causal item pairs a head's longest query tile with its shortest), or with ``LPT_HEADS``
the program's list in a host-built table (:func:`kernels.attention.attention_ws_rules.lpt_schedule`)."""

from __future__ import annotations

try:  # Gluon (Triton >= 3.6); the functions are defined only where it exists
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier

    from kernels.gluon_compat import tma_load
except ImportError:  # pragma: no cover - older Triton
    gluon = None

if gluon is not None:
    from kernels.attention.attention_ws_steps import _program_tile, _tile_extent, _work_item
    from kernels.attention.attention_ws_stream import _round_items, _tail_part, _tail_share

    @gluon.jit
    def _program_items(Sched, num_m, BH, CAUSAL: gl.constexpr, STREAM_KV: gl.constexpr, LPT: gl.constexpr):
        """(first, end, step) of the items a persistent program runs: with ``LPT`` its entries of ``Sched`` (the
        table's offsets, one tile an entry), else every ``num_programs``-th work item from its own (with
        ``STREAM_KV`` those of the whole rounds)."""
        if LPT:
            first = gl.load(Sched + gl.program_id(0))
            end = gl.load(Sched + gl.program_id(0) + 1)
            step = 1
        else:
            first = gl.program_id(0)
            end = _round_items(num_m, BH, CAUSAL, STREAM_KV)
            step = gl.num_programs(0)
        return first, end, step

    @gluon.jit
    def _entry(Sched, j, end, LPT: gl.constexpr):
        """``LPT``: the table's entry ``j``, clamped to the program's last (a consumer loads one a tile ahead); else
        0."""
        if LPT:
            code = gl.load(Sched + gl.minimum(j, end - 1))
        else:
            code = end * 0
        return code

    @gluon.jit
    def _scheduled_item(item, code, num_m, CAUSAL: gl.constexpr, LPT: gl.constexpr):
        """(batch*head, first query tile, second, tiles) of a program's item: with ``LPT`` its table entry ``code``
        (``head * num_m + tile``, one tile); else work item ``item`` (:func:`_work_item`)."""
        if LPT:
            off_hz = code // num_m
            first = code % num_m
            second = first
            tiles = 1
        else:
            off_hz, first, second, tiles = _work_item(item, num_m, CAUSAL)
        return off_hz, first, second, tiles

    @gluon.jit
    def _load_tile(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty,
                   q_row, kv_row, lo, hi, base, q_free_phase, BLOCK_N: gl.constexpr,
                   NUM_BUFFERS: gl.constexpr, CONSUMERS: gl.constexpr, qb=0):  # fmt: skip
        """A tile's loads of its key blocks lo .. hi-1: K_lo and V_lo into ring slot ``base + lo`` (its stage frees
        while the previous tile runs), the consumers' 64-row Q tiles (once each consumer freed its buffer), then K_j
        and V_j into slot base + j. ``qb``: which of the consumers' Q buffers (``Q_BUFFERS``) the tile's Q goes to."""
        _load_kv(desc_k, desc_v, k_smem, v_smem, k_ready, v_ready, kv_empty, kv_row, lo, base, BLOCK_N, NUM_BUFFERS)
        for c in gl.static_range(CONSUMERS):
            qs = qb * CONSUMERS + c
            mbarrier.wait(q_empty.index(qs), q_free_phase)
            mbarrier.expect(q_bar.index(qs), desc_q.block_type.nbytes)
            tma_load(desc_q, [q_row + c * 64, 0], q_bar.index(qs), q_smem.index(qs))
        for j in range(lo + 1, hi):
            _load_kv(desc_k, desc_v, k_smem, v_smem, k_ready, v_ready, kv_empty, kv_row, j, base, BLOCK_N, NUM_BUFFERS)

    @gluon.jit
    def _load_kv(desc_k, desc_v, k_smem, v_smem, k_ready, v_ready, kv_empty, kv_row, j, base, BLOCK_N: gl.constexpr,
                 NUM_BUFFERS: gl.constexpr):  # fmt: skip
        """K_j and V_j into ring slot base + j once every consumer freed it (K and V with their own barriers).
        With ``RELEASE_K`` (``kv_empty`` twice as long: V's empty barriers after K's) each waits for its own."""
        V_EMPTY: gl.constexpr = kv_empty.shape[0] - NUM_BUFFERS  # 0: one barrier frees both; else V's offset
        stage = (base + j) % NUM_BUFFERS
        # A fresh barrier's "previous phase" (parity 1) counts as complete: the first pass does not wait.
        free_phase = (((base + j) // NUM_BUFFERS) & 1) ^ 1
        mbarrier.wait(kv_empty.index(stage), free_phase)
        row = kv_row + j * BLOCK_N
        mbarrier.expect(k_ready.index(stage), desc_k.block_type.nbytes)
        tma_load(desc_k, [row, 0], k_ready.index(stage), k_smem.index(stage))
        if V_EMPTY > 0:
            mbarrier.wait(kv_empty.index(V_EMPTY + stage), free_phase)
        mbarrier.expect(v_ready.index(stage), desc_v.block_type.nbytes)
        tma_load(desc_v, [row, 0], v_ready.index(stage), v_smem.index(stage))

    @gluon.jit
    def _loader(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, SEQ_LEN,
                BH, BLOCK_N: gl.constexpr, NUM_BUFFERS: gl.constexpr, CAUSAL: gl.constexpr,
                HEAD_MAJOR: gl.constexpr, PERSISTENT: gl.constexpr, CONSUMERS: gl.constexpr, desc_ones, ones_smem,
                ones_bar, SUM_MMA: gl.constexpr, STREAM_KV: gl.constexpr, Sched, LPT: gl.constexpr):  # fmt: skip
        """One warp: the program's tile (or, persistent, each of its tiles in turn: its work items, or with ``LPT``
        its list in ``Sched``; with ``STREAM_KV`` then its share of the last round's key blocks): Q, then its K/V
        blocks; with ``SUM_MMA`` first the block of ones the consumers' row-sum wgmmas read."""
        BLOCK_M: gl.constexpr = 64 * CONSUMERS
        QB: gl.constexpr = q_smem.shape[0] // CONSUMERS  # Q_BUFFERS: tile i's Q in buffer i % QB
        if SUM_MMA:
            mbarrier.expect(ones_bar.index(0), desc_ones.block_type.nbytes)
            tma_load(desc_ones, [0, 0], ones_bar.index(0), ones_smem)
        if PERSISTENT:
            num_m = gl.cdiv(SEQ_LEN, BLOCK_M)
            base = 0
            i = 0
            first_item, end, step = _program_items(Sched, num_m, BH, CAUSAL, STREAM_KV, LPT)
            for item in range(first_item, end, step):
                off_hz, first, second, tiles = _scheduled_item(item, _entry(Sched, item, end, LPT), num_m, CAUSAL, LPT)
                row0 = off_hz * SEQ_LEN
                for h in range(tiles):
                    start_m = first + h * (second - first)
                    _, n_blocks = _tile_extent(start_m, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
                    _load_tile(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready,
                               kv_empty, row0 + start_m * BLOCK_M, row0, 0, n_blocks, base, ((i // QB) & 1) ^ 1,
                               BLOCK_N, NUM_BUFFERS, CONSUMERS, i % QB)  # fmt: skip
                    base += n_blocks
                    i += 1
            if STREAM_KV:
                g, g_end = _tail_share(gl.program_id(0), num_m, BH, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
                while g < g_end:
                    off_hz, start_m, _, n_blocks, kb, hi = _tail_part(g, g_end, num_m, SEQ_LEN, BLOCK_N, CAUSAL,
                                                                     CONSUMERS)  # fmt: skip
                    row0 = off_hz * SEQ_LEN
                    _load_tile(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready,
                               kv_empty, row0 + start_m * BLOCK_M, row0, kb, hi, base - kb, ((i // QB) & 1) ^ 1,
                               BLOCK_N, NUM_BUFFERS, CONSUMERS, i % QB)  # fmt: skip
                    base += hi - kb
                    g += hi - kb
                    i += 1
        else:
            off_hz, start_m = _program_tile(SEQ_LEN, CAUSAL, HEAD_MAJOR, CONSUMERS)
            _, n_blocks = _tile_extent(start_m, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
            row0 = off_hz * SEQ_LEN
            _load_tile(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_ready, v_ready, kv_empty,
                       row0 + start_m * BLOCK_M, row0, 0, n_blocks, 0, 1, BLOCK_N, NUM_BUFFERS, CONSUMERS)  # fmt: skip
