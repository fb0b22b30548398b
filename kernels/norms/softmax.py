"""Triton softmax over the last dim, numerically stable (the row max is subtracted), with a torch reference.

Each program handles ``ROWS_PER_PROGRAM`` rows as one ``(ROWS_PER_PROGRAM, BLOCK)`` tile:

- single pass (``BLOCK >= n_cols``): the row is loaded once into registers; max, ``exp(x - max)``,
  sum and the scaled store follow without touching memory again.
- two passes (``BLOCK < n_cols``): the first pass keeps a running max ``m`` and a running sum
  ``s`` of ``exp(x - m)`` (rescaled by ``exp(m_old - m_new)`` whenever the max grows, the
  "online softmax"); the second reads x again (mostly from L2) and stores ``exp(x - m) / s``.

Input and output share one dtype (fp32, fp16 or bf16); the math is fp32. Masked columns load
``-inf`` so that they add ``exp(-inf) = 0``. Rows past the last one wrap around (``% n_rows``)
and are never stored. Launch helpers, dtypes and the row-wise error come from
``kernels/norms/rmsnorm.py``.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernels.norms.rmsnorm import (
    DTYPES,
    PRECISIONS,
    check_2d,
    check_precision,
    check_tile,
    grid,
    make_masters,
    meta_args,
    output_buffer,
    row_rel_error,
    warmup_kernel,
)

__all__ = [
    "DTYPES",
    "PRECISIONS",
    "compile_only",
    "make_input",
    "reference_softmax",
    "row_rel_error",
    "softmax",
    "softmax_kernel",
]


@triton.jit
def softmax_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    n_cols,
    stride_xr,
    stride_xc,
    stride_yr,
    stride_yc,
    BLOCK: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    EVEN_COLS: tl.constexpr,
    EVEN_ROWS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """``ROWS_PER_PROGRAM`` rows per program; fp32 max and sum; one or two passes over each row."""
    pid = tl.program_id(axis=0)
    rows = pid * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_ok = rows < n_rows
    # Rows past the end wrap around: their loads stay in bounds, their results are never stored.
    safe_rows = (rows % n_rows).to(tl.int64)
    x_rows = x_ptr + safe_rows[:, None] * stride_xr
    y_rows = y_ptr + safe_rows[:, None] * stride_yr
    cols = tl.arange(0, BLOCK)

    if SINGLE_PASS:
        if EVEN_COLS:
            x = tl.load(x_rows + cols[None, :] * stride_xc).to(tl.float32)
        else:
            x = tl.load(x_rows + cols[None, :] * stride_xc, mask=cols[None, :] < n_cols, other=-float("inf"))
            x = x.to(tl.float32)
        row_max = tl.max(x, axis=1)
        e = tl.exp(x - row_max[:, None])
        inv_sum = 1.0 / tl.sum(e, axis=1)
        y = (e * inv_sum[:, None]).to(y_ptr.dtype.element_ty)
        y_ptrs = y_rows + cols[None, :] * stride_yc
        if EVEN_COLS and EVEN_ROWS:
            tl.store(y_ptrs, y)
        else:
            tl.store(y_ptrs, y, mask=row_ok[:, None] & (cols[None, :] < n_cols))
    else:
        # Pass 1: online max and sum. Every block holds at least one real column, so m stays finite
        # after the first block and exp(m_old - m_new) is exp(-inf) = 0 only on the first step.
        m = tl.full((ROWS_PER_PROGRAM,), -float("inf"), dtype=tl.float32)
        s = tl.zeros((ROWS_PER_PROGRAM,), dtype=tl.float32)
        for start in tl.range(0, n_cols, BLOCK, num_stages=NUM_STAGES):
            offs = start + cols
            if EVEN_COLS:
                x = tl.load(x_rows + offs[None, :] * stride_xc).to(tl.float32)
            else:
                x = tl.load(x_rows + offs[None, :] * stride_xc, mask=offs[None, :] < n_cols, other=-float("inf"))
                x = x.to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
            m = m_new
        inv_sum = 1.0 / s
        # Pass 2: read x again (L2), store exp(x - m) / s.
        for start in tl.range(0, n_cols, BLOCK, num_stages=NUM_STAGES):
            offs = start + cols
            y_ptrs = y_rows + offs[None, :] * stride_yc
            if EVEN_COLS:
                x = tl.load(x_rows + offs[None, :] * stride_xc).to(tl.float32)
            else:
                x = tl.load(x_rows + offs[None, :] * stride_xc, mask=offs[None, :] < n_cols, other=-float("inf"))
                x = x.to(tl.float32)
            y = (tl.exp(x - m[:, None]) * inv_sum[:, None]).to(y_ptr.dtype.element_ty)
            if EVEN_COLS and EVEN_ROWS:
                tl.store(y_ptrs, y)
            else:
                tl.store(y_ptrs, y, mask=row_ok[:, None] & (offs[None, :] < n_cols))


def softmax(
    x: torch.Tensor,
    *,
    precision: str,
    BLOCK: int,
    ROWS_PER_PROGRAM: int,
    num_warps: int,
    num_stages: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``softmax(x, dim=-1)`` with one config.

    ``x`` is (rows, cols), any strides, in ``DTYPES[precision]``; ``out`` (same shape and dtype)
    is written in place when given. Returns y. Launches asynchronously on the current stream.
    """
    n_rows, n_cols = check_2d(x, precision)
    check_tile(BLOCK, ROWS_PER_PROGRAM, num_warps, num_stages)
    out = output_buffer(x, out)
    softmax_kernel[grid(n_rows, ROWS_PER_PROGRAM)](
        x,
        out,
        n_rows,
        n_cols,
        x.stride(0),
        x.stride(1),
        out.stride(0),
        out.stride(1),
        **meta_args(n_rows, n_cols, BLOCK, ROWS_PER_PROGRAM, num_warps, num_stages),
    )
    return out


def compile_only(
    n_rows: int,
    n_cols: int,
    *,
    precision: str,
    BLOCK: int,
    ROWS_PER_PROGRAM: int,
    num_warps: int,
    num_stages: int,
) -> Any | None:
    """Compile the kernel that :func:`softmax` launches on contiguous (n_rows, n_cols) tensors, launching nothing.

    See ``kernels.norms.rmsnorm.compile_only``; returns None under the interpreter.
    """
    check_precision(precision)
    check_tile(BLOCK, ROWS_PER_PROGRAM, num_warps, num_stages)
    dtype = DTYPES[precision]
    args = [dtype, dtype, n_rows, n_cols, n_cols, 1, n_cols, 1]
    meta = meta_args(n_rows, n_cols, BLOCK, ROWS_PER_PROGRAM, num_warps, num_stages)
    return warmup_kernel(softmax_kernel, args, grid(n_rows, ROWS_PER_PROGRAM), meta)


def make_input(rows: int, cols: int, device: str | torch.device, seed: int) -> torch.Tensor:
    """The fp32 master input x (rows, cols), standard normal (the same x as the rmsnorm workload's)."""
    return make_masters(rows, cols, device, seed)[0]


def reference_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim in fp32 of the given tensor (upcast first): the numerics reference."""
    return torch.softmax(x.to(torch.float32), dim=-1)
