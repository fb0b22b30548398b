"""Triton axpy, ``out = alpha * x + y`` over a vector, with a torch reference: the smallest memory-bound kernel.

Each program handles ``BLOCK`` consecutive elements; the last one masks past the end. Inputs and
output share one dtype (fp32, fp16 or bf16); the multiply-add runs in fp32. The result goes to a
separate buffer (not into y), so repeated launches for timing compute the same values.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernels.norms.rmsnorm import DTYPES, warmup_kernel

__all__ = ["DTYPES", "axpy", "axpy_kernel", "compile_only", "reference_axpy"]


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    """``BLOCK`` elements per program: ``out[i] = alpha * x[i] + y[i]`` in fp32, stored in out's dtype."""
    pid = tl.program_id(axis=0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=mask)


def axpy(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor, *, BLOCK: int, num_warps: int) -> None:
    """``out = alpha * x + y`` for contiguous 1-D tensors of one dtype; launches asynchronously."""
    if not (x.shape == y.shape == out.shape and x.dtype == y.dtype == out.dtype and x.is_contiguous()):
        raise ValueError(f"x, y, out must be contiguous, of one shape and dtype, got {x.shape} {y.shape} {out.shape}")
    n = x.numel()
    axpy_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, float(alpha), n, BLOCK=BLOCK, num_warps=num_warps)


def compile_only(n: int, *, precision: str, BLOCK: int, num_warps: int) -> Any | None:
    """Compile the kernel :func:`axpy` launches for ``n`` elements, launching nothing (None under the interpreter)."""
    dtype = DTYPES[precision]
    meta = {"BLOCK": BLOCK, "num_warps": num_warps}
    return warmup_kernel(axpy_kernel, [dtype, dtype, dtype, 1.0, n], (triton.cdiv(n, BLOCK),), meta)


def reference_axpy(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    """``alpha * x + y`` in fp32 of the given tensors (upcast first): the numerics reference."""
    return alpha * x.to(torch.float32) + y.to(torch.float32)
