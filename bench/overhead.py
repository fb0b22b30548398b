"""Orchestration overhead per trial: the full stack against plain Optuna, in the same run.

A study of the ``noop`` workload (no work, no sleep) runs through the whole
engine: the sampler, our trial rows in the SQL database (every result
committed before the sampler hears of it), Ray worker actors. Beside it, in
the same run and on the same database, plain ``optuna.Study.optimize`` on
Optuna's RDB storage with the same sampler, the same space (suggested by the
same code) and the same objective function; and the same sampler on an
in-memory study with no database at all, which is the part of both sides'
time that is the sampler's own (TPE's cost grows with the trials).

The sides take turns in ``--segments`` segments (ours resumes its study with
a larger budget each time), so that a change in the load of a shared machine
hits them alike. Reported: milliseconds per trial of each (mean over the
loops, and the 95th percentile of the intervals between consecutive finished
trials), the ratio ours / plain (lower is better), and the load average.

With ``--sampler tpe`` the engine runs the project's TPE (``tuner.strategy.tpe``) while
``plain_optuna_*`` stays plain Optuna with Optuna's own ``TPESampler`` (configured as ``optuna_tpe``:
what a user would otherwise run); ``plain_optuna_same_sampler_*`` is plain Optuna on the same
database with the project's TPE, and ``sampler_only_*`` the engine's sampler on an in-memory
study (``sampler_only_optuna_*``: Optuna's TPE there).

Ours is also split, in the same run, into the sampler's own time and the rest: every
``SamplerAdapter.ask`` and ``tell`` of our run is timed, and ``orchestration_*`` is ours less that,
per trial (each interval between finished trials less the ask and tell calls made inside it). The
keys ``ours_*`` stay what they were: the whole per-trial cost, sampler included.

    python bench/overhead.py --trials 1000 --sampler tpe --out bench/results/overhead-tpe-1000.json
    python bench/overhead.py --db-url "$TUNER_TEST_PG_URL" --out bench/results/overhead-tpe-1000-postgres.json
"""

from __future__ import annotations

import argparse
import contextlib
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
from tuner.run.orchestrator import Orchestrator, ensure_ray
from tuner.store.storage import StudyDB, tune_sqlite_engine
from tuner.strategy.adapter import SamplerAdapter
from tuner.strategy.samplers import make_sampler
from tuner.study.spec import load_spec
from tuner.workloads.fingerprint import fingerprint


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


#: the sampler plain Optuna runs as the baseline, when it is not the engine's: Optuna's own TPE for ``tpe``
PLAIN_SAMPLER = {"tpe": "optuna_tpe"}


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) >= 2 else (values[0] if values else 0.0)


def intervals_ms(stamps: list[float]) -> list[float]:
    return [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]


class Plain:
    """``Study.optimize`` on ``storage`` (None: Optuna's in-memory storage), run in segments."""

    def __init__(self, storage: str | None, trials: int, sampler_name: str, seed: int) -> None:
        self.compiled = load_spec(spec("plain", trials, sampler_name, seed))
        sampler = make_sampler(
            sampler_name, n_objectives=1, seed=seed, budget_trials=trials, has_conditions=True, grid_points=None
        )
        name = f"plain-optuna-{uuid.uuid4().hex[:8]}"
        rdb = None
        if storage is not None:
            # the same SQLite settings as ours (WAL, synchronous=NORMAL): the same durability on both sides
            rdb = optuna.storages.RDBStorage(storage)
            tune_sqlite_engine(rdb.engine)
        self.study = optuna.create_study(storage=rdb, study_name=name, direction="maximize", sampler=sampler)
        self.seconds = 0.0
        self.intervals_ms: list[float] = []

    def run(self, trials: int) -> None:
        stamps: list[float] = []

        def objective(trial: optuna.Trial) -> float:
            return NoOp.reference(self.compiled.space.suggest(trial))

        start = time.perf_counter()
        self.study.optimize(objective, n_trials=trials, callbacks=[lambda _s, _t: stamps.append(time.perf_counter())])
        self.seconds += time.perf_counter() - start
        self.intervals_ms += intervals_ms(stamps)


class SamplerClock:
    """Times every ``SamplerAdapter.ask`` and ``tell`` while installed: (end time, seconds) of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []

    @contextlib.contextmanager
    def installed(self) -> Any:
        originals = {name: getattr(SamplerAdapter, name) for name in ("ask", "tell")}

        def timed(original: Any) -> Any:
            def call(adapter: SamplerAdapter, *args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return original(adapter, *args, **kwargs)
                finally:
                    end = time.perf_counter()
                    self.calls.append((end, end - start))

            return call

        for name, original in originals.items():
            setattr(SamplerAdapter, name, timed(original))
        try:
            yield self
        finally:
            for name, original in originals.items():
                setattr(SamplerAdapter, name, original)

    def within(self, start: float, end: float) -> float:
        """Seconds of sampler calls that ended in ``(start, end]`` (the loop is one thread: a call made
        between two finished trials ends between them)."""
        return sum(seconds for at, seconds in self.calls if start < at <= end)


class Ours:
    """The engine on one study, run in segments: each segment resumes the study with a larger budget
    (the startup of each, Ray actors and the rebuild of the sampler's study, is reported apart)."""

    def __init__(self, url: str, sampler_name: str, seed: int, workers: int, slots: int | None = None) -> None:
        self.url, self.sampler_name, self.seed, self.workers, self.slots = url, sampler_name, seed, workers, slots
        self.name = f"ours-{uuid.uuid4().hex[:8]}"
        self.seconds = self.startup_s = self.sampler_s = 0.0
        self.intervals_ms: list[float] = []
        self.orchestration_intervals_ms: list[float] = []

    def run(self, upto: int) -> None:
        compiled = load_spec(spec(self.name, upto, self.sampler_name, self.seed))
        db = StudyDB(self.url)
        stamps: list[float] = []
        progress = lambda _p: stamps.append(time.perf_counter())  # noqa: E731
        clock = SamplerClock()
        with clock.installed():
            summary = Orchestrator(
                compiled, db, workers=self.workers, trials_per_worker=self.slots, progress=progress
            ).run()
        run_end = time.perf_counter()
        assert summary.counts.get("ok") == upto, summary.counts
        durable = sum(t.status == "ok" for t in db.trials(summary.study_id))
        assert durable == upto, f"{durable} of {upto} results in the database"
        db.dispose()
        self.seconds += summary.loop_s
        self.startup_s += summary.startup_s
        self.intervals_ms += intervals_ms(stamps)
        # the sampler's calls in the loop (``loop_s`` ends just before run() returns; startup's are left out)
        self.sampler_s += clock.within(run_end - summary.loop_s, run_end)
        self.orchestration_intervals_ms += [
            (b - a) * 1000 - clock.within(a, b) * 1000 for a, b in itertools.pairwise(stamps)
        ]


def baselines(plains: dict[str, Plain], n: int, ours_ms: float) -> dict[str, float]:
    """The keys of the baselines that run only when plain Optuna's sampler is not the engine's."""
    if "plain_same" not in plains:
        return {}
    same, optuna_only = plains["plain_same"], plains["sampler_only_optuna"]
    same_ms = same.seconds / n * 1000
    return {
        "plain_optuna_same_sampler_ms_per_trial": round(same_ms, 3),
        "plain_optuna_same_sampler_p95_ms": round(p95(same.intervals_ms), 3),
        "ratio_ours_over_plain_same_sampler": round(ours_ms / same_ms, 3),
        "sampler_only_optuna_ms_per_trial": round(optuna_only.seconds / n * 1000, 3),
        "sampler_only_optuna_p95_ms": round(p95(optuna_only.intervals_ms), 3),
    }


#: What the result's figures mean.
RESULT_KEYS = {
    "ours_p95_ms": "95th percentile of the intervals between consecutive finished trials of the whole "
    "engine, the sampler's ask and tell included (the issue's target)",
    "orchestration_p95_ms": "the same intervals, each less the time of the sampler's ask and tell calls "
    "made inside it in the same run: the engine's own cost (rows, Ray, dispatch)",
    "ours_sampler_ms_per_trial": "mean time of our run's SamplerAdapter.ask and tell per trial",
    "plain_optuna_ms_per_trial": "plain Optuna (Study.optimize, RDB storage) with plain_optuna_sampler",
    "plain_optuna_same_sampler_ms_per_trial": "plain Optuna on the same database with the engine's sampler",
    "sampler_only_ms_per_trial": "the engine's sampler on an in-memory Optuna study (no database)",
    "sampler_only_optuna_ms_per_trial": "plain_optuna_sampler on an in-memory Optuna study",
}
#: What the engine is compared with.
BASELINE = (
    "optuna.Study.optimize with plain_optuna_sampler (and with the engine's sampler: *_same_sampler), same "
    "space code, same database and SQLite settings, same process; sampler_only: the engine's sampler on an "
    "in-memory study (its own cost)"
)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--sampler", default="tpe", choices=["tpe", "optuna_tpe", "random", "nsga2"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--slots", type=int, default=None, help="trials in flight per worker (default: the workload's, 1 on a CPU)"
    )
    parser.add_argument("--segments", type=int, default=4, help="turns each side takes (1: one run each)")
    parser.add_argument("--db", help="SQLite file to use (default: a fresh temporary file)")
    parser.add_argument("--db-url", help="a database URL instead (PostgreSQL: both sides on that database)")
    parser.add_argument("--out", help="write the result as JSON here")
    return parser.parse_args()


def main() -> None:
    args = _parse_args()
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
    # The sides take turns, segment by segment, so a change in the machine's load hits them alike.
    ours = Ours(url, args.sampler, args.seed, args.workers, args.slots)
    baseline = PLAIN_SAMPLER.get(args.sampler, args.sampler)
    plains = {"plain": Plain(optuna_url, args.trials, baseline, args.seed)}
    if baseline != args.sampler:
        plains["plain_same"] = Plain(optuna_url, args.trials, args.sampler, args.seed)
        plains["sampler_only_optuna"] = Plain(None, args.trials, baseline, args.seed)
    plains["sampler_only"] = Plain(None, args.trials, args.sampler, args.seed)
    per_segment = args.trials // args.segments
    for segment in range(1, args.segments + 1):
        upto = args.trials if segment == args.segments else segment * per_segment
        ours.run(upto)
        for side in plains.values():
            side.run(upto - len(side.study.trials))
    n = args.trials
    ours_ms, ours_p95 = ours.seconds / n * 1000, p95(ours.intervals_ms)
    plain, sampler_only = plains["plain"], plains["sampler_only"]
    plain_ms, plain_p95 = plain.seconds / n * 1000, p95(plain.intervals_ms)
    sampler_ms, sampler_p95 = sampler_only.seconds / n * 1000, p95(sampler_only.intervals_ms)
    orchestration_ms = (ours.seconds - ours.sampler_s) / n * 1000
    orchestration_p95 = p95(ours.orchestration_intervals_ms)
    result: dict[str, Any] = {
        "benchmark": "orchestration overhead per trial",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "database": db.engine.dialect.name,
        "trials": args.trials,
        "sampler": args.sampler,
        "workers": args.workers,
        "trials_per_worker": args.slots or 1,
        "segments": args.segments,
        "ours_ms_per_trial": round(ours_ms, 3),
        "ours_p95_ms": round(ours_p95, 3),
        "plain_optuna_ms_per_trial": round(plain_ms, 3),
        "plain_optuna_p95_ms": round(plain_p95, 3),
        "ratio_ours_over_plain": round(ours_ms / plain_ms, 3),
        "ratio_ours_p95_over_plain_p95": round(ours_p95 / plain_p95, 3),
        "sampler_only_ms_per_trial": round(sampler_ms, 3),
        "sampler_only_p95_ms": round(sampler_p95, 3),
        **baselines(plains, n, ours_ms),
        "plain_optuna_sampler": baseline,
        # ours less our own run's sampler calls (SamplerAdapter.ask and tell, timed in this run)
        "ours_sampler_ms_per_trial": round(ours.sampler_s / n * 1000, 3),
        "orchestration_ms_per_trial": round(orchestration_ms, 3),
        "orchestration_p95_ms": round(orchestration_p95, 3),
        "ours_startup_s": round(ours.startup_s, 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "targets": {"ours_p95_ms_max": 20.0, "ratio_max": 0.2},
        "keys": RESULT_KEYS,
        "baseline": BASELINE,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "optuna": optuna.__version__,
        },
        "fingerprint": fingerprint(),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
