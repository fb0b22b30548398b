"""The samplers' factories (registered in :mod:`tuner.study.sampler_registry`), configured for batch-aware,
constraint-aware tuning.

Constraints reach the samplers as Optuna 5 trial constraints
(``Trial.set_constraint``, read back as ``FrozenTrial.constraints``): one
entry per spec constraint plus one "the trial failed" entry. A failed trial
(compile error, timeout, wrong numerics...) is told to Optuna as COMPLETE with
that entry violated, so constraint-aware samplers learn to avoid the region,
instead of FAIL, which TPE ignores and would propose again.

``auto`` is the project's own strategy (:mod:`tuner.strategy`): it proposes only statically
feasible configs that are neither measured nor in flight, and says when the space is exhausted.
``tpe`` is the project's TPE (:mod:`tuner.strategy.tpe`: Optuna's multivariate, grouped, constant-liar
TPE, incremental) for one objective, Optuna's own for several; ``optuna_tpe`` is Optuna's always.
"""

from __future__ import annotations

import random
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.search_space import IntersectionSearchSpace
from optuna.trial import FrozenTrial, TrialState

from tuner.study.sampler_registry import SamplerInputs, resolve

CONSTRAINTS_ATTR = "constraints"  # Optuna's system-attribute key of a trial's constraint values

if TYPE_CHECKING:
    from tuner.study.space import SearchSpace


def make_sampler(
    name: str,
    *,
    n_objectives: int,
    seed: int | None,
    budget_trials: int,
    has_conditions: bool,
    grid_points: list[dict[str, Any]] | None = None,
    space: SearchSpace | None = None,
    device: Mapping[str, Any] | None = None,
    static_check: Callable[[dict[str, Any]], str | None] | None = None,
    intersection: IntersectionSearchSpace | None = None,
    priors: Sequence[Any] = (),
    storage: optuna.storages.BaseStorage | None = None,
) -> BaseSampler:
    """The sampler registered as ``name`` (:mod:`tuner.study.sampler_registry`; ``auto`` above 3 objectives is
    NSGA-II), made by its factory from these inputs (:class:`~tuner.study.sampler_registry.SamplerInputs`).

    ``auto`` needs the compiled ``space``; ``device`` (the fields of ``device.<field>`` rules) and
    ``static_check`` (the workload's static check: a reason when infeasible) let it apply every
    static rule before it proposes. Without ``space``, ``auto`` falls back to TPE. ``intersection``: the
    study's search-space intersection, shared by the samplers made for one study (NSGA-II; the project's TPE
    keys its history of encoded trials on it); ``storage``: the study's Optuna storage (NSGA-II writes the
    generations it counts there). ``priors``
    (:class:`tuner.strategy.Prior`: configs measured at other shapes) reach a sampler declared ``priors``
    only: Optuna's samplers take no observations but their study's trials, and priors must never be trials.
    """
    info = resolve(name, n_objectives)
    inputs = SamplerInputs(
        n_objectives=n_objectives,
        seed=seed,
        budget_trials=budget_trials,
        has_conditions=has_conditions,
        grid_points=grid_points,
        space=space,
        device=device,
        static_check=static_check,
        intersection=intersection,
        priors=priors if info.priors else (),
        storage=storage,
    )
    return info.load()(inputs)


def _startup(inputs: SamplerInputs) -> int:
    return max(5, min(10, inputs.budget_trials // 6))


def make_auto(inputs: SamplerInputs) -> BaseSampler:
    """``auto``: the project's strategy (:mod:`tuner.strategy`); TPE when no compiled space is given."""
    if inputs.space is None:
        return make_tpe(inputs)
    from tuner.strategy import TunerSampler

    return TunerSampler(
        inputs.space,
        seed=inputs.seed,
        device=inputs.device,
        static_check=inputs.static_check,
        budget_trials=inputs.budget_trials,
        priors=inputs.priors,
    )


def make_tpe(inputs: SamplerInputs) -> BaseSampler:
    """``tpe``: the project's TPE (:mod:`tuner.strategy.tpe`) for one objective, Optuna's for several."""
    if inputs.n_objectives != 1:
        return make_optuna_tpe(inputs)
    from tuner.strategy.tpe import TPEHistory, TPESampler

    # one history of encoded trials per study, whatever number of samplers are made for it
    intersection = inputs.intersection
    history = _TPE_HISTORIES.setdefault(intersection, TPEHistory()) if intersection is not None else None
    return TPESampler(seed=inputs.seed, n_startup_trials=_startup(inputs), history=history)


def make_optuna_tpe(inputs: SamplerInputs) -> BaseSampler:
    """``optuna_tpe``: Optuna's multivariate TPE (grouped for a conditional space), with the constant liar."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # `group`
        return optuna.samplers.TPESampler(
            seed=inputs.seed,
            multivariate=True,
            group=inputs.has_conditions,
            constant_liar=True,
            n_startup_trials=_startup(inputs),
        )


def make_nsga2(inputs: SamplerInputs) -> BaseSampler:
    """``nsga2``: NSGA-II on the study's shared intersection (:class:`SharedSpaceNSGAII`)."""
    population = max(8, min(50, inputs.budget_trials // 5))
    return SharedSpaceNSGAII(
        seed=inputs.seed, population_size=population, intersection=inputs.intersection, storage=inputs.storage
    )


def make_gp(inputs: SamplerInputs) -> BaseSampler:
    """``gp``: Optuna's GP sampler."""
    return optuna.samplers.GPSampler(seed=inputs.seed, n_startup_trials=_startup(inputs))


def make_random(inputs: SamplerInputs) -> BaseSampler:
    """``random``: Optuna's random sampler."""
    return optuna.samplers.RandomSampler(seed=inputs.seed)


def make_grid(inputs: SamplerInputs) -> BaseSampler:
    """``grid``: every point of the enumerated grid once (:class:`EnumeratedGridSampler`)."""
    if inputs.grid_points is None:
        raise ValueError("the grid sampler needs the enumerated grid")
    return EnumeratedGridSampler(inputs.grid_points, seed=inputs.seed)


#: intersection of a study (one per study: see ``make_sampler``) -> the project's TPE's encoded trials of it
_TPE_HISTORIES: weakref.WeakKeyDictionary[IntersectionSearchSpace, Any] = weakref.WeakKeyDictionary()

#: intersection of a study -> generation -> its parent population as NSGA-II reads it once chosen
_PARENTS: weakref.WeakKeyDictionary[IntersectionSearchSpace, dict[int, list[FrozenTrial]]] = weakref.WeakKeyDictionary()


@dataclass
class _Generations:
    """What NSGA-II derives a new trial's generation from: the highest generation of the study's completed
    trials and how many completed trials it has; ``complete``: the completed trials counted (-1: none yet)."""

    complete: int = -1
    highest: int = 0
    count: int = 0

    def add(self, generation: int) -> None:
        """Count one more completed trial (as ``BaseGASampler.get_trial_generation``'s walk counts it)."""
        self.complete += 1
        if generation > self.highest:
            self.highest, self.count = generation, 1
        elif generation == self.highest:
            self.count += 1


#: intersection of a study -> its generation count
_GENERATIONS: weakref.WeakKeyDictionary[IntersectionSearchSpace, _Generations] = weakref.WeakKeyDictionary()


class SharedSpaceNSGAII(optuna.samplers.NSGAIISampler):
    """NSGA-II whose search space (the intersection of every finished trial's distributions) is one
    ``IntersectionSearchSpace`` shared by every sampler made for the study, and so are the parent
    populations it chose (keyed by that intersection: one per study).

    With a study seed the adapter makes a sampler per trial (its seed derived from the trial number). Each
    new ``NSGAIISampler`` starts its intersection from nothing and walks every trial of the study: a
    quadratic cost, 10 ms a trial at 400 trials. Shared, the intersection goes on from the last trial it
    saw, as it does for one sampler; what it computes is the same. Likewise a generation's parents, once
    chosen, are found again by a walk over every trial of the study on each later ask (Optuna keeps their
    ids); kept here, they are the same trials in the same order, without the walk. And a new trial's
    generation, which Optuna finds by a walk over every completed trial on each ask (the larger part of an
    ask at 10,000 trials), comes from a count of the completed trials' generations kept as they complete
    (``after_trial``): the study's trials counted once, on the first ask (those the adapter rebuilt it
    from), then one at each tell. That needs the study's ``storage`` (through its public methods: the
    generation is stored with the trial, where NSGA-II reads it); without, generations are Optuna's own.
    """

    def __init__(
        self,
        *,
        intersection: IntersectionSearchSpace | None = None,
        storage: optuna.storages.BaseStorage | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._storage = storage
        self._intersection = intersection or IntersectionSearchSpace()
        self._parents = _PARENTS.setdefault(self._intersection, {})
        self._generations = _GENERATIONS.setdefault(self._intersection, _Generations())

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        # as NSGAIISampler's: single-valued distributions are sampled independently
        return {name: d for name, d in self._intersection.calculate(study).items() if not d.single()}

    def get_trial_generation(self, study: optuna.Study, trial: FrozenTrial) -> int:
        # BaseGASampler.get_trial_generation's rule and storage of the result, from the kept count.
        key = self._get_generation_key()
        generation = trial.system_attrs.get(key, None)
        if generation is not None or self._storage is None:
            return generation if generation is not None else super().get_trial_generation(study, trial)
        counted = self._generations
        if counted.complete < 0:
            counted.complete = 0
            for done in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                counted.add(done.system_attrs.get(key, -1))
        assert self._population_size is not None, "Population size must be set."
        generation = counted.highest + (1 if counted.count >= self._population_size else 0)
        study_id = self._storage.get_study_id_from_name(study.study_name)
        trial_id = self._storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        self._storage.set_trial_system_attr(trial_id, key, generation)
        return generation

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        super().after_trial(study, trial, state, values)
        if state == TrialState.COMPLETE and self._storage is not None and self._generations.complete >= 0:
            self._generations.add(trial.system_attrs.get(self._get_generation_key(), -1))

    def get_parent_population(self, study: optuna.Study, generation: int) -> list[FrozenTrial]:
        kept = self._parents.get(generation)
        if kept is not None:
            return list(kept)
        chosen = super().get_parent_population(study, generation)  # chooses them, and keeps their ids
        if generation > 0:
            # What Optuna answers from then on: the trials of those ids, in the study's order.
            self._parents[generation] = super().get_parent_population(study, generation)
        return chosen


class EnumeratedGridSampler(BaseSampler):
    """Visits every point of an enumerated grid once, in a seeded random order.

    Unlike Optuna's ``GridSampler`` the points may differ in their keys, so
    conditional spaces enumerate correctly. Points are in Optuna's param form.
    The points visited are read from the study's trials (their params), so a
    study rebuilt from its rows goes on where it stopped.
    """

    def __init__(self, points: list[dict[str, Any]], seed: int | None = None) -> None:
        self._points = points
        self._order = list(range(len(points)))
        random.Random(seed).shuffle(self._order)
        self._index = {_point_key(p): i for i, p in enumerate(points)}
        self._assigned: dict[int, int] = {}  # trial number -> the point it was given
        self._done: set[int] = set()  # points of finished trials
        self._scanned = 0  # trials before this position are finished and in _done
        self._fallback = optuna.samplers.RandomSampler(seed=seed)

    def _visited(self, study: optuna.Study) -> set[int]:
        trials = study.get_trials(deepcopy=False)
        while self._scanned < len(trials) and trials[self._scanned].state.is_finished():
            index = self._index.get(_point_key(trials[self._scanned].params))
            if index is not None:
                self._done.add(index)
            self._scanned += 1
        visited = self._done | set(self._assigned.values())
        for trial in trials[self._scanned :]:
            index = self._index.get(_point_key(trial.params))
            if index is not None:
                visited.add(index)
        return visited

    def is_exhausted(self, study: optuna.Study) -> bool:
        return len(self._visited(study)) >= len(self._points)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if "fixed_params" in trial.system_attrs:
            return
        visited = self._visited(study)
        for index in self._order:
            if index not in visited:
                self._assigned[trial.number] = index
                return

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        index = self._assigned.get(trial.number)
        if index is not None and param_name in self._points[index]:
            return self._points[index][param_name]
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        return None


def _point_key(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))
