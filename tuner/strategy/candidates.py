"""The statically feasible configs a proposal is chosen from, as rows of levels (see :mod:`.encoding`).

Nothing here lists a range or walks the whole space. Candidates are drawn arithmetically from the
space's structure: a level per param (``rng.integers(count)``, a continuous float uniformly), the
``when`` conditions applied in the space's order, then the static rules. A space of at most
:data:`ENUMERATE_LIMIT` value combinations is decoded in full instead (mixed-radix indices, one
numpy pass): proposals then come from that exact set, and when every member is measured the set says so.

Conditions and rules are evaluated by the space's own expression evaluator, once per distinct
combination of the levels of the params they read (a rule over four knobs sees a few hundred
combinations, however many candidates there are), and the verdicts are kept: after the first
proposals checking a thousand candidates is a few numpy lookups. The workload's own static check
runs on a whole config, so it is applied to the candidates of a proposal before they are scored
(:meth:`FeasibleSet.check_mask`: a proposal comes from the feasible set, not from configs the check then
refuses), once per distinct config, and its verdicts are kept too.

Local moves change 1 to 3 knobs of a config together (a tile with its warps, as a plateau often
needs): an ordered knob steps to a nearby value, a categorical to another choice, a float moves by
a tenth of its range; params that a move activates are drawn at random.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tuner.strategy.encoding import Encoder, row_key, row_keys, unique_rows
from tuner.study import expr
from tuner.study.space import SearchSpace

ENUMERATE_LIMIT = 16_384  # value combinations (conditions aside) decoded in full
DRAW_ROUNDS = 8  # rounds of random draws a sampled space gets to find enough free candidates
PROBE = 2048  # random draws that estimate a sampled space's share of rule-feasible configs
TABLE_LIMIT = 1 << 22  # level combinations of one expression kept in a dense verdict table
StaticCheck = Callable[[dict[str, Any]], "str | None"]


class _Verdicts:
    """One expression's verdict per combination of the levels of the params it reads, evaluated once each."""

    def __init__(self, columns: list[int], counts: list[int | None], evaluate: Callable[[np.ndarray], bool]) -> None:
        self.columns, self.evaluate = columns, evaluate
        finite = all(counts[c] is not None for c in columns)
        radix = [int(counts[c]) + 2 for c in columns] if finite else []  # +2: inactive and out-of-space levels
        size = math.prod(radix) if finite else 0
        self.weights = np.cumprod([1, *radix[:-1]]).astype(np.int64) if finite and size <= TABLE_LIMIT else None
        self.table = np.full(size, -1, dtype=np.int8) if self.weights is not None else None
        self.cache: dict[tuple[float, ...], bool] = {}

    def __call__(self, R: np.ndarray) -> np.ndarray:
        sub = R[:, self.columns]
        if self.table is None or self.weights is None:
            return np.array([self._cached(r) for r in sub], dtype=bool)
        codes = (np.where(np.isnan(sub), -2, sub) + 2).astype(np.int64) @ self.weights
        verdict = self.table[codes]
        unknown = np.flatnonzero(verdict < 0)
        if len(unknown):
            fresh, first = np.unique(codes[unknown], return_index=True)
            self.table[fresh] = [self.evaluate(sub[unknown[i]]) for i in first]
            verdict = self.table[codes]
        return verdict.astype(bool)

    def _cached(self, levels: np.ndarray) -> bool:
        key = tuple(np.where(np.isnan(levels), -math.inf, levels).tolist())
        found = self.cache.get(key)
        if found is None:
            if len(self.cache) > 200_000:
                self.cache.clear()
            found = self.cache[key] = self.evaluate(levels)
        return found


class FeasibleSet:
    """Feasible configs of ``space`` on ``device`` (``device.<field>`` rules); decoded in full when small."""

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
        self.names = list(space.params)
        self.counts = self.encoder.counts
        self._position = {name: i for i, name in enumerate(self.names)}
        self._when = {
            p: self._verdicts(param.when, self._when_verdict(param.when))
            for p, param in enumerate(space.params.values())
            if param.when is not None
        }
        self._rules = [self._verdicts(rule.expression, self._rule_verdict(rule.expression)) for rule in space.rules]
        self._checked: dict[bytes, bool] = {}  # the workload's static check, by row key
        self.static_rejected = 0  # distinct configs the workload's check refused when they were about to be proposed
        self.static_filtered = 0  # distinct candidates it refused before scoring (:meth:`check_mask`)
        self._yield = 1.0  # share of random draws that pass the rules (estimated below for a sampled space)
        self._move_cache: dict[tuple[int, float, int], list[float]] = {}
        self.ordered = np.array([c.kind == "ordinal" for c in self.encoder.columns])
        bound = space.grid_upper_bound()
        self.enumerated = bound is not None and bound <= enumerate_limit
        self.rows = np.zeros((0, len(self.names)))
        self.index: dict[bytes, int] = {}
        if self.enumerated:
            grid = np.stack(np.unravel_index(np.arange(bound), [int(c) for c in self.counts]), axis=1).astype(float)  # type: ignore[arg-type]
            grid = unique_rows(self._apply_conditions(grid, None))
            self.rows = grid[self.rule_mask(grid)]
            self.index = {k: i for i, k in enumerate(row_keys(self.rows))}
            self.X = self.encoder.encode_rows(self.rows)
        else:  # from a fixed probe, so the number of draws per proposal is a function of the space alone
            probe = np.random.default_rng(0)
            R = self._apply_conditions(np.stack([self._draw(p, probe, PROBE) for p in range(len(self.names))], 1), None)
            self._yield = max(float(self.rule_mask(R).mean()), 0.02)

    # expressions ------------------------------------------------------------------------
    def _verdicts(self, expression: expr.Expression, evaluate: Callable[[dict[str, Any]], bool]) -> _Verdicts:
        columns = sorted(self._position[n] for n in expression.names)
        cols = self.encoder.columns

        def on_levels(levels: np.ndarray) -> bool:
            values = {}
            for c, level in zip(columns, levels.tolist(), strict=True):
                if level != level:
                    continue
                if cols[c].count is None:
                    values[cols[c].name] = level
                elif level >= 0:
                    values[cols[c].name] = cols[c].param.value_at(int(level))
            return evaluate(values)

        return _Verdicts(columns, self.counts, on_levels)

    @staticmethod
    def _when_verdict(when: expr.Expression) -> Callable[[dict[str, Any]], bool]:
        def active(values: dict[str, Any]) -> bool:  # as SearchSpace.active
            try:
                return bool(when.evaluate(values))
            except expr.ExpressionError:
                return False

        return active

    def _rule_verdict(self, expression: expr.Expression) -> Callable[[dict[str, Any]], bool]:
        def holds(values: dict[str, Any]) -> bool:  # as SearchSpace.static_violation
            if not expression.names <= set(values):
                return True
            try:
                return bool(expression.evaluate(values, self.device))
            except expr.Unknown:
                return True
            except expr.ExpressionError:
                return False

        return holds

    def rule_mask(self, R: np.ndarray) -> np.ndarray:
        """Which rows pass every static rule of the space."""
        ok = np.ones(len(R), dtype=bool)
        for verdicts in self._rules:
            if ok.any():
                ok[ok] = verdicts(R[ok])
        return ok

    def _apply_conditions(self, R: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
        """``R`` with each conditional param set inactive (NaN) where its condition fails, in the space's
        order; with ``rng``, a param that becomes active without a level gets a random one."""
        for p, verdicts in self._when.items():
            active = verdicts(R)
            R[~active, p] = np.nan
            if rng is not None:
                fill = active & np.isnan(R[:, p])
                if fill.any():
                    R[fill, p] = self._draw(p, rng, int(fill.sum()))
        return R

    # the workload's check, lazily ---------------------------------------------------------
    def accept(self, row: np.ndarray) -> dict[str, Any] | None:
        """The config of a rule-feasible row if the workload's static check passes it, else None."""
        config = self.encoder.config(row)
        if self.static_check is None:
            return config
        key = row_key(row)
        ok = self._checked.get(key)
        if ok is None:
            ok = self._checked[key] = self.static_check(config) is None
            self.static_rejected += not ok
        return config if ok else None

    def check_mask(self, R: np.ndarray) -> np.ndarray:
        """Which rule-feasible rows the workload's static check passes, checked once per distinct config (the
        verdicts kept as :meth:`accept` keeps them). Candidates it refuses here are never proposed, so they
        are no replaced proposals: :attr:`static_filtered` counts them apart from :attr:`static_rejected`."""
        if self.static_check is None or not len(R):
            return np.ones(len(R), dtype=bool)
        mask = np.empty(len(R), dtype=bool)
        for i, key in enumerate(row_keys(R)):
            ok = self._checked.get(key)
            if ok is None:
                ok = self._checked[key] = self.static_check(self.encoder.config(R[i])) is None
                self.static_filtered += not ok
            mask[i] = ok
        return mask

    def feasible(self, config: dict[str, Any]) -> bool:
        """Whether ``config`` passes the space's static rules and the workload's static check."""
        if self.space.static_violation(config, self.device) is not None:
            return False
        return self.static_check is None or self.static_check(config) is None

    def remaining(self, exclude: set[bytes]) -> int | None:
        """Of a decoded space: feasible rows not in ``exclude`` (the workload's check counted where it has
        been applied); None for a sampled space."""
        if not self.enumerated:
            return None
        refused = sum(1 for k, ok in self._checked.items() if not ok and k in self.index and k not in exclude)
        return len(self.rows) - sum(1 for k in exclude if k in self.index) - refused

    # candidates ---------------------------------------------------------------------------
    def sample(self, rng: np.random.Generator, n: int, exclude: set[bytes]) -> np.ndarray:
        """Up to ``n`` distinct rule-feasible rows not in ``exclude`` (the workload's check not yet applied)."""
        if self.enumerated:
            free = np.ones(len(self.rows), dtype=bool)
            for key in exclude:
                i = self.index.get(key)
                if i is not None:
                    free[i] = False
            index = np.flatnonzero(free)
            if len(index) > n:
                index = np.sort(rng.choice(index, size=n, replace=False))
            return self.rows[index]
        found: dict[bytes, None] = {}
        blocks: list[np.ndarray] = []
        for _ in range(DRAW_ROUNDS):
            # as many draws as the share that passed the rules so far says n needs (at least n, at most 8 n)
            want = n - len(found)
            draws = int(min(8 * n, max(n, 1.2 * want / self._yield)))
            R = np.stack([self._draw(p, rng, draws) for p in range(len(self.names))], axis=1)
            R = self._apply_conditions(R, None)
            R = R[self.rule_mask(R)]
            keep = []
            for i, key in enumerate(row_keys(R)):
                if key not in exclude and key not in found:
                    found[key] = None
                    keep.append(i)
            blocks.append(R[keep])
            if len(found) >= n:
                break
        return np.vstack(blocks)[:n] if blocks else np.zeros((0, len(self.names)))

    def neighbours(
        self, rows: list[np.ndarray], rng: np.random.Generator, n_random: int, exclude: set[bytes]
    ) -> np.ndarray:
        """Of each row of ``rows``: its rule-feasible one-knob moves (ordered knobs by one step, categoricals
        to any other choice, floats by a tenth of the range) and ``n_random`` moves of 2-3 knobs (ordered knobs
        by up to two steps), none in ``exclude``; params a move activates are drawn at random."""
        moves: list[np.ndarray] = []
        for row in rows:
            moves += self._moves_of(row, rng, n_random)
        if not moves:
            return np.zeros((0, len(self.names)))
        R = self._apply_conditions(np.array(moves), rng)
        R = R[self.rule_mask(R)]
        seen: set[bytes] = set()
        keep = []
        for i, key in enumerate(row_keys(R)):
            if key not in exclude and key not in seen and (not self.enumerated or key in self.index):
                seen.add(key)
                keep.append(i)
        return R[keep]

    def _moves_of(self, row: np.ndarray, rng: np.random.Generator, n_random: int) -> list[np.ndarray]:
        levels = row.tolist()
        active = [p for p, level in enumerate(levels) if level == level and level >= 0]
        moves: list[np.ndarray] = []
        for p in active:
            for level in self._moves(p, levels[p], 1, rng):
                moved = row.copy()
                moved[p] = level
                moves.append(moved)
        for _ in range(n_random if active else 0):
            moved = row.copy()
            for p in rng.choice(active, size=min(int(rng.integers(2, 4)), len(active)), replace=False).tolist():
                options = self._moves(p, levels[p], 2, rng)
                if options:
                    moved[p] = options[int(rng.integers(len(options)))]
            moves.append(moved)
        return moves

    def _moves(self, p: int, level: float, reach: int, rng: np.random.Generator) -> list[float]:
        column = self.encoder.columns[p]
        count = self.counts[p]
        if count is None:  # a continuous float: about a tenth of the range either way
            param = column.param
            width = (param.high - param.low) / 10
            noise = rng.normal(0, width / 4) if reach > 1 else 0.0
            moved = [min(param.high, max(param.low, level + d + noise)) for d in (-width, width)]
            return [float(f"{v:.12g}") for v in moved if v != level]
        cached = self._move_cache.get((p, level, reach))
        if cached is not None:
            return cached
        if column.kind == "onehot":
            moves = [float(v) for v in range(count) if v != level]
        else:
            order = list(column.ordered_levels) if column.ordered_levels else None
            rank = order.index(int(level)) if order else int(level)
            ranks = [rank + d for d in range(-reach, reach + 1) if d and 0 <= rank + d < count]
            moves = [float(order[r]) if order else float(r) for r in ranks]
        if len(self._move_cache) < 100_000:
            self._move_cache[(p, level, reach)] = moves
        return moves

    def _draw(self, p: int, rng: np.random.Generator, n: int) -> np.ndarray:
        count = self.counts[p]
        if count is not None:
            return rng.integers(count, size=n).astype(float)
        param = self.encoder.columns[p].param
        if param.log:
            values = np.exp(rng.uniform(math.log(param.low), math.log(param.high), size=n))
        else:
            values = rng.uniform(param.low, param.high, size=n)
        return np.array([float(f"{v:.12g}") for v in values.tolist()])
