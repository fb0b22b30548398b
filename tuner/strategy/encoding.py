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

from tuner.study.space import LOG2_SUFFIX, Param, SearchSpace

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


def _choice_id(value: Any) -> tuple[bool, Any]:
    """A categorical choice's identity: ``True`` and ``1`` are different choices."""
    return isinstance(value, bool), value


@dataclass(frozen=True)
class _Column:
    """How one param maps to a level and to encoded columns.

    A level is the param's value as a number: its index (``Param.value_at``) for a finite param, the
    value itself for a continuous float, NaN when the param is inactive. ``kind``: ``ordinal`` (one
    column) or ``onehot`` (one column per choice)."""

    name: str
    param: Param
    kind: str
    start: int
    width: int
    count: int | None  # None: a continuous float (the level is the value)
    low: float = 0.0
    span: float = 1.0
    ranks: np.ndarray | None = None  # numeric categorical: encoded rank of each level
    ordered_levels: tuple[int, ...] = ()  # numeric categorical: levels in ascending order of value
    index: dict[tuple[bool, Any], int] | None = None  # categorical: choice -> level


class Encoder:
    """Maps configs of ``space`` to levels (one number per param) and to vectors of :attr:`width` numbers.

    Levels are computed from each param's structure (count, ``value_at``), never by listing a range, so a
    param of 10**12 values costs what one of ten does."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.columns: list[_Column] = []
        start = 0
        for name, param in space.params.items():
            column = _column(name, param, start)
            self.columns.append(column)
            start += column.width
        self.width = start
        self.counts = [c.count for c in self.columns]

    # config <-> level row ---------------------------------------------------------------
    def row(self, config: Mapping[str, Any]) -> np.ndarray:
        """The levels of ``config`` (NaN for an inactive param; -1 for a value outside the param)."""
        return np.array([_level(c, config.get(c.name)) for c in self.columns], dtype=float)

    def config(self, row: np.ndarray) -> dict[str, Any]:
        """The config a row of levels stands for (inactive params left out)."""
        out: dict[str, Any] = {}
        for c, level in zip(self.columns, row.tolist(), strict=True):
            if level != level:
                continue
            out[c.name] = level if c.count is None else c.param.value_at(int(level))
        return out

    # encodings --------------------------------------------------------------------------
    def encode_rows(self, R: np.ndarray) -> np.ndarray:
        """Encodings of level rows ``R`` (n x params), computed column by column with numpy."""
        n = len(R)
        X = np.zeros((n, self.width))
        for p, c in enumerate(self.columns):
            level = R[:, p]
            inactive = np.isnan(level)
            safe = np.where(inactive | (level < 0), 0, level)
            if c.kind == "onehot":
                for j in range(c.width):
                    X[:, c.start + j] = (level == j).astype(float)
                continue
            if c.ranks is not None:
                x = np.where(level >= 0, c.ranks[safe.astype(int)], 0.0)
            else:
                x = _numeric(c, safe) if c.count is not None else np.where(inactive, c.low, level)
                if c.param.log or c.param.type == "pow2":
                    x = np.log(np.maximum(x, 1e-300))
                x = (x - c.low) / c.span if c.span > 0 else np.zeros(n)
            X[:, c.start] = np.where(inactive, INACTIVE, x)
        return X

    def encode(self, config: Mapping[str, Any]) -> np.ndarray:
        return self.encode_rows(self.row(config)[None, :])[0]

    def encode_many(self, configs: list[Mapping[str, Any]]) -> np.ndarray:
        if not configs:
            return np.zeros((0, self.width))
        return self.encode_rows(np.stack([self.row(c) for c in configs]))


def row_key(row: np.ndarray) -> bytes:
    """A level row's identity (rows of equal configs are equal, NaN included)."""
    return np.where(np.isnan(row), -3.0, row).tobytes()


def row_keys(R: np.ndarray) -> list[bytes]:
    """``row_key`` of every row of ``R``, in one pass."""
    if not len(R):
        return []
    K = np.ascontiguousarray(np.where(np.isnan(R), -3.0, R))
    return K.view(np.dtype((np.void, K.shape[1] * K.itemsize))).ravel().tolist()


def unique_rows(R: np.ndarray) -> np.ndarray:
    """The distinct rows of ``R`` (NaN equal to NaN), in the order of their first occurrence."""
    if len(R) < 2:
        return R
    first = {k: i for i, k in reversed(list(enumerate(row_keys(R))))}
    return R[np.sort(np.fromiter(first.values(), dtype=np.int64, count=len(first)))]


def _numeric(c: _Column, level: np.ndarray) -> np.ndarray:
    """The values of a finite numeric param at ``level`` (as ``Param.value_at``, vectorised)."""
    p = c.param
    if p.type == "pow2":
        return float(p.low) * np.exp2(level)
    first = float(p.value_at(0))
    step = float(p.multiple if p.type == "multiple_of" else (p.step or 1))
    return first + level * step


def _level(c: _Column, value: Any) -> float:
    if value is None:
        return math.nan
    p = c.param
    if c.index is not None:
        return float(c.index.get(_choice_id(value), -1))
    if not _is_number(value) or not p.contains(value):
        return -1.0
    if c.count is None:
        return float(f"{float(value):.12g}")
    if p.type == "pow2":
        return float(int(value).bit_length() - int(p.low).bit_length())
    first = float(p.value_at(0))
    step = float(p.multiple if p.type == "multiple_of" else (p.step or 1))
    return float(round((float(value) - first) / step))


def _column(name: str, param: Param, start: int) -> _Column:
    count = param.count()
    if param.type == "categorical":
        choices = tuple(param.choices)
        index = {_choice_id(v): i for i, v in enumerate(choices)}
        if all(_is_number(c) for c in choices):
            order = sorted(range(len(choices)), key=lambda i: choices[i])
            n = max(1, len(choices) - 1)
            ranks = np.empty(len(choices))
            ranks[order] = np.arange(len(choices)) / n
            return _Column(
                name, param, "ordinal", start, 1, count, ranks=ranks, ordered_levels=tuple(order), index=index
            )
        return _Column(name, param, "onehot", start, len(choices), count, index=index)
    log = bool(param.log) or param.type == "pow2"
    low = math.log(param.low) if log else float(param.low)
    high = math.log(param.high) if log else float(param.high)
    return _Column(name, param, "ordinal", start, 1, count, low=low, span=high - low)
