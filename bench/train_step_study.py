"""Training-step tuning of a ~1B GPT at seq 2048 on this GPU, against the default config in the same run.

The ``train_step`` workload (objectives/train_step.py) runs whole AdamW steps of the ``1b`` preset
of ``models/gpt.py`` (18 layers, d_model 2048, 16 heads, vocab 32000, seq 2048: 0.98B parameters)
at a fixed global batch (``--global-batch`` sequences per step). The script:

1. runs a 3-objective study with the engine (Optuna, Ray worker, SQLite): ``tokens_per_s`` (max),
   ``peak_mem_gb`` (min), ``loss_error`` (``|loss_delta|``, min) over the default space, except that ``compile``
   is limited to off/default (``max-autotune-no-cudagraphs`` autotunes every GEMM of the model for
   minutes: more than this study's budget) and ``micro_batch`` to the global batch;
2. runs a second, short study maximizing ``tokens_per_s`` under the constraint ``peak_mem_gb <= 24``
   and the workload's ``memory_limit_gb: 24``, under which configs whose estimated peak exceeds the
   limit are refused before they run (0.98B parameters with fp32 weights, gradients and AdamW
   moments are 15.6 GB; with 24 layers, 1.28B parameters, they were 20.4 GB and no config of the
   first H200 run fitted);
3. re-measures the study's fastest config whose ``|loss_delta| <= LOSS_TOLERANCE`` against the
   baseline, interleaved (A B A B ...), both through the same workload and stopwatch. The baseline
   is the *default config* a user gets without tuning: fp32 (IEEE, TF32 off), eager, micro-batch 1
   with gradient accumulation up to the global batch, no checkpointing, SDPA with torch's backend
   choice, foreach AdamW (torch's default).

A training step changes the model, so the stopwatch is the workload's own (CUDA events between
consecutive steps, see objectives/train_step.py), not :func:`tuner.workloads.measure.time_fn`'s repetitions.

Targets: tuned tokens/s >= 1.5 x the default config; the tuned config's MFU >= 0.40 (PaLM model
FLOPs over the dense peak of its precision); a Pareto front of >= 5 configs; a feasible config
under 24 GB (reported with its throughput cost against the unconstrained winner).

    PYTHONPATH=. python bench/train_step_study.py --out bench/results/train-step-1b-h200.json
    PYTHONPATH=. python bench/train_step_study.py --quick --out /tmp/train-step-smoke.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import interleaved, median, run_study, verdict, write_result

#: The config a user gets without tuning (grad_accum follows from the global batch).
DEFAULT_CONFIG: dict[str, Any] = {
    "micro_batch": 1,
    "precision": "fp32",
    "checkpoint": 0,
    "compile": "off",
    "attention": "sdpa",
    "optimizer": "adamw_foreach",
}
TARGET_SPEEDUP = 1.5
TARGET_MFU = 0.40
TARGET_PARETO = 5
MEMORY_LIMIT_GB = 24.0
#: The tuned config must train like fp32: |loss_delta| at most this (nats, at step reference_steps).
LOSS_TOLERANCE = 0.1


def trial_row(t: Any) -> dict[str, Any]:
    return {"trial": t.number, "status": t.status, "params": t.params, "metrics": t.metrics}


def study_spec(name: str, workload_args: dict[str, Any], args: argparse.Namespace, **changes: Any) -> dict[str, Any]:
    spec = {
        "name": name,
        "workload": "train_step",
        "args": workload_args,
        "space": {
            "micro_batch": {"high": args.global_batch},
            "compile": {"choices": ["off", "default"]},
        },
        "objectives": [
            {"metric": "tokens_per_s", "direction": "maximize"},
            {"metric": "peak_mem_gb", "direction": "minimize"},
            {"metric": "loss_error", "direction": "minimize"},
        ],
        "budget": {"trials": args.trials, "minutes": args.minutes, "trial_timeout_s": 300},
        "sampler": "auto",
        "seed": args.seed,
        # Re-running the top configs costs whole training runs: the winner is re-measured below instead.
        "remeasure": {"top_k": 0},
    }
    spec.update(changes)
    return spec


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="preset of models/config.py (default 1b; 125m with --quick)")
    parser.add_argument("--global-batch", type=int, default=8, help="sequences per optimizer step")
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps per trial")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--trials", type=int, default=30, help="budget.trials of the 3-objective study")
    parser.add_argument("--minutes", type=float, default=4.0, help="budget.minutes of the 3-objective study")
    parser.add_argument("--constrained-trials", type=int, default=12)
    parser.add_argument("--constrained-minutes", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved re-measurement rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="125m model, 4 + 3 trials, 1 round (a smoke run)")
    parser.add_argument("--out")
    args = parser.parse_args()
    args.model = args.model if args.model or args.quick else "1b"
    if args.quick:
        args.model = args.model or "125m"
        args.steps, args.warmup_steps, args.rounds = 2, 1, 1
        args.trials, args.minutes = 4, 1.0
        args.constrained_trials, args.constrained_minutes = 3, 0.5
    return args


def _summary(
    args: argparse.Namespace,
    winner: Any,
    under: Any,
    pareto: list[Any],
    combined_front: list[Any],
    tuned_tps: float | None,
    default_tps: float | None,
    ratio: float | None,
    tuned_mfu: float | None,
    under_cost: float | None,
    start: float,
) -> dict[str, Any]:
    """The result's verdicts: the tuned config against the default, MFU, the front, the best under the limit."""
    summary = {
        "baseline": {"name": "default config (no tuning)", "config": DEFAULT_CONFIG, "grad_accum": args.global_batch},
        "tuned_config": None if winner is None else winner.params,
        "tokens_per_s": {"tuned": tuned_tps, "default": default_tps},
        "speedup_vs_default": {"ratio": ratio, "target": TARGET_SPEEDUP, "verdict": verdict(ratio, TARGET_SPEEDUP)},
        "mfu_tuned": {
            "value": None if tuned_mfu is None else round(tuned_mfu, 3),
            "target": TARGET_MFU,
            "verdict": verdict(tuned_mfu, TARGET_MFU),
        },
        "pareto_front_size": {
            # The 3-objective study's own front is judged; the front over both studies' trials (same
            # model, batch and steps; the second only adds the memory limit) is reported beside it.
            "value": len(pareto),
            "both_studies": len(combined_front),
            "target": TARGET_PARETO,
            "verdict": verdict(len(pareto), TARGET_PARETO),
        },
        f"under_{MEMORY_LIMIT_GB:g}gb": {
            "verdict": "met" if under is not None else "missed",
            "config": None if under is None else under.params,
            "tokens_per_s": None if under is None else under.metrics["tokens_per_s"],
            "peak_mem_gb": None if under is None else under.metrics["peak_mem_gb"],
            "loss_delta": None if under is None else under.metrics.get("loss_delta"),
            "throughput_cost_vs_unconstrained_winner": under_cost,
        },
        "loss_tolerance": LOSS_TOLERANCE,
        "wall_s": round(time.monotonic() - start, 1),
    }
    summary["all_targets_met"] = all(
        summary[k]["verdict"] == "met"
        for k in ("speedup_vs_default", "mfu_tuned", "pareto_front_size", f"under_{MEMORY_LIMIT_GB:g}gb")
    )
    return summary


def _constrained_study(args: argparse.Namespace, workload_args: dict[str, Any]) -> Any:
    """The single-objective study under the memory limit."""
    print(
        f"== constrained study: peak_mem_gb <= {MEMORY_LIMIT_GB:g}, {args.constrained_trials} trials / "
        f"{args.constrained_minutes} min",
        flush=True,
    )
    constrained = run_study(
        study_spec(
            f"train-step-{args.model}-under-{MEMORY_LIMIT_GB:g}gb",
            {**workload_args, "memory_limit_gb": MEMORY_LIMIT_GB},
            args,
            objectives=[{"metric": "tokens_per_s", "direction": "maximize"}],
            constraints=[f"peak_mem_gb <= {MEMORY_LIMIT_GB:g}"],
            budget={
                "trials": args.constrained_trials,
                "minutes": args.constrained_minutes,
                "trial_timeout_s": 300,
            },
        )
    )
    return constrained


def _remeasure(
    workload_args: dict[str, Any], winner: Any, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[dict[str, Any]]]]:
    """Interleaved re-measurement: the winner against the default config, same workload, same stopwatch."""
    from objectives.train_step import TrainStep
    from tuner.workloads.base import TrialContext
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    bench_workload = TrainStep(**workload_args)
    runs: dict[str, list[dict[str, Any]]] = {"tuned": [], "default": []}

    def measure(name: str, config: dict[str, Any]) -> float:
        result = bench_workload.run(config, device, TrialContext())
        runs[name].append({"status": result.status.value, "metrics": result.metrics, "error": result.error})
        print(f"   {name}: {result.status.value} {result.metrics.get('tokens_per_s')} tokens/s", flush=True)
        return result.metrics.get("tokens_per_s", float("nan")) if result.ok else float("nan")

    candidates = {"default": lambda: measure("default", DEFAULT_CONFIG)}
    if winner is not None:
        candidates = {"tuned": lambda: measure("tuned", winner.params), **candidates}
    print(f"== interleaved re-measurement, {rounds} rounds", flush=True)
    values = interleaved(candidates, rounds=rounds)
    return values, runs


def main() -> None:
    args = _parse_args()

    workload_args = {
        "model": args.model,
        "global_batch": args.global_batch,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "seed": args.seed,
    }
    start = time.monotonic()

    print(f"== 3-objective study: {args.trials} trials / {args.minutes} min, {workload_args}", flush=True)
    main_study = run_study(study_spec(f"train-step-{args.model}", workload_args, args))
    ok = [t for t in main_study.ok() if t.metrics.get("tokens_per_s") is not None]
    accurate = [t for t in ok if t.metrics.get("loss_error", float("inf")) <= LOSS_TOLERANCE]
    winner = max(accurate, key=lambda t: t.metrics["tokens_per_s"]) if accurate else None
    pareto = list(main_study.summary.pareto)
    default_in_study = main_study.ok(**DEFAULT_CONFIG)
    print(f"   {time.monotonic() - start:.0f} s; winner {None if winner is None else winner.params}", flush=True)
    partial: dict[str, Any] = {
        "benchmark": f"train_step {args.model} tuning vs the default config",
        "partial": "the 3-objective study only: the run stopped before the constrained study ended",
        "workload_args": workload_args,
        "main_study": main_study.describe(),
        "pareto_front": [trial_row(t) for t in pareto],
        "winner_in_study": None if winner is None else trial_row(winner),
        "trials": [trial_row(t) for t in main_study.trials],
    }
    write_result(partial, args.out)  # replaced by the full result at the end

    constrained = _constrained_study(args, workload_args)
    feasible = [
        t for t in constrained.ok() if t.feasible and t.metrics.get("loss_error", float("inf")) <= LOSS_TOLERANCE
    ]
    under = max(feasible, key=lambda t: t.metrics["tokens_per_s"]) if feasible else None
    print(f"   {time.monotonic() - start:.0f} s; best under the limit {None if under is None else under.params}")
    partial.update(
        {
            "partial": "both studies, no interleaved re-measurement: the run stopped before it ended",
            "constrained_study": constrained.describe(),
            "constrained_trials": [trial_row(t) for t in constrained.trials],
        }
    )
    write_result(partial, args.out)

    values, runs = _remeasure(workload_args, winner, args.rounds)
    tuned_tps, default_tps = median(values.get("tuned", [])), median(values.get("default", []))
    ratio = round(tuned_tps / default_tps, 3) if tuned_tps and default_tps else None
    tuned_mfu = median([r["metrics"].get("mfu", float("nan")) for r in runs["tuned"] if r["status"] == "ok"])
    under_cost = None
    if under is not None and winner is not None:
        under_cost = round(1 - under.metrics["tokens_per_s"] / winner.metrics["tokens_per_s"], 3)

    from tuner.results.pareto import pareto_front

    objectives = [(o["metric"], o["direction"]) for o in main_study.spec["objectives"]]
    combined_front = pareto_front([*main_study.trials, *constrained.trials], objectives)
    summary = _summary(args, winner, under, pareto, combined_front, tuned_tps, default_tps, ratio, tuned_mfu,
                       under_cost, start)
    write_result(
        {
            "benchmark": f"train_step {args.model} tuning vs the default config",
            "summary": summary,
            "workload_args": workload_args,
            "main_study": main_study.describe(),
            "pareto_front": [trial_row(t) for t in pareto],
            "pareto_front_both_studies": [trial_row(t) for t in combined_front],
            "winner_in_study": None if winner is None else trial_row(winner),
            "default_config_in_study": [trial_row(t) for t in default_in_study],
            "constrained_study": constrained.describe(),
            "interleaved_tokens_per_s": values,
            "interleaved_runs": runs,
            "trials": [trial_row(t) for t in main_study.trials],
            "constrained_trials": [trial_row(t) for t in constrained.trials],
        },
        args.out,
    )


if __name__ == "__main__":
    main()
