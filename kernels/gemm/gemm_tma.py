"""Persistent GEMM ``C = A @ B`` with TMA tensor descriptors (Hopper), optionally warp-specialized.

The kernel follows the tensor-descriptor persistent matmul of Triton's tutorial
(``09-persistent-matmul.py``): a grid of ``NUM_SMS`` programs walks the output tiles
``start, start + NUM_SMS, ...`` in GROUP_M-swizzled order, so each program keeps its
registers and pipeline across tiles instead of paying a launch and a prologue per tile.
A, B and C go through host-side tensor descriptors (``TensorDescriptor``): the copy
engine loads the operand tiles into swizzled shared memory (out-of-bounds rows and K
columns read as zeros, so any M, N, K work) and stores C tiles with clipping at the
edges. ``EPILOGUE_SUBTILE`` stores C in two BLOCK_M x BLOCK_N/2 halves, halving the
epilogue's shared-memory buffer (room for one more pipeline stage). With
``WARP_SPECIALIZE`` the tile loop is split by Triton into a producer partition (TMA
loads) and consumer warpgroups (wgmma), instead of one software pipeline.

Precisions: bf16 and fp16 (B row-major (K, N) or K-major), fp8 e4m3 with per-tensor
fp32 scales (B K-major, as Hopper's 8-bit wgmma reads it), output bf16.
``FP8_FAST_ACCUM=False`` promotes the fp8 partial sums into the fp32 accumulator every
BLOCK_K (cuBLAS's default); True lets the tensor cores accumulate the whole K in their
reduced-precision accumulator (``torch._scaled_mm(use_fast_accum=True)``).

``STREAM_K`` splits the last, partial wave of tiles by K iterations instead of by tiles
(stream-K, Osama et al. 2023): when ``num_tiles % NUM_SMS`` tiles are left after the full
waves, their ``tiles * k_tiles`` iterations are dealt out evenly, so every program does the
same work instead of a third of the SMs idling while the rest finish a whole tile (at
8192x4096x4096 with 128x256 tiles: 7 full waves and 100 tiles for 132 SMs). A tile whose
iterations span several programs is finished by the one holding its first iterations: the
others store fp32 partials into a per-program slot and raise a flag (release); the owner
waits for each flag (acquire, resetting it), adds the partials and stores the tile. Programs
take their shares in reverse order of program id, so an owner only waits for programs with
lower ids (which the interpreter, running programs in order, has finished). The slots and
flags are cached per device: launches on one device must not overlap.

TMA needs 16-byte aligned row strides: K * element bytes for A (and K-major B),
N * element bytes for row-major B and for C. :func:`tma_strides_aligned` says whether a
shape qualifies; :func:`matmul_persistent` raises otherwise.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernels.gemm.gemm import (
    INPUT_DTYPES,
    OUTPUT_DTYPES,
    check_operands,
    device_sms,
    operand_strides,
    raise_if_over_shared_memory,
    strided_mock,
)
from kernels.launch import Descriptors, Plan, PlanCache, layout_key
from kernels.runtime import interpreter_active

#: Precisions of this kernel (fp32/tf32 stay with the tutorial kernel of ``kernels/gemm/gemm.py``).
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8")
#: Bytes per element of A/B and of C, per precision.
IN_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1}
OUT_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 2}
TMA_ALIGN_BYTES = 16


def tma_strides_aligned(m: int, n: int, k: int, precision: str) -> bool:
    """Whether every row stride the descriptors use is a multiple of 16 bytes (TMA's rule)."""
    in_bytes, out_bytes = IN_BYTES[precision], OUT_BYTES[precision]
    b_row = k * in_bytes if precision == "fp8" else n * in_bytes
    return all(s % TMA_ALIGN_BYTES == 0 for s in (k * in_bytes, b_row, n * out_bytes))


@triton.jit
def _tile_coords(tile_id, num_pid_in_group, num_pid_m, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of a linear tile index, GROUP_M row-tiles sharing each column-tile."""
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _k_loop(a_desc, b_desc, accumulator, offs_am, offs_bn, k_lo, k_hi, BLOCK_K: tl.constexpr,
            B_K_MAJOR: tl.constexpr, FP8_FAST_ACCUM: tl.constexpr):  # fmt: skip
    """Accumulate the K iterations ``k_lo .. k_hi-1`` of one tile."""
    for ki in range(k_lo, k_hi):
        offs_k = ki * BLOCK_K
        a = a_desc.load([offs_am, offs_k])
        if B_K_MAJOR:
            b = b_desc.load([offs_bn, offs_k]).T
        else:
            b = b_desc.load([offs_k, offs_bn])
        if FP8_FAST_ACCUM:
            accumulator = tl.dot(a, b, accumulator)
        else:
            accumulator = tl.dot(a, b, accumulator, max_num_imprecise_acc=BLOCK_K)
    return accumulator


@triton.jit
def _store_tile(c_desc, accumulator, offs_cm, offs_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                EPILOGUE_SUBTILE: tl.constexpr):  # fmt: skip
    dtype = c_desc.dtype
    if EPILOGUE_SUBTILE:
        acc = tl.reshape(accumulator, (BLOCK_M, 2, BLOCK_N // 2))
        acc = tl.permute(acc, (0, 2, 1))
        acc0, acc1 = tl.split(acc)
        c_desc.store([offs_cm, offs_cn], acc0.to(dtype))
        c_desc.store([offs_cm, offs_cn + BLOCK_N // 2], acc1.to(dtype))
    else:
        c_desc.store([offs_cm, offs_cn], accumulator.to(dtype))


@triton.jit
def _stream_k_tail(a_desc, b_desc, c_desc, partials_ptr, flags_ptr, scale, first_tile, sk_tiles, k_tiles,
                   num_pid_in_group, num_pid_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                   EPILOGUE_SUBTILE: tl.constexpr, B_K_MAJOR: tl.constexpr, HAS_SCALE: tl.constexpr,
                   FP8_FAST_ACCUM: tl.constexpr):  # fmt: skip
    """The tiles ``first_tile ..`` (``sk_tiles`` of them) split by K iterations over all programs."""
    pid = tl.program_id(axis=0)
    rank = NUM_SMS - 1 - pid  # owners wait only for lower program ids
    total = sk_tiles * k_tiles
    share = tl.cdiv(total, NUM_SMS)
    it = rank * share
    it_end = tl.minimum(it + share, total)
    tile_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    while it < it_end:
        tile = it // k_tiles
        t_start = tile * k_tiles
        t_end = t_start + k_tiles
        seg_end = tl.minimum(it_end, t_end)
        pid_m, pid_n = _tile_coords(first_tile + tile, num_pid_in_group, num_pid_m, GROUP_M)
        accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        accumulator = _k_loop(a_desc, b_desc, accumulator, pid_m * BLOCK_M, pid_n * BLOCK_N, it - t_start,
                              seg_end - t_start, BLOCK_K, B_K_MAJOR, FP8_FAST_ACCUM)  # fmt: skip
        if it == t_start:  # the owner: add the partials of the ranks whose shares start inside the tile
            for r in range(t_start // share + 1, (t_end - 1) // share + 1):
                src = NUM_SMS - 1 - r
                flag = tl.atomic_cas(flags_ptr + src, 1, 0, sem="acquire")
                while flag != 1:
                    flag = tl.atomic_cas(flags_ptr + src, 1, 0, sem="acquire")
                part = tl.load(partials_ptr + src * BLOCK_M * BLOCK_N + tile_offs, cache_modifier=".cg")
                accumulator += part
            if HAS_SCALE:
                accumulator = accumulator * scale
            _store_tile(c_desc, accumulator, pid_m * BLOCK_M, pid_n * BLOCK_N, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
        else:  # a share's first segment, inside a tile another program owns: publish it
            tl.store(partials_ptr + pid * BLOCK_M * BLOCK_N + tile_offs, accumulator)
            tl.debug_barrier()
            tl.atomic_xchg(flags_ptr + pid, 1, sem="release")
        it = seg_end


@triton.jit
def matmul_tma_persistent_kernel(
    a_desc,
    b_desc,
    c_desc,
    scale_a_ptr,
    scale_b_ptr,
    partials_ptr,
    flags_ptr,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    B_K_MAJOR: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    FP8_FAST_ACCUM: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    FLATTEN: tl.constexpr,
    STREAM_K: tl.constexpr,
):
    """Programs ``0 .. NUM_SMS-1`` each compute the C tiles ``pid, pid + NUM_SMS, ...`` (with ``STREAM_K``,
    those of the full waves; then the remaining tiles' K iterations are shared out)."""
    start_pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    num_pid_in_group = GROUP_M * num_pid_n
    scale = 1.0
    if HAS_SCALE:
        scale = tl.load(scale_a_ptr) * tl.load(scale_b_ptr)
    dp_tiles = num_tiles
    if STREAM_K:
        if num_tiles > NUM_SMS:
            dp_tiles = num_tiles - num_tiles % NUM_SMS
    # The epilogue recomputes its tile from its own counter: one value used by both the
    # prologue and the epilogue of the flattened loop defeats the pipeliner.
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, dp_tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_in_group, num_pid_m, GROUP_M)
        accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        accumulator = _k_loop(a_desc, b_desc, accumulator, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, k_tiles, BLOCK_K,
                              B_K_MAJOR, FP8_FAST_ACCUM)  # fmt: skip
        if HAS_SCALE:
            accumulator = accumulator * scale
        tile_id_c += NUM_SMS
        pid_m, pid_n = _tile_coords(tile_id_c, num_pid_in_group, num_pid_m, GROUP_M)
        _store_tile(c_desc, accumulator, pid_m * BLOCK_M, pid_n * BLOCK_N, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
    if STREAM_K:
        if dp_tiles < num_tiles:
            _stream_k_tail(a_desc, b_desc, c_desc, partials_ptr, flags_ptr, scale, dp_tiles, num_tiles - dp_tiles,
                           k_tiles, num_pid_in_group, num_pid_m, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_SMS,
                           EPILOGUE_SUBTILE, B_K_MAJOR, HAS_SCALE, FP8_FAST_ACCUM)  # fmt: skip


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"the persistent TMA kernel takes precision {PRECISIONS}, got {precision!r}")


def _b_k_major(b_strides: tuple[int, int]) -> bool:
    return b_strides[0] == 1 and b_strides[1] != 1


def _descriptors(
    a: Any, b: Any, c: Any, m: int, n: int, k: int, b_k_major: bool, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int,
    subtile: bool,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """Host-side descriptors of A (M, K), B ((N, K) when K-major, else (K, N)) and C (M, N)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    a_desc = TensorDescriptor(a, [m, k], [k, 1], [BLOCK_M, BLOCK_K])
    if b_k_major:
        b_desc = TensorDescriptor(b, [n, k], [k, 1], [BLOCK_N, BLOCK_K])
    else:
        b_desc = TensorDescriptor(b, [k, n], [n, 1], [BLOCK_K, BLOCK_N])
    c_desc = TensorDescriptor(c, [m, n], [n, 1], [BLOCK_M, BLOCK_N // 2 if subtile else BLOCK_N])
    return a_desc, b_desc, c_desc


def _plan_descriptors(a: Any, b: Any, c: Any, tile: tuple[Any, ...]) -> tuple[Any, Any, Any]:
    """:func:`_descriptors` of a plan's operands: ``tile`` is (M, N, K, B K-major, BLOCK_M, BLOCK_N, BLOCK_K,
    epilogue subtile); a K-major B's descriptor spans the underlying (N, K) buffer."""
    return _descriptors(a, b.t() if tile[3] else b, c, *tile)


def _meta_args(
    precision: str,
    b_k_major: bool,
    *,
    BLOCK_M: int,
    BLOCK_N: int,
    BLOCK_K: int,
    GROUP_M: int,
    num_warps: int,
    num_stages: int,
    num_sms: int,
    epilogue_subtile: bool,
    warp_specialize: bool,
    fp8_fast_accum: bool,
    flatten: bool,
    stream_k: bool,
) -> dict[str, Any]:
    """The kernel's constexpr and launch arguments for one config (shared by launch and compile-ahead)."""
    return {
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": BLOCK_N,
        "BLOCK_K": BLOCK_K,
        "GROUP_M": GROUP_M,
        "NUM_SMS": num_sms,
        "EPILOGUE_SUBTILE": bool(epilogue_subtile),
        "B_K_MAJOR": bool(b_k_major),
        "HAS_SCALE": precision == "fp8",
        # Only 8-bit operands accumulate imprecisely; 16-bit ones ignore the setting.
        "FP8_FAST_ACCUM": precision != "fp8" or bool(fp8_fast_accum),
        "WARP_SPECIALIZE": bool(warp_specialize),
        "FLATTEN": bool(flatten),
        "STREAM_K": bool(stream_k),
        "num_warps": num_warps,
        "num_stages": num_stages,
    }


def num_programs(m: int, n: int, BLOCK_M: int, BLOCK_N: int, num_sms: int) -> int:
    """Programs launched: one per SM (``num_sms``), or fewer when there are fewer tiles."""
    return max(1, min(num_sms, triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N)))


#: (device, programs, BLOCK_M, BLOCK_N) -> the stream-K tail's fp32 partial slots and flags (left zero by launches).
_STREAM_K_BUFFERS: dict[tuple[str, int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def stream_k_buffers(
    device: torch.device, programs: int, BLOCK_M: int, BLOCK_N: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One BLOCK_M x BLOCK_N fp32 slot and one flag per program, allocated once per device and tile."""
    key = (str(device), programs, BLOCK_M, BLOCK_N)
    if key not in _STREAM_K_BUFFERS:
        partials = torch.empty((programs, BLOCK_M, BLOCK_N), device=device, dtype=torch.float32)
        _STREAM_K_BUFFERS[key] = (partials, torch.zeros(programs, device=device, dtype=torch.int32))
    return _STREAM_K_BUFFERS[key]


#: :func:`matmul_persistent`'s launch plans.
_PLANS = PlanCache()


def matmul_persistent(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    precision: str,
    BLOCK_M: int,
    BLOCK_N: int,
    BLOCK_K: int,
    GROUP_M: int,
    num_warps: int,
    num_stages: int,
    num_sms: int | None = None,
    epilogue_subtile: bool = False,
    warp_specialize: bool = False,
    fp8_fast_accum: bool = True,
    flatten: bool = True,
    stream_k: bool = False,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``C = A @ B`` (times ``scale_a * scale_b`` for fp8) with the persistent TMA kernel.

    ``a`` (M, K) row-major and ``b`` (K, N) either row-major or K-major (the transpose of a
    contiguous (N, K); required for fp8), in ``INPUT_DTYPES[precision]``; ``out`` (M, N)
    contiguous in ``OUTPUT_DTYPES[precision]``. ``num_sms`` programs are launched (default, the
    natural value: the device's multiprocessor count, :func:`kernels.gemm.gemm.device_sms`; with ``stream_k``
    they must all be resident at once, as one per SM is). Launches asynchronously.
    """
    num_sms = device_sms(a.device) if num_sms is None else num_sms
    key = (layout_key(a, b, scale_a, scale_b, out), a.device, precision, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
           num_warps, num_stages, num_sms, epilogue_subtile, warp_specialize, fp8_fast_accum, flatten,
           stream_k)  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        _check_precision(precision)
        m, n, k = check_operands(a, b, precision, scale_a, scale_b)
        if a.stride() != (k, 1):
            raise ValueError(f"A must be row-major (M, K), got strides {a.stride()}")
        b_k_major = _b_k_major(b.stride())
        if b.stride() not in ((n, 1), (1, k)) or (precision == "fp8" and not b_k_major):
            raise ValueError(f"B must be row-major (K, N) or K-major (fp8: K-major), got strides {b.stride()}")
        if not tma_strides_aligned(m, n, k, precision):
            raise ValueError(f"TMA needs 16-byte aligned rows: {m}x{n}x{k} in {precision} is not")
        if out is None:
            out = torch.empty((m, n), device=a.device, dtype=OUTPUT_DTYPES[precision])
        elif out.shape != (m, n) or out.dtype != OUTPUT_DTYPES[precision] or not out.is_contiguous():
            raise ValueError(f"out must be contiguous ({m}, {n}) {OUTPUT_DTYPES[precision]}, got {tuple(out.shape)}")
        meta = _meta_args(
            precision, b_k_major, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
            num_warps=num_warps, num_stages=num_stages, num_sms=num_sms, epilogue_subtile=epilogue_subtile,
            warp_specialize=warp_specialize, fp8_fast_accum=fp8_fast_accum, flatten=flatten, stream_k=stream_k,
        )  # fmt: skip
        programs = num_programs(m, n, BLOCK_M, BLOCK_N, num_sms)
        buffers = stream_k_buffers(a.device, programs, BLOCK_M, BLOCK_N) if stream_k else None
        plan = _PLANS.put(key, Plan(
            matmul_tma_persistent_kernel, (programs,), meta, ints=(m, n, k), buffers=buffers,
            out=((m, n), OUTPUT_DTYPES[precision]), descs=Descriptors(),
            tile=(m, n, k, b_k_major, BLOCK_M, BLOCK_N, BLOCK_K, epilogue_subtile),
        ))  # fmt: skip
    elif out is None:
        shape, dtype = plan.state["out"]
        out = torch.empty(shape, device=a.device, dtype=dtype)
    state = plan.state
    # B's descriptor spans the underlying (N, K) buffer when K-major.
    descs = state["descs"].get((a.data_ptr(), b.data_ptr(), out.data_ptr()), _plan_descriptors, a, b, out,
                               state["tile"])  # fmt: skip
    partials, flags = state["buffers"] or (out, out)
    if precision == "fp8":
        plan.launch(*descs, scale_a, scale_b, partials, flags, *state["ints"])
    else:
        plan.launch(*descs, out, out, partials, flags, *state["ints"])
    return out


def _mock_args(m: int, n: int, k: int, precision: str, tile: dict[str, Any]) -> tuple[tuple[Any, ...], bool]:
    """Placeholder arguments of a launch (no memory), laid out as :func:`kernels.gemm.gemm.quantize_inputs` does."""
    strides = operand_strides(m, n, k, precision)
    b_k_major = _b_k_major(strides["b"])
    a = strided_mock(INPUT_DTYPES[precision], [m, k], (k, 1))
    b = strided_mock(INPUT_DTYPES[precision], [n, k] if b_k_major else [k, n], (k, 1) if b_k_major else (n, 1))
    c = strided_mock(OUTPUT_DTYPES[precision], [m, n], (n, 1))
    descs = _descriptors(
        a, b, c, m, n, k, b_k_major, tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"], tile["epilogue_subtile"]
    )
    scale = strided_mock(torch.float32, [1], (1,))
    flags = strided_mock(torch.int32, [1], (1,))
    return (*descs, scale, scale, scale, flags, m, n, k), b_k_major


def compile_only(m: int, n: int, k: int, *, precision: str, **tile: Any) -> Any | None:
    """Compile the kernel :func:`matmul_persistent` launches for M x N x K, without launching it.

    ``tile`` holds the keyword arguments of :func:`matmul_persistent` from BLOCK_M to flatten.
    As :func:`kernels.gemm.gemm.compile_only`: the later launch finds the binary in Triton's cache;
    raises ``OutOfResources`` over the device's shared memory; None under the interpreter.
    """
    _check_precision(precision)
    if interpreter_active():
        return None
    tile = _with_defaults(tile)
    args, b_k_major = _mock_args(m, n, k, precision, tile)
    meta = _meta_args(precision, b_k_major, **tile)
    grid = (num_programs(m, n, tile["BLOCK_M"], tile["BLOCK_N"], tile["num_sms"]),)
    kernel = matmul_tma_persistent_kernel.warmup(*args, **meta, grid=grid)
    raise_if_over_shared_memory(kernel)
    return kernel


def compile_for_target(m: int, n: int, k: int, *, precision: str, capability: int = 90, **tile: Any) -> Any:
    """``triton.compile`` of the kernel for ``GPUTarget("cuda", capability, 32)``, with no GPU.

    For checking configs ahead of time on a CPU machine (shared memory, registers, SASS);
    see :func:`kernels.attention.attention.compile_jit_for_target` for what it relies on.
    """
    from kernels.attention.attention import compile_jit_for_target

    _check_precision(precision)
    tile = _with_defaults(tile)
    args, b_k_major = _mock_args(m, n, k, precision, tile)
    meta = _meta_args(precision, b_k_major, **tile)
    return compile_jit_for_target(matmul_tma_persistent_kernel, args, meta, capability)


def _with_defaults(tile: dict[str, Any]) -> dict[str, Any]:
    defaults = {
        "epilogue_subtile": False,
        "warp_specialize": False,
        "fp8_fast_accum": True,
        "flatten": True,
        "stream_k": False,
    }
    return {**defaults, **tile}
