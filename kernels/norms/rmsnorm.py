"""Triton RMSNorm over the last dim, ``y = x / sqrt(mean(x^2) + eps) * w``, with a torch reference.

Each program normalizes ``ROWS_PER_PROGRAM`` rows held as one ``(ROWS_PER_PROGRAM, BLOCK)`` tile
and walks the row in ``BLOCK``-wide column steps:

- single pass (``BLOCK >= n_cols``): the whole row is loaded once into registers, reduced, scaled
  and stored; x is read from memory exactly once.
- two passes (``BLOCK < n_cols``): the first pass accumulates the sum of squares block by block,
  the second reads x again (mostly from L2, the program's rows were just read), scales and stores.

Input, weight and output share one dtype (``precision``: fp32, fp16 or bf16); everything inside
is computed in fp32. Rows past the last one wrap around (``% n_rows``) so that loads stay in bounds
without a row mask; their results are never stored. The column tail is masked unless ``n_cols``
is a multiple of ``BLOCK``.

The helpers shared with ``kernels/norms/softmax.py`` (dtypes, the row-wise error, compile-only warm-up)
live here. Under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors; unlike ``tl.dot``, the
element-wise and reduction ops they use give correct bf16 results there (Triton 3.9).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernels.runtime import interpreter_active

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")
#: dtype of x, the weight and y per precision (the math inside is fp32 either way).
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: Largest number of elements of one Triton tensor (``triton.language.TRITON_MAX_TENSOR_NUMEL``).
MAX_TILE_ELEMENTS = 1 << 20
#: Default epsilon added to the mean square (as in Llama-style models).
DEFAULT_EPS = 1e-6


@triton.jit
def rmsnorm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    n_rows,
    n_cols,
    stride_xr,
    stride_xc,
    stride_w,
    stride_yr,
    stride_yc,
    eps,
    BLOCK: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    EVEN_COLS: tl.constexpr,
    EVEN_ROWS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """``ROWS_PER_PROGRAM`` rows per program; fp32 sum of squares; one or two passes over each row."""
    pid = tl.program_id(axis=0)
    rows = pid * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_ok = rows < n_rows
    # Rows past the end wrap around: their loads stay in bounds, their results are never stored.
    safe_rows = (rows % n_rows).to(tl.int64)
    x_rows = x_ptr + safe_rows[:, None] * stride_xr
    y_rows = y_ptr + safe_rows[:, None] * stride_yr
    cols = tl.arange(0, BLOCK)

    if SINGLE_PASS:
        # The whole row is in registers: read x once, reduce, scale, store.
        if EVEN_COLS:
            x = tl.load(x_rows + cols[None, :] * stride_xc).to(tl.float32)
            w = tl.load(w_ptr + cols[None, :] * stride_w).to(tl.float32)
        else:
            col_ok = cols < n_cols
            x = tl.load(x_rows + cols[None, :] * stride_xc, mask=col_ok[None, :], other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols[None, :] * stride_w, mask=col_ok[None, :], other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
        y = (x * rstd[:, None] * w).to(y_ptr.dtype.element_ty)
        y_ptrs = y_rows + cols[None, :] * stride_yc
        if EVEN_COLS and EVEN_ROWS:
            tl.store(y_ptrs, y)
        else:
            tl.store(y_ptrs, y, mask=row_ok[:, None] & (cols[None, :] < n_cols))
    else:
        # Pass 1: per-lane fp32 partial sums of squares, reduced once at the end.
        acc = tl.zeros((ROWS_PER_PROGRAM, BLOCK), dtype=tl.float32)
        for start in tl.range(0, n_cols, BLOCK, num_stages=NUM_STAGES):
            offs = start + cols
            if EVEN_COLS:
                x = tl.load(x_rows + offs[None, :] * stride_xc).to(tl.float32)
            else:
                x = tl.load(x_rows + offs[None, :] * stride_xc, mask=offs[None, :] < n_cols, other=0.0)
                x = x.to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / n_cols + eps)
        # Pass 2: read x again (L2), scale by rstd and the weight, store.
        for start in tl.range(0, n_cols, BLOCK, num_stages=NUM_STAGES):
            offs = start + cols
            y_ptrs = y_rows + offs[None, :] * stride_yc
            if EVEN_COLS:
                x = tl.load(x_rows + offs[None, :] * stride_xc).to(tl.float32)
                w = tl.load(w_ptr + offs[None, :] * stride_w).to(tl.float32)
            else:
                col_ok = offs < n_cols
                x = tl.load(x_rows + offs[None, :] * stride_xc, mask=col_ok[None, :], other=0.0).to(tl.float32)
                w = tl.load(w_ptr + offs[None, :] * stride_w, mask=col_ok[None, :], other=0.0).to(tl.float32)
            y = (x * rstd[:, None] * w).to(y_ptr.dtype.element_ty)
            if EVEN_COLS and EVEN_ROWS:
                tl.store(y_ptrs, y)
            else:
                tl.store(y_ptrs, y, mask=row_ok[:, None] & (offs[None, :] < n_cols))


# --------------------------------------------------------------------------- launch helpers


def check_precision(precision: str) -> None:
    """Raise ValueError naming ``precision`` unless it is one of :data:`PRECISIONS`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def check_tile(BLOCK: int, ROWS_PER_PROGRAM: int, num_warps: int, num_stages: int) -> None:
    """Raise ValueError naming the knob that Triton cannot compile (powers of two, tile size)."""
    for name, value in (("BLOCK", BLOCK), ("ROWS_PER_PROGRAM", ROWS_PER_PROGRAM), ("num_warps", num_warps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two, got {value!r}")
    if BLOCK * ROWS_PER_PROGRAM > MAX_TILE_ELEMENTS:
        raise ValueError(f"BLOCK * ROWS_PER_PROGRAM must be <= {MAX_TILE_ELEMENTS}, got {BLOCK * ROWS_PER_PROGRAM}")
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages must be an int >= 1, got {num_stages!r}")


def grid(n_rows: int, rows_per_program: int) -> tuple[int]:
    """One program per ``rows_per_program`` rows."""
    return (triton.cdiv(n_rows, rows_per_program),)


def meta_args(
    n_rows: int, n_cols: int, BLOCK: int, ROWS_PER_PROGRAM: int, num_warps: int, num_stages: int
) -> dict[str, Any]:
    """The constexpr and launch arguments for one config (shared by the launch and the warm-up)."""
    return {
        "BLOCK": BLOCK,
        "ROWS_PER_PROGRAM": ROWS_PER_PROGRAM,
        "SINGLE_PASS": BLOCK >= n_cols,
        "EVEN_COLS": n_cols % BLOCK == 0,
        "EVEN_ROWS": n_rows % ROWS_PER_PROGRAM == 0,
        # The two-pass loops are software-pipelined through shared memory (cp.async) only when the
        # loop itself asks for stages: the launch option alone leaves them unpipelined (Triton 3.9).
        "NUM_STAGES": num_stages,
        "num_warps": num_warps,
        "num_stages": num_stages,
    }


def check_2d(x: torch.Tensor, precision: str, name: str = "x") -> tuple[int, int]:
    """(rows, cols) of a non-empty 2-D tensor of the precision's dtype; ValueError naming ``name`` otherwise."""
    check_precision(precision)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} must be a non-empty 2-D (rows, cols) tensor, got shape {tuple(x.shape)}")
    if x.dtype != DTYPES[precision]:
        raise ValueError(f"precision {precision!r} needs {name} in {DTYPES[precision]}, got {x.dtype}")
    return int(x.shape[0]), int(x.shape[1])


def output_buffer(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``out`` checked against x's shape and dtype, or a new tensor like x."""
    if out is None:
        return torch.empty_like(x)
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out must be {tuple(x.shape)} {x.dtype} on {x.device}, got {tuple(out.shape)} {out.dtype}")
    return out


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    precision: str,
    BLOCK: int,
    ROWS_PER_PROGRAM: int,
    num_warps: int,
    num_stages: int,
    eps: float = DEFAULT_EPS,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = x / sqrt(mean(x^2, -1) + eps) * weight`` with one config.

    ``x`` is (rows, cols), any strides, and ``weight`` (cols,), both in ``DTYPES[precision]``;
    ``out`` (same shape and dtype as x) is written in place when given. Returns y. Launches
    asynchronously on the current stream.
    """
    n_rows, n_cols = check_2d(x, precision)
    check_tile(BLOCK, ROWS_PER_PROGRAM, num_warps, num_stages)
    if weight.shape != (n_cols,) or weight.dtype != x.dtype:
        raise ValueError(f"weight must be ({n_cols},) {x.dtype}, got {tuple(weight.shape)} {weight.dtype}")
    out = output_buffer(x, out)
    rmsnorm_kernel[grid(n_rows, ROWS_PER_PROGRAM)](
        x,
        weight,
        out,
        n_rows,
        n_cols,
        x.stride(0),
        x.stride(1),
        weight.stride(0),
        out.stride(0),
        out.stride(1),
        float(eps),
        **meta_args(n_rows, n_cols, BLOCK, ROWS_PER_PROGRAM, num_warps, num_stages),
    )
    return out


def warmup_kernel(kernel: Any, args: list[Any], grid_size: tuple[int], meta: dict[str, Any]) -> Any | None:
    """Compile ``kernel`` for ``args`` (torch dtypes stand for tensors) without launching it.

    Returns the compiled kernel, or None under the interpreter or on a Triton without
    ``JITFunction.warmup``. Raises ``OutOfResources`` when the binary needs more shared memory
    than the device allows (Triton itself would only find out at the first launch).
    """
    if interpreter_active():
        return None
    warmup = getattr(kernel, "warmup", None)
    if warmup is None:
        return None
    compiled = warmup(*args, grid=grid_size, **meta)
    from kernels.gemm.gemm import raise_if_over_shared_memory

    raise_if_over_shared_memory(compiled)
    return compiled


def compile_only(
    n_rows: int,
    n_cols: int,
    *,
    precision: str,
    BLOCK: int,
    ROWS_PER_PROGRAM: int,
    num_warps: int,
    num_stages: int,
    eps: float = DEFAULT_EPS,
) -> Any | None:
    """Compile the kernel that :func:`rmsnorm` launches on contiguous (n_rows, n_cols) tensors.

    Uses ``JITFunction.warmup`` with placeholder tensors (dtype only; the strides are passed as
    the contiguous layout's), so the later launch finds the binary in Triton's in-process cache.
    Compiles for the calling thread's current CUDA device and launches nothing. Returns None under
    the interpreter.
    """
    check_precision(precision)
    check_tile(BLOCK, ROWS_PER_PROGRAM, num_warps, num_stages)
    dtype = DTYPES[precision]
    args = [dtype, dtype, dtype, n_rows, n_cols, n_cols, 1, 1, n_cols, 1, float(eps)]
    meta = meta_args(n_rows, n_cols, BLOCK, ROWS_PER_PROGRAM, num_warps, num_stages)
    return warmup_kernel(rmsnorm_kernel, args, grid(n_rows, ROWS_PER_PROGRAM), meta)


# --------------------------------------------------------------------------- inputs and reference


def make_masters(rows: int, cols: int, device: str | torch.device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 masters: x (rows, cols) standard normal and a weight (cols,) of ``1 + 0.5 * N(0, 1)``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((rows, cols), device=device, dtype=torch.float32, generator=generator)
    w = 1.0 + 0.5 * torch.randn((cols,), device=device, dtype=torch.float32, generator=generator)
    return x, w


def reference_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """RMSNorm in fp32 of the given tensors (upcast first): the numerics reference."""
    x = x.to(torch.float32)
    return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps) * weight.to(torch.float32)


def row_rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max over rows of ``max|out - ref| / max|ref|`` within the row, in fp32; NaN when ``out`` has a NaN.

    Normalizing per row keeps rows of small values (e.g. a flat softmax row) from hiding behind
    the rows with the largest values, while elements near zero do not blow the error up.
    """
    diff = (out.to(torch.float32) - ref).abs().amax(dim=-1)
    scale = ref.abs().amax(dim=-1).clamp(min=torch.finfo(torch.float32).tiny)
    return float((diff / scale).amax())
