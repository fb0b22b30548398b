"""Weight-only int4/int8 GEMM built for the HBM roofline: an offline K-interleaved int32 layout,
CUDA-core GEMV for a few rows, tensor cores above, and split-K reduced inside the kernel.

``Y = X @ dequant(W)``: X (M, K) bf16/fp16, W quantized as in :mod:`kernels.quant.quant_gemm`
(symmetric, one scale per group of ``group_size`` K rows and column, int4 values in [-7, 7],
int8 in [-127, 127]); Y (M, N) in X's dtype, products accumulated in fp32.

Layout (made once, at quantization time, by :func:`kernels.quant.quant_layout.pack_weights`):
``PACK = 32 // bits`` values share one int32 word (8 nibbles or 4 bytes), stored offset-binary
(``q + 8`` or ``q + 128``). K is cut into spans of ``SPAN = 16 * PACK`` rows (128 for int4, 64 for
int8); word ``[16 * s + j, n]`` holds, in its value slot ``i``, ``q[SPAN * s + 16 * i + j, n]``. So a
(16, BLOCK_N) tile of words is a whole span, and decoding slot ``i`` of every word gives the
(16, BLOCK_N) weight slice of K rows ``SPAN * s + 16 i .. + 16``: the matching X slice is 16
contiguous columns, the slice is one ``tl.dot`` of K = 16 or one FMA sweep, and no value moves
between threads. Words are contiguous along N, so a thread's loads are 16-byte vectors of 4 words
(32 int4 weights). Scales are (K // group_size, N), read once per span when ``group_size >= SPAN``
(or once per 16-row slice for smaller groups).

Decoding uses the exponent trick in fp32: ``bits(0x4B000000 | u)`` is ``2**23 + u``, so a value
costs a shift, a masked OR and one subtraction (an int-to-float conversion runs at a quarter rate).

With ``FAST_DECODE`` (int4, compiled kernels) a few lines of inline PTX decode two nibbles per
instruction into 16-bit floats instead (``lop3`` under the exponent of 128.0 or 1024.0, then one
packed ``fma``), about one instruction per weight; the interpreter runs the fp32 decode.
``FAST_DECODE=2`` (the int4 GEMV with one scale per span) goes further: the same masked OR read as two
fp32 values ``q + bias`` (no 16-bit subtraction, no conversion to fp32), multiplied by X, and the biases
taken off once per span as ``bias * sum(x)``: a shift, an OR, a shift and two FMAs per two weights
(the default where it applies; other tiles take the 16-bit pairs). The decodes live in
:mod:`kernels.quant.quant_decode`.

Paths (``BLOCK_M`` picks): ``BLOCK_M == 1`` is the GEMV path: one row of X per program, the
decoded weights multiplied on the CUDA cores into a (16, BLOCK_N) fp32 accumulator reduced over
its rows after the K loop (rows of X fastest in the grid, so the programs reading one weight tile
run together and it comes from HBM once). ``BLOCK_M >= 16`` feeds the decoded slices, rounded to
X's dtype (exact: small integers), to ``tl.dot`` with K = 16. ``PREFETCH`` loads the next span's
words before decoding the current one, so every program keeps a load in flight; ``num_stages`` > 1
pipelines the K loop itself (the loads of ``num_stages - 1`` spans ahead go through shared memory by
``cp.async``), so a program keeps several spans in flight with few registers: a GEMV at M = 1 is
bound by the bytes in flight per SM, not by the decode.

Hopper options: ``TMA`` reads the words by bulk tensor copies ((16, BLOCK_N) boxes; the pipeliner keeps
``num_stages - 1`` in flight, one instruction each) instead of per-thread loads. ``SWAP`` (tensor-core
tiles) computes Y's tile transposed, ``Y^T = dequant(W)^T X^T``: the decoded weights become the MMA's
first operand, which wgmma reads from registers, so they are never staged through shared memory (X is).
``SWAP=1`` multiplies 16-row slices; ``SWAP=2`` joins a span's slices into one (BLOCK_N, SPAN) operand, one
wgmma chain and one wait per span instead of one per slice (on an H200 1.16-1.18x bf16 at M = 64 against
0.70-0.86x without it); ``SWAP=3`` also folds the scales into the weights (rounded to X's dtype), so the
product accumulates across spans and the next span decodes while the last one's wgmmas run. Both need
one scale row per span (``group_size >= SPAN``); with smaller groups they take ``SWAP=1``'s slices.
``TMA=2`` (with ``SWAP >= 2``) reads X's (BLOCK_M, SPAN) slices by tensor copies as well: they land in shared
memory in the async proxy the wgmma reads from, so X skips the load into registers, the store back and the proxy
fence that ``TMA=1`` needs (an X slice holds 2-4x the bytes of its span's words at 64 rows). On an H200 at M = 64
it took the (N, K) = (4096, 14336) product from 31.7 to 24.8 us (1.43x bf16), at M = 16 from 17.8 to 16.9 us
(bench/results/int4-roofline-xtma-h200.json).

Split-K without extra launches (``SPLIT_K > 1``): program ``(tile, s)`` covers K rows
``[s K / SPLIT_K, (s + 1) K / SPLIT_K)``, adds its partial into an fp32 workspace with atomics,
then increments the tile's arrival counter; the program that arrives last reads the sum, writes
Y, and puts the workspace tile and the counter back to zero. Workspace and counters are allocated
zeroed once per device and left zeroed by every launch: one kernel per product, and a CUDA
graph can capture it (split-K products on two streams at once must not share a device's scratch).
Rows and columns past the edge wrap around for loads and are masked on stores; K must be a multiple
of ``SPLIT_K * SPAN`` (checked).

``PARTIALS`` (with ``SPLIT_K``, not ``STREAM``) leaves the reduction to the caller: each split stores its fp32 partial
tile into a ``(SPLIT_K, M, N)`` output and returns, so a small product ends with its last loads rather than a
chain of atomics and reads (14-26% faster at the 1B decode shapes on an H200); the sum belongs in the next
operation (``torch.compile`` fuses it there where it can). ``PARTIALS=2`` stores the partials in X's 16-bit dtype
instead of fp32: half the bytes written by the product and read by the operation that sums them, each partial
rounded once as Y itself is (the sum is still taken in fp32).

``STREAM`` (programs per SM, ``SPLIT_K`` 1) replaces the (tile, split) grid: ``STREAM`` x SMs programs each take
an equal run of the (tile, span) steps, spans fastest, in one loop, so the pipeliner keeps loads in flight
across tiles instead of filling and draining once per short program. A tile cut between programs is summed
as split-K's are, its number of parts known from the shares. (The reduction's CTA barrier is written as PTX:
Triton does not pipeline a loop that holds ``tl.debug_barrier``.)

The kernel's device functions (a span's decode and product, a tile's offsets and its store or split-K reduction)
are in :mod:`kernels.quant.quant_packed_steps`; this module holds the kernel, its launch and its checks.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from kernels.launch import Descriptors, Plan, PlanCache, layout_key, sm_count
from kernels.quant.quant_layout import (
    BITS,
    SLICE,
    PackedWeights,
    pack_factor,
    pack_weights,
    quantize_packed,
    repack,
    span,
    unpack_weights,
)
from kernels.quant.quant_packed_steps import _span_product, _store_tile, _tile_offsets
from kernels.quant.quant_weights import ACT_DTYPES, QMAX, _is_pow2
from kernels.runtime import interpreter_active

#: Smallest BLOCK_M that takes the tensor-core path; below it the GEMV path runs.
DOT_MIN_M = 16


# --------------------------------------------------------------------------- kernel


@triton.jit
def packed_quant_kernel(
    x_ptr, x_desc, w_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K: tl.constexpr,
    stride_xm, stride_xk, stride_wr, stride_wn, stride_sg, stride_sn, stride_ym, stride_yn,
    BITS: tl.constexpr, GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr, UNROLL: tl.constexpr, PREFETCH: tl.constexpr, FAST_DECODE: tl.constexpr,
    STAGES: tl.constexpr, TMA: tl.constexpr, SWAP: tl.constexpr, STREAM: tl.constexpr, COMPILED: tl.constexpr,
    PARTIALS: tl.constexpr = False, PDL: tl.constexpr = False, ACT: tl.constexpr = 0,
):  # fmt: skip
    """One (BLOCK_M, BLOCK_N) tile of Y over one K split, or, ``STREAM``, an equal share of every tile's spans
    (layout and paths: the module docstring). ``PDL``: launched as a programmatic dependent of the kernel before
    it, the program waits for that kernel's writes (``griddepcontrol.wait``) before its first load.

    K is a compile-time constant (one binary per K, as a model has few): with K at run time the pipelined loop
    keeps a path that skips it, where moves zero the accumulator, and ptxas then serializes every wgmma of the
    two-warpgroup split-K tiles (a wait after each wgmma). With K constant, 64 x 8192 x 8192 takes 26.5 us against
    27.4 on an H100 (bench/results/int4-roofline-kconst-m64-h100.json)."""
    if PDL:
        gdc_wait()
    PACK: tl.constexpr = 32 // BITS
    SPAN: tl.constexpr = 16 * PACK
    USE_DOT: tl.constexpr = BLOCK_M > 1
    ONE_SCALE: tl.constexpr = GROUP_SIZE >= SPAN  # one scale row per span, applied once per span
    WIDE: tl.constexpr = SWAP >= 2 and ONE_SCALE and BLOCK_M > 1  # one transposed product of K = SPAN per span
    # SWAP 3: the scales folded into the decoded weights (rounded to X's dtype), the product accumulated in acc
    # across spans, so the pipeliner can keep one span's wgmma in flight while the next span decodes
    FOLD: tl.constexpr = SWAP == 3 and WIDE
    X_TMA: tl.constexpr = TMA == 2  # X's (BLOCK_M, SPAN) slices by tensor copies too (WIDE tiles only: checked)
    dtype = x_ptr.dtype.element_ty
    offs_j = tl.arange(0, 16)
    if WIDE or USE_DOT:
        acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    if STREAM:
        # The (tile, span) steps, span fastest, cut into one contiguous share per program: one loop, so the
        # pipeliner keeps loads in flight across the tiles; a tile split between programs is summed with atomics.
        n_spans = K // SPAN
        steps = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N) * n_spans
        share = tl.cdiv(steps, tl.num_programs(0))
        first = tl.program_id(0) * share
        last = tl.minimum(first + share, steps)
        for t in tl.range(first, last, num_stages=STAGES, loop_unroll_factor=UNROLL):
            tile = t // n_spans
            it = t % n_spans
            pid_m, pid_n, offs_m, offs_n, x_ptrs, s_ptrs = _tile_offsets(
                tile, M, N, it * SPAN, x_ptr, s_ptr, stride_xm, stride_xk, stride_sn, BLOCK_M, BLOCK_N, SPAN,
                USE_DOT, WIDE,
            )  # fmt: skip
            if TMA:
                words = w_ptr.load([it * 16, pid_n * BLOCK_N])
            else:
                words = tl.load(w_ptr + (it * 16 + offs_j)[:, None] * stride_wr + (offs_n % N)[None, :] * stride_wn)
            x_tile = x_desc.load([pid_m * BLOCK_M, it * SPAN]) if X_TMA else None
            acc = _span_product(words, x_ptrs, s_ptrs, acc, it * SPAN, stride_xk, stride_sg, dtype, BITS,
                                GROUP_SIZE, FAST_DECODE, USE_DOT, ONE_SCALE, WIDE, FOLD, SWAP, COMPILED,
                                x_tile)  # fmt: skip
            if (it == n_spans - 1) | (t == last - 1):
                # the programs whose shares hold one of the tile's steps: those of its first and last step, between
                parts = ((tile + 1) * n_spans - 1) // share - (tile * n_spans) // share + 1
                _store_tile(acc, pid_m, offs_m, offs_n, M, N, y_ptr, ws_ptr, cnt_ptr, tile, parts, stride_ym,
                            stride_yn, USE_DOT, SWAP, COMPILED, ACT=ACT)  # fmt: skip
                acc = tl.zeros_like(acc)
    else:
        tile = tl.program_id(0)
        k_per_split = K // SPLIT_K
        k_begin = tl.program_id(1) * k_per_split
        n_iter = k_per_split // SPAN
        pid_m, pid_n, offs_m, offs_n, x_ptrs, s_ptrs = _tile_offsets(
            tile, M, N, k_begin, x_ptr, s_ptr, stride_xm, stride_xk, stride_sn, BLOCK_M, BLOCK_N, SPAN, USE_DOT, WIDE
        )  # fmt: skip
        if TMA:  # w_ptr is a tensor descriptor of the words, (16, BLOCK_N) boxes; columns past N read zeros
            w_row = k_begin // PACK
        else:
            w_ptrs = w_ptr + (k_begin // PACK + offs_j)[:, None] * stride_wr + (offs_n % N)[None, :] * stride_wn
        if PREFETCH:
            words = tl.load(w_ptrs)
        for it in tl.range(0, n_iter, num_stages=STAGES, loop_unroll_factor=UNROLL):
            if TMA:  # one bulk copy per span; num_stages > 1 keeps num_stages - 1 spans in flight
                words = w_ptr.load([w_row + it * 16, pid_n * BLOCK_N])
            elif PREFETCH:  # the next span's words (this span's again on the last iteration: in bounds, unused)
                upcoming = tl.load(w_ptrs + (tl.minimum(it + 1, n_iter - 1) - it) * 16 * stride_wr)
            else:  # loaded at the top of the iteration, where the pipeliner (num_stages > 1) issues it ahead
                words = tl.load(w_ptrs)
            x_tile = x_desc.load([pid_m * BLOCK_M, k_begin + it * SPAN]) if X_TMA else None
            acc = _span_product(words, x_ptrs, s_ptrs, acc, k_begin + it * SPAN, stride_xk, stride_sg, dtype, BITS,
                                GROUP_SIZE, FAST_DECODE, USE_DOT, ONE_SCALE, WIDE, FOLD, SWAP, COMPILED,
                                x_tile)  # fmt: skip
            if PREFETCH:
                words = upcoming
            if not TMA:
                w_ptrs += 16 * stride_wr
            x_ptrs += SPAN * stride_xk
        _store_tile(acc, pid_m, offs_m, offs_n, M, N, y_ptr, ws_ptr, cnt_ptr, tile, SPLIT_K, stride_ym, stride_yn,
                    USE_DOT, SWAP, COMPILED, PARTIALS, tl.program_id(1), ACT)  # fmt: skip


# --------------------------------------------------------------------------- launch


def check_layout(m: int, n: int, k: int, bits: int, group_size: int, BLOCK_M: int, BLOCK_N: int, SPLIT_K: int) -> None:
    """Raise ValueError (naming the argument) for a shape / quantization / tiling the kernel cannot run."""
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if not _is_pow2(group_size) or group_size < SLICE or k % group_size:
        raise ValueError(f"group_size must be a power of two >= {SLICE} dividing K={k}, got {group_size!r}")
    if not _is_pow2(BLOCK_M) or 1 < BLOCK_M < DOT_MIN_M:
        raise ValueError(f"BLOCK_M must be 1 (GEMV) or a power of two >= {DOT_MIN_M} (tensor cores), got {BLOCK_M}")
    if not _is_pow2(BLOCK_N) or BLOCK_N < 16:
        raise ValueError(f"BLOCK_N must be a power of two >= 16, got {BLOCK_N}")
    if SPLIT_K < 1 or k % (SPLIT_K * span(bits)):
        raise ValueError(f"SPLIT_K * {span(bits)} (the int{bits} span) = {SPLIT_K * span(bits)} must divide K={k}")
    if m < 1 or n < 1:
        raise ValueError(f"M and N must be positive, got {m} and {n}")


def _grid(m: int, n: int, BLOCK_M: int, BLOCK_N: int, SPLIT_K: int, STREAM: int = 0, sms: int = 1,
          spans: int = 1) -> tuple[int, int]:  # fmt: skip
    """(tiles, SPLIT_K) programs, or with ``STREAM`` ``STREAM`` programs per multiprocessor (at most one per
    (tile, span) step: ``spans`` is K over the span)."""
    tiles = triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N)
    if STREAM:
        return (min(tiles * spans, STREAM * sms), 1)
    return (tiles, SPLIT_K)


def _multiprocessors(device: torch.device) -> int:
    """The device's SM count (8 for the interpreter's CPU tensors: any grid runs there)."""
    if device.type != "cuda":
        return 8
    return sm_count(device)


_scratch: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}
#: Scratch pairs a larger product replaced: kept for the life of the process, never freed, because a CUDA graph
#: captured before the growth still reads and re-zeroes them at its replays (freed, their memory would go to other
#: tensors, which the graph's atomics would then corrupt: on an H200 a decode step captured at batch 1 before a
#: larger LM head grew the scratch returned all-NaN logits at its next replay).
_retired: list[tuple[torch.Tensor, torch.Tensor]] = []


def scratch(device: torch.device, elements: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The zeroed fp32 workspace and int32 arrival counters of split-K, one pair per device, grown on demand.

    Every launch leaves them zeroed, so they are allocated (and zeroed) only when a larger product comes;
    call it once before capturing a CUDA graph so that the capture allocates nothing. A pair that a larger
    product replaces stays allocated (:data:`_retired`): graphs captured with it keep using it. Split-K products
    running on two streams at the same time would share them: keep such products on one stream.
    """
    key = (device.type, device.index)
    ws, cnt = _scratch.get(key, (None, None))
    if ws is None or ws.numel() < elements or cnt.numel() < tiles:
        if ws is not None:
            _retired.append((ws, cnt))
        size = max(elements, ws.numel() if ws is not None else 0)
        count = max(tiles, cnt.numel() if cnt is not None else 0)
        ws = torch.zeros(size, device=device, dtype=torch.float32)
        cnt = torch.zeros(count, device=device, dtype=torch.int32)
        _scratch[key] = (ws, cnt)
    return ws, cnt


def _meta(bits: int, group_size: int, BLOCK_M: int, BLOCK_N: int, SPLIT_K: int, UNROLL: int, num_warps: int,
          num_stages: int, PREFETCH: int, FAST_DECODE: int, MAXNREG: int = 0, TMA: int = 0, SWAP: int = 0,
          STREAM: int = 0, PARTIALS: int = 0, PDL: int = 0, ACT: int = 0) -> dict[str, Any]:  # fmt: skip
    """Constexprs and launch options; FAST_DECODE (inline PTX) only for int4 and only when compiling;
    ``MAXNREG`` > 0 caps the registers per thread (more programs per SM keep more loads in flight);
    ``TMA`` loads the words through a tensor descriptor (``PREFETCH`` then has nothing to do: off), ``TMA=2``
    X's span slices too (swapped span tiles: ``SWAP >= 2``);
    ``SWAP`` (tensor-core tiles only) computes Y's tile transposed, the decoded weights as the MMA's A operand;
    ``STREAM`` (programs per SM) gives each program an equal share of all tiles' spans (``SPLIT_K`` must be 1);
    ``PARTIALS`` stores each split's partial tile instead of summing them (not with ``STREAM``): 1 in fp32, 2 in
    X's dtype;
    ``PDL`` launches the kernel as a programmatic dependent launch (Hopper: its launch overlaps the end of the
    kernel before it; compiled kernels only); ``ACT`` 1 stores GELU (tanh approximation) of Y (not with
    ``PARTIALS``, whose sum is the caller's)."""
    if ACT not in (0, 1):
        raise ValueError(f"ACT (the epilogue's activation) must be 0 (none) or 1 (GELU, tanh), got {ACT!r}")
    if PARTIALS not in (0, 1, 2):
        raise ValueError(f"PARTIALS must be 0 (Y), 1 (fp32 partials) or 2 (partials in X's dtype), got {PARTIALS!r}")
    if ACT and PARTIALS:
        raise ValueError("ACT applies to Y: PARTIALS leaves the sum, and so the activation, to the caller")
    if PARTIALS and STREAM:
        raise ValueError(
            "PARTIALS stores one partial per K split: STREAM, whose programs share tiles unevenly, has none"
        )
    if STREAM and SPLIT_K != 1:
        raise ValueError(
            f"STREAM shares each tile's K spans among the programs itself: SPLIT_K must be 1, got {SPLIT_K}"
        )
    if STREAM < 0:
        raise ValueError(f"STREAM (programs per multiprocessor) must be >= 0, got {STREAM}")
    if TMA not in (0, 1, 2):
        raise ValueError(f"TMA must be 0 (no tensor copies), 1 (the words) or 2 (the words and X), got {TMA!r}")
    if TMA == 2 and not (SWAP >= 2 and BLOCK_M >= DOT_MIN_M and group_size >= span(bits)):
        raise ValueError(
            "TMA=2 (X by tensor copies) feeds X's span slices straight to the wgmma: it needs SWAP >= 2, "
            f"BLOCK_M >= {DOT_MIN_M} and group_size >= {span(bits)}, got SWAP={SWAP}, BLOCK_M={BLOCK_M}, "
            f"group_size={group_size}"
        )
    extra = {"maxnreg": MAXNREG} if MAXNREG and not interpreter_active() else {}
    if PDL and not interpreter_active():
        extra |= {"PDL": True, "launch_pdl": True}
    if FAST_DECODE == 2 and bits == 4 and BLOCK_M == 1 and group_size >= span(bits):
        decode = 2  # plain Triton bit operations: the interpreter runs it too
    else:
        decode = int(bool(FAST_DECODE) and bits == 4 and not interpreter_active())
    return extra | {
        "PREFETCH": bool(PREFETCH) and not TMA and not STREAM,
        "TMA": int(TMA),
        "STREAM": bool(STREAM),
        "PARTIALS": bool(PARTIALS),
        "ACT": int(ACT),
        "COMPILED": not interpreter_active(),
        "SWAP": int(SWAP) if BLOCK_M > 1 else 0,
        "FAST_DECODE": decode,
        "BITS": bits,
        "GROUP_SIZE": group_size,
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": BLOCK_N,
        "SPLIT_K": SPLIT_K,
        "UNROLL": UNROLL,
        "STAGES": num_stages,
        "num_warps": num_warps,
        "num_stages": num_stages,
    }


#: :func:`packed_matmul`'s launch plans.
_PLANS = PlanCache()


def _check_operands(x: torch.Tensor, weights: PackedWeights, BLOCK_M: int, BLOCK_N: int, SPLIT_K: int) -> tuple:
    """``(m, n, k)`` of ``x @ dequant(weights)``; raises ValueError on X, the words or the scales that the tile
    config cannot take."""
    qweight, scales = weights.qweight, weights.scales
    if x.dtype not in ACT_DTYPES.values():
        raise ValueError(f"x must be bfloat16 or float16, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (M, K), got {tuple(x.shape)}")
    bits, group_size = weights.bits, weights.group_size
    m, k = x.shape
    n = qweight.shape[1]
    check_layout(m, n, k, bits, group_size, BLOCK_M, BLOCK_N, SPLIT_K)
    if qweight.dtype != torch.int32 or qweight.shape[0] * pack_factor(bits) != k:
        raise ValueError(
            f"qweight must be int32 ({k // pack_factor(bits)}, {n}), got {qweight.dtype} {tuple(qweight.shape)}"
        )
    if scales.dtype not in ACT_DTYPES.values() or tuple(scales.shape) != (k // group_size, n):
        raise ValueError(
            f"scales must be bf16/fp16 ({k // group_size}, {n}), got {scales.dtype} {tuple(scales.shape)}"
        )
    return m, n, k


def _output(x: torch.Tensor, out: torch.Tensor | None, m: int, n: int, SPLIT_K: int, PARTIALS: int) -> tuple:
    """``(out, shape, dtype)``: Y (or the partials) as the caller gave it, checked, else allocated."""
    shape, dtype = ((SPLIT_K, m, n), partials_dtype(PARTIALS, x.dtype)) if PARTIALS else ((m, n), x.dtype)
    if out is None:
        out = torch.empty(shape, device=x.device, dtype=dtype)
    elif tuple(out.shape) != shape or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {shape} {dtype}, got {tuple(out.shape)} {out.dtype}")
    return out, shape, dtype


def packed_matmul(
    x: torch.Tensor,
    weights: PackedWeights,
    *,
    BLOCK_M: int,
    BLOCK_N: int,
    SPLIT_K: int,
    num_warps: int,
    num_stages: int = 2,
    UNROLL: int = 1,
    PREFETCH: int = 1,
    FAST_DECODE: int = 2,
    MAXNREG: int = 0,
    TMA: int = 0,
    SWAP: int = 0,
    STREAM: int = 0,
    PARTIALS: int = 0,
    PDL: int = 0,
    ACT: int = 0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``Y = X @ dequant(weights)`` with one tile config, one kernel launch; returns Y (``out`` if given).

    ``PARTIALS``: the K splits are not summed; returns their partial products, ``(SPLIT_K, M, N)`` in fp32
    (``PARTIALS=1``) or in X's dtype (``PARTIALS=2``) (``out`` if given, of that shape and dtype), whose sum over
    the first axis is Y. A caller that adds them in the next operation (``torch.compile`` fuses ``partials.sum(0)``
    into it) skips split-K's reduction in the kernel: the atomics, the arrival count and the last program's reads, a
    chain of round trips a small product waits on.

    ``x`` (M, K) bf16/fp16 with unit stride along K or not; ``out`` (M, N) in x's dtype. Launches
    asynchronously on the current stream; split-K's scratch is this module's (:func:`scratch`).
    ``TMA``: the words are read by bulk tensor copies (Hopper; contiguous words, N a multiple of 4); ``TMA=2``
    X's span slices too (``SWAP`` >= 2; X with unit stride along K and 16-byte rows).
    ``STREAM``: ``STREAM`` programs per multiprocessor, each taking an equal share of all tiles' K spans in one
    pipelined loop (``SPLIT_K`` 1; a tile shared between programs is summed in the kernel as split-K is).
    ``PDL``: a programmatic dependent launch (the launch overlaps the previous kernel's end; Hopper, compiled).
    ``ACT``: 1 stores GELU(Y) (tanh approximation), the activation applied to the fp32 sum in the epilogue.
    """
    qweight, scales = weights.qweight, weights.scales
    key = (layout_key(x, qweight, scales, out), x.device, weights.bits, weights.group_size, BLOCK_M, BLOCK_N, SPLIT_K,
           num_warps, num_stages, UNROLL, PREFETCH, FAST_DECODE, MAXNREG, TMA, SWAP, STREAM, PARTIALS, PDL,
           ACT)  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        bits, group_size = weights.bits, weights.group_size
        m, n, k = _check_operands(x, weights, BLOCK_M, BLOCK_N, SPLIT_K)
        out, shape, dtype = _output(x, out, m, n, SPLIT_K, PARTIALS)
        meta = _meta(bits, group_size, BLOCK_M, BLOCK_N, SPLIT_K, UNROLL, num_warps, num_stages, PREFETCH, FAST_DECODE,
                     MAXNREG, TMA, SWAP, STREAM, PARTIALS, PDL, ACT)  # fmt: skip
        sms = _multiprocessors(x.device) if STREAM else 1
        grid = _grid(m, n, BLOCK_M, BLOCK_N, SPLIT_K, STREAM, sms, k // span(bits))
        tiles = _grid(m, n, BLOCK_M, BLOCK_N, SPLIT_K)[0]  # one arrival counter per tile
        if TMA:
            check_tma(n, BLOCK_N)
            if not qweight.is_contiguous():
                raise ValueError("TMA needs contiguous words (qweight)")
        if TMA == 2:
            check_x_tma(k, x.element_size(), x.stride())
        ints = (m, n, k, x.stride(0), x.stride(1), qweight.stride(0), qweight.stride(1), scales.stride(0),
                scales.stride(1), out.stride(-2), out.stride(-1))  # fmt: skip
        # split-K's scratch is looked up at every call: a larger product may have replaced it since
        plan = _PLANS.put(key, Plan(packed_quant_kernel, grid, meta, ints=ints, out=(shape, dtype),
                                    scratch=(m * n, tiles) if not PARTIALS and (SPLIT_K > 1 or STREAM) else None,
                                    descs=Descriptors() if TMA else None, boxes=(BLOCK_M, bits, BLOCK_N)))  # fmt: skip
    elif out is None:
        shape, dtype = plan.state["out"]
        out = torch.empty(shape, device=x.device, dtype=dtype)
    state = plan.state
    if state["scratch"] is not None:
        ws, cnt = scratch(x.device, *state["scratch"])
    else:  # never read without split-K; with PARTIALS the partials are the workspace (Y's strides unused)
        ws, cnt = out, out
    if TMA:
        x_arg, w_arg = state["descs"].get((x.data_ptr(), qweight.data_ptr()), _tma_args, x, qweight, TMA,
                                          *state["boxes"])  # fmt: skip
    else:
        x_arg, w_arg = x, qweight
    plan.launch(x, x_arg, w_arg, scales, out, ws, cnt, *state["ints"])
    return out


def partials_dtype(PARTIALS: int, dtype: torch.dtype) -> torch.dtype:
    """The dtype of a ``PARTIALS`` tile's partial products for activations of ``dtype``: fp32, or (2) ``dtype``."""
    return dtype if PARTIALS == 2 else torch.float32


def check_tma(n: int, BLOCK_N: int) -> None:
    """Raise ValueError where a tensor descriptor of the words cannot exist (16-byte row stride, box <= 256)."""
    if (n * 4) % 16:
        raise ValueError(f"TMA needs N a multiple of 4 (16-byte rows of int32 words), got N={n}")
    if BLOCK_N > 256:
        raise ValueError(f"TMA boxes are at most 256 words wide: BLOCK_N={BLOCK_N}")


def check_x_tma(k: int, element_size: int, strides: tuple[int, ...]) -> None:
    """Raise ValueError where X cannot be read by tensor copies (``TMA=2``): unit stride along K, 16-byte rows."""
    if strides[1] != 1 or (strides[0] * element_size) % 16 or (k * element_size) % 16:
        raise ValueError(
            f"TMA=2 reads X by tensor copies: X needs unit stride along K and rows of a multiple of 16 bytes, "
            f"got strides {tuple(strides)} and K={k}"
        )


def _x_descriptor(x: Any, BLOCK_M: int, bits: int) -> Any:
    """Host-side descriptor of X (M, K), one (BLOCK_M, SPAN) box per span of a tile (rows past M read zeros)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = x.shape
    return TensorDescriptor(x, [m, k], [x.stride()[0], 1], [BLOCK_M, span(bits)])


def _tma_args(x: Any, words: Any, TMA: int, BLOCK_M: int, bits: int, BLOCK_N: int) -> tuple[Any, Any]:
    """X's argument (its descriptor with ``TMA=2``, else X) and the words' descriptor of a ``TMA`` launch."""
    return _x_descriptor(x, BLOCK_M, bits) if TMA == 2 else x, _word_descriptor(words, BLOCK_N)


def _word_descriptor(words: Any, BLOCK_N: int) -> Any:
    """Host-side descriptor of the (K // PACK, N) words, one (16, BLOCK_N) box per span of a tile."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows, n = words.shape
    return TensorDescriptor(words, [rows, n], [n, 1], [SLICE, BLOCK_N])


def _mock_launch(m: int, n: int, k: int, precision: str, bits: int, group_size: int, BLOCK_M: int, BLOCK_N: int,
                 SPLIT_K: int, scale_dtype: torch.dtype | None, TMA: int = 0, STREAM: int = 0,
                 PARTIALS: int = 0) -> tuple[Any, ...]:  # fmt: skip
    """Placeholder tensors with the dtypes, shapes and row-major strides of a contiguous launch, and the ints."""
    from kernels.gemm.gemm import strided_mock

    def row_major(dtype: torch.dtype, shape: list[int]) -> Any:
        return strided_mock(dtype, shape, (shape[1], 1))

    if precision not in ACT_DTYPES:
        raise ValueError(f"precision must be one of {tuple(ACT_DTYPES)}, got {precision!r}")
    dtype = ACT_DTYPES[precision]
    x = row_major(dtype, [m, k])
    w = row_major(torch.int32, [k // pack_factor(bits), n])
    s = row_major(scale_dtype or dtype, [k // group_size, n])
    y = row_major(partials_dtype(PARTIALS, dtype) if PARTIALS else dtype, [m, n])
    split = (SPLIT_K > 1 or STREAM) and not PARTIALS
    ws = row_major(torch.float32, [m * n, 1]) if split else y
    cnt = row_major(torch.int32, [_grid(m, n, BLOCK_M, BLOCK_N, SPLIT_K)[0], 1]) if split else y
    w_arg = _word_descriptor(w, BLOCK_N) if TMA else w
    x_arg = _x_descriptor(x, BLOCK_M, bits) if TMA == 2 else x
    return (x, x_arg, w_arg, s, y, ws, cnt, m, n, k, *x.stride(), *w.stride(), *s.stride(), *y.stride())


def compile_only(
    m: int,
    n: int,
    k: int,
    *,
    precision: str,
    bits: int,
    group_size: int,
    BLOCK_M: int,
    BLOCK_N: int,
    SPLIT_K: int,
    num_warps: int,
    num_stages: int = 2,
    UNROLL: int = 1,
    PREFETCH: int = 1,
    FAST_DECODE: int = 2,
    MAXNREG: int = 0,
    TMA: int = 0,
    SWAP: int = 0,
    STREAM: int = 0,
    PARTIALS: int = 0,
    PDL: int = 0,
    ACT: int = 0,
    scale_dtype: torch.dtype | None = None,
) -> Any | None:
    """Compile the kernel :func:`packed_matmul` launches for contiguous operands on this GPU, without launching.

    Returns the compiled kernel (None under the interpreter or without ``JITFunction.warmup``);
    raises ``OutOfResources`` past the device's shared memory and Triton's compile errors as they are.
    """
    check_layout(m, n, k, bits, group_size, BLOCK_M, BLOCK_N, SPLIT_K)
    if TMA:
        check_tma(n, BLOCK_N)
    meta = _meta(bits, group_size, BLOCK_M, BLOCK_N, SPLIT_K, UNROLL, num_warps, num_stages, PREFETCH, FAST_DECODE,
                 MAXNREG, TMA, SWAP, STREAM, PARTIALS, PDL, ACT)  # fmt: skip
    args = _mock_launch(m, n, k, precision, bits, group_size, BLOCK_M, BLOCK_N, SPLIT_K, scale_dtype, TMA, STREAM,
                        PARTIALS)  # fmt: skip
    warmup = getattr(packed_quant_kernel, "warmup", None)
    if interpreter_active() or warmup is None:
        return None
    from kernels.gemm.gemm import raise_if_over_shared_memory

    kernel = warmup(*args, **meta, grid=_grid(m, n, BLOCK_M, BLOCK_N, SPLIT_K))
    raise_if_over_shared_memory(kernel)
    return kernel


def compile_for_target(
    m: int, n: int, k: int, *, precision: str, bits: int, group_size: int, BLOCK_M: int, BLOCK_N: int, SPLIT_K: int,
    num_warps: int, num_stages: int = 2, UNROLL: int = 1, PREFETCH: int = 1, FAST_DECODE: int = 2,
    MAXNREG: int = 0, TMA: int = 0, SWAP: int = 0, STREAM: int = 0, PARTIALS: int = 0, PDL: int = 0, ACT: int = 0,
    capability: int = 90,
) -> Any:  # fmt: skip
    """``triton.compile`` for ``GPUTarget("cuda", capability, 32)`` with no GPU (ahead-of-time checks on a CPU)."""
    from kernels.attention.attention import compile_jit_for_target

    check_layout(m, n, k, bits, group_size, BLOCK_M, BLOCK_N, SPLIT_K)
    if TMA:
        check_tma(n, BLOCK_N)
    args = _mock_launch(m, n, k, precision, bits, group_size, BLOCK_M, BLOCK_N, SPLIT_K, None, TMA, STREAM, PARTIALS)
    meta = _meta(bits, group_size, BLOCK_M, BLOCK_N, SPLIT_K, UNROLL, num_warps, num_stages, PREFETCH, FAST_DECODE,
                 MAXNREG, TMA, SWAP, STREAM, PARTIALS, PDL, ACT)  # fmt: skip
    return compile_jit_for_target(packed_quant_kernel, args, meta, capability)


__all__ = [
    "BITS",
    "QMAX",
    "PackedWeights",
    "check_layout",
    "check_tma",
    "compile_for_target",
    "compile_only",
    "pack_weights",
    "packed_matmul",
    "quantize_packed",
    "repack",
    "unpack_weights",
]
