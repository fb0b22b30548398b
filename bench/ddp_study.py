"""DDP training-step tuning of a GPT on 2 GPUs, against the default DDP/NCCL settings in the same run.

The ``ddp_step`` workload (objectives/ddp_step.py) trains the ``125m`` GPT preset of models/gpt.py in
DistributedDataParallel on two ranks (fresh processes per trial, tuner/run/gang.py). The study searches
``bucket_cap_mb``, ``gradient_as_bucket_view``, ``static_graph``, bf16/fp16 gradient compression and the
NCCL knobs, minimizing ``step_ms``; configs whose ``|loss_delta|`` (vs the same run without
compression) exceeds ``LOSS_TOLERANCE`` are infeasible. The baseline is torch's defaults (bucket 25 MB,
no bucket view, no static graph, no hook) with NCCL's own choices. Winner and baseline are then
re-measured interleaved (A B A B ..., each a fresh gang), and the script reports the median step times,
their ratio, the difference and a 95% interval of each median (order statistics, tuner.workloads.measure).
Target: tuned step time <= default.

    PYTHONPATH=. python bench/ddp_study.py --out bench/results/ddp-step-125m-h200x2.json
    PYTHONPATH=. python bench/ddp_study.py --quick --out /tmp/ddp-smoke.json
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

from bench.common import gang_backend, interleaved, median, run_study, verdict, write_result
from objectives.collective import DEFAULT, NCCL_KNOBS
from tuner.run.gang import run_gang
from tuner.workloads.measure import median_ci95

DEFAULT_CONFIG: dict[str, Any] = {
    "bucket_cap_mb": 25,
    "gradient_as_bucket_view": False,
    "static_graph": False,
    "comm_hook": "none",
    **{knob: DEFAULT for knob in NCCL_KNOBS},
}
LOSS_TOLERANCE = 0.02
TRIAL_TIMEOUT_S = 180


def step_ms(workload_args: dict[str, Any], config: dict[str, Any]) -> float:
    out = run_gang("ddp_step", workload_args, config, 2, backend=gang_backend(), trial_timeout_s=TRIAL_TIMEOUT_S)
    value = (out.get("metrics") or {}).get("step_ms")
    return float(value) if out["status"] == "ok" and value is not None else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the JSON result here")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny budget")
    parser.add_argument("--model", default="125m")
    parser.add_argument("--batch-per-rank", type=int, default=8)
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.quick:
        args.trials, args.minutes, args.rounds = 4, 1.0, 1
    workload_args = {
        "model": args.model,
        "batch_per_rank": args.batch_per_rank,
        "world_size": 2,
        "precision": args.precision,
        "steps": 10,
        "warmup_steps": 3,
    }
    started = time.time()
    spec = {
        "name": f"ddp-step-{args.model}",
        "workload": "ddp_step",
        "args": workload_args,
        "objectives": [{"metric": "step_ms"}],
        "constraints": [f"loss_delta <= {LOSS_TOLERANCE}", f"loss_delta >= {-LOSS_TOLERANCE}"],
        "budget": {"trials": args.trials, "minutes": args.minutes, "trial_timeout_s": TRIAL_TIMEOUT_S},
        "remeasure": {"top_k": 0},
        "sampler": "auto",
        "seed": 0,
        "resources": {"gpus_per_trial": 2},
    }
    run = run_study(spec)
    feasible = [t for t in run.ok() if t.feasible]
    best = min(feasible, key=lambda t: t.metrics["step_ms"]) if feasible else None
    result: dict[str, Any] = {"study": run.describe(), "workload_args": workload_args}
    if best is None:
        result["summary"] = {"verdict": "no result"}
        write_result(result, args.out)
        return
    print(f"winner trial {best.number}: {best.metrics['step_ms']:.2f} ms {best.params}", flush=True)
    values = interleaved(
        {
            "default": lambda: step_ms(workload_args, DEFAULT_CONFIG),
            "tuned": lambda: step_ms(workload_args, best.params),
        },
        rounds=args.rounds,
    )
    default_med, tuned_med = median(values["default"]), median(values["tuned"])
    ratio = default_med / tuned_med if default_med and tuned_med else None

    def interval(xs: list[float]) -> list[float] | None:
        finite = sorted(x for x in xs if x == x)
        return list(median_ci95(finite)) if finite else None

    result.update(
        {
            "winner": {"trial": best.number, "params": best.params, "metrics": best.metrics},
            "interleaved_step_ms": values,
            "wall_s": round(time.time() - started, 1),
            "summary": {
                "target": "tuned step time <= default (interleaved medians, same run)",
                "default_step_ms": default_med,
                "tuned_step_ms": tuned_med,
                "difference_ms": (default_med - tuned_med) if default_med and tuned_med else None,
                "default_ci95_ms": interval(values["default"]),
                "tuned_ci95_ms": interval(values["tuned"]),
                "speedup": ratio,
                "verdict": verdict(ratio, 1.0),
                "tuned_params": best.params,
            },
        }
    )
    write_result(result, args.out)


if __name__ == "__main__":
    main()
