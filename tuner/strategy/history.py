"""What a study has measured and has in flight, read through Optuna's public trial API only.

The engine tells a failed or constraint-violating trial as COMPLETE with a positive entry in the
trial's constraint values (``tuner.strategy.samplers.CONSTRAINTS_ATTR``, Optuna's own key); a FAIL trial
counts as infeasible too. So this works on any storage, including an in-memory study rebuilt
from the project's trial table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.strategy.encoding import Encoder, config_from_optuna, config_key, row_key
from tuner.study.space import SearchSpace

CONSTRAINTS_ATTR = "constraints"  # as tuner.strategy.samplers writes it (Optuna's key for Trial.set_constraint too)
STATES = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.FAIL)


@dataclass(frozen=True)
class Observation:
    """One trial as the strategy sees it. ``values`` is None unless the trial is complete and feasible."""

    number: int
    key: str
    config: dict[str, Any]
    x: np.ndarray
    running: bool
    feasible: bool
    values: tuple[float, ...] | None
    levels: np.ndarray  # the config's level row (see :class:`Encoder`)
    row: bytes  # its identity (``row_key``): what a proposal must not repeat


def _violated(trial: FrozenTrial) -> bool:
    attrs = trial.system_attrs
    values = list(attrs.get(CONSTRAINTS_ATTR) or [])
    values += [v for k, v in attrs.items() if k.startswith(CONSTRAINTS_ATTR + ":")]
    return any(v is None or not math.isfinite(v) or v > 0 for v in values)


class History:
    """Parses a study's trials into :class:`Observation` s; finished trials are parsed once and cached."""

    def __init__(self, space: SearchSpace, encoder: Encoder) -> None:
        self.space, self.encoder = space, encoder
        self._finished: dict[int, Observation | None] = {}
        # The leading trials that are all finished, and their observations: a finished trial never changes,
        # so a read walks only the trials after them (the last few, at 1,000 trials).
        self._prefix = 0
        self._prefix_obs: list[Observation] = []

    def read(self, study: optuna.Study, current: int | None = None) -> list[Observation]:
        """Every trial with a complete config of the space, but the trial numbered ``current``."""
        trials = study.get_trials(deepcopy=False)
        while self._prefix < len(trials) and trials[self._prefix].state.is_finished():
            trial = trials[self._prefix]
            if trial.number == current:  # the trial being asked is never finished; kept out to be safe
                break
            obs = self._finished_obs(trial)
            if obs is not None:
                self._prefix_obs.append(obs)
            self._prefix += 1
        out = list(self._prefix_obs)
        for trial in trials[self._prefix :]:
            if trial.number == current or trial.state not in STATES:
                continue
            obs = self._finished_obs(trial) if trial.state != TrialState.RUNNING else self._parse(trial)
            if obs is not None:
                out.append(obs)
        return out

    def _finished_obs(self, trial: FrozenTrial) -> Observation | None:
        if trial.number not in self._finished:
            self._finished[trial.number] = self._parse(trial) if trial.state in STATES else None
        return self._finished[trial.number]

    def _parse(self, trial: FrozenTrial) -> Observation | None:
        params = trial.params
        if trial.state == TrialState.RUNNING and not params:
            params = trial.system_attrs.get("fixed_params") or {}  # enqueued (a seed) but not yet suggested
        config = config_from_optuna(self.space, params)
        if config is None:
            return None
        running = trial.state == TrialState.RUNNING
        values: tuple[float, ...] | None = None
        feasible = False
        if trial.state == TrialState.COMPLETE and trial.values is not None and not _violated(trial):
            vals = tuple(float(v) for v in trial.values)
            if all(math.isfinite(v) for v in vals):
                values, feasible = vals, True
        levels = self.encoder.row(config)
        x = self.encoder.encode_rows(levels[None, :])[0]
        return Observation(
            trial.number, config_key(config), config, x, running, feasible, values, levels, row_key(levels)
        )
