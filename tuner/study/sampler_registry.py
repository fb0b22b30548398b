"""The sampler registry: every ``sampler:`` name of a spec, registered once, with what it can do.

A sampler is one :func:`register` call: its name, the ``"module:factory"`` that makes it (imported on
first use, as Kernel Tuner's ``strategy_map`` imports its strategies), and its declared capabilities.
The spec's validation, the construction of the sampler and the adapter's behaviour read the
capabilities, never a list of names. A factory takes one :class:`SamplerInputs` and returns an Optuna
sampler; a sampler that can run out (``exhaustible``) answers ``is_exhausted(study)``, and the adapter
signals the end of the space one way, by raising ``tuner.strategy.SpaceExhausted`` from its ``ask``.

The registry lives with the spec (the lowest layer) because the spec validates names against it; it
imports nothing of the search code until a sampler is made.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplerInputs:
    """What a factory may read to make the sampler of one study (or one trial, for a reseeded sampler).

    ``space``: the compiled space; ``device`` and ``static_check`` let a sampler apply the static rules
    before it proposes; ``grid_points``: the enumerated grid in Optuna's param form (``enumerates`` only);
    ``intersection``: the study's search-space intersection, shared by the samplers made for it;
    ``storage``: the study's Optuna storage; ``priors``: configs measured at other shapes (``priors`` only).
    """

    n_objectives: int
    seed: int | None
    budget_trials: int
    has_conditions: bool = False
    grid_points: list[dict[str, Any]] | None = None
    space: Any = None
    device: Mapping[str, Any] | None = None
    static_check: Callable[[dict[str, Any]], str | None] | None = None
    intersection: Any = None
    priors: Sequence[Any] = ()
    storage: Any = None


@dataclass(frozen=True)
class SamplerInfo:
    """A registered sampler and its declared capabilities.

    - ``batch``: proposes distinct configs for trials still in flight (else a study runs one worker).
    - ``multi_objective``: takes several objectives; ``max_objectives``: above it ``fallback`` is made.
    - ``priors``: reads the registry's priors (configs measured at other shapes); others get none.
    - ``enumerates``: needs the enumerated grid (the spec checks the space enumerates) and takes no
      warm start (it visits the grid in its own order).
    - ``exhaustible``: answers ``is_exhausted(study)``; ``exhausted_message``: the study's message then
      (None: nothing to say, as a grid's end is its plan).
    - ``reseeded``: with a study seed, made again for each trial with a seed derived from the trial number
      (else made once, deriving its proposals from the seed and the trials itself).
    - ``constraints_on_every_trial``: a satisfied trial is told its (zero) constraints too; else only a
      violated one is (TPE and random read a trial without constraints as feasible).
    - ``replaces_proposals``: counts the proposals it replaced inside its proposal step
      (``proposal_counts()``), kept on the study.
    """

    name: str
    factory: str
    summary: str
    batch: bool = True
    multi_objective: bool = True
    max_objectives: int | None = None
    fallback: str | None = None
    priors: bool = False
    enumerates: bool = False
    exhaustible: bool = False
    exhausted_message: str | None = None
    reseeded: bool = True
    constraints_on_every_trial: bool = False
    replaces_proposals: bool = False

    def load(self) -> Callable[[SamplerInputs], Any]:
        """The factory, imported now."""
        module, _, attr = self.factory.partition(":")
        return getattr(importlib.import_module(module), attr)


class UnknownSampler(ValueError):
    """A sampler name nobody registered; the message lists the registered ones."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(unknown_message(name))


_REGISTRY: dict[str, SamplerInfo] = {}


def register(name: str, factory: str, summary: str, **capabilities: Any) -> SamplerInfo:
    """Register the sampler ``name`` (once: a second registration of a name is refused)."""
    if name in _REGISTRY:
        raise ValueError(f"sampler {name!r} is registered already")
    if ":" not in factory:
        raise ValueError(f"sampler {name!r}: factory must be 'module:function', got {factory!r}")
    info = SamplerInfo(name, factory, summary, **capabilities)
    _REGISTRY[name] = info
    return info


def unregister(name: str) -> None:
    """Remove ``name`` (a sampler a test or a plugin registered)."""
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(_REGISTRY)


def sampler_info(name: str) -> SamplerInfo:
    """The registered sampler ``name``; :class:`UnknownSampler` when there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownSampler(name) from None


def resolve(name: str, n_objectives: int) -> SamplerInfo:
    """The sampler a study of ``n_objectives`` gets for ``name``: its ``fallback`` above its ``max_objectives``."""
    info = sampler_info(name)
    if info.max_objectives is not None and n_objectives > info.max_objectives and info.fallback is not None:
        return sampler_info(info.fallback)
    return info


def unknown_message(name: str) -> str:
    """Why ``name`` is refused: the registered names, with a "did you mean" for a near miss."""
    known = names()
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listed = ", ".join(repr(n) for n in known)
    return f"Input should be a registered sampler: {listed}; got {name!r}{hint}"


_FACTORIES = "tuner.strategy.samplers"
register(
    "auto",
    f"{_FACTORIES}:make_auto",
    "the project's strategy: feasible-only, no-repeat, batch-aware; NSGA-II above 3 objectives",
    max_objectives=3,
    fallback="nsga2",
    priors=True,
    exhaustible=True,
    exhausted_message="the space is exhausted: every statically feasible config is measured",
    reseeded=False,
    constraints_on_every_trial=True,
    replaces_proposals=True,
)
register("tpe", f"{_FACTORIES}:make_tpe", "the project's TPE for one objective, Optuna's for several")
register("optuna_tpe", f"{_FACTORIES}:make_optuna_tpe", "Optuna's multivariate, constant-liar TPE")
register("nsga2", f"{_FACTORIES}:make_nsga2", "Optuna's NSGA-II", constraints_on_every_trial=True)
register("gp", f"{_FACTORIES}:make_gp", "Optuna's Gaussian-process sampler", constraints_on_every_trial=True)
register("random", f"{_FACTORIES}:make_random", "uniform random proposals")
register(
    "grid",
    f"{_FACTORIES}:make_grid",
    "every point of the enumerated grid once, in a seeded order",
    enumerates=True,
    exhaustible=True,
    reseeded=False,
)
