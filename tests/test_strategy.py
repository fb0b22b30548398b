"""The project's search strategy (``sampler: auto``): feasible-only, no repeats, batches, resume, exhaustion."""

from __future__ import annotations

import json
import math
from typing import Any

import optuna
import pytest

from tuner.strategy import SpaceExhausted, TunerSampler
from tuner.strategy.encoding import config_key
from tuner.strategy.samplers import CONSTRAINTS_ATTR, make_sampler
from tuner.study.space import SearchSpace, compile_space

pytestmark = pytest.mark.timeout(120)
H200 = {"smem_per_block_bytes": 232448}

# A conditional space with a static rule and a device rule: depth exists only for mode 'exact'.
CONDITIONAL = {
    "params": {
        "tile": {"type": "pow2", "low": 16, "high": 128},
        "stages": {"type": "int", "low": 1, "high": 6},
        "mode": {"type": "categorical", "choices": ["fast", "balanced", "exact"]},
        "depth": {"type": "multiple_of", "low": 8, "high": 16, "multiple": 8, "when": "mode == 'exact'"},
    },
    "rules": [
        {"name": "tile_budget", "expr": "tile * stages <= 256"},
        {"name": "smem", "expr": "tile * stages * 1024 <= device.smem_per_block_bytes"},
    ],
}


def score(config: dict[str, Any]) -> float:
    depth = {"fast": 0.15, "balanced": 0.0, "exact": 0.05 + config.get("depth", 8) / 400}[config["mode"]]
    return 1.0 - (math.log2(config["tile"]) - 6) ** 2 / 8 - (config["stages"] - 3) ** 2 / 9 - depth


def feasible_configs(space: SearchSpace) -> list[dict[str, Any]]:
    return [c for c in space.grid() if space.static_violation(c, H200) is None]


def new_study(sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="maximize", sampler=sampler)


def measure(study: optuna.Study, space: SearchSpace, trial: optuna.Trial, config: dict[str, Any]) -> None:
    """Tell a result as the orchestrator does: stages 6 fails (a constraint entry violated)."""
    failed = config["stages"] == 6
    study._storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_ATTR, [1.0 if failed else 0.0])
    study.tell(trial, 0.0 if failed else score(config))


def run_trials(study: optuna.Study, space: SearchSpace, n: int) -> list[dict[str, Any]]:
    configs = []
    for _ in range(n):
        trial = study.ask()
        config = space.suggest(trial)
        measure(study, space, trial, config)
        configs.append(config)
    return configs


def test_proposals_are_new_feasible_configs_until_the_space_is_exhausted() -> None:
    space = compile_space(CONDITIONAL)
    everything = feasible_configs(space)
    assert len(everything) == 64 and len(space.grid()) == 96  # both rules cut the space
    sampler = TunerSampler(space, seed=1, device=H200, budget_trials=len(everything))
    study = new_study(sampler)
    configs = run_trials(study, space, len(everything))
    assert all(space.validate_config(c) is None for c in configs)  # depth only with mode 'exact'
    assert all(space.static_violation(c, H200) is None for c in configs)
    assert len({config_key(c) for c in configs}) == len(configs) == len(everything)
    assert sampler.is_exhausted(study)
    trial = study.ask()
    with pytest.raises(SpaceExhausted):
        space.suggest(trial)


def test_a_workload_static_check_is_applied_before_proposing() -> None:
    space = compile_space(CONDITIONAL)
    check = lambda c: "refused" if c["mode"] == "fast" else None  # noqa: E731
    sampler = TunerSampler(space, seed=2, device=H200, static_check=check)
    configs = run_trials(new_study(sampler), space, 25)
    assert not any(c["mode"] == "fast" for c in configs)
    counts = sampler.proposal_counts()  # refused candidates were filtered before scoring: nothing was replaced
    assert counts == {"repeats_replaced": 0, "static_rejected": 0}
    assert sampler._strategy is not None and sampler._strategy.feasible.static_filtered > 0


def test_a_batch_of_proposals_differs_from_each_other_and_from_the_measured() -> None:
    space = compile_space(CONDITIONAL)
    sampler = TunerSampler(space, seed=3, device=H200, budget_trials=40)
    study = new_study(sampler)
    measured = run_trials(study, space, 12)
    batch = [(trial, space.suggest(trial)) for trial in (study.ask() for _ in range(4))]  # 4 free workers
    keys = [config_key(c) for _, c in batch]
    assert len(set(keys)) == 4 and not set(keys) & {config_key(c) for c in measured}
    for trial, config in batch:
        measure(study, space, trial, config)


# The same space with a knob of 1,001 values: too many combinations to decode, so candidates are drawn.
SAMPLED = {**CONDITIONAL, "params": {**CONDITIONAL["params"], "offset": {"type": "int", "low": 0, "high": 1000}}}


@pytest.mark.parametrize("document", [CONDITIONAL, SAMPLED], ids=["decoded", "sampled"])
def test_a_study_rebuilt_from_the_same_trials_proposes_the_same_configs(document: dict[str, Any]) -> None:
    space = compile_space(document)
    study = new_study(TunerSampler(space, seed=5, device=H200, budget_trials=30))
    run_trials(study, space, 14)
    rebuilt = new_study(TunerSampler(space, seed=5, device=H200, budget_trials=30))
    for trial in study.get_trials(deepcopy=False):
        rebuilt.add_trial(trial)
    assert run_trials(rebuilt, space, 3) == run_trials(study, space, 3)


def test_a_continuous_space_is_sampled_without_repeats_or_rule_failures() -> None:
    space = compile_space(
        {**CONDITIONAL, "params": {**CONDITIONAL["params"], "x": {"type": "float", "low": 0, "high": 1}}}
    )
    sampler = make_sampler(
        "auto", n_objectives=1, seed=4, budget_trials=30, has_conditions=True, space=space, device=H200
    )
    assert isinstance(sampler, TunerSampler)
    configs = run_trials(new_study(sampler), space, 30)
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == 30
    assert all(space.static_violation(c, H200) is None and space.validate_config(c) is None for c in configs)


def test_two_objectives_are_searched_with_the_same_guarantees() -> None:
    space = compile_space(CONDITIONAL)
    sampler = TunerSampler(space, seed=6, device=H200, budget_trials=25)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    seen = set()
    for _ in range(25):
        trial = study.ask()
        config = space.suggest(trial)
        assert config_key(config) not in seen and space.static_violation(config, H200) is None
        seen.add(config_key(config))
        study.tell(trial, [score(config), config["tile"] * config["stages"]])
