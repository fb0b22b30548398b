"""The warp-specialized int4/int8 GEMM's knobs and static rules (:mod:`kernels.quant.quant_gemm_ws`), without Triton:
a workload's static check imports them before any kernel module is loaded."""

from __future__ import annotations

from kernels.quant.quant_layout import SLICE, span

#: Tiles: BLOCK_N weight columns (the MMA's M: 64 rows a wgmma), BLOCK_M rows of X (the MMA's N).
BLOCK_NS = (64, 128, 256)
BLOCK_MS = (8, 16, 32, 64)
SMEM_BYTES = 227 * 1024
#: The knobs of :func:`ws_quant_matmul` and their defaults.
KNOBS: dict[str, int] = {"BLOCK_N": 128, "BLOCK_M": 16, "NUM_STAGES": 4, "PROGRAMS_PER_SM": 2, "LOADER_REGS": 40,
                         "SCALE_ACC": 0, "SWIZZLE": 0, "SLICE_WAIT": 0, "STAGGER": 0, "UNSWAPPED": 0,
                         "WIDE_X": 0, "PDL": 0, "ACT": 0, "DIAG": 0}  # fmt: skip
#: ``DIAG`` (benchmarks only; the product is wrong unless 0): 1, the consumer only waits for each stage and
#: releases it, so the kernel times the loader's stream of words alone; 2, a split tile's parts are added to the
#: workspace and nothing more (no arrival count, no last program's sum: the cost of that protocol). ``ACT`` 1: Y is
#: stored as GELU (tanh approximation) of the product, applied to the fp32 sum in the epilogue.


def loader_regs(programs_per_sm: int) -> int:
    """Registers the loader's warpgroup keeps (``LOADER_REGS``): 40, or 24 at three programs an SM and more, where
    the consumers need what the smaller register file share leaves."""
    return 24 if programs_per_sm >= 3 else 40


def accumulators_spill(BLOCK_M: int, BLOCK_N: int, PROGRAMS_PER_SM: int, SCALE_ACC: int = 0) -> bool:
    """Whether a 64-row tile's fp32 accumulators overflow the consumer's registers: three programs an SM, or 256
    columns other than at one program with the scales in the decode (387-1,304 spill instructions in their sm_90
    SASS, against 0-20 for the other 64-row tiles). Such tiles never won; sweeps and tuners leave them out."""
    return BLOCK_M == 64 and (PROGRAMS_PER_SM >= 3 or (BLOCK_N == 256 and (PROGRAMS_PER_SM > 1 or bool(SCALE_ACC))))


def shared_memory_bytes(bits: int, BLOCK_M: int, BLOCK_N: int, NUM_STAGES: int, UNSWAPPED: int = 0) -> int:
    """The ring's words, scales and X slices (16-bit X), ``UNSWAPPED``'s decoded span (16-bit), plus 1024 bytes
    for barriers and alignment."""
    per_stage = SLICE * BLOCK_N * 4 + BLOCK_N * 2 + span(bits) * BLOCK_M * 2
    return NUM_STAGES * per_stage + UNSWAPPED * span(bits) * BLOCK_N * 2 + 1024


def check_config(m: int, n: int, k: int, bits: int, group_size: int, BLOCK_M: int, BLOCK_N: int, NUM_STAGES: int,
                 PROGRAMS_PER_SM: int, LOADER_REGS: int, SCALE_ACC: int = 0, SWIZZLE: int = 0, SLICE_WAIT: int = 0,
                 STAGGER: int = 0, UNSWAPPED: int = 0, WIDE_X: int = 0, PDL: int = 0, ACT: int = 0,
                 DIAG: int = 0) -> str | None:  # fmt: skip
    """Why the kernel cannot run this product and config (None when it can), naming the field."""
    if bits not in (4, 8):
        return f"bits must be 4 or 8, got {bits!r}"
    if group_size % span(bits) or k % group_size:
        return f"group_size must be a multiple of the int{bits} span ({span(bits)}) dividing K={k}, got {group_size}"
    if BLOCK_N not in BLOCK_NS:
        return f"BLOCK_N must be one of {BLOCK_NS}, got {BLOCK_N}"
    if BLOCK_M not in BLOCK_MS:
        return f"BLOCK_M must be one of {BLOCK_MS}, got {BLOCK_M}"
    if NUM_STAGES < 2:
        return f"NUM_STAGES must be >= 2, got {NUM_STAGES}"
    if not 1 <= PROGRAMS_PER_SM <= 4:
        return f"PROGRAMS_PER_SM must be in [1, 4], got {PROGRAMS_PER_SM}"
    if LOADER_REGS % 8 or not 24 <= LOADER_REGS <= 256:
        return f"LOADER_REGS must be a multiple of 8 in [24, 256], got {LOADER_REGS}"
    if SCALE_ACC not in (0, 1):
        return f"SCALE_ACC must be 0 or 1, got {SCALE_ACC}"
    if SWIZZLE not in (0, 1):
        return f"SWIZZLE must be 0 or 1, got {SWIZZLE}"
    if SLICE_WAIT not in (0, 1):
        return f"SLICE_WAIT must be 0 or 1, got {SLICE_WAIT}"
    if STAGGER not in (0, 1):
        return f"STAGGER must be 0 or 1, got {STAGGER}"
    if UNSWAPPED not in (0, 1):
        return f"UNSWAPPED must be 0 or 1, got {UNSWAPPED}"
    if UNSWAPPED and (bits != 4 or BLOCK_M != 64 or DIAG):
        return f"UNSWAPPED takes int4 with BLOCK_M 64 (a wgmma's rows) and DIAG 0, got int{bits}, BLOCK_M={BLOCK_M}"
    if WIDE_X not in (0, 1):
        return f"WIDE_X must be 0 or 1, got {WIDE_X}"
    if PDL not in (0, 1):
        return f"PDL must be 0 or 1, got {PDL}"
    if PDL and STAGGER:
        return "PDL copies the ring's first lap of words before X, STAGGER the first stage alone first: pick one"
    if ACT not in (0, 1):
        return f"ACT (the epilogue's activation) must be 0 (none) or 1 (GELU, tanh), got {ACT}"
    if DIAG not in (0, 1, 2):
        return f"DIAG must be 0, 1 or 2, got {DIAG}"
    if n % 8:
        return f"TMA needs N a multiple of 8 (16-byte rows of scales), got N={n}"
    if m < 1:
        return f"M must be positive, got {m}"
    shared = shared_memory_bytes(bits, BLOCK_M, BLOCK_N, NUM_STAGES, UNSWAPPED) * PROGRAMS_PER_SM
    if shared > SMEM_BYTES:
        return f"shared memory {shared} B ({PROGRAMS_PER_SM} programs of {NUM_STAGES} stages) exceeds {SMEM_BYTES} B"
    return None
