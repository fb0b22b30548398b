"""The project's TPE (``tuner.strategy.tpe``): proposals inside the space, seeded, Optuna's estimator and split,
better than random search, the same proposal after a rebuild, and a study through the engine."""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from tuner.strategy.parzen import ParzenMixture, ramp_weights
from tuner.strategy.samplers import make_sampler
from tuner.strategy.tpe import TPESampler

pytestmark = pytest.mark.timeout(300)
optuna.logging.set_verbosity(optuna.logging.WARNING)
KIND_COST = {"a": 0.03, "b": 0.0, "c": 0.02, "d": 0.04}


def objective(trial: optuna.Trial) -> float:
    """Every kind of param: float, log float, stepped float, int, log int, stepped int, categorical, and one
    param (``depth``) only when ``kind == "b"``. Best (0) at x=0.7, lr=10^-2.5, n=11, kind b, depth 4."""
    x = trial.suggest_float("x", 0.0, 1.0)
    lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
    frac = trial.suggest_float("frac", 0.0, 2.0, step=0.25)
    n = trial.suggest_int("n", 1, 16)
    width = trial.suggest_int("width", 1, 1024, log=True)
    group = trial.suggest_int("group", 8, 64, step=8)
    kind = trial.suggest_categorical("kind", list(KIND_COST))
    loss = (x - 0.7) ** 2 + (math.log10(lr) + 2.5) ** 2 / 4 + (n - 11) ** 2 / 64 + KIND_COST[kind]
    loss += (frac - 1.25) ** 2 / 100 + math.log2(width / 64) ** 2 / 400 + (group - 32) ** 2 / 40000
    if kind == "b":
        loss += (trial.suggest_int("depth", 1, 6) - 4) ** 2 / 50
    return loss


def bowl(trial: optuna.Trial) -> float:
    """A smaller landscape for the search test: best (0) at x=0.7, lr=10^-2.5, n=11, kind b."""
    x, lr = trial.suggest_float("x", 0.0, 1.0), trial.suggest_float("lr", 1e-5, 1e-1, log=True)
    n, kind = trial.suggest_int("n", 1, 16), trial.suggest_categorical("kind", list(KIND_COST))
    return (x - 0.7) ** 2 + (math.log10(lr) + 2.5) ** 2 / 4 + (n - 11) ** 2 / 64 + KIND_COST[kind]


def study_of(sampler: optuna.samplers.BaseSampler, trials: int, function: Any = objective) -> optuna.Study:
    study = optuna.create_study(sampler=sampler)
    study.optimize(function, n_trials=trials)
    return study


def inside(dist: BaseDistribution, value: Any) -> bool:
    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    if isinstance(dist, IntDistribution) and not isinstance(value, int):
        return False
    on_step = dist.step is None or math.isclose((value - dist.low) / dist.step, round((value - dist.low) / dist.step))
    return dist.low <= value <= dist.high and on_step


def test_proposals_lie_inside_the_space_and_a_conditional_param_only_under_its_condition() -> None:
    study = study_of(TPESampler(seed=0, n_startup_trials=5), 40)
    for trial in study.trials:
        assert all(inside(trial.distributions[name], value) for name, value in trial.params.items()), trial.params
        assert ("depth" in trial.params) == (trial.params["kind"] == "b")
    # past the startup trials the proposals are the model's, not random draws
    sampler = TPESampler(seed=0, n_startup_trials=5)
    asked = study.ask()
    space = sampler.infer_relative_search_space(study, study.trials[asked.number])
    assert {"x", "lr", "frac", "n", "width", "group", "kind", "depth"} <= set(space)
    proposal = sampler.sample_relative(study, study.trials[asked.number], space)
    assert set(proposal) == set(space) and all(inside(space[n], v) for n, v in proposal.items())


def test_the_same_seed_and_results_give_the_same_proposals() -> None:
    first, again, other = (study_of(TPESampler(seed=s, n_startup_trials=5), 30) for s in (3, 3, 4))
    assert [t.params for t in first.trials] == [t.params for t in again.trials]
    assert [t.params for t in first.trials] != [t.params for t in other.trials]


def test_it_finds_the_good_region_far_better_than_random_search_at_the_same_budget() -> None:
    # fixed seeds: the outcome is deterministic; the margin (half of random search's median) is wide
    ours = [study_of(TPESampler(seed=s, n_startup_trials=10), 50, bowl).best_value for s in range(7)]
    randoms = [study_of(optuna.samplers.RandomSampler(seed=s), 50, bowl).best_value for s in range(7)]
    assert statistics.median(ours) < 0.5 * statistics.median(randoms), (ours, randoms)


def test_its_parzen_estimator_is_optunas() -> None:
    """The densities of Optuna's own estimator (a private class, the reference) on the same observations."""
    from optuna.samplers._tpe.parzen_estimator import _ParzenEstimator, _ParzenEstimatorParameters
    from optuna.samplers._tpe.sampler import default_weights

    space: dict[str, BaseDistribution] = {
        "f": FloatDistribution(0, 1),
        "log_f": FloatDistribution(1e-3, 10, log=True),
        "step_f": FloatDistribution(0, 2, step=0.25),
        "i": IntDistribution(1, 6),
        "log_i": IntDistribution(1, 1024, log=True),
        "step_i": IntDistribution(8, 64, step=8),
        "c": CategoricalDistribution(["a", "b", "c"]),
    }
    rng = np.random.default_rng(0)

    def draw(n: int) -> dict[str, np.ndarray]:
        return {
            "f": rng.uniform(0, 1, n),
            "log_f": np.exp(rng.uniform(math.log(1e-3), math.log(10), n)),
            "step_f": rng.integers(0, 9, n) * 0.25,
            "i": rng.integers(1, 7, n).astype(float),
            "log_i": rng.integers(1, 1025, n).astype(float),
            "step_i": rng.integers(1, 9, n) * 8.0,
            "c": rng.integers(0, 3, n).astype(float),
        }

    parameters = _ParzenEstimatorParameters(1.0, True, False, default_weights, True)
    for n in (0, 1, 2, 7, 60):
        observed, points = draw(n), draw(40)
        reference = _ParzenEstimator(observed, space, parameters).log_pdf(points)
        ours = ParzenMixture(
            np.array([observed[k] for k in space]).T.reshape(n, len(space)), list(space.values()), ramp_weights(n)
        )
        assert np.allclose(ours.log_pdf(np.array([points[k] for k in space]).T), reference, atol=1e-9)
        drawn = ours.sample(np.random.default_rng(n), 200)  # internal values: choice indices, ints as floats
        for j, dist in enumerate(space.values()):
            assert all(inside(dist, dist.to_external_repr(int(v) if dist is space["c"] else v)) for v in drawn[:, j])


def test_the_good_set_is_optunas_and_a_running_trial_is_among_the_rest() -> None:
    """The split of Optuna's TPE (its private ``_split_trials``): best complete feasible trials, then the least
    infeasible ones; a running trial (the constant liar) joins the rest."""
    from optuna.samplers._tpe.sampler import _split_trials

    study = study_of(TPESampler(seed=1, n_startup_trials=5), 36)
    for number in (3, 8, 20):  # failures as the engine tells them: complete, with a violated constraint
        trial = study.ask()
        objective(trial)
        trial.set_constraint("0", float(number))
        study.tell(trial, 0.0)
    running = study.ask()
    objective(running)
    current = study.ask()
    sampler = TPESampler(seed=1)
    sampler.infer_relative_search_space(study, study.trials[current.number])
    trials = [
        t for t in study.get_trials(states=(TrialState.COMPLETE, TrialState.RUNNING)) if t.number != current.number
    ]
    below, above = _split_trials(study, trials, min(math.ceil(0.1 * 39), 25))
    rows, good = sampler._split(study, [study.trials[running.number]])
    numbers = np.array(sorted(t.number for t in trials))
    assert sorted(numbers[good].tolist()) == sorted(t.number for t in below)
    assert running.number in numbers[~good].tolist() and running.number in [t.number for t in above]
    assert not np.isnan(rows[numbers == running.number]).all()  # it counts with the params it was given


def test_a_sampler_rebuilt_on_the_same_trials_proposes_what_the_live_one_does() -> None:
    live = study_of(TPESampler(seed=5, n_startup_trials=5), 24)
    in_flight = live.ask()  # left running: the constant liar counts it
    objective(in_flight)
    following = live.ask()
    objective(following)
    rebuilt = optuna.create_study(sampler=TPESampler(seed=5, n_startup_trials=5))
    rebuilt.add_trials([t for t in live.trials if t.state == TrialState.COMPLETE])
    rebuilt.enqueue_trial(in_flight.params)
    objective(rebuilt.ask())
    again = rebuilt.ask()
    objective(again)
    assert again.number == following.number
    assert again.params == following.params


def test_make_sampler_gives_the_projects_tpe_for_one_objective_and_optunas_otherwise() -> None:
    def made(name: str, n_objectives: int) -> optuna.samplers.BaseSampler:
        return make_sampler(name, n_objectives=n_objectives, seed=0, budget_trials=20, has_conditions=True)

    assert isinstance(made("tpe", 1), TPESampler)
    assert isinstance(made("tpe", 2), optuna.samplers.TPESampler)
    assert isinstance(made("optuna_tpe", 1), optuna.samplers.TPESampler)
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=TPESampler(seed=0))
    with pytest.raises(ValueError, match="single-objective"):
        study.optimize(lambda t: (t.suggest_float("x", 0, 1), 0.0), n_trials=1)
