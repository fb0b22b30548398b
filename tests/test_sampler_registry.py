"""The sampler registry: every registered sampler on a recorded landscape, a sampler added in one place,
and an unknown name refused naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from objectives.replay import params_key
from tuner.store.storage import StudyDB
from tuner.strategy import SpaceExhausted
from tuner.strategy.adapter import SamplerAdapter
from tuner.study import sampler_registry
from tuner.study.spec import CompiledStudy, SpecError, load_spec
from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus

CPU = DeviceInfo()
#: a small recorded landscape: 324 GEMM configs of one GPU, every one recorded (some out of resources)
LANDSCAPE = Path(__file__).resolve().parents[1] / "bench" / "landscapes" / "gemm-bf16-fp16-4096.jsonl"
#: 4 of its configs: a space a sampler exhausts within a small budget
TINY = {
    "BLOCK_M": {"choices": [64, 128]},
    "BLOCK_N": {"choices": [64]},
    "BLOCK_K": {"choices": [32]},
    "num_warps": {"choices": [4]},
    "num_stages": {"choices": [3]},
}


def replay_spec(sampler: str, trials: int, space: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": f"registry-{sampler}",
        "workload": "replay",
        "args": {"file": f"bench/landscapes/{LANDSCAPE.name}"},
        "objectives": [{"metric": "tflops"}],
        "budget": {"trials": trials},
        "sampler": sampler,
        "seed": 3,
        "warm_start": False,
        "space": space or {},
    }


def replay_study(compiled: CompiledStudy) -> tuple[list[dict[str, Any]], SpaceExhausted | None, list[str]]:
    """Drive the study's sampler on the landscape as the engine does (one trial in flight at a time): every
    proposal, in order, and the end if the sampler signalled one. A repeat is told the earlier result and a
    statically infeasible config its status, as the orchestrator records them; the static reasons seen."""
    replay = compiled.workload_cls(**compiled.spec.args)
    device = CPU.to_dict()

    def static_reason(config: dict[str, Any]) -> str | None:
        return compiled.space.static_violation(config, device) or replay.static_check(config, CPU)

    adapter = SamplerAdapter(compiled, [], static_reason=static_reason, device=device)
    measured: dict[str, tuple[str, dict[str, Any]]] = {}
    proposals: list[dict[str, Any]] = []
    refused: list[str] = []
    end = None
    while len(proposals) < compiled.spec.budget.trials:
        try:
            proposal = adapter.ask()
        except SpaceExhausted as exc:
            end = exc
            break
        proposals.append(proposal.config)
        key = params_key(proposal.config)
        reason = static_reason(proposal.config)
        if key in measured:
            status, metrics = measured[key]
        elif reason is not None:
            refused.append(reason)
            status, metrics = TrialStatus.INFEASIBLE_STATIC.value, {}
        else:
            result = replay.run(proposal.config, CPU, TrialContext())
            status, metrics = result.status.value, dict(result.metrics)
            measured[key] = (status, metrics)
        adapter.tell(proposal.number, status, metrics)
    return proposals, end, refused


def keys(configs: Sequence[dict[str, Any]]) -> list[str]:
    return [params_key(c) for c in configs]


@pytest.mark.parametrize("name", sampler_registry.names())
def test_every_registered_sampler_proposes_distinct_feasible_configs_on_a_landscape(name: str) -> None:
    compiled = load_spec(replay_spec(name, trials=8))
    proposals, end, refused = replay_study(compiled)
    assert end is None and len(proposals) == 8  # 324 configs: none runs out in 8 trials
    assert refused == []  # every proposal is statically feasible (a config of the recorded landscape)
    assert all(compiled.space.validate_config(c) is None for c in proposals)
    assert len(set(keys(proposals))) == len(proposals), f"{name} repeated a config"


@pytest.mark.parametrize("name", [n for n in sampler_registry.names() if sampler_registry.sampler_info(n).exhaustible])
def test_an_exhaustible_sampler_ends_a_small_space_with_one_signal(name: str) -> None:
    info = sampler_registry.sampler_info(name)
    compiled = load_spec(replay_spec(name, trials=10, space=TINY))
    assert compiled.space.size() == 4
    proposals, end, _ = replay_study(compiled)
    assert sorted(keys(proposals)) == sorted(keys(compiled.space.grid()))  # each of the 4 once
    assert end is not None and end.reason == info.exhausted_message


def test_auto_above_its_objectives_is_its_fallback() -> None:
    auto = sampler_registry.sampler_info("auto")
    assert auto.max_objectives is not None and auto.fallback is not None
    assert sampler_registry.resolve("auto", auto.max_objectives).name == "auto"
    assert sampler_registry.resolve("auto", auto.max_objectives + 1).name == auto.fallback


class ReverseGrid(BaseSampler):
    """A sampler for the test: the enumerated grid's points, last first; exhausted when each is asked."""

    def __init__(self, points: list[dict[str, Any]]) -> None:
        self._points = points[::-1]

    def is_exhausted(self, study: optuna.Study) -> bool:
        return len(study.get_trials(deepcopy=False)) >= len(self._points)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self._points[trial.number][param_name]

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        return None


def make_reverse_grid(inputs: sampler_registry.SamplerInputs) -> BaseSampler:
    assert inputs.grid_points is not None  # declared ``enumerates``: the adapter enumerates the grid for it
    return ReverseGrid(inputs.grid_points)


@pytest.fixture
def reverse_grid() -> Iterator[str]:
    sampler_registry.register(
        "reverse_grid",
        f"{__name__}:make_reverse_grid",
        "the grid, last point first",
        enumerates=True,
        exhaustible=True,
        exhausted_message="every point of the grid proposed",
        reseeded=False,
    )
    yield "reverse_grid"
    sampler_registry.unregister("reverse_grid")


def noop_spec(sampler: str) -> dict[str, Any]:
    return {
        "name": "registered-here",
        "workload": "noop",
        "objectives": [{"metric": "score"}],
        "space": {  # 3 points
            "x": {"low": 0.0, "high": 1.0, "step": 0.5},
            "tile": {"choices": [64]},
            "stages": {"choices": [3]},
            "mode": {"choices": ["balanced"]},
        },
        "budget": {"trials": 10, "trial_timeout_s": 30},
        "sampler": sampler,
        "warm_start": False,
    }


@pytest.mark.timeout(300)
def test_a_sampler_registered_in_one_place_is_accepted_by_the_spec_and_run_by_the_orchestrator(
    reverse_grid: str, sqlite_url: str, ray_session: None
) -> None:
    from tuner.run.orchestrator import Orchestrator

    compiled = load_spec(noop_spec(reverse_grid))
    assert compiled.spec.sampler == reverse_grid
    db = StudyDB(sqlite_url)
    summary = Orchestrator(compiled, db, workers=1).run()
    trials = sorted(db.trials(summary.study_id), key=lambda t: t.number)
    grid = [json.dumps(c, sort_keys=True) for c in compiled.space.grid()]
    assert [json.dumps(t.params, sort_keys=True) for t in trials] == grid[::-1]  # its order, each point once
    assert summary.status == "completed" and summary.message == "every point of the grid proposed"
    assert db.find_study("registered-here").proposal_counts is None  # it declares no replaced proposals
    db.dispose()


def test_a_sampler_not_registered_is_refused_naming_the_field_and_the_registered_ones(reverse_grid: str) -> None:
    sampler_registry.unregister(reverse_grid)
    with pytest.raises(SpecError) as refused:
        load_spec(noop_spec(reverse_grid))
    assert [field for field, _ in refused.value.errors] == ["sampler"]
    with pytest.raises(SpecError) as near:
        load_spec(noop_spec("tpee"))
    [(field, message)] = near.value.errors
    assert field == "sampler" and "did you mean 'tpe'?" in message
    assert all(repr(name) in message for name in sampler_registry.names())


def test_a_sampler_is_registered_once_by_a_lazy_factory() -> None:
    with pytest.raises(ValueError, match="registered already"):
        sampler_registry.register("tpe", "tuner.strategy.samplers:make_tpe", "again")
    with pytest.raises(ValueError, match="module:function"):
        sampler_registry.register("nameless", "make_tpe", "no module")
    assert "nameless" not in sampler_registry.names()
    assert all(":" in sampler_registry.sampler_info(n).factory for n in sampler_registry.names())


def test_a_capability_the_sampler_lacks_is_refused_by_the_spec() -> None:
    sampler_registry.register(
        "one_at_a_time", f"{__name__}:make_reverse_grid", "test", batch=False, multi_objective=False
    )
    try:
        spec = noop_spec("one_at_a_time") | {"objectives": [{"metric": "score"}, {"metric": "cost"}]}
        spec["resources"] = {"workers": 2}
        with pytest.raises(SpecError) as refused:
            load_spec(spec)
        assert sorted(field for field, _ in refused.value.errors) == ["resources.workers", "sampler"]
    finally:
        sampler_registry.unregister("one_at_a_time")


def test_the_registry_imports_no_sampler_until_one_is_made() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from tuner.study import sampler_registry as r\n"
        "assert r.resolve('auto', 5).name == 'nsga2' and r.sampler_info('grid').enumerates\n"
        "assert 'tuner.strategy' not in sys.modules and 'optuna' not in sys.modules, sorted(sys.modules)\n"
        "r.sampler_info('random').load()\n"
        "assert 'tuner.strategy.samplers' in sys.modules\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
