"""Search spaces as data: parameters, conditions, static rules, canonical form and hash.

A space file in ``search_spaces/`` holds ``params`` (name -> definition),
``rules`` (static feasibility expressions over params and ``device.<field>``)
and ``seeds`` (known-good configs tried first). A study spec overrides
parameters field by field. Compiling yields a :class:`SearchSpace` that the
orchestrator uses to suggest configs through an Optuna trial, reject
statically infeasible ones, enumerate a grid, and hash itself.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from tuner.study import expr
from tuner.study.yamlio import load_yaml_text

PARAM_TYPES = ("int", "float", "categorical", "pow2", "multiple_of")
_FIELDS = {
    "int": {"type", "low", "high", "step", "log", "when"},
    "float": {"type", "low", "high", "step", "log", "when"},
    "categorical": {"type", "choices", "when"},
    "pow2": {"type", "low", "high", "when"},
    "multiple_of": {"type", "low", "high", "multiple", "when"},
}
GRID_LIMIT = 100_000
#: Bound of int-like params: integers up to 2**53 survive the float round trip of Optuna's storage.
MAX_INT = 2**53
#: How many value combinations a ``when`` or a rule is tried on when the space is compiled.
PROBES = 32
LOG2_SUFFIX = "__log2"


class SpaceError(ValueError):
    """A space that cannot be compiled; ``field`` is the dotted path of the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Param:
    """One knob. Finite params are counted, indexed and tested arithmetically (``count``, ``value_at``,
    ``contains``), so ``high: 1e12`` costs nothing; only ``values()`` lists them, for small ones."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    multiple: int | None = None
    choices: tuple[Any, ...] = ()
    when: expr.Expression | None = None

    def count(self) -> int | None:
        """How many values the param takes (None for a continuous float)."""
        if self.type == "categorical":
            return len(self.choices)
        if self.type == "pow2":
            return int(self.high).bit_length() - int(self.low).bit_length() + 1
        if self.type == "multiple_of":
            first = -(-int(self.low) // self.multiple) * self.multiple
            return max(0, (int(self.high) - first) // self.multiple + 1)
        if self.type == "int":
            return (int(self.high) - int(self.low)) // int(self.step or 1) + 1
        if self.type == "float" and self.step:
            return math.floor((self.high - self.low) / self.step + 1e-9) + 1
        return None

    def value_at(self, index: int) -> Any:
        """The ``index``-th value, in ascending order (choices in their order); 0 <= index < count()."""
        if self.type == "categorical":
            return self.choices[index]
        if self.type == "pow2":
            return int(self.low) << index
        if self.type == "multiple_of":
            return -(-int(self.low) // self.multiple) * self.multiple + index * self.multiple
        if self.type == "int":
            return int(self.low) + index * int(self.step or 1)
        return round(self.low + index * self.step, 12)

    def values(self, limit: int = GRID_LIMIT) -> list[Any] | None:
        """Every value (None for a continuous float); refuses a param of more than ``limit`` values."""
        count = self.count()
        if count is None:
            return None
        if count > limit:
            raise SpaceError(f"space.{self.name}", f"{count} values, more than {limit} to enumerate")
        return [self.value_at(i) for i in range(count)]

    def contains(self, value: Any) -> bool:
        if self.type == "categorical":
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.type == "float":
            return self.low <= value <= self.high
        if value != int(value):
            return False
        value, low = int(value), int(self.low)
        if self.type == "pow2":
            return low <= value <= self.high and value & (value - 1) == 0
        count = self.count()
        if self.type == "multiple_of":
            first = self.value_at(0)
            return count > 0 and first <= value <= self.high and (value - first) % self.multiple == 0
        step = 1 if self.log else int(self.step or 1)
        return low <= value <= self.value_at(count - 1) and (value - low) % step == 0

    def probe_values(self, per_param: int = 8) -> list[Any]:
        """A few values that span the param (its ends, its middle, or its first choices), to try expressions on."""
        if self.type == "categorical":
            return list(self.choices[:per_param])
        count = self.count()
        if count is None:
            return [self.low, (self.low + self.high) / 2, self.high]
        return list(dict.fromkeys(self.value_at(i) for i in (0, count // 2, count - 1)))

    def suggest(self, trial: Any) -> Any:
        """Draw this param's value through an Optuna trial."""
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.type == "pow2":
            exponent = trial.suggest_int(self.name + LOG2_SUFFIX, int(math.log2(self.low)), int(math.log2(self.high)))
            return 2**exponent
        if self.type == "multiple_of":
            return trial.suggest_int(self.name, self.value_at(0), self.value_at(self.count() - 1), step=self.multiple)
        if self.type == "int":
            if self.log:
                return trial.suggest_int(self.name, int(self.low), int(self.high), log=True)
            last = self.value_at(self.count() - 1)
            return trial.suggest_int(self.name, int(self.low), last, step=int(self.step or 1))
        return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)

    def optuna_params(self, value: Any) -> dict[str, Any]:
        """This param's value in the form Optuna stores it (pow2 as its exponent)."""
        if self.type == "pow2":
            return {self.name + LOG2_SUFFIX: int(math.log2(value))}
        return {self.name: value}


@dataclass(frozen=True)
class Rule:
    name: str
    expression: expr.Expression


@dataclass
class SearchSpace:
    """A compiled space: ordered params, static rules, seeds, and its canonical form."""

    params: dict[str, Param]
    rules: list[Rule]
    seeds: list[dict[str, Any]]
    canonical: dict[str, Any] = field(repr=False)

    @property
    def canonical_json(self) -> str:
        return json.dumps(self.canonical, sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.canonical_json.encode()).hexdigest()[:16]

    def active(self, name: str, config: Mapping[str, Any]) -> bool:
        when = self.params[name].when
        if when is None:
            return True
        try:
            return bool(when.evaluate(config))
        except expr.ExpressionError:
            return False  # a condition on a param that is itself inactive

    def suggest(self, trial: Any) -> dict[str, Any]:
        """Draw a config through an Optuna trial; inactive conditional params are left out."""
        config: dict[str, Any] = {}
        for name, param in self.params.items():
            if self.active(name, config):
                config[name] = param.suggest(trial)
        return config

    def validate_config(self, config: Mapping[str, Any]) -> str | None:
        """None if ``config`` is a point of this space, else why not."""
        expected: dict[str, Any] = {}
        for name, param in self.params.items():
            if not self.active(name, expected):
                continue
            if name not in config:
                return f"missing param {name!r}"
            if not param.contains(config[name]):
                return f"param {name!r}={config[name]!r} is outside the space"
            expected[name] = config[name]
        extra = set(config) - set(expected)
        if extra:
            return f"unexpected params {sorted(extra)}"
        return None

    def static_violation(self, config: Mapping[str, Any], device: Mapping[str, Any] | None) -> str | None:
        """The first static rule that ``config`` breaks on ``device``, or None.

        A rule that needs a device field the device does not know (null) is skipped.
        """
        for rule in self.rules:
            if not rule.expression.names <= set(config):
                continue
            try:
                ok = rule.expression.evaluate(config, device or {})
            except expr.Unknown:
                continue
            except expr.ExpressionError as exc:  # a config the compile-time probes did not try
                return f"rule {rule.name!r} cannot be evaluated: {exc}"
            if not ok:
                return f"rule {rule.name!r} fails: {rule.expression.text}"
        return None

    def optuna_params(self, config: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in config.items():
            out.update(self.params[name].optuna_params(value))
        return out

    def grid_upper_bound(self) -> int | None:
        """Product of the params' value counts (an upper bound with conditions); None if infinite."""
        total = 1
        for param in self.params.values():
            count = param.count()
            if count is None:
                return None
            total *= count
        return total

    def grid(self, limit: int = GRID_LIMIT) -> list[dict[str, Any]]:
        """Every point of the space, conditional params respected; refuses spaces of more than ``limit`` points
        (counted with the conditions: a param inactive on most of the space multiplies only where it is active),
        without making more than ``limit`` of them."""
        bound = self.grid_upper_bound()
        if bound is None:
            floats = [p.name for p in self.params.values() if p.count() is None]
            raise SpaceError(f"space.{floats[0]}", "a grid needs a finite space: give this float a step")
        for param in self.params.values():
            if param.count() > limit:  # type: ignore[operator]
                raise SpaceError(
                    "space", f"grid too large to enumerate: {param.name} alone has {param.count()} values > {limit}"
                )
        points: list[dict[str, Any]] = [{}]
        for name, param in self.params.items():
            nxt: list[dict[str, Any]] = []
            for point in points:
                if self.active(name, point):
                    nxt.extend({**point, name: v} for v in param.values())  # type: ignore[union-attr]
                else:
                    nxt.append(point)
                if len(nxt) > limit:
                    raise SpaceError(
                        "space", f"grid too large to enumerate: more than {limit} points ({bound} without conditions)"
                    )
            points = nxt
        return points

    def size(self) -> int | None:
        bound = self.grid_upper_bound()
        if bound is None:
            return None
        has_conditions = any(p.when is not None for p in self.params.values())
        if has_conditions and bound <= GRID_LIMIT:
            return len(self.grid())
        return bound

    def iter_names(self) -> Iterator[str]:
        return iter(self.params)

    def point_at(self, index: int, fractions: Mapping[str, float] | None = None) -> dict[str, Any]:
        """The ``index``-th combination of the params' values (mixed radix, the last param fastest), by
        arithmetic: no param's values are listed. Inactive conditional params are left out; a continuous
        float (no count) takes ``fractions[name]`` of its range (log-scaled when ``log``), 0.5 by default."""
        config: dict[str, Any] = {}
        counts = [p.count() for p in self.params.values()]
        digits: list[int] = []
        for count in reversed(counts):
            if count is None:
                digits.append(0)
                continue
            index, digit = divmod(index, max(1, count))
            digits.append(digit)
        digits.reverse()
        for (name, param), digit in zip(self.params.items(), digits, strict=True):
            if not self.active(name, config):
                continue
            if param.count() is None:
                f = (fractions or {}).get(name, 0.5)
                low, high = float(param.low), float(param.high)  # type: ignore[arg-type]
                config[name] = low * (high / low) ** f if param.log else low + f * (high - low)
            else:
                config[name] = param.value_at(digit)
        return config

    def sample_points(self, limit: int, seed: int = 0) -> tuple[Iterator[dict[str, Any]], bool]:
        """Up to ``limit`` points, made as they are read: every point when the space has at most ``limit``
        combinations (then the flag is True: they are exhaustive), else ``limit`` drawn uniformly at random.
        Never materialises a param's values, so a param of 10**12 values costs what one of 10 does."""
        import random

        rng = random.Random(seed)
        bound = self.grid_upper_bound()
        floats = [name for name, p in self.params.items() if p.count() is None]
        if bound is not None and bound <= limit:
            return (self.point_at(i) for i in range(bound)), True
        total = 1
        for p in self.params.values():
            total *= p.count() or 1

        def drawn() -> Iterator[dict[str, Any]]:
            for _ in range(limit):
                fractions = {name: rng.random() for name in floats}
                yield self.point_at(rng.randrange(total), fractions)

        return drawn(), False


def load_space_file(filename: str) -> dict[str, Any]:
    """Read a space file shipped in the ``search_spaces`` package."""
    text = resources.files("search_spaces").joinpath(filename).read_text()
    return load_yaml_text(text, source=filename)


def merge_overrides(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Apply a spec's ``space`` overrides to a default space, field by field.

    An override with a ``type`` replaces the param's definition; one without
    updates the given fields. Unknown param names are refused.
    """
    merged = copy.deepcopy(dict(base))
    params = merged.setdefault("params", {})
    for name, override in overrides.items():
        if not isinstance(override, Mapping):
            raise SpaceError(f"space.{name}", "must be a mapping of fields, e.g. {choices: [bf16, fp16]}")
        if name not in params:
            raise SpaceError(f"space.{name}", f"unknown param; the workload's params are {sorted(params)}")
        if "type" in override and override["type"] != params[name].get("type"):
            params[name] = dict(override)
        else:
            updated = {**params[name], **override}
            if "choices" in override:
                updated["type"] = "categorical"
                for key in ("low", "high", "step", "log", "multiple"):
                    updated.pop(key, None)
            params[name] = updated
    return merged


def compile_space(raw: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> SearchSpace:
    """Validate a space description (plus overrides) and compile it."""
    data = merge_overrides(raw, overrides or {})
    raw_params = data.get("params")
    if not isinstance(raw_params, Mapping) or not raw_params:
        raise SpaceError("space.params", "a space needs at least one param")
    params: dict[str, Param] = {}
    canonical_params: dict[str, Any] = {}
    for name, spec in raw_params.items():
        param = _compile_param(str(name), spec, set(params))
        params[param.name] = param
        canonical_params[param.name] = _canonical_param(param)
    rules: list[Rule] = []
    for i, rule in enumerate(data.get("rules") or []):
        where = f"space.rules[{i}]"
        if not isinstance(rule, Mapping) or "expr" not in rule:
            raise SpaceError(where, "a rule is {name: ..., expr: ...}")
        try:
            expression = expr.parse(str(rule["expr"]), allow_device=True)
        except expr.ExpressionError as exc:
            raise SpaceError(where, str(exc)) from None
        unknown = expression.names - set(params)
        if unknown:
            raise SpaceError(where, f"unknown names {sorted(unknown)}")
        rules.append(Rule(str(rule.get("name", f"rule{i}")), expression))
    for name, param in params.items():
        if param.when is not None:
            _probe(f"space.{name}.when", param.when, params)
    for i, rule in enumerate(rules):
        _probe(f"space.rules[{i}]", rule.expression, params)
    space = SearchSpace(params=params, rules=rules, seeds=[], canonical={})
    seeds = [dict(s) for s in (data.get("seeds") or []) if isinstance(s, Mapping)]
    space.seeds = [s for s in seeds if space.validate_config(s) is None]
    space.canonical = {
        "version": data.get("version", 1),
        "params": canonical_params,
        "rules": [{"name": r.name, "expr": r.expression.text} for r in rules],
    }
    return space


def _probe(where: str, expression: expr.Expression, params: Mapping[str, Param]) -> None:
    """Evaluate ``expression`` on a few combinations of the values of the params it reads, so that one
    that cannot be evaluated (``mode < 1`` over string choices, a division by a param that can be 0) is
    refused at submit time, naming ``where``. A device field it needs stops that probe (it is null here)."""
    names = sorted(expression.names)
    axes = [params[name].probe_values() for name in names]
    for combo in itertools.islice(itertools.product(*axes), PROBES):
        config = dict(zip(names, combo, strict=True))
        try:
            expression.evaluate(config, {})
        except expr.Unknown:
            continue
        except expr.ExpressionError as exc:
            raise SpaceError(where, f"{exc} (with {config})") from None


def _bounds(where: str, ptype: str, spec: Mapping[str, Any]) -> tuple[float, float]:
    """``low`` and ``high``: finite, ordered, and for int-like params integers within +-2**53."""
    low, high = spec.get("low"), spec.get("high")
    for key, value in (("low", low), ("high", high)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise SpaceError(f"{where}.{key}", "must be a finite number")
        if ptype != "float" and abs(value) > MAX_INT:
            raise SpaceError(f"{where}.{key}", f"must be within +-2**53 (integers a float holds exactly), got {value}")
    if low > high:
        raise SpaceError(f"{where}.low", f"low ({low}) > high ({high})")
    if ptype != "float" and (int(low) != low or int(high) != high):
        raise SpaceError(f"{where}.low", f"a {ptype} param needs integer bounds")
    return low, high


def _compile_when(where: str, spec: Mapping[str, Any], earlier: set[str]) -> Any:
    """A param's ``when`` condition, parsed; it may name only params declared before it."""
    if spec.get("when") is None:
        return None
    try:
        when = expr.parse(str(spec["when"]), allow_calls=False)
    except expr.ExpressionError as exc:
        raise SpaceError(f"{where}.when", str(exc)) from None
    unknown = when.names - earlier
    if unknown:
        raise SpaceError(f"{where}.when", f"may only refer to params declared before it, not {sorted(unknown)}")
    return when


def _choices(where: str, spec: Mapping[str, Any]) -> tuple[Any, ...]:
    choices = spec.get("choices")
    if not isinstance(choices, (list, tuple)) or not choices:
        raise SpaceError(f"{where}.choices", "must be a non-empty list")
    if any(not isinstance(c, (str, int, float, bool)) or c is None for c in choices):
        raise SpaceError(f"{where}.choices", "choices must be strings, numbers or booleans")
    if len(set(map(repr, choices))) != len(choices):
        raise SpaceError(f"{where}.choices", "duplicate choices")
    return tuple(choices)


def _compile_param(name: str, spec: Any, earlier: set[str]) -> Param:
    where = f"space.{name}"
    if not name.isidentifier():
        raise SpaceError(where, "param names must be identifiers")
    if not isinstance(spec, Mapping):
        raise SpaceError(where, "must be a mapping with a type")
    ptype = spec.get("type")
    if ptype not in PARAM_TYPES:
        raise SpaceError(f"{where}.type", f"must be one of {', '.join(PARAM_TYPES)}, got {ptype!r}")
    extra = set(spec) - _FIELDS[ptype]
    if extra:
        raise SpaceError(f"{where}.{sorted(extra)[0]}", f"not a field of a {ptype} param")
    when = _compile_when(where, spec, earlier)
    if ptype == "categorical":
        return Param(name, ptype, choices=_choices(where, spec), when=when)
    low, high = _bounds(where, ptype, spec)
    log = bool(spec.get("log", False))
    if log and low <= 0:
        raise SpaceError(f"{where}.low", f"a log scale needs low > 0, got {low}")
    if ptype == "pow2":
        for key, value in (("low", low), ("high", high)):
            if value < 1 or int(value) & (int(value) - 1):
                raise SpaceError(f"{where}.{key}", f"must be a power of two, got {value}")
        return Param(name, ptype, low=int(low), high=int(high), when=when)
    if ptype == "multiple_of":
        multiple = spec.get("multiple")
        if not isinstance(multiple, int) or multiple < 1:
            raise SpaceError(f"{where}.multiple", "must be a positive integer")
        param = Param(name, ptype, low=int(low), high=int(high), multiple=multiple, when=when)
        if not param.count():
            raise SpaceError(where, f"no multiple of {multiple} lies in [{low}, {high}]")
        return param
    step = spec.get("step")
    if step is not None:
        if not isinstance(step, (int, float)) or isinstance(step, bool) or not math.isfinite(step) or step <= 0:
            raise SpaceError(f"{where}.step", "must be a finite positive number")
        if log:
            raise SpaceError(f"{where}.step", "step and log cannot be combined")
    if ptype == "int":
        if step is not None and int(step) != step:
            raise SpaceError(f"{where}.step", "an int param needs an integer step")
        return Param(name, ptype, low=int(low), high=int(high), step=int(step) if step else None, log=log, when=when)
    param = Param(name, ptype, low=float(low), high=float(high), step=float(step) if step else None, log=log, when=when)
    if not math.isfinite(param.high - param.low):
        raise SpaceError(f"{where}.high", f"the range [{low}, {high}] is wider than a float holds")
    if step and not math.isfinite((param.high - param.low) / param.step):
        raise SpaceError(f"{where}.step", f"too small for the range [{low}, {high}]")
    return param


def _canonical_param(param: Param) -> dict[str, Any]:
    out: dict[str, Any] = {"type": param.type}
    if param.type == "categorical":
        out["choices"] = list(param.choices)
    else:
        out.update(low=param.low, high=param.high)
        if param.step is not None:
            out["step"] = param.step
        if param.log:
            out["log"] = True
        if param.multiple is not None:
            out["multiple"] = param.multiple
    if param.when is not None:
        out["when"] = param.when.text
    return out


__all__ = [
    "GRID_LIMIT",
    "Param",
    "Rule",
    "SearchSpace",
    "SpaceError",
    "compile_space",
    "load_space_file",
    "merge_overrides",
]
