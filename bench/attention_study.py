"""Flash attention forward on this GPU: one tuner study per shape, against torch SDPA's backends in the same run.

Shapes (from the attention workload's issue): B*S = 16384 tokens, H*D = 2048, S in {1024, 4096,
8192}, D in {64, 128}, causal and not: 12 shapes. For each one:

1. a study with the engine (Optuna, Ray worker, SQLite) over the ``flash_attention`` default space
   with precision fixed to bf16 (a space override), objective TFLOP/s;
2. baselines timed with the same stopwatch (:func:`tuner.workloads.measure.time_fn`) on the same bf16
   tensors: ``scaled_dot_product_attention`` with each backend forced through
   ``torch.nn.attention.sdpa_kernel`` (FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION); a
   backend that raises is skipped and the reason recorded;
3. the study's pick, the flash backend and the fastest backend re-measured interleaved
   (A B C A B C ..., ``--rounds`` times); the ratios of the medians are the verdicts.

Targets: tuned >= the flash backend (ratio >= 1.0) on every shape, and >= 0.9 x the fastest
backend at D=128. The studies share ``--total-minutes`` of wall time (each gets at most
``--minutes``), so the whole run stays within a small GPU budget.

    PYTHONPATH=. python bench/attention_study.py --out bench/results/attention-h200.json
    PYTHONPATH=. python bench/attention_study.py --quick --out /tmp/attention-smoke.json
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from bench.common import interleaved, median, run_study, verdict, write_result

TOKENS = 16384  # B * S
WIDTH = 2048  # H * D
SEQ_LENS = (1024, 4096, 8192)
HEAD_DIMS = (64, 128)
#: Target ratios: against the flash backend on every shape; against the fastest backend at D=128.
TARGET_VS_FLASH = 1.0
TARGET_VS_FASTEST = 0.9
#: SDPA backends timed as baselines, by the name used in the results.
BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
#: Seconds each shape needs besides its study (baselines, compiling the pick, interleaved rounds).
OVERHEAD_PER_SHAPE_S = 15.0
QUICK_SHAPES = ("s1024-d128-causal", "s4096-d64-full")


def shape_name(seq_len: int, head_dim: int, causal: bool) -> str:
    return f"s{seq_len}-d{head_dim}-{'causal' if causal else 'full'}"


#: name -> workload args
SHAPES: dict[str, dict[str, Any]] = {
    shape_name(s, d, causal): {
        "batch": TOKENS // s,
        "heads": WIDTH // d,
        "seq_len": s,
        "head_dim": d,
        "causal": causal,
    }
    for s in SEQ_LENS
    for d in HEAD_DIMS
    for causal in (False, True)
}


def make_tensors(args: dict[str, Any], seed: int) -> tuple[Any, Any, Any]:
    """The bf16 Q, K, V the workload's trials use (same masters, same seed), on the GPU."""
    import torch

    from kernels.attention.attention import make_masters, quantize

    masters = make_masters(args["batch"], args["heads"], args["seq_len"], args["head_dim"], "cuda", seed)
    tensors = quantize(masters, "bf16")
    del masters
    torch.cuda.empty_cache()
    return tensors


def timed_tflops(
    call: Callable[[], Any], flops: float, context: Callable[[], Any] | None = None
) -> Callable[[], float]:
    """A function that times ``call`` with :func:`time_fn` (GPU options) and returns TFLOP/s."""
    import contextlib

    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.measure import time_fn, timing_options

    device = device_info()

    def measure() -> float:
        with context() if context is not None else contextlib.nullcontext():
            timing = time_fn(call, device, **timing_options(True))
        return flops / (timing.median_ms * 1e-3) / 1e12

    return measure


def sdpa_baselines(
    q: Any, k: Any, v: Any, causal: bool, flops: float
) -> tuple[dict[str, Callable[[], float]], dict[str, float], dict[str, str], dict[str, Any]]:
    """Each SDPA backend that runs on these tensors: (measure functions, first TFLOP/s, why others were skipped,
    outputs for a numerics cross-check)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    measures: dict[str, Callable[[], float]] = {}
    first: dict[str, float] = {}
    skipped: dict[str, str] = {}
    outputs: dict[str, Any] = {}
    for name, backend_name in BACKENDS.items():
        backend = getattr(SDPBackend, backend_name, None)
        if backend is None:
            skipped[name] = f"torch {torch.__version__} has no SDPBackend.{backend_name}"
            continue

        def call(q: Any = q, k: Any = k, v: Any = v) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def context(backend: Any = backend) -> Any:
            return sdpa_kernel(backend)

        try:
            with sdpa_kernel(backend):
                outputs[name] = call()
            torch.cuda.synchronize()
            measure = timed_tflops(call, flops, context)
            first[name] = measure()
        except Exception as exc:  # a backend that does not support this shape/device
            skipped[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            outputs.pop(name, None)
            continue
        measures[name] = measure
    return measures, first, skipped, outputs


def run_shape(name: str, trials: int, minutes: float, rounds: int, seed: int) -> dict[str, Any]:
    import torch

    from kernels.attention.attention import attention
    from kernels.gemm.gemm import max_rel_error
    from objectives.flash_attention import FlashAttention

    args = SHAPES[name]
    spec = {
        "name": f"attention-{name}",
        "workload": "flash_attention",
        "args": {**args, "seed": seed},
        "space": {"precision": {"choices": ["bf16"]}},
        "objectives": [{"metric": "tflops", "direction": "maximize"}],
        "budget": {"trials": trials, "minutes": minutes, "trial_timeout_s": 120},
        "sampler": "auto",
        "seed": seed,
        "remeasure": {"top_k": 3, "rounds": 2},
    }
    study = run_study(spec)
    pick = study.summary.best
    best_in_study = study.best("tflops")
    flops = FlashAttention(**args).flops
    out: dict[str, Any] = {
        "args": args,
        "study": study.describe(),
        "best_in_study": None
        if best_in_study is None
        else {"trial": best_in_study.number, "params": best_in_study.params, "tflops": best_in_study.metrics["tflops"]},
        "pick": None if pick is None else {"trial": pick.number, "params": pick.params, "metrics": pick.metrics},
    }

    q, k, v = make_tensors(args, seed)
    measures, first, skipped, outputs = sdpa_baselines(q, k, v, args["causal"], flops)
    out.update(baseline_tflops_first=first, backends_skipped=skipped)
    fastest = max(first, key=first.get) if first else None
    candidates: dict[str, Callable[[], float]] = {}
    if pick is not None:
        config = pick.params
        tile = {p: int(config[p]) for p in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}
        tuned_out = torch.empty_like(q)

        def tuned_call() -> Any:
            return attention(
                q, k, v, causal=args["causal"], use_tma=bool(config.get("use_tma", False)), out=tuned_out, **tile
            )

        tuned_call()
        torch.cuda.synchronize()
        # The pick on these tensors against each backend's output (both bf16: a few 1e-3 apart).
        out["tuned_max_rel_diff_vs_backend"] = {b: max_rel_error(tuned_out, o.float()) for b, o in outputs.items()}
        candidates["tuned"] = timed_tflops(tuned_call, flops)
    del outputs
    for backend in dict.fromkeys(b for b in ("flash", fastest) if b is not None and b in measures):
        candidates[backend] = measures[backend]
    values = interleaved(candidates, rounds=rounds) if len(candidates) > 1 else {}
    medians = {name: median(samples) for name, samples in values.items()}
    out.update(interleaved_tflops=values, interleaved_median_tflops=medians, fastest_backend=fastest)

    def ratio_to(backend: str | None) -> float | None:
        tuned, theirs = medians.get("tuned"), medians.get(backend) if backend else None
        return round(tuned / theirs, 3) if tuned and theirs else None

    ratio_flash, ratio_fastest = ratio_to("flash"), ratio_to(fastest)
    out.update(
        ratio_vs_flash=ratio_flash,
        verdict_vs_flash=verdict(ratio_flash, TARGET_VS_FLASH),
        ratio_vs_fastest=ratio_fastest,
        verdict_vs_fastest=verdict(ratio_fastest, TARGET_VS_FASTEST)
        if args["head_dim"] == 128
        else "no target at D=64",
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", choices=list(SHAPES), help="default: all 12 (two with --quick)")
    parser.add_argument("--trials", type=int, default=24, help="budget.trials of each study")
    parser.add_argument("--minutes", type=float, default=1.5, help="budget.minutes cap of each study")
    parser.add_argument(
        "--total-minutes", type=float, default=6.0, help="wall time for everything; studies share what is left"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved re-measurement rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="two shapes, 6 trials, 2 rounds (a smoke run)")
    parser.add_argument("--out")
    args = parser.parse_args()
    import torch

    if args.quick:
        args.trials, args.rounds, args.minutes = 6, 2, min(args.minutes, 0.5)
    shapes = args.shapes or (list(QUICK_SHAPES) if args.quick else list(SHAPES))

    deadline = time.monotonic() + args.total_minutes * 60
    results: dict[str, Any] = {}
    for i, name in enumerate(shapes):
        left_s = deadline - time.monotonic()
        share_s = left_s / (len(shapes) - i) - OVERHEAD_PER_SHAPE_S
        minutes = round(max(0.25, min(args.minutes, share_s / 60)), 2)
        print(f"== {name} {SHAPES[name]}: study of <= {args.trials} trials / {minutes} min ({left_s:.0f} s left)")
        start = time.monotonic()
        results[name] = run_shape(name, args.trials, minutes, args.rounds, args.seed)
        torch.cuda.empty_cache()  # the shape's tensors are gone with run_shape's frame
        r = results[name]
        print(
            f"   {time.monotonic() - start:.0f} s; tuned {r['interleaved_median_tflops'].get('tuned')} TFLOP/s; "
            f"vs flash {r['ratio_vs_flash']} ({r['verdict_vs_flash']}); vs fastest ({r['fastest_backend']}) "
            f"{r['ratio_vs_fastest']} ({r['verdict_vs_fastest']})",
            flush=True,
        )

    summary: dict[str, Any] = {
        name: {
            "tuned_tflops": r["interleaved_median_tflops"].get("tuned"),
            "flash_tflops": r["interleaved_median_tflops"].get("flash"),
            "fastest_backend": r["fastest_backend"],
            "fastest_tflops": r["interleaved_median_tflops"].get(r["fastest_backend"]),
            "ratio_vs_flash": r["ratio_vs_flash"],
            "verdict_vs_flash": r["verdict_vs_flash"],
            "ratio_vs_fastest": r["ratio_vs_fastest"],
            "verdict_vs_fastest": r["verdict_vs_fastest"],
            "pick": (r["pick"] or {}).get("params"),
            "backends_skipped": r["backends_skipped"],
        }
        for name, r in results.items()
    }
    verdicts = [s["verdict_vs_flash"] for s in summary.values()]
    verdicts += [s["verdict_vs_fastest"] for s in summary.values() if s["verdict_vs_fastest"] != "no target at D=64"]
    summary["all_targets_met"] = bool(verdicts) and all(v == "met" for v in verdicts)
    summary["targets"] = (
        f"tuned >= {TARGET_VS_FLASH} x SDPA flash backend on every shape; "
        f">= {TARGET_VS_FASTEST} x the fastest SDPA backend at D=128"
    )
    write_result(
        {"benchmark": "flash attention forward vs torch SDPA backends", "summary": summary, "shapes": results},
        args.out,
    )


if __name__ == "__main__":
    main()
