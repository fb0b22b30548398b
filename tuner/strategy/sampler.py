"""The project's search strategy as an Optuna sampler (``sampler: auto``).

Relative sampling over the whole config: :meth:`TunerSampler.sample_relative` proposes one
config of the compiled space (every knob, conditional ones only when active) and hands it to
Optuna in the space's Optuna form (pow2 params as exponents), so ``SearchSpace.suggest`` reads it
back knob by knob. The proposal is a statically feasible config that is neither measured nor in
flight (see :mod:`tuner.strategy.model`); when none is left :meth:`is_exhausted` turns true and a
proposal raises :class:`SpaceExhausted` instead of repeating a config.

Only Optuna's public trial API is read (``study.get_trials``, a trial's params, values, state and
system attrs), so the sampler works the same on RDB storage and on an in-memory study.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from tuner.strategy.candidates import FeasibleSet, StaticCheck
from tuner.strategy.gp import one_blas_thread
from tuner.strategy.history import History
from tuner.strategy.model import SpaceExhausted, Strategy
from tuner.strategy.priors import Prior
from tuner.study.space import LOG2_SUFFIX, Param, SearchSpace


def optuna_distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Each param's distribution as ``Param.suggest`` declares it (pow2 under ``<name>__log2``)."""
    return dict(_distribution(p) for p in space.params.values())


def _distribution(param: Param) -> tuple[str, BaseDistribution]:
    if param.type == "categorical":
        return param.name, CategoricalDistribution(list(param.choices))
    if param.type == "pow2":
        return param.name + LOG2_SUFFIX, IntDistribution(int(math.log2(param.low)), int(math.log2(param.high)))
    if param.type == "multiple_of":
        vals = param.values() or []
        return param.name, IntDistribution(vals[0], vals[-1], step=param.multiple or 1)
    if param.type == "int":
        if param.log:
            return param.name, IntDistribution(int(param.low), int(param.high), log=True)
        vals = param.values() or []
        return param.name, IntDistribution(vals[0], vals[-1], step=int(param.step or 1))
    return param.name, FloatDistribution(param.low, param.high, log=param.log, step=param.step)


def default_startup(budget_trials: int | None, n_params: int) -> int:
    """Space-filling trials before the model: about one per knob, 4 to 10, at most a fifth of the budget."""
    n = min(10, max(4, n_params + 1))
    if budget_trials:
        n = min(n, max(2, budget_trials // 5))
    return n


class TunerSampler(BaseSampler):
    """Feasible-only, no-repeat, batch-aware proposals for a compiled space.

    ``device``: the device's fields for ``device.<field>`` rules (unknown fields skip their rule);
    ``static_check``: the workload's own static check (a reason string when infeasible), applied
    with the space's rules before a config is proposed. ``directions`` default to the study's.
    ``priors``: what configs measured elsewhere (the registry's nearest shapes, in the study's objective
    order: :class:`~tuner.strategy.priors.Prior`); they shape the proposals and are never trials.
    """

    def __init__(
        self,
        space: SearchSpace,
        *,
        seed: int | None = None,
        device: Mapping[str, Any] | None = None,
        static_check: StaticCheck | None = None,
        budget_trials: int | None = None,
        n_startup: int | None = None,
        n_candidates: int = 1000,
        priors: Sequence[Prior] = (),
    ) -> None:
        self._space = space
        self._priors = tuple(priors)
        self._device = device
        self._static_check = static_check
        self._seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        self._n_startup = n_startup if n_startup is not None else default_startup(budget_trials, len(space.params))
        self._n_candidates = n_candidates
        self._distributions = optuna_distributions(space)
        self._strategy: Strategy | None = None
        self._history: History | None = None
        self._planned: dict[int, dict[str, Any]] = {}  # trial number -> proposal not yet told
        self._fallback = optuna.samplers.RandomSampler(seed=self._seed)
        self._last_remaining: int | None = None  # feasible configs left after the last proposal

    # the strategy, built on first use (a small space is decoded in full then) ------------------
    def _ensure(self, study: optuna.Study) -> Strategy:
        if self._strategy is None:
            feasible = FeasibleSet(self._space, device=self._device, static_check=self._static_check)
            directions = [
                "maximize" if d == optuna.study.StudyDirection.MAXIMIZE else "minimize" for d in study.directions
            ]
            self._strategy = Strategy(
                feasible,
                directions,
                seed=self._seed,
                n_startup=self._n_startup,
                n_candidates=self._n_candidates,
                priors=self._priors,
            )
            self._history = History(self._space, feasible.encoder)
        return self._strategy

    def propose(self, study: optuna.Study, number: int) -> dict[str, Any]:
        """The config for trial ``number`` of ``study`` (not recorded as planned)."""
        strategy = self._ensure(study)
        assert self._history is not None
        observations = self._history.read(study, current=number)
        seen = {o.number for o in observations}
        planned = [c for n, c in sorted(self._planned.items()) if n != number and n not in seen]
        with one_blas_thread():
            config = strategy.propose(observations, planned, number)
        remaining = strategy.remaining(strategy.exclusion(observations, [*planned, config]))
        self._last_remaining = remaining
        return config

    def is_exhausted(self, study: optuna.Study) -> bool:
        """True when every statically feasible config is measured or in flight (a decoded space only)."""
        if self._last_remaining:  # something was left after the last proposal: one ask takes one config at most
            return False
        strategy = self._ensure(study)
        assert self._history is not None
        keys = strategy.exclusion(self._history.read(study), list(self._planned.values()))
        return strategy.remaining(keys) == 0

    def proposal_counts(self) -> dict[str, int]:
        """Proposals replaced inside the proposal step so far (this process): ``repeats_replaced`` stays 0,
        since measured and in-flight configs are never candidates; ``static_rejected`` counts the distinct
        configs the workload's static check refused as they were about to be proposed (the next candidate
        was proposed instead). The space's static rules are applied before scoring and count as neither."""
        rejected = self._strategy.feasible.static_rejected if self._strategy is not None else 0
        return {"repeats_replaced": 0, "static_rejected": int(rejected)}

    # Optuna's sampler interface ------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self._distributions)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or "fixed_params" in trial.system_attrs:
            return {}  # an enqueued config (a seed) is suggested as given
        config = self.propose(study, trial.number)
        self._planned[trial.number] = config
        return self._space.optuna_params(config)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        planned = self._planned.get(trial.number)
        if planned is not None:
            value = self._space.optuna_params(planned).get(param_name)
            if value is not None:
                return value
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._planned.pop(trial.number, None)


__all__ = ["Prior", "SpaceExhausted", "TunerSampler", "default_startup", "optuna_distributions"]
