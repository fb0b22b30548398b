"""The statically feasible configs a proposal is chosen from.

A space small enough to enumerate (at most :data:`ENUMERATE_LIMIT` points, conditions
respected) is enumerated once and filtered by its static rules (and the workload's own static
check, when given): proposals then come from that exact set, and when every member has been
measured the set says so. A larger or continuous space is sampled: random configs drawn knob by
knob (conditional params only when active), rejected when a rule fails.

Local moves change 1 to 3 knobs of a config together (a tile with its warps, as a plateau often
needs): an ordered knob steps to a nearby value, a categorical to another choice, a float moves by
a tenth of its range; params that a move activates are drawn at random.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from tuner.space import SearchSpace
from tuner.strategy.encoding import Encoder, config_key

ENUMERATE_LIMIT = 50_000
POOL_BLOCK = 1000  # feasible random configs drawn at a time for a sampled space
MAX_POOL_BLOCKS = 20
StaticCheck = Callable[[dict[str, Any]], "str | None"]


class FeasibleSet:
    """Feasible configs of ``space`` on ``device`` (``device.<field>`` rules), enumerated when small enough."""

    def __init__(
        self,
        space: SearchSpace,
        *,
        device: Mapping[str, Any] | None = None,
        static_check: StaticCheck | None = None,
        enumerate_limit: int = ENUMERATE_LIMIT,
    ) -> None:
        self.space = space
        self.device = dict(device or {})
        self.static_check = static_check
        self.encoder = Encoder(space)
        self._values = {name: p.values() for name, p in space.params.items()}
        bound = space.grid_upper_bound()
        self.enumerated = bound is not None and bound <= enumerate_limit
        self.configs: list[dict[str, Any]] = []
        self.keys: list[str] = []
        self.index: dict[str, int] = {}
        self.X = np.zeros((0, self.encoder.width))
        self._pool: list[dict[str, Any]] = []  # a sampled space's candidates (see sample_pool)
        self._pool_keys: list[str] = []
        self._pool_X: list[np.ndarray] = []
        self._pool_blocks = 0
        self.levels = np.zeros((0, len(space.params)), dtype=int)
        self.ordered = np.array([self._is_ordered(name) for name in space.params])
        self._counts = [len(v) if v is not None else 0 for v in self._values.values()]
        self._by_levels: dict[tuple[int, ...], int] | None = None
        if self.enumerated:
            self.configs = [c for c in space.grid(limit=enumerate_limit) if self.feasible(c)]
            self.keys = [config_key(c) for c in self.configs]
            self.index = {k: i for i, k in enumerate(self.keys)}
            self.X = self.encoder.encode_many(self.configs)
            self.levels = np.array([[self._level(n, c.get(n)) for n in space.params] for c in self.configs], dtype=int)
            self.levels = self.levels.reshape(len(self.configs), len(space.params))

    def free_mask(self, exclude: set[str]) -> np.ndarray:
        """Of an enumerated set: which members are not in ``exclude``."""
        mask = np.ones(len(self.configs), dtype=bool)
        for key in exclude:
            i = self.index.get(key)
            if i is not None:
                mask[i] = False
        return mask

    def neighbour_indices(self, i: int, rng: np.random.Generator, n_random: int, free: np.ndarray) -> np.ndarray:
        """Of an enumerated set: the free one-knob moves of member ``i`` (ordered knobs by one step, categoricals
        to any other choice) and ``n_random`` free moves of 2-3 knobs (ordered knobs by up to two steps).

        Moves are looked up by their level vectors, so the cost does not grow with the set; a move that would
        switch a conditional param on or off is not among them (the random candidates cover those)."""
        if self._by_levels is None:
            self._by_levels = {tuple(row): j for j, row in enumerate(self.levels.tolist())}
        base = self.levels[i].tolist()
        active = [p for p, level in enumerate(base) if level >= 0]
        found: list[int] = []

        def look(levels: list[int]) -> None:
            j = self._by_levels.get(tuple(levels))  # type: ignore[union-attr]
            if j is not None and free[j]:
                found.append(j)

        for p in active:
            for level in self._moves(p, base[p], 1):
                look([*base[:p], level, *base[p + 1 :]])
        for _ in range(n_random):
            moved = list(base)
            for p in rng.choice(active, size=min(int(rng.integers(2, 4)), len(active)), replace=False):
                options = self._moves(int(p), base[int(p)], 2)
                if options:
                    moved[int(p)] = options[int(rng.integers(len(options)))]
            look(moved)
        return np.unique(np.array(found, dtype=int))

    def _moves(self, p: int, level: int, reach: int) -> list[int]:
        count = self._counts[p]
        if not self.ordered[p]:
            return [v for v in range(count) if v != level]
        return [level + d for d in range(-reach, reach + 1) if d and 0 <= level + d < count]

    def _is_ordered(self, name: str) -> bool:
        values = self._values[name]
        if self.space.params[name].type != "categorical":
            return True
        return values is not None and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)

    def _level(self, name: str, value: Any) -> int:
        """A value's position among the param's values (sorted when ordered); -1 when the param is inactive."""
        if value is None:
            return -1
        values = self._values[name] or []
        ordered = sorted(values) if self.space.params[name].type == "categorical" and self._is_ordered(name) else values
        return ordered.index(value)

    def feasible(self, config: dict[str, Any]) -> bool:
        """Whether ``config`` passes the space's static rules and the workload's static check."""
        if self.space.static_violation(config, self.device) is not None:
            return False
        return self.static_check is None or self.static_check(config) is None

    def random_config(self, rng: np.random.Generator) -> dict[str, Any]:
        """One config drawn knob by knob, in the space's order (conditions respected, rules not checked)."""
        config: dict[str, Any] = {}
        for name in self.space.params:
            if self.space.active(name, config):
                config[name] = self._draw(name, rng)
        return config

    def sample(self, rng: np.random.Generator, n: int, exclude: set[str], tries: int = 20) -> list[dict[str, Any]]:
        """Up to ``n`` distinct feasible configs whose keys are not in ``exclude``."""
        if self.enumerated:
            free = [i for i, k in enumerate(self.keys) if k not in exclude]
            if len(free) > n:
                free = sorted(rng.choice(free, size=n, replace=False).tolist())
            return [self.configs[i] for i in free]
        out: dict[str, dict[str, Any]] = {}
        for _ in range(n * tries):
            config = self.random_config(rng)
            key = config_key(config)
            if key in exclude or key in out or not self.feasible(config):
                continue
            out[key] = config
            if len(out) >= n:
                break
        return list(out.values())

    def sample_pool(
        self, seed: int, rng: np.random.Generator, n: int, exclude: set[str]
    ) -> tuple[list[dict[str, Any]], np.ndarray]:
        """Of a sampled space: up to ``n`` free configs of a pool of feasible random configs, and their encodings.

        Drawing and checking configs is the slow part of a proposal, so the pool is drawn once, in blocks of
        :data:`POOL_BLOCK` each seeded by ``(seed, block)``, and grows by a block whenever fewer than ``n`` of
        its members are free: the pool is a function of the seed and the measured configs alone (resume
        proposes the same configs).
        """
        while True:
            free = [i for i, k in enumerate(self._pool_keys) if k not in exclude]
            if len(free) >= n or self._pool_blocks >= MAX_POOL_BLOCKS:
                break
            block = np.random.default_rng([seed, self._pool_blocks, 7])
            self._pool_blocks += 1
            known = set(self._pool_keys)
            for config in self.sample(block, POOL_BLOCK, known):
                self._pool.append(config)
                self._pool_keys.append(config_key(config))
                self._pool_X.append(self.encoder.encode(config))
        if len(free) > n:
            free = sorted(rng.choice(free, size=n, replace=False).tolist())
        configs = [self._pool[i] for i in free]
        return configs, np.stack([self._pool_X[i] for i in free]) if free else np.zeros((0, self.encoder.width))

    def neighbours(
        self, config: Mapping[str, Any], rng: np.random.Generator, n_random: int, exclude: set[str]
    ) -> list[dict[str, Any]]:
        """Every feasible one-knob move of ``config`` and ``n_random`` moves of 2-3 knobs, none in ``exclude``."""
        moves: list[dict[str, Any]] = []
        names = [name for name in self.space.params if name in config]
        for name in names:
            for value in self._nearby(name, config[name], rng, every=True):
                moves.append(self._resolve({**config, name: value}, rng))
        for _ in range(n_random):
            k = int(rng.integers(2, 4))
            changed = dict(config)
            for name in rng.choice(names, size=min(k, len(names)), replace=False):
                options = self._nearby(str(name), config[str(name)], rng, every=False)
                if options:
                    changed[str(name)] = options[int(rng.integers(len(options)))]
            moves.append(self._resolve(changed, rng))
        return self._admissible(moves, exclude)

    def _admissible(self, configs: Iterable[dict[str, Any]], exclude: set[str]) -> list[dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for config in configs:
            key = config_key(config)
            if key in exclude or key in out:
                continue
            if self.enumerated:
                i = self.index.get(key)
                if i is not None:
                    out[key] = self.configs[i]
            elif self.space.validate_config(config) is None and self.feasible(config):
                out[key] = config
        return list(out.values())

    def _resolve(self, config: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        """``config`` with inactive params dropped and newly active ones drawn."""
        out: dict[str, Any] = {}
        for name in self.space.params:
            if self.space.active(name, out):
                out[name] = config[name] if name in config else self._draw(name, rng)
        return out

    def _draw(self, name: str, rng: np.random.Generator) -> Any:
        values = self._values[name]
        if values is not None:
            return values[int(rng.integers(len(values)))]
        param = self.space.params[name]
        if param.log:
            return float(math.exp(rng.uniform(math.log(param.low), math.log(param.high))))
        return float(rng.uniform(param.low, param.high))

    def _nearby(self, name: str, value: Any, rng: np.random.Generator, *, every: bool) -> list[Any]:
        """Values a move of knob ``name`` may take from ``value``: ordered knobs step by 1 (or 2), categoricals
        take any other choice, floats move by about a tenth of their range."""
        param = self.space.params[name]
        values = self._values[name]
        if values is None:
            width = (param.high - param.low) / 10
            moved = [min(param.high, max(param.low, value + d)) for d in (-width, width)]
            return [float(v + rng.normal(0, width / 4)) if not every else float(v) for v in moved if v != value]
        if param.type == "categorical" and not all(isinstance(c, (int, float)) for c in values):
            return [v for v in values if v != value]
        ordered = sorted(values) if param.type == "categorical" else values
        if value not in ordered:
            return []
        i = ordered.index(value)
        steps = (-1, 1) if every else (-2, -1, 1, 2)
        return [ordered[i + s] for s in steps if 0 <= i + s < len(ordered)]
