"""The study spec: what a user submits, validated before anything runs.

``load_spec`` reads YAML or JSON, checks the structure with pydantic and the
meaning against the workload registry (metrics, space, constraints, args).
Every refusal is a :class:`SpecError` whose lines name the offending field.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tuner.study import expr, sampler_registry
from tuner.study.space import SearchSpace, SpaceError, compile_space, load_space_file
from tuner.study.yamlio import load_json_text, load_yaml_text
from tuner.workloads.base import DeviceInfo, MetricSpec, Workload, interpreter_active
from tuner.workloads.registry import UnknownWorkload, workload_class

#: Samplers (numpy's, Optuna's) take 32-bit seeds.
MAX_SEED = 2**32 - 1
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class SpecError(ValueError):
    """A spec that cannot run. ``errors`` is a list of (field, message)."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in errors))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ObjectiveSpec(_Model):
    metric: str
    direction: Literal["maximize", "minimize"] | None = None


class Budget(_Model):
    trials: int = Field(default=50, ge=1, le=1_000_000)
    minutes: float | None = Field(default=None, gt=0)
    trial_timeout_s: float = Field(default=300.0, gt=0)

    @field_validator("minutes", "trial_timeout_s")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be finite")
        return value


class Remeasure(_Model):
    """Before a winner is called, the best ``top_k`` distinct configs (by the first objective) are timed
    again, interleaved A B C A B C ... for ``rounds`` rounds on one GPU, so that clock drift cannot
    pick the winner. ``top_k`` null: 5 when the trials' timings are comparable (a GPU), else 0."""

    top_k: int | None = Field(default=None, ge=0, le=32)
    rounds: int = Field(default=3, ge=1, le=20)


class Resources(_Model):
    #: GPUs of one node per trial; > 1 runs each trial as that many rank processes in one process
    #: group (tuner/run/gang.py), for the multi-GPU workloads (collective, ddp_step).
    gpus_per_trial: int = Field(default=1, ge=1, le=8)
    workers: int | None = Field(default=None, ge=1, le=1024)
    trials_per_worker: int | None = Field(default=None, ge=1, le=16)


class StudySpec(_Model):
    """A tuning study: workload + fixed args + space overrides + objectives + budget."""

    name: str = Field(pattern=NAME_PATTERN)
    workload: str
    args: dict[str, Any] = Field(default_factory=dict)
    space: dict[str, dict[str, Any]] = Field(default_factory=dict)
    objectives: list[ObjectiveSpec] = Field(min_length=1, max_length=8)
    constraints: list[str] = Field(default_factory=list, max_length=32)
    budget: Budget = Field(default_factory=Budget)
    #: a name of :mod:`tuner.study.sampler_registry` (the schema lists those registered)
    sampler: str = Field(
        default="auto", json_schema_extra=lambda schema: schema.update(enum=list(sampler_registry.names()))
    )
    seed: int | None = Field(default=0, ge=0, le=MAX_SEED)
    #: true: the space's seed configs first; ``registry``: the configs of the registry's entries at the
    #: ``warm_start_k`` nearest shapes (same workload, GPU and fixed args) before them, and what they measured
    #: there as the strategy's priors; ``auto`` (the default): ``registry`` when the registry has a comparable
    #: entry near the study's shape, else true (tuner/best_configs/warm_start.py); false: nothing first.
    warm_start: bool | Literal["registry", "auto"] = "auto"
    warm_start_k: int = Field(default=3, ge=1, le=32)
    #: With the registry: the strategy reads what the entries' configs measured at their shapes (priors).
    warm_start_priors: bool = True
    #: A completed study publishes its pick to the best-config registry (tuner/best_configs/registry.py).
    publish: bool = True
    remeasure: Remeasure = Field(default_factory=Remeasure)
    resources: Resources = Field(default_factory=Resources)
    #: The study's share of its runner's worker slots against the other studies it runs at once: a study of
    #: priority 3 gets three trials for each one of a study of priority 1 (tuner/run/fair.py).
    priority: int = Field(default=1, ge=1, le=100)

    @model_validator(mode="before")
    @classmethod
    def _json_numbers_only(cls, data: Any) -> Any:
        """Refuse NaN, Infinity and numbers too large for a float (``1e999``) anywhere in the spec, each
        error at its field: JSON has no such numbers, and stored as null they would change the spec."""
        errors = [{"type": "finite_number", "loc": loc, "input": repr(value)} for loc, value in non_finite_floats(data)]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)  # type: ignore[arg-type]
        return data

    @field_validator("sampler")
    @classmethod
    def _registered_sampler(cls, value: str) -> str:
        if value not in sampler_registry.names():
            raise PydanticCustomError(
                "unknown_sampler", "{message}", {"message": sampler_registry.unknown_message(value)}
            )
        return value

    def identity(self) -> dict[str, Any]:
        """The parts that define what is measured: a resumed study must keep them."""
        return {
            "workload": self.workload,
            "args": self.args,
            "objectives": [o.model_dump() for o in self.objectives],
            "constraints": self.constraints,
        }


def non_finite_floats(value: Any, loc: tuple[str | int, ...] = (), limit: int = 20) -> list[tuple[tuple, float]]:
    """(location, value) of the first ``limit`` NaN or infinite floats in nested dicts and lists."""
    found: list[tuple[tuple, float]] = []
    stack: list[tuple[tuple, Any]] = [(loc, value)]
    while stack and len(found) < limit:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            found.append((where, item))
        elif isinstance(item, dict):
            stack.extend(((*where, str(k)), v) for k, v in reversed(list(item.items())))
        elif isinstance(item, (list, tuple)):
            stack.extend(((*where, i), v) for i, v in reversed(list(enumerate(item))))
    return found


@dataclass
class CompiledStudy:
    """A validated spec with everything the orchestrator needs resolved."""

    spec: StudySpec
    workload_cls: type[Workload]
    space: SearchSpace
    objectives: list[tuple[str, str]]  # (metric, direction)
    constraints: list[expr.Constraint]
    metrics: dict[str, MetricSpec]

    @property
    def directions(self) -> list[str]:
        return [d for _, d in self.objectives]


def parse_spec_text(text: str, source: str = "<spec>") -> dict[str, Any]:
    stripped = text.lstrip()
    try:
        data = load_json_text(text, source) if stripped.startswith("{") else load_yaml_text(text, source)
    except ValueError as exc:
        raise SpecError([("", str(exc))]) from None
    if not isinstance(data, dict):
        raise SpecError([("", f"{source}: a spec is a mapping (YAML or JSON object)")])
    return data


def load_spec(source: str | Path | dict[str, Any]) -> CompiledStudy:
    """Read (path, YAML/JSON text or dict), validate and compile a spec; raises SpecError."""
    if isinstance(source, dict):
        data = source
    else:
        path = Path(source)
        if isinstance(source, Path) or (len(str(source)) < 4096 and "\n" not in str(source) and path.exists()):
            data = parse_spec_text(path.read_text(), str(path))
        else:
            data = parse_spec_text(str(source))
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as exc:
        bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
        raise SpecError(_pydantic_errors(exc) + semantic_errors(data, bad)) from None
    return compile_study(spec)


def _pydantic_errors(exc: ValidationError) -> list[tuple[str, str]]:
    return [(".".join(str(p) for p in err["loc"]), err["msg"]) for err in exc.errors(include_url=False)]


#: Top-level fields a spec cannot be checked further without; a placeholder stands in for a bad one.
_PLACEHOLDERS: dict[str, Any] = {"name": "spec", "workload": "", "objectives": [{"metric": "-"}]}


def semantic_errors(data: Any, bad: set[str]) -> list[tuple[str, str]]:
    """The errors a structurally invalid spec also has against the registry (workload, args, metrics,
    constraints, space), from its fields that are valid, so that one answer lists every error: the top-level
    fields pydantic refused (``bad``) are left out (their defaults stand in), and so are errors that follow
    from them."""
    if not isinstance(data, dict):
        return []
    if "workload" in bad or not isinstance(data.get("workload"), str):
        return []
    partial = {k: v for k, v in data.items() if k not in bad and k in StudySpec.model_fields}
    for key, placeholder in _PLACEHOLDERS.items():
        if key in bad or key not in partial:
            partial[key] = placeholder
    try:
        spec = StudySpec.model_validate(partial)
    except ValidationError:
        return []  # nothing more can be said until the structure is fixed
    if "objectives" in bad or "objectives" not in data:
        spec.objectives = []
    try:
        compile_study(spec)
    except SpecError as more:
        return [(f, m) for f, m in more.errors if not any(f == b or f.startswith(f"{b}.") for b in bad)]
    return []


def _check_gpus_per_trial(spec: StudySpec, cls: type[Workload], workload: Workload | None) -> list[tuple[str, str]]:
    """A multi-GPU workload's ``world_size`` arg must equal ``resources.gpus_per_trial``; other workloads take one."""
    k = spec.resources.gpus_per_trial
    if not cls.multi_gpu:
        if k > 1:
            return [
                (
                    "resources.gpus_per_trial",
                    f"{cls.name} runs on one GPU; multi-GPU trials are for collective, ddp_step",
                )
            ]
        return []
    world_size = None if workload is None else workload.world_size
    if world_size is not None and world_size != k:
        return [("args.world_size", f"must equal resources.gpus_per_trial ({k}), got {world_size}")]
    return []


def sampler_errors(spec: StudySpec) -> list[tuple[str, str]]:
    """The spec against what its sampler declares it can do (several objectives, trials in flight)."""
    n_objectives = len(spec.objectives)
    info = sampler_registry.resolve(spec.sampler, max(1, n_objectives))
    errors = []
    if n_objectives > 1 and not info.multi_objective:
        errors.append(("sampler", f"the {info.name} sampler takes one objective; the spec has {n_objectives}"))
    workers = spec.resources.workers or 1
    if not info.batch and (workers > 1 or (spec.resources.trials_per_worker or 1) > 1):
        errors.append(
            ("resources.workers", f"the {info.name} sampler proposes one trial at a time: one worker, one trial")
        )
    return errors


def declared_arg_errors(cls: type[Workload], args: dict[str, Any]) -> list[tuple[str, str]]:
    """``args`` against the keyword arguments the workload's constructor declares: each unknown one (with a
    "did you mean" for a near miss) and each missing required one, naming every arg the workload takes."""
    import difflib
    import inspect

    try:
        signature = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return []
    params = [p for name, p in signature.parameters.items() if name != "self"]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return []  # it takes any keyword: its constructor checks them
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    names = [p.name for p in named]
    takes = f"{cls.name} takes {', '.join(names)}" if names else f"{cls.name} takes no args"
    errors = []
    for arg in args:
        if arg not in names:
            close = difflib.get_close_matches(arg, names, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            errors.append((f"args.{arg}", f"unknown arg {arg!r}{hint}; {takes}"))
    for p in named:
        if p.default is inspect.Parameter.empty and p.name not in args:
            errors.append((f"args.{p.name}", f"missing required arg {p.name!r}; {takes}"))
    return errors


def _compile_overrides(document: dict[str, Any], spec: StudySpec) -> tuple[SearchSpace | None, list[tuple[str, str]]]:
    """The space with the spec's overrides, or every override's error: each override is tried alone when the
    whole does not compile, so one answer names every bad one."""

    def attempt(overrides: dict[str, Any]) -> tuple[SearchSpace | None, tuple[str, str] | None]:
        try:
            space = compile_space(document, overrides)
            if sampler_registry.sampler_info(spec.sampler).enumerates:
                space.grid()
            return space, None
        except SpaceError as exc:
            return None, (exc.field, exc.message)
        except ValueError as exc:
            return None, ("space", str(exc))

    space, error = attempt(spec.space)
    if error is None:
        return space, []
    # An override tried alone is blamed only for an error in its own field: without the others, a param they
    # fix (a float given a step for a grid) would be reported against an override that is fine.
    errors = [
        e
        for name, value in spec.space.items()
        if (e := attempt({name: value})[1]) is not None
        and (e[0] == f"space.{name}" or e[0].startswith(f"space.{name}."))
    ]
    return None, list(dict.fromkeys(errors)) or [error]


#: Points a space is enumerated up to, or sampled at, when a study is checked for a feasible config.
FEASIBILITY_SAMPLES = 2000
#: The device a study is checked on before it runs: a GPU of unknown limits (rules on its fields are skipped).
UNKNOWN_GPU = DeviceInfo(kind="cuda", name="a GPU not known before the study runs")


def _low_range_points(space: SearchSpace, limit: int, seed: int = 1) -> Iterator[dict[str, Any]]:
    """``limit`` random points whose every value is among its param's first 8 (a float: in the lowest 5% of
    its range), by index arithmetic as :meth:`SearchSpace.point_at` counts them."""
    rng = random.Random(seed)
    counts = [p.count() or 1 for p in space.params.values()]
    floats = [name for name, p in space.params.items() if p.count() is None]
    for _ in range(limit):
        index = 0
        for count in counts:
            index = index * count + rng.randrange(min(count, 8))
        yield space.point_at(index, {name: 0.05 * rng.random() for name in floats})


def _refusal(space: SearchSpace, workload: Workload, config: dict[str, Any]) -> str | None:
    """Why ``config`` fails the static checks (the space's rules, then the workload's on an unknown GPU), or None."""
    reason = space.static_violation(config, None)
    if reason is None:
        try:
            reason = workload.static_check(config, UNKNOWN_GPU)
        except Exception as exc:  # a check that breaks on a config cannot pass it
            reason = f"static_check raised {type(exc).__name__}: {exc}"
    return reason


def infeasible_space_errors(space: SearchSpace, workload: Workload) -> list[tuple[str, str]]:
    """An error when no point of the space passes the static checks (the space's rules whose device fields
    are unknown are skipped, and the workload's ``static_check`` on a GPU of unknown limits): such a study
    could only record infeasible configs. Spaces up to :data:`FEASIBILITY_SAMPLES` points are enumerated
    and refused when no point passes; larger ones are sampled, uniformly and near every range's low end."""
    points, exhaustive = space.sample_points(FEASIBILITY_SAMPLES)
    reasons: dict[str, int] = {}
    seen = 0
    for config in points:
        seen += 1
        reason = _refusal(space, workload, config)
        if reason is None:
            return []
        reasons[reason] = reasons.get(reason, 0) + 1
    if interpreter_active() and any("interpreter" in reason for reason in reasons):
        # Refusals that describe this process (kernels interpreted here, e.g. no bf16), not the GPU the
        # trials will run on: no proof that the space is infeasible there.
        return []
    if not exhaustive and any(
        _refusal(space, workload, c) is None for c in _low_range_points(space, FEASIBILITY_SAMPLES)
    ):
        # A uniform sample misses a huge range whose feasible part is small (stages up to 1e12 under a rule
        # tile * stages <= 1024): points near every range's low end find it.
        return []
    common = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
    why = "; ".join(f"{reason} ({n}x)" for reason, n in common)
    scope = f"none of its {seen} points" if exhaustive else f"none of {seen} points sampled"
    return [("space", f"no statically feasible config: {scope} passes the static checks: {why}")]


def compile_study(spec: StudySpec) -> CompiledStudy:
    """Check a structurally valid spec against the registry and compile its space."""
    errors: list[tuple[str, str]] = []
    try:
        cls = workload_class(spec.workload)
    except UnknownWorkload as exc:
        raise SpecError([("workload", str(exc))]) from None
    workload: Workload | None = None
    arg_errors = declared_arg_errors(cls, spec.args)
    errors.extend(arg_errors)
    try:
        workload = None if arg_errors else cls(**spec.args)
    except (TypeError, ValueError) as exc:
        errors.append(("args", str(exc)))
    except Exception as exc:  # args come from a request: whatever they break is their error
        errors.append(("args", f"{type(exc).__name__}: {exc}"))
    metrics = {m.name: m for m in (workload.metric_specs() if workload is not None else cls.metrics)}
    objectives: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, objective in enumerate(spec.objectives):
        if objective.metric not in metrics:
            errors.append(
                (f"objectives.{i}.metric", f"unknown metric {objective.metric!r}; {cls.name} reports {sorted(metrics)}")
            )
            continue
        if objective.metric in seen:
            errors.append((f"objectives.{i}.metric", f"duplicate objective {objective.metric!r}"))
        seen.add(objective.metric)
        objectives.append((objective.metric, objective.direction or metrics[objective.metric].direction))
    constraints: list[expr.Constraint] = []
    for i, text in enumerate(spec.constraints):
        try:
            constraints.append(expr.parse_constraint(text, set(metrics)))
        except expr.ExpressionError as exc:
            errors.append((f"constraints.{i}", str(exc)))
    if len({c.text for c in constraints}) != len(constraints):
        errors.append(("constraints", "duplicate constraints"))
    space: SearchSpace | None = None
    # Without a valid workload, fall back to its space file; a workload whose space comes
    # from its args (replay) has none, and its args error is reported already.
    document = None
    if workload is not None or cls.space_file:
        document = workload.space_document() if workload is not None else load_space_file(cls.space_file)
        space, space_errors = _compile_overrides(document, spec)
        errors.extend(space_errors)
    if space is not None and workload is not None and not errors:
        errors.extend(infeasible_space_errors(space, workload))
    errors.extend(_check_gpus_per_trial(spec, cls, workload))
    errors.extend(sampler_errors(spec))
    if errors:
        raise SpecError(errors)
    assert space is not None
    return CompiledStudy(spec, cls, space, objectives, constraints, metrics)


def objectives_from_spec(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(metric, direction) of a stored spec's objectives, directions defaulted by its workload (which is
    built: this raises whatever building it raises). Called once, when a study is stored."""
    parsed = StudySpec.model_validate(spec)
    workload = workload_class(parsed.workload)(**parsed.args)
    directions = {m.name: m.direction for m in workload.metric_specs()}
    return [(o.metric, o.direction or directions[o.metric]) for o in parsed.objectives]


def objectives_of(row: Any) -> list[tuple[str, str]]:
    """The objectives stored with a study (its ``StudyRow``); a study stored before they were has them
    rebuilt from its spec (raising what that raises: see :func:`objectives_or_error`)."""
    if row.objectives is not None:
        return [(o["metric"], o["direction"]) for o in row.objectives]
    return objectives_from_spec(row.spec)


def objectives_or_error(row: Any) -> tuple[list[tuple[str, str]], str | None]:
    """:func:`objectives_of` (no objectives where they cannot be had), and :func:`build_error`: why the study
    cannot be run or exported as it is stored, or None."""
    error = build_error(row)
    try:
        return objectives_of(row), error
    except Exception as exc:  # whatever the workload raises, the study is still listed
        return [], error or _one_line(f"its workload can no longer be built: {type(exc).__name__}: {exc}")


#: Seconds a study's :func:`build_error` verdict is kept (every list entry asks; a moved file shows after this).
BUILD_CHECK_TTL_S = 10.0
_build_checks: dict[str, tuple[float, str | None]] = {}


def build_error(row: Any) -> str | None:
    """Why the study's stored spec no longer builds its workload (a spec that is not JSON or not an object, an
    arg that no longer validates, a replay landscape moved away), or None. Kept ``BUILD_CHECK_TTL_S`` seconds
    by workload and args. A JSON column that did not parse reads as an empty dict with a ``reason``
    (``tuner.store.engine.UnreadableJSON``)."""
    spec = row.spec
    reason = getattr(spec, "reason", None)
    if isinstance(spec, dict) and reason is not None:
        return f"its stored spec is not JSON ({reason})"
    if not isinstance(spec, dict):
        return f"its stored spec is not an object but a JSON {type(spec).__name__}"
    key = json.dumps([row.workload, spec.get("args")], sort_keys=True, default=str)
    now = time.monotonic()
    kept = _build_checks.get(key)
    if kept is not None and now - kept[0] < BUILD_CHECK_TTL_S:
        return kept[1]
    try:
        workload_class(row.workload)(**spec.get("args", {}))
        error = None
    except Exception as exc:  # whatever the workload raises is the reason
        error = _one_line(f"its workload can no longer be built: {type(exc).__name__}: {exc}")
    if len(_build_checks) >= 4096:
        _build_checks.clear()
    _build_checks[key] = (now, error)
    return error


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
