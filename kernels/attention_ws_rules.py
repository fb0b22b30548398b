"""The host-side rules of the warp-specialized attention kernel (:mod:`kernels.attention_ws`): its knobs and their
defaults, the configs it can run (shared memory, registers, the knobs that need each other), its register budgets
and its persistent grid's work items. No Gluon here: the workload's static check and the benchmarks use these
rules on any machine.
"""

from __future__ import annotations

from typing import Any

#: Query rows per consumer warpgroup (one wgmma M=64 atom); consumers per program (``CONSUMERS``: three hold
#: 64 x D accumulators in 160 registers a thread, so only at D = 64); the program's tile is ``SUB_M * CONSUMERS``.
SUB_M = 64
#: Q, K and V's dtypes (those of :data:`kernels.attention.PRECISIONS`, which a test keeps equal).
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

#: The kernel's knobs (keyword arguments of :func:`kernels.attention_ws.attention_ws`) and their defaults.
KNOBS: dict[str, Any] = {
    "BLOCK_N": 128, "NUM_BUFFERS": 2, "OVERLAP": False, "CONSUMER_REGS": None, "HEAD_MAJOR": True,
    "PERSISTENT": False, "PINGPONG": False, "CONSUMERS": 2, "ONE_LOOP": False, "CHAIN": False, "CTAS_PER_SM": 1,
    "EPILOGUE": 0, "RELEASE_K": False, "THREAD_ARRIVE": False, "WARP_ARRIVE": False, "HALF_DIAG": False,
    "EXP_POLY": 0, "SUM_MMA": False, "STREAM_KV": False, "Q_BUFFERS": 1,
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
}  # fmt: skip
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
    """Everything :func:`kernels.attention_ws.attention_ws` refuses: unknown knobs, :func:`check_config`,
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
