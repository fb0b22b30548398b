"""Warm start from the best-config registry on a real GPU: GEMM studies at three shapes publish their picks,
a lookup for a fourth shape answers the nearest entries, and studies at the fourth shape warm-started from
the registry (``warm_start: registry``: the entries' configs first, and what the entries' studies measured
as the strategy's priors) are compared with cold ones (``warm_start: true``: the space's seed configs only)
and, with ``--modes cold warm warm-no-priors``, with registry warm starts without the priors
(``warm_start_priors: false``), under the same budget and seeds. The source studies are cold
(``warm_start: true``), as the default would otherwise warm-start each from the ones before it.

The figure compared is the number of trials a study needs to come within 2% of its own final best TFLOP/s
(fewer is better), per seed and on average. Everything runs in one process against one SQLite database,
through the engine (Ray workers, the project's strategy, the registry's automatic publication).

    PYTHONPATH=. python bench/registry_warmstart.py --out bench/results/registry-warmstart-h200.json

``--dry-run`` runs the same path on a CPU under the Triton interpreter at tiny shapes and budgets (the
figures only show that it runs); it writes JSON only where ``--out`` says.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GPU_SHAPES = [(8192, 8192, 4096), (4096, 14336, 4096), (4096, 4096, 4096)]
GPU_TARGET = (8192, 14336, 4096)
CPU_SHAPES = [(128, 128, 64), (64, 256, 64), (64, 64, 64)]
CPU_TARGET = (128, 256, 64)
WITHIN = 0.98  # "within 2% of its own final best"


def gemm_spec(name: str, shape: tuple[int, int, int], trials: int, seed: int, **changes: Any) -> dict[str, Any]:
    """A single-objective fp16 GEMM study (the registry keys entries by precision: one precision compares)."""
    m, n, k = shape
    spec: dict[str, Any] = {
        "name": name,
        "workload": "triton_gemm",
        "args": {"m": m, "n": n, "k": k},
        "space": {"precision": {"choices": ["fp16"]}},
        "objectives": [{"metric": "tflops", "direction": "maximize"}],
        "constraints": ["max_rel_error <= 0.05"],
        "budget": {"trials": trials, "trial_timeout_s": 180},
        "sampler": "auto",
        "seed": seed,
    }
    spec.update(changes)
    return spec


def best_curve(trials: list[Any]) -> list[float]:
    """The best feasible TFLOP/s after each trial (repeats and failures keep the previous best)."""
    best, curve = 0.0, []
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.status == "ok" and trial.feasible and trial.duplicate_of is None:
            best = max(best, float(trial.metrics.get("tflops") or 0.0))
        curve.append(best)
    return curve


def trials_to_within(curve: list[float], fraction: float = WITHIN) -> int | None:
    """1-based index of the first trial whose best-so-far is within ``fraction`` of the curve's final best."""
    if not curve or curve[-1] <= 0:
        return None
    return next(i + 1 for i, value in enumerate(curve) if value >= fraction * curve[-1])


def run(spec: dict[str, Any], db: Any) -> tuple[Any, list[Any], float]:
    from tuner.run.orchestrator import Orchestrator
    from tuner.study.spec import load_spec

    started = time.time()
    summary = Orchestrator(load_spec(spec), db).run()
    print(f"  {spec['name']}: {summary.status}, best {summary.best.metrics.get('tflops') if summary.best else None}")
    return summary, db.trials(summary.study_id), time.time() - started


def compare_study(
    db: Any, mode: str, target: tuple[int, int, int], trials: int, seed: int, k: int, cold_seeds: bool = True
) -> dict[str, Any]:
    """One study at the target shape, warm-started from the registry (``warm``) or cold (the space's seed
    configs, or none with ``cold_seeds=False``); not published, so that every seed's warm study starts from
    the same three entries."""
    from tuner.best_configs import registry as configs
    from tuner.best_configs.warm_start import decision_of

    warm_start: bool | str = "registry" if mode.startswith("warm") else cold_seeds
    spec = gemm_spec(f"target-{mode}-seed{seed}", target, trials, seed, warm_start=warm_start, warm_start_k=k)
    spec.update(publish=False, remeasure={"top_k": 0}, warm_start_priors=mode != "warm-no-priors")
    summary, rows, wall_s = run(spec, db)
    curve = best_curve(rows)
    origins = configs.trial_origins(db, summary.study_id)
    return {
        "mode": mode,
        "seed": seed,
        "study_status": summary.status,
        "trials": len(rows),
        "final_best_tflops": round(curve[-1], 2) if curve else None,
        "trials_to_within_2pct": trials_to_within(curve),
        "best_so_far_tflops": [round(v, 2) for v in curve],
        "origins": {str(n): o for n, o in sorted(origins.items())},
        "warm_start": decision_of(db, summary.study_id),
        "wall_s": round(wall_s, 1),
    }


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=None, help="budget of every study (default 20; dry run 4)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--k", type=int, default=3, help="warm_start_k: entries of the nearest shapes enqueued")
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    parser.add_argument(
        "--cold", choices=["seeds", "none"], default="seeds", help="cold studies: the space's seeds, or none"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["cold", "warm", "warm-no-priors"],
        default=["cold", "warm"],
        help="target studies per seed: cold, registry warm start, registry warm start without priors",
    )
    parser.add_argument("--db", default=None, help="SQLite file (default: a fresh temporary one)")
    parser.add_argument("--out")
    return parser.parse_args()


def _publish(db: Any, shapes: list[tuple[int, int, int]], trials: int) -> list[dict[str, Any]]:
    """One study per shape; each publishes its pick to the registry when it completes."""
    from tuner.best_configs import answers
    from tuner.best_configs import registry as configs

    published = []
    for shape in shapes:  # each study publishes its pick when it completes (publish: true is the default)
        source = gemm_spec("gemm-{}x{}x{}".format(*shape), shape, trials, seed=0, warm_start=True)
        summary, _, wall_s = run(source, db)
        total, entries = configs.list_entries(db, workload="triton_gemm", shape=dict(zip("mnk", shape, strict=True)))
        published.append(
            {
                "shape": shape,
                "study_status": summary.status,
                "wall_s": round(wall_s, 1),
                "entry": answers.entry_dict(entries[0]) if total else None,
            }
        )
    return published


def _lookup(db: Any, target: tuple[int, int, int], gpu: str | None, k: int) -> tuple[Any, dict[str, Any]]:
    """The registry's answer for the target shape: an exact entry or the nearest ones."""
    from tuner.best_configs import registry as configs

    found = configs.lookup(db, "triton_gemm", dict(zip("mnk", target, strict=True)), gpu=gpu, k=k)
    lookup = {
        "shape": target,
        "gpu": gpu,
        "exact": found.exact,
        "nearest": [
            {
                "entry": m.entry.id,
                "shape": m.entry.shape,
                "distance": round(m.distance, 3),
                "tflops": m.entry.value,
                "config": m.entry.config,
            }
            for m in found.matches
        ],
    }

    return found, lookup


def main() -> None:
    ns = _parse_args()
    if ns.dry_run:  # before triton is imported anywhere, workers included (they inherit the environment)
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.common import write_result
    from tuner.store.storage import StudyDB

    trials = ns.trials or (4 if ns.dry_run else 20)
    shapes, target = (CPU_SHAPES, CPU_TARGET) if ns.dry_run else (GPU_SHAPES, GPU_TARGET)
    db = StudyDB(ns.db or str(Path(tempfile.mkdtemp()) / "registry.db"))
    db.create_tables()
    started = time.time()

    published = _publish(db, shapes, trials)
    gpu = published[0]["entry"]["gpu"] if published[0]["entry"] else None
    found, lookup = _lookup(db, target, gpu, ns.k)

    cold_seeds = ns.cold == "seeds"
    runs = [compare_study(db, mode, target, trials, seed, ns.k, cold_seeds) for seed in ns.seeds for mode in ns.modes]
    by_mode = {mode: [r["trials_to_within_2pct"] for r in runs if r["mode"] == mode] for mode in ns.modes}
    means = {mode: statistics.mean(v) if v and None not in v else None for mode, v in by_mode.items()}
    met = means.get("warm") is not None and means.get("cold") is not None and means["warm"] < means["cold"]
    per_seed = [
        {
            "seed": s,
            **{
                m: next(r["trials_to_within_2pct"] for r in runs if r["seed"] == s and r["mode"] == m) for m in ns.modes
            },
        }
        for s in ns.seeds
    ]
    write_result(
        {
            "dry_run": ns.dry_run,
            "budget_trials": trials,
            "warm_start_k": ns.k,
            "cold_warm_start": cold_seeds,
            "published": published,
            "lookup": lookup,
            "runs": runs,
            "targets": [
                {
                    "target": f"trials to within 2% of the study's own final best at {target}, warm-started from "
                    f"the registry vs cold, same budget ({trials}) and seeds {ns.seeds} (mean; fewer is better)",
                    "tuned": means.get("warm"),
                    "baseline": means.get("cold"),
                    "verdict": "met" if met else "missed",
                }
            ],
            "summary": {
                "lookup_exact": found.exact,
                "nearest": [(m["shape"], m["distance"]) for m in lookup["nearest"]],
                "trials_to_within_2pct": per_seed,
                "mean_cold": means.get("cold"),
                "mean_warm": means.get("warm"),
                "mean_warm_no_priors": means.get("warm-no-priors"),
                "final_best_tflops": {f"{r['mode']}-{r['seed']}": r["final_best_tflops"] for r in runs},
                "wall_s": round(time.time() - started, 1),
            },
        },
        ns.out,
    )
    db.dispose()


if __name__ == "__main__":
    main()
