"""The sampler adapter: an in-memory Optuna study derived from the project's trial table.

The trial table is the record of truth. When a study opens or resumes, the
adapter rebuilds Optuna's view of it from the rows (a finished row becomes a
finished trial with its values and constraints, a row still running becomes a
trial in flight, whose result is told when its re-run ends), then asks and tells that
study in memory. Nothing of Optuna's is written to the study database: a
result costs one write, ours, and the orchestrator commits it before it calls
:meth:`SamplerAdapter.tell`.

Proposals are reproducible. With a study seed, the sampler that proposes trial
``n`` is made (by :func:`tuner.strategy.samplers.make_sampler`) with a seed derived from
the study's seed and ``n``, so a study stopped after ``n`` trials and resumed
proposes what an uninterrupted run would have proposed given the same results.
A sampler therefore keeps no state between proposals that it cannot derive from
the study's trials' params, values and constraints (Optuna's TPE, GP and random
samplers keep none; the project's TPE keeps the finished trials encoded, one copy shared by the
study's samplers, and draws each proposal from the seed and the trial number; NSGA-II's
generation numbers, kept in its trials' system attributes, are not rebuilt: after a restart it
counts generations afresh).
A sampler not declared ``reseeded`` (the grid; the project's own strategy ``auto``, :mod:`tuner.strategy`)
is made once: the grid's order comes from the study's seed and the points it has visited from the
trials' params; the strategy derives each proposal from the seed, the trial number and the
trials (a small space is decoded in full once; a large one is sampled, never listed).

Only Optuna's public API is used: ``create_trial`` + ``add_trials`` to rebuild,
``enqueue_trial`` for warm-start seeds and for the trials in flight,
``ask``/``tell``, and ``Trial.set_constraint`` for the constraints.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.search_space import IntersectionSearchSpace
from optuna.trial import FrozenTrial, TrialState

from tuner.store.storage import RUNNING
from tuner.strategy import Prior, SpaceExhausted
from tuner.strategy.samplers import make_sampler
from tuner.study.sampler_registry import resolve
from tuner.study.space import SearchSpace
from tuner.study.spec import CompiledStudy
from tuner.workloads.base import TrialStatus

log = logging.getLogger("tuner.run.orchestrator")
STUDY_NAME = "tuner"  # the one study of the adapter's private in-memory storage


def trial_seed(seed: int, number: int) -> int:
    """The sampler's seed for trial ``number`` of a study seeded ``seed``: the same in every run."""
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class ParamEncoder:
    """A config of the space in Optuna's form: its params and their distributions (from the space's own
    ``suggest``, so they are the ones a live trial records)."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self._distributions: dict[str, BaseDistribution] = {}

    def encode(self, config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, BaseDistribution]]:
        params = self.space.optuna_params(config)
        if any(name not in self._distributions for name in params):
            fixed = optuna.trial.FixedTrial(params)
            self.space.suggest(fixed)
            self._distributions.update(fixed.distributions)
        params = {name: value for name, value in params.items() if name in self._distributions}
        return params, {name: self._distributions[name] for name in params}


@dataclass(frozen=True)
class Proposal:
    """A config the sampler proposed, under the trial number it will be recorded with."""

    number: int
    config: dict[str, Any]


class SamplerAdapter:
    """Asks and tells the sampler on a study rebuilt from trial rows. Not thread-safe.

    ``rows``: the study's trial rows, numbered 0, 1, ... (a gap is filled with a failed trial, which
    samplers ignore, so numbers stay aligned). ``static_reason``: why a config is statically
    infeasible, or None; it filters the warm-start seeds, and the project's strategy proposes only
    configs it passes. ``device``: the device fields of the space's ``device.*`` rules.
    """

    def __init__(
        self,
        compiled: CompiledStudy,
        rows: Sequence[Any],
        static_reason: Callable[[dict[str, Any]], str | None],
        device: Mapping[str, Any] | None = None,
        warm_configs: Sequence[tuple[dict[str, Any], dict[str, Any]]] = (),
        priors: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """``warm_configs``: (config, origin) pairs enqueued before the space's seeds (``warm_start:
        registry``); :attr:`origins` maps the trial numbers they were given to their origin. ``priors``: what
        configs measured at other shapes (``{"config", "status", "metrics", "source", "distance"}``, as
        :func:`tuner.best_configs.warm_start.registry_priors` reads them), for the project's strategy only; never
        trials."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.compiled = compiled
        spec = compiled.spec
        #: the registered sampler the study gets (its capabilities decide what the adapter does)
        self.info = resolve(spec.sampler, len(compiled.objectives))
        self.sampler_name = self.info.name
        self._priors = self._as_priors(priors) if self.info.priors else []
        #: what became of the priors: how many the strategy reads, or why none
        self.priors_note = self._priors_note(priors)
        self._seed = spec.seed
        self._grid: list[dict[str, Any]] | None = None
        if self.info.enumerates:
            self._grid = [compiled.space.optuna_params(p) for p in compiled.space.grid()]
        self._per_trial_seed = self._seed is not None and self.info.reseeded
        self._device, self._static_reason = device, static_reason
        self._storage = optuna.storages.InMemoryStorage()
        self._intersection = IntersectionSearchSpace()  # one for the study, whatever the samplers made
        self._sampler = self._make_sampler(self._seed)
        self._study = optuna.create_study(
            storage=self._storage, study_name=STUDY_NAME, directions=compiled.directions, sampler=self._sampler
        )
        self._encoder = ParamEncoder(compiled.space)
        self._open: dict[int, optuna.Trial] = {}  # asked, not yet told
        self._queued: deque[int] = deque()  # numbers of enqueued trials, in the order ask hands them out
        self._n_trials = 0
        self._worst: dict[str, float] = {}
        self.origins: dict[int, dict[str, Any]] = {}  # trial number -> where its enqueued config came from
        self._rebuild(rows)
        if spec.warm_start and not self.info.enumerates:
            self._enqueue_seeds(rows, static_reason, warm_configs)

    # sampler ------------------------------------------------------------------
    def _make_sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        compiled, spec = self.compiled, self.compiled.spec
        return make_sampler(
            self.sampler_name,
            n_objectives=len(compiled.objectives),
            seed=seed,
            budget_trials=spec.budget.trials,
            has_conditions=any(p.when is not None for p in compiled.space.params.values()),
            grid_points=self._grid,
            space=compiled.space,
            device=self._device,
            static_check=self._static_reason,
            intersection=self._intersection,
            priors=self._priors,
            storage=self._storage,
        )

    def _as_priors(self, records: Sequence[Mapping[str, Any]]) -> list[Prior]:
        """The records as the strategy's priors: an ``ok`` record that has every objective's figure and meets
        every constraint has values (in the study's objective order); any other is a failure there."""
        out = []
        for record in records:
            metrics = dict(record.get("metrics") or {})
            values: tuple[float, ...] | None = None
            if record.get("status") == TrialStatus.OK.value:
                figures = [metrics.get(m) for m, _ in self.compiled.objectives]
                met = all(c.violation(metrics) <= 0 for c in self.compiled.constraints)
                if met and all(finite(v) for v in figures):
                    values = tuple(float(v) for v in figures)  # type: ignore[arg-type]
            source, distance = str(record.get("source", "")), float(record.get("distance") or 0.0)
            out.append(Prior(dict(record.get("config") or {}), values, source, distance))
        return out

    def _priors_note(self, records: Sequence[Mapping[str, Any]]) -> str | None:
        if not records:
            return None
        if not self.info.priors:
            return (
                f"{len(records)} priors not used: the {self.sampler_name} sampler (Optuna's) learns from its "
                "study's trials only; the registry's configs are enqueued first all the same"
            )
        sources = len({p.source for p in self._priors})
        return f"{len(self._priors)} priors from {sources} source(s) read by the strategy (never trials)"

    def _study_for(self, number: int) -> optuna.Study:
        """The study as trial ``number``'s sampler sees it (same storage, that trial's seed)."""
        if not self._per_trial_seed:
            return self._study
        sampler = self._make_sampler(trial_seed(self._seed, number))  # type: ignore[arg-type]
        return optuna.load_study(study_name=STUDY_NAME, storage=self._storage, sampler=sampler)

    def trials(self) -> list[FrozenTrial]:
        """The sampler's view of the study (copies), in number order."""
        return self._study.get_trials(deepcopy=True)

    def proposal_counts(self) -> dict[str, int] | None:
        """Proposals the sampler replaced inside its proposal step in this run (see
        :meth:`TunerSampler.proposal_counts`); None for a sampler that replaces nothing (an Optuna
        sampler's repeats and statically infeasible proposals are trial rows, in the status counts)."""
        if self.info.replaces_proposals:
            return self._sampler.proposal_counts()  # type: ignore[attr-defined]
        return None

    # ask and tell -------------------------------------------------------------
    def ask(self) -> Proposal:
        """The next config, suggested by the space's code through an Optuna trial. Raises
        :class:`SpaceExhausted` (the one signal of the end; its ``reason`` is the study's message) when the
        sampler has nothing new left: an ``exhaustible`` sampler says so before a trial is asked (a grid
        visited in full, every statically feasible config measured or in flight), or its proposal finds none."""
        if self.info.exhaustible and self._sampler.is_exhausted(self._study):  # type: ignore[attr-defined]
            raise SpaceExhausted(self.info.exhausted_message)
        return self._ask()

    def _ask(self) -> Proposal:
        number = self._queued.popleft() if self._queued else self._take_number()
        trial = self._study_for(number).ask()
        assert trial.number == number, (trial.number, number)
        try:
            config = self.compiled.space.suggest(trial)
        except SpaceExhausted as exc:  # the asked trial never runs: it is no row, and samplers ignore it
            trial.study.tell(trial, state=TrialState.FAIL)
            raise SpaceExhausted(f"the space is exhausted: {exc}") from exc
        self._open[number] = trial
        return Proposal(number, config)

    def _take_number(self) -> int:
        self._n_trials += 1
        return self._n_trials - 1

    def tell(self, number: int, status: str, metrics: Mapping[str, Any]) -> None:
        """Tell the sampler trial ``number``'s result; a failure is told as infeasible, with the worst
        values seen so far. The caller has committed the result to the trial table first."""
        trial = self._open.pop(number, None)
        if trial is None:
            return  # never asked here, or told already
        values, violations = self._outcome(status, metrics)
        if self.info.constraints_on_every_trial or any(v > 0 for v in violations):
            for index, violation in enumerate(violations):
                trial.set_constraint(str(index), violation)
        trial.study.tell(trial, values, state=TrialState.COMPLETE, skip_if_finished=True)
        self._note(status, metrics)

    def _outcome(self, status: str, metrics: Mapping[str, Any]) -> tuple[list[float], list[float]]:
        """The values and constraint violations a trial is told with (the last one: it failed)."""
        ok = status == TrialStatus.OK.value
        violations = [c.violation(metrics) if ok else 1.0 for c in self.compiled.constraints]
        violations.append(0.0 if ok else 1.0)
        if ok:
            values = [float(metrics[m]) for m, _ in self.compiled.objectives]
        else:
            values = [self._penalty(m, metrics) for m, _ in self.compiled.objectives]
        return values, violations

    def _penalty(self, metric: str, metrics: Mapping[str, Any]) -> float:
        """A failed trial's stand-in value: the worst seen so far (its constraints mark it infeasible)."""
        if metric in self._worst:
            return self._worst[metric]
        value = metrics.get(metric)
        return float(value) if finite(value) else 0.0

    def _note(self, status: str, metrics: Mapping[str, Any]) -> None:
        if status != TrialStatus.OK.value:
            return
        for metric, direction in self.compiled.objectives:
            value = metrics.get(metric)
            if not finite(value):
                continue
            worst = self._worst.get(metric)
            if worst is None or (value < worst if direction == "maximize" else value > worst):
                self._worst[metric] = float(value)

    # rebuild ------------------------------------------------------------------
    def _rebuild(self, rows: Iterable[Any]) -> None:
        """Add the rows' trials in number order: finished ones at once, running ones as trials in flight."""
        finished: list[FrozenTrial] = []
        for row in sorted(rows, key=lambda r: r.number):
            while self._n_trials < row.number:  # a gap: keep numbers aligned with a trial samplers ignore
                finished.append(optuna.trial.create_trial(state=TrialState.FAIL))
                self._take_number()
            if row.status == RUNNING:
                self._study.add_trials(finished)
                finished = []
                self._reopen(row)
            else:
                finished.append(self._frozen(row))
                self._take_number()
        self._study.add_trials(finished)

    def _frozen(self, row: Any) -> FrozenTrial:
        values, violations = self._outcome(row.status, row.metrics)
        self._note(row.status, row.metrics)
        params, distributions = self._encoder.encode(row.params)
        constraints = None
        if self.info.constraints_on_every_trial or any(v > 0 for v in violations):
            constraints = {str(i): v for i, v in enumerate(violations)}
        return optuna.trial.create_trial(
            params=params, distributions=distributions, values=values, constraints=constraints
        )

    def _reopen(self, row: Any) -> None:
        """A row an earlier run left running: the same params as a trial in flight, to be told later."""
        params, _ = self._encoder.encode(row.params)
        self._study.enqueue_trial(params)
        self._queued.append(self._take_number())
        self._ask()  # the caller dispatches the row's own config again and tells its result

    def _enqueue_seeds(
        self,
        rows: Sequence[Any],
        static_reason: Callable[[dict[str, Any]], str | None],
        warm_configs: Sequence[tuple[dict[str, Any], dict[str, Any]]] = (),
    ) -> None:
        """Warm start: the registry's configs (when given), then the space's seed configs, at most a quarter
        of the budget, those not in the table yet (a resumed study goes on with the seeds its first run had
        no time for). A registry config outside this study's space or statically infeasible is left out."""
        space, budget = self.compiled.space, self.compiled.spec.budget.trials
        limit = max(1, budget // 4)
        candidates = [(c, o) for c, o in warm_configs if space.validate_config(c) is None and static_reason(c) is None]
        candidates += [(s, {"source": "seed"}) for s in space.seeds]
        feasible = [s for s, _ in candidates if static_reason(s) is None]
        origin_of = {_key(space.optuna_params(c)): o for c, o in reversed(candidates)}
        if len(feasible) > limit and not rows:
            log.warning(
                "warm start: %d of %d seed configs enqueued (seeds take at most a quarter of budget.trials=%d)",
                limit,
                len(feasible),
                budget,
            )
        tried = {_key(space.optuna_params(r.params)) for r in rows}
        for seed_config in feasible[:limit]:
            params = space.optuna_params(seed_config)
            if _key(params) in tried:
                continue
            tried.add(_key(params))
            self._study.enqueue_trial(params)
            number = self._take_number()
            self._queued.append(number)
            self.origins[number] = origin_of.get(_key(params), {"source": "seed"})


def _key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))
