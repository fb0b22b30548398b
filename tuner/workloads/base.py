"""The workload contract: what every objective in ``objectives/`` implements.

A workload knows how to build its inputs, run one configuration, check the
numerics against a reference, and report metrics. It receives plain data (a
config dict, a :class:`DeviceInfo`, a :class:`TrialContext`) and returns a
:class:`TrialResult`. It never imports Optuna, Ray or SQLAlchemy, so it runs
the same under the orchestrator, in a test, or from a one-off script.

A result crosses process boundaries (a Ray actor's return value, a rank's JSON file) in one
versioned form, :class:`WireResult` (:meth:`TrialResult.to_wire`, :func:`read_report`), which keeps
``extra`` (the timing interval, convergence, loss curves) all the way to the database.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from kernels.runtime import interpreter_active  # re-exported: the workloads' check is the kernels'
from tuner.study.yamlio import json_safe

#: Version of :class:`WireResult`: a worker of another version is refused, not misread.
RESULT_VERSION = 1
#: Fields of a kernel's export form that its launcher takes beside ``kwargs`` (:meth:`Workload.launch_call`).
LAUNCH_FIELDS = ("num_warps", "num_stages", "precision")


class TrialStatus(str, enum.Enum):
    """Outcome of one trial. Every failure is a value, stored and fed back to the sampler."""

    OK = "ok"
    INFEASIBLE_STATIC = "infeasible_static"
    COMPILE_ERROR = "compile_error"
    OUT_OF_RESOURCES = "out_of_resources"
    OOM = "oom"
    RUNTIME_ERROR = "runtime_error"
    NUMERICS_FAIL = "numerics_fail"
    TIMEOUT = "timeout"
    WORKER_LOST = "worker_lost"


@dataclass(frozen=True)
class MetricSpec:
    """A metric a workload reports: its name, the direction that is better, and its unit."""

    name: str
    direction: str  # "maximize" | "minimize"
    unit: str = ""
    description: str = ""


@dataclass(frozen=True)
class DeviceInfo:
    """What static feasibility rules may know about the device a trial will run on.

    ``kind`` is ``"cuda"`` or ``"cpu"``. On a CPU, Triton kernels run under the
    interpreter and timings are not comparable with GPU timings.
    """

    kind: str = "cpu"
    name: str = "cpu"
    compute_capability: tuple[int, int] | None = None
    smem_per_block_bytes: int | None = None
    sm_count: int | None = None
    total_memory_bytes: int | None = None

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "compute_capability": list(self.compute_capability) if self.compute_capability else None,
            "smem_per_block_bytes": self.smem_per_block_bytes,
            "sm_count": self.sm_count,
            "total_memory_bytes": self.total_memory_bytes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceInfo:
        cc = data.get("compute_capability")
        return cls(
            kind=data.get("kind", "cpu"),
            name=data.get("name", "cpu"),
            compute_capability=tuple(cc) if cc else None,  # type: ignore[arg-type]
            smem_per_block_bytes=data.get("smem_per_block_bytes"),
            sm_count=data.get("sm_count"),
            total_memory_bytes=data.get("total_memory_bytes"),
        )


@dataclass(frozen=True)
class TrialContext:
    """Per-trial facts a workload may use: the trial number and which attempt this is."""

    trial_number: int = 0
    attempt: int = 1


@dataclass
class TrialResult:
    """The outcome of one trial.

    ``metrics`` maps metric names to floats (NaN/inf allowed, stored as null);
    ``samples_ms`` holds the raw timing samples in milliseconds;
    ``timing_comparable`` is False when timings come from a CPU or an
    interpreter and must not be compared with GPU timings.
    """

    status: TrialStatus
    metrics: dict[str, float] = field(default_factory=dict)
    samples_ms: list[float] = field(default_factory=list)
    error: str | None = None
    timing_comparable: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == TrialStatus.OK

    def to_wire(self) -> WireResult:
        """The result as it crosses processes: plain JSON types, ``extra`` made JSON-safe (NaN/inf -> null)."""
        return {
            "version": RESULT_VERSION,
            "status": self.status.value,
            "metrics": dict(self.metrics),
            "samples_ms": list(self.samples_ms),
            "error": self.error,
            "timing_comparable": self.timing_comparable,
            "extra": json_safe(self.extra),
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> TrialResult:
        """The inverse of :meth:`to_wire`; ValueError for another version or an unknown status."""
        check_version(data)
        return cls(
            status=TrialStatus(data["status"]),
            metrics=dict(data.get("metrics") or {}),
            samples_ms=list(data.get("samples_ms") or []),
            error=data.get("error"),
            timing_comparable=bool(data.get("timing_comparable", True)),
            extra=dict(data.get("extra") or {}),
        )


class WireResult(TypedDict):
    """A :class:`TrialResult` across processes (:meth:`TrialResult.to_wire`). ``timing_comparable`` is
    None where no measurement ran (a gang's failure before any rank reported)."""

    version: int
    status: str
    metrics: dict[str, float]
    samples_ms: list[float]
    error: str | None
    timing_comparable: bool | None
    extra: dict[str, Any]


class TrialReport(WireResult, total=False):
    """What a worker returns for one trial: the result and where and how it ran."""

    worker: str
    duration_s: float
    #: The worker's device is unusable after this trial (a poisoned CUDA context, leaked memory).
    replace_worker: bool
    #: Multi-GPU trials: each rank's status, exit code and whether it was killed.
    ranks: list[dict[str, Any]]
    rank: int


def check_version(data: dict[str, Any]) -> None:
    """ValueError unless ``data`` is a :class:`WireResult` of :data:`RESULT_VERSION`."""
    version = data.get("version")
    if version != RESULT_VERSION:
        raise ValueError(f"trial result format version {version!r}; this engine reads version {RESULT_VERSION}")


def read_report(data: Any) -> TrialReport:
    """A worker's report as the engine reads it: itself when it is of this version, else a
    ``runtime_error`` report that says why (a worker of another release on the cluster)."""
    if isinstance(data, dict):
        try:
            check_version(data)
            TrialStatus(data.get("status"))
            return data  # type: ignore[return-value]
        except ValueError as exc:
            problem = str(exc)
    else:
        problem = f"a worker returned {type(data).__name__}, not a trial report"
    report: dict[str, Any] = dict(TrialResult(TrialStatus.RUNTIME_ERROR, error=problem).to_wire())
    if isinstance(data, dict) and "worker" in data:
        report["worker"] = str(data["worker"])
    return report  # type: ignore[return-value]


class Workload(ABC):
    """Base class of every workload: what it declares and the one method the engine calls to run a trial.

    Declared, as class attributes (the engine reads them, never probes for them):

    - ``name``: registry key; ``space_file``: the YAML in ``search_spaces/`` that holds its default
      space; ``metrics``: what ``run`` reports; ``description``: one line for ``GET /workloads``.
    - ``trials_in_flight``: trials a GPU worker holds at once (``resources.trials_per_worker``
      overrides it). More than one pays off where ``prepare`` compiles ahead (the kernel workloads):
      the next configs compile on the worker's threads while one is timed. A whole training or
      decode step gains nothing from a queue, which would only run on past the study's time budget.
    - ``multi_gpu``: a trial runs as ``world_size`` rank processes in one process group
      (:mod:`tuner.run.gang`, :class:`tuner.workloads.rank.RankWorkload`); ``world_size`` (ranks, an
      arg of such a workload: it must equal ``resources.gpus_per_trial``) and ``timeout_s`` (the
      process-group timeout in seconds; None: derived from ``budget.trial_timeout_s``) are set per
      instance; ``trial_env(config)`` is the environment of the rank processes.

    Contract of the methods:

    - ``__init__(**args)`` takes the spec's ``args`` (shapes, dtypes...) and must validate them,
      raising ``ValueError`` naming the argument.
    - ``static_check(config, device)`` returns ``None`` when the config may be dispatched, or a
      reason string when it is statically infeasible. It must be cheap and must not touch a GPU
      (nor import torch or triton): the orchestrator calls it before dispatch.
    - ``prepare(config, device)`` may compile ahead of timing; it may run on a thread while another
      trial is being timed on the same GPU.
    - ``run(config, device, ctx)`` checks numerics against a reference, then times, and returns a
      :class:`TrialResult`. It may raise; the worker turns exceptions into statuses
      (:func:`tuner.workloads.failures.classify_exception`). Workloads that measure something implement it
      through the trial template (:class:`tuner.workloads.template.MeasuredWorkload`), not by hand.
    """

    name: ClassVar[str] = ""
    space_file: ClassVar[str] = ""
    metrics: ClassVar[tuple[MetricSpec, ...]] = ()
    description: ClassVar[str] = ""
    trials_in_flight: ClassVar[int] = 1
    multi_gpu: ClassVar[bool] = False
    #: Ranks of one trial (an arg of a multi-GPU workload; 1 for every other).
    world_size: int = 1
    #: Process-group timeout of a multi-GPU trial in seconds (None: 0.4 x the trial timeout, in [5, 60]).
    timeout_s: float | None = None
    #: The args that make a best-config registry entry's shape (tuner/best_configs/registry.py): GEMM ``m, n, k``.
    #: Positive
    #: numbers among them are compared in log2 space; any other value (a model name, ``causal``) must match.
    shape_args: ClassVar[tuple[str, ...]] = ()
    #: Shape args that must match exactly even though they are numbers (a collective's ``world_size``).
    shape_exact: ClassVar[tuple[str, ...]] = ()
    #: Args that say how a trial runs rather than what it computes (seeds, repetitions, injected faults): left
    #: out of a registry key. Every other arg that is not a shape arg keys the entry as a fixed arg.
    unkeyed_args: ClassVar[tuple[str, ...]] = ("seed",)
    #: Knobs whose chosen value keys the entry beside the fixed args (GEMM: ``precision``), so that a lookup
    #: can ask for the best fp16 config.
    key_knobs: ClassVar[tuple[str, ...]] = ()
    #: The farthest two shapes may be (:meth:`shape_distance`) for one to stand in for the other.
    max_shape_distance: ClassVar[float] = 4.0

    def __init__(self, **args: Any) -> None:
        if args:
            raise ValueError(f"workload {self.name!r} takes no args, got {sorted(args)}")

    def metric_specs(self) -> tuple[MetricSpec, ...]:
        """What ``run`` reports: the class's ``metrics``, unless they depend on the args (``replay``)."""
        return self.metrics

    def space_document(self) -> dict[str, Any]:
        """The default search space as a YAML document (a mapping): ``space_file`` unless the args define it."""
        from tuner.study.space import load_space_file

        return load_space_file(self.space_file)

    def static_check(self, config: dict[str, Any], device: DeviceInfo) -> str | None:
        return None

    def prepare(self, config: dict[str, Any], device: DeviceInfo) -> None:
        return None

    @abstractmethod
    def run(self, config: dict[str, Any], device: DeviceInfo, ctx: TrialContext) -> TrialResult:
        """One trial of ``config`` on ``device``."""

    def trial_env(self, config: dict[str, Any]) -> dict[str, str | None]:
        """Environment variables of a multi-GPU trial's rank processes (None: unset); none by default."""
        return {}

    def work(self, config: dict[str, Any]) -> tuple[float, float, str | None] | None:
        """``(flops, bytes, precision)``: the FLOPs a config computes and the fewest bytes it must move
        through device memory, and the precision whose peak bounds it; None when not meaningful.
        The worker turns it into the trial's roofline position."""
        return None

    @classmethod
    def registry_key(cls, args: dict[str, Any], config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(shape, fixed)``: the shape key and the fixed args (``key_knobs`` included) of a registry entry
        measured with ``args`` (a spec's, the ``__init__`` defaults filling what it leaves out) and ``config``."""
        resolved = {**_init_defaults(cls), **args}
        shape = {name: json_safe(resolved.get(name)) for name in cls.shape_args}
        skip = set(cls.shape_args) | set(cls.unkeyed_args)
        fixed = {name: json_safe(value) for name, value in sorted(resolved.items()) if name not in skip}
        fixed.update({name: json_safe(config[name]) for name in cls.key_knobs if name in config})
        return shape, fixed

    @classmethod
    def shape_distance(cls, a: dict[str, Any], b: dict[str, Any]) -> float | None:
        """How far shape ``a`` is from ``b``: the Euclidean distance of their positive numbers in log2 space
        (``m=4096`` to ``m=8192`` is 1.0); None when another value differs, or beyond ``max_shape_distance``."""
        total = 0.0
        for name in cls.shape_args:
            x, y = a.get(name), b.get(name)
            if name not in cls.shape_exact and _positive_number(x) and _positive_number(y):
                total += (math.log2(float(x)) - math.log2(float(y))) ** 2
            elif x != y:
                return None
        distance = math.sqrt(total)
        return distance if distance <= cls.max_shape_distance else None

    def provenance(self) -> dict[str, Any] | None:
        """Where the trials' measurements come from when not from running the config on the study's own
        workers (``replay``: a recorded landscape), as ``{"kind", "note", ...}``; None (the default) when
        they are measured here. Exports and the dashboard show it beside the metrics."""
        return None

    def trial_fingerprint(self, local: dict[str, Any]) -> dict[str, Any]:
        """The fingerprint recorded with this workload's trials, given the worker's own (``local``): by
        default the worker's; ``replay`` names the machine the landscape was recorded on and says ``replayed``."""
        return local

    def export_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config in the form user code consumes (default: the params as they are)."""
        return dict(config)

    def launch_call(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config as the call that uses it takes it: ``{"function", "kwargs"}``, the dotted name of the
        function the config is for (None when it is no one function's) and the keyword arguments it takes
        beside its tensors, so that ``fn(a, b, **kwargs)`` runs the config. Default: the export form's
        ``function``, its ``kwargs`` with the launch fields (``num_warps``, ``num_stages``, ``precision``)
        as the launchers of ``kernels/`` take them; a form without ``kwargs`` as it is."""
        exported = self.export_config(config)
        if "kwargs" not in exported:
            return {"function": exported.get("function"), "kwargs": dict(exported)}
        kwargs = dict(exported["kwargs"])
        kwargs.update({name: exported[name] for name in LAUNCH_FIELDS if name in exported})
        return {"function": exported.get("function"), "kwargs": kwargs}

    def export_env(self, config: dict[str, Any]) -> dict[str, str]:
        """The config as environment variables (default: each param, upper-cased; a boolean as ``1`` or
        ``0``, the shell's and most tools' spelling of a flag). Values are raw: the ``env`` export quotes them."""
        return {name.upper(): env_value(value) for name, value in config.items()}

    def export_python(self, config: dict[str, Any]) -> str:
        """Python source a user pastes into their code (default: a dict literal). Every value from a config
        goes in as a literal (``repr``), and into a comment only through :func:`comment_text`."""
        return f"config = {dict(config)!r}\n"


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _init_defaults(cls: type) -> dict[str, Any]:
    """The defaults of a workload's ``__init__`` args (what a spec that leaves an arg out runs with)."""
    import inspect

    try:
        parameters = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {
        p.name: p.default
        for p in parameters
        if p.name != "self" and p.default is not inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD
    }


def is_pow2(value: Any) -> bool:
    """Whether ``value`` is a positive power of two (an int, not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 and value & (value - 1) == 0


def missing_params(config: dict[str, Any], names: Iterable[str]) -> str | None:
    """``static_check``'s first test: the reason naming the params ``config`` lacks, or None."""
    missing = [name for name in names if name not in config]
    return f"config lacks {', '.join(missing)}" if missing else None


def not_pow2(values: dict[str, int], names: Iterable[str]) -> str | None:
    """The reason naming the first of ``names`` whose value is not a power of two, or None."""
    for name in names:
        if not is_pow2(values[name]):
            return f"{name}={values[name]} is not a power of two (tl.arange and the warp layout need one)"
    return None


def env_value(value: Any) -> str:
    """A config value as an environment variable holds it: booleans as ``1``/``0``, others as ``str``."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def comment_text(value: Any) -> str:
    """``value`` as text that stays inside one ``#`` comment of generated source: its line breaks become spaces."""
    return " ".join(str(value).splitlines())


def triton_configs_python(comment: str, exported: dict[str, Any], preamble: str = "") -> str:
    """Python source of a one-element ``triton.Config`` list (for ``@triton.autotune(configs=...)``) from an
    exported config with ``kwargs``, ``num_warps`` and ``num_stages``; ``comment`` heads it, ``preamble``
    (more source lines) follows the comment."""
    return (
        "import triton\n\n"
        f"# {comment_text(comment)}\n"
        f"{preamble}"
        "configs = [\n"
        f"    triton.Config({exported['kwargs']!r}, num_warps={exported['num_warps']!r}, "
        f"num_stages={exported['num_stages']!r}),\n"
        "]\n"
    )


def timing_comparable(device: DeviceInfo) -> bool:
    """Whether a trial's timings on ``device`` may be compared with GPU timings (real GPU, no interpreter)."""
    return device.is_gpu and not interpreter_active()
