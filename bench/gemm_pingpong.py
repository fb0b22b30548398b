"""The Gluon ping-pong GEMM (``kernels/gemm/gemm_ws.py``) against cuBLAS and the persistent TMA kernel, side by side.

For each target (bf16 and fp16 at 8192^3, 8192x14336x4096 and 8192x4096x4096) the kernel's configs are checked
against an fp32 product and timed once (CUDA events, L2 flushed); the fastest is re-measured interleaved with
``torch.matmul`` (cuBLAS) and with the persistent TMA kernel's winner of the earlier runs (``persistent_tma_ws``
128x256x64, 8 warps, 3 stages, EPILOGUE_SUBTILE), ``--rounds`` times; the ratio of the medians is the verdict.

    PYTHONPATH=. python bench/gemm_pingpong.py --out bench/results/kernel-variants-pingpong-h200.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import interleaved, median, tflops_measurer, verdict, write_result
from bench.gemm_targets import baseline_fn
from bench.kernel_variants import GEMM_SHAPES

#: (BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, GROUP_M) tried per target.
CONFIGS: list[tuple[int, int, int, int, int]] = [
    (128, 128, 64, 4, 8),
    (128, 128, 64, 5, 8),
    (128, 128, 64, 4, 16),
    (128, 128, 64, 5, 4),
    (128, 128, 128, 2, 8),
    (64, 256, 64, 4, 8),
    (128, 128, 32, 8, 8),
    (128, 128, 32, 6, 16),
    (64, 256, 32, 6, 8),
]
PERSISTENT = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
              "epilogue_subtile": True, "warp_specialize": True}  # fmt: skip


def _operands(m: int, n: int, k: int, precision: str) -> tuple[Any, Any, Any]:
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    b = torch.randn(k, n, device="cuda", generator=gen).to(dtype)
    return a, b, torch.empty(m, n, device="cuda", dtype=dtype)


def run_target(shape: str, precision: str, rounds: int) -> dict[str, Any]:
    import torch

    from kernels.gemm.gemm_tma import matmul_persistent
    from kernels.gemm.gemm_ws import check_config, matmul_pingpong

    m, n, k = GEMM_SHAPES[shape]
    flops = 2.0 * m * n * k
    a, b, out = _operands(m, n, k, precision)
    reference = a.float() @ b.float()
    scale = reference.abs().max().item()
    sweep = []
    for bm, bn, bk, stages, group in CONFIGS:
        knobs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "NUM_STAGES": stages, "GROUP_M": group}
        reason = check_config(precision, bm, bn, bk, stages, 240)
        if reason:
            sweep.append({"config": knobs, "skipped": reason})
            continue
        try:
            out.zero_()
            matmul_pingpong(a, b, out=out, **knobs)
            torch.cuda.synchronize()
        except Exception as exc:  # a config that fails to compile or run is recorded, not fatal
            sweep.append({"config": knobs, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        error = ((out.float() - reference).abs().max() / scale).item()
        entry: dict[str, Any] = {"config": knobs, "max_rel_error": error}
        if error < (1e-2 if precision == "bf16" else 2e-3):
            call = lambda knobs=knobs: matmul_pingpong(a, b, out=out, **knobs)  # noqa: E731
            entry["tflops"] = round(tflops_measurer(call, flops)(), 1)
        sweep.append(entry)
        print(f"    {entry}", flush=True)
    timed = [e for e in sweep if "tflops" in e]
    if not timed:
        return {"shape": shape, "precision": precision, "sweep": sweep, "target": None}
    best = max(timed, key=lambda e: e["tflops"])["config"]
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    values = interleaved(
        {
            "pingpong": tflops_measurer(lambda: matmul_pingpong(a, b, out=out, **best), flops),
            "baseline": baseline_fn(m, n, k, precision),
            "persistent_tma_ws": tflops_measurer(
                lambda: matmul_persistent(a, b, precision=precision, num_sms=num_sms, out=out, **PERSISTENT), flops
            ),
        },
        rounds,
    )
    tuned, base = median(values["pingpong"]), median(values["baseline"])
    ratio = tuned / base if tuned and base else None
    row = {"target": f"GEMM {precision} {shape} vs torch.matmul (ping-pong)", "tuned": round(tuned or 0, 1),
           "baseline": round(base or 0, 1), "ratio": None if ratio is None else round(ratio, 4), "goal": 1.0,
           "verdict": verdict(ratio, 1.0)}  # fmt: skip
    print(f"  {row}  persistent_tma_ws {median(values['persistent_tma_ws'])}", flush=True)
    return {"shape": {"m": m, "n": n, "k": k}, "precision": precision, "sweep": sweep, "winner": best,
            "interleaved_tflops": values, "target": row}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--precisions", nargs="*", default=["bf16", "fp16"])
    ns = parser.parse_args()
    result: dict[str, Any] = {"benchmark": "Gluon ping-pong GEMM vs cuBLAS and persistent_tma_ws", "gemm": []}
    started = time.time()
    for precision in ns.precisions:
        for shape in GEMM_SHAPES:
            print(f"GEMM {precision} {shape}", flush=True)
            result["gemm"].append(run_target(shape, precision, ns.rounds))
            result["targets"] = [g["target"] for g in result["gemm"] if g.get("target")]
            result["seconds"] = round(time.time() - started, 1)
            write_result(result, ns.out)


if __name__ == "__main__":
    main()
