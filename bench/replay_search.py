"""How fast each search strategy finds a recorded landscape's best config, replayed on a CPU.

A landscape (``bench/landscapes/*.jsonl``) holds every config of a grid measured on a GPU. Each
study drives a sampler exactly as the engine does (``tuner.strategy.samplers.make_sampler``, Optuna's
ask, ``SearchSpace.suggest``, the orchestrator's static check, its tell with constraint values),
with the ``replay`` workload answering each trial from the file: no Ray, no database, so twenty
seeds of every strategy fit in minutes on a CPU. A proposal of a config measured before costs no
trial (the engine reuses the earlier result) and one that fails a static check neither: both are
counted. A study ends after ``--trials`` measured configs, when the sampler says the space is
exhausted, or when it measures the landscape's best config: its best-so-far curve is flat from there, so
the curve is filled up to the budget with that value (repeated and infeasible proposals and proposal times
are then counted up to that trial).

Strategies: ``random`` (uniform random search without repeats over the statically feasible
configs, computed exactly from the landscape: no sampling), ``tpe`` (the project's TPE,
``tuner.strategy.tpe``), ``optuna_tpe`` and ``gp`` (Optuna's samplers as ``make_sampler``
configures them) and ``tuner`` (``sampler: auto``, the project's own strategy). No strategy is
given seed configs. Results recorded before the project's TPE existed hold Optuna's TPE under ``tpe``.

Per strategy: the median and p90 over seeds of the trials to within 2% and 5% of the landscape's
best and to the best itself (None when more than the budget), the share of seeds within 2% by
the budget, repeated and statically infeasible proposals per study, and milliseconds per
proposal (ask plus suggest).

    PYTHONPATH=. python bench/replay_search.py --landscape bench/landscapes/gemm-bf16-fp16-4096.jsonl \\
        --out bench/results/replay-search-gemm-4096.json

``--jobs N`` runs the seeds' studies in N processes. ``--objectives A B`` instead runs 2-objective
studies (strategies random, tpe, nsga2, gp, tuner) and reports the hypervolume after 25, 50, 100 and
``--trials`` trials as a fraction of the landscape's own front's. ``--timing-trials N`` times proposals
of the project's strategy and TPE over an N-trial study of the default GEMM space, interleaved.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # small matrices: threads only contend on a shared CPU

import argparse
import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

import optuna

from bench.common import write_result

STRATEGIES = ("random", "tpe", "optuna_tpe", "gp", "tuner")
SAMPLER = {"tpe": "tpe", "optuna_tpe": "optuna_tpe", "gp": "gp", "tuner": "auto"}
BENCHMARK = "search strategies on a recorded landscape (samplers driven as the engine drives them, CPU)"
REPEAT_LIMIT = 200  # as the engine's DUPLICATE_LIMIT: consecutive repeats end a study


def load(path: Path, metric: str) -> tuple[Any, Any, bool, list[dict[str, Any]]]:
    """The replay workload, its compiled space, whether ``metric`` is maximised, and the records."""
    from objectives.replay import Replay
    from tuner.study.space import compile_space

    replay = Replay(file=str(path))
    space = compile_space(replay.space_document())
    direction = next(m.direction for m in replay.metric_specs() if m.name == metric)
    return replay, space, direction == "maximize", list(replay.landscape.records.values())


def run_one(path: Path, metric: str, strategy: str, seed: int, trials: int) -> dict[str, Any]:
    """One study: the best-so-far value after each measured trial, waste counts and proposal times."""
    from objectives.replay import params_key
    from tuner.strategy import SpaceExhausted
    from tuner.strategy.samplers import CONSTRAINTS_ATTR, make_sampler
    from tuner.study.sampler_registry import resolve
    from tuner.workloads.base import DeviceInfo, TrialStatus

    replay, space, maximize, records = load(path, metric)
    top = _landscape_best(records, metric, maximize)
    device = DeviceInfo()
    sampler = make_sampler(
        SAMPLER[strategy],
        n_objectives=1,
        seed=seed,
        budget_trials=trials,
        has_conditions=any(p.when is not None for p in space.params.values()),
        space=space,
        device=device.to_dict(),
        static_check=lambda c: replay.static_check(c, device),
    )
    exhaustible = resolve(SAMPLER[strategy], 1).exhaustible  # it says when nothing new is left
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if maximize else "minimize", sampler=sampler)
    measured: dict[str, tuple[bool, float]] = {}
    best, worst, curve, ask_ms = math.nan, math.nan, [], []
    repeats = infeasible = in_a_row = 0
    exhausted = False
    stopped_at = None
    while len(curve) < trials and in_a_row < REPEAT_LIMIT:
        if exhaustible and sampler.is_exhausted(study):  # type: ignore[attr-defined]
            exhausted = True
            break
        started = time.perf_counter()
        trial = study.ask()
        try:
            config = space.suggest(trial)
        except SpaceExhausted:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            exhausted = True
            break
        ask_ms.append((time.perf_counter() - started) * 1e3)
        key = params_key(config)
        if key in measured:
            repeats, in_a_row = repeats + 1, in_a_row + 1
            ok, value = measured[key]
        elif space.static_violation(config, device.to_dict()) or replay.static_check(config, device):
            infeasible += 1
            ok, value = False, math.nan
        else:
            in_a_row = 0
            record = replay.landscape.records[key]
            value = (record.get("metrics") or {}).get(metric)
            ok = record["status"] == TrialStatus.OK.value and value is not None and math.isfinite(value)
            value = float(value) if ok else math.nan
            measured[key] = (ok, value)
            if ok:
                better = best != best or (value > best if maximize else value < best)
                best = value if better else best
                worse = worst != worst or (value < worst if maximize else value > worst)
                worst = value if worse else worst
            curve.append(best)
            if best == top:  # the landscape's best: every later best-so-far value is this one
                stopped_at = len(curve)
                curve += [best] * (trials - len(curve))
        # told as the orchestrator tells it: a failure at the worst value seen, its constraint violated
        study._storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_ATTR, [0.0 if ok else 1.0])
        study.tell(trial, value if ok else (worst if worst == worst else 0.0))
    return {
        "curve": curve,
        "repeats": repeats,
        "infeasible": infeasible,
        "ask_ms": ask_ms,
        "exhausted": exhausted,
        "stopped_at_best": stopped_at,
    }


def _landscape_best(records: list[dict[str, Any]], metric: str, maximize: bool) -> float:
    values = [r["metrics"][metric] for r in records if r["status"] == "ok" and r["metrics"].get(metric) is not None]
    return max(values) if maximize else min(values)


def cache_file(cache: str, path: Path, strategy: str, metric: str, trials: int, seed: int) -> Path:
    return Path(cache) / f"{path.stem}-{strategy}-{metric}-t{trials}-s{seed}.json"


def cached_run(path: Path, metric: str, strategy: str, seed: int, trials: int, cache: str | None) -> dict[str, Any]:
    """:func:`run_one`, its result kept as ``cache/<landscape>-<strategy>-<metric>-t<trials>-s<seed>.json`` when
    ``cache`` is given and read back from there on a later call: a long run stopped part way keeps the studies
    it finished. The file knows nothing of the strategy's code: use a fresh directory after changing it."""
    if cache is None:
        return run_one(path, metric, strategy, seed, trials)
    file = cache_file(cache, path, strategy, metric, trials, seed)
    if file.is_file():
        return json.loads(file.read_text())
    result = run_one(path, metric, strategy, seed, trials)
    file.parent.mkdir(parents=True, exist_ok=True)
    part = file.with_suffix(".part")
    part.write_text(json.dumps(result))
    part.replace(file)
    return result


def trials_to(curve: list[float], target: float, maximize: bool) -> int | None:
    for i, value in enumerate(curve, start=1):
        if value == value and (value >= target if maximize else value <= target):
            return i
    return None


def random_exact(n_configs: int, n_good: int, budget: int) -> dict[str, Any]:
    """Uniform random search without repeats over ``n_configs``, ``n_good`` of them on target: the first hit's
    median and p90 trial (P(T > t) = C(N - K, t) / C(N, t)) and P(T <= budget)."""
    survive, cdf = 1.0, []
    for t in range(1, n_configs + 1):
        survive *= max(0.0, (n_configs - n_good - t + 1) / (n_configs - t + 1))
        cdf.append(1.0 - survive)
    median = next(t for t, p in enumerate(cdf, start=1) if p >= 0.5)
    p90 = next(t for t, p in enumerate(cdf, start=1) if p >= 0.9)
    return {"median": median, "p90": p90, "reach": cdf[min(budget, n_configs) - 1]}


def quantile(needed: list[int | None], q: float) -> int | None:
    """The ``q`` quantile of trials needed (nearest rank), None when it lies beyond the budget."""
    ranked = sorted(math.inf if n is None else n for n in needed)
    value = ranked[min(len(ranked) - 1, math.ceil(q * len(ranked)) - 1)]
    return None if value == math.inf else int(value)


def bootstrap_interval(needed: list[int | None], q: float, resamples: int = 2000) -> list[int | None]:
    """95% interval of the ``q`` quantile of trials needed, by resampling the seeds with replacement (a fixed
    generator, so a summary is reproducible); None bounds lie beyond the budget."""
    rng = random.Random(0)
    values = sorted(
        math.inf if v is None else v
        for v in (quantile(rng.choices(needed, k=len(needed)), q) for _ in range(resamples))
    )
    low, high = values[int(0.025 * resamples)], values[int(0.975 * resamples) - 1]
    return [None if low == math.inf else int(low), None if high == math.inf else int(high)]


def summarise(runs: list[dict[str, Any]], best: float, maximize: bool, budget: int) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    for name, share in (("2pct", 0.98), ("5pct", 0.95), ("best", 1.0), ("95pct", 0.95), ("99pct", 0.99)):
        target = best * share if maximize else best / share
        needed = [trials_to(r["curve"], target, maximize) for r in runs]
        if name in ("95pct", "99pct"):  # the keys of the earlier version of this benchmark
            reached = [n for n in needed if n is not None]
            entry[f"trials_to_{name}_median"] = statistics.median(reached) if reached else None
            entry[f"runs_reaching_{name}"] = f"{len(reached)}/{len(runs)}"
            continue
        entry[f"trials_to_{name}_median"] = quantile(needed, 0.5)
        entry[f"trials_to_{name}_p90"] = quantile(needed, 0.9)
        if name == "2pct":
            entry["reach_2pct_fraction"] = sum(n is not None for n in needed) / len(runs)
            entry["trials_to_2pct_median_ci95"] = bootstrap_interval(needed, 0.5)
            entry["trials_to_2pct_p90_ci95"] = bootstrap_interval(needed, 0.9)
    for n in (10, 20, budget):
        values = [c[min(n, len(c)) - 1] for c in (r["curve"] for r in runs) if c]
        values = [v / best if maximize else best / v for v in values if v == v]
        entry[f"fraction_of_best_after_{n}_median"] = round(statistics.median(values), 4) if values else None
    asks = [ms for r in runs for ms in r["ask_ms"]]
    tail = [ms for r in runs for ms in r["ask_ms"][-20:]]
    entry.update(
        repeated_proposals_per_study=statistics.mean(r["repeats"] for r in runs),
        infeasible_proposals_per_study=statistics.mean(r["infeasible"] for r in runs),
        measured_per_study=statistics.mean(len(r["curve"]) for r in runs),
        studies_ended_at_the_best=sum(1 for r in runs if r.get("stopped_at_best")),
        ms_per_proposal_mean=round(statistics.mean(asks), 2) if asks else None,
        ms_per_proposal_last20=round(statistics.mean(tail), 2) if tail else None,
    )
    return entry


def random_summary(records: list[dict[str, Any]], metric: str, best: float, maximize: bool, budget: int) -> dict:
    """The random strategy's entry, exact: over the configs that pass the static checks (failures included)."""
    measurable = [r for r in records if r["status"] != "infeasible_static"]
    values = [r["metrics"][metric] for r in measurable if r["status"] == "ok" and r["metrics"].get(metric) is not None]
    entry: dict[str, Any] = {"computed": "exactly, uniform without repeats over the statically feasible configs"}
    for name, share in (("2pct", 0.98), ("5pct", 0.95), ("best", 1.0)):
        target = best * share if maximize else best / share
        good = sum(1 for v in values if (v >= target if maximize else v <= target))
        exact = random_exact(len(measurable), good, budget)
        entry[f"trials_to_{name}_median"] = exact["median"] if exact["median"] <= budget else None
        entry[f"trials_to_{name}_p90"] = exact["p90"] if exact["p90"] <= budget else None
        entry[f"trials_to_{name}_median_unbounded"], entry[f"trials_to_{name}_p90_unbounded"] = (
            exact["median"],
            exact["p90"],
        )
        if name == "2pct":
            entry["reach_2pct_fraction"] = round(exact["reach"], 4)
    entry.update(repeated_proposals_per_study=0, infeasible_proposals_per_study=0, ms_per_proposal_mean=None)
    return entry


def proposal_times(trials: int, strategies: list[str]) -> dict[str, Any]:
    """Milliseconds per proposal over a ``trials``-trial study of the default GEMM space (H200 rules, every
    precision: tens of thousands of configs) with a synthetic objective, each strategy in the same run."""
    from tuner.strategy.samplers import make_sampler
    from tuner.study.space import compile_space
    from tuner.workloads.registry import workload_class

    workload = workload_class("triton_gemm")(m=4096, n=4096, k=4096)
    space = compile_space(workload.space_document())
    device = {"smem_per_block_bytes": 232448}

    def synthetic(config: dict[str, Any]) -> float:  # a smooth peak at 128 x 256 x 64, 8 warps, 3 stages
        shape = [math.log2(config["BLOCK_M"]) - 7, math.log2(config["BLOCK_N"]) - 8, math.log2(config["BLOCK_K"]) - 6]
        return -sum(v * v for v in shape) - (config["num_stages"] - 3) ** 2 / 4 - (config["num_warps"] != 8) / 2

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out: dict[str, Any] = {
        "space": "triton_gemm default, H200 smem",
        "space_points": space.grid_upper_bound(),
        "trials": trials,
        "interleaved": "each trial asks every strategy once in turn, so a busy CPU slows them alike",
    }
    studies = {}
    for strategy in strategies:
        sampler = make_sampler(
            SAMPLER[strategy],
            n_objectives=1,
            seed=0,
            budget_trials=trials,
            has_conditions=False,
            space=space,
            device=device,
        )
        studies[strategy] = optuna.create_study(direction="maximize", sampler=sampler)
    times: dict[str, list[float]] = {s: [] for s in strategies}
    cpu: dict[str, list[float]] = {s: [] for s in strategies}  # this process's CPU time: less of the load
    for _ in range(trials):
        for strategy, study in studies.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            trial = study.ask()
            config = space.suggest(trial)
            times[strategy].append((time.perf_counter() - started) * 1e3)
            cpu[strategy].append((time.process_time() - started_cpu) * 1e3)
            study.tell(trial, synthetic(config))
    for strategy, ms in times.items():
        last = sorted(ms[-100:])
        out[strategy] = {
            "ms_per_proposal_mean": round(statistics.mean(ms), 2),
            "ms_first_proposal": round(ms[0], 1),
            "ms_per_proposal_after_first": round(statistics.mean(ms[1:]), 2),
            "ms_per_proposal_last100": round(statistics.mean(ms[-100:]), 2),  # at about `trials` trials
            "ms_per_proposal_last100_median": round(last[len(last) // 2], 2),
            "cpu_ms_per_proposal_mean": round(statistics.mean(cpu[strategy]), 2),
            "cpu_ms_per_proposal_last100": round(statistics.mean(cpu[strategy][-100:]), 2),
        }
        print(strategy, out[strategy], flush=True)
    return out


# multi-objective ---------------------------------------------------------------------------------
MO_STRATEGIES = ("random", "tpe", "nsga2", "gp", "tuner")
MO_SAMPLER = {"tpe": "tpe", "nsga2": "nsga2", "gp": "gp", "tuner": "auto"}  # tpe: Optuna's, for several objectives


def hypervolume_2d(points: list[tuple[float, float]], reference: tuple[float, float]) -> float:
    """The area dominated by ``points`` (both coordinates minimised) inside the box up to ``reference``."""
    front = sorted(p for p in points if p[0] < reference[0] and p[1] < reference[1])
    area, best_second = 0.0, reference[1]
    for first, second in front:
        if second < best_second:
            area += (reference[0] - first) * (best_second - second)
            best_second = second
    return area


def run_multi(path: Path, metrics: list[str], strategy: str, seed: int, trials: int) -> dict[str, Any]:
    """One 2-objective study (driven as :func:`run_one` drives one): the objective pairs of the measured
    feasible configs in trial order (None for a failure), and waste counts."""
    import random

    from objectives.replay import params_key
    from tuner.strategy import SpaceExhausted
    from tuner.strategy.samplers import CONSTRAINTS_ATTR, make_sampler
    from tuner.workloads.base import DeviceInfo, TrialStatus

    replay, space, _, records = load(path, metrics[0])
    specs = {m.name: m.direction for m in replay.metric_specs()}
    directions = [specs[m] for m in metrics]
    device = DeviceInfo()
    measurable = [r for r in records if r["status"] != "infeasible_static"]

    def outcome(record: dict[str, Any]) -> tuple[float, ...] | None:
        values = [(record.get("metrics") or {}).get(m) for m in metrics]
        ok = record["status"] == TrialStatus.OK.value and all(v is not None and math.isfinite(v) for v in values)
        return tuple(float(v) for v in values) if ok else None

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if strategy == "random":  # uniform without repeats over the statically feasible configs
        order = random.Random(seed).sample(measurable, min(trials, len(measurable)))
        return {"values": [outcome(r) for r in order], "repeats": 0, "infeasible": 0}
    sampler = make_sampler(
        MO_SAMPLER[strategy],
        n_objectives=len(metrics),
        seed=seed,
        budget_trials=trials,
        has_conditions=any(p.when is not None for p in space.params.values()),
        space=space,
        device=device.to_dict(),
        static_check=lambda c: replay.static_check(c, device),
    )
    study = optuna.create_study(directions=directions, sampler=sampler)
    measured: dict[str, tuple[float, ...] | None] = {}
    values: list[tuple[float, ...] | None] = []
    worst: list[float] | None = None
    repeats = infeasible = in_a_row = 0
    while len(values) < trials and in_a_row < REPEAT_LIMIT:
        trial = study.ask()
        try:
            config = space.suggest(trial)
        except SpaceExhausted:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            break
        key = params_key(config)
        if key in measured:
            repeats, in_a_row = repeats + 1, in_a_row + 1
            result = measured[key]
        elif space.static_violation(config, device.to_dict()) or replay.static_check(config, device):
            infeasible += 1
            result = None
        else:
            in_a_row = 0
            result = measured[key] = outcome(replay.landscape.records[key])
            values.append(result)
            if result is not None:
                worst = (
                    list(result)
                    if worst is None
                    else [
                        (min if d == "maximize" else max)(w, v)
                        for w, v, d in zip(worst, result, directions, strict=True)
                    ]
                )
        study._storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_ATTR, [0.0 if result else 1.0])
        study.tell(trial, list(result) if result else (worst or [0.0] * len(metrics)))
    return {"values": values, "repeats": repeats, "infeasible": infeasible}


def multi_main(
    path: Path, metrics: list[str], strategies: list[str], seeds: int, trials: int, out: str | None, jobs: int = 1
) -> None:
    """Hypervolume after 25, 50, 100 and ``trials`` trials, as a fraction of the landscape's own front's."""
    replay, _, _, records = load(path, metrics[0])
    specs = {m.name: m.direction for m in replay.metric_specs()}
    signs = [1.0 if specs[m] == "minimize" else -1.0 for m in metrics]  # minimised coordinates
    ok = [r for r in records if r["status"] == "ok" and all((r["metrics"] or {}).get(m) is not None for m in metrics)]
    points = [tuple(s * float(r["metrics"][m]) for s, m in zip(signs, metrics, strict=True)) for r in ok]
    low = [min(p[j] for p in points) for j in range(2)]
    high = [max(p[j] for p in points) for j in range(2)]
    scale = [(h - lo) or 1.0 for h, lo in zip(high, low, strict=True)]

    def normalised(p: tuple[float, ...]) -> tuple[float, float]:
        return ((p[0] - low[0]) / scale[0], (p[1] - low[1]) / scale[1])

    reference = (1.1, 1.1)  # 10% beyond the worst feasible config of each objective
    full = hypervolume_2d([normalised(p) for p in points], reference)
    checkpoints = sorted({n for n in (25, 50, 100, trials) if n <= trials})
    summary: dict[str, Any] = {}
    for strategy in strategies:
        runs = _map(run_multi, [(path, metrics, strategy, seed, trials) for seed in range(seeds)], jobs)
        entry: dict[str, Any] = {"seeds": seeds}
        for n in checkpoints:
            fractions = []
            for r in runs:
                seen = [
                    normalised(tuple(s * v for s, v in zip(signs, val, strict=True))) for val in r["values"][:n] if val
                ]
                fractions.append(hypervolume_2d(seen, reference) / full)
            entry[f"hypervolume_fraction_after_{n}_median"] = round(statistics.median(fractions), 4)
            entry[f"hypervolume_fraction_after_{n}_p10"] = round(sorted(fractions)[len(fractions) // 10], 4)
        entry["repeated_proposals_per_study"] = statistics.mean(r["repeats"] for r in runs)
        entry["infeasible_proposals_per_study"] = statistics.mean(r["infeasible"] for r in runs)
        summary[strategy] = entry
        print(strategy, json.dumps(entry), flush=True)
    write_result(
        {
            "benchmark": "hypervolume of 2-objective search on a recorded landscape (samplers as the engine runs them)",
            "landscape": str(path),
            "objectives": [{"metric": m, "direction": specs[m]} for m in metrics],
            "hypervolume": "normalised objectives (0 = best, 1 = worst feasible config), reference point 1.1, 1.1;"
            " fraction of the landscape's own Pareto front's",
            "trials_per_study": trials,
            "summary": summary,
        },
        out,
    )


def _map(fn: Any, calls: list[tuple[Any, ...]], jobs: int) -> list[Any]:
    """``fn(*call)`` for every call, in order; in ``jobs`` processes when more than one (each study is
    independent; its proposal times are its own process's)."""
    if jobs <= 1:
        return [fn(*call) for call in calls]
    import concurrent.futures

    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(fn, *zip(*calls, strict=True)))


def _allow(path: Path) -> None:
    """The replay workload reads only bench/landscapes/ and $TUNER_LANDSCAPE_DIR: a landscape named on the
    command line may lie elsewhere, so name its directory."""
    allowed = [d for d in os.environ.get("TUNER_LANDSCAPE_DIR", "").split(os.pathsep) if d]
    os.environ["TUNER_LANDSCAPE_DIR"] = os.pathsep.join([*allowed, str(path.resolve().parent)])


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscape")
    parser.add_argument(
        "--timing-trials", type=int, help="instead of a landscape: time proposals over this many trials"
    )
    parser.add_argument("--metric", help="default: the landscape's first metric")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument(
        "--strategies", nargs="*", default=list(STRATEGIES), choices=sorted({*STRATEGIES, *MO_STRATEGIES})
    )
    parser.add_argument("--out")
    parser.add_argument("--jobs", type=int, default=1, help="studies run in parallel processes (one per core)")
    parser.add_argument("--cache", help="a directory keeping each finished study (reused by a later run)")
    parser.add_argument(
        "--cached-only", action="store_true", help="summarise only the studies already in --cache (of --seeds)"
    )
    parser.add_argument("--note", help="a sentence kept in the JSON's notes (with --merge, after the earlier ones)")
    parser.add_argument(
        "--objectives", nargs=2, metavar="METRIC", help="two metrics: hypervolume of 2-objective studies instead"
    )
    parser.add_argument(
        "--merge", action="store_true", help="keep the other strategies' entries of --out when it is this benchmark's"
    )
    args = parser.parse_args()
    if args.cached_only and not args.cache:
        parser.error("--cached-only needs --cache")
    if not args.timing_trials and not args.landscape:
        parser.error("--landscape is required (or --timing-trials)")
    return args


def main() -> None:
    args = _parse_args()
    if args.timing_trials:
        strategies = [s for s in args.strategies if s in ("tpe", "optuna_tpe", "tuner")]
        result = proposal_times(args.timing_trials, strategies)
        write_result({"benchmark": "milliseconds per proposal (ask + suggest), CPU", "summary": result}, args.out)
        return
    path = Path(args.landscape)
    if args.objectives:
        _allow(path)
        chosen = args.strategies if args.strategies != list(STRATEGIES) else list(MO_STRATEGIES)
        strategies = [s for s in chosen if s in MO_STRATEGIES]
        multi_main(path, list(args.objectives), strategies, args.seeds, args.trials, args.out, args.jobs)
        return
    _allow(path)
    header = json.loads(path.read_text().splitlines()[0])
    metric = args.metric or header["metrics"][0]["name"]
    _, _, maximize, records = load(path, metric)
    ok = [r for r in records if r["status"] == "ok" and r["metrics"].get(metric) is not None]
    best_record = (max if maximize else min)(ok, key=lambda r: r["metrics"][metric])
    best = best_record["metrics"][metric]
    summary: dict[str, Any] = {}
    curves: dict[str, list[list[float | None]]] = {}
    for strategy in args.strategies:
        if strategy == "random":
            summary[strategy] = random_summary(records, metric, best, maximize, args.trials)
            continue
        seeds = list(range(args.seeds))
        if args.cached_only:  # the studies a stopped run finished, and no others
            seeds = [s for s in seeds if cache_file(args.cache, path, strategy, metric, args.trials, s).is_file()]
            if not seeds:
                continue
        calls = [(path, metric, strategy, s, args.trials, args.cache) for s in seeds]
        runs = _map(cached_run, calls, args.jobs)
        entry = {"seeds": len(seeds), **summarise(runs, best, maximize, args.trials)}
        if len(seeds) < args.seeds:
            entry["seed_numbers"] = seeds
        summary[strategy] = entry
        curves[strategy] = [
            [round(v / best if maximize else best / v, 4) if v == v else None for v in r["curve"]] for r in runs
        ]
        print(strategy, json.dumps(summary[strategy]), flush=True)
    notes = [args.note] if args.note else []
    if args.merge and args.out and Path(args.out).is_file():
        earlier = json.loads(Path(args.out).read_text())
        if earlier.get("benchmark") == BENCHMARK and earlier.get("trials_per_study") == args.trials:
            summary = {**earlier["summary"], **summary}
            curves = {**earlier.get("curves_fraction_of_best", {}), **curves}
            notes = [*earlier.get("notes", []), *notes]
    summary = {s: summary[s] for s in STRATEGIES if s in summary}
    write_result(
        {
            "benchmark": BENCHMARK,
            "landscape": str(path),
            "landscape_fingerprint": header.get("fingerprint"),
            "grid_configs": header.get("configs"),
            "statically_feasible_configs": sum(1 for r in records if r["status"] != "infeasible_static"),
            "metric": metric,
            "landscape_best": {"value": best, "params": best_record["params"]},
            "trials_per_study": args.trials,
            "seeds_per_strategy": {s: e.get("seeds") for s, e in summary.items() if s != "random"},
            "seed_configs": "none (every strategy starts from nothing)",
            "notes": notes,
            "summary": summary,
            "curves_fraction_of_best": curves,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
