"""``STREAM_KV`` of :mod:`kernels.attention.attention_ws`, in Gluon: the persistent grid's last, partial round of work
items
dealt out to every program by key blocks, and the parts of a tile cut between programs merged in the kernel.

- The schedule: all tiles' key blocks laid end to end in the work items' order (head-major; causal, a head's pairs of
  tiles), found by closed forms (:func:`_locate`), and each program's even share of the last round's blocks
  (:func:`_tail_share`), walked a tile's part at a time (:func:`_tail_part`).
- The merge: a share that starts inside a tile publishes its part to an fp32 slot of its own and raises a flag
  (release, :func:`_publish`); the program holding the tile's first blocks acquires and resets the flag, and folds
  the part in as the online softmax folds a key block (:func:`_merge`).
"""

from __future__ import annotations

try:  # Gluon (Triton >= 3.6); the functions are defined only where it exists
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from kernels.gluon_compat import warps_barrier
except ImportError:  # pragma: no cover - older Triton
    gluon = None

if gluon is not None:
    from kernels.attention.attention_ws_steps import _num_items, _sum_layout, _tile_extent

    @gluon.jit
    def _round_items(num_m, BH, CAUSAL: gl.constexpr, STREAM_KV: gl.constexpr):
        """The work items a persistent program strides over: all, or with ``STREAM_KV`` those of the whole rounds
        (one item a program a round); the rest go out as :func:`_tail_share`'s key blocks."""
        items = _num_items(num_m, BH, CAUSAL)
        if STREAM_KV:
            items = items // gl.num_programs(0) * gl.num_programs(0)
        return items

    @gluon.jit
    def _head_blocks(num_m, SEQ_LEN, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr):
        """Key blocks of all of one (batch, head)'s tiles (``STREAM_KV``: causal with ``BLOCK_N`` dividing the
        ``64 * CONSUMERS`` rows of a tile, so that tile m < num_m - 1 reads R * (m + 1) blocks, R the ratio)."""
        nb = gl.cdiv(SEQ_LEN, BLOCK_N)
        if CAUSAL:
            R: gl.constexpr = 64 * CONSUMERS // BLOCK_N
            blocks = nb + R * ((num_m - 1) * num_m // 2)
        else:
            blocks = num_m * nb
        return blocks

    @gluon.jit
    def _blocks_before(k, num_m, SEQ_LEN, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr):
        """Key blocks of a head's work items before its item ``k`` (:func:`_work_item`'s order). Causal: item 0
        pairs the last tile (its rows clipped at SEQ_LEN) with the first; every later pair reads R * (num_m + 1)
        blocks (the middle tile of an odd num_m, alone and last, half that)."""
        nb = gl.cdiv(SEQ_LEN, BLOCK_N)
        if CAUSAL:
            R: gl.constexpr = 64 * CONSUMERS // BLOCK_N
            first = nb + gl.where(num_m > 1, R, 0)
            before = gl.where(k > 0, first + (k - 1) * (R * (num_m + 1)), 0)
        else:
            before = k * nb
        return before

    @gluon.jit
    def _locate(g, num_m, SEQ_LEN, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr):
        """(batch*head, query block, key block) of block ``g`` of all the tiles' key blocks laid end to end in the
        work items' order (head-major; causal, a head's pairs of tiles as :func:`_work_item` takes them)."""
        nb = gl.cdiv(SEQ_LEN, BLOCK_N)
        if CAUSAL:
            R: gl.constexpr = 64 * CONSUMERS // BLOCK_N
            head = _head_blocks(num_m, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
            off_hz = g // head
            rem = g - off_hz * head
            first = _blocks_before(1, num_m, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)  # item 0's blocks
            pair = R * (num_m + 1)
            later = rem >= first
            k = gl.where(later, 1 + (rem - first) // pair, 0)
            into = gl.where(later, (rem - first) % pair, rem)
            first_len = gl.where(later, R * (num_m - k), nb)  # blocks of the pair's first (longer) tile
            in_first = into < first_len
            start_m = gl.where(in_first, num_m - 1 - k, k)
            kb = gl.where(in_first, into, into - first_len)
        else:
            t = g // nb
            kb = g - t * nb
            off_hz = t // num_m
            start_m = t - off_hz * num_m
        return off_hz, start_m, kb

    @gluon.jit
    def _tail_share(rank, num_m, BH, SEQ_LEN, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                    CONSUMERS: gl.constexpr):  # fmt: skip
        """``STREAM_KV``: the key blocks [start, end) that program ``rank`` takes of the work items left after the
        whole rounds (each program one item a round): their blocks dealt out evenly over all programs, as stream-K
        deals a GEMM's last tiles' K iterations, so no SM idles through the last round while others finish it."""
        programs = gl.num_programs(0)
        first_item = _round_items(num_m, BH, CAUSAL, True)
        if CAUSAL:
            per_head = (num_m + 1) // 2
        else:
            per_head = num_m
        h0 = first_item // per_head
        head = _head_blocks(num_m, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
        g0 = h0 * head + _blocks_before(first_item - h0 * per_head, num_m, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
        total = (BH * head - g0).to(gl.int64)
        start = g0 + (rank.to(gl.int64) * total // programs).to(gl.int32)
        end = g0 + ((rank + 1).to(gl.int64) * total // programs).to(gl.int32)
        return start, end

    @gluon.jit
    def _tail_part(g, g_end, num_m, SEQ_LEN, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr):
        """The part of a tail share [g, g_end) that starts at block ``g``: (batch*head, query block, the tile's
        blocks left of its rows and its blocks, the part's first and end key block), one tile's blocks at most."""
        off_hz, start_m, kb = _locate(g, num_m, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
        n_full, n_blocks = _tile_extent(start_m, SEQ_LEN, BLOCK_N, CAUSAL, CONSUMERS)
        return off_hz, start_m, n_full, n_blocks, kb, gl.minimum(n_blocks, kb + (g_end - g))

    @gluon.jit
    def _partial_at(Partials, slot, acc, c: gl.constexpr, CONSUMERS: gl.constexpr, HEAD_DIM: gl.constexpr):
        """``STREAM_KV``'s fp32 slot of consumer ``c`` of program ``slot``: its 64 x HEAD_DIM accumulator, then its
        rows' running max and sum, each as a 64 x 8 tile (:func:`_sum_layout`, every column the same value): offsets
        of the accumulator in ``acc``'s layout and of the two 64 x 8 tiles."""
        sums: gl.constexpr = _sum_layout()
        o_layout: gl.constexpr = acc.type.layout
        base = Partials + (slot * CONSUMERS + c) * (64 * (HEAD_DIM + 16))
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
        d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        acc_ptrs = base + gl.expand_dims(r, 1) * HEAD_DIM + gl.expand_dims(d, 0)
        rs = gl.arange(0, 64, layout=gl.SliceLayout(1, sums))
        cs = gl.arange(0, 8, layout=gl.SliceLayout(0, sums))
        m_ptrs = base + 64 * HEAD_DIM + gl.expand_dims(rs, 1) * 8 + gl.expand_dims(cs, 0)
        return acc_ptrs, m_ptrs, m_ptrs + 64 * 8

    @gluon.jit
    def _publish(Partials, Flags, slot, acc, m_i, l_i, c: gl.constexpr, CONSUMERS: gl.constexpr,
                 HEAD_DIM: gl.constexpr):  # fmt: skip
        """``STREAM_KV``: a consumer's part of a tile that another program finishes (its accumulator, unnormalized,
        with the rows' max and sum) into slot ``slot``, then the slot's flag raised (release) once every thread's
        stores are issued."""
        sums: gl.constexpr = _sum_layout()
        acc_ptrs, m_ptrs, l_ptrs = _partial_at(Partials, slot, acc, c, CONSUMERS, HEAD_DIM)
        gl.store(acc_ptrs, acc)
        wide = gl.zeros([64, 8], gl.float32, sums)
        gl.store(m_ptrs, wide + gl.expand_dims(gl.convert_layout(m_i, gl.SliceLayout(1, sums)), 1))
        gl.store(l_ptrs, wide + gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, sums)), 1))
        warps_barrier()
        gl.atomic_xchg(Flags + slot * CONSUMERS + c, 1, sem="release", scope="gpu")

    @gluon.jit
    def _merge(Partials, Flags, slot, acc, m_i, l_i, c: gl.constexpr, CONSUMERS: gl.constexpr,
               HEAD_DIM: gl.constexpr):  # fmt: skip
        """``STREAM_KV``: wait for slot ``slot``'s flag (acquire, and reset it for the next launch), then fold that
        part of the tile into (acc, m_i, l_i) as the online softmax folds a key block: both rescaled to the larger
        max (a part whose rows saw only masked keys has a max of about -1e30 * scale and weighs nothing)."""
        o_layout: gl.constexpr = acc.type.layout
        flag = gl.atomic_cas(Flags + slot * CONSUMERS + c, 1, 0, sem="acquire", scope="gpu")
        while flag != 1:
            flag = gl.atomic_cas(Flags + slot * CONSUMERS + c, 1, 0, sem="acquire", scope="gpu")
        warps_barrier()
        acc_ptrs, m_ptrs, l_ptrs = _partial_at(Partials, slot, acc, c, CONSUMERS, HEAD_DIM)
        part = gl.load(acc_ptrs, cache_modifier=".cg")
        part_m = gl.convert_layout(gl.max(gl.load(m_ptrs, cache_modifier=".cg"), 1), m_i.type.layout)
        part_l = gl.convert_layout(gl.max(gl.load(l_ptrs, cache_modifier=".cg"), 1), l_i.type.layout)
        m_new = gl.maximum(m_i, part_m)
        mine = gl.exp2(m_i - m_new)
        theirs = gl.exp2(part_m - m_new)
        # A row that saw no key of the part (causal, blocks past its diagonal: only with BLOCK_N < 64 * CONSUMERS)
        # has a max of -1e30 * scale and probabilities of exp2 of that product's rounding error (0, or inf): such a
        # part weighs exactly 0 here and is dropped, so that inf * 0 cannot make NaN. The program's own part has
        # its tile's first key block, which every row sees.
        keep = gl.expand_dims(gl.convert_layout(theirs, gl.SliceLayout(1, o_layout)), 1)
        acc = (acc * gl.expand_dims(gl.convert_layout(mine, gl.SliceLayout(1, o_layout)), 1)
               + gl.where(keep > 0.0, part * keep, 0.0))  # fmt: skip
        part_l = gl.where(theirs > 0.0, part_l * gl.convert_layout(theirs, part_l.type.layout), 0.0)
        l_i = l_i * gl.convert_layout(mine, l_i.type.layout) + gl.convert_layout(part_l, l_i.type.layout)
        return acc, m_new, l_i
