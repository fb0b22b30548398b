"""Stress the packed weight-only GEMM (its in-kernel split-K / streamed reduction, its swapped tiles) for wrong
results that a single check misses.

Each case launches :func:`kernels.quant.quant_gemm_packed.packed_matmul` ``--launches`` times on fresh X, every third
launch beside a large matmul on a second stream (so the programs of one product start at different times;
``--alone`` also runs every case with no second stream), and checks every result against ``X @ dequant(W)``
in fp32: a lost or stale partial sum shows as a relative error of order 1.

    PYTHONPATH=. python bench/quant_reduce_stress.py --alone --out bench/results/int4-roofline-reduce-stress-h200.json
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.common import write_result

CASES: list[dict[str, Any]] = [
    {"m": 1, "n": 4096, "k": 14336, "bits": 4,
     "config": {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 1, "num_warps": 4, "PREFETCH": 0, "num_stages": 3,
                "TMA": 1, "SWAP": 1, "STREAM": 2}},
    {"m": 1, "n": 4096, "k": 14336, "bits": 8,
     "config": {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 16, "num_warps": 4, "PREFETCH": 0, "num_stages": 3,
                "TMA": 1, "SWAP": 2}},
    {"m": 1, "n": 14336, "k": 4096, "bits": 4,
     "config": {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 4, "num_warps": 4, "PREFETCH": 0, "num_stages": 3,
                "TMA": 1, "SWAP": 2}},
    {"m": 16, "n": 4096, "k": 14336, "bits": 4,
     "config": {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 8, "num_warps": 4, "PREFETCH": 0, "num_stages": 3,
                "TMA": 1}},
    {"m": 1, "n": 4096, "k": 14336, "bits": 4,
     "config": {"BLOCK_M": 1, "BLOCK_N": 64, "SPLIT_K": 8, "num_warps": 4, "num_stages": 3}},
    {"m": 1, "n": 8192, "k": 8192, "bits": 4,
     "config": {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 8, "num_warps": 4, "PREFETCH": 0, "num_stages": 3,
                "TMA": 1, "SWAP": 1}},
    {"m": 64, "n": 14336, "k": 4096, "bits": 4,
     "config": {"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_K": 1, "num_warps": 4, "PREFETCH": 0, "num_stages": 3,
                "TMA": 1, "SWAP": 2}},
    {"m": 64, "n": 8192, "k": 8192, "bits": 4,
     "config": {"BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 4, "num_warps": 8, "PREFETCH": 0, "num_stages": 3,
                "TMA": 1, "SWAP": 3}},
    {"m": 64, "n": 8192, "k": 8192, "bits": 4,
     "config": {"BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 4, "num_warps": 4, "PREFETCH": 0, "num_stages": 4,
                "TMA": 2, "SWAP": 2}},
    {"m": 16, "n": 4096, "k": 14336, "bits": 4,
     "config": {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 4, "num_warps": 4, "PREFETCH": 0, "num_stages": 4,
                "TMA": 2, "SWAP": 3}},
    {"m": 1, "n": 4096, "k": 14336, "bits": 4,
     "config": {"BLOCK_M": 1, "BLOCK_N": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3, "TMA": 1, "STREAM": 2}},
    {"m": 64, "n": 4096, "k": 14336, "bits": 4,
     "config": {"BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 4, "num_warps": 4, "PREFETCH": 0, "num_stages": 3,
                "TMA": 1}},
    {"m": 1, "n": 4096, "k": 14336, "bits": 4,
     "config": {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 1, "num_warps": 4, "PREFETCH": 0, "num_stages": 3,
                "TMA": 1, "SWAP": 1}},
    {"m": 16, "n": 14336, "k": 4096, "bits": 8,
     "config": {"BLOCK_M": 16, "BLOCK_N": 256, "SPLIT_K": 4, "num_warps": 4, "PREFETCH": 0, "num_stages": 3,
                "TMA": 1}},
]  # fmt: skip


def stress(case: dict[str, Any], launches: int, side_work: bool = True) -> dict[str, Any]:
    """Launch one case ``launches`` times; how many results were wrong (relative error > 0.02) and the worst."""
    import torch

    from kernels.gemm.gemm import max_rel_error
    from kernels.quant.quant_gemm_packed import packed_matmul, quantize_packed

    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(case["k"], case["n"], device="cuda", generator=gen) * 0.02
    weights = quantize_packed(w, case["bits"], 128, torch.bfloat16)
    dequantized = weights.dequantize()
    side = torch.cuda.Stream()
    busy = torch.randn(4096, 4096, device="cuda", generator=gen)
    wrong, worst = 0, 0.0
    for i in range(launches):
        x = torch.randn(case["m"], case["k"], device="cuda", generator=gen).to(torch.bfloat16)
        if side_work and i % 3 == 1:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                busy @ busy
        y = packed_matmul(x, weights, **case["config"])
        ref = x.float() @ dequantized
        err = max_rel_error(y, ref)
        worst = max(worst, err)
        wrong += not err <= 0.02  # a NaN is wrong too
    torch.cuda.synchronize()
    return {**case, "launches": launches, "side_work": side_work, "wrong": wrong, "worst_relative_error": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--launches", type=int, default=2000)
    parser.add_argument("--alone", action="store_true", help="also every case without the second stream's matmul")
    ns = parser.parse_args()
    rows = []
    for side_work in (True, False) if ns.alone else (True,):
        for case in CASES:
            rows.append(stress(case, ns.launches, side_work))
            print(rows[-1], flush=True)
        write_result({"benchmark": "packed quant GEMM: in-kernel reduction under stress", "rows": rows}, ns.out)


if __name__ == "__main__":
    main()
