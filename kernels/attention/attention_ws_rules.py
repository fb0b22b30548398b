"""The host-side rules of the warp-specialized attention kernel (:mod:`kernels.attention.attention_ws`): its knobs and
their
defaults, the configs it can run (shared memory, registers, the knobs that need each other), its register budgets
and its persistent grid's work items. No Gluon here: the workload's static check and the benchmarks use these
rules on any machine.

The knobs beyond the kernel's core schedule (:mod:`kernels.attention.attention_ws`: partitions, ``OVERLAP``,
``ONE_LOOP``,
``PERSISTENT``, ``PINGPONG``, ``CONSUMERS``), what each does and what it measured:

- ``CONSUMERS=1`` with ``CTAS_PER_SM=2``: cuDNN's tile at these shapes, 64 query rows and one consumer warpgroup a
  program, two programs an SM (registers and the K/V ring sized for two), so one program's loads, drain and stores
  overlap the other's wgmmas. Right on an H200, but 2-10% slower than two consumers at S = 1024 / 2048 (not in the
  default search space; ``bench/results/kernel-variants-attention-ws-single-h200.json``).
- ``EPILOGUE=1``: a consumer moves its normalized output tile (in Out's dtype) from the wgmma accumulator's layout,
  where each thread holds two columns of every 8-column group (4-byte stores), to a row-major one of 8 columns a
  thread (16-byte stores, a warp writing whole rows), through the compiler's shared-memory scratch (16 KiB more a
  program on sm_90). On an H200 it gained 3-8% at D = 64 with three K/V stages (S 1024-2048); at D = 128 it
  leaves room for two stages only, which lose to three without it
  (``bench/results/kernel-variants-attention-ws-epilogue-h200.json``).
- ``EPILOGUE=2``: the same 16-byte stores, 8 adjacent columns a thread, with the accumulator layout's rows kept:
  only each row's four lanes exchange pieces (:func:`kernels.attention.attention_ws_steps._quad_vector_layout`). The
  compiler does the exchange through 512 bytes of shared memory a warp, so it costs 4 KiB instead of 16 with two
  consumers.
- ``RELEASE_K``: K and V slots of the ring freed by their own empty barriers, a K slot as soon as the scores
  that read it are done (FlashAttention-3's separate K and V pipelines). Without it a block's K slot is held until
  its P V is done, one step longer than needed, so the loader's next K waits for it: two stages then act as
  fewer. On an H200 at S = 1024 it lifted two-stage configs by 4-14% (D = 128 full 505 -> 571 TFLOP/s with
  ``PINGPONG`` and ``EPILOGUE=2``), past three stages without it, and left three stages unchanged; with two stages
  the 64 KiB saved at D = 128 make room for either epilogue
  (``bench/results/kernel-variants-attention-ws-release-h200.json``).
- ``CHAIN`` (with ``PERSISTENT``, ``OVERLAP`` and ``ONE_LOOP``, without ``PINGPONG``): a program's tiles as one
  stream of key blocks, a tile's first scores and softmax under the previous tile's last P V. Right on an H200
  (GPU test), but 1-5% slower than the same config without it at S = 1024 (not in the default search space).
- ``THREAD_ARRIVE``: every consumer thread frees a K/V slot (``cp.async.mbarrier.arrive.noinc``, the empty
  barriers counting 128 arrivals a consumer) instead of one thread, for which Triton brackets the arrival with
  warpgroup barriers (3 -> 2 ``bar.sync`` a key block in the overlapped loop under Triton 3.6). ncu put a third of
  the D = 64 S = 1024 winner's stall cycles at those barriers; right on an H200 (GPU test), but the 128 arrivals
  cost more than the barriers saved: 2.6% slower (median of 56 pairs, 16 shapes; not in the default search space;
  ``bench/results/kernel-variants-attention-ws-thread-arrive-h200.json``).
- ``WARP_ARRIVE``: lane 0 of each consumer warp frees a slot (4 arrivals a consumer) in inline PTX at kv_empty's
  shared-memory offset, which a first compile's barrier inits give (``attention_ws_steps._place_warp_arrivals``;
  the second compile must place the barriers at the same offset, or the launch fails). Triton sees no arrival, so
  the overlapped loop keeps 1 of its 3 warpgroup barriers a key block. Right on an H200 (GPU test), and neutral:
  1.001x the same config without it (median of 56 pairs, 16 shapes;
  ``kernel-variants-attention-ws-warp-arrive-h200.json``): the warps that no longer wait at the barriers wait for
  each other at the next wgmma. Not in the search space.

- ``HALF_DIAG`` (causal, two consumers, 128-key blocks, ``OVERLAP`` without ``PINGPONG``): in a tile's diagonal key
  block the first consumer's rows see only the first 64 keys, so it folds in that half alone (a 64 x 64 score
  wgmma on the K slot's first half, P V on the V slot's) after its loop over the blocks before, instead of scores,
  exponentials and P V over 128 keys of which 64 are masked: a quarter of the diagonal block's work, 5.6% of a
  causal tile's at S = 1024 (2.9% at 2048). On an H100 +2.6% at D = 64 S = 1024 causal, 1-2% slower at S = 2048
  and 4096 (``kernel-variants-attention-ws-half-diag-h100.json``); not in the default search space.
- ``EXP_POLY`` (0-4): FlashAttention-4's exponential. Each score costs one ``MUFU.EX2``, and the multi-function
  unit does 16 a clock an SM against the tensor cores' 4,096 bf16 FLOPs: at D = 64 a 128 x 128 block's
  exponentials (1,024 clocks) take as long as its two wgmmas, so the unit, not the tensor cores, sets the pace.
  ``EXP_POLY`` of every 8 scores instead get a degree-3 polynomial on the FMA pipe (128 a clock; about seven
  instructions, :func:`kernels.attention.attention_ws_steps.exp2_asm`), relative error 7.5e-5 against bf16's 3.9e-3. On
  an
  H100 ``EXP_POLY`` 0 won all four D = 64 shapes measured, S = 1024 and 2048
  (``kernel-variants-attention-ws-exp-poly-h100.json``): the loop is bound by its instruction issue, not by the
  unit; not in the default search space.
- ``SUM_MMA`` (one or two consumers, not ``CHAIN``): each row's sum of P by a 64 x 8 wgmma of P against a block of
  ones (8 x ``BLOCK_N`` in shared memory, loaded once by the loader) beside P V, instead of an add a score and a
  shuffle reduction a key block by every consumer thread (sm_90 SASS of the D = 64 winner: 272 -> 8 ``FADD``). The
  sums are then those of P as rounded for P V. Triton copies a register operand before each wgmma, so the second
  wgmma costs 32 moves a key block and the instruction count stays about the same; what it removes is the adds'
  dependent chain. On an H100 at S = 1024: +0.5-1.4% (D = 128 causal and full, D = 64 full), 0-2% slower at D = 64
  causal (``bench/results/kernel-variants-attention-ws-sum-mma*-h100.json``). In the search space.
- ``STREAM_KV`` (with ``PERSISTENT``, ``OVERLAP`` and ``ONE_LOOP``; ``BLOCK_N`` dividing the tile's rows): the items
  of the whole rounds as before, then the last round's key blocks dealt out evenly to every program (stream-K). A
  share that starts inside a tile publishes that part (unnormalized output, row max and sum) to a global fp32 slot
  and raises a flag (release); the program holding the tile's first blocks acquires the flags of every share that
  starts inside it, folds the parts in and stores. Right on an H100 (GPU test), but 1-9% slower than without it:
  the split parts cost more than the SMs that idle through a partial last round
  (``bench/results/kernel-variants-attention-waves-stream-h100.json``); not in the default search space.
- ``Q_BUFFERS=2`` (with ``PERSISTENT``, not ``CHAIN``): each consumer's tiles alternate between two Q buffers (tile i
  in buffer i % 2, its barriers' phase from i // 2), so the loader fetches a tile's Q while the tile before it runs
  instead of after that tile's last Q K^T. Right on an H100 (GPU test); no interleaved A/B yet (the first rounds of
  ``kernel-variants-attention-ws-q-buffers-h100.json`` favour it at 6 of 8 shapes by single samples); not in the
  default search space.
- ``LPT_HEADS`` (with ``PERSISTENT``, not ``CHAIN`` or ``STREAM_KV``): each persistent program runs a list of query
  tiles from a host-built table (:func:`lpt_schedule`, cached per device and shape; the next entry loaded a tile
  ahead) instead of striding over the causal pairs. The table takes the tiles ``LPT_HEADS`` heads at a time (a
  group's K/V stays in L2), longest first within a group, each to the program with the least work so far: the
  grid's last tiles are its shortest, so the programs end within about a short tile of each other. The pairs are
  equal items, and at the causal targets (2,048 pairs at S = 1024, D = 64, for 132 programs) the last round is
  partial: by the schedule's own count (key blocks plus half a block a tile) the most loaded program carries 3.1%
  over the mean with the pairs and 0.6% with the table (groups of 64 heads). Full attention's tiles are all the
  same work: there the table is the round-robin.
"""

from __future__ import annotations

from typing import Any

#: Query rows per consumer warpgroup (one wgmma M=64 atom); consumers per program (``CONSUMERS``: three hold
#: 64 x D accumulators in 160 registers a thread, so only at D = 64); the program's tile is ``SUB_M * CONSUMERS``.
SUB_M = 64
#: Q, K and V's dtypes (those of :data:`kernels.attention.attention.PRECISIONS`, which a test keeps equal).
PRECISIONS = ("bf16", "fp16")
CONSUMER_COUNTS = (1, 2, 3)
HEAD_DIMS = (64, 128)
BLOCK_NS = (64, 128)
LOADER_REGS = 24
#: Programs an SM runs at once (``CTAS_PER_SM``): two only with one consumer warpgroup (64 query rows a program,
#: cuDNN's tile), whose shared memory and registers then fit two programs. (Three leave 80 registers a thread at
#: launch, which Triton 3.6's ptxas refuses for the kernel's wgmma: "Insufficient registers".)
CTAS_PER_SM = (1, 2)
#: How a consumer stores its output tile (``EPILOGUE``): 0 from the wgmma accumulator's layout (4-byte stores),
#: 1 moved to a row-major layout first (16-byte stores, whole rows a warp; ``attention_ws_steps._store_tile``),
#: 2 its pieces exchanged within each row's four lanes (16-byte stores, 512 bytes of scratch a warp).
EPILOGUES = (0, 1, 2)
#: ``EPILOGUE=2``'s scratch a consumer: sm_90 compiles (Triton 3.6 and 3.9) exchange each warp's pieces through
#: 512 bytes of shared memory a warp (16-byte stores, ``ldmatrix`` loads) rather than shuffles: 3.8 KiB over the
#: kernel's other scratch with two consumers at D = 64 and 128, which leaves three K/V stages at D = 128 1.1 KiB
#: short.
EPILOGUE_SHUFFLE_SCRATCH = 2048
#: Shared memory of an H100/H200 multiprocessor (227 KiB a program at most, 1 KiB reserved per program).
SM_SHARED_BYTES = 228 * 1024
#: The scores of one exponential call: ``EXP_POLY`` of every ``EXP_PACK`` go to the polynomial, at most half.
EXP_PACK = 8
EXP_POLY_CHOICES = tuple(range(EXP_PACK // 2 + 1))

#: The kernel's knobs (keyword arguments of :func:`kernels.attention.attention_ws.attention_ws`) and their defaults.
KNOBS: dict[str, Any] = {
    "BLOCK_N": 128, "NUM_BUFFERS": 2, "OVERLAP": False, "CONSUMER_REGS": None, "HEAD_MAJOR": True,
    "PERSISTENT": False, "PINGPONG": False, "CONSUMERS": 2, "ONE_LOOP": False, "CHAIN": False, "CTAS_PER_SM": 1,
    "EPILOGUE": 0, "RELEASE_K": False, "THREAD_ARRIVE": False, "WARP_ARRIVE": False, "HALF_DIAG": False,
    "EXP_POLY": 0, "SUM_MMA": False, "STREAM_KV": False, "Q_BUFFERS": 1, "LPT_HEADS": 0,
}  # fmt: skip

#: Knobs that work only beside others: what each needs, and why.
_NEEDS: dict[str, tuple[dict[str, Any], str]] = {
    "CHAIN": ({"PERSISTENT": True, "OVERLAP": True, "ONE_LOOP": True, "PINGPONG": False},
              "CHAIN runs a persistent program's tiles as one OVERLAP loop of ONE_LOOP tiles"),
    "HALF_DIAG": ({"OVERLAP": True, "PINGPONG": False, "CHAIN": False, "CONSUMERS": 2, "BLOCK_N": 128},
                  "HALF_DIAG gives the first consumer of a 128-row tile the first half of the 128-key diagonal block "
                  "after its OVERLAP loop"),
    "SUM_MMA": ({"CHAIN": False}, "SUM_MMA adds a row-sum wgmma to the tile loops, which CHAIN's stream has not"),
    "STREAM_KV": ({"PERSISTENT": True, "OVERLAP": True, "ONE_LOOP": True, "HALF_DIAG": False, "CHAIN": False},
                  "STREAM_KV deals the persistent grid's last round out by key blocks, each part an OVERLAP loop of "
                  "ONE_LOOP tiles"),
    "LPT_HEADS": ({"PERSISTENT": True, "CHAIN": False, "STREAM_KV": False},
                  "LPT_HEADS gives each persistent program a list of tiles (CHAIN and STREAM_KV walk the items "
                  "their own way)"),
}  # fmt: skip
#: ``LPT_HEADS`` values: 0 (the items in turn: a causal item pairs a head's longest query tile with its shortest),
#: or the heads of a group whose tiles the schedule orders longest first (:func:`lpt_schedule`).
LPT_HEAD_CHOICES = (0, 16, 32, 64, 128)
#: :func:`lpt_schedule`'s estimate of a tile's cost beyond its key blocks (Q's wait, the pipeline's fill and
#: drain, the normalization and the store), in key blocks.
LPT_TILE_OVERHEAD = 0.5
#: ``Q_BUFFERS`` values: a consumer's Q tiles in shared memory (2: the next tile's Q loads while this one runs).
Q_BUFFER_COUNTS = (1, 2)


def check_config(head_dim: int, block_n: int, num_buffers: int, precision: str, consumers: int = 2,
                 ctas_per_sm: int = 1, epilogue: int = 0, sum_mma: bool = False,
                 q_buffers: int = 1) -> str | None:  # fmt: skip
    """Why the kernel cannot run this config (None when it can): head dims, key blocks, consumers, programs per
    SM, epilogue, shared memory (``EPILOGUE`` 1 adds the layout conversion's scratch, bounded by one 64 x D tile
    a consumer: sm_90 compiles took 16 KiB with two consumers at D = 64 and 128; ``EPILOGUE`` 2 a 512-byte exchange
    buffer a warp)."""
    if precision not in PRECISIONS:
        return f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
    if head_dim not in HEAD_DIMS:
        return f"the warp-specialized kernel supports head_dim in {HEAD_DIMS}, got {head_dim}"
    if block_n not in BLOCK_NS:
        return f"BLOCK_N must be one of {BLOCK_NS} for the warp-specialized kernel, got {block_n}"
    if num_buffers not in (2, 3, 4):
        return f"NUM_BUFFERS must be 2, 3 or 4, got {num_buffers}"
    if consumers not in CONSUMER_COUNTS:
        return f"CONSUMERS must be one of {CONSUMER_COUNTS}, got {consumers}"
    if ctas_per_sm not in CTAS_PER_SM:
        return f"CTAS_PER_SM must be one of {CTAS_PER_SM}, got {ctas_per_sm}"
    if epilogue not in EPILOGUES:
        return f"EPILOGUE must be one of {EPILOGUES}, got {epilogue!r}"
    if q_buffers not in Q_BUFFER_COUNTS or isinstance(q_buffers, bool):
        return f"Q_BUFFERS must be one of {Q_BUFFER_COUNTS}, got {q_buffers!r}"
    regs = consumer_regs_limit(consumers, ctas_per_sm)
    if (consumers == 3 or regs < 200) and head_dim != 64:
        return (
            f"CONSUMERS={consumers} with CTAS_PER_SM={ctas_per_sm} leaves {regs} registers a thread: a "
            f"64x{head_dim} fp32 accumulator beside the scores does not fit (head_dim 64 only)"
        )
    block_m = SUB_M * consumers
    shared = 2 * (q_buffers * block_m * head_dim + 2 * num_buffers * block_n * head_dim) + 1024
    shared += {0: 0, 1: 2 * block_m * head_dim, 2: EPILOGUE_SHUFFLE_SCRATCH * consumers}[epilogue]
    shared += (2 * 8 * block_n + 8) if sum_mma else 0  # SUM_MMA's 8 x BLOCK_N ones and their barrier
    if ctas_per_sm * (shared + 1024) > SM_SHARED_BYTES:  # one program: shared <= 227 KiB
        return (
            f"shared memory {shared} B ({q_buffers} x Q {block_m}x{head_dim}, {num_buffers} K/V stages of "
            f"{block_n}x{head_dim}"
            f"{', the epilogue scratch' if epilogue else ''}{', the ones of SUM_MMA' if sum_mma else ''}) "
            f"for {ctas_per_sm} program(s) per SM exceeds the 228 KiB of an H100/H200 multiprocessor (227 KiB a "
            "program, 1 KiB each reserved)"
        )
    return None


def knob_conflict(knobs: dict[str, Any]) -> str | None:
    """Why these knobs cannot go together (None when they can): ``PINGPONG`` without ``OVERLAP`` or a second
    consumer, both ways to free a slot, ``EXP_POLY`` out of range, and what ``CHAIN`` and ``HALF_DIAG`` need.
    Knobs left out take :data:`KNOBS`' defaults."""
    given = {**KNOBS, **knobs}
    if given["PINGPONG"] and not given["OVERLAP"]:
        return "PINGPONG orders the OVERLAP loop's wgmmas between the consumers: it needs OVERLAP=true"
    if given["PINGPONG"] and given["CONSUMERS"] < 2:
        return "PINGPONG passes the turn between consumers: it needs CONSUMERS >= 2"
    if given["THREAD_ARRIVE"] and given["WARP_ARRIVE"]:
        return "THREAD_ARRIVE and WARP_ARRIVE are two ways to free a K/V slot: set one of them"
    exp_poly = given["EXP_POLY"]
    if exp_poly not in EXP_POLY_CHOICES or isinstance(exp_poly, bool):
        return (f"EXP_POLY (how many of every {EXP_PACK} exponentials a polynomial takes) must be one of "
                f"{EXP_POLY_CHOICES}, got {exp_poly!r}")  # fmt: skip
    if given["SUM_MMA"] and given["CONSUMERS"] == 3:
        return ("SUM_MMA keeps a second copy of P for its row-sum wgmma, which three consumers' 160 registers do not "
                "hold (sm_90: spills, serialized wgmmas): it needs CONSUMERS=1 or 2")  # fmt: skip
    if given["Q_BUFFERS"] == 2 and (not given["PERSISTENT"] or given["CHAIN"]):
        return ("Q_BUFFERS=2 loads a persistent program's next tile's Q while it runs this one (CHAIN has its own "
                "stream): it needs PERSISTENT=true, CHAIN=false")  # fmt: skip
    if given["LPT_HEADS"] not in LPT_HEAD_CHOICES or isinstance(given["LPT_HEADS"], bool):
        return f"LPT_HEADS must be one of {LPT_HEAD_CHOICES}, got {given['LPT_HEADS']!r}"
    if given["STREAM_KV"] and (SUB_M * given["CONSUMERS"]) % given["BLOCK_N"]:
        return (f"STREAM_KV finds a key block's tile by the blocks a tile reads, which needs BLOCK_N to divide the "
                f"tile's {SUB_M * given['CONSUMERS']} rows: got BLOCK_N={given['BLOCK_N']} with "
                f"CONSUMERS={given['CONSUMERS']}")  # fmt: skip
    for knob, (needs, why) in _NEEDS.items():
        wrong = [f"{name}={_word(given[name])}" for name, value in needs.items() if given[name] != value]
        if given[knob] and wrong:
            return f"{why}: it needs {_words(needs)}, got {', '.join(wrong)}"
    return None


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _words(needs: dict[str, Any]) -> str:
    return ", ".join(f"{name}={_word(value)}" for name, value in needs.items())


def _maxnreg(consumers: int, ctas_per_sm: int = 1) -> int:
    """Registers per thread over the program's warpgroups (the consumers' and the loader's, padded to one), so that
    ``ctas_per_sm`` programs fit an SM: 65,536 / (programs * 128 * warpgroups), a multiple of 8, at most 256: 168
    with two consumers, 128 with three or with one consumer and two programs per SM."""
    return min(256, 65536 // (ctas_per_sm * 128 * (consumers + 1)) // 8 * 8)


def consumer_regs_limit(consumers: int, ctas_per_sm: int = 1) -> int:
    """The most registers a consumer thread can take (``setmaxnreg``, at most 256): the program's launch budget
    (:func:`_maxnreg` over its warpgroups) less the loader warpgroup's 24, shared by the consumers."""
    per_thread = ((consumers + 1) * _maxnreg(consumers, ctas_per_sm) - LOADER_REGS) // consumers
    return min(256, per_thread // 8 * 8)


def check_knobs(head_dim: int, precision: str, knobs: dict[str, Any]) -> str | None:
    """Everything :func:`kernels.attention.attention_ws.attention_ws` refuses: unknown knobs, :func:`check_config`,
    ``CONSUMER_REGS`` and :func:`knob_conflict`."""
    unknown = set(knobs) - set(KNOBS)
    if unknown:
        return f"unknown knobs of the warp-specialized attention kernel: {sorted(unknown)}"
    given = {**KNOBS, **knobs}
    consumers, ctas = given["CONSUMERS"], given["CTAS_PER_SM"]
    reason = check_config(head_dim, given["BLOCK_N"], given["NUM_BUFFERS"], precision, consumers, ctas,
                          given["EPILOGUE"], bool(given["SUM_MMA"]), given["Q_BUFFERS"])  # fmt: skip
    if reason:
        return reason
    regs, limit = given["CONSUMER_REGS"], consumer_regs_limit(consumers, ctas)
    if regs is not None and not (isinstance(regs, int) and 24 <= regs <= limit and regs % 8 == 0):
        return f"CONSUMER_REGS must be a multiple of 8 in [24, {limit}] with CONSUMERS={consumers}, got {regs!r}"
    return knob_conflict(knobs)


def query_tiles(seq_len: int, consumers: int) -> int:
    """Query tiles of one (batch, head): ``SUB_M`` rows a consumer warpgroup."""
    return -(-seq_len // (SUB_M * consumers))


def stream_slot_floats(consumers: int, head_dim: int) -> int:
    """``STREAM_KV``'s fp32 slot a program: each consumer's 64 x D accumulator and its rows' max and sum as two
    64 x 8 tiles."""
    return consumers * SUB_M * (head_dim + 16)


def work_items(bh: int, seq_len: int, consumers: int, causal: bool) -> int:
    """The persistent grid's work items: one query tile of one (batch, head), or, causal, a pair of tiles from
    both ends of the sequence (so that every item costs about the same)."""
    tiles = query_tiles(seq_len, consumers)
    return bh * ((tiles + 1) // 2 if causal else tiles)


def tile_blocks(m: int, seq_len: int, block_n: int, consumers: int, causal: bool) -> int:
    """Key blocks query tile ``m`` reads (the kernel's ``_tile_extent``): causal, those up to its last row."""
    rows = SUB_M * consumers
    end = min((m + 1) * rows, seq_len) if causal else seq_len
    return -(-end // block_n)


def lpt_schedule(bh: int, seq_len: int, consumers: int, block_n: int, causal: bool, programs: int,
                 group_heads: int) -> list[int]:  # fmt: skip
    """``LPT_HEADS``' table: each persistent program's query tiles, in the order it runs them. The tiles are taken
    ``group_heads`` heads at a time (so that a group's K/V stays in L2 while its tiles run), within a group longest
    first, and each goes to the program with the least work so far (key blocks plus :data:`LPT_TILE_OVERHEAD`;
    ties to the lowest program): longest-processing-time-first, so the last tiles of the grid are its shortest and
    the programs end within about one short tile of each other, where the causal pairs of a round-robin end a
    whole item apart when the items do not fill the last round.

    Returns ``programs + 1`` offsets into the list itself (program p's tiles at ``[table[p], table[p + 1])``),
    then the tiles, each ``head * tiles_per_head + m``."""
    import heapq

    num_m = query_tiles(seq_len, consumers)
    costs = [tile_blocks(m, seq_len, block_n, consumers, causal) + LPT_TILE_OVERHEAD for m in range(num_m)]
    by_cost = sorted(range(num_m), key=lambda m: (-costs[m], m))
    load = [(0.0, p) for p in range(programs)]
    tiles: list[list[int]] = [[] for _ in range(programs)]
    for g0 in range(0, bh, group_heads):
        for m in by_cost:
            for head in range(g0, min(bh, g0 + group_heads)):
                work, p = heapq.heappop(load)
                tiles[p].append(head * num_m + m)
                heapq.heappush(load, (work + costs[m], p))
    offsets = [programs + 1]
    for own in tiles:
        offsets.append(offsets[-1] + len(own))
    return offsets + [t for own in tiles for t in own]
