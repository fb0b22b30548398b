"""The project's search against Kernel Tuner's strategies on recorded landscapes, counted the same way.

Each JSONL landscape (``bench/landscapes/*.jsonl``) is converted into a Kernel Tuner cache file (its JSON cache
format: ``tune_params`` = the landscape's grid, one entry per statically feasible recorded config, failed configs
as ``RuntimeFailedConfig``) and replayed through Kernel Tuner's simulation mode, with a restriction that admits
exactly the recorded configs, every single-objective strategy it ships at its defaults and
``strategy_options={"max_fevals": budget}``. The project's side is ``bench/replay_search.py``'s replay path
(``sampler: auto``, no seed configs, i.e. ``warm_start: false``) with the same seeds and budget.

Both sides count trials alike: distinct configurations evaluated, failed ones included, up to the first within 2%
of the landscape's best. The target: ``auto``'s p90 <= 0.67x the p90 of the best Kernel Tuner strategy on the
landscape, and 2% reached in every seed within the budget.

    PYTHONPATH=. python bench/search_peers.py --min-configs 1000 --trials 300 --seeds 10 \\
        --out bench/results/search-peers.json

Kernel Tuner is a dev/bench extra (``pip install -e .[dev]``), never a runtime dependency.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import math
import random
import tempfile
import warnings
from pathlib import Path
from typing import Any

from bench.common import write_result
from bench.replay_search import _allow, load, quantile, run_one, trials_to

GOAL_RATIO = 0.67
#: Kernel Tuner's strategies that are not a single-objective search of their own: brute force, the
#: multi-objective pymoo ones.
SKIPPED = ("brute_force", "nsga2", "nsga3")
KERNEL_NAME = "replayed_landscape"
#: The value of a conditional param in a config that does not have it (Kernel Tuner gives every param a value).
ABSENT = "absent"


def kt_strategies() -> list[str]:
    from kernel_tuner.interface import strategy_map

    return [s for s in strategy_map if s not in SKIPPED]


def to_cache(path: Path, metric: str) -> tuple[dict[str, Any], set[tuple[Any, ...]]]:
    """The landscape as a Kernel Tuner cache and the set of configs (in ``tune_params`` order) it admits."""
    header = json.loads(path.read_text().splitlines()[0])
    _, _, maximize, records = load(path, metric)
    names = list(header["grid"])
    grid = {n: list(v) for n, v in header["grid"].items()}
    entries: dict[str, Any] = {}
    admitted: set[tuple[Any, ...]] = set()
    for record in records:
        if record["status"] == "infeasible_static":
            continue  # never measured: the project's replay path does not count it either
        values = tuple(record["params"].get(n, ABSENT) for n in names)
        for name, value in zip(names, values, strict=True):
            if value == ABSENT and ABSENT not in grid[name]:  # a conditional param this config has not
                grid[name].append(ABSENT)
        value = (record.get("metrics") or {}).get(metric)
        ok = record["status"] == "ok" and value is not None and math.isfinite(value)
        entry = dict(zip(names, values, strict=True))
        entry[metric] = float(value) if ok else "RuntimeFailedConfig"
        entry.update(compile_time=0.0, verification_time=0.0, benchmark_time=0.0)
        entries[",".join(str(v) for v in values)] = entry
        admitted.add(values)
    cache = {
        "device_name": "replayed",
        "kernel_name": KERNEL_NAME,
        "problem_size": [1],
        "tune_params_keys": names,
        "tune_params": grid,
        "objective": metric,
        "objective_higher_is_better": maximize,
        "cache": entries,
    }
    return cache, admitted


def run_kernel_tuner(
    cache_file: Path,
    admitted: set,
    names: list[str],
    grid: dict,
    metric: str,
    maximize: bool,
    strategy: str,
    seed: int,
    budget: int,
) -> list[str]:
    """One simulated Kernel Tuner search: the keys of the distinct configs it evaluated, in order."""
    import numpy as np
    from constraint import FunctionConstraint
    from kernel_tuner import tune_kernel

    random.seed(seed)
    np.random.seed(seed)
    restriction = FunctionConstraint(lambda *values: values in admitted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = tune_kernel(
            KERNEL_NAME,
            "",
            (1,),
            [],
            grid,
            cache=str(cache_file),
            restrictions=[restriction],
            simulation_mode=True,
            strategy=strategy,
            strategy_options={"max_fevals": budget},
            objective=metric,
            objective_higher_is_better=maximize,
            quiet=True,
        )
    seen: list[str] = []
    for result in results:
        if not result:
            continue
        key = ",".join(str(result[n]) for n in names)
        if key not in seen:
            seen.append(key)
    return seen[:budget]


def kt_trials_to(order: list[str], cache: dict, metric: str, target: float, maximize: bool) -> int | None:
    for i, key in enumerate(order, start=1):
        value = cache["cache"][key][metric]
        if isinstance(value, float) and (value >= target if maximize else value <= target):
            return i
    return None


def compare(path: Path, strategies: list[str], seeds: int, budget: int, workdir: Path) -> dict[str, Any]:
    """One landscape: trials to 2% per seed for ``auto`` and each Kernel Tuner strategy, their p90s, the verdict."""
    _allow(path)
    header = json.loads(path.read_text().splitlines()[0])
    metric = header["metrics"][0]["name"]
    _, _, maximize, _ = load(path, metric)
    cache, admitted = to_cache(path, metric)
    values = [v[metric] for v in cache["cache"].values() if isinstance(v[metric], float)]
    best = max(values) if maximize else min(values)
    target = best * 0.98 if maximize else best / 0.98
    cache_file = workdir / f"{path.stem}.json"
    cache_file.write_text(json.dumps(cache))
    names = cache["tune_params_keys"]
    tuned = [trials_to(run_one(path, metric, "tuner", s, budget)["curve"], target, maximize) for s in range(seeds)]
    peers: dict[str, Any] = {}
    for strategy in strategies:
        try:
            needed = [
                kt_trials_to(
                    run_kernel_tuner(
                        cache_file, admitted, names, cache["tune_params"], metric, maximize, strategy, s, budget
                    ),
                    cache,
                    metric,
                    target,
                    maximize,
                )
                for s in range(seeds)
            ]
        except Exception as exc:  # a strategy that cannot run on this space: said, not hidden
            peers[strategy] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        peers[strategy] = {"trials_to_2pct": needed, "p90": quantile(needed, 0.9), "median": quantile(needed, 0.5)}
        print(path.stem, strategy, peers[strategy], flush=True)
    ranked = [(e["p90"], s) for s, e in peers.items() if "p90" in e and e["p90"] is not None]
    best_p90, best_strategy = min(ranked) if ranked else (None, None)
    auto_p90 = quantile(tuned, 0.9)
    every_seed = all(n is not None for n in tuned)
    ratio = round(auto_p90 / best_p90, 3) if auto_p90 is not None and best_p90 else None
    met = every_seed and auto_p90 is not None and (best_p90 is None or auto_p90 <= GOAL_RATIO * best_p90)
    return {
        "target": f"{path.stem}: auto p90 trials to 2% vs Kernel Tuner's best strategy",
        "landscape": str(path),
        "configs": len(cache["cache"]),
        "within_2pct": sum(1 for v in values if (v >= target if maximize else v <= target)),
        "metric": metric,
        "tuned": auto_p90,
        "tuned_trials_to_2pct": tuned,
        "baseline": best_p90,
        "baseline_strategy": best_strategy,
        "ratio": ratio,
        "goal": f"auto p90 <= {GOAL_RATIO}x the best Kernel Tuner strategy's p90; 2% reached in every seed",
        "verdict": "met" if met else "not met",
        "kernel_tuner": peers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("landscapes", nargs="*", help="JSONL landscapes (default: bench/landscapes/*.jsonl)")
    parser.add_argument("--min-configs", type=int, default=0, help="only landscapes with at least this many configs")
    parser.add_argument("--strategies", nargs="*", help="Kernel Tuner strategies (default: every one it ships)")
    parser.add_argument("--trials", type=int, default=300, help="the budget, max_fevals")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 seeds")
    parser.add_argument("--out")
    args = parser.parse_args()
    paths = [Path(p) for p in args.landscapes] or sorted(Path("bench/landscapes").glob("*.jsonl"))
    seeds = 3 if args.quick else args.seeds
    strategies = args.strategies or kt_strategies()
    targets = []
    with tempfile.TemporaryDirectory() as workdir:
        for path in paths:
            header = json.loads(path.read_text().splitlines()[0])
            if header.get("configs", 0) < args.min_configs:
                continue
            targets.append(compare(path, strategies, seeds, args.trials, Path(workdir)))
            _write(targets, seeds, args.trials, args.out)  # after each landscape: a stopped run keeps its part


def _write(targets: list[dict[str, Any]], seeds: int, trials: int, out: str | None) -> None:
    import kernel_tuner

    write_result(
        {
            "benchmark": "trials to 2% of the best: sampler auto vs Kernel Tuner's strategies (simulation mode), CPU",
            "kernel_tuner": kernel_tuner.__version__,
            "counting": "distinct configurations evaluated, failed ones included, up to the first within 2% of best",
            "trials_per_study": trials,
            "seeds": seeds,
            "targets": targets,
        },
        out,
    )


if __name__ == "__main__":
    main()
