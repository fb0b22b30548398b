"""Weight-only quantized GEMM ``Y = X @ dequant(W)`` in Triton, with the quantizer and a torch reference.

X (M, K) is bf16 or fp16 (the activations); W (K, N) is quantized once,
symmetric per group of ``group_size`` consecutive K rows and per output
column, to int8 or int4, with one scale per (group, column) in fp16 or bf16.
Y (M, N) is in X's dtype; products accumulate in fp32.

Storage layout (what :func:`quantize_weights` produces and :func:`quant_matmul` reads):

| bits | ``qweight``                  | element ``[r, n]``                                                |
| ---- | ---------------------------- | ----------------------------------------------------------------- |
| 8    | int8 (K, N), row-major       | ``q[r, n]`` in [-127, 127], two's complement                      |
| 4    | int8 (K // 2, N), row-major  | low nibble ``q[2r, n] + 8``, high nibble ``q[2r + 1, n] + 8``      |

``scales`` is (K // group_size, N), row-major; ``W[k, n] ~= q[k, n] * scales[k // group_size, n]``.
int4 values lie in [-7, 7] and are stored offset-binary (``q + 8``, 1..15) two per byte along K:
row ``r`` of the packed tensor holds K rows ``2r`` (low nibble) and ``2r + 1`` (high nibble), so
one byte never straddles a group (group sizes are even) and a column stays contiguous in N.

The kernel decodes int4 with the exponent trick instead of an int-to-float conversion:
``bits(MAGIC | u)`` read as bf16 is ``128 + u`` (fp16: ``1024 + u``), exact for a nibble ``u``,
so ``q = that - (128 + 8)`` takes two integer ops and one subtraction per weight. int8 is
converted with a plain cast (exact: |q| <= 127 fits both 16-bit formats).

Scaling: when ``BLOCK_K <= group_size`` one K tile lies inside one group (both are powers of
two and tiles start at multiples of BLOCK_K), so the kernel multiplies the exact integer weights
by X in fp32 and scales the tile's partial product once per column (``acc += (X @ q) * s``):
no per-weight multiply and no rounding of dequantized weights. With ``BLOCK_K > group_size``
it dequantizes the tile (``q * s``, rounded to X's dtype) before ``tl.dot``.

Split-K (``SPLIT_K > 1``): program ``(tile, s)`` covers K rows ``[s * K / SPLIT_K, (s + 1) * K /
SPLIT_K)`` and adds its fp32 partial into an fp32 workspace with ``tl.atomic_add``; the wrapper
zeroes the workspace before the launch and casts it into Y after it (three kernels, all on the
current stream, all capturable in a CUDA graph). Programs are ordered with the M tiles fastest,
so the programs that read the same weight tile run together and the weights (the large operand
at decode shapes) come from HBM once.

Swapped operands (``SWAP_AB``, tl.dot tiles): the tile is computed as ``Y^T = dequant(W)^T @ X^T``,
so the decoded weights are the dot's first operand. On Hopper, wgmma reads its first operand from
registers and only its second from shared memory: the weights, decoded in registers, need no trip
through shared memory, and X^T (a few rows at decode shapes) is the staged operand.

GEMV (``BLOCK_M == 1``, for decode with a handful of rows): a second kernel,
:func:`quant_gemv_kernel`, without ``tl.dot`` (which needs 16 rows and would pad one row to 16).
Program ``(m, tile, s)`` handles one row of X, ``BLOCK_N`` columns and one K split; it multiplies
the decoded weights by X on the CUDA cores into a (stored rows, BLOCK_N) fp32 accumulator and
reduces over K once, after its loop. Nibbles and int8 values become fp32 with the exponent trick
(``bits(0x4B000000 | u)`` is ``2**23 + u``): an integer OR and one subtraction per weight, since
int-to-float conversions run at a quarter of the FMA rate and would bound the kernel below the HBM
bandwidth. The M programs that read the same weight tile run next to each other (M fastest), so
the weights come from HBM once. Split-K works as above.

Rows and columns past the edge wrap around (``% M``, ``% N``) so loads stay in bounds, and
stores are masked; K must be a multiple of ``SPLIT_K * BLOCK_K`` (checked).

Under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors; bf16 ``tl.dot`` is wrong there
(Triton 3.9), so bf16 numerics are checked on a GPU only; fp16 is exact enough to test.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernels.launch import Plan, PlanCache, layout_key
from kernels.quant.quant_weights import (
    ACT_DTYPES,
    BITS,
    CLIP_RATIOS,
    INT4_OFFSET,
    QMAX,
    QuantizedWeights,
    _is_pow2,
    dequantize_groups,
    pack_int4,
    quantize_groups,
    quantize_weights,
    reference_quant_matmul,
    unpack_int4,
)
from kernels.runtime import interpreter_active

#: Smallest BLOCK_K per bit width: ``tl.dot`` needs K >= 16 per dot, and int4 splits a tile in two halves.
MIN_BLOCK_K: dict[int, int] = {4: 32, 8: 16}


@triton.jit
def _tile_coords(M, K, BLOCK_M: tl.constexpr, SPLIT_K: tl.constexpr):
    """This program's (pid_m, pid_n, k_begin, k_per_split): M tiles fastest, so that the programs
    sharing a weight tile run together and the weights come from HBM once."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    k_per_split = K // SPLIT_K
    return pid % num_pid_m, pid // num_pid_m, tl.program_id(1) * k_per_split, k_per_split


@triton.jit
def _decode_int4(stored, dtype: tl.constexpr, MAGIC: tl.constexpr, MAGIC_OFFSET: tl.constexpr):
    """The low and high nibbles of packed int4 bytes as exact ``dtype`` integers (the exponent trick)."""
    u = stored.to(tl.uint8, bitcast=True).to(tl.int16)
    lo = ((u & 15) | MAGIC).to(tl.int16)
    hi = ((u >> 4) | MAGIC).to(tl.int16)
    return (lo.to(dtype, bitcast=True) - MAGIC_OFFSET).to(dtype), (hi.to(dtype, bitcast=True) - MAGIC_OFFSET).to(dtype)


@triton.jit
def _write_tile(
    acc, y_ptr, ws_ptr, rows, cols, row_bound, col_bound, y_row_stride, y_col_stride, ws_row_stride, ws_col_stride,
    SPLIT_K: tl.constexpr,
):  # fmt: skip
    """Store a finished tile into Y, or with split-K add it into the fp32 workspace the wrapper zeroed
    (a contiguous (M, N) buffer); ``rows``/``cols`` index the tile's two axes."""
    mask = (rows[:, None] < row_bound) & (cols[None, :] < col_bound)
    if SPLIT_K == 1:
        y_ptrs = y_ptr + rows[:, None] * y_row_stride + cols[None, :] * y_col_stride
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        ws_ptrs = ws_ptr + rows[:, None] * ws_row_stride + cols[None, :] * ws_col_stride
        tl.atomic_add(ws_ptrs, acc, mask=mask, sem="relaxed")


@triton.jit
def quant_matmul_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    ws_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wk,
    stride_wn,
    stride_sg,
    stride_sn,
    stride_ym,
    stride_yn,
    BITS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    MAGIC: tl.constexpr,
    MAGIC_OFFSET: tl.constexpr,
    SWAP_AB: tl.constexpr = False,
):
    """One (BLOCK_M, BLOCK_N) tile of Y over one K split (see the module docstring for layouts)."""
    if SWAP_AB:
        _quant_matmul_tile_swapped(
            x_ptr, w_ptr, s_ptr, y_ptr, ws_ptr, M, N, K, stride_xm, stride_xk, stride_wk, stride_wn, stride_sg,
            stride_sn, stride_ym, stride_yn, BITS, GROUP_SIZE, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, MAGIC,
            MAGIC_OFFSET,
        )  # fmt: skip
    else:
        pid_m, pid_n, k_begin, k_per_split = _tile_coords(M, K, BLOCK_M, SPLIT_K)
        PACK: tl.constexpr = 8 // BITS  # K rows per stored byte
        ROWS: tl.constexpr = BLOCK_K // PACK  # stored rows per K tile

        offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        offs_r = tl.arange(0, ROWS)
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_begin + offs_k)[None, :] * stride_xk
        w_ptrs = w_ptr + (k_begin // PACK + offs_r)[:, None] * stride_wk + offs_n[None, :] * stride_wn
        dtype = x_ptr.dtype.element_ty

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in range(0, k_per_split // BLOCK_K):
            k0 = k_begin + i * BLOCK_K
            stored = tl.load(w_ptrs)
            x = tl.load(x_ptrs)
            if BITS == 8:
                x0 = x
                q0 = stored.to(dtype)
            else:
                # Even and odd K columns of X meet the low and high nibbles (loaded contiguous, split in registers).
                x0, x1 = tl.split(tl.reshape(x, (BLOCK_M, ROWS, 2)))
                q0, q1 = _decode_int4(stored, dtype, MAGIC, MAGIC_OFFSET)
            if BLOCK_K <= GROUP_SIZE:
                # The whole K tile is one group: exact integer weights, one scale per column after the dot.
                scale = tl.load(s_ptr + (k0 // GROUP_SIZE) * stride_sg + offs_n * stride_sn).to(tl.float32)
                part = tl.dot(x0, q0)
                if BITS == 4:
                    part = tl.dot(x1, q1, part)
                acc += part * scale[None, :]
            else:
                # Several groups per tile: dequantize each weight (both nibbles of a byte share a group).
                groups = (k0 + offs_r * PACK) // GROUP_SIZE
                scale = tl.load(s_ptr + groups[:, None] * stride_sg + offs_n[None, :] * stride_sn).to(tl.float32)
                acc = tl.dot(x0, (q0.to(tl.float32) * scale).to(dtype), acc)
                if BITS == 4:
                    acc = tl.dot(x1, (q1.to(tl.float32) * scale).to(dtype), acc)
            x_ptrs += BLOCK_K * stride_xk
            w_ptrs += ROWS * stride_wk

        offs_ym = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_yn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        _write_tile(acc, y_ptr, ws_ptr, offs_ym, offs_yn, M, N, stride_ym, stride_yn, N, 1, SPLIT_K)


@triton.jit
def _quant_matmul_tile_swapped(
    x_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    ws_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wk,
    stride_wn,
    stride_sg,
    stride_sn,
    stride_ym,
    stride_yn,
    BITS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    MAGIC: tl.constexpr,
    MAGIC_OFFSET: tl.constexpr,
):
    """The tile as ``Y^T = dequant(W)^T @ X^T`` (``SWAP_AB``): the decoded weights are the dot's first
    operand, which Hopper's wgmma reads from registers, and X^T (small at decode shapes) the second,
    staged through shared memory; the accumulator is (BLOCK_N, BLOCK_M)."""
    pid_m, pid_n, k_begin, k_per_split = _tile_coords(M, K, BLOCK_M, SPLIT_K)
    PACK: tl.constexpr = 8 // BITS
    ROWS: tl.constexpr = BLOCK_K // PACK

    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_r = tl.arange(0, ROWS)
    # X^T rows: K row PACK * r (+ 1 for the high nibbles) of each stored weight row r.
    xt_ptrs = x_ptr + (k_begin + offs_r * PACK)[:, None] * stride_xk + offs_m[None, :] * stride_xm
    wt_ptrs = w_ptr + (k_begin // PACK + offs_r)[None, :] * stride_wk + offs_n[:, None] * stride_wn
    dtype = x_ptr.dtype.element_ty

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for i in range(0, k_per_split // BLOCK_K):
        k0 = k_begin + i * BLOCK_K
        stored = tl.load(wt_ptrs)
        x0 = tl.load(xt_ptrs)
        if BITS == 8:
            q0 = stored.to(dtype)
        else:
            x1 = tl.load(xt_ptrs + stride_xk)
            q0, q1 = _decode_int4(stored, dtype, MAGIC, MAGIC_OFFSET)
        if BLOCK_K <= GROUP_SIZE:
            scale = tl.load(s_ptr + (k0 // GROUP_SIZE) * stride_sg + offs_n * stride_sn).to(tl.float32)
            part = tl.dot(q0, x0)
            if BITS == 4:
                part = tl.dot(q1, x1, part)
            acc += part * scale[:, None]
        else:
            groups = (k0 + offs_r * PACK) // GROUP_SIZE
            scale = tl.load(s_ptr + groups[None, :] * stride_sg + offs_n[:, None] * stride_sn).to(tl.float32)
            acc = tl.dot((q0.to(tl.float32) * scale).to(dtype), x0, acc)
            if BITS == 4:
                acc = tl.dot((q1.to(tl.float32) * scale).to(dtype), x1, acc)
        xt_ptrs += BLOCK_K * stride_xk
        wt_ptrs += ROWS * stride_wk

    offs_ym = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_yn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _write_tile(acc, y_ptr, ws_ptr, offs_yn, offs_ym, N, M, stride_yn, stride_ym, 1, N, SPLIT_K)


@triton.jit
def quant_gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    ws_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wk,
    stride_wn,
    stride_sg,
    stride_sn,
    stride_ym,
    stride_yn,
    BITS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """Row ``m`` of Y, BLOCK_N columns, one K split, on the CUDA cores (see the module docstring)."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = pid % M  # rows fastest: the programs reading one weight tile run together
    pid_n = pid // M
    PACK: tl.constexpr = 8 // BITS
    ROWS: tl.constexpr = BLOCK_K // PACK
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_r = tl.arange(0, ROWS)
    k_per_split = K // SPLIT_K
    k_begin = pid_k * k_per_split
    w_ptrs = w_ptr + (k_begin // PACK + offs_r)[:, None] * stride_wk + offs_n[None, :] * stride_wn
    x_ptrs = x_ptr + m * stride_xm + (k_begin + offs_r * PACK) * stride_xk

    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for i in range(0, k_per_split // BLOCK_K):
        k0 = k_begin + i * BLOCK_K
        stored = tl.load(w_ptrs)
        x0 = tl.load(x_ptrs).to(tl.float32)
        if BITS == 8:
            u = stored.to(tl.int32) + 128
            part = x0[:, None] * ((u | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0)
        else:
            x1 = tl.load(x_ptrs + stride_xk).to(tl.float32)
            u = stored.to(tl.uint8, bitcast=True).to(tl.int32)
            lo = ((u & 15) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
            hi = ((u >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
            part = x0[:, None] * lo + x1[:, None] * hi
        if BLOCK_K <= GROUP_SIZE:
            scale = tl.load(s_ptr + (k0 // GROUP_SIZE) * stride_sg + offs_n * stride_sn).to(tl.float32)
            acc += part * scale[None, :]
        else:
            groups = (k0 + offs_r * PACK) // GROUP_SIZE
            scale = tl.load(s_ptr + groups[:, None] * stride_sg + offs_n[None, :] * stride_sn).to(tl.float32)
            acc += part * scale
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += ROWS * stride_wk

    y = tl.sum(acc, axis=0)
    offs_yn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs_yn < N
    if SPLIT_K == 1:
        tl.store(y_ptr + m * stride_ym + offs_yn * stride_yn, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(ws_ptr + m * N + offs_yn, y, mask=mask, sem="relaxed")


# --------------------------------------------------------------------------- launch


def _magic(dtype: torch.dtype) -> tuple[int, float]:
    """``(MAGIC, MAGIC_OFFSET)``: bits of 128.0 (bf16) or 1024.0 (fp16), and that value plus the nibble offset."""
    if dtype == torch.bfloat16:
        return 0x4300, 128.0 + INT4_OFFSET
    return 0x6400, 1024.0 + INT4_OFFSET


def check_layout(m: int, n: int, k: int, bits: int, group_size: int, BLOCK_K: int, SPLIT_K: int) -> None:
    """Raise ValueError (naming the argument) for a shape / quantization / tiling the kernel cannot run."""
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if not _is_pow2(group_size) or group_size < 16 or k % group_size:
        raise ValueError(f"group_size must be a power of two >= 16 dividing K={k}, got {group_size!r}")
    if not _is_pow2(BLOCK_K) or BLOCK_K < MIN_BLOCK_K[bits]:
        raise ValueError(f"BLOCK_K must be a power of two >= {MIN_BLOCK_K[bits]} for int{bits}, got {BLOCK_K!r}")
    if SPLIT_K < 1 or k % (SPLIT_K * BLOCK_K):
        raise ValueError(f"SPLIT_K * BLOCK_K = {SPLIT_K} * {BLOCK_K} must divide K={k}")
    if m < 1 or n < 1:
        raise ValueError(f"M and N must be positive, got {m} and {n}")


def _grid(m: int, n: int, BLOCK_M: int, BLOCK_N: int, SPLIT_K: int) -> tuple[int, int]:
    return (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N), SPLIT_K)


def _kernel_and_meta(
    dtype: torch.dtype,
    bits: int,
    group_size: int,
    BLOCK_M: int,
    BLOCK_N: int,
    BLOCK_K: int,
    SPLIT_K: int,
    num_warps: int,
    num_stages: int,
    SWAP_AB: int = 0,
) -> tuple[Any, dict[str, Any]]:
    """The kernel one config launches (GEMV for BLOCK_M == 1) and its constexpr and launch arguments
    (shared by launch and warm-up)."""
    meta = {
        "BITS": bits,
        "GROUP_SIZE": group_size,
        "BLOCK_N": BLOCK_N,
        "BLOCK_K": BLOCK_K,
        "SPLIT_K": SPLIT_K,
        "num_warps": num_warps,
        "num_stages": num_stages,
    }
    if BLOCK_M == 1:
        return quant_gemv_kernel, meta
    magic, magic_offset = _magic(dtype)
    extra = {"BLOCK_M": BLOCK_M, "MAGIC": magic, "MAGIC_OFFSET": magic_offset, "SWAP_AB": bool(SWAP_AB)}
    return quant_matmul_kernel, {**meta, **extra}


#: :func:`quant_matmul`'s launch plans.
_PLANS = PlanCache()


def quant_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    *,
    bits: int,
    group_size: int,
    BLOCK_M: int,
    BLOCK_N: int,
    BLOCK_K: int,
    SPLIT_K: int,
    num_warps: int,
    num_stages: int,
    SWAP_AB: int = 0,
    out: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """``Y = X @ dequant(qweight, scales)`` with one tile config; returns Y (written into ``out`` if given).

    ``x`` (M, K) bf16/fp16; ``qweight`` int8 (K, N) for 8 bits or (K // 2, N) for 4 bits and
    ``scales`` (K // group_size, N) fp16/bf16, as :func:`quantize_weights` lays them out; ``out``
    (M, N) in x's dtype. With ``SPLIT_K > 1`` the partial products go through ``workspace``, a
    contiguous (M, N) float32 tensor (allocated when None) that this function zeroes first and
    casts into ``out`` last. Launches asynchronously on the current stream.
    """
    key = (layout_key(x, qweight, scales, out, workspace), x.device, bits, group_size, BLOCK_M, BLOCK_N, BLOCK_K,
           SPLIT_K, num_warps, num_stages, SWAP_AB)  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        if x.dtype not in ACT_DTYPES.values():
            raise ValueError(f"x must be bfloat16 or float16, got {x.dtype}")
        if x.ndim != 2 or qweight.ndim != 2 or scales.ndim != 2:
            raise ValueError("x, qweight and scales must be 2-D")
        m, k = x.shape
        n = qweight.shape[1]
        check_layout(m, n, k, bits, group_size, BLOCK_K, SPLIT_K)
        if qweight.dtype != torch.int8 or qweight.shape[0] * (8 // bits) != k:
            raise ValueError(
                f"qweight must be int8 ({k * bits // 8}, {n}) for int{bits}, got {qweight.dtype} {tuple(qweight.shape)}"
            )
        if scales.dtype not in ACT_DTYPES.values() or tuple(scales.shape) != (k // group_size, n):
            raise ValueError(
                f"scales must be bf16/fp16 ({k // group_size}, {n}), got {scales.dtype} {tuple(scales.shape)}"
            )
        if out is None:
            out = torch.empty((m, n), device=x.device, dtype=x.dtype)
        elif tuple(out.shape) != (m, n) or out.dtype != x.dtype:
            raise ValueError(f"out must be ({m}, {n}) {x.dtype}, got {tuple(out.shape)} {out.dtype}")
        if SPLIT_K > 1 and workspace is not None and (
            tuple(workspace.shape) != (m, n) or workspace.dtype != torch.float32 or not workspace.is_contiguous()
        ):
            raise ValueError(f"workspace must be a contiguous ({m}, {n}) float32 tensor")
        kernel, meta = _kernel_and_meta(
            x.dtype, bits, group_size, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages, SWAP_AB
        )
        ints = (m, n, k, x.stride(0), x.stride(1), qweight.stride(0), qweight.stride(1), scales.stride(0),
                scales.stride(1), out.stride(0), out.stride(1))  # fmt: skip
        plan = _PLANS.put(key, Plan(kernel, _grid(m, n, BLOCK_M, BLOCK_N, SPLIT_K), meta, ints=ints))
    elif out is None:
        out = torch.empty(plan.state["ints"][:2], device=x.device, dtype=x.dtype)
    if SPLIT_K > 1:
        if workspace is None:
            workspace = torch.empty(out.shape, device=x.device, dtype=torch.float32)
        workspace.zero_()
        plan.launch(x, qweight, scales, out, workspace, *plan.state["ints"])
        out.copy_(workspace)
    else:
        plan.launch(x, qweight, scales, out, out, *plan.state["ints"])  # the workspace is never read
    return out


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
    BLOCK_K: int,
    SPLIT_K: int,
    num_warps: int,
    num_stages: int,
    SWAP_AB: int = 0,
    scale_dtype: torch.dtype | None = None,
) -> Any | None:
    """Compile the kernel :func:`quant_matmul` launches for contiguous operands, without launching it.

    Placeholder tensors carry dtype, shape and the row-major strides of
    :func:`quantize_weights` and contiguous X / Y, so the later launch finds
    the binary in Triton's in-process cache. Raises ``OutOfResources`` when
    the binary needs more shared memory than the current device has, and
    Triton's compile errors as they are. Returns None under the interpreter
    (nothing to compile) or on a Triton without ``JITFunction.warmup``.
    """
    if precision not in ACT_DTYPES:
        raise ValueError(f"precision must be one of {tuple(ACT_DTYPES)}, got {precision!r}")
    check_layout(m, n, k, bits, group_size, BLOCK_K, SPLIT_K)
    if interpreter_active():
        return None
    dtype = ACT_DTYPES[precision]
    jit, meta = _kernel_and_meta(
        dtype, bits, group_size, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages, SWAP_AB
    )
    warmup = getattr(jit, "warmup", None)
    if warmup is None:
        return None
    from kernels.gemm.gemm import raise_if_over_shared_memory, strided_mock

    def row_major(dtype: torch.dtype, shape: list[int]) -> Any:
        return strided_mock(dtype, shape, (shape[1], 1))

    x = row_major(dtype, [m, k])
    w = row_major(torch.int8, [k * bits // 8, n])
    s = row_major(scale_dtype or dtype, [k // group_size, n])
    y = row_major(dtype, [m, n])
    ws = row_major(torch.float32, [m, n]) if SPLIT_K > 1 else y
    kernel = warmup(
        x,
        w,
        s,
        y,
        ws,
        m,
        n,
        k,
        *x.stride(),
        *w.stride(),
        *s.stride(),
        *y.stride(),
        **meta,
        grid=_grid(m, n, BLOCK_M, BLOCK_N, SPLIT_K),
    )
    raise_if_over_shared_memory(kernel)
    return kernel


__all__ = [
    "ACT_DTYPES",
    "BITS",
    "CLIP_RATIOS",
    "INT4_OFFSET",
    "MIN_BLOCK_K",
    "QMAX",
    "QuantizedWeights",
    "check_layout",
    "compile_only",
    "dequantize_groups",
    "pack_int4",
    "quant_gemv_kernel",
    "quant_matmul",
    "quant_matmul_kernel",
    "quantize_groups",
    "quantize_weights",
    "reference_quant_matmul",
    "unpack_int4",
]
