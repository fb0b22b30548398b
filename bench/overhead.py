"""Orchestration overhead per trial: the full stack against plain Optuna, in the same run.

A study of the ``noop`` workload (no work, no sleep) runs through the whole
engine: Optuna sampler on RDB storage, our trial rows in the same SQL
database, Ray worker actors. Beside it, in the same run and on the same SQLite
file, plain ``optuna.Study.optimize`` with the same sampler, the same space
(suggested by the same code) and the same objective function. Reported:
milliseconds per trial of each, and their ratio (ours / plain; lower is better).

    python bench/overhead.py --trials 1000 --sampler tpe --out bench/results/overhead-tpe.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import optuna

from objectives.noop import NoOp
from tuner.orchestrator import Orchestrator, ensure_ray
from tuner.samplers import make_sampler
from tuner.spec import load_spec
from tuner.storage import StudyDB


def spec(name: str, trials: int, sampler: str, seed: int) -> dict:
    return {
        "name": name,
        "workload": "noop",
        "space": {"tile": {"high": 128}, "stages": {"high": 4}},  # every config feasible
        "objectives": [{"metric": "score"}],
        "budget": {"trials": trials, "trial_timeout_s": 60},
        "sampler": sampler,
        "seed": seed,
        "warm_start": False,
    }


def plain_optuna(url: str, trials: int, sampler_name: str, seed: int) -> float:
    compiled = load_spec(spec("plain", trials, sampler_name, seed))
    sampler = make_sampler(
        sampler_name, n_objectives=1, seed=seed, budget_trials=trials, has_conditions=True, grid_points=None
    )
    study = optuna.create_study(storage=url, study_name="plain-optuna", direction="maximize", sampler=sampler)

    def objective(trial: optuna.Trial) -> float:
        return NoOp.reference(compiled.space.suggest(trial))

    start = time.perf_counter()
    study.optimize(objective, n_trials=trials)
    return (time.perf_counter() - start) / trials * 1000


def ours(url: str, trials: int, sampler_name: str, seed: int, workers: int) -> tuple[float, float]:
    compiled = load_spec(spec("ours", trials, sampler_name, seed))
    db = StudyDB(url)
    summary = Orchestrator(compiled, db, workers=workers).run()
    assert summary.counts.get("ok") == trials, summary.counts
    db.dispose()
    return summary.loop_s / trials * 1000, summary.startup_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--sampler", default="tpe", choices=["tpe", "random", "nsga2"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--db", help="SQLite file to use (default: a fresh temporary file)")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = Path(args.db) if args.db else Path(tempfile.mkdtemp()) / "overhead.db"
    url = f"sqlite:///{path}"
    StudyDB(url).create_tables()  # same file, WAL mode, for both
    ensure_ray(None, min_cpus=args.workers)
    ours_ms, startup_s = ours(url, args.trials, args.sampler, args.seed, args.workers)
    plain_ms = plain_optuna(url, args.trials, args.sampler, args.seed)
    result = {
        "benchmark": "orchestration overhead per trial",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "trials": args.trials,
        "sampler": args.sampler,
        "workers": args.workers,
        "ours_ms_per_trial": round(ours_ms, 3),
        "plain_optuna_ms_per_trial": round(plain_ms, 3),
        "ratio_ours_over_plain": round(ours_ms / plain_ms, 3),
        "ours_startup_s": round(startup_s, 2),
        "baseline": "optuna.Study.optimize, same sampler, same space code, same SQLite file, same process",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "optuna": optuna.__version__,
        },
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
