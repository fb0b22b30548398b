"""The weight-only GEMMs of one decode step, shape by shape: the 1B model's Linears at decode row counts.

A decode step of the ``1b`` preset runs four products a layer, (N, K) = (6144, 2048) qkv, (2048, 2048) attention
out, (8192, 2048) MLP up and (2048, 8192) MLP down, at M = the batch. ``bench/decode_profile.py`` found the int4
kernels of the step taking longer than the bytes say at these small shapes (2-8 MB of words a product). Per shape
and row count, in CUDA graphs over weight copies rotating through 256 MB (as the decode tuner times them):

- bf16 ``F.linear`` (cuBLAS), the baseline's product;
- every int4 tile the decode tuner measures (:func:`models.quant_tiles.packed_candidates` and
  :func:`~models.quant_tiles.ws_candidates`), and with ``--partials`` the split-K tiles whose partial products are
  left to the next operation (:func:`~models.quant_tiles.partial_candidates`, the kernel alone), and with
  ``--pdl`` the warp-specialized tiles also as programmatic dependents (``PDL: 1``: timed back to back, each
  copying its first words while the one before ends), and with ``--wide`` also their ``WIDE_X`` and
  ``UNSWAPPED`` tiles (32-64 rows), best first; a tile whose product is wrong is left out
  (:func:`~models.quant_tiles.right_tiles`);
- the read floor of the int4 words (:mod:`bench.stream_floor`'s flat reader, the fastest of its configs).

    PYTHONPATH=. python bench/decode_shapes.py --rows 1 64 --partials \
        --out bench/results/int4-roofline-decode-shapes-h200.json
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

SHAPES = {"qkv": (6144, 2048), "attn_out": (2048, 2048), "mlp_up": (8192, 2048), "mlp_down": (2048, 8192)}
#: ``--shapes lm_head``: the tied LM head (vocabulary x d_model), quantized with ``lm_head_bits`` 8 or 4.
EXTRA_SHAPES = {"lm_head": (32000, 2048)}
GROUP = 128


#: ``--extra-gemv``: GEMV tiles beyond the tuner's at M = 1, more spans in flight a program (``cp.async`` 4 and 8
#: deep, TMA boxes, STREAM), little or no split-K. None beat the tuner's tiles on an H200.
EXTRA_GEMV = [
    {"BLOCK_M": 1, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": w, "num_stages": st, "PREFETCH": 0}
    for bn, sk, st, w in itertools.product((32, 64, 128), (1, 2, 4, 8), (4, 8), (4, 8))
] + [
    {"BLOCK_M": 1, "BLOCK_N": bn, "SPLIT_K": sk, "num_warps": 4, "num_stages": st, "PREFETCH": 0, "TMA": 1}
    for bn, sk, st in itertools.product((64, 128, 256), (1, 2, 4, 8), (4, 8))
] + [
    {"BLOCK_M": 1, "BLOCK_N": bn, "SPLIT_K": 1, "num_warps": 4, "num_stages": st, "PREFETCH": 0, "TMA": tma,
     "STREAM": stream}
    for bn, st, tma, stream in itertools.product((64, 128), (4, 8), (0, 1), (2, 4))
]  # fmt: skip


def bf16_ms(m: int, n: int, k: int) -> float:
    import torch

    from models.quant_tiles import ROTATE_BYTES
    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.measure import time_fn

    copies = max(1, min(64, ROTATE_BYTES // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

    def products() -> None:
        for w in weights:
            torch.nn.functional.linear(x, w)

    timing = time_fn(products, device_info(), warmup_ms=2.0, rep_ms=10.0, min_reps=5, max_reps=50, flush_l2=False,
                     cuda_graph=True, graph_calls=1)  # fmt: skip
    return timing.median_ms / copies


def floor_ms(n: int, k: int, bits: int = 4) -> tuple[float, dict[str, Any]]:
    """The fastest flat read of the words of an (N, K) weight (K * bits / 32 rows of N words), rotating copies."""
    import torch

    from bench.stream_floor import candidates, reader
    from models.quant_tiles import ROTATE_BYTES
    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.measure import time_fn

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = k * bits // 32
    copies = max(1, min(64, ROTATE_BYTES // (rows * n * 4)))
    words = [torch.randint(-(2**31), 2**31 - 1, (rows, n), dtype=torch.int32, device="cuda") for _ in range(copies)]
    best: tuple[float, dict[str, Any]] = (float("inf"), {})
    for config in [c for c in candidates(sms) if c["kind"] == "flat" and c["programs"] <= 4 * sms]:
        calls = [reader(w, config) for w in words]

        def reads(calls: list[Any] = calls) -> None:
            for call in calls:
                call()

        reads()
        timing = time_fn(reads, device_info(), warmup_ms=2.0, rep_ms=10.0, min_reps=5, max_reps=50, flush_l2=False,
                         cuda_graph=True, graph_calls=1)  # fmt: skip
        best = min(best, (timing.median_ms / copies, config), key=lambda pair: pair[0])
    return best


def main() -> None:
    import torch

    from bench.common import write_result
    from models.quant_tiles import packed_candidates, partial_candidates, time_packed_tiles, ws_candidates

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[1, 64])
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=[*SHAPES, *EXTRA_SHAPES])
    parser.add_argument("--bits", type=int, default=4, choices=[4, 8], help="weight bits (the int4_* fields hold them)")
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--partials", action="store_true", help="also the PARTIALS tiles")
    parser.add_argument("--extra-gemv", action="store_true", help="also EXTRA_GEMV at M = 1")
    parser.add_argument("--pdl", action="store_true", help="also the warp-specialized tiles with PDL")
    parser.add_argument("--wide", action="store_true", help="also the WIDE_X and UNSWAPPED warp-specialized tiles")
    parser.add_argument("--out")
    args = parser.parse_args()
    started = time.time()
    rows_out = []
    shapes = {**SHAPES, **EXTRA_SHAPES}
    bits = args.bits
    floors = {name: floor_ms(*shapes[name], bits) for name in args.shapes}
    for m in args.rows:
        for name in args.shapes:
            n, k = shapes[name]
            tiles = packed_candidates(m, n, k, bits) + ws_candidates(m, n, k, bits, GROUP, wide=args.wide)
            tiles += partial_candidates(m, n, k, bits) if args.partials else []
            tiles += ws_candidates(m, n, k, bits, GROUP, pdl=True) if args.pdl else []
            tiles += EXTRA_GEMV if args.extra_gemv and m == 1 else []
            timed = sorted(time_packed_tiles(m, n, k, bits, GROUP, torch.bfloat16, torch.device("cuda"), tiles),
                           key=lambda pair: pair[1])  # fmt: skip
            summed = min((p for p in timed if not p[0].get("PARTIALS")), key=lambda pair: pair[1], default=None)
            base = bf16_ms(m, n, k)
            words_bytes = k * bits // 32 * n * 4 + k // GROUP * n * 2
            row = {
                "m": m, "shape": name, "n": n, "k": k, "bits": bits, "bf16_us": base * 1e3,
                "int4_read_floor_us": floors[name][0] * 1e3, "floor_config": floors[name][1],
                "int4_best_us": timed[0][1] * 1e3 if timed else None,
                "int4_best_summed_us": summed[1] * 1e3 if summed else None,
                "int4_best_tb_s": words_bytes / timed[0][1] / 1e9 if timed else None,
                "offered": len(tiles), "candidates": len(timed),
                "top": [{"tile": t, "us": ms * 1e3} for t, ms in timed[: args.top]],
            }  # fmt: skip
            rows_out.append(row)
            print(f"M={m} {name} ({n}, {k}): bf16 {row['bf16_us']:.2f} us, int4 best {row['int4_best_us']:.2f} "
                  f"(summed in the kernel {row['int4_best_summed_us']:.2f}), floor {row['int4_read_floor_us']:.2f}; "
                  f"best {timed[0][0] if timed else None}", flush=True)  # fmt: skip
            write_result({"what": __doc__.split("\n\n")[0], "wall_s": time.time() - started, "rows": rows_out},
                         args.out)  # fmt: skip


if __name__ == "__main__":
    main()
