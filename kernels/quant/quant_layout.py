"""The packed int4/int8 weight layout of :mod:`kernels.quant.quant_gemm_packed` (made once, at quantization time).

``PACK = 32 // bits`` values share one int32 word, stored offset-binary (``q + 8`` or ``q + 128``). K is cut
into spans of ``SPAN = 16 * PACK`` rows; word ``[16 * s + j, n]`` holds, in its value slot ``i``,
``q[SPAN * s + 16 * i + j, n]``, so decoding slot ``i`` of a (16, BLOCK_N) tile of words gives the 16-row weight
slice that one ``tl.dot`` of K = 16 (or one FMA sweep) takes, with no value moving between threads.
Plain torch: packing, unpacking, quantizing into the layout, converting from :mod:`kernels.quant.quant_gemm`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.quant.quant_weights import _is_pow2, dequantize_groups, quantize_groups

#: Supported weight bit widths.
BITS: tuple[int, ...] = (4, 8)
#: K rows per decoded slice: one ``tl.dot`` of K = 16, the smallest the tensor cores take.
SLICE = 16
#: Offset of the stored values (offset-binary): ``u = q + OFFSET[bits]``.
OFFSET: dict[int, int] = {4: 8, 8: 128}


def pack_factor(bits: int) -> int:
    """Values per int32 word."""
    return 32 // bits


def span(bits: int) -> int:
    """K rows one (16, N) tile of words covers."""
    return SLICE * pack_factor(bits)


# --------------------------------------------------------------------------- layout


def pack_weights(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer weights q (K, N) (int8, in [-QMAX, QMAX]) -> the (K // PACK, N) int32 words of the layout.

    Word ``[16 s + j, n]``, slot ``i`` (bits ``bits * i`` up), holds ``q[SPAN s + 16 i + j, n] + OFFSET``.
    """
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if q.ndim != 2 or q.shape[0] % span(bits):
        raise ValueError(f"q must be (K, N) with K a multiple of {span(bits)} for int{bits}, got {tuple(q.shape)}")
    k, n = q.shape
    pack = pack_factor(bits)
    u = (q.to(torch.int64) + OFFSET[bits]).clamp(0, (1 << bits) - 1)
    # (spans, slot i, row j, n) -> (spans, row j, slot i, n): slot i of word (s, j) is K row SPAN s + 16 i + j.
    u = u.reshape(k // span(bits), pack, SLICE, n).permute(0, 2, 1, 3)
    shifts = (torch.arange(pack, device=q.device, dtype=torch.int64) * bits).view(1, 1, pack, 1)
    words = (u << shifts).sum(dim=2)  # < 2**32: slots do not overlap
    words = torch.where(words >= 2**31, words - 2**32, words)  # the same 32 bits as a signed int32
    return words.reshape(k // pack, n).to(torch.int32).contiguous()


def unpack_weights(words: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_weights`: (K // PACK, N) int32 -> q (K, N) int8."""
    if words.dtype != torch.int32 or words.ndim != 2 or words.shape[0] % SLICE:
        raise ValueError(f"words must be int32 (K // {pack_factor(bits)}, N), got {words.dtype} {tuple(words.shape)}")
    pack = pack_factor(bits)
    rows, n = words.shape
    shifts = (torch.arange(pack, device=words.device, dtype=torch.int64) * bits).view(1, 1, pack, 1)
    u = (words.to(torch.int64).reshape(rows // SLICE, SLICE, 1, n) >> shifts) & ((1 << bits) - 1)
    q = u.permute(0, 2, 1, 3).reshape(rows * pack, n) - OFFSET[bits]
    return q.to(torch.int8)


@dataclass
class PackedWeights:
    """Words and scales in this module's layout; ``dequantize()`` is the fp32 (K, N) matrix multiplied by."""

    qweight: torch.Tensor
    scales: torch.Tensor
    bits: int
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        """(K, N) of the unpacked weight matrix."""
        return self.qweight.shape[0] * pack_factor(self.bits), self.qweight.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of words plus scales: what one product streams of W."""
        return self.qweight.numel() * 4 + self.scales.numel() * self.scales.element_size()

    def values(self) -> torch.Tensor:
        """The integer weights q (K, N) as int8."""
        return unpack_weights(self.qweight, self.bits)

    def dequantize(self) -> torch.Tensor:
        """``q * scale`` in fp32, (K, N)."""
        return dequantize_groups(self.values(), self.scales, self.group_size)

    def clone(self) -> PackedWeights:
        """A copy in new memory (launches rotate over copies so that L2 does not hold the weights)."""
        return PackedWeights(self.qweight.clone(), self.scales.clone(), self.bits, self.group_size)


def quantize_packed(
    w: torch.Tensor, bits: int, group_size: int, scale_dtype: torch.dtype = torch.bfloat16, clip_search: bool = False
) -> PackedWeights:
    """Quantize an fp32 (K, N) matrix as :func:`kernels.quant.quant_gemm.quantize_weights` does (same values and
    scales) and lay it out for this kernel."""
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if w.ndim != 2:
        raise ValueError(f"w must be 2-D (K, N), got {tuple(w.shape)}")
    k, n = w.shape
    if not _is_pow2(group_size) or group_size < SLICE or k % group_size:
        raise ValueError(f"group_size must be a power of two >= {SLICE} dividing K={k}, got {group_size!r}")
    scales, q = quantize_groups(
        w.to(torch.float32).reshape(k // group_size, group_size, n), bits, scale_dtype, clip_search
    )
    return PackedWeights(pack_weights(q.to(torch.int8).reshape(k, n), bits), scales.contiguous(), bits, group_size)


def repack(qweight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int) -> PackedWeights:
    """Weights in :mod:`kernels.quant.quant_gemm`'s layout -> this module's (the same values and scales)."""
    from kernels.quant.quant_weights import unpack_int4

    q = qweight if bits == 8 else unpack_int4(qweight)
    return PackedWeights(pack_weights(q, bits), scales, bits, group_size)
