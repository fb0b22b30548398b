"""Memory-bound targets on this GPU: RMSNorm and softmax over rows x cols bf16 against the copy bandwidth.

Target (from the issue): for each of ``rmsnorm`` and ``softmax`` at 8192 x 8192 bf16, the tuner's
best >= 0.85 x the copy bandwidth measured in the same run. Two copy bandwidths are measured:

- ``tuner.workloads.roofline.measure_copy_bandwidth_gbps()``: a 1 GiB device-to-device copy, the figure the
  workers use for each trial's ``roofline_fraction`` (before and after the studies);
- ``y.copy_(x)`` of the same rows x cols bf16 tensor, timed with ``tuner.workloads.measure.time_fn`` (L2
  flushed, adaptive repetitions), exactly like the kernels; it is re-measured interleaved with them.

The verdict uses the larger of the two (the stricter bar). The torch baselines
(``torch.nn.functional.rms_norm``, or the formula where it is missing; ``torch.softmax``) are timed
with the same stopwatch and reported as a ratio, without a target. GB/s counts the bytes the op
must move: x read once, y written once (+ the weight for RMSNorm), for the kernels and for torch.

Each study runs with the engine (Optuna, Ray workers, SQLite) over the workload's default space
with the precision fixed to bf16; its pick, torch and the same-shape copy are then re-measured
interleaved (A B C A B C ..., ``--rounds`` times).

    PYTHONPATH=. python bench/memory_bound_study.py --out bench/results/memory-bound-h200.json
    PYTHONPATH=. python bench/memory_bound_study.py --quick    # smoke run: 6 trials per study
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from bench.common import interleaved, median, run_study, verdict, write_result

WORKLOADS: tuple[str, ...] = ("rmsnorm", "softmax")
#: Best found >= this fraction of the measured copy bandwidth.
TARGET_VS_COPY = 0.85
EPS = 1e-6
#: Where the baselines' tensors live.
DEVICE = "cuda"


def _bf16_input(rows: int, cols: int) -> Any:
    """A standard-normal bf16 (rows, cols) tensor on the GPU."""
    import torch

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    return torch.randn(rows, cols, device=DEVICE, generator=gen).to(torch.bfloat16)


def _gbps_fn(call: Callable[[], Any], bytes_moved: float) -> Callable[[], float]:
    """A function timing ``call`` with time_fn (GPU options) and returning GB/s of ``bytes_moved``."""
    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.measure import GPU_TIMING, time_fn

    device = device_info()

    def measure() -> float:
        timing = time_fn(call, device, **GPU_TIMING)
        return bytes_moved / (timing.median_ms * 1e-3) / 1e9

    return measure


def copy_fn(rows: int, cols: int) -> Callable[[], float]:
    """GB/s of ``y.copy_(x)`` on a bf16 (rows, cols) tensor: bytes read plus written."""
    import torch

    x = _bf16_input(rows, cols)
    y = torch.empty_like(x)
    return _gbps_fn(lambda: y.copy_(x), 2 * x.numel() * x.element_size())


def torch_fn(name: str, rows: int, cols: int) -> tuple[Callable[[], float], str]:
    """The torch baseline of ``name`` in GB/s (same byte count as the workload) and its description."""
    import torch

    from tuner.workloads.registry import workload_class

    x = _bf16_input(rows, cols)
    bytes_moved = workload_class(name)(rows=rows, cols=cols).bytes_moved("bf16")
    if name == "softmax":
        return _gbps_fn(lambda: torch.softmax(x, dim=-1), bytes_moved), "torch.softmax(x, dim=-1)"
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    w = (1.0 + 0.5 * torch.randn(cols, device=DEVICE, generator=gen)).to(torch.bfloat16)
    rms_norm = getattr(torch.nn.functional, "rms_norm", None)
    if rms_norm is not None:
        return _gbps_fn(lambda: rms_norm(x, (cols,), w, EPS), bytes_moved), "torch.nn.functional.rms_norm"

    def formula() -> Any:
        xf = x.float()
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)

    return _gbps_fn(formula, bytes_moved), "x * rsqrt(mean(x^2) + eps) * w (fp32 math)"


def tuned_fn(name: str, rows: int, cols: int, config: dict[str, Any]) -> Callable[[], float]:
    """GB/s of the workload's own trial of ``config`` (numerics checked, then timed like in the study)."""
    from tuner.workloads.base import TrialContext
    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.registry import workload_class

    workload = workload_class(name)(rows=rows, cols=cols)
    device = device_info()

    def measure() -> float:
        result = workload.run(config, device, TrialContext())
        return result.metrics["gbps"] if result.ok else float("nan")

    return measure


def run_workload(
    name: str, rows: int, cols: int, trials: int, minutes: float, rounds: int, seed: int, copy_1gib_gbps: float
) -> dict[str, Any]:
    """One study of ``name``, then its pick, torch and the same-shape copy re-measured interleaved."""
    import torch

    spec = {
        "name": f"{name}-{rows}x{cols}-bf16",
        "workload": name,
        "args": {"rows": rows, "cols": cols},
        "space": {"precision": {"choices": ["bf16"]}},
        "objectives": [{"metric": "gbps", "direction": "maximize"}],
        "constraints": ["max_rel_error <= 0.05"],
        "budget": {"trials": trials, "minutes": minutes, "trial_timeout_s": 120},
        "sampler": "auto",
        "seed": seed,
        "remeasure": {"top_k": 3, "rounds": 2},
    }
    baseline, baseline_name = torch_fn(name, rows, cols)
    baseline_before = baseline()
    print(f"   torch before the study: {baseline_before:.0f} GB/s", flush=True)
    study = run_study(spec)
    pick = study.summary.best
    best_in_study = study.best("gbps")
    out: dict[str, Any] = {
        "shape": {"rows": rows, "cols": cols},
        "precision": "bf16",
        "baseline": baseline_name,
        "target": f">= {TARGET_VS_COPY} x measured copy bandwidth",
        "study": study.describe(),
        "torch_gbps_before_study": baseline_before,
        "best_in_study": None
        if best_in_study is None
        else {"trial": best_in_study.number, "params": best_in_study.params, "metrics": best_in_study.metrics},
        "pick": None if pick is None else {"trial": pick.number, "params": pick.params, "metrics": pick.metrics},
    }
    if pick is None:
        out.update(ratio_vs_copy=None, ratio_vs_torch=None, verdict=verdict(None, TARGET_VS_COPY))
        return out
    values = interleaved(
        {"tuned": tuned_fn(name, rows, cols, pick.params), "torch": baseline, "copy": copy_fn(rows, cols)},
        rounds=rounds,
    )
    tuned, torch_median, copy_median = median(values["tuned"]), median(values["torch"]), median(values["copy"])
    copy_bar = max(v for v in (copy_median, copy_1gib_gbps) if v)
    ratio_vs_copy = tuned / copy_bar if tuned else None
    out.update(
        interleaved_gbps=values,
        tuned_gbps_median=tuned,
        torch_gbps_median=torch_median,
        copy_same_shape_gbps_median=copy_median,
        copy_bar_gbps=copy_bar,
        ratio_vs_copy=None if ratio_vs_copy is None else round(ratio_vs_copy, 3),
        ratio_vs_copy_same_shape=round(tuned / copy_median, 3) if tuned and copy_median else None,
        ratio_vs_copy_1gib=round(tuned / copy_1gib_gbps, 3) if tuned and copy_1gib_gbps else None,
        ratio_vs_torch=round(tuned / torch_median, 3) if tuned and torch_median else None,
        verdict=verdict(ratio_vs_copy, TARGET_VS_COPY),
    )
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=8192)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--minutes", type=float, default=1.5, help="budget.minutes of each study")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved re-measurement rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="6 trials and 0.5 minutes per study, 2 rounds")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.minutes, args.rounds = 6, 0.5, 2

    from tuner.workloads.roofline import measure_copy_bandwidth_gbps

    copy_1gib_before = measure_copy_bandwidth_gbps()
    copy_same_shape_before = copy_fn(args.rows, args.cols)()
    print(f"copy: 1 GiB {copy_1gib_before} GB/s, same shape {copy_same_shape_before:.0f} GB/s", flush=True)
    results = {}
    for name in args.workloads:
        print(f"== {name} {args.rows}x{args.cols} bf16", flush=True)
        results[name] = run_workload(
            name, args.rows, args.cols, args.trials, args.minutes, args.rounds, args.seed, copy_1gib_before
        )
        r = results[name]
        print(
            f"   tuned {r.get('tuned_gbps_median')} GB/s; vs copy {r['ratio_vs_copy']} -> {r['verdict']}; "
            f"vs torch {r['ratio_vs_torch']}",
            flush=True,
        )
    copy_1gib_after = measure_copy_bandwidth_gbps()
    summary: dict[str, Any] = {
        name: {
            "tuned_gbps": r.get("tuned_gbps_median"),
            "ratio_vs_copy": r["ratio_vs_copy"],
            "ratio_vs_copy_same_shape": r.get("ratio_vs_copy_same_shape"),
            "ratio_vs_copy_1gib": r.get("ratio_vs_copy_1gib"),
            "target": r["target"],
            "verdict": r["verdict"],
            "torch_gbps": r.get("torch_gbps_median"),
            "ratio_vs_torch": r["ratio_vs_torch"],
            "pick": (r["pick"] or {}).get("params"),
        }
        for name, r in results.items()
    }
    summary["copy_gbps"] = {
        "1gib_before": copy_1gib_before,
        "1gib_after": copy_1gib_after,
        "same_shape_before": copy_same_shape_before,
    }
    write_result(
        {
            "benchmark": "memory-bound row-wise kernels (rmsnorm, softmax) vs copy bandwidth and torch",
            "summary": summary,
            "workloads": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
