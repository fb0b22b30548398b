"""In-register decodes of :mod:`kernels.quant.quant_gemm_packed`'s int32 words (Triton device functions).

A word holds ``PACK = 32 // bits`` offset-binary values; slot ``i`` of word row ``j`` of a span is K row
``16 i + j`` of it (the layout: :func:`kernels.quant.quant_gemm_packed.pack_weights`). Decodes, cheapest last:

- :func:`slot`: one slot as exact fp32 integers by the exponent trick (a shift, a masked OR, a subtraction);
- :func:`slot_pair_asm`: two int4 slots as exact 16-bit floats by inline PTX (``lop3`` under the exponent
  of 128.0 or 1024.0, one packed ``fma``), about one instruction a weight; GPU only;
- :func:`slot_pair_f32`: two int4 slots as fp32 ``q + bias`` in one masked OR (the GEMV takes the biases
  off once per span);
- :func:`span_decoded_t`: a whole span decoded and transposed, (BLOCK_N, SPAN), for one MMA chain per span.
"""

import triton
import triton.language as tl


@triton.jit
def slot(words, i: tl.constexpr, BITS: tl.constexpr):
    """Slot ``i`` of every word as exact fp32 integers q (the exponent trick; offset removed)."""
    u = (words >> (BITS * i)) & ((1 << BITS) - 1)
    OFF: tl.constexpr = 8388608.0 + (1 << (BITS - 1))  # 2**23 + the storage offset
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - OFF


#: PTX decoding two nibbles of an int4 word to 16-bit floats in three instructions (Marlin's trick):
#: ``lop3`` puts nibbles ``p`` and ``p + 4`` (bits 4p and 16 + 4p, after the shift) under the exponent
#: of 128.0 (bf16) or 1024.0 (fp16) in the two halves of a register, and one packed ``fma`` subtracts
#: 128 + 8 (1024 + 8), leaving q exactly. One call per pair keeps few decoded values live (registers).
_PAIR_ASM = """
{
.reg .b32 t, one, neg;
mov.b32 one, ONE;
mov.b32 neg, NEG;
shr.u32 t, $2, SHIFT;
lop3.b32 t, t, 0x000F000F, MAGIC, 0xEA;
fma.rn.TYPE t, t, one, neg;
mov.b32 {$0, $1}, t;
}
"""


def _pair_asm(dtype: str, pair: int) -> tl.constexpr:
    magic, one, neg, kind = {
        "bf16": ("0x43004300", "0x3F803F80", "0xC308C308", "bf16x2"),
        "fp16": ("0x64006400", "0x3C003C00", "0xE408E408", "f16x2"),
    }[dtype]
    text = _PAIR_ASM.replace("MAGIC", magic).replace("ONE", one).replace("NEG", neg).replace("TYPE", kind)
    # One line: torch.compile (Inductor) re-emits a user kernel's source, and a newline inside this string
    # constant would end its literal there.
    return tl.constexpr(" ".join(text.replace("SHIFT", str(4 * pair)).split()))


PAIR_BF16_0, PAIR_BF16_1, PAIR_BF16_2, PAIR_BF16_3 = (_pair_asm("bf16", p) for p in range(4))
PAIR_FP16_0, PAIR_FP16_1, PAIR_FP16_2, PAIR_FP16_3 = (_pair_asm("fp16", p) for p in range(4))


@triton.jit
def _pair(words, asm: tl.constexpr, IS_BF16: tl.constexpr):
    if IS_BF16:
        return tl.inline_asm_elementwise(
            asm, "=h,=h,r", [words], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1
        )
    else:
        return tl.inline_asm_elementwise(asm, "=h,=h,r", [words], dtype=(tl.float16, tl.float16), is_pure=True, pack=1)


@triton.jit
def slot_pair_asm(words, p: tl.constexpr, dtype: tl.constexpr):
    """Slots ``p`` and ``p + 4`` of int4 words as exact 16-bit floats (bf16 or fp16), by inline PTX (GPU only)."""
    if dtype == tl.bfloat16:
        if p == 0:
            return _pair(words, PAIR_BF16_0, True)
        elif p == 1:
            return _pair(words, PAIR_BF16_1, True)
        elif p == 2:
            return _pair(words, PAIR_BF16_2, True)
        else:
            return _pair(words, PAIR_BF16_3, True)
    else:
        if p == 0:
            return _pair(words, PAIR_FP16_0, False)
        elif p == 1:
            return _pair(words, PAIR_FP16_1, False)
        elif p == 2:
            return _pair(words, PAIR_FP16_2, False)
        else:
            return _pair(words, PAIR_FP16_3, False)


#: Biases of :func:`slot_pair_f32`'s values over q: ``128 + 8`` (the exponent's 128.0 and the storage offset),
#: and for the high value also the low half's bits 0x4300 read as the fraction ``0x4300 / 2**16``.
PAIR_F32_LO_BIAS: tl.constexpr = tl.constexpr(136.0)
PAIR_F32_HI_BIAS: tl.constexpr = tl.constexpr(136.0 + 0x4300 / 65536)


@triton.jit
def slot_pair_f32(words, p: tl.constexpr):
    """Slots ``p`` and ``p + 4`` of int4 words as fp32 ``q + 136`` (low) and ``q + 136.26...`` (high), in
    about one instruction per value: one masked OR puts both nibbles under the exponent of 128.0 in the two
    16-bit halves of a word; the word read as fp32 is the high value (its low half adds 0x4300 / 2**16 and at
    most 15 / 2**16, below a bf16 rounding of any product), and shifted up 16 bits the low one (exact). The
    caller subtracts the biases once per span (one scalar per K row), not once per weight."""
    t = ((words >> (4 * p)) & 0x000F000F) | 0x43004300
    return (t << 16).to(tl.float32, bitcast=True), t.to(tl.float32, bitcast=True)


@triton.jit
def span_decoded_t(words, dtype: tl.constexpr, BITS: tl.constexpr, FAST_DECODE: tl.constexpr):
    """The span's weights decoded and transposed, (BLOCK_N, SPAN) in X's dtype: column 16 i + j is slot i of
    word row j (K row SPAN s + 16 i + j), built from the (16, BLOCK_N) slot tiles by joins (no data moves
    between threads when the joins land in registers), for one wgmma chain of K = SPAN per span."""
    if BITS == 4:
        if FAST_DECODE:
            q0, q4 = slot_pair_asm(words, 0, dtype)
            q1, q5 = slot_pair_asm(words, 1, dtype)
            q2, q6 = slot_pair_asm(words, 2, dtype)
            q3, q7 = slot_pair_asm(words, 3, dtype)
        else:
            q0, q4 = slot(words, 0, 4).to(dtype), slot(words, 4, 4).to(dtype)
            q1, q5 = slot(words, 1, 4).to(dtype), slot(words, 5, 4).to(dtype)
            q2, q6 = slot(words, 2, 4).to(dtype), slot(words, 6, 4).to(dtype)
            q3, q7 = slot(words, 3, 4).to(dtype), slot(words, 7, 4).to(dtype)
        low = tl.join(tl.join(q0, q1), tl.join(q2, q3))  # (j, n, bit0, bit1) of slots 0-3
        high = tl.join(tl.join(q4, q5), tl.join(q6, q7))
        q = tl.join(low, high)  # (j, n, bit0, bit1, bit2) of slot 4 bit2 + 2 bit1 + bit0 -> (n, bit2, bit1, bit0, j)
        return tl.reshape(tl.permute(q, (1, 4, 3, 2, 0)), (q.shape[1], 128))
    else:
        q0 = slot(words, 0, 8).to(dtype)
        q1 = slot(words, 1, 8).to(dtype)
        q2 = slot(words, 2, 8).to(dtype)
        q3 = slot(words, 3, 8).to(dtype)
        q = tl.join(tl.join(q0, q1), tl.join(q2, q3))  # (j, n, bit0, bit1)
        return tl.reshape(tl.permute(q, (1, 3, 2, 0)), (q.shape[1], 64))
