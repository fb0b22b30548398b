"""The read floor of a weight stream: the fastest a Triton kernel reads a buffer of int32 words from HBM.

A weight-only GEMM at M = 1 cannot beat the time it takes to read its weights, so the int4 roofline
benchmark (:mod:`bench.int4_roofline`) reports, beside the GEMM, the fastest of these pure reads of
the same words (the same bytes, the same rotation over copies larger than the L2):

- ``flat``: a grid of P programs, each reading ``BLOCK`` consecutive words per step with 16-byte
  vector loads, grid-stride (all programs walk the buffer together), XOR-reduced to one word each;
- ``tma``: the words as a 2-D (rows, N) tensor read by bulk tensor copies of (BOX_R, BOX_N) boxes,
  ``num_stages`` copies in flight per program, grid-stride over the boxes.

Nothing is computed from the values but an XOR (one instruction per word), so the time is what the
memory system gives a kernel of this shape: a GEMM slower than the floor by a wide margin is bound by
its own instructions or its schedule, not by HBM.
"""

from __future__ import annotations

import itertools
from typing import Any

import triton
import triton.language as tl


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def read_flat_kernel(w_ptr, out_ptr, n_words, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """Program p reads words [BLOCK (p + P i), BLOCK (p + P i + 1)) for i = 0, 1, ...; one XOR per word."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    steps = tl.cdiv(tl.cdiv(n_words, BLOCK) - pid, programs)
    for i in tl.range(0, steps, num_stages=STAGES):
        offs = (pid + i * programs) * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(w_ptr + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + pid, tl.reduce(acc, 0, _xor))


@triton.jit
def read_tma_kernel(desc, out_ptr, rows, cols, BOX_R: tl.constexpr, BOX_N: tl.constexpr, STAGES: tl.constexpr):
    """Program p reads boxes p, p + P, ... of the (rows, cols) words through the descriptor."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    per_row = tl.cdiv(cols, BOX_N)
    boxes = tl.cdiv(rows, BOX_R) * per_row
    acc = tl.zeros((BOX_R, BOX_N), dtype=tl.int32)
    steps = tl.cdiv(boxes - pid, programs)
    for i in tl.range(0, steps, num_stages=STAGES):
        box = pid + i * programs
        acc ^= desc.load([(box // per_row) * BOX_R, (box % per_row) * BOX_N])
    tl.store(out_ptr + pid, tl.reduce(tl.reduce(acc, 1, _xor), 0, _xor))


def candidates(sms: int) -> list[dict[str, Any]]:
    """The pure-read configs tried per buffer."""
    flat = [
        {"kind": "flat", "programs": sms * p, "BLOCK": b, "num_warps": w, "num_stages": s}
        for p, b, w, s in itertools.product((1, 2, 4, 8), (1024, 4096), (4, 8), (1, 3))
    ]
    tma = [
        {"kind": "tma", "programs": sms * p, "BOX_R": r, "BOX_N": n, "num_warps": 4, "num_stages": s}
        for p, (r, n), s in itertools.product((1, 2, 4), ((16, 128), (32, 256), (64, 128), (16, 256)), (3, 5))
    ]
    return flat + tma


def reader(words: Any, config: dict[str, Any]) -> Any:
    """A callable reading ``words`` (a contiguous (rows, N) int32 tensor) once with ``config``."""
    import torch

    programs = config["programs"]
    out = torch.empty(programs, device=words.device, dtype=torch.int32)
    meta = {"num_warps": config["num_warps"], "num_stages": config["num_stages"], "STAGES": config["num_stages"]}
    if config["kind"] == "flat":
        flat = words.view(-1)
        return lambda w=flat: read_flat_kernel[(programs,)](w, out, w.numel(), BLOCK=config["BLOCK"], **meta)
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows, cols = words.shape
    box = [config["BOX_R"], config["BOX_N"]]
    desc = TensorDescriptor(words, [rows, cols], [cols, 1], box)
    return lambda d=desc: read_tma_kernel[(programs,)](d, out, rows, cols, BOX_R=box[0], BOX_N=box[1], **meta)


__all__ = ["candidates", "read_flat_kernel", "read_tma_kernel", "reader"]
