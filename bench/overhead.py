"""Orchestration overhead per trial: the full stack against plain Optuna, in the same run.

A study of the ``noop`` workload (no work, no sleep) runs through the whole
engine: the sampler, our trial rows in the SQL database (every result
committed before the sampler hears of it), Ray worker actors. Beside it, in
the same run and on the same database, plain ``optuna.Study.optimize`` on
Optuna's RDB storage with the same sampler, the same space (suggested by the
same code) and the same objective function; and the same sampler on an
in-memory study with no database at all, which is the part of both sides'
time that is the sampler's own (TPE's cost grows with the trials).

Reported: milliseconds per trial of each (mean over the loop, and the 95th
percentile of the intervals between consecutive finished trials), and the
ratio ours / plain (lower is better).

    python bench/overhead.py --trials 1000 --sampler tpe --out bench/results/overhead-tpe-1000.json
    python bench/overhead.py --db-url "$TUNER_TEST_PG_URL" --out bench/results/overhead-tpe-1000-postgres.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

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


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) >= 2 else (values[0] if values else 0.0)


def intervals_ms(stamps: list[float]) -> list[float]:
    return [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]


def plain_optuna(storage: str | None, trials: int, sampler_name: str, seed: int) -> tuple[float, float]:
    """Mean and p95 ms per trial of ``Study.optimize`` on ``storage`` (None: Optuna's in-memory storage)."""
    compiled = load_spec(spec("plain", trials, sampler_name, seed))
    sampler = make_sampler(
        sampler_name, n_objectives=1, seed=seed, budget_trials=trials, has_conditions=True, grid_points=None
    )
    name = f"plain-optuna-{uuid.uuid4().hex[:8]}"
    study = optuna.create_study(storage=storage, study_name=name, direction="maximize", sampler=sampler)
    stamps: list[float] = []

    def objective(trial: optuna.Trial) -> float:
        return NoOp.reference(compiled.space.suggest(trial))

    start = time.perf_counter()
    study.optimize(objective, n_trials=trials, callbacks=[lambda _s, _t: stamps.append(time.perf_counter())])
    mean_ms = (time.perf_counter() - start) / trials * 1000
    return mean_ms, p95(intervals_ms(stamps))


def ours(url: str, trials: int, sampler_name: str, seed: int, workers: int) -> dict[str, float]:
    compiled = load_spec(spec(f"ours-{uuid.uuid4().hex[:8]}", trials, sampler_name, seed))
    db = StudyDB(url)
    stamps: list[float] = []
    summary = Orchestrator(compiled, db, workers=workers, progress=lambda _p: stamps.append(time.perf_counter())).run()
    assert summary.counts.get("ok") == trials, summary.counts
    durable = sum(t.status == "ok" for t in db.trials(summary.study_id))
    assert durable == trials, f"{durable} of {trials} results in the database"
    db.dispose()
    return {
        "mean_ms": summary.loop_s / trials * 1000,
        "p95_ms": p95(intervals_ms(stamps)),
        "startup_s": summary.startup_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--sampler", default="tpe", choices=["tpe", "random", "nsga2"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--db", help="SQLite file to use (default: a fresh temporary file)")
    parser.add_argument("--db-url", help="a database URL instead (PostgreSQL: both sides on that database)")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.db_url:
        url = args.db_url
    else:
        path = Path(args.db) if args.db else Path(tempfile.mkdtemp()) / "overhead.db"
        url = f"sqlite:///{path}"
    db = StudyDB(url)
    db.create_tables()  # same database (for SQLite: the same file, in WAL mode) for both
    optuna_url = db.url
    db.dispose()
    ensure_ray(None, min_cpus=args.workers)
    measured = ours(url, args.trials, args.sampler, args.seed, args.workers)
    plain_ms, plain_p95 = plain_optuna(optuna_url, args.trials, args.sampler, args.seed)
    sampler_ms, sampler_p95 = plain_optuna(None, args.trials, args.sampler, args.seed)
    result: dict[str, Any] = {
        "benchmark": "orchestration overhead per trial",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "database": db.engine.dialect.name,
        "trials": args.trials,
        "sampler": args.sampler,
        "workers": args.workers,
        "ours_ms_per_trial": round(measured["mean_ms"], 3),
        "ours_p95_ms": round(measured["p95_ms"], 3),
        "plain_optuna_ms_per_trial": round(plain_ms, 3),
        "plain_optuna_p95_ms": round(plain_p95, 3),
        "ratio_ours_over_plain": round(measured["mean_ms"] / plain_ms, 3),
        "ratio_ours_p95_over_plain_p95": round(measured["p95_ms"] / plain_p95, 3),
        "sampler_only_ms_per_trial": round(sampler_ms, 3),
        "sampler_only_p95_ms": round(sampler_p95, 3),
        "ours_startup_s": round(measured["startup_s"], 2),
        "targets": {"ours_p95_ms_max": 20.0, "ratio_max": 0.2},
        "baseline": (
            "optuna.Study.optimize, same sampler, same space code, same database, same process; "
            "sampler_only: the same on an in-memory study (the sampler's own cost, common to both)"
        ),
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
