"""Where the warp-specialized int4/int8 GEMM's time goes at M = 1: the kernel beside its own loader alone.

For each weight shape, every (``BLOCK_N``, ``NUM_STAGES``, ``PROGRAMS_PER_SM``) of :mod:`kernels.quant.quant_gemm_ws`
is timed as it is (``DIAG`` 0, checked against the fp32 product), with ``DIAG`` 1, where the consumer only waits
for each stage and releases it, so the kernel is the TMA ring streaming the same words, scales and X slices with
nothing computed, and (without ``--wide``) with ``DIAG`` 2, where split tiles add their partials but skip the
arrival count and the last program's sum (the cost of the in-kernel split-K protocol). Beside them, the read
floor of the words (:mod:`bench.stream_floor`). If the loader alone is near the kernel, the stream's structure
(boxes, stages, programs) holds the kernel; if it is near the floor, the consumer's decode-and-multiply does.
Timing as :mod:`bench.int4_roofline` (CUDA graphs over weight copies beyond twice the L2).

    PYTHONPATH=. python bench/int4_ws_diag.py --out bench/results/int4-roofline-ws-diag-h200.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from typing import Any

from bench.common import write_result
from bench.int4_roofline import GROUP, SHAPES, Bench, graph_time_us, read_floor
from bench.int4_ws import MAX_ERROR, _key, compile_jobs, ws_fn
from kernels.quant.quant_ws_rules import loader_regs


def candidates(bits: int, wide: bool) -> list[dict[str, int]]:
    """``wide``: 128/256 columns, 2-8 stages, 1-4 programs an SM, the kernel and its loader alone; otherwise the
    standing winners' neighbourhood (256 columns, swizzled words, a wait per slice pair, 2-3 stages, 2-3
    programs) with ``DIAG`` 2 as well (the split tiles' partials added without the arrival count)."""
    if wide:
        grid = itertools.product((128, 256), (2, 3, 4, 6, 8), (1, 2, 3, 4), (0, 1))
        extra = {}
    else:
        grid = itertools.product((256,), (2, 3), (2, 3), (0, 1, 2))
        extra = {"SWIZZLE": int(bits == 4), "SLICE_WAIT": 1}
    out = []
    for bn, stages, programs, diag in grid:
        out.append({"BLOCK_N": bn, "BLOCK_M": 8, "NUM_STAGES": stages, "PROGRAMS_PER_SM": programs,
                    "LOADER_REGS": loader_regs(programs), "SCALE_ACC": 1 if bits == 4 else 0,
                    "DIAG": diag, **extra})  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--bits", default="4,8")
    parser.add_argument("--shapes", default=",".join(f"{n}:{k}" for n, k in SHAPES))
    parser.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 2))
    parser.add_argument("--wide", action="store_true", help="the wide sweep (the first run's), not the winners'")
    args = parser.parse_args()
    import torch

    from kernels.quant.quant_gemm_packed import scratch
    from kernels.quant.quant_gemm_ws import check_config, ws_quant_matmul

    started = time.time()
    shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
    bits_list = [int(b) for b in args.bits.split(",")]
    failed = compile_jobs([(bits, 1, n, k, c) for bits in bits_list for n, k in shapes
                           for c in candidates(bits, args.wide)], args.workers)  # fmt: skip
    entries = []
    for bits in bits_list:
        for n, k in shapes:
            bench = Bench(n, k, bits)
            x = bench.x(1)
            rows = []
            for config in candidates(bits, args.wide):
                key = _key(bits, 1, n, k, config)
                if key in failed or check_config(1, n, k, bits, GROUP, **config):
                    continue
                row: dict[str, Any] = {"config": config}
                try:
                    if config["DIAG"] == 0:
                        row["error"] = bench.error(x, ws_quant_matmul(x, bench.packed[0], **config))
                    row["us"] = graph_time_us(*ws_fn(bench, x, config))
                except Exception as exc:  # reported per config
                    row["why"] = f"{type(exc).__name__}: {exc}"[:300]
                finally:
                    if config["DIAG"] == 2:  # it leaves the split-K workspace and counters dirty: clean them
                        for buf in scratch(x.device, 1, 1):
                            buf.zero_()
                rows.append(row)
            timed = [r for r in rows if "us" in r and (r["config"]["DIAG"] or r.get("error", 1) <= MAX_ERROR)]
            best = {d: min((r for r in timed if r["config"]["DIAG"] == d), key=lambda r: r["us"], default=None)
                    for d in (0, 1, 2)}  # fmt: skip
            floor = read_floor(bench)
            entry = {"bits": bits, "n": n, "k": k, "m": 1, "weight_bytes": bench.weight_bytes,
                     "best_kernel": best[0], "best_loader_alone": best[1], "best_without_arrivals": best[2],
                     "read_floor_us": floor["best"]["us"] if floor["best"] else None, "rows": rows}  # fmt: skip
            entries.append(entry)
            print(f"int{bits} {n}x{k}: kernel {best[0] and round(best[0]['us'], 2)} loader alone "
                  f"{best[1] and round(best[1]['us'], 2)} without arrivals {best[2] and round(best[2]['us'], 2)} "
                  f"read floor {entry['read_floor_us']}", flush=True)  # fmt: skip
            write_result({"what": "warp-specialized int4/int8 GEMM at M=1: kernel vs its loader alone (DIAG 1) vs "
                          "the words' read floor", "wall_s": time.time() - started, "compile_failures": failed,
                          "shapes": entries}, args.out)  # fmt: skip
            del bench
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
