"""A multi-objective GEMM study on the GPUs of this machine, against torch.matmul in the same run.

Runs the engine end to end (Ray worker per GPU, Optuna, SQLite) on the
``triton_gemm`` workload's default space (tile sizes, warps, stages, all five
precisions), objectives TFLOP/s (max) and max relative error (min). In the
same run it times ``torch.matmul`` in bf16 on the same shape with the same
stopwatch, before the study and again after it, interleaved with the best
bf16 config found, so clock drift cannot favour either side.

    python bench/gemm_study.py --size 8192 --trials 60 --out $OUT/gemm-study.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def baseline_bf16_tflops(size: int, rounds: int = 1) -> list[float]:
    import torch

    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.measure import time_fn

    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=gen)
    device = device_info()
    out = []
    for _ in range(rounds):
        timing = time_fn(lambda: torch.matmul(a, b), device, warmup_ms=25, rep_ms=200, min_reps=10, max_reps=1000)
        out.append(2 * size**3 / (timing.median_ms * 1e-3) / 1e12)
    return out


def remeasure_interleaved(size: int, config: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """Best bf16 config and torch.matmul, A B A B ..., each with the same stopwatch."""
    from objectives.triton_gemm import TritonGemm
    from tuner.workloads.base import TrialContext
    from tuner.workloads.fingerprint import device_info
    from tuner.workloads.roofline import gpu_clock_and_temperature

    workload = TritonGemm(m=size, n=size, k=size)
    device = device_info()
    ours, theirs, clocks = [], [], []
    for _ in range(rounds):
        result = workload.run(config, device, TrialContext())
        ours.append(result.metrics["tflops"])
        clocks.append(gpu_clock_and_temperature())
        theirs.extend(baseline_bf16_tflops(size))
        clocks.append(gpu_clock_and_temperature())
    return {"tuned_bf16_tflops": ours, "torch_matmul_bf16_tflops": theirs, "clock_after_each": clocks}


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved re-measurement rounds")
    parser.add_argument("--db", help="SQLite file (default: a fresh temporary file)")
    parser.add_argument("--out", help="write the result JSON here")
    return parser.parse_args()


def _study_spec(size: int, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "name": f"gemm-{size}-multiobjective",
        "workload": "triton_gemm",
        "args": {"m": size, "n": size, "k": size},
        "objectives": [{"metric": "tflops", "direction": "maximize"}, {"metric": "max_rel_error"}],
        "constraints": ["max_rel_error <= 0.1"],
        "budget": {"trials": args.trials, "trial_timeout_s": 180},
        "sampler": "auto",
        "seed": args.seed,
    }


def _trial_row(t: Any, origin: str) -> dict[str, Any]:
    return {
        "trial": t.number,
        "status": t.status,
        "origin": origin,
        "params": t.params,
        "metrics": t.metrics,
        "worker": t.worker,
        "duplicate_of": t.duplicate_of,
        "remeasured": t.remeasured,
        "seconds": round((t.finished_at - t.started_at).total_seconds(), 2) if t.finished_at else None,
    }


def _best_rows(
    best_bf16: Any, best_bf16_sampler: Any, best_any: Any, origin: Any, seconds_to: Any, torch_median: float
) -> dict[str, Any]:
    """The result's rows of the best bf16 trial (any, from the sampler), the default pick and the best overall."""
    return {
        "best_bf16": None
        if best_bf16 is None
        else {
            "trial": best_bf16.number,
            "origin": origin(best_bf16),
            "params": best_bf16.params,
            "tflops_in_study": best_bf16.metrics["tflops"],
            "seconds_to_find": seconds_to(best_bf16),
        },
        "best_bf16_from_sampler_proposals": None
        if best_bf16_sampler is None
        else {
            "trial": best_bf16_sampler.number,
            "params": best_bf16_sampler.params,
            "tflops_in_study": best_bf16_sampler.metrics["tflops"],
            "ratio_to_torch_matmul": round(best_bf16_sampler.metrics["tflops"] / torch_median, 3),
        },
        "default_pick_after_interleaved_remeasure": None
        if best_any is None
        else {"trial": best_any.number, "params": best_any.params, "remeasured": best_any.remeasured},
        "best_overall": None
        if best_any is None
        else {
            "trial": best_any.number,
            "params": best_any.params,
            "metrics": best_any.metrics,
            "seconds_to_find": seconds_to(best_any),
        },
    }


def _trial_counts(summary: Any, trials: list[Any], measured: list[Any]) -> dict[str, Any]:
    """The result's counts of trials by outcome, and the failures."""
    return {
        "workers": len({t.worker.split(".")[0] for t in measured if t.worker}),
        "study_status": summary.status,
        "trials_measured": len(measured),
        "trials_static_pruned": sum(t.status == "infeasible_static" for t in trials),
        "trials_reusing_a_repeated_config": sum(t.duplicate_of is not None for t in trials),
        "status_breakdown": summary.counts,
        "failures": [
            {"trial": t.number, "status": t.status, "params": t.params, "error": (t.error or "")[-300:]}
            for t in measured
            if t.status != "ok"
        ],
    }


def _report(result: dict[str, Any], out: str | None, torch_median: float, tuned_median: float | None) -> None:
    text = json.dumps(result, indent=2, default=str)
    if out:
        Path(out).write_text(text + "\n")
    short = {k: result[k] for k in ("status_breakdown", "trials_per_minute", "best_bf16", "best_overall")}
    print(json.dumps(short, indent=2, default=str))
    print(
        f"torch.matmul bf16 {torch_median:.1f} TFLOP/s; best bf16 found {tuned_median} TFLOP/s; "
        f"ratio {result['ratio_best_bf16_to_torch_matmul']}"
    )

def main() -> None:
    args = _parse_args()

    from tuner.run.orchestrator import Orchestrator
    from tuner.store.storage import StudyDB
    from tuner.study.spec import load_spec
    from tuner.workloads.fingerprint import fingerprint

    size = args.size
    spec = _study_spec(size, args)
    compiled = load_spec(spec)
    baseline_before = baseline_bf16_tflops(size)
    db_path = Path(args.db) if args.db else Path(tempfile.mkdtemp()) / "gemm-study.db"
    db = StudyDB(str(db_path))

    def on_progress(p: Any) -> None:
        best = f"{p.best_value:.1f}" if p.best_value is not None else "-"
        print(f"  {p.finished}/{p.budget_trials} done, {p.failed} failed, best tflops {best}", flush=True)

    wall_start = time.time()
    summary = Orchestrator(compiled, db, progress=on_progress).run()
    trials = db.trials(summary.study_id)
    measured = [t for t in trials if t.status != "infeasible_static" and t.duplicate_of is None]
    ok = [t for t in measured if t.status == "ok"]
    seeds = {json.dumps(s, sort_keys=True) for s in compiled.space.seeds}

    def origin(t: Any) -> str:
        return "seed" if json.dumps(t.params, sort_keys=True) in seeds else "sampler"

    def best_of(rows: list[Any]) -> Any | None:
        return max(rows, key=lambda t: t.metrics["tflops"]) if rows else None

    bf16 = [t for t in ok if t.params["precision"] == "bf16"]
    best_bf16 = best_of(bf16)
    best_bf16_sampler = best_of([t for t in bf16 if origin(t) == "sampler"])
    first_start = min(t.started_at for t in measured)
    best_any = summary.best

    def seconds_to(t: Any | None) -> float | None:
        return None if t is None else round((t.finished_at - first_start).total_seconds(), 1)

    interleaved = remeasure_interleaved(size, best_bf16.params, args.rounds) if best_bf16 else {}
    baseline_after = baseline_bf16_tflops(size)
    all_baseline = baseline_before + baseline_after + interleaved.get("torch_matmul_bf16_tflops", [])
    torch_median = statistics.median(all_baseline)
    tuned_median = statistics.median(interleaved["tuned_bf16_tflops"]) if interleaved else None
    loop_minutes = summary.loop_s / 60
    result = {
        "benchmark": "multi-objective triton_gemm study vs torch.matmul bf16",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "fingerprint": fingerprint(),
        "shape": {"m": size, "n": size, "k": size},
        "spec": spec,
        "space_points": compiled.space.size(),
        **_trial_counts(summary, trials, measured),
        "trials_per_minute": round(len(measured) / loop_minutes, 2) if loop_minutes else None,
        "startup_s": round(summary.startup_s, 1),
        "study_loop_s": round(summary.loop_s, 1),
        "wall_s": round(time.time() - wall_start, 1),
        **_best_rows(best_bf16, best_bf16_sampler, best_any, origin, seconds_to, torch_median),
        "pareto_front": [{"trial": t.number, "params": t.params, "metrics": t.metrics} for t in summary.pareto],
        "torch_matmul_bf16_tflops": {
            "before_study": baseline_before,
            "after_study": baseline_after,
            "interleaved": interleaved.get("torch_matmul_bf16_tflops"),
            "median": round(torch_median, 1),
        },
        "tuned_bf16_tflops_interleaved": interleaved.get("tuned_bf16_tflops"),
        "sm_clock_and_temperature_after_each_interleaved_measurement": interleaved.get("clock_after_each"),
        "roofline": {
            "device": (db.find_study(spec["name"]).device or {}).get("roofline"),
            "best_bf16_roofline_fraction": None if best_bf16 is None else best_bf16.metrics.get("roofline_fraction"),
            "best_overall_roofline_fraction": None if best_any is None else best_any.metrics.get("roofline_fraction"),
        },
        "ratio_best_bf16_to_torch_matmul": round(tuned_median / torch_median, 3) if tuned_median else None,
        "target": ">= 0.85 x torch.matmul bf16",
        "trials": [_trial_row(t, origin(t)) for t in trials],
    }
    _report(result, args.out, torch_median, tuned_median)

if __name__ == "__main__":
    main()
