"""The weight format of the weight-only GEMMs (:mod:`kernels.quant.quant_gemm`, re-exported there): symmetric int4 /
int8 weights with one scale per group of ``group_size`` rows of K, int4 packed two to a byte along K, the
round-to-nearest quantizer (with an optional clipping search) and the fp32 reference product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Activation precisions and their torch dtypes (X, Y and, by default, the scales).
ACT_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: Supported weight bit widths.
BITS: tuple[int, ...] = (4, 8)
#: Largest |q| per bit width (symmetric: int4 leaves -8 unused, int8 leaves -128 unused).
QMAX: dict[int, int] = {4: 7, 8: 127}
#: Offset of the stored int4 nibble: ``u = q + INT4_OFFSET``.
INT4_OFFSET = 8


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


# --------------------------------------------------------------------------- quantization and reference


@dataclass
class QuantizedWeights:
    """Packed weights and per-group scales in the layout of :mod:`kernels.quant.quant_gemm`'s docstring.

    ``dequantize()`` returns the fp32 (K, N) matrix the kernel multiplies by.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    bits: int
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        """(K, N) of the unpacked weight matrix."""
        return self.qweight.shape[0] * (8 // self.bits), self.qweight.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of packed weights plus scales (what one product reads of W)."""
        return self.qweight.numel() * self.qweight.element_size() + self.scales.numel() * self.scales.element_size()

    def values(self) -> torch.Tensor:
        """The integer weights q (K, N) as int8, unpacked."""
        return self.qweight if self.bits == 8 else unpack_int4(self.qweight)

    def dequantize(self) -> torch.Tensor:
        """``q * scale`` in fp32, (K, N)."""
        return dequantize_groups(self.values(), self.scales, self.group_size)

    def clone(self) -> QuantizedWeights:
        """A copy in new memory (same values): launches may rotate over copies to defeat L2 reuse."""
        return QuantizedWeights(self.qweight.clone(), self.scales.clone(), self.bits, self.group_size)


def dequantize_groups(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """Integer weights q (K, N) times their per-group scales (K // group_size, N), in fp32."""
    k, n = q.shape
    grouped = q.to(torch.float32).reshape(k // group_size, group_size, n)
    return (grouped * scales.to(torch.float32)[:, None, :]).reshape(k, n)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7], shape (K, N) with K even -> (K // 2, N) int8 bytes, offset-binary nibbles.

    Byte ``[r, n]`` holds ``q[2r, n] + 8`` in its low nibble and ``q[2r + 1, n] + 8`` in its high one.
    """
    if q.ndim != 2 or q.shape[0] % 2:
        raise ValueError(f"q must be (K, N) with K even, got {tuple(q.shape)}")
    u = (q.to(torch.int16) + INT4_OFFSET).clamp(0, 15)
    return (u[0::2] | (u[1::2] << 4)).to(torch.uint8).view(torch.int8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: (K // 2, N) bytes -> (K, N) int8 values in [-8, 7]."""
    u = packed.view(torch.uint8).to(torch.int16)
    lo = (u & 15) - INT4_OFFSET
    hi = (u >> 4) - INT4_OFFSET
    return torch.stack((lo, hi), dim=1).reshape(-1, packed.shape[1]).to(torch.int8)


#: Clipping ratios :func:`quantize_weights` tries with ``clip_search``: the scale is ``r * max|w| / QMAX``.
CLIP_RATIOS: tuple[float, ...] = tuple(round(1.0 - 0.025 * i, 3) for i in range(13))  # 1.0 .. 0.7


def quantize_weights(
    w: torch.Tensor,
    bits: int,
    group_size: int,
    scale_dtype: torch.dtype = torch.bfloat16,
    clip_search: bool = False,
) -> QuantizedWeights:
    """Symmetric per-group quantization of an fp32 (K, N) matrix along K, one scale per group and column.

    ``scale = max|w| over the group / QMAX[bits]``, rounded to ``scale_dtype`` (bf16 or fp16), then
    ``q = clamp(round(w / scale), -QMAX, QMAX)`` with the rounded scale, so ``q * scale`` is the
    representable value nearest to ``w``. All-zero groups get the smallest normal scale (q = 0).

    ``clip_search``: per group and column, the scale is instead ``r * max|w| / QMAX`` for the ratio ``r``
    of :data:`CLIP_RATIOS` whose rounded-and-clamped weights have the least squared error (the clipping
    search of llama.cpp's and AWQ's quantizers): a group's few large weights are clipped so that the many
    small ones get finer steps. The error never exceeds that of ``r = 1`` (it is one of the candidates).
    """
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if w.ndim != 2:
        raise ValueError(f"w must be 2-D (K, N), got {tuple(w.shape)}")
    k, n = w.shape
    if not _is_pow2(group_size) or group_size < 2 or k % group_size:
        raise ValueError(f"group_size must be an even power of two dividing K={k}, got {group_size!r}")
    if scale_dtype not in ACT_DTYPES.values():
        raise ValueError(f"scale_dtype must be bfloat16 or float16, got {scale_dtype}")
    groups = w.to(torch.float32).reshape(k // group_size, group_size, n)
    scales, q = quantize_groups(groups, bits, scale_dtype, clip_search)
    q = q.to(torch.int8).reshape(k, n)
    qweight = q.contiguous() if bits == 8 else pack_int4(q).contiguous()
    return QuantizedWeights(qweight, scales.contiguous(), bits, group_size)


def quantize_groups(
    groups: torch.Tensor, bits: int, scale_dtype: torch.dtype, clip_search: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and rounded values of fp32 weight groups ``(G, group_size, N)``, as :func:`quantize_weights`
    makes them: ``(scales (G, N) in scale_dtype, q (G, group_size, N) fp32 integers)``.

    ``scale = r * max|w| / QMAX`` for ``r = 1``, or with ``clip_search`` the ratio of :data:`CLIP_RATIOS`
    with the least squared error per group and column; ``q = clamp(round(w / scale))`` with the rounded scale.
    """
    qmax = QMAX[bits]
    tiny = torch.finfo(scale_dtype).tiny
    amax = groups.abs().amax(dim=1)

    def rounded(ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
        scales = (amax * ratio / qmax).clamp(min=tiny).to(scale_dtype)
        q = torch.round(groups / scales.to(torch.float32)[:, None, :]).clamp(-qmax, qmax)
        return scales, q

    scales, q = rounded(1.0)
    if clip_search:
        best_error = ((q * scales.to(torch.float32)[:, None, :] - groups) ** 2).sum(dim=1)
        for ratio in CLIP_RATIOS[1:]:
            cand_scales, cand_q = rounded(ratio)
            error = ((cand_q * cand_scales.to(torch.float32)[:, None, :] - groups) ** 2).sum(dim=1)
            better = error < best_error
            best_error = torch.where(better, error, best_error)
            scales = torch.where(better, cand_scales, scales)
            q = torch.where(better[:, None, :], cand_q, q)
    return scales, q


def reference_quant_matmul(x: torch.Tensor, weights: QuantizedWeights) -> torch.Tensor:
    """``x @ dequant(W)`` in fp32 with TF32 off: the exact product of the operands the kernel reads."""
    from kernels.gemm.gemm import reference_matmul

    return reference_matmul(x.to(torch.float32), weights.dequantize())
