"""Triton GEMM ``C = A @ B`` in the style of the Triton matmul tutorial, with a torch reference.

Precisions (the ``precision`` argument of :func:`matmul`):

| precision | A, B dtype                          | ``tl.dot``                      | C dtype  |
| --------- | ----------------------------------- | ------------------------------- | -------- |
| ``fp32``  | float32                             | ``input_precision="ieee"``      | float32  |
| ``tf32``  | float32                             | ``input_precision="tf32"``      | float32  |
| ``bf16``  | bfloat16                            | fp32 accumulate                 | bfloat16 |
| ``fp16``  | float16                             | fp32 accumulate                 | float16  |
| ``fp8``   | float8_e4m3fn, per-tensor fp32 scale | fp32 accumulate, then scaled   | bfloat16 |

Any M, N, K and any operand strides work: rows and columns past the edge
wrap around (``% M``, ``% N``) so their loads stay in bounds, the K tail is
masked (unless K is a multiple of BLOCK_K), and the store is masked on both
edges. :func:`quantize_inputs` lays B out K-major for tf32 and fp8 (see
:data:`K_MAJOR_B`); :func:`compile_only` assumes those layouts.

Under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors through the
interpreter; there ``input_precision`` is ignored (tf32 computes like fp32)
and bf16 products are wrong (max relative error 1.5e9 to 3e9 measured with
Triton 3.9 on 16x16x16 up to 65x17x100), so bf16 numerics are checked on a
GPU only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.launch import Plan, PlanCache, layout_key, sm_count
from kernels.runtime import interpreter_active

#: Programs of a persistent kernel under the interpreter (no SMs to count): :func:`device_sms`.
INTERPRETER_PROGRAMS = 3
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")

#: dtype of the A and B operands the kernel reads, per precision.
INPUT_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}
#: dtype of C, per precision.
OUTPUT_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.bfloat16,
}
#: ``tl.dot`` input precision per precision; it only matters for fp32 operands.
DOT_INPUT_PRECISION: dict[str, str] = {
    "fp32": "ieee",
    "tf32": "tf32",
    "bf16": "tf32",
    "fp16": "tf32",
    "fp8": "tf32",
}
#: Largest finite float8_e4m3fn value: per-tensor scales map each operand's amax onto it.
FP8_E4M3_MAX = 448.0
#: Precisions whose B operand is laid out K-major (column-major (K, N)). Hopper's wgmma reads
#: 32- and 8-bit B only K-major; a row-major B makes Triton fall back to a slower path.
#: Measured on an H200 (Triton 3.6, 4096^3): tf32 83 -> 326 TFLOP/s with K-major B, while
#: fp32 ("ieee", no tensor cores) drops 43 -> 22, so fp32 keeps B row-major.
K_MAJOR_B: frozenset[str] = frozenset({"tf32", "fp8"})
#: Smallest BLOCK_K that ``tl.dot`` accepts on NVIDIA GPUs (8-bit operands need K >= 32).
MIN_BLOCK_K: dict[str, int] = {"fp32": 16, "tf32": 16, "bf16": 16, "fp16": 16, "fp8": 32}


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    scale_a_ptr,
    scale_b_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """One BLOCK_M x BLOCK_N tile of C per program, fp32 accumulator, K walked in BLOCK_K steps."""
    # Grouped ordering: GROUP_M row-tiles share each column-tile while it is in L2.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Rows/columns past the edge wrap around, so A and B loads never leave the
    # tensors along M and N; the results for those rows/columns are never stored.
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            # The K tail runs past the edge: masked, zero-filled.
            k_remaining = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        accumulator = tl.dot(a, b, accumulator, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if HAS_SCALE:
        # Per-tensor dequantization (fp8): C = (A_q @ B_q) * scale_a * scale_b.
        accumulator = accumulator * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
    c = accumulator.to(c_ptr.dtype.element_ty)

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def _grid(m: int, n: int, block_m: int, block_n: int) -> tuple[int]:
    return (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)


def _meta_args(
    precision: str, k: int, BLOCK_M: int, BLOCK_N: int, BLOCK_K: int, GROUP_M: int, num_warps: int, num_stages: int
) -> dict[str, Any]:
    """The kernel's constexpr and launch arguments for one config (shared by launch and warm-up)."""
    return {
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": BLOCK_N,
        "BLOCK_K": BLOCK_K,
        "GROUP_M": GROUP_M,
        "INPUT_PRECISION": DOT_INPUT_PRECISION[precision],
        "HAS_SCALE": precision == "fp8",
        "EVEN_K": k % BLOCK_K == 0,
        "num_warps": num_warps,
        "num_stages": num_stages,
    }


#: :func:`matmul`'s launch plans.
_PLANS = PlanCache()


def matmul(
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
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``C = A @ B`` (times ``scale_a * scale_b`` for fp8) with one tile config.

    ``a`` is (M, K) and ``b`` is (K, N), any strides, in ``INPUT_DTYPES[precision]``;
    ``scale_a``/``scale_b`` are one-element float32 tensors (required for fp8,
    ignored otherwise); ``out`` (M, N) in ``OUTPUT_DTYPES[precision]`` is written
    in place when given. Returns C. Launches asynchronously on the current stream.
    """
    key = (layout_key(a, b, scale_a, scale_b, out), a.device, precision, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
           num_warps, num_stages)  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        m, n, k = check_operands(a, b, precision, scale_a, scale_b)
        if out is None:
            out = torch.empty((m, n), device=a.device, dtype=OUTPUT_DTYPES[precision])
        elif out.shape != (m, n) or out.dtype != OUTPUT_DTYPES[precision]:
            raise ValueError(f"out must be ({m}, {n}) {OUTPUT_DTYPES[precision]}, got {tuple(out.shape)} {out.dtype}")
        meta = _meta_args(precision, k, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)
        ints = (m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))
        plan = _PLANS.put(key, Plan(matmul_kernel, _grid(m, n, BLOCK_M, BLOCK_N), meta, ints=ints,
                                    out=((m, n), OUTPUT_DTYPES[precision])))  # fmt: skip
    elif out is None:
        shape, dtype = plan.state["out"]
        out = torch.empty(shape, device=a.device, dtype=dtype)
    # Unused pointer arguments still need a tensor; HAS_SCALE=False never reads them.
    if precision == "fp8":
        plan.launch(a, b, out, scale_a, scale_b, *plan.state["ints"])
    else:
        plan.launch(a, b, out, out, out, *plan.state["ints"])
    return out


def check_operands(
    a: torch.Tensor, b: torch.Tensor, precision: str, scale_a: torch.Tensor | None, scale_b: torch.Tensor | None
) -> tuple[int, int, int]:
    """Raise ValueError unless A (M, K) and B (K, N) are operands of ``precision`` (fp8: with both scales);
    returns (M, N, K). Layouts are each kernel's own check."""
    _check_precision(precision)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"incompatible shapes for A @ B: {tuple(a.shape)} @ {tuple(b.shape)}")
    expected = INPUT_DTYPES[precision]
    if a.dtype != expected or b.dtype != expected:
        raise ValueError(f"precision {precision!r} needs {expected} operands, got {a.dtype} and {b.dtype}")
    if precision == "fp8" and (scale_a is None or scale_b is None):
        raise ValueError("precision 'fp8' needs scale_a and scale_b (one-element float32 tensors)")
    return a.shape[0], b.shape[1], a.shape[1]


def operand_strides(m: int, n: int, k: int, precision: str) -> dict[str, tuple[int, int]]:
    """Element strides of A, B and C as :func:`quantize_inputs` and :func:`matmul` lay them out."""
    _check_precision(precision)
    b_stride = (1, k) if precision in K_MAJOR_B else (n, 1)
    return {"a": (k, 1), "b": b_stride, "c": (n, 1)}


def compile_only(
    m: int,
    n: int,
    k: int,
    *,
    precision: str,
    BLOCK_M: int,
    BLOCK_N: int,
    BLOCK_K: int,
    GROUP_M: int,
    num_warps: int,
    num_stages: int,
) -> Any | None:
    """Compile the kernel that :func:`matmul` launches for an M x N x K product, without launching it.

    Calls ``JITFunction.warmup(..., grid=...)`` on placeholder tensors (dtype,
    shape and the strides of :func:`operand_strides`, no memory), so the later
    launch on tensors from :func:`quantize_inputs` finds the binary in Triton's
    in-process cache. Compiles for the calling thread's current CUDA device;
    it launches nothing, so it may run on a thread while another kernel is
    being timed.

    Raises ``OutOfResources`` when the binary needs more shared memory than the
    device allows (read from the compiled metadata, before any launch would
    find out), and Triton's compilation errors as they are. Returns the
    compiled kernel, or ``None`` under the interpreter (nothing to compile) or
    on a Triton without ``warmup``.
    """
    _check_precision(precision)
    if interpreter_active():
        return None
    warmup = getattr(matmul_kernel, "warmup", None)
    if warmup is None:
        return None
    strides = operand_strides(m, n, k, precision)
    a = strided_mock(INPUT_DTYPES[precision], [m, k], strides["a"])
    b = strided_mock(INPUT_DTYPES[precision], [k, n], strides["b"])
    c = strided_mock(OUTPUT_DTYPES[precision], [m, n], strides["c"])
    has_scale = precision == "fp8"
    scale = strided_mock(torch.float32, [1], (1, 1))
    kernel = warmup(
        a,
        b,
        c,
        scale if has_scale else c,
        scale if has_scale else c,
        m,
        n,
        k,
        *strides["a"],
        *strides["b"],
        *strides["c"],
        **_meta_args(precision, k, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages),
        grid=_grid(m, n, BLOCK_M, BLOCK_N),
    )
    raise_if_over_shared_memory(kernel)
    return kernel


def strided_mock(dtype: torch.dtype, shape: list[int], strides: tuple[int, ...]) -> Any:
    """A placeholder tensor for ``JITFunction.warmup``: dtype, shape and strides, no memory.

    The compile-ahead functions of every kernel module pass these, with the strides the real
    launch will see, so that the launch finds the binary in Triton's in-process cache.
    """
    from triton.runtime.jit import MockTensor

    class StridedMock(MockTensor):
        def stride(self) -> tuple[int, ...]:
            return strides

    return StridedMock(dtype, shape)


def device_sms(device: torch.device) -> int:
    """Programs a persistent kernel launches by default on ``device``: its multiprocessor count on a GPU,
    :data:`INTERPRETER_PROGRAMS` under the interpreter (several, so that programs share the tiles)."""
    if device.type == "cuda":
        return sm_count(device)
    return INTERPRETER_PROGRAMS


def raise_if_over_shared_memory(kernel: Any) -> None:
    """Triton checks shared memory only when it loads the binary (first launch); check it now."""
    shared_bytes = getattr(getattr(kernel, "metadata", None), "shared", None)
    if shared_bytes is None:
        return
    from triton.runtime import driver
    from triton.runtime.errors import OutOfResources

    try:
        limit_bytes = driver.active.utils.get_device_properties(driver.active.get_current_device())["max_shared_mem"]
    except Exception:  # no limit known: the launch will check it
        return
    if shared_bytes > limit_bytes:
        raise OutOfResources(shared_bytes, limit_bytes, "shared memory")


# --------------------------------------------------------------------------- inputs and reference


@dataclass
class GemmInputs:
    """Operands for one precision and the fp32 master inputs they were quantized from.

    ``a`` (M, K) and ``b`` (K, N) are in ``INPUT_DTYPES[precision]``;
    ``scale_a``/``scale_b`` are one-element float32 tensors (fp8 only, else
    None) such that ``a.float() * scale_a`` approximates ``a_master``.
    """

    precision: str
    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor | None
    scale_b: torch.Tensor | None
    a_master: torch.Tensor
    b_master: torch.Tensor


def make_masters(m: int, n: int, k: int, device: str | torch.device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 master inputs A (M, K) and B (K, N), standard normal, deterministic per (device, seed)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn((m, k), device=device, dtype=torch.float32, generator=generator)
    b = torch.randn((k, n), device=device, dtype=torch.float32, generator=generator)
    return a, b


def _fp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor scaling: ``x ~= q.float() * scale`` with ``amax(x)`` mapped to the e4m3 max."""
    amax = x.abs().amax().clamp(min=1e-12).to(torch.float32)
    scale = (amax / FP8_E4M3_MAX).reshape(1)
    q = (x / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def quantize_inputs(a_master: torch.Tensor, b_master: torch.Tensor, precision: str) -> GemmInputs:
    """Convert fp32 masters into the operands of ``precision``.

    For the precisions in :data:`K_MAJOR_B` (tf32, fp8) B is stored K-major (an
    (N, K) buffer viewed as (K, N)), as the Triton tutorial does for fp8.
    """
    _check_precision(precision)
    scale_a = scale_b = None
    if precision == "fp32":
        a, b = a_master, b_master
    elif precision == "tf32":
        a, b = a_master, b_master.t().contiguous().t()
    elif precision == "fp8":
        a, scale_a = _fp8_quantize(a_master)
        b_t, scale_b = _fp8_quantize(b_master.t().contiguous())
        b = b_t.t()
    else:
        a = a_master.to(INPUT_DTYPES[precision])
        b = b_master.to(INPUT_DTYPES[precision])
    return GemmInputs(precision, a, b, scale_a, scale_b, a_master, b_master)


def prepare_inputs(m: int, n: int, k: int, precision: str, device: str | torch.device, seed: int) -> GemmInputs:
    """Masters from :func:`make_masters`, quantized for ``precision`` by :func:`quantize_inputs`."""
    a_master, b_master = make_masters(m, n, k, device, seed)
    return quantize_inputs(a_master, b_master, precision)


def reference_matmul(a_master: torch.Tensor, b_master: torch.Tensor) -> torch.Tensor:
    """The fp32 product of the masters with TF32 off (IEEE fp32 multiply-add): the numerics reference."""
    if a_master.device.type != "cuda":
        return a_master @ b_master
    matmul_flags = torch.backends.cuda.matmul
    if hasattr(matmul_flags, "fp32_precision"):
        saved = matmul_flags.fp32_precision
        matmul_flags.fp32_precision = "ieee"
        try:
            return a_master @ b_master
        finally:
            matmul_flags.fp32_precision = saved
    saved_tf32 = matmul_flags.allow_tf32
    matmul_flags.allow_tf32 = False
    try:
        return a_master @ b_master
    finally:
        matmul_flags.allow_tf32 = saved_tf32


def torch_matmul(inputs: GemmInputs) -> torch.Tensor:
    """The exact product of the operands :func:`matmul` reads (dequantized), in fp32 with TF32 off.

    Differs from :func:`reference_matmul` of the masters only by input
    quantization, so comparing the kernel's output with it isolates the
    kernel's own error (accumulation order, output rounding).
    """
    a = inputs.a.to(torch.float32)
    b = inputs.b.to(torch.float32)
    if inputs.scale_a is not None and inputs.scale_b is not None:
        a = a * inputs.scale_a
        b = b * inputs.scale_b
    return reference_matmul(a, b)


def max_rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max|out - ref| / max|ref|`` in fp32; NaN when ``out`` has a NaN."""
    diff = (out.to(torch.float32) - ref).abs().amax()
    scale = ref.abs().amax().clamp(min=torch.finfo(torch.float32).tiny)
    return float(diff / scale)
