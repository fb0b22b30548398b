"""How fast each search strategy finds a recorded landscape's best config, on a CPU, through the whole engine.

A landscape (``bench/landscapes/*.jsonl``) holds every config of a grid measured on a GPU.
The ``replay`` workload answers trials from it, so a study costs no GPU time and every
strategy faces the very same numbers, failures included. For each strategy and seed this
runs a study of ``--trials`` trials and records, trial by trial, the best value found so far
as a fraction of the landscape's best; the summary gives, per strategy, the median over
seeds of the trials needed to reach 95% and 99% of the best and the fraction reached after
10, 20 and all trials.

Strategies: ``random`` (Optuna's random sampler, no seeds), ``tpe`` (Optuna's multivariate
TPE, no seeds), ``gp`` (Optuna's Gaussian-process sampler, no seeds) and ``tuner`` (the
engine's default: ``sampler: auto`` with the workload's known-good seed configs tried first --
those that the grid contains).

    PYTHONPATH=. python bench/replay_search.py --landscape bench/landscapes/gemm-bf16-fp16-4096.jsonl \\
        --metric tflops --out bench/results/replay-search-gemm-4096.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import write_result

STRATEGIES = ("random", "tpe", "gp", "tuner")


def landscape_best(path: Path, metric: str, maximize: bool) -> tuple[float, dict[str, Any]]:
    """The best OK value of ``metric`` in the landscape and its params."""
    rows = [json.loads(line) for line in path.read_text().splitlines()[1:] if line.strip()]
    ok = [r for r in rows if r["status"] == "ok" and r["metrics"].get(metric) is not None]
    best = (max if maximize else min)(ok, key=lambda r: r["metrics"][metric])
    return best["metrics"][metric], best["params"]


def seed_configs(path: Path) -> list[dict[str, Any]]:
    """The recorded workload's default seeds restricted to the grid's params, those the grid contains."""
    from tuner.registry import workload_class

    header = json.loads(path.read_text().splitlines()[0])
    workload = workload_class(header["workload"])(**header["args"])
    grid = header["grid"]
    seeds = []
    for seed in workload.space_document().get("seeds", []):
        config = {name: seed.get(name) for name in grid}
        if all(config[name] in values for name, values in grid.items()) and config not in seeds:
            seeds.append(config)
    return seeds


def run_one(path: Path, metric: str, strategy: str, seed: int, trials: int, seeds: list[dict[str, Any]]) -> list[float]:
    """Best-so-far value of ``metric`` after each trial of one study (NaN until the first OK trial)."""
    from tuner.orchestrator import Orchestrator
    from tuner.spec import load_spec
    from tuner.storage import StudyDB

    spec: dict[str, Any] = {
        "name": f"replay-{strategy}-{seed}",
        "workload": "replay",
        "args": {"file": str(path), "seeds": seeds if strategy == "tuner" else []},
        "objectives": [{"metric": metric}],
        "budget": {"trials": trials},
        "sampler": {"random": "random", "tpe": "tpe", "gp": "gp", "tuner": "auto"}[strategy],
        "seed": seed,
        "warm_start": strategy == "tuner",
        "remeasure": {"top_k": 0},
        "resources": {"workers": 1},
    }
    compiled = load_spec(spec)
    db = StudyDB(str(Path(tempfile.mkdtemp()) / "replay.db"))
    summary = Orchestrator(compiled, db).run()
    maximize = compiled.directions[0] == "maximize"
    rows = sorted(
        (t for t in db.trials(summary.study_id) if t.status != "infeasible_static" and t.duplicate_of is None),
        key=lambda t: t.number,
    )
    best, curve = float("nan"), []
    for t in rows:
        value = t.metrics.get(metric) if t.status == "ok" else None
        if value is not None and (best != best or (value > best if maximize else value < best)):
            best = value
        curve.append(best)
    db.dispose()
    return curve[:trials]


def trials_to(curve: list[float], target: float, maximize: bool) -> int | None:
    for i, value in enumerate(curve, start=1):
        if value == value and (value >= target if maximize else value <= target):
            return i
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscape", required=True)
    parser.add_argument("--metric", default="tflops")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--strategies", nargs="*", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--out")
    args = parser.parse_args()
    path = Path(args.landscape)
    # The replay workload reads only bench/landscapes/ and $TUNER_LANDSCAPE_DIR: a landscape named on the
    # command line may lie elsewhere, so name its directory (before the engine starts Ray, whose workers inherit it).
    allowed = [d for d in os.environ.get("TUNER_LANDSCAPE_DIR", "").split(os.pathsep) if d]
    os.environ["TUNER_LANDSCAPE_DIR"] = os.pathsep.join([*allowed, str(path.resolve().parent)])
    header = json.loads(path.read_text().splitlines()[0])
    direction = next(m["direction"] for m in header["metrics"] if m["name"] == args.metric)
    maximize = direction == "maximize"
    best, best_params = landscape_best(path, args.metric, maximize)
    seeds = seed_configs(path)
    curves: dict[str, list[list[float]]] = {}
    for strategy in args.strategies:
        curves[strategy] = [run_one(path, args.metric, strategy, s, args.trials, seeds) for s in range(args.seeds)]
        print(f"{strategy}: final {[round(c[-1] / best, 3) for c in curves[strategy]]}", flush=True)

    def fraction(value: float) -> float | None:
        if value != value:
            return None
        return round(value / best if maximize else best / value, 4)

    summary = {}
    for strategy, runs in curves.items():
        entry: dict[str, Any] = {}
        for share in (0.95, 0.99):
            target = best * share if maximize else best / share
            needed = [trials_to(c, target, maximize) for c in runs]
            reached = [n for n in needed if n is not None]
            entry[f"trials_to_{int(share * 100)}pct_median"] = statistics.median(reached) if reached else None
            entry[f"runs_reaching_{int(share * 100)}pct"] = f"{len(reached)}/{len(runs)}"
        for n in (10, 20, args.trials):
            values = [fraction(c[min(n, len(c)) - 1]) for c in runs if c]
            values = [v for v in values if v is not None]
            entry[f"fraction_of_best_after_{n}_median"] = statistics.median(values) if values else None
        summary[strategy] = entry
    write_result(
        {
            "benchmark": "search strategies on a recorded landscape (replay workload, whole engine, CPU)",
            "landscape": str(path),
            "landscape_fingerprint": header.get("fingerprint"),
            "grid_configs": header.get("configs"),
            "metric": args.metric,
            "landscape_best": {"value": best, "params": best_params},
            "seed_configs_in_grid": seeds,
            "trials_per_study": args.trials,
            "seeds_per_strategy": args.seeds,
            "summary": summary,
            "curves_fraction_of_best": {s: [[fraction(v) for v in c] for c in runs] for s, runs in curves.items()},
        },
        args.out,
    )


if __name__ == "__main__":
    main()
