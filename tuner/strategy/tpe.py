"""The project's TPE: Optuna's multivariate, group-decomposed TPE with the constant liar, made incremental.

It computes what ``optuna.samplers.TPESampler(multivariate=True, group=True, constant_liar=True)`` computes
for one objective with its default estimator: the trials split by gamma(n) = min(ceil(n / 10), 25) into a
good set (the best complete feasible trials, then pruned ones by their last step, then the least infeasible)
and the rest, running trials with the rest (the constant liar); in each group of parameters that always
appear together, a Parzen mixture per set (:mod:`tuner.strategy.parzen`), one kernel per trial that has the
group's params plus a prior's, older trials of the rest weighed down (Optuna's ramp beyond 25); 24 candidates
drawn from the good mixture, the one of highest l(x) / g(x) wins.

What differs is the cost and the randomness. Optuna re-derives everything from every trial on each ask (group
decomposition, constraints, params, sorting, all per trial in Python: 25 ms a proposal at 1,000 trials).
Here each finished trial is encoded once, by its number, into rows of arrays (:class:`TPEHistory`); an ask
reads only the trials after the leading finished ones, and the split and the densities are numpy over
candidates x trials. Each proposal draws from a generator seeded by (seed, trial number), so the same seed
and the same results give the same proposals, and a sampler rebuilt on a study's trials proposes what the one
that saw them live would have. A running trial counts with the params it has been given (Optuna also reads
params another process is still suggesting from the trial's system attributes, through its storage's private
API). Single objective only: :func:`tuner.strategy.samplers.make_sampler` gives multi-objective studies Optuna's TPE.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from tuner.strategy.parzen import ParzenMixture, modelled_bounds, ramp_weights

N_EI_CANDIDATES = 24


def n_below(n_finished: int) -> int:
    """Optuna's default gamma: how many of ``n_finished`` trials make the good density l(x)."""
    return min(math.ceil(0.1 * n_finished), 25)


class TPEHistory:
    """A study's finished trials as arrays, each trial encoded once (keyed by its number); one per study.

    Rows hold a trial's number, value, whether it is complete (else pruned), its infeasibility (the sum of
    its positive constraint values), its pruned score (Optuna's: last step, last intermediate value) and its
    params' internal values, one column per param name (NaN where the trial lacks it or gave it another
    distribution than the param's first). FAIL trials are left out, as TPE leaves them out.
    """

    _FIELDS = ("number", "value", "complete", "infeasible", "pruned_step", "pruned_value")

    def __init__(self) -> None:
        self._reset("")

    def _reset(self, study_name: str) -> None:
        self.study_name = study_name
        self.columns: dict[str, int] = {}
        self.distributions: list[BaseDistribution] = []
        self.n = 0
        self._x = np.full((64, 0), np.nan)
        self._cols = {f: np.zeros(64) for f in self._FIELDS}
        self._seen: set[int] = set()
        self._prefix = 0  # the trials before this index are all finished and seen
        self._name_sets: set[frozenset[str]] = set()
        self._groups: list[set[str]] = []

    def field(self, name: str) -> np.ndarray:
        return self._cols[name][: self.n]

    @property
    def x(self) -> np.ndarray:
        return self._x[: self.n]

    def groups(self) -> list[dict[str, BaseDistribution]]:
        """Optuna's group decomposition of the finished trials' params, each group's names sorted, groups in the
        order of their first name (the same however the trials finished)."""
        named = sorted(sorted(g) for g in self._groups)
        return [{name: self.distributions[self.columns[name]] for name in g} for g in named]

    def refresh(self, study: optuna.Study, current: int) -> list[FrozenTrial]:
        """Encode the trials finished since the last call; the running trials but ``current``."""
        trials = study.get_trials(deepcopy=False)
        if study.study_name != self.study_name or len(trials) < self._prefix:  # not the study it was built on
            self._reset(study.study_name)
        while self._prefix < len(trials) and trials[self._prefix].state.is_finished():
            self._add(trials[self._prefix])
            self._prefix += 1
        running = []
        for trial in trials[self._prefix :]:
            if trial.state.is_finished():
                self._add(trial)
            elif trial.state == TrialState.RUNNING and trial.number != current:
                running.append(trial)
        return running

    def column(self, name: str, dist: BaseDistribution) -> int:
        """The column of param ``name``, added (empty) when new."""
        if name not in self.columns:
            self.columns[name] = len(self.distributions)
            self.distributions.append(dist)
            self._x = np.hstack([self._x, np.full((len(self._x), 1), np.nan)])
        return self.columns[name]

    def encode(self, trial: FrozenTrial) -> np.ndarray:
        """The trial's params as a row of internal values over the columns."""
        row = np.full(len(self.distributions) + len(trial.distributions), np.nan)
        for name, dist in trial.distributions.items():
            j = self.column(name, dist)
            if dist == self.distributions[j]:
                row[j] = dist.to_internal_repr(trial.params[name])
        return row[: len(self.distributions)]

    def _add(self, trial: FrozenTrial) -> None:
        if trial.number in self._seen:
            return
        self._seen.add(trial.number)
        if trial.state not in (TrialState.COMPLETE, TrialState.PRUNED):
            return
        row = self.encode(trial)
        if self.n == len(self._x):  # full: double the capacity
            self._x = np.vstack([self._x, np.full_like(self._x, np.nan)])
            self._cols = {f: np.concatenate([c, np.zeros_like(c)]) for f, c in self._cols.items()}
        self._x[self.n] = row
        complete = trial.state == TrialState.COMPLETE
        step, value = _pruned_score(trial)
        fields = (trial.number, trial.value if complete else np.nan, complete, _infeasibility(trial), step, value)
        for name, value in zip(self._FIELDS, fields, strict=True):
            self._cols[name][self.n] = value
        self.n += 1
        self._decompose(frozenset(trial.distributions))

    def _decompose(self, names: frozenset[str]) -> None:
        """Refine the groups by one trial's param names (Optuna's ``_SearchSpaceGroup.add_distributions``)."""
        if names in self._name_sets:
            return  # refining by the same names again changes nothing
        self._name_sets.add(names)
        rest, groups = set(names), []
        for group in self._groups:
            groups += [group & names, group - names]
            rest -= group
        self._groups = [g for g in [*groups, rest] if g]


def _infeasibility(trial: FrozenTrial) -> float:
    return float(sum(v for v in trial.constraints.values() if v > 0))


def _pruned_score(trial: FrozenTrial) -> tuple[float, float]:
    """Optuna's order of pruned trials (lower is better): the later the last step and the better its value."""
    if trial.state != TrialState.PRUNED or not trial.intermediate_values:
        return 1.0, 0.0
    step, value = max(trial.intermediate_values.items())
    return -float(step), value  # the direction is applied at the split


class TPESampler(BaseSampler):
    """The project's TPE (see the module's docstring), single objective; Optuna's public sampler API only.

    ``history``: the :class:`TPEHistory` of the study, shared by every sampler made for it (the engine makes
    one per trial, seeded from the trial's number); by default the sampler keeps its own. Not thread-safe: the
    engine asks from one thread (``Study.optimize(n_jobs > 1)`` would need a lock around the history).
    """

    def __init__(
        self,
        *,
        seed: int | None = None,
        n_startup_trials: int = 10,
        n_ei_candidates: int = N_EI_CANDIDATES,
        history: TPEHistory | None = None,
    ) -> None:
        self._seed = int(np.random.SeedSequence(seed).entropy) if seed is None else int(seed)
        self._n_startup = n_startup_trials
        self._n_candidates = n_ei_candidates
        self._history = history if history is not None else TPEHistory()
        self._rngs: dict[int, np.random.Generator] = {}

    def reseed_rng(self) -> None:
        self._seed = int(np.random.SeedSequence().entropy)
        self._rngs.clear()

    def _rng(self, number: int) -> np.random.Generator:
        """The generator of trial ``number``'s proposal: drawn from in the order the space asks its params."""
        if number not in self._rngs:
            if len(self._rngs) > 256:  # trials asked and never told: keep the newest
                self._rngs.pop(next(iter(self._rngs)))
            self._rngs[number] = np.random.default_rng([self._seed % 2**63, number])
        return self._rngs[number]

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if len(study.directions) > 1:
            raise ValueError("the project's TPE is single-objective; use optuna_tpe for several objectives")
        self._history.refresh(study, trial.number)
        return {n: d for group in self._history.groups() for n, d in group.items() if not d.single()}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        running = self._history.refresh(study, trial.number)
        if self._history.n < self._n_startup:
            return {}
        split = self._split(study, running)
        params: dict[str, Any] = {}
        for group in self._history.groups():
            space = {n: d for n, d in group.items() if n in search_space and not d.single()}
            if space:
                params.update(self._sample(split, space, self._rng(trial.number)))
        return params

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        running = self._history.refresh(study, trial.number)
        rng = self._rng(trial.number)
        if self._history.n < self._n_startup:
            return _random(param_distribution, rng)
        self._history.column(param_name, param_distribution)  # a param no finished trial has: the prior alone
        return self._sample(self._split(study, running), {param_name: param_distribution}, rng)[param_name]

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._rngs.pop(trial.number, None)

    def _split(self, study: optuna.Study, running: list[FrozenTrial]) -> tuple[np.ndarray, np.ndarray]:
        """Every finished and running trial's row in trial order, and which rows make the good set (Optuna's
        ``_split_trials``: the best complete feasible trials, then pruned ones, then the least infeasible)."""
        h = self._history
        numbers, infeasible = h.field("number"), h.field("infeasible")
        complete = h.field("complete").astype(bool)
        sign = 1.0 if study.direction == StudyDirection.MINIMIZE else -1.0
        value, pruned_value = sign * h.field("value"), sign * h.field("pruned_value")
        pruned_value = np.where(np.isnan(pruned_value), np.inf, pruned_value)
        good = np.zeros(h.n, dtype=bool)
        left = n_below(h.n)
        feasible = infeasible <= 0
        for mask, keys in (
            (complete & feasible, (value,)),
            (~complete & feasible, (pruned_value, h.field("pruned_step"))),
            (~feasible, (infeasible,)),
        ):
            index = np.flatnonzero(mask)
            ranked = index[np.lexsort((numbers[index], *(k[index] for k in keys)))][:left]
            good[ranked] = True
            left -= len(ranked)
        rows = np.vstack([h.x, *(h.encode(t)[None, :] for t in running)]) if running else h.x
        numbers = np.concatenate([numbers, [t.number for t in running]])
        order = np.argsort(numbers, kind="stable")
        return rows[order], np.concatenate([good, np.zeros(len(running), dtype=bool)])[order]

    def _sample(
        self, split: tuple[np.ndarray, np.ndarray], space: dict[str, BaseDistribution], rng: np.random.Generator
    ) -> dict[str, Any]:
        rows, good = split
        names, dists = list(space), list(space.values())
        columns = [self._history.columns[n] for n in names]
        x = rows[:, columns]
        for j, dist in enumerate(dists):
            if dist != self._history.distributions[columns[j]]:
                x[:, j] = np.nan  # another distribution than the column's: no observations of this one
        has = ~np.isnan(x).any(axis=1)
        below, above = x[has & good], x[has & ~good]
        l_x = ParzenMixture(below, dists, ramp_weights(len(below)))
        g_x = ParzenMixture(above, dists, ramp_weights(len(above)))
        candidates = l_x.sample(rng, self._n_candidates)
        best = candidates[int(np.argmax(l_x.log_pdf(candidates) - g_x.log_pdf(candidates)))]
        return {
            name: dist.to_external_repr(_internal(dist, v)) for name, dist, v in zip(names, dists, best, strict=True)
        }


def _internal(dist: BaseDistribution, value: float) -> Any:
    """A sampled value as the distribution's internal repr (a choice index or an int where one is wanted)."""
    return int(value) if isinstance(dist, CategoricalDistribution) else value


def _random(dist: BaseDistribution, rng: np.random.Generator) -> Any:
    """A uniform draw over ``dist`` (log scales uniform in log), as the startup trials are drawn."""
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[int(rng.integers(len(dist.choices)))]
    if dist.single():
        return dist.low
    low, high, step = modelled_bounds(dist)
    value = float(rng.uniform(low, high))
    value = math.exp(value) if dist.log else value
    if step:
        value = dist.low + round((value - dist.low) / step) * step
    return dist.to_external_repr(min(max(value, dist.low), dist.high))
