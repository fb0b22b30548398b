"""Tile configs of the quantized Linears' GEMMs: the heuristics, the candidates and the measurement.

:class:`models.quant_linear.QuantLinear` runs each product with one tile config per row count. Without a
measurement it takes a heuristic: :func:`default_tile` (tensor cores) or :func:`gemv_tile` (one row) for the
``tiled`` kernel (:func:`kernels.quant.quant_gemm.quant_matmul`), :func:`packed_tile` (the H200's measured winners
generalised by shape) for the ``packed`` one (:func:`kernels.quant.quant_gemm_packed.packed_matmul`). Measured, on the
GPU at hand: :func:`tune_tile` and :func:`tune_packed_tile` time every candidate (:func:`_candidate_tiles`,
:func:`packed_candidates`, :func:`ws_candidates` for the warp-specialized Gluon kernel, :func:`partial_candidates`
for split-K tiles whose sums the next operation takes) in a CUDA graph over weight copies rotating through
:data:`ROTATE_BYTES`, as a decode step streams its weights from HBM; one tuning per shape and process.
:func:`packed_product` runs one product with a packed-layout tile, whichever kernel the tile names.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

#: Programs per product the tile heuristic aims for (an H200 has 132 SMs).
TARGET_PROGRAMS = 132
#: Rows of X up to which the GEMV kernel (one row per program, no tl.dot) runs the product.
GEMV_MAX_M = 1
#: Weight bytes one GEMV program streams before the product is split along K.
GEMV_BYTES_PER_PROGRAM = 64 * 1024
#: Shared memory per block assumed when the device does not say (bytes).
DEFAULT_SMEM_BYTES = 99 * 1024


def _pow2_at_most(value: int, cap: int) -> int:
    """The largest power of two that divides ``value`` and is at most ``cap`` (>= 1)."""
    out = 1
    while out * 2 <= cap and value % (out * 2) == 0:
        out *= 2
    return out


def default_tile(m: int, n: int, k: int, bits: int, group_size: int, smem_bytes: int | None = None) -> dict[str, int]:
    """The ``quant_matmul`` tile config used for an (M, K) x (K, N) product (decode and prefill shapes).

    A heuristic, not a tuned result (the ``quant_gemm`` workload tunes the kernel alone): BLOCK_M the
    smallest power of two >= M in [16, 64] (decode M is the batch); BLOCK_N 64 (128 for M > 64),
    halved down to 32 while the grid has fewer than :data:`TARGET_PROGRAMS` programs; BLOCK_K the
    largest power of two <= 128 dividing K (at least the kernel's minimum for the bit width); no
    split-K: at decode sizes (2-8 MB of int4 weights per Linear of a 1B model, microseconds) the
    wrapper's two extra kernels (workspace zeroing and the final copy) cost more than the extra
    programs gain; 4 warps; 4 pipeline stages, fewer when the estimate of
    :func:`kernels.quant.quant_rules.shared_memory_bytes` exceeds ``smem_bytes``.
    """
    from kernels.quant.quant_gemm import MIN_BLOCK_K
    from kernels.quant.quant_rules import shared_memory_bytes

    if m <= GEMV_MAX_M:
        return gemv_tile(n, k, bits)

    block_m = 16
    while block_m < min(m, 64):
        block_m *= 2
    block_n = 128 if m > 64 else 64
    m_tiles = -(-m // block_m)
    while block_n > 32 and m_tiles * -(-n // block_n) < TARGET_PROGRAMS:
        block_n //= 2
    tile = {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_K": max(MIN_BLOCK_K[bits], _pow2_at_most(k, 128)),
        "SPLIT_K": 1,
        "num_warps": 4,
        "num_stages": 4,
    }
    budget = smem_bytes or DEFAULT_SMEM_BYTES
    while tile["num_stages"] > 1 and shared_memory_bytes({**tile, "bits": bits, "group_size": group_size}) > budget:
        tile["num_stages"] -= 1
    return tile


def gemv_tile(n: int, k: int, bits: int) -> dict[str, int]:
    """The GEMV kernel's tile (``BLOCK_M = 1``) for a single-row product, a heuristic: 32 columns per
    program (the Linears of a 1B model have N = 2048..8192, so at least 64 programs), 256 K rows per
    iteration (the largest power of two <= 256 dividing K), and split-K only while a program would
    stream more than :data:`GEMV_BYTES_PER_PROGRAM` of weights (a split adds two small kernels)."""
    block_n = 32
    block_k = _pow2_at_most(k, 256)
    split = 1
    while k * bits // 8 * block_n // split > GEMV_BYTES_PER_PROGRAM and k % (2 * split * block_k) == 0 and split < 8:
        split *= 2
    return {"BLOCK_M": 1, "BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split, "num_warps": 4, "num_stages": 4}


def _candidate_tiles(m: int, n: int, k: int, bits: int) -> list[dict[str, int]]:
    """The tiles :func:`tune_tile` times: GEMV tiles (CUDA cores) up to 8 rows, and ``tl.dot`` tiles of
    16 rows and of M rounded up to a power of two (at most 64), with and without split-K, plain and
    swapped (``SWAP_AB``)."""
    from kernels.quant.quant_gemm import MIN_BLOCK_K

    tiles: list[dict[str, int]] = []
    if m <= 8:
        gemv = itertools.product((16, 32, 64, 128), (128, 256), (1, 2, 4, 8))
        tiles += [
            {"BLOCK_M": 1, "BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split, "num_warps": 4, "num_stages": 3}
            for block_n, block_k, split in gemv
        ]
    block_ms = sorted({16, min(64, max(16, 1 << (m - 1).bit_length()))})
    for block_m, block_n, block_k, split in itertools.product(block_ms, (32, 64, 128), (64, 128), (1, 2, 4, 8)):
        tile = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": max(block_k, MIN_BLOCK_K[bits]), "SPLIT_K": split}
        tiles += [{**tile, "num_warps": warps, "num_stages": 3} for warps in (2, 4)]
        if block_n >= 64:  # the swapped product: decoded weights as the MMA's register operand
            tiles.append({**tile, "num_warps": 4, "num_stages": 3, "SWAP_AB": 1})
    return [t for t in tiles if k % (t["SPLIT_K"] * t["BLOCK_K"]) == 0 and t["BLOCK_N"] <= max(16, n)]


#: Measured tiles, per (GPU name, M, N, K, bits, group size, activation dtype): one tuning per process.
_TUNED: dict[tuple[Any, ...], dict[str, int]] = {}


def packed_product(
    x: torch.Tensor,
    weights: Any,
    tile: dict[str, int],
    out: torch.Tensor | None = None,
    sum_partials: bool = True,
) -> torch.Tensor:
    """``x @ dequant(weights)`` with a packed-layout tile: ``WS: 1`` names the warp-specialized Gluon kernel
    (:mod:`kernels.quant.quant_gemm_ws`, the other keys its knobs), any other tile :func:`packed_matmul`'s. A
    ``PARTIALS``
    tile's partial products (``out`` unused; fp32, or X's dtype with ``PARTIALS: 2``) are summed here in fp32 with
    ``sum_partials``, else returned as they are, ``(SPLIT_K, M, N)``. A ``TMA: 2`` tile reads X by tensor copies: an
    X without unit stride along K or 16-byte rows is copied to a contiguous one first."""
    if tile.get("TMA") == 2 and (x.stride(-1) != 1 or (x.stride(0) * x.element_size()) % 16):
        x = x.contiguous()
    if tile.get("PARTIALS"):
        from kernels.quant.quant_gemm_packed import packed_matmul

        partials = packed_matmul(x, weights, **tile)
        return partials.sum(0, dtype=torch.float32).to(x.dtype) if sum_partials else partials
    if tile.get("WS") and weights.scales.dtype == x.dtype:
        from kernels.quant.quant_gemm_ws import ws_quant_matmul

        return ws_quant_matmul(x, weights, out=out, **{k: v for k, v in tile.items() if k != "WS"})
    if tile.get("WS"):  # the Gluon kernel takes scales in x's dtype only: the packed kernel's default tile
        m, n, k = x.shape[0], weights.qweight.shape[1], x.shape[1]
        tile = {**packed_tile(m, n, k, weights.bits), **({"ACT": tile["ACT"]} if "ACT" in tile else {})}
    from kernels.quant.quant_gemm_packed import packed_matmul

    return packed_matmul(x, weights, out=out, **tile)


def ws_candidates(
    m: int, n: int, k: int, bits: int, group_size: int, pdl: bool = False, wide: bool = False
) -> list[dict[str, int]]:
    """Tiles of the warp-specialized Gluon kernel for (M, K) x (K, N) (``WS: 1``), where this Triton has it and
    the product fits its rules (N a multiple of 8, groups of whole spans, shared memory). Each waits for its
    wgmmas a slice pair at a time and, for int4, reads swizzled words (the fastest at every shape measured on an
    H200); rings of 2-3 stages up to 16 rows (deeper ones measured slower there), 3-4 above; none whose
    accumulators spill (:func:`kernels.quant.quant_ws_rules.accumulators_spill`). ``wide`` (not yet measured on a GPU,
    so not the decode tuner's default): from 32 rows also with X in 64-column boxes (``WIDE_X``), and at 64 rows of
    int4 the ``UNSWAPPED`` tiles, which read X once per 128-256 columns (at 64 rows X's re-reads by every
    64-column slab are four times the int4 words' bytes). ``pdl``: each launched as a programmatic dependent of
    the kernel before it (``PDL: 1``)."""
    from kernels.quant import quant_gemm_ws
    from kernels.quant.quant_ws_rules import accumulators_spill, loader_regs

    if not quant_gemm_ws.available():
        return []
    block_m = next((b for b in quant_gemm_ws.BLOCK_MS if m <= b), quant_gemm_ws.BLOCK_MS[-1])
    depths = (2, 3) if block_m <= 16 else (3, 4)
    extra = {"PDL": 1} if pdl else {}
    tiles = []
    for bn, stages, programs, scale_acc, wide_x in itertools.product(
        (128, 256), depths, (1, 2, 3), (0, 1), (0, 1) if wide and block_m >= 32 else (0,)
    ):
        if accumulators_spill(block_m, bn, programs, scale_acc):
            continue
        tile = {"BLOCK_N": bn, "BLOCK_M": block_m, "NUM_STAGES": stages, "PROGRAMS_PER_SM": programs,
                "LOADER_REGS": loader_regs(programs), "SCALE_ACC": scale_acc,
                "SWIZZLE": int(bits == 4), "SLICE_WAIT": 1, **({"WIDE_X": 1} if wide_x else {}), **extra}  # fmt: skip
        tiles.append(tile)
    if wide and block_m == 64 and bits == 4:  # X as wgmma's A operand: read once a tile, not once a 64-column slab
        tiles += [
            {"BLOCK_N": bn, "BLOCK_M": 64, "NUM_STAGES": stages, "PROGRAMS_PER_SM": programs,
             "LOADER_REGS": loader_regs(programs), "SWIZZLE": 1, "UNSWAPPED": 1, **extra}
            for bn, stages, programs in itertools.product((128, 256), (2, 3), (1, 2))
        ]  # fmt: skip
    return [{"WS": 1, **t} for t in tiles if quant_gemm_ws.check_config(m, n, k, bits, group_size, **t) is None]


#: Weight bytes the timed products rotate over, so that the weights come from HBM as in a decode step
#: (whose whole model is far larger than the L2 cache), not from L2.
ROTATE_BYTES = 256 * 1024 * 1024


def _compiling(tiles: list[dict[str, int]], compile_tile: Callable[[dict[str, int]], Any]) -> list[dict[str, int]]:
    """The ``tiles`` that ``compile_tile`` compiles without an error, compiled ahead on a thread pool (a tile that
    does not compile here, or exceeds shared memory, is simply not a candidate)."""
    import concurrent.futures

    def compiles(tile: dict[str, int]) -> bool:
        try:
            compile_tile(tile)
        except Exception:
            return False
        return True

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        return [t for t, ok in zip(tiles, pool.map(compiles, tiles), strict=True) if ok]


def _ms_per_product(products: Callable[[], None], copies: int, info: Any) -> float:
    """``products`` (``copies`` products over rotating weight copies) timed inside a CUDA graph (no launch
    overhead, as in a graph-captured decode step): the median in ms per product."""
    from tuner.workloads.measure import time_fn

    timing = time_fn(products, info, warmup_ms=2.0, rep_ms=10.0, min_reps=5, max_reps=50, flush_l2=False,
                     cuda_graph=True, graph_calls=1)  # fmt: skip
    return timing.median_ms / copies


def tune_tile(
    m: int,
    n: int,
    k: int,
    bits: int,
    group_size: int,
    dtype: torch.dtype,
    device: torch.device,
    candidates: list[dict[str, int]] | None = None,
) -> dict[str, int]:
    """The fastest ``quant_matmul`` tile for an (M, K) x (K, N) product on this GPU, measured.

    Every candidate (default :func:`_candidate_tiles`; those that fail to compile or exceed shared
    memory are dropped) is compiled on a thread pool, then timed inside a CUDA graph (no launch
    overhead, as in a graph-captured decode step) over copies of random weights rotating through
    :data:`ROTATE_BYTES`, so that each product streams its weights from HBM. Split-K tiles are timed
    with their workspace zeroing and final copy. The default set's result is cached per GPU and shape
    for the process.
    """
    from kernels.quant.quant_gemm import compile_only, quant_matmul
    from tuner.workloads.fingerprint import device_info

    key = (torch.cuda.get_device_name(device), m, n, k, bits, group_size, dtype)
    if candidates is None and key in _TUNED:
        return dict(_TUNED[key])
    precision = "bf16" if dtype == torch.bfloat16 else "fp16"
    tiles = _compiling(
        candidates if candidates is not None else _candidate_tiles(m, n, k, bits),
        lambda tile: compile_only(m, n, k, precision=precision, bits=bits, group_size=group_size, **tile),
    )
    if not tiles:
        raise RuntimeError(f"no quant_matmul tile compiles for M={m} N={n} K={k} int{bits}")
    packed_rows = k * bits // 8
    weight_bytes = packed_rows * n + (k // group_size) * n * 2
    copies = max(1, min(64, ROTATE_BYTES // weight_bytes))
    qweights = [torch.randint(-128, 128, (packed_rows, n), dtype=torch.int8, device=device) for _ in range(copies)]
    scales = [torch.rand((k // group_size, n), device=device).to(dtype) / 64 for _ in range(copies)]
    x = torch.randn((m, k), device=device).to(dtype)
    out = torch.empty((m, n), device=device, dtype=dtype)
    workspace = torch.empty((m, n), device=device, dtype=torch.float32)
    info = device_info()
    best, best_ms = tiles[0], float("inf")
    for tile in tiles:

        def products(tile: dict[str, int] = tile) -> None:
            for qw, sc in zip(qweights, scales, strict=True):
                quant_matmul(x, qw, sc, bits=bits, group_size=group_size, out=out, workspace=workspace, **tile)

        per_product = _ms_per_product(products, copies, info)
        if per_product < best_ms:
            best, best_ms = tile, per_product
    if candidates is None:
        _TUNED[key] = dict(best)
    return dict(best)


def partial_candidates(m: int, n: int, k: int, bits: int, store: int = 1) -> list[dict[str, int]]:
    """``PARTIALS`` tiles: the split-K tiles of :func:`packed_candidates` (STREAM's aside) with their partial products
    left unsummed, and at one row the GEMV split finer (16 and 32 ways), which costs little without a reduction.
    ``store``: the tiles' ``PARTIALS``, 1 (fp32 partials) or 2 (in X's dtype)."""
    tiles = [
        {**t, "PARTIALS": store} for t in packed_candidates(m, n, k, bits) if t["SPLIT_K"] > 1 and not t.get("STREAM")
    ]
    if m == 1:
        span = 16 * (32 // bits)
        gemv = {"BLOCK_M": 1, "num_warps": 4, "num_stages": 1, "PARTIALS": store}
        tiles += [
            {**gemv, "BLOCK_N": bn, "SPLIT_K": sk, "PREFETCH": pf}
            for bn, sk, pf in itertools.product((32, 64, 128), (16, 32), (0, 1))
            if k % (sk * span) == 0 and bn <= max(16, n)
        ]
    return tiles


def packed_candidates(m: int, n: int, k: int, bits: int) -> list[dict[str, int]]:
    """``packed_matmul`` tiles :func:`tune_packed_tile` measures: around the H200's winners for the row count."""
    if m == 1:
        grid = itertools.product((1,), (64, 128), (2, 4, 8, 16), ((0, 1), (1, 1)))
    elif m <= 16:
        grid = itertools.product((16,), (128, 256), (2, 4, 8), ((0, 3), (0, 4)))
    else:
        grid = itertools.product((32, 64), (128,), (1, 2, 4, 8), ((0, 3), (0, 4)))
    span = 16 * (32 // bits)
    tiles = [
        {"BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": 4, "num_stages": st, "PREFETCH": pf}
        for bm, bn, sk, (pf, st) in grid
    ]
    # Hopper: the words by TMA and Y's tile transposed (the decoded weights as wgmma's register operand), the
    # fastest tiles at 16 and 64 rows on an H200 (bench/results/int4-roofline-swap-h200.json); a GPU without
    # TMA fails to compile them and :func:`tune_packed_tile` drops them.
    if m <= 16:
        swapped = itertools.product((16,), (128, 256), (2, 4, 8), (3, 4), (1, 2))
    else:
        swapped = itertools.product((32, 64), (64, 128), (1, 2, 4), (3, 4), (2, 3))
    # Whole-span tiles (SWAP >= 2) also with X's slices by tensor copies (TMA 2): no pass through registers, the
    # fastest tiles at 8-64 rows on an H200 (bench/results/int4-roofline-xtma-h200.json); at 32-64 rows also two
    # warpgroups on a 128-256 column tile, which share each X slice (the winners at K = 8192-14336 there).
    swapped = [(bm, bn, sk, st, swap, 4, tma) for (bm, bn, sk, st, swap), tma in itertools.product(swapped, (1, 2))]
    if m > 16:
        swapped += [
            (bm, bn, sk, 3, swap, 8, 2)
            for bm, bn, sk, swap in itertools.product((32, 64), (128, 256), (1, 2, 4), (2, 3))
        ]
    tiles += [
        {"BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": w, "num_stages": st, "PREFETCH": 0, "TMA": tma,
         "SWAP": swap}
        for bm, bn, sk, st, swap, w, tma in swapped
        if n % 4 == 0 and (tma == 1 or swap >= 2)
    ]  # fmt: skip
    # STREAM: two programs per SM sharing every tile's spans, one pipelined loop (the fastest tile at M = 1,
    # 4096 <- 14336 on an H200: bench/results/int4-roofline-stream-h200.json)
    if m <= 16 and n % 4 == 0:
        tiles += [
            {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": st, "PREFETCH": 0, "TMA": tma,
             "SWAP": swap, "STREAM": 2}
            for st, (swap, tma) in itertools.product((3, 4), ((1, 1), (2, 1), (2, 2)))
        ]  # fmt: skip
    # Above 16 rows, with X by tensor copies: a small product's few spans a tile (K = 2048: 16) run as one stream
    # per program across tiles instead of a short split-K loop that fills and drains its pipeline each time.
    if m > 16 and n % 4 == 0:
        tiles += [
            {"BLOCK_M": 64 if m > 32 else 32, "BLOCK_N": bn, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3,
             "PREFETCH": 0, "TMA": 2, "SWAP": swap, "STREAM": programs}
            for bn, swap, programs in itertools.product((64, 128), (2, 3), (2, 3))
        ]  # fmt: skip
    return [t for t in tiles if k % (t["SPLIT_K"] * span) == 0 and t["BLOCK_N"] <= max(16, n)]


#: Fewest rows at which :func:`tune_packed_tile` offers ``PARTIALS`` tiles. The operation after a product sums
#: its partials inside a kernel that takes a row per program (Inductor's norm and GELU kernels), so at a few rows
#: that kernel reads every split's fp32 partials on a few SMs. Timed alone the partials tiles won at every row count,
#: but in the compiled 1B step they lost: 0.58x and 0.95x of in-kernel sums at batches 1 and 8 on an H100 (151 ->
#: 224 kernels a step at batch 1, Inductor's time 144 -> 498 us), 0.84-0.91x at batch 8 on an H200; at 64 rows
#: they won on both, by 2-5% (bench/results/int4-roofline-decode-b1-b8-fused-h100.json, -profile-b1-fused-h100.json,
#: -xtma-b8-h200.json, -stream-b8-h200.json, -xtma-b64-h200.json, -split-sums-b64-h200.json). 16 and 32 rows are
#: not measured.
PARTIALS_MIN_ROWS = 32


def tuned_candidates(
    m: int, n: int, k: int, bits: int, group_size: int, partials: int = 0, pdl: bool = False
) -> list[dict[str, int]]:
    """The tiles :func:`tune_packed_tile` times: :func:`packed_candidates` and :func:`ws_candidates`, and with
    ``partials`` (1 or True: fp32 partials, 2: in X's dtype) from :data:`PARTIALS_MIN_ROWS` rows
    :func:`partial_candidates`."""
    if partials not in (0, 1, 2):
        raise ValueError(f"partials must be 0 (none), 1 (fp32 partials) or 2 (in X's dtype), got {partials!r}")
    candidates = packed_candidates(m, n, k, bits) + ws_candidates(m, n, k, bits, group_size, pdl)
    if partials and m >= PARTIALS_MIN_ROWS:
        candidates += partial_candidates(m, n, k, bits, int(partials))
    return candidates


def tune_packed_tile(
    m: int,
    n: int,
    k: int,
    bits: int,
    group_size: int,
    dtype: torch.dtype,
    device: torch.device,
    partials: int = 0,
    pdl: bool = False,
) -> dict[str, int]:
    """The fastest :func:`packed_candidates` (and :func:`ws_candidates`) tile for an (M, K) x (K, N) product on this
    GPU, measured by :func:`time_packed_tiles`; cached per GPU and shape for the process. ``partials``: the caller
    sums split-K's partial products in its next operation (a compiled model), so from :data:`PARTIALS_MIN_ROWS` rows
    the split-K tiles are also timed with ``PARTIALS`` (:func:`partial_candidates`; ``partials`` 2: stored in X's
    dtype), the kernel alone. ``pdl``: the warp-specialized tiles launched as programmatic dependents (timed so,
    back to back: each copies its first words while the one before ends)."""
    candidates = tuned_candidates(m, n, k, bits, group_size, partials, pdl)
    # keyed by the candidates, not the flags: below PARTIALS_MIN_ROWS ``partials`` offers the same tiles, so a
    # step with the sums fused and one without share one tuning (and one tile) per shape
    offered = tuple(tuple(sorted(tile.items())) for tile in candidates)
    key = ("packed", torch.cuda.get_device_name(device), m, n, k, bits, group_size, dtype, offered)
    if key in _TUNED:
        return dict(_TUNED[key])
    timed = time_packed_tiles(m, n, k, bits, group_size, dtype, device, candidates)
    best = min(timed, key=lambda pair: pair[1])[0] if timed else packed_tile(m, n, k, bits)
    _TUNED[key] = dict(best)
    return dict(best)


def time_packed_tiles(
    m: int,
    n: int,
    k: int,
    bits: int,
    group_size: int,
    dtype: torch.dtype,
    device: torch.device,
    candidates: list[dict[str, int]],
) -> list[tuple[dict[str, int], float]]:
    """``(tile, ms per product)`` for every candidate that compiles here (``WS: 1`` tiles on the Gluon kernel) and
    computes the right product (:func:`right_tiles`), as :func:`tune_tile` measures: compiled ahead on a thread
    pool, timed in a CUDA graph over copies of random weights rotating through :data:`ROTATE_BYTES` (each product
    streams its weights from HBM)."""
    from kernels.quant import quant_gemm_ws
    from kernels.quant.quant_gemm_packed import PackedWeights, compile_only, pack_factor
    from tuner.workloads.fingerprint import device_info

    precision = "bf16" if dtype == torch.bfloat16 else "fp16"

    def compile_tile(tile: dict[str, int]) -> None:
        if tile.get("WS"):
            knobs = {name: value for name, value in tile.items() if name != "WS"}
            quant_gemm_ws.compile_only(m, n, k, bits=bits, group_size=group_size, precision=dtype, **knobs)
        else:
            compile_only(m, n, k, precision=precision, bits=bits, group_size=group_size, **tile)

    tiles = _compiling(candidates, compile_tile)
    if not tiles:
        return []
    rows = k // pack_factor(bits)
    copies = max(1, min(64, ROTATE_BYTES // (rows * n * 4 + (k // group_size) * n * 2)))
    weights = [
        PackedWeights(
            torch.randint(-(2**31), 2**31 - 1, (rows, n), dtype=torch.int32, device=device),
            (torch.rand((k // group_size, n), device=device) / 64).to(dtype),
            bits,
            group_size,
        )
        for _ in range(copies)
    ]
    x = torch.randn((m, k), device=device).to(dtype)
    out = torch.empty((m, n), device=device, dtype=dtype)
    info = device_info()
    timed = []
    for tile in right_tiles(x, weights[0], tiles):

        def products(tile: dict[str, int] = tile) -> None:
            for w in weights:  # PARTIALS tiles: the kernel alone (its sum goes into the next operation)
                packed_product(x, w, tile, out=out, sum_partials=False)

        products()  # split-K scratch allocated before the graph capture
        timed.append((tile, _ms_per_product(products, copies, info)))
    return timed


#: Largest error of a candidate's product over the largest value of the fp32 reference (bf16 output rounds
#: to 2^-8 relative; a wrong kernel is off by the values themselves).
MAX_RELATIVE_ERROR = 2e-2


def right_tiles(
    x: torch.Tensor,
    weights: Any,
    tiles: list[dict[str, int]],
    product: Callable[..., torch.Tensor] | None = None,
) -> list[dict[str, int]]:
    """The ``tiles`` whose product of ``x`` and the packed ``weights`` matches the fp32 reference here (largest
    error within :data:`MAX_RELATIVE_ERROR` of the largest value), in order: a tile that computes a wrong product
    on this GPU (a kernel variant new to it, a compiler's miscompile) is never timed, so it never wins a tuning.
    ``product`` is :func:`packed_product` (its partial products summed)."""
    product = product or packed_product
    reference = x.float() @ weights.dequantize()
    scale = reference.abs().max().clamp_min(1e-30)
    right = []
    for tile in tiles:
        try:
            got = product(x, weights, tile, sum_partials=True)
        except Exception:  # a launch this GPU refuses: not a candidate either
            continue
        error = float(((got.float() - reference).abs().max() / scale).nan_to_num(float("inf")))
        if error <= MAX_RELATIVE_ERROR:
            right.append(tile)
    return right


def _device_smem_bytes(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or DEFAULT_SMEM_BYTES)


def packed_tile(m: int, n: int, k: int, bits: int) -> dict[str, int]:
    """The ``packed_matmul`` tile for an (M, K) x (K, N) product: the fastest tiles measured on an H200
    (``bench/results/int4-roofline-pipelined-h200.json``) generalised by shape. M = 1: the GEMV with 64
    columns per program and K split until about 4 programs per SM; more rows: tensor-core tiles (BLOCK_M
    16 and 256 columns up to 16 rows, 32 x 128 above) with the K loop pipelined 3 deep, split-K for the
    same occupancy."""
    span = 16 * (32 // bits)
    block_m = 1 if m == 1 else 16 if m <= 16 else 32
    block_n = 64 if m == 1 else 256 if m <= 16 else 128
    programs = -(-m // block_m) * -(-n // block_n)
    split_k = 1
    while split_k < 16 and programs * split_k < 4 * TARGET_PROGRAMS and k % (2 * split_k * span) == 0:
        split_k *= 2
    tile = {"BLOCK_M": block_m, "BLOCK_N": block_n, "SPLIT_K": split_k, "num_warps": 4}
    return {**tile, "num_stages": 1 if m == 1 else 3, "PREFETCH": 0}
