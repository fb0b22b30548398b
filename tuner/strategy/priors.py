"""Prior knowledge for the strategy: what configs measured somewhere else (the registry's nearest shapes).

A :class:`Prior` is a config and the objective values it measured at another shape of the workload (or
its failure there). Priors are never trials of the study: no row, nothing told to Optuna, and no
exclusion (a config measured only elsewhere may be proposed: it is worth measuring here). The strategy
(:mod:`tuner.strategy.model`) reads them as down-weighted observations:

- Figures are compared within their ``source`` only (one study at one shape): a TFLOP/s at another shape
  is on another scale, so each source's targets are standardised among themselves. A source of one config
  (a registry winner whose study is gone) reads as :data:`LONE_TARGET` standard deviations above its mean.
- Each prior row carries extra noise variance ``PRIOR_NOISE_VAR * (1 + distance)`` (standardised units)
  in the surrogate, so the study's own results outweigh the priors wherever both exist, the more so the
  farther the shape they were measured at.
- Their best configs join the candidates (with their local moves), and failures there (a config that did
  not compile or ran out of resources) join the feasibility model.
- During the space-filling start every other proposal is the priors' most promising candidate instead
  (see :meth:`tuner.strategy.model.Strategy.propose`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.strategy.candidates import FeasibleSet
from tuner.strategy.encoding import config_key, row_key
from tuner.strategy.history import Observation

PRIOR_NOISE_VAR = 0.3  # extra noise of a prior at distance 0, in standardised target units
LONE_TARGET = 1.0
MAX_PRIORS = 60  # prior rows the surrogate conditions on (the best of each source first)
INCUMBENT_PRIORS = 3  # best prior configs whose local moves join the candidates


@dataclass(frozen=True)
class Prior:
    """A config measured elsewhere. ``values``: its objective values there, in the study's objective
    order, or None when it failed there or violated a constraint (``feasible`` False). ``source``: priors
    measured together (one study at one shape), compared with each other only. ``distance``: how far that
    shape is from the study's (the workload's shape distance, 0 for the same shape)."""

    config: dict[str, Any]
    values: tuple[float, ...] | None
    source: str
    distance: float = 0.0

    @property
    def feasible(self) -> bool:
        return self.values is not None


class PriorSet:
    """The priors a study's proposals read, encoded once. ``observations``: the priors in the space, as
    :class:`Observation` s numbered -1, -2, ... (never a trial number); ``feasible`` the ones with values."""

    def __init__(self, priors: Sequence[Prior], feasible_set: FeasibleSet) -> None:
        encoder, space = feasible_set.encoder, feasible_set.space
        self.observations: list[Observation] = []
        self.sources: list[str] = []
        self.distances: list[float] = []
        for prior in priors:
            if space.validate_config(prior.config) is not None:
                continue  # outside this study's space (overridden bounds, another kernel family)
            config = dict(prior.config)
            levels = encoder.row(config)
            x = encoder.encode_rows(levels[None, :])[0]
            number = -(len(self.observations) + 1)
            obs = Observation(
                number, config_key(config), config, x, False, prior.feasible, prior.values, levels, row_key(levels)
            )
            self.observations.append(obs)
            self.sources.append(prior.source)
            self.distances.append(float(prior.distance))
        self.feasible = [i for i, o in enumerate(self.observations) if o.feasible]

    def __bool__(self) -> bool:
        return bool(self.feasible)

    def targets(self, scalarise: Callable[[list[Observation]], np.ndarray]) -> tuple[list[Observation], np.ndarray]:
        """The feasible priors kept (at most :data:`MAX_PRIORS`, the best of each source first) and their
        targets, larger is better: ``scalarise`` (the strategy's own, with this proposal's weights) applied
        to each source's priors, standardised within the source."""
        by_source: dict[str, list[int]] = {}
        for i in self.feasible:
            by_source.setdefault(self.sources[i], []).append(i)
        ranked: list[tuple[int, float, int]] = []  # (rank within its source, target, prior index)
        for members in by_source.values():
            y = scalarise([self.observations[i] for i in members])
            z = (y - y.mean()) / (y.std() or 1.0) if len(y) > 1 else np.full(1, LONE_TARGET)
            order = np.argsort(-z, kind="stable")
            ranked += [(rank, float(z[j]), members[int(j)]) for rank, j in enumerate(order)]
        ranked.sort(key=lambda r: (r[0], -r[1], r[2]))
        kept = sorted(ranked[:MAX_PRIORS], key=lambda r: r[2])
        return [self.observations[i] for _, _, i in kept], np.array([t for _, t, _ in kept])

    def noise(self, kept: list[Observation]) -> np.ndarray:
        """The extra noise variance of each kept prior (by its shape's distance)."""
        return np.array([PRIOR_NOISE_VAR * (1.0 + self.distances[-o.number - 1]) for o in kept])

    def measured(self) -> list[Observation]:
        """Every prior in the space, feasible or not: what the feasibility model reads beside the trials."""
        return list(self.observations)


__all__ = ["MAX_PRIORS", "PRIOR_NOISE_VAR", "Prior", "PriorSet"]
