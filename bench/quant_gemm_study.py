"""Weight-only int4/int8 GEMM at decode shapes: one tuner study per (M, bits), against bf16 torch.matmul.

Targets (from the quant_gemm workload's issue): for M in {1, 16, 64} and N = K = 8192, with int4 and
with int8 weights (group 128, bf16 activations and scales), the tuner's best ``quant_gemm`` config is
faster than ``torch.matmul`` of the bf16 activations and the unquantized bf16 weights on the same shape
(ratio of medians > 1.0). Each target's max_rel_error (against that bf16 product) is reported.

Each study runs with the engine (Optuna, Ray workers, SQLite) over the workload's default space with
bits, group size and precision fixed by space overrides, so the study searches the kernel's knobs only
(BLOCK_M: the GEMV kernel's 1 or the smallest power of two >= 16 and >= M: taller row tiles only
repeat rows).
Its winner and the baseline are then re-measured interleaved (A B A B ..., ``--rounds`` times).

Both sides are timed the same way: ``tuner.workloads.measure.time_fn`` with ``cuda_graph=True`` (these products
take microseconds; a graph of many calls removes the launch overhead, as in a graph-captured decode
loop) and the default GPU options (L2 flushed before each replay), and both rotate over copies of their
weights worth >= 256 MiB, so every call reads its weights from HBM rather than from L2.

    PYTHONPATH=. python bench/quant_gemm_study.py --out $OUT/quant-gemm-h200.json
    PYTHONPATH=. python bench/quant_gemm_study.py --quick --targets int4-m16   # smoke run
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from bench.common import interleaved, median, run_study, verdict, write_result
from objectives.quant_gemm import GEMV_MAX_M

N = K = 8192
GROUP_SIZE = 128
#: name -> (m, bits)
TARGETS: dict[str, tuple[int, int]] = {f"int{bits}-m{m}": (m, bits) for bits in (4, 8) for m in (1, 16, 64)}
TARGET_RATIO = 1.0
TIMING_NOTE = (
    "both sides: tuner.workloads.measure.time_fn(cuda_graph=True, GPU_TIMING), L2 flushed before each graph replay, "
    "weights rotated over copies >= 256 MiB so each call reads them from HBM"
)


def block_m_choices(m: int) -> list[int]:
    """BLOCK_M values a study at M rows searches: 1 (GEMV) up to 8 rows, then 16 .. next power of two >= M."""
    top = max(16, 1 << (m - 1).bit_length())
    return ([1] if m <= GEMV_MAX_M else []) + [b for b in (16, 32, 64, 128) if b <= top]


def make_spec(m: int, bits: int, trials: int, minutes: float, seed: int, n: int = N, k: int = K) -> dict[str, Any]:
    """The study of one target: the default space with bits, group size and precision fixed."""
    return {
        "name": f"quant-gemm-int{bits}-m{m}-n{n}-k{k}",
        "workload": "quant_gemm",
        "args": {"m": m, "n": n, "k": k},
        "space": {
            "bits": {"choices": [bits]},
            "group_size": {"choices": [GROUP_SIZE]},
            "precision": {"choices": ["bf16"]},
            # Row tiles taller than M only repeat rows: GEMV (1, up to 8 rows) and the powers of two
            # from 16 (the least tl.dot takes) to the smallest >= M; smaller tiles than M re-read each
            # weight tile from L2, once per row tile, but decode fewer weights per program.
            "BLOCK_M": {"choices": block_m_choices(m)},
        },
        "objectives": [{"metric": "tflops", "direction": "maximize"}],
        "budget": {"trials": trials, "minutes": minutes, "trial_timeout_s": 120},
        "sampler": "auto",
        "seed": seed,
        "remeasure": {"top_k": 3, "rounds": 2},
    }


def baseline_fn(m: int, n: int, k: int) -> Any:
    """A function returning torch.matmul's TFLOP/s for X bf16 (M, K) @ W bf16 (K, N), timed as a CUDA graph."""
    import torch

    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.measure import GPU_TIMING, L2_FLUSH_BYTES, time_fn

    device = device_info()
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(k, n, device="cuda", generator=gen).to(torch.bfloat16)
    copies = max(1, math.ceil(L2_FLUSH_BYTES / (w.numel() * w.element_size())))
    weights = [w, *(w.clone() for _ in range(copies - 1))]
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    turn = [0]

    def call() -> None:
        torch.matmul(x, weights[turn[0]], out=y)
        turn[0] = (turn[0] + 1) % len(weights)

    def measure() -> float:
        timing = time_fn(call, device, **{**GPU_TIMING, "cuda_graph": True})
        return 2 * m * n * k / (timing.median_ms * 1e-3) / 1e12

    return measure


def tuned_fn(m: int, n: int, k: int, config: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """A function returning the config's TFLOP/s as the workload measures it, and the list it logs results to."""
    from objectives.quant_gemm import QuantGemm
    from tuner.workloads.base import TrialContext
    from tuner.workloads.fingerprint import device_info

    workload = QuantGemm(m=m, n=n, k=k)
    device = device_info()
    log: list[dict[str, Any]] = []

    def measure() -> float:
        result = workload.run(config, device, TrialContext())
        log.append(
            {
                "status": result.status.value,
                "metrics": result.metrics,
                "dequant_rel_error": result.extra.get("dequant_rel_error"),
                "timing_mode": (result.extra.get("timing") or {}).get("mode"),
                "error": result.error,
            }
        )
        return result.metrics["tflops"] if result.ok else float("nan")

    return measure, log


def run_target(name: str, trials: int, minutes: float, rounds: int, seed: int) -> dict[str, Any]:
    import torch

    m, bits = TARGETS[name]
    spec = make_spec(m, bits, trials, minutes, seed)
    baseline_before = baseline_fn(m, N, K)()
    print(f"   torch.matmul bf16 {baseline_before:.1f} TFLOP/s before the study", flush=True)
    study = run_study(spec)
    pick = study.summary.best
    best_in_study = study.best("tflops")
    out: dict[str, Any] = {
        "shape": {"m": m, "n": N, "k": K},
        "quantization": {"bits": bits, "group_size": GROUP_SIZE, "precision": "bf16", "scales": "bf16"},
        "baseline": "torch.matmul bf16 (X bf16 @ W bf16, unquantized)",
        "target": f"> {TARGET_RATIO} x baseline",
        "timing": TIMING_NOTE,
        "study": study.describe(),
        "baseline_tflops_before_study": baseline_before,
        "best_in_study": None
        if best_in_study is None
        else {"trial": best_in_study.number, "params": best_in_study.params, "metrics": best_in_study.metrics},
        "pick": None if pick is None else {"trial": pick.number, "params": pick.params, "metrics": pick.metrics},
    }
    if pick is None:
        out.update(ratio=None, verdict=verdict(None, TARGET_RATIO, strictly=True), max_rel_error=None)
        return out
    tuned, log = tuned_fn(m, N, K, pick.params)
    values = interleaved({"tuned": tuned, "baseline": baseline_fn(m, N, K)}, rounds=rounds)
    tuned_median, baseline_median = median(values["tuned"]), median(values["baseline"])
    ratio = tuned_median / baseline_median if tuned_median and baseline_median else None
    ok_runs = [entry for entry in log if entry["status"] == "ok"]
    out.update(
        interleaved_tflops=values,
        tuned_runs=log,
        tuned_tflops_median=tuned_median,
        baseline_tflops_median=baseline_median,
        tuned_latency_us=None if not tuned_median else round(2 * m * N * K / (tuned_median * 1e12) * 1e6, 2),
        baseline_latency_us=None if not baseline_median else round(2 * m * N * K / (baseline_median * 1e12) * 1e6, 2),
        max_rel_error=ok_runs[0]["metrics"]["max_rel_error"] if ok_runs else None,
        dequant_rel_error=ok_runs[0]["dequant_rel_error"] if ok_runs else None,
        ratio=None if ratio is None else round(ratio, 3),
        verdict=verdict(ratio, TARGET_RATIO, strictly=True),
    )
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--minutes", type=float, default=1.0, help="budget.minutes of each study")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved re-measurement rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="6 trials and 0.5 minutes per study, 2 rounds")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.minutes, args.rounds = 6, 0.5, 2
    results = {}
    for name in args.targets:
        print(f"== {name} (M={TARGETS[name][0]}, N=K={N}, int{TARGETS[name][1]} g{GROUP_SIZE})", flush=True)
        results[name] = run_target(name, args.trials, args.minutes, args.rounds, args.seed)
        r = results[name]
        print(
            f"   tuned {r.get('tuned_tflops_median')} vs torch.matmul bf16 {r.get('baseline_tflops_median')} "
            f"TFLOP/s: ratio {r['ratio']} -> {r['verdict']} (max_rel_error {r['max_rel_error']})",
            flush=True,
        )
    summary = {
        name: {
            "ratio": r["ratio"],
            "target": r["target"],
            "verdict": r["verdict"],
            "max_rel_error": r["max_rel_error"],
            "tuned_latency_us": r.get("tuned_latency_us"),
            "baseline_latency_us": r.get("baseline_latency_us"),
            "pick": (r["pick"] or {}).get("params"),
        }
        for name, r in results.items()
    }
    write_result(
        {
            "benchmark": "weight-only quantized GEMM (quant_gemm) vs torch.matmul bf16 at decode shapes",
            "timing": TIMING_NOTE,
            "summary": summary,
            "targets": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
