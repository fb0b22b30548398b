"""Weight-only quantized ``nn.Linear`` for decoding: int8 / int4 weights, 16-bit activations.

:class:`QuantLinear` holds the weight of an ``nn.Linear`` (``out_features x in_features``)
transposed to ``(K, N) = (in_features, out_features)`` and quantized by
:func:`kernels.quant_gemm.quantize_weights` (symmetric, one bf16/fp16 scale per group of
``group_size`` consecutive input features and per output feature, each scale the clipping of the
group's maximum with the least squared error). Its forward is ``y = x @ dequant(W) + bias`` with
fp32 accumulation, returned in x's dtype:

- on a GPU (CUDA tensors, bf16/fp16 activations, Triton compiling for real) through
  :func:`kernels.quant_gemm.quant_matmul`, with one tile config per product shape: the one
  :func:`autotune_tiles` measured on this GPU, else the heuristic :func:`default_tile`; or, for a
  layer built with ``kernel="packed"`` (:func:`pack_linears`), through
  :func:`kernels.quant_gemm_packed.packed_matmul` (int32 words, one launch per product), with the tile
  set by :meth:`QuantLinear.set_tile` for a row count (what a tuned study found), else
  :func:`packed_tile`, the H200's measured winners;
- otherwise (CPU tensors, or the Triton interpreter) by dequantizing to fp32 and multiplying with
  torch: the same numbers as the kernel's scale-after-dot path (exact integer weights times an fp32
  scale, fp32 accumulation, one rounding to x's dtype), up to summation order.

:func:`quantize_linears` returns a copy of a model whose chosen ``nn.Linear`` modules are replaced by
``QuantLinear`` while every other parameter and buffer is shared with the original (no copy), so a
bf16 reference model and its int8 / int4 variants live side by side for the price of the quantized
weights alone.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tuner.workload import interpreter_active

#: Weight bit widths :class:`QuantLinear` supports (16 = not quantized: keep the ``nn.Linear``).
BITS: tuple[int, ...] = (4, 8)
#: The kernels a :class:`QuantLinear` runs on a GPU (and the weight layout it stores for them).
KERNELS: tuple[str, ...] = ("tiled", "packed")
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
    :func:`objectives.quant_gemm.shared_memory_bytes` exceeds ``smem_bytes``.
    """
    from kernels.quant_gemm import MIN_BLOCK_K
    from objectives.quant_gemm import shared_memory_bytes

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
    from kernels.quant_gemm import MIN_BLOCK_K

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


#: The packed layers' operators take the layer's buffers and its tile as two lists, the knobs' names and values.
_PACKED_SCHEMA = (
    "(Tensor x, Tensor qweight, Tensor scales, int bits, int group_size, str[] names, int[] values) -> Tensor"
)


def _packed_call(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int,
                 names: list[str], values: list[int], sum_partials: bool) -> torch.Tensor:  # fmt: skip
    """:func:`packed_product` of an operator's arguments."""
    from kernels.quant_gemm_packed import PackedWeights

    weights = PackedWeights(qweight, scales, bits, group_size)
    return packed_product(x, weights, dict(zip(names, values, strict=True)), sum_partials=sum_partials)


@torch.library.custom_op("tuner::packed_linear", mutates_args=(), schema=_PACKED_SCHEMA)
def packed_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int,
                  names: list[str], values: list[int]) -> torch.Tensor:  # fmt: skip
    """:func:`kernels.quant_gemm_packed.packed_matmul` (tile ``dict(zip(names, values))``) as an opaque operator:
    torch.compile calls it as it is. Traced as a Triton kernel instead, its non-pure inline PTX (split-K's barrier)
    defeats Inductor's mutation analysis, which then takes every tensor argument, the weights too, as written."""
    return _packed_call(x, qweight, scales, bits, group_size, names, values, sum_partials=True)


@torch.library.custom_op("tuner::packed_linear_partials", mutates_args=(), schema=_PACKED_SCHEMA)
def packed_linear_partials(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int,
                           names: list[str], values: list[int]) -> torch.Tensor:  # fmt: skip
    """The fp32 partial products ``(SPLIT_K, M, N)`` of a ``PARTIALS`` tile, as an opaque operator: the caller's
    ``.sum(0)`` is left to ``torch.compile``, which fuses it into the operation that reads the product."""
    return _packed_call(x, qweight, scales, bits, group_size, names, values, sum_partials=False)


@packed_linear_partials.register_fake
def _packed_linear_partials_shape(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int,
                                  group_size: int, names: list[str], values: list[int]) -> torch.Tensor:  # fmt: skip
    split = dict(zip(names, values, strict=True))["SPLIT_K"]
    return x.new_empty((split, x.shape[0], qweight.shape[1]), dtype=torch.float32)


def packed_product(
    x: torch.Tensor,
    weights: Any,
    tile: dict[str, int],
    out: torch.Tensor | None = None,
    sum_partials: bool = True,
) -> torch.Tensor:
    """``x @ dequant(weights)`` with a packed-layout tile: ``WS: 1`` names the warp-specialized Gluon kernel
    (:mod:`kernels.quant_gemm_ws`, the other keys its knobs), any other tile :func:`packed_matmul`'s. A
    ``PARTIALS`` tile's fp32 partial products (``out`` unused) are summed here with ``sum_partials``, else
    returned as they are, ``(SPLIT_K, M, N)``."""
    if tile.get("PARTIALS"):
        from kernels.quant_gemm_packed import packed_matmul

        partials = packed_matmul(x, weights, **tile)
        return partials.sum(0).to(x.dtype) if sum_partials else partials
    if tile.get("WS") and weights.scales.dtype == x.dtype:
        from kernels.quant_gemm_ws import ws_quant_matmul

        return ws_quant_matmul(x, weights, out=out, **{k: v for k, v in tile.items() if k != "WS"})
    if tile.get("WS"):  # the Gluon kernel takes scales in x's dtype only: the packed kernel's default tile
        m, n, k = x.shape[0], weights.qweight.shape[1], x.shape[1]
        tile = packed_tile(m, n, k, weights.bits)
    from kernels.quant_gemm_packed import packed_matmul

    return packed_matmul(x, weights, out=out, **tile)


def ws_candidates(m: int, n: int, k: int, bits: int, group_size: int) -> list[dict[str, int]]:
    """Tiles of the warp-specialized Gluon kernel for (M, K) x (K, N) (``WS: 1``), where this Triton has it and
    the product fits its rules (N a multiple of 8, groups of whole spans, shared memory)."""
    from kernels import quant_gemm_ws

    if not quant_gemm_ws.available():
        return []
    block_m = next((b for b in quant_gemm_ws.BLOCK_MS if m <= b), quant_gemm_ws.BLOCK_MS[-1])
    tiles = []
    for bn, stages, programs, scale_acc in itertools.product((128, 256), (3, 4), (1, 2, 3), (0, 1)):
        tile = {"BLOCK_N": bn, "BLOCK_M": block_m, "NUM_STAGES": stages, "PROGRAMS_PER_SM": programs,
                "LOADER_REGS": 24 if programs == 3 else 40, "SCALE_ACC": scale_acc}  # fmt: skip
        if quant_gemm_ws.check_config(m, n, k, bits, group_size, **tile) is None:
            tiles.append({"WS": 1, **tile})
    return tiles


@packed_linear.register_fake
def _packed_linear_shape(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int,
                         names: list[str], values: list[int]) -> torch.Tensor:  # fmt: skip
    return x.new_empty((x.shape[0], qweight.shape[1]))


#: Weight bytes the timed products rotate over, so that the weights come from HBM as in a decode step
#: (whose whole model is far larger than the L2 cache), not from L2.
ROTATE_BYTES = 256 * 1024 * 1024


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
    import concurrent.futures

    from kernels.quant_gemm import compile_only, quant_matmul
    from tuner.fingerprint import device_info
    from tuner.measure import time_fn

    key = (torch.cuda.get_device_name(device), m, n, k, bits, group_size, dtype)
    if candidates is None and key in _TUNED:
        return dict(_TUNED[key])
    precision = "bf16" if dtype == torch.bfloat16 else "fp16"
    tiles = candidates if candidates is not None else _candidate_tiles(m, n, k, bits)

    def compiles(tile: dict[str, int]) -> bool:
        try:
            compile_only(m, n, k, precision=precision, bits=bits, group_size=group_size, **tile)
        except Exception:  # a tile that does not compile here is simply not a candidate
            return False
        return True

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        tiles = [t for t, ok in zip(tiles, pool.map(compiles, tiles), strict=True) if ok]
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

        timing = time_fn(
            products,
            info,
            warmup_ms=2.0,
            rep_ms=10.0,
            min_reps=5,
            max_reps=50,
            flush_l2=False,
            cuda_graph=True,
            graph_calls=1,
        )
        per_product = timing.median_ms / copies
        if per_product < best_ms:
            best, best_ms = tile, per_product
    if candidates is None:
        _TUNED[key] = dict(best)
    return dict(best)


def autotune_tiles(
    model: nn.Module, m: int, dtype: torch.dtype = torch.bfloat16, partials: bool = False
) -> dict[tuple[int, int], dict[str, int]]:
    """Measure the best tile (:func:`tune_tile`, :func:`tune_packed_tile`) for every distinct shape of ``model``'s
    CUDA :class:`QuantLinear` modules at ``m`` rows and make them use it; returns ``{(K, N): tile}``.
    ``partials``: packed layers may take ``PARTIALS`` tiles, whose split-K sums the model leaves to the operation
    after each product (for a model run under ``torch.compile``, which fuses them there).

    Call it before capturing a CUDA graph of the model (tuning launches kernels). On a model without
    CUDA QuantLinears (CPU, or the interpreter) it does nothing and returns ``{}``.
    """
    layers = [mod for mod in model.modules() if isinstance(mod, QuantLinear) and mod.qweight.is_cuda]
    if not layers or interpreter_active():
        return {}
    chosen: dict[tuple[int, int], dict[str, int]] = {}
    for layer in layers:
        shape = (layer.in_features, layer.out_features)
        if shape not in chosen:
            args = (m, layer.out_features, layer.in_features, layer.bits, layer.group_size, dtype, layer.qweight.device)
            chosen[shape] = tune_packed_tile(*args, partials) if layer.kernel == "packed" else tune_tile(*args)
        layer._tiles[(m, str(layer.qweight.device))] = chosen[shape]
    return chosen


def partial_candidates(m: int, n: int, k: int, bits: int) -> list[dict[str, int]]:
    """``PARTIALS`` tiles: the split-K tiles of :func:`packed_candidates` (STREAM's aside) with their partial products
    left unsummed, and at one row the GEMV split finer (16 and 32 ways), which costs little without a reduction."""
    tiles = [{**t, "PARTIALS": 1} for t in packed_candidates(m, n, k, bits) if t["SPLIT_K"] > 1 and not t.get("STREAM")]
    if m == 1:
        span = 16 * (32 // bits)
        tiles += [
            {"BLOCK_M": 1, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": 4, "num_stages": 1, "PREFETCH": pf, "PARTIALS": 1}
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
        swapped += [(bm, bn, sk, 3, swap, 8, 2) for bm, bn, sk, swap in itertools.product((32, 64), (128, 256),
                                                                                         (1, 2, 4), (2, 3))]
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
            {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": st, "PREFETCH": 0, "TMA": 1,
             "SWAP": swap, "STREAM": 2}
            for st, swap in itertools.product((3, 4), (1, 2))
        ]  # fmt: skip
    return [t for t in tiles if k % (t["SPLIT_K"] * span) == 0 and t["BLOCK_N"] <= max(16, n)]


def tune_packed_tile(
    m: int,
    n: int,
    k: int,
    bits: int,
    group_size: int,
    dtype: torch.dtype,
    device: torch.device,
    partials: bool = False,
) -> dict[str, int]:
    """The fastest :func:`packed_candidates` (and :func:`ws_candidates`) tile for an (M, K) x (K, N) product on
    this GPU, measured by :func:`time_packed_tiles`; cached per GPU and shape for the process. ``partials``: the
    caller sums split-K's partial products in its next operation (a compiled model), so the split-K tiles are
    also timed with ``PARTIALS`` (:func:`partial_candidates`), the kernel alone."""
    key = ("packed", torch.cuda.get_device_name(device), m, n, k, bits, group_size, dtype, partials)
    if key in _TUNED:
        return dict(_TUNED[key])
    candidates = packed_candidates(m, n, k, bits) + ws_candidates(m, n, k, bits, group_size)
    if partials:
        candidates += partial_candidates(m, n, k, bits)
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
    """``(tile, ms per product)`` for every candidate that compiles here (``WS: 1`` tiles on the Gluon kernel), as
    :func:`tune_tile` measures: compiled ahead on a thread pool, timed in a CUDA graph over copies of random
    weights rotating through :data:`ROTATE_BYTES` (each product streams its weights from HBM)."""
    import concurrent.futures

    from kernels import quant_gemm_ws
    from kernels.quant_gemm_packed import PackedWeights, compile_only, pack_factor
    from tuner.fingerprint import device_info
    from tuner.measure import time_fn

    precision = "bf16" if dtype == torch.bfloat16 else "fp16"

    def compiles(tile: dict[str, int]) -> bool:
        try:
            if tile.get("WS"):
                knobs = {name: value for name, value in tile.items() if name != "WS"}
                quant_gemm_ws.compile_only(m, n, k, bits=bits, group_size=group_size, precision=dtype, **knobs)
            else:
                compile_only(m, n, k, precision=precision, bits=bits, group_size=group_size, **tile)
        except Exception:  # a tile that does not compile here is simply not a candidate
            return False
        return True

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        tiles = [t for t, ok in zip(candidates, pool.map(compiles, candidates), strict=True) if ok]
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
    for tile in tiles:

        def products(tile: dict[str, int] = tile) -> None:
            for w in weights:  # PARTIALS tiles: the kernel alone (its sum goes into the next operation)
                packed_product(x, w, tile, out=out, sum_partials=False)

        products()  # split-K scratch allocated before the graph capture
        timing = time_fn(products, info, warmup_ms=2.0, rep_ms=10.0, min_reps=5, max_reps=50, flush_l2=False,
                         cuda_graph=True, graph_calls=1)  # fmt: skip
        timed.append((tile, timing.median_ms / copies))
    return timed


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


class QuantLinear(nn.Module):
    """``y = x @ dequant(W) + bias`` with W stored as int8 / packed int4 and per-group scales.

    Build it with :meth:`from_linear`. ``use_kernel``: None picks the Triton kernel for CUDA
    bf16/fp16 inputs when the interpreter is off and the torch fallback otherwise; True / False
    force one (True also runs the kernel on CPU tensors under the interpreter, for tests).
    Buffers: ``qweight`` (int8 in :mod:`kernels.quant_gemm`'s layout for ``kernel="tiled"``, int32
    words of :mod:`kernels.quant_gemm_packed` for ``kernel="packed"``), ``scales`` (bf16/fp16),
    ``bias`` (or None); they move with ``.to(device)`` as any buffer does.
    """

    def __init__(
        self,
        qweight: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None,
        bits: int,
        group_size: int,
        use_kernel: bool | None = None,
        kernel: str = "tiled",
    ) -> None:
        super().__init__()
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.bits = bits
        self.group_size = group_size
        self.kernel = kernel
        self.in_features = qweight.shape[0] * ((32 if kernel == "packed" else 8) // bits)
        self.out_features = qweight.shape[1]
        self.use_kernel = use_kernel
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)
        self._tiles: dict[tuple[int, str], dict[str, int]] = {}

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        bits: int,
        group_size: int,
        scale_dtype: torch.dtype = torch.bfloat16,
        use_kernel: bool | None = None,
        clip_search: bool = True,
    ) -> QuantLinear:
        """Quantize ``linear``'s weight (on its device); the bias is kept in ``scale_dtype``.

        ``clip_search`` (default on): each group's scale is the clipping of its maximum with the least
        squared error (:func:`kernels.quant_gemm.quantize_weights`), which matters for int4.

        Raises ValueError when ``group_size`` does not divide ``in_features`` (or is not an even
        power of two) or ``bits`` is not 4 or 8.
        """
        from kernels.quant_gemm import quantize_weights

        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
        with torch.no_grad():
            weights = quantize_weights(
                linear.weight.detach().t().to(torch.float32), bits, group_size, scale_dtype, clip_search
            )
            bias = None if linear.bias is None else linear.bias.detach().to(scale_dtype).clone()
        return cls(weights.qweight, weights.scales, bias, bits, group_size, use_kernel)

    @property
    def weight_bytes(self) -> int:
        """Bytes of packed weights, scales and bias: what one forward reads of this layer."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.bias) if t is not None)

    def dequantized_weight(self) -> torch.Tensor:
        """``q * scale`` as an fp32 (K, N) = (in_features, out_features) matrix."""
        if self.kernel == "packed":
            return self._packed_weights().dequantize()
        from kernels.quant_gemm import QuantizedWeights

        return QuantizedWeights(self.qweight, self.scales, self.bits, self.group_size).dequantize()

    def _packed_weights(self) -> Any:
        from kernels.quant_gemm_packed import PackedWeights

        return PackedWeights(self.qweight, self.scales, self.bits, self.group_size)

    def packed(self) -> QuantLinear:
        """The same layer (values, scales, bias shared) for the packed kernel: its words made from this layout."""
        if self.kernel == "packed":
            return self
        from kernels.quant_gemm_packed import repack

        words = repack(self.qweight, self.scales, self.bits, self.group_size).qweight
        return QuantLinear(words, self.scales, self.bias, self.bits, self.group_size, self.use_kernel, "packed")

    def set_tile(self, m: int, tile: dict[str, int], device: torch.device | str = "cuda") -> None:
        """Use ``tile`` for products of ``m`` rows on ``device`` (a tuned config; checked at the next forward)."""
        self._tiles[(m, str(torch.device(device)))] = dict(tile)

    def _kernel_wanted(self, x: torch.Tensor) -> bool:
        if self.use_kernel is not None:
            return self.use_kernel
        return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and not interpreter_active()

    def _tile(self, m: int, device: torch.device) -> dict[str, int]:
        key = (m, str(device))
        tile = self._tiles.get(key)
        if tile is None:
            if self.kernel == "packed":
                tile = packed_tile(m, self.out_features, self.in_features, self.bits)
            else:
                smem = _device_smem_bytes(device) if device.type == "cuda" else None
                tile = default_tile(m, self.out_features, self.in_features, self.bits, self.group_size, smem)
            self._tiles[key] = tile
        return tile

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected {self.in_features} input features, got {x.shape[-1]}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self._kernel_wanted(x2) and self.kernel == "packed":
            tile = self._tile(x2.shape[0], x2.device)
            args = (
                x2,
                self.qweight,
                self.scales,
                self.bits,
                self.group_size,
                list(tile),
                [int(v) for v in tile.values()],
            )
            if tile.get("PARTIALS"):  # summed by whatever reads y: under torch.compile, in that kernel
                y = packed_linear_partials(*args).sum(0).to(x.dtype)
            else:
                y = packed_linear(*args)
        elif self._kernel_wanted(x2):
            from kernels.quant_gemm import quant_matmul

            y = quant_matmul(
                x2,
                self.qweight,
                self.scales,
                bits=self.bits,
                group_size=self.group_size,
                **self._tile(x2.shape[0], x2.device),
            )
        else:
            y = (x2.to(torch.float32) @ self.dequantized_weight()).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"group_size={self.group_size}, bias={self.bias is not None}, kernel={self.kernel}"
        )


def quantize_linears(
    model: nn.Module,
    bits: int,
    group_size: int,
    select: Callable[[str, nn.Linear], bool] | None = None,
    scale_dtype: torch.dtype = torch.bfloat16,
    use_kernel: bool | None = None,
    clip_search: bool = True,
    prebuilt: dict[str, QuantLinear] | None = None,
) -> nn.Module:
    """A copy of ``model`` with the selected ``nn.Linear`` modules replaced by :class:`QuantLinear`.

    ``select(qualified_name, linear)`` picks the layers (default: every ``nn.Linear``); a layer named
    in ``prebuilt`` becomes that module (quantized elsewhere, e.g. by :mod:`models.gptq`). Every other
    parameter and buffer is the original tensor, shared, not copied; only the module objects are new.
    The original is left unchanged. A linear whose weight is also used elsewhere (tied to an
    embedding) is quantized in this copy only; the other user keeps the unquantized tensor.
    """
    memo: dict[int, Any] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and prebuilt and name in prebuilt:
            memo[id(module)] = prebuilt[name]
        elif isinstance(module, nn.Linear) and (select is None or select(name, module)):
            memo[id(module)] = QuantLinear.from_linear(module, bits, group_size, scale_dtype, use_kernel, clip_search)
    for tensor in [*model.parameters(), *model.buffers()]:
        memo.setdefault(id(tensor), tensor)
    return copy.deepcopy(model, memo)


def quantize_decoder(model: nn.Module, bits: int, group_size: int, int8_first_blocks: int = 0) -> nn.Module:
    """A copy of a GPT (``models.gpt``) with its block Linears quantized to ``bits``, the first
    ``int8_first_blocks`` blocks' Linears to int8 instead (same group size).

    Why the first blocks: they see the raw token embeddings, and their quantization error passes through
    every later block. On CPU (8-block model, d_model 256, pretrained 60 steps, int4 group 64), keeping
    block 0 in int8 raised top-1 agreement with the bf16 model from 0.941 to 0.988 and halved the mean
    logit error; keeping the last block instead changed nothing.
    """
    if int8_first_blocks and bits != 4:
        raise ValueError(f"int8_first_blocks applies to int4 weights, got bits={bits}")
    keep = tuple(f"blocks.{i}." for i in range(int8_first_blocks))
    if keep:
        model = quantize_linears(model, 8, group_size, select=lambda name, _: name.startswith(keep))
    return quantize_linears(model, bits, group_size)


def pack_linears(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose :class:`QuantLinear` layers run the packed kernel (:meth:`QuantLinear.packed`);
    every other module, parameter and buffer is shared with the original."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        if isinstance(module, QuantLinear):
            memo[id(module)] = module.packed()
    for tensor in [*model.parameters(), *model.buffers()]:
        memo.setdefault(id(tensor), tensor)
    return copy.deepcopy(model, memo)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of a model's distinct parameters and buffers (shared tensors counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel() * tensor.element_size()
    return total
