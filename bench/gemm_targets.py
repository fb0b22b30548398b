"""GEMM targets on this GPU: one tuner study per target, each against its library baseline in the same run.

Targets (from the GEMM workload's issue):
- bf16 and fp16 at 4096^3 and 8192^3: best found >= 0.95 x ``torch.matmul`` of the same dtype;
- fp8 (e4m3, per-tensor scales) at 8192^3: >= 0.85 x ``torch._scaled_mm`` (bf16 output);
- bf16 at 8192 x 8192 x 8191: the tuner's best (``pad_k`` allowed) beats ``torch.matmul`` on the same shape.

Each study runs with the engine (Optuna, Ray workers, SQLite) over the default GEMM space
with the precision fixed. Its winner and the baseline are then re-measured interleaved
(A B A B ..., ``--rounds`` times) with the same stopwatch, and the ratio of the medians
is the verdict.

    PYTHONPATH=. python bench/gemm_targets.py --out bench/results/gemm-targets-h200.json
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.common import interleaved, median, run_study, tflops_measurer, verdict, write_result

#: name -> (m, n, k, precision, target ratio, strictly greater, baseline)
TARGETS: dict[str, tuple[int, int, int, str, float, bool, str]] = {
    "bf16-4096": (4096, 4096, 4096, "bf16", 0.95, False, "torch.matmul"),
    "fp16-4096": (4096, 4096, 4096, "fp16", 0.95, False, "torch.matmul"),
    "bf16-8192": (8192, 8192, 8192, "bf16", 0.95, False, "torch.matmul"),
    "fp16-8192": (8192, 8192, 8192, "fp16", 0.95, False, "torch.matmul"),
    "fp8-8192": (8192, 8192, 8192, "fp8", 0.85, False, "torch._scaled_mm"),
    "bf16-8192x8192x8191": (8192, 8192, 8191, "bf16", 1.0, True, "torch.matmul"),
}


def baseline_fn(m: int, n: int, k: int, precision: str, fast_accum: bool = False) -> Any:
    """A function returning the baseline's TFLOP/s on fresh standard-normal operands, timed by time_fn
    (fp8: ``torch._scaled_mm``, with ``use_fast_accum=fast_accum``)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", generator=gen)
    b = torch.randn(k, n, device="cuda", generator=gen)
    if precision == "fp8":
        scale_a = (a.abs().max() / 448.0).float().reshape(())
        scale_b = (b.abs().max() / 448.0).float().reshape(())
        a8 = (a / scale_a).to(torch.float8_e4m3fn)
        b8 = (b.t().contiguous() / scale_b).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs

        def call() -> Any:
            return torch._scaled_mm(
                a8, b8, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
            )

    else:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        a_t, b_t = a.to(dtype), b.to(dtype)

        def call() -> Any:
            return torch.matmul(a_t, b_t)

    del a, b
    return tflops_measurer(call, 2 * m * n * k)


def tuned_fn(m: int, n: int, k: int, config: dict[str, Any]) -> Any:
    from objectives.triton_gemm import TritonGemm
    from tuner.workloads.base import TrialContext
    from tuner.workloads.fingerprint import device_info

    workload = TritonGemm(m=m, n=n, k=k)
    device = device_info()

    def measure() -> float:
        result = workload.run(config, device, TrialContext())
        return result.metrics["tflops"] if result.ok else float("nan")

    return measure


def run_target(name: str, trials: int, minutes: float, rounds: int, seed: int) -> dict[str, Any]:
    import torch

    m, n, k, precision, target, strictly, baseline = TARGETS[name]
    space: dict[str, Any] = {"precision": {"choices": [precision]}}
    if k % 128 == 0:
        space["pad_k"] = {"choices": [False]}  # refused statically anyway: no proposal is wasted on it
    spec = {
        "name": f"gemm-target-{name}",
        "workload": "triton_gemm",
        "args": {"m": m, "n": n, "k": k},
        "space": space,
        "objectives": [{"metric": "tflops", "direction": "maximize"}],
        "budget": {"trials": trials, "minutes": minutes, "trial_timeout_s": 180},
        "sampler": "auto",
        "seed": seed,
        "remeasure": {"top_k": 3, "rounds": 2},
    }
    baseline_before = baseline_fn(m, n, k, precision)()
    study = run_study(spec)
    pick = study.summary.best
    best_in_study = study.best("tflops")
    out: dict[str, Any] = {
        "shape": {"m": m, "n": n, "k": k},
        "precision": precision,
        "baseline": baseline,
        "target": f"{'>' if strictly else '>='} {target} x {baseline}",
        "study": study.describe(),
        "baseline_tflops_before_study": baseline_before,
        "best_in_study": None
        if best_in_study is None
        else {"trial": best_in_study.number, "params": best_in_study.params, "tflops": best_in_study.metrics["tflops"]},
        "pick": None if pick is None else {"trial": pick.number, "params": pick.params, "metrics": pick.metrics},
    }
    if pick is None:
        out.update(ratio=None, verdict=verdict(None, target))
        return out
    values = interleaved(
        {"tuned": tuned_fn(m, n, k, pick.params), "baseline": baseline_fn(m, n, k, precision)}, rounds=rounds
    )
    tuned_median, baseline_median = median(values["tuned"]), median(values["baseline"])
    ratio = tuned_median / baseline_median if tuned_median and baseline_median else None
    out.update(
        interleaved_tflops=values,
        tuned_tflops_median=tuned_median,
        baseline_tflops_median=baseline_median,
        ratio=None if ratio is None else round(ratio, 3),
        verdict=verdict(ratio, target, strictly),
    )
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--minutes", type=float, default=1.5, help="budget.minutes of each study")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved re-measurement rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="8 trials per study, 2 rounds (a smoke run)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.rounds = 8, 2
    results = {}
    for name in args.targets:
        print(f"== {name}", flush=True)
        results[name] = run_target(name, args.trials, args.minutes, args.rounds, args.seed)
        print(f"   ratio {results[name]['ratio']} -> {results[name]['verdict']}", flush=True)
    summary = {
        name: {
            "ratio": r["ratio"],
            "target": r["target"],
            "verdict": r["verdict"],
            "pick": (r["pick"] or {}).get("params"),
        }
        for name, r in results.items()
    }
    write_result({"benchmark": "GEMM targets vs library baselines", "summary": summary, "targets": results}, args.out)


if __name__ == "__main__":
    main()
