"""The proposal step: from what a study has measured and has in flight, the next config to measure.

1. Space-filling start: until ``n_startup`` trials exist, of 20 random candidates the one farthest
   (in encoded units) from every measured or in-flight config; random ones while fewer than two
   feasible results exist.
2. Then a Gaussian process over the feasible results (objective log-scaled when positive,
   standardised; 2-3 objectives scalarised with random Chebyshev weights per proposal, as ParEGO
   does), expected improvement times the probability of feasibility (a kernel-weighted share of
   the feasible trials nearby: failures and constraint violations), maximised over a sample of
   feasible unmeasured candidates plus 1-3-knob moves around the best configs.
3. In-flight configs are excluded and enter the GP at their predicted mean (kriging believer), so a
   batch of proposals spreads out instead of piling onto one peak.
4. One objective: every third proposal is a local step, the best-scored unmeasured config that
   differs from the incumbent in the fewest knobs (one where any is left): a plateau's peak often
   lies one knob away (a block equal to the row length) where a smooth model ranks it low. Once the
   best result is older than the latest ``patience`` feasible ones, another third of the proposals
   are the most uncertain feasible candidate: a restart somewhere the model knows little about.
5. The posterior conditions on a bounded active set (:data:`PREDICT_CAP` observations: the best
   half and the latest), so a proposal costs about the same at 1,000 trials as at 150.
6. With priors (configs measured at other shapes, :mod:`tuner.strategy.priors`), the surrogate conditions
   on them too, down-weighted, from the first proposal: every other proposal of the space-filling start,
   and every proposal after it, is the model's (their best configs and local moves among the candidates).
   Without priors nothing of this runs: the proposals are the same as before priors existed.

Every choice is a function of the seed, the trial number, the observations and the priors (stored with
the study), so a study rebuilt from the same trials proposes the same configs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.special import erfc, ndtri

from tuner.strategy import gp
from tuner.strategy.candidates import FeasibleSet
from tuner.strategy.encoding import row_key, row_keys, unique_rows
from tuner.strategy.history import Observation
from tuner.strategy.priors import INCUMBENT_PRIORS, Prior, PriorSet

FIT_CAP = 150  # observations the hyperparameters are fitted on
PREDICT_CAP = 150  # observations the posterior conditions on (a bounded active set: the best half, the latest)
SPREAD_CHOICES = 20  # random candidates a space-filling proposal picks the most distant of
INCUMBENTS = 3  # best configs whose local moves join the candidates
CHECK_ROUNDS = 3  # further random samples a proposal draws while the workload's static check refuses most
CHEBYSHEV_RHO = 0.05
LOCAL_TURN = 1  # trial numbers equal to this mod 3 (one objective) take a local step around the incumbent


def standardise(y: np.ndarray) -> np.ndarray:
    """Zero mean, unit variance."""
    return (y - y.mean()) / (y.std() or 1.0)


def warp(y: np.ndarray) -> np.ndarray:
    """Standardised targets with the worse half replaced by Gaussian rank scores (half-rank warping):
    a few very bad configs (a tile far off its plateau) no longer flatten the model of the good ones."""
    n = len(y)
    median = float(np.median(y))
    upper = y >= median
    scale = math.sqrt(float(np.mean((y[upper] - median) ** 2))) or float(y.std()) or 1.0
    out = (y - median) / scale
    if n >= 4:
        ranks = np.argsort(np.argsort(y, kind="stable"), kind="stable")
        scores = ndtri((ranks + 0.5) / n)
        out[~upper] = np.minimum(scores[~upper], 0.0)
    return (out - out.mean()) / (out.std() or 1.0)


def _nearest_first(R: np.ndarray, levels: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``order`` with the rows of ``R`` that differ from ``levels`` in the fewest knobs moved to the front
    (each group keeping its order): a local step, the best-scored unmeasured neighbour of the incumbent."""
    same = (R == levels) | (np.isnan(R) & np.isnan(levels))
    distance = (~same).sum(1)[order]
    near = distance <= max(1, int(distance.min()))
    return np.concatenate([order[near], order[~near]])


class SpaceExhausted(RuntimeError):
    """Nothing new is left to propose (every statically feasible config of the space measured or in flight,
    a grid visited in full): the one signal of the end, from a proposal, the adapter and the orchestrator.
    ``reason``: the study's message (None: nothing to say, as a grid's end is its plan)."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason or "nothing new is left to propose")
        self.reason = reason


def _schedule_point(n: int) -> int:
    """The largest refit point <= n: hyperparameters are refitted as the data grows by a quarter."""
    point, nxt = 2, 2
    while nxt <= n:
        point = nxt
        nxt = max(point + 1, math.ceil(point * 1.25))
    return point


class Strategy:
    """Proposes configs from a :class:`FeasibleSet`. ``directions``: one per objective."""

    def __init__(
        self,
        feasible: FeasibleSet,
        directions: Sequence[str],
        *,
        seed: int,
        n_startup: int,
        n_candidates: int = 1000,
        priors: Sequence[Prior] = (),
    ) -> None:
        """``priors``: what configs measured elsewhere (:class:`~tuner.strategy.priors.Prior`); never trials."""
        self.feasible = feasible
        self.signs = np.array([1.0 if d == "maximize" else -1.0 for d in directions])
        self.seed = seed
        self.n_startup = n_startup
        self.n_candidates = n_candidates
        self.patience = max(8, 2 * len(feasible.space.params))
        self._hyper: dict[tuple[Any, ...], gp.Hyper] = {}
        prior_set = PriorSet(priors, feasible) if priors else None
        self.priors: PriorSet | None = prior_set if prior_set else None  # None: none with a figure in the space

    def remaining(self, exclude: set[bytes]) -> int | None:
        """Feasible configs whose row keys are not in ``exclude``; None when the space is sampled, not decoded."""
        return self.feasible.remaining(exclude)

    def exclusion(self, observations: list[Observation], planned: list[dict[str, Any]]) -> set[bytes]:
        """The row keys of the measured, in-flight and planned configs: what a proposal must not repeat."""
        return {o.row for o in observations} | {row_key(self.feasible.encoder.row(c)) for c in planned}

    def propose(self, observations: list[Observation], planned: list[dict[str, Any]], number: int) -> dict[str, Any]:
        """The config for trial ``number``; raises :class:`SpaceExhausted` when none is left."""
        rng = np.random.default_rng([self.seed, number])
        encoder = self.feasible.encoder
        exclude = self.exclusion(observations, planned)
        if self.remaining(exclude) == 0:
            raise SpaceExhausted("every statically feasible config of the space has been measured")
        done = [o for o in observations if o.feasible]
        startup = len(observations) + len(planned) < self.n_startup
        if self.priors is not None and not (startup and number % 2):
            return self._propose_with_priors(observations, planned, number, rng, exclude, startup)
        modelled = not startup and len(done) >= 2
        y_all = self._targets(done, rng) if modelled else np.zeros(0)
        top = np.argsort(-y_all, kind="stable")[:INCUMBENTS]
        incumbents = [done[int(i)] for i in top]
        R, Xc = self._candidates(rng, exclude, incumbents)
        if not len(R):
            raise SpaceExhausted("no statically feasible unmeasured config could be drawn")
        pending = [o.x for o in observations if o.running] + list(encoder.encode_many(planned))
        if startup:
            return self._first_accepted(R, self._space_filling(Xc, [o.x for o in observations] + pending, rng), exclude)
        if len(done) < 2:  # past the start with almost nothing feasible: search at random until something is
            return self._first_accepted(R, rng.permutation(len(R)), exclude)
        # A portfolio of two views of the results, alternating: as measured (standardised) and half-rank
        # warped; each wins on some landscapes (a far-off tile's collapse either matters or is noise).
        transform = warp if number % 2 else standardise
        hyper = self._fitted(done, transform)
        keep = self._subset(done, y_all, PREDICT_CAP)
        X, y = np.stack([done[i].x for i in keep]), transform(y_all[keep])
        posterior = gp.Posterior(X, y, hyper)
        if pending:  # kriging believer: in-flight configs "measured" at their predicted mean
            Xp = np.stack(pending)
            posterior = gp.Posterior(np.vstack([X, Xp]), np.concatenate([y, posterior.predict(Xp)[0]]), hyper)
        mean, std = posterior.predict(Xc)
        log_feasible = self._log_feasibility(Xc, observations)
        if self._stalled(done, y_all) and number % 3 == 0:
            score = np.log(std) + log_feasible
        else:
            score = gp.log_expected_improvement(mean, std, float(y.max())) + log_feasible
        order = np.argsort(-score, kind="stable")
        if len(self.signs) == 1 and number % 3 == LOCAL_TURN:
            order = _nearest_first(R, incumbents[0].levels, order)
        return self._first_accepted(R, order, exclude)

    def _propose_with_priors(
        self,
        observations: list[Observation],
        planned: list[dict[str, Any]],
        number: int,
        rng: np.random.Generator,
        exclude: set[bytes],
        startup: bool,
    ) -> dict[str, Any]:
        """A proposal of the surrogate over the study's feasible results and the priors (at their extra noise):
        expected improvement on the best result here (the priors' best while there is none) times the
        probability of feasibility, which reads the priors' failures too."""
        assert self.priors is not None
        done = [o for o in observations if o.feasible]
        k = len(self.signs)
        weights = rng.dirichlet(np.ones(k)) if k > 1 else None  # one scalarisation for the study and the priors
        kept, y_prior = self.priors.targets(lambda obs: self._targets(obs, None, weights))
        y_own = self._targets(done, None, weights) if done else np.zeros(0)
        best_priors = [kept[int(i)] for i in np.argsort(-y_prior, kind="stable")[:INCUMBENT_PRIORS]]
        incumbents = [done[int(i)] for i in np.argsort(-y_own, kind="stable")[:INCUMBENTS]] + best_priors
        R, Xc = self._candidates(rng, exclude, incumbents, extra=[o.levels for o in best_priors])
        if not len(R):
            raise SpaceExhausted("no statically feasible unmeasured config could be drawn")
        transform = warp if number % 2 else standardise
        keep = self._subset(done, y_own, PREDICT_CAP) if done else np.zeros(0, dtype=int)
        own_y = transform(y_own[keep]) if len(keep) else np.zeros(0)
        X = np.stack([done[i].x for i in keep] + [o.x for o in kept])
        y = np.concatenate([own_y, y_prior])
        noise = np.concatenate([np.zeros(len(keep)), self.priors.noise(kept)])
        hyper = self._fitted_with_priors(done, kept, y_prior, transform)
        posterior = gp.Posterior(X, y, hyper, noise)
        pending = [o.x for o in observations if o.running] + list(self.feasible.encoder.encode_many(planned))
        if pending:  # kriging believer, as without priors
            Xp = np.stack(pending)
            y_all = np.concatenate([y, posterior.predict(Xp)[0]])
            posterior = gp.Posterior(np.vstack([X, Xp]), y_all, hyper, np.concatenate([noise, np.zeros(len(Xp))]))
        mean, std = posterior.predict(Xc)
        log_feasible = self._log_feasibility(Xc, observations + self.priors.measured())
        if not startup and self._stalled(done, y_own) and number % 3 == 0:
            score = np.log(std) + log_feasible
        else:
            incumbent = float(own_y.max()) if len(own_y) else float(y_prior.max())
            score = gp.log_expected_improvement(mean, std, incumbent) + log_feasible
        return self._first_accepted(R, np.argsort(-score, kind="stable"), exclude)

    def _fitted_with_priors(
        self,
        done: list[Observation],
        kept: list[Observation],
        y_prior: np.ndarray,
        transform: Callable[[np.ndarray], np.ndarray],
    ) -> gp.Hyper:
        """Hyperparameters fitted on the first results (as :meth:`_fitted`) and the kept priors together."""
        first = sorted(done, key=lambda o: o.number)[: _schedule_point(len(done))] if len(done) >= 2 else []
        key = ("priors-" + transform.__name__, *(o.number for o in first), *(o.number for o in kept))
        hyper = self._hyper.get(key)
        if hyper is None:
            y = transform(self._targets(first, None)) if first else np.zeros(0)
            X = np.stack([o.x for o in first] + [o.x for o in kept])
            noise = np.concatenate([np.zeros(len(first)), self.priors.noise(kept)])  # type: ignore[union-attr]
            hyper = gp.fit(X, np.concatenate([y, y_prior]), extra_noise=noise)
            self._hyper = {k: v for k, v in self._hyper.items() if k[0] != key[0]} | {key: hyper}
        return hyper

    def _first_accepted(self, R: np.ndarray, order: np.ndarray, exclude: set[bytes]) -> dict[str, Any]:
        """The config of the first row in ``order`` that the workload's static check passes. When it refuses
        them all, the rest of a decoded space is tried; a sampled one is taken as exhausted."""
        fs = self.feasible
        for i in order:
            config = fs.accept(R[int(i)])
            if config is not None:
                return config
        if fs.enumerated:
            rest = fs.sample(np.random.default_rng(self.seed), len(fs.rows), exclude | {row_key(r) for r in R})
            for row in rest:
                config = fs.accept(row)
                if config is not None:
                    return config
        raise SpaceExhausted("the workload's static check refuses every unmeasured config left")

    def _candidates(
        self,
        rng: np.random.Generator,
        exclude: set[str | bytes],
        incumbents: list[Observation],
        extra: list[np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Level rows and encodings of the candidates: a random sample of the free rule-feasible configs plus
        local moves around the incumbents (the workload's static check is applied when one is picked), and the
        ``extra`` rows (priors' configs) that are free and pass the rules."""
        fs = self.feasible
        parts = [self._checked_sample(rng, exclude)]  # type: ignore[arg-type]
        n_random = 30 if fs.enumerated else 10
        parts.append(fs.neighbours([o.levels for o in incumbents], rng, n_random, exclude))  # type: ignore[arg-type]
        if extra:
            rows = np.stack(extra)
            free = [row_key(r) not in exclude and (not fs.enumerated or row_key(r) in fs.index) for r in rows]
            rows = rows[np.array(free, dtype=bool)]
            parts.append(rows[fs.rule_mask(rows)])
        R = np.vstack(parts)
        if len(R) > len(parts[0]):  # a local move may also be in the random sample
            R = unique_rows(R)
        R = R[fs.check_mask(R)]  # the workload's static check before scoring: proposals come from the feasible set
        return R, fs.encoder.encode_rows(R)

    def _checked_sample(self, rng: np.random.Generator, exclude: set[bytes]) -> np.ndarray:
        """A random sample of the free configs that pass the rules and the workload's static check: drawn again
        (at most :data:`CHECK_ROUNDS` times) while the check refuses more than half of what was drawn."""
        fs = self.feasible
        rows = fs.sample(rng, self.n_candidates, exclude)
        kept = rows[fs.check_mask(rows)]
        for _ in range(CHECK_ROUNDS):
            if 2 * len(kept) >= self.n_candidates or len(rows) < self.n_candidates:
                break
            exclude = exclude | set(row_keys(rows))
            rows = fs.sample(rng, self.n_candidates, exclude)
            kept = np.vstack([kept, rows[fs.check_mask(rows)]])
        return kept

    # pieces ------------------------------------------------------------------
    def _space_filling(self, Xc: np.ndarray, taken: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
        """Candidates in the order a space-filling proposal tries them: of a few random ones, the farthest
        from every taken config first (spread out, without the pull to the corners of the space, huge tiles
        where configs fail, that the farthest of all has), then the rest at random."""
        order = rng.permutation(len(Xc))
        if not taken:
            return order
        few = order[:SPREAD_CHOICES]
        far = few[np.argsort(-gp.sqdist(Xc[few], np.stack(taken)).min(1), kind="stable")]
        return np.concatenate([far, order[SPREAD_CHOICES:]])

    def _targets(
        self, done: list[Observation], rng: np.random.Generator | None, weights: np.ndarray | None = None
    ) -> np.ndarray:
        """One number per feasible observation, larger is better (Chebyshev ``weights``, else random ones
        with ``rng``, else equal ones)."""
        values = np.array([o.values for o in done], dtype=float)
        for j in range(values.shape[1]):
            if (values[:, j] > 0).all():
                values[:, j] = np.log(values[:, j])
        values = values * self.signs
        if values.shape[1] == 1:
            return values[:, 0]
        low, high = values.min(0), values.max(0)
        regret = (high - values) / np.where(high > low, high - low, 1.0)  # 0 at the best of each objective
        k = values.shape[1]
        if weights is None:
            weights = rng.dirichlet(np.ones(k)) if rng is not None else np.full(k, 1.0 / k)
        weighted = regret * weights
        return -(weighted.max(1) + CHEBYSHEV_RHO * weighted.sum(1))

    def _subset(self, done: list[Observation], y: np.ndarray, cap: int) -> np.ndarray:
        """Indices of at most ``cap`` observations: the best half by target, the rest the latest by number."""
        n = len(done)
        if n <= cap:
            return np.arange(n)
        best = np.argsort(-y, kind="stable")[: cap // 2]
        chosen = set(best.tolist())
        rest = [i for i in np.argsort([-o.number for o in done], kind="stable") if i not in chosen]
        return np.sort(np.concatenate([best, np.array(rest[: cap - len(best)], dtype=int)]))

    def _fitted(self, done: list[Observation], transform: Callable[[np.ndarray], np.ndarray]) -> gp.Hyper:
        """Hyperparameters fitted on the first (by trial number) observations up to the last refit point."""
        first = sorted(done, key=lambda o: o.number)[: _schedule_point(len(done))]
        key = (transform.__name__, *(o.number for o in first))
        hyper = self._hyper.get(key)
        if hyper is None:
            y = self._targets(first, None)
            keep = self._subset(first, y, FIT_CAP)
            hyper = gp.fit(np.stack([first[i].x for i in keep]), transform(y[keep]))
            # one entry per model: the next refit point supersedes it
            self._hyper = {k: v for k, v in self._hyper.items() if k[0] != key[0]} | {key: hyper}
        return hyper

    def _log_feasibility(self, Xc: np.ndarray, observations: list[Observation]) -> np.ndarray:
        """log P(feasible) per candidate: a GP regression of the measured configs' labels (+1 feasible,
        -1 failed or violating a constraint) read through a probit; 0 when nothing has failed."""
        measured = [o for o in observations if not o.running]
        if len(measured) > PREDICT_CAP:  # the latest failures (up to half) and the latest feasible configs
            failed = [o for o in measured if not o.feasible][-(PREDICT_CAP // 2) :]
            ok = [o for o in measured if o.feasible][-(PREDICT_CAP - len(failed)) :]
            measured = sorted(failed + ok, key=lambda o: o.number)
        labels = np.array([1.0 if o.feasible else -1.0 for o in measured])
        if not len(labels) or (labels > 0).all():
            return np.zeros(len(Xc))
        X = np.stack([o.x for o in measured])
        first = sorted(range(len(measured)), key=lambda i: measured[i].number)[: _schedule_point(len(measured))]
        key = ("feasibility", *(measured[i].number for i in first))
        hyper = self._hyper.get(key)
        if hyper is None:
            fit_on = first[:: max(1, math.ceil(len(first) / FIT_CAP))]
            hyper = gp.fit(X[fit_on], labels[fit_on] - labels[fit_on].mean())
            self._hyper = {k: v for k, v in self._hyper.items() if k[0] != "feasibility"} | {key: hyper}
        offset = labels.mean()
        mean, std = gp.Posterior(X, labels - offset, hyper).predict(Xc)
        z = (mean + offset) / np.sqrt(std * std + 0.25)
        return np.log(np.clip(0.5 * erfc(-z / math.sqrt(2)), 1e-6, 1.0))

    def _stalled(self, done: list[Observation], y: np.ndarray) -> bool:
        """Whether to spend every third proposal on the most uncertain candidate (a restart): for one
        objective, once the best result is older than the latest ``patience`` feasible results. (Until
        then those turns go to the acquisition: spent on the most uncertain configs, they were mostly
        huge or tiny tiles far off any plateau.)"""
        if len(self.signs) != 1 or len(done) < self.patience:
            return False
        numbers = np.array([o.number for o in done])
        return bool(numbers[int(np.argmax(y))] < np.sort(numbers)[-self.patience])
