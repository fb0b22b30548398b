"""Configs of a compiled space as rows of numbers in [0, 1], the form the surrogate reads.

Each knob keeps the order it has for a performance engineer: a power of two by its log2 (tile
sizes), ints and floats by value (log-scaled when the param is), numeric categoricals by rank of
value (``[16, 64, 256]`` stays ordered), other categoricals (strings, booleans) one-hot. A
conditional param that is inactive in a config reads as :data:`INACTIVE` (outside [0, 1], so the
surrogate keeps configs with and without it apart), and its one-hot columns as zeros.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.space import LOG2_SUFFIX, Param, SearchSpace

INACTIVE = -0.5


def config_key(config: Mapping[str, Any]) -> str:
    """A config's identity: its canonical JSON, floats rounded to 12 significant digits (what storage round-trips)."""
    return json.dumps(
        {k: (float(f"{v:.12g}") if isinstance(v, float) else v) for k, v in config.items()},
        sort_keys=True,
        default=str,
    )


def config_from_optuna(space: SearchSpace, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config an Optuna trial's params stand for (pow2 params are stored as exponents); None if incomplete."""
    config: dict[str, Any] = {}
    for name, param in space.params.items():
        if not space.active(name, config):
            continue
        if param.type == "pow2":
            exponent = params.get(name + LOG2_SUFFIX)
            if exponent is None:
                return None
            config[name] = 2 ** int(exponent)
        elif name in params:
            config[name] = params[name]
        else:
            return None
    return config


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class _Column:
    """How one param maps to columns: ``ordinal`` (one column) or ``onehot`` (one column per choice)."""

    name: str
    kind: str
    start: int
    width: int
    low: float = 0.0
    span: float = 1.0
    log: bool = False
    ranks: dict[Any, float] | None = None
    choices: tuple[Any, ...] = ()


class Encoder:
    """Maps configs of ``space`` to vectors of :attr:`width` numbers."""

    def __init__(self, space: SearchSpace) -> None:
        self.columns: list[_Column] = []
        start = 0
        for name, param in space.params.items():
            column = _column(name, param, start)
            self.columns.append(column)
            start += column.width
        self.width = start

    def encode(self, config: Mapping[str, Any]) -> np.ndarray:
        row = np.zeros(self.width)
        for c in self.columns:
            value = config.get(c.name)
            if c.kind == "onehot":
                if value is not None and value in c.choices:
                    row[c.start + c.choices.index(value)] = 1.0
                continue
            if value is None:
                row[c.start] = INACTIVE
            elif c.ranks is not None:
                row[c.start] = c.ranks.get(value, 0.0)
            else:
                x = math.log(value) if c.log else float(value)
                row[c.start] = (x - c.low) / c.span if c.span > 0 else 0.0
        return row

    def encode_many(self, configs: list[Mapping[str, Any]]) -> np.ndarray:
        if not configs:
            return np.zeros((0, self.width))
        return np.stack([self.encode(c) for c in configs])


def _column(name: str, param: Param, start: int) -> _Column:
    if param.type == "categorical":
        choices = tuple(param.choices)
        if all(_is_number(c) for c in choices):
            ordered = sorted(choices)
            n = max(1, len(ordered) - 1)
            return _Column(name, "ordinal", start, 1, ranks={v: i / n for i, v in enumerate(ordered)})
        return _Column(name, "onehot", start, len(choices), choices=choices)
    if param.type == "pow2":
        low, high = math.log(param.low), math.log(param.high)
        return _Column(name, "ordinal", start, 1, low=low, span=high - low, log=True)
    log = bool(param.log)
    low = math.log(param.low) if log else float(param.low)
    high = math.log(param.high) if log else float(param.high)
    return _Column(name, "ordinal", start, 1, low=low, span=high - low, log=log)
