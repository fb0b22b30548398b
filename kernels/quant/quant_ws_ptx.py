"""The inline PTX that decodes the packed int4/int8 words in :mod:`kernels.quant.quant_gemm_ws`'s consumer: one text a
pair of K slots, element type and scaling, as Triton constexprs (a Gluon kernel reads them as globals)."""

from __future__ import annotations

from typing import Any

import triton

#: PTX decoding slots 2b and 2b + 1 of two int4 words (K rows j and j + 1 of a slice: one wgmma K pair) and
#: scaling them: ``prmt`` puts byte b of each word in the low byte of a register half, ``lop3`` puts a nibble
#: under the exponent of 128.0 (bf16) or 1024.0 (fp16) in both halves, a packed ``fma`` takes off 128 + 8
#: (1024 + 8), leaving q exactly, and a packed multiply by the scale (both halves the same): four
#: instructions a pair of weights, and the pair is already the register wgmma reads.
_SLOTS_ASM = (
    "{ .reg .b32 x, t, one, neg; mov.b32 one, ONE; mov.b32 neg, NEG; "
    "prmt.b32 x, $2, $3, SEL; "
    "lop3.b32 t, x, 0x000F000F, MAGIC, 0xEA; fma.rn.TYPE t, t, one, neg; mul.rn.TYPE $0, t, $4; "
    "shr.u32 x, x, 4; "
    "lop3.b32 t, x, 0x000F000F, MAGIC, 0xEA; fma.rn.TYPE t, t, one, neg; mul.rn.TYPE $1, t, $4; }"
)


def _slots_asm(dtype: str, b: int, scaled: bool = True) -> Any:
    magic, one, neg, kind = {
        "bf16": ("0x43004300", "0x3F803F80", "0xC308C308", "bf16x2"),
        "fp16": ("0x64006400", "0x3C003C00", "0xE408E408", "f16x2"),
    }[dtype]
    sel = f"0x{4 + b:x}{4 + b:x}{b:x}{b:x}"  # bytes: b of the first word (0, 1), b of the second (2, 3)
    text = _SLOTS_ASM.replace("SEL", sel).replace("MAGIC", magic).replace("ONE", one).replace("NEG", neg)
    if not scaled:  # q itself (SCALE_ACC: the scale goes on the span's product instead)
        text = text.replace("fma.rn.TYPE t, t, one, neg; mul.rn.TYPE $0, t, $4;", "fma.rn.TYPE $0, t, one, neg;")
        text = text.replace("fma.rn.TYPE t, t, one, neg; mul.rn.TYPE $1, t, $4;", "fma.rn.TYPE $1, t, one, neg;")
    return triton.language.constexpr(text.replace("TYPE", kind))


_SLOTS_BF16_0, _SLOTS_BF16_1, _SLOTS_BF16_2, _SLOTS_BF16_3 = (_slots_asm("bf16", b) for b in range(4))
_SLOTS_FP16_0, _SLOTS_FP16_1, _SLOTS_FP16_2, _SLOTS_FP16_3 = (_slots_asm("fp16", b) for b in range(4))
_Q_BF16_0, _Q_BF16_1, _Q_BF16_2, _Q_BF16_3 = (_slots_asm("bf16", b, scaled=False) for b in range(4))
_Q_FP16_0, _Q_FP16_1, _Q_FP16_2, _Q_FP16_3 = (_slots_asm("fp16", b, scaled=False) for b in range(4))
#: PTX decoding slots 2h and 2h + 1 of two int8 words (K rows j and j + 1): ``prmt`` puts byte b of a word
#: under the exponent of 2^23 in an fp32 (2^23 + u), a ``sub`` takes off 2^23 + 128, leaving q = u - 128 exactly,
#: and one ``cvt`` packs the two words' values into the pair wgmma reads (then, unless SCALE_ACC, a packed
#: multiply by the scale): five instructions a pair of weights (six scaled).
_BYTES_ASM = (
    "{ .reg .b32 m, f0, f1, t; mov.b32 m, 0x4B000000; "
    "prmt.b32 f0, $2, m, SEL0; prmt.b32 f1, $3, m, SEL0; sub.f32 f0, f0, 0f4B000080; sub.f32 f1, f1, 0f4B000080; "
    "OUT0 "
    "prmt.b32 f0, $2, m, SEL1; prmt.b32 f1, $3, m, SEL1; sub.f32 f0, f0, 0f4B000080; sub.f32 f1, f1, 0f4B000080; "
    "OUT1 }"
)


def _bytes_asm(dtype: str, h: int, scaled: bool = True) -> Any:
    kind = {"bf16": "bf16x2", "fp16": "f16x2"}[dtype]
    text = _BYTES_ASM.replace("SEL0", f"0x765{2 * h}").replace("SEL1", f"0x765{2 * h + 1}")
    for i in (0, 1):
        pack = f"cvt.rn.{kind}.f32 ${i}, f1, f0;"
        if scaled:
            pack = f"cvt.rn.{kind}.f32 t, f1, f0; mul.rn.{kind} ${i}, t, $4;"
        text = text.replace(f"OUT{i}", pack)
    return triton.language.constexpr(text)


_BYTES_BF16_0, _BYTES_BF16_1, _BYTES_FP16_0, _BYTES_FP16_1 = (
    _bytes_asm(t, h) for t in ("bf16", "fp16") for h in (0, 1)
)
_QB_BF16_0, _QB_BF16_1, _QB_FP16_0, _QB_FP16_1 = (
    _bytes_asm(t, h, scaled=False) for t in ("bf16", "fp16") for h in (0, 1)
)
