"""The project's own search strategy (``sampler: auto``): feasible-only, no-repeat, batch-aware.

The work lives in small modules: :mod:`.encoding` (configs as numbers), :mod:`.candidates`
(the statically feasible set and local moves), :mod:`.gp` (the surrogate), :mod:`.history`
(a study's trials as observations), :mod:`.priors` (what configs measured at other shapes),
:mod:`.model` (the proposal step) and :mod:`.sampler` (the Optuna sampler the engine uses).
:mod:`.tpe` (with :mod:`.parzen`) is the project's TPE, ``sampler: tpe``, imported where it is made.
"""

from tuner.strategy.model import SpaceExhausted
from tuner.strategy.priors import Prior
from tuner.strategy.sampler import TunerSampler

__all__ = ["Prior", "SpaceExhausted", "TunerSampler"]
